//! Planted behaviour: ranks the simulator makes slower (or faster) by a factor for the whole run, so a test or a
//! demonstration knows which ranks an outlier search or a clustering must find. Written `RANKS:FACTOR`, the
//! ranks as ranges of global rank numbers: `3,17:2.5` makes ranks 3 and 17 take 2.5 times as long in their
//! computation (and, in namd, their entry methods); `8-15:0.6` makes a group faster. The first plant naming a
//! rank decides its factor.

use std::fmt;
use std::str::FromStr;

use canopy_wire::ranks::RankSet;

/// The largest factor a plant may give: beyond, a round's times leave any sensible range.
pub const MAX_FACTOR: f64 = 100.0;

/// Ranks and the factor their work is multiplied by.
#[derive(Debug, Clone, PartialEq)]
pub struct Plant {
    ranks: RankSet,
    text: String,
    factor: f64,
}

/// Why a plant cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad plant {text:?}: {why} (expected RANKS:FACTOR, e.g. 3,17:2.5 or 8-15:0.6)")]
pub struct PlantError {
    text: String,
    why: String,
}

impl FromStr for Plant {
    type Err = PlantError;

    fn from_str(text: &str) -> Result<Plant, PlantError> {
        let bad = |why: String| PlantError {
            text: text.to_string(),
            why,
        };
        let (ranks, factor) = text
            .rsplit_once(':')
            .ok_or_else(|| bad("no ':' before the factor".into()))?;
        if ranks.trim().is_empty() {
            return Err(bad("no ranks".into()));
        }
        let set = RankSet::parse(ranks).map_err(|e| bad(e.to_string()))?;
        let factor: f64 = factor
            .trim()
            .parse()
            .map_err(|_| bad(format!("the factor {:?} is not a number", factor.trim())))?;
        if !(factor > 0.0 && factor <= MAX_FACTOR) {
            return Err(bad(format!(
                "the factor must be above 0 and at most {MAX_FACTOR}"
            )));
        }
        Ok(Plant {
            ranks: set,
            text: ranks.trim().to_string(),
            factor,
        })
    }
}

impl fmt::Display for Plant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.text, self.factor)
    }
}

/// The factor of `rank`'s work: the first plant naming it, else 1.
pub fn factor_of(plants: &[Plant], rank: u32) -> f64 {
    plants
        .iter()
        .find(|p| p.ranks.contains(rank))
        .map_or(1.0, |p| p.factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plants_parse_and_the_first_that_names_a_rank_decides() {
        let plants: Vec<Plant> = ["3,17:2.5", "0-7:0.5"]
            .iter()
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(factor_of(&plants, 3), 2.5);
        assert_eq!(factor_of(&plants, 17), 2.5);
        assert_eq!(factor_of(&plants, 4), 0.5);
        assert_eq!(factor_of(&plants, 8), 1.0);
        assert_eq!(plants[0].to_string(), "3,17:2.5");
        for (bad, why) in [
            ("3,17", "no ':' before the factor"),
            (":2", "no ranks"),
            ("4-2:2", "bad rank range \"4-2\": 4 is above 2"),
            ("3:fast", "the factor \"fast\" is not a number"),
            ("3:0", "the factor must be above 0 and at most 100"),
            ("3:1000", "the factor must be above 0 and at most 100"),
        ] {
            let e = bad.parse::<Plant>().unwrap_err().to_string();
            assert_eq!(
                e,
                format!("bad plant {bad:?}: {why} (expected RANKS:FACTOR, e.g. 3,17:2.5 or 8-15:0.6)")
            );
        }
    }
}
