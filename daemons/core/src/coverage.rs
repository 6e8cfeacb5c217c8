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
    into.covered += other.covered;
    into.expected += other.expected;
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
        Some(m) => m.ranks += ranks,
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
}
