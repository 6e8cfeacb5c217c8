//! Rank selections as users write them: comma-separated ranks and inclusive ranges, `0-7,17,40-43`.

/// Why a rank selection cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankSetError {
    Malformed(String),
    Reversed { part: String, low: u32, high: u32 },
}

// Written out rather than derived: this crate is in every filter plugin's dependencies, which stay few.
impl std::fmt::Display for RankSetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RankSetError::Malformed(part) => write!(f, "bad rank range {part:?}: expected N or N-M"),
            RankSetError::Reversed { part, low, high } => {
                write!(f, "bad rank range {part:?}: {low} is above {high}")
            }
        }
    }
}

impl std::error::Error for RankSetError {}

/// A set of ranks parsed from ranges; empty means every rank (unless made by [`RankSet::none`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankSet {
    ranges: Vec<(u32, u32)>,
    none: bool,
}

impl RankSet {
    /// Parses `0-7,17`; the error names the part that is wrong.
    pub fn parse(text: &str) -> Result<RankSet, RankSetError> {
        let mut ranges = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || RankSetError::Malformed(part.to_string());
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (
                    a.trim().parse().map_err(|_| bad())?,
                    b.trim().parse().map_err(|_| bad())?,
                ),
                None => {
                    let n = part.parse().map_err(|_| bad())?;
                    (n, n)
                }
            };
            if a > b {
                return Err(RankSetError::Reversed {
                    part: part.to_string(),
                    low: a,
                    high: b,
                });
            }
            ranges.push((a, b));
        }
        Ok(RankSet { ranges, none: false })
    }

    /// The selection of no rank at all.
    pub fn none() -> RankSet {
        RankSet {
            ranges: Vec::new(),
            none: true,
        }
    }

    /// As [`RankSet::parse`], except that empty text selects no rank.
    pub fn parse_or_none(text: &str) -> Result<RankSet, RankSetError> {
        let set = RankSet::parse(text)?;
        Ok(if set.ranges.is_empty() {
            RankSet::none()
        } else {
            set
        })
    }

    /// Whether the selection names every rank (it was empty).
    pub fn is_all(&self) -> bool {
        self.ranges.is_empty() && !self.none
    }

    pub fn contains(&self, rank: u32) -> bool {
        self.is_all() || self.ranges.iter().any(|(a, b)| (*a..=*b).contains(&rank))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_match() {
        let s = RankSet::parse("0-3, 17,40-41").unwrap();
        assert!(s.contains(0) && s.contains(3) && s.contains(17) && s.contains(41));
        assert!(!s.contains(4) && !s.contains(39));
        assert!(RankSet::parse("").unwrap().contains(12345));
        let none = RankSet::parse_or_none(" ").unwrap();
        assert!(!none.is_all() && !none.contains(0));
        assert_eq!(RankSet::parse_or_none("3").unwrap(), RankSet::parse("3").unwrap());
        assert_eq!(
            RankSet::parse("4-2").unwrap_err().to_string(),
            "bad rank range \"4-2\": 4 is above 2"
        );
        assert_eq!(
            RankSet::parse("a").unwrap_err().to_string(),
            "bad rank range \"a\": expected N or N-M"
        );
    }
}
