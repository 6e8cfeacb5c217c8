//! The one codec between Canopy's enumerations and the short lowercase words the store holds (`agent`, `lost`,
//! `wait_for_all`, `exclusive`, `open`). The writer, the reader, the API and the logs all go through it, so a
//! new variant is added in one table here and nowhere else.

use canopy_proto::filters::v1::Metric;
use canopy_proto::v1::{MissingReason, NodeKind, NodeState, SyncMode};

/// An enumeration the store writes as a word.
pub trait Word: Copy + PartialEq + Sized + 'static {
    /// Every variant with its word, in the enumeration's order.
    const WORDS: &'static [(Self, &'static str)];

    /// The word stored for this variant.
    fn word(self) -> &'static str {
        Self::WORDS
            .iter()
            .find(|(v, _)| *v == self)
            .map_or("unspecified", |(_, w)| w)
    }

    /// The variant a stored word names; `None` for a word this version does not know.
    fn from_word(word: &str) -> Option<Self> {
        Self::WORDS.iter().find(|(_, w)| *w == word).map(|(v, _)| *v)
    }
}

macro_rules! words {
    ($ty:ty { $($variant:ident => $word:literal),+ $(,)? }) => {
        impl Word for $ty {
            const WORDS: &'static [(Self, &'static str)] = &[$((<$ty>::$variant, $word)),+];
        }
    };
}

// In the proto's numbering: `rounds` has one `missing_<word>` column per reason, found by this index.
words!(MissingReason {
    Unspecified => "unspecified",
    Late => "late",
    Lost => "lost",
    Stopped => "stopped",
    SampledOut => "sampled_out",
    Malformed => "malformed",
    NotWaited => "not_waited",
    Dropped => "dropped",
    Absent => "absent",
    StoreFailed => "store_failed",
    Unreachable => "unreachable",
});

words!(NodeKind {
    Unspecified => "unspecified",
    Agent => "agent",
    Relay => "relay",
    Frontend => "frontend",
});

words!(NodeState {
    Unspecified => "unspecified",
    Attached => "attached",
    Lost => "lost",
    Finished => "finished",
});

words!(SyncMode {
    Unspecified => "unspecified",
    WaitForAll => "wait_for_all",
    DontWait => "dont_wait",
});

// The `metric` column of `stats` and `histograms`.
words!(Metric {
    Unspecified => "unspecified",
    Calls => "calls",
    Inclusive => "inclusive",
    Exclusive => "exclusive",
    Counter => "counter",
    // Per-event metrics (canopy_wire::event_metrics): a perf counter's inclusive and exclusive counts, values
    // at entry.
    TaskClockInclusive => "task_clock_inclusive",
    TaskClockExclusive => "task_clock_exclusive",
    PageFaultsInclusive => "page_faults_inclusive",
    PageFaultsExclusive => "page_faults_exclusive",
    ContextSwitchesInclusive => "context_switches_inclusive",
    ContextSwitchesExclusive => "context_switches_exclusive",
    CpuMigrationsInclusive => "cpu_migrations_inclusive",
    CpuMigrationsExclusive => "cpu_migrations_exclusive",
    MinorFaultsInclusive => "minor_faults_inclusive",
    MinorFaultsExclusive => "minor_faults_exclusive",
    MajorFaultsInclusive => "major_faults_inclusive",
    MajorFaultsExclusive => "major_faults_exclusive",
    CyclesInclusive => "cycles_inclusive",
    CyclesExclusive => "cycles_exclusive",
    InstructionsInclusive => "instructions_inclusive",
    InstructionsExclusive => "instructions_exclusive",
    CacheReferencesInclusive => "cache_references_inclusive",
    CacheReferencesExclusive => "cache_references_exclusive",
    CacheMissesInclusive => "cache_misses_inclusive",
    CacheMissesExclusive => "cache_misses_exclusive",
    BranchInstructionsInclusive => "branch_instructions_inclusive",
    BranchInstructionsExclusive => "branch_instructions_exclusive",
    BranchMissesInclusive => "branch_misses_inclusive",
    BranchMissesExclusive => "branch_misses_exclusive",
    HeapAtEntry => "heap_at_entry",
    DepthAtEntry => "depth_at_entry",
});

