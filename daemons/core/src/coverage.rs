//! Coverage arithmetic: how many ranks a packet or a result covers out of how many were expected, and why the
//! others are missing. Every coverage keeps one invariant, [`coverage_is_exact`].

use canopy_proto::v1::{Coverage, Missing, MissingReason};

/// The coverage of one rank that delivered.
pub fn full() -> Coverage {
    Coverage {
        covered: 1,
        expected: 1,
        missing: vec![],
    }
}

/// The coverage of one rank that answers for a round without a profile, and why.
pub fn absent(reason: MissingReason) -> Coverage {
    Coverage {
        covered: 0,
        expected: 1,
        missing: vec![Missing {
            reason: reason as i32,
            ranks: 1,
        }],
    }
}

/// Adds `other` into `into`: covered, expected and each reason.
pub fn add_coverage(into: &mut Coverage, other: &Coverage) {
    into.covered = into.covered.saturating_add(other.covered);
    into.expected = into.expected.saturating_add(other.expected);
    for m in &other.missing {
        add_missing(into, m.reason(), m.ranks);
    }
}

/// Counts `ranks` more under `reason`, keeping one entry per reason.
pub fn add_missing(cov: &mut Coverage, reason: MissingReason, ranks: u32) {
    if ranks == 0 {
        return;
    }
    match cov.missing.iter_mut().find(|m| m.reason() == reason) {
        Some(m) => m.ranks = m.ranks.saturating_add(ranks),
        None => cov.missing.push(Missing {
            reason: reason as i32,
            ranks,
        }),
    }
}

/// Moves `ranks` covered ranks to `reason` (a payload the filter rejected).
pub fn uncover(cov: &mut Coverage, reason: MissingReason, ranks: u32) {
    let ranks = ranks.min(cov.covered);
    cov.covered -= ranks;
    add_missing(cov, reason, ranks);
}

/// The invariant every coverage keeps.
pub fn coverage_is_exact(cov: &Coverage) -> bool {
    u64::from(cov.covered) + cov.missing.iter().map(|m| u64::from(m.ranks)).sum::<u64>()
        == u64::from(cov.expected)
}

/// Whether a child's coverage may be taken in: exact, and for no more ranks than `ranks_below` (the most
/// [`canopy_proto::MAX_RANKS`]); the reason when not.
pub fn check_child_coverage(cov: &Coverage, ranks_below: u32) -> Result<(), String> {
    if !coverage_is_exact(cov) {
        let missing: u64 = cov.missing.iter().map(|m| u64::from(m.ranks)).sum();
        return Err(format!(
            "coverage is not exact: {} covered and {missing} missing, but {} expected",
            cov.covered, cov.expected
        ));
    }
    if cov.expected > ranks_below {
        return Err(format!(
            "coverage expects {} ranks, more than the {ranks_below} the child has below",
            cov.expected
        ));
    }
    Ok(())
}

/// Ranks missing under `reason`.
pub fn missing_for(cov: &Coverage, reason: MissingReason) -> u32 {
    cov.missing
        .iter()
        .filter(|m| m.reason() == reason)
        .map(|m| m.ranks)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncovering_keeps_the_invariant_and_one_entry_per_reason() {
        let mut c = full();
        add_coverage(&mut c, &absent(MissingReason::Late));
        add_coverage(&mut c, &full());
        assert_eq!((c.covered, c.expected), (2, 3));
        uncover(&mut c, MissingReason::Late, 5);
        assert_eq!(c.covered, 0);
        assert_eq!(missing_for(&c, MissingReason::Late), 3);
        assert_eq!(c.missing.len(), 1);
        assert!(coverage_is_exact(&c));
    }

    #[test]
    fn sums_saturate_rather_than_wrap() {
        let mut c = Coverage {
            covered: u32::MAX,
            expected: u32::MAX,
            missing: vec![],
        };
        add_coverage(&mut c, &full());
        add_missing(&mut c, MissingReason::Late, u32::MAX);
        add_missing(&mut c, MissingReason::Late, 1);
        assert_eq!((c.covered, c.expected), (u32::MAX, u32::MAX));
        assert_eq!(missing_for(&c, MissingReason::Late), u32::MAX);
    }

    #[test]
    fn a_childs_coverage_must_add_up_and_stay_within_its_ranks() {
        assert_eq!(check_child_coverage(&full(), 1), Ok(()));
        assert_eq!(check_child_coverage(&absent(MissingReason::Lost), 4), Ok(()));
        assert_eq!(
            check_child_coverage(&full(), 0),
            Err("coverage expects 1 ranks, more than the 0 the child has below".into())
        );
        let inexact = Coverage {
            covered: 4,
            expected: 4,
            missing: vec![Missing {
                reason: MissingReason::Late as i32,
                ranks: u32::MAX,
            }],
        };
        assert_eq!(
            check_child_coverage(&inexact, 8),
            Err("coverage is not exact: 4 covered and 4294967295 missing, but 4 expected".into())
        );
    }
}
