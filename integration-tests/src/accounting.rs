//! What the fault tests assert of a run's rounds: every round of a stream has its row, and every rank-round is
//! covered, arrived late with its data, or is counted with one of the reasons the test allows; none twice.

use canopy_proto::v1::MissingReason;
use std::collections::BTreeMap;

use crate::RoundRow;

/// Every stream's rounds from 0 to its last each have a row.
pub fn assert_every_round_has_its_row(rounds: &[RoundRow]) {
    let mut by_stream = BTreeMap::<u32, Vec<u64>>::new();
    for r in rounds {
        by_stream.entry(r.stream_id).or_default().push(r.round);
    }
    for (stream, mut numbers) in by_stream {
        numbers.sort_unstable();
        let want: Vec<u64> = (0..=*numbers.last().unwrap_or(&0)).collect();
        assert_eq!(numbers, want, "stream {stream}: a round without its row");
    }
}

/// Each round expects `expected` ranks, counts none twice, and has each of them covered, late with its data or
/// missing for one of `reasons`. Returns the rank-rounds that arrived late.
pub fn assert_accounted(rounds: &[RoundRow], expected: u32, reasons: &[MissingReason]) -> u32 {
    let mut late = 0;
    for r in rounds {
        assert_eq!(
            r.expected, expected,
            "a round that forgot ranks the run expects: {r:?}"
        );
        assert!(r.covered + r.late_ranks <= expected, "counted twice: {r:?}");
        let counted: u32 = reasons.iter().map(|reason| r.missing.get(*reason)).sum();
        assert!(
            r.covered + r.late_ranks + counted >= expected,
            "rank-rounds neither covered, nor late with their data, nor counted {reasons:?}: {r:?}"
        );
        late += r.late_ranks;
    }
    late
}

/// The rows [`assert_accounted`] would refuse, as runs of consecutive rounds with the same counts: what a failing
/// fault test prints, so a rare failure says at once whether one round or every round after a moment lacks its
/// ranks, and for which reason.
pub fn unaccounted(rounds: &[RoundRow], expected: u32, reasons: &[MissingReason]) -> Vec<String> {
    let mut runs: Vec<(u32, u64, u64, String)> = Vec::new();
    for r in rounds {
        let counted: u32 = reasons.iter().map(|reason| r.missing.get(*reason)).sum();
        if r.covered + r.late_ranks + counted >= expected {
            continue;
        }
        let what = format!(
            "covered {}, late with data {}, missing {:?}",
            r.covered,
            r.late_ranks,
            r.missing_reason.as_deref().unwrap_or("")
        );
        match runs.last_mut() {
            Some((stream, _, end, last))
                if *stream == r.stream_id && *end + 1 == r.round && *last == what =>
            {
                *end = r.round
            }
            _ => runs.push((r.stream_id, r.round, r.round, what)),
        }
    }
    runs.into_iter()
        .map(|(stream, from, to, what)| format!("stream {stream} rounds {from}-{to}: {what}"))
        .collect()
}