/// The unit of a `metric` word's values and what they measure: the `units` table, which the views join so that
/// every value of `stats_named`, `histograms_named` and `event_metrics_named` says its unit.
pub fn metric_unit(metric: Metric) -> (&'static str, String) {
    use canopy_wire::event_metrics::{ALL, Side, of_metric};
    match metric {
        Metric::Unspecified => ("", "a metric this version of Canopy does not know".into()),
        Metric::Calls => ("calls", "times the event was entered in the round".into()),
        Metric::Inclusive => ("us", "time in the event and everything it called".into()),
        Metric::Exclusive => ("us", "time in the event itself, less what it called".into()),
        Metric::Counter => (
            "",
            "an application counter's value, in the counter's own unit".into(),
        ),
        m => match of_metric(m as i32) {
            Some((i, side)) => {
                let (name, unit) = (ALL[i].name, ALL[i].unit);
                let what = match side {
                    Side::Inclusive => format!("{name} while the event ran, with what it called"),
                    Side::Exclusive => format!("{name} while the event ran innermost"),
                    Side::AtEntry => format!("{name} at the event's latest entry"),
                };
                (unit, what)
            }
            None => ("", "a metric this version of Canopy does not know".into()),
        },
    }
}

/// A stream's state as the store records it (`streams.state`).
pub use canopy_proto::StreamState;

words!(StreamState {
    Open => "open",
    Closed => "closed",
    Failed => "failed",
});

/// How many missing reasons there are: the length of the per-reason counts.
pub const REASONS: usize = <MissingReason as Word>::WORDS.len();

/// The index of a reason in per-reason counts (its proto number; the test below keeps the two equal).
pub(crate) fn reason_index(reason: MissingReason) -> usize {
    reason as usize
}

/// The `rounds` column that counts ranks missing for `reason`.
pub(crate) fn missing_column(reason: MissingReason) -> String {
    format!("missing_{}", reason.word())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks every variant prost knows (numbers 0..64) against the table: a word, the same variant back, the
    /// word older stores hold (the proto name less its prefix, lowercase), and no word twice.
    fn round_trips<T: Word + std::fmt::Debug + TryFrom<i32>>(
        prefix: &str,
        name: impl Fn(&T) -> &'static str,
    ) {
        let mut seen = 0;
        for n in 0..64 {
            let Ok(v) = T::try_from(n) else { continue };
            seen += 1;
            let word = v.word();
            assert_eq!(T::from_word(word), Some(v), "{v:?}");
            let legacy = name(&v).strip_prefix(prefix).unwrap().to_ascii_lowercase();
            assert_eq!(word, legacy, "{v:?}");
        }
        assert_eq!(seen, T::WORDS.len(), "a variant has no word");
        let mut words: Vec<_> = T::WORDS.iter().map(|(_, w)| *w).collect();
        words.sort_unstable();
        words.dedup();
        assert_eq!(words.len(), T::WORDS.len(), "a word is used twice");
        assert_eq!(T::from_word("no such word"), None);
    }

    #[test]
    fn every_variant_round_trips_through_its_word() {
        round_trips::<MissingReason>("MISSING_REASON_", MissingReason::as_str_name);
        round_trips::<NodeKind>("NODE_KIND_", NodeKind::as_str_name);
        round_trips::<NodeState>("NODE_STATE_", NodeState::as_str_name);
        round_trips::<SyncMode>("SYNC_MODE_", SyncMode::as_str_name);
        round_trips::<Metric>("METRIC_", Metric::as_str_name);
        for (state, word) in StreamState::WORDS {
            assert_eq!(StreamState::from_word(word), Some(*state));
            assert_eq!(state.word(), *word);
        }
        assert_eq!(StreamState::WORDS.len(), 3);
    }

    #[test]
    fn every_known_metric_has_a_unit_and_a_meaning() {
        for (metric, word) in Metric::WORDS.iter().filter(|(m, _)| *m != Metric::Unspecified) {
            let (unit, meaning) = metric_unit(*metric);
            assert!(!meaning.contains("does not know"), "{word}");
            // Only an application counter's unit is the counter's own.
            assert_eq!(unit.is_empty(), *metric == Metric::Counter, "{word}");
        }
        assert_eq!(metric_unit(Metric::TaskClockExclusive).0, "ns");
        assert_eq!(
            metric_unit(Metric::PageFaultsInclusive).1,
            "page-faults while the event ran, with what it called"
        );
        assert_eq!(
            metric_unit(Metric::HeapAtEntry),
            ("bytes", "heap at the event's latest entry".into())
        );
    }

    #[test]
    fn reasons_are_listed_in_proto_order() {
        for (i, (reason, _)) in MissingReason::WORDS.iter().enumerate() {
            assert_eq!(reason_index(*reason), i, "{reason:?}");
        }
        assert_eq!(missing_column(MissingReason::SampledOut), "missing_sampled_out");
    }
}
