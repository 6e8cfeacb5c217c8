//! Per-event metrics beyond time: the counters a rank reads from the kernel's perf events at each entry and exit
//! of an event (inclusive and exclusive, like time), and the values it reads at entry (the heap in use, the depth
//! of the event stack). This table names them (CANOPY_COUNTERS, `Options.counters`), gives each the
//! `canopy.filters.v1.Metric` numbers its values travel under, and its unit.

/// Where a per-event metric's values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A kernel software event (`PERF_TYPE_SOFTWARE`, this `config`): counted on every Linux machine.
    Software(u64),
    /// A hardware event (`PERF_TYPE_HARDWARE`, this `config`): only where the machine exposes a PMU.
    Hardware(u64),
    /// The process's heap in use, read at the event's entry.
    Heap,
    /// The depth of the thread's event stack at the event's entry.
    Depth,
}

/// One per-event metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventMetric {
    /// Its name in CANOPY_COUNTERS and `Options.counters` (perf's own name for a counter).
    pub name: &'static str,
    pub source: Source,
    /// The unit of its values.
    pub unit: &'static str,
    /// Its first `Metric` number: a counter's inclusive values; its exclusive ones are the next number. A value
    /// read at entry has this number alone.
    pub metric: i32,
}

impl EventMetric {
    /// Whether it counts (inclusive and exclusive values) rather than reads a value at entry.
    pub fn counts(&self) -> bool {
        matches!(self.source, Source::Software(_) | Source::Hardware(_))
    }
}

const fn counter(name: &'static str, source: Source, unit: &'static str, i: i32) -> EventMetric {
    EventMetric {
        name,
        source,
        unit,
        metric: FIRST_COUNTER_METRIC + 2 * i,
    }
}

/// The `Metric` number of the first counter's inclusive values.
pub const FIRST_COUNTER_METRIC: i32 = 16;

// perf_event_open(2)'s config values (linux/perf_event.h).
const SW_TASK_CLOCK: u64 = 1;
const SW_PAGE_FAULTS: u64 = 2;
const SW_CONTEXT_SWITCHES: u64 = 3;
const SW_CPU_MIGRATIONS: u64 = 4;
const SW_PAGE_FAULTS_MIN: u64 = 5;
const SW_PAGE_FAULTS_MAJ: u64 = 6;
const HW_CPU_CYCLES: u64 = 0;
const HW_INSTRUCTIONS: u64 = 1;
const HW_CACHE_REFERENCES: u64 = 2;
const HW_CACHE_MISSES: u64 = 3;
const HW_BRANCH_INSTRUCTIONS: u64 = 4;
const HW_BRANCH_MISSES: u64 = 5;

/// Every per-event metric, in `Metric` order. A rank's set is a bit set over this table.
pub const ALL: [EventMetric; 14] = [
    counter("task-clock", Source::Software(SW_TASK_CLOCK), "ns", 0),
    counter("page-faults", Source::Software(SW_PAGE_FAULTS), "faults", 1),
    counter(
        "context-switches",
        Source::Software(SW_CONTEXT_SWITCHES),
        "switches",
        2,
    ),
    counter(
        "cpu-migrations",
        Source::Software(SW_CPU_MIGRATIONS),
        "migrations",
        3,
    ),
    counter("minor-faults", Source::Software(SW_PAGE_FAULTS_MIN), "faults", 4),
    counter("major-faults", Source::Software(SW_PAGE_FAULTS_MAJ), "faults", 5),
    counter("cycles", Source::Hardware(HW_CPU_CYCLES), "cycles", 6),
    counter(
        "instructions",
        Source::Hardware(HW_INSTRUCTIONS),
        "instructions",
        7,
    ),
    counter(
        "cache-references",
        Source::Hardware(HW_CACHE_REFERENCES),
        "references",
        8,
    ),
    counter("cache-misses", Source::Hardware(HW_CACHE_MISSES), "misses", 9),
    counter(
        "branch-instructions",
        Source::Hardware(HW_BRANCH_INSTRUCTIONS),
        "branches",
        10,
    ),
    counter("branch-misses", Source::Hardware(HW_BRANCH_MISSES), "misses", 11),
    EventMetric {
        name: "heap",
        source: Source::Heap,
        unit: "bytes",
        metric: 40,
    },
    EventMetric {
        name: "depth",
        source: Source::Depth,
        unit: "frames",
        metric: 41,
    },
];

/// The set of per-event metrics these names ask for, as bits over [`ALL`]; the error names an unknown one and
/// lists the valid names (with the nearest one, when a name looks like a misspelling).
pub fn parse(names: &[String]) -> Result<u32, String> {
    let mut bits = 0;
    for n in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        let Some(i) = ALL.iter().position(|m| m.name == n) else {
            let valid = ALL.map(|m| m.name).join(", ");
            return Err(match nearest(n) {
                Some(near) => format!("unknown counter {n:?} (did you mean {near:?}? valid: {valid})"),
                None => format!("unknown counter {n:?} (valid: {valid})"),
            });
        };
        bits |= 1 << i;
    }
    Ok(bits)
}

/// The set named by a comma-separated list (CANOPY_COUNTERS).
pub fn parse_list(list: &str) -> Result<u32, String> {
    parse(&list.split(',').map(str::to_string).collect::<Vec<_>>())
}

/// The names of a set, in table order.
pub fn names(bits: u32) -> Vec<&'static str> {
    ALL.iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .map(|(_, m)| m.name)
        .collect()
}

/// The valid name closest to `name` by edit distance, if it is close enough to be a slip.
fn nearest(name: &str) -> Option<&'static str> {
    ALL.iter()
        .map(|m| (strsim::levenshtein(name, m.name), m.name))
        .filter(|(d, m)| *d <= 2.max(m.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, m)| m)
}

/// Which of a metric's values a `Metric` number is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Inclusive,
    Exclusive,
    /// A value read at entry.
    AtEntry,
}

/// The per-event metric a `Metric` number belongs to (its index in [`ALL`]) and which of its values it is;
/// `None` for the time metrics, the counters of `CounterSample` and unknown numbers.
pub fn of_metric(metric: i32) -> Option<(usize, Side)> {
    ALL.iter().enumerate().find_map(|(i, m)| {
        if m.metric == metric {
            Some((
                i,
                if m.counts() {
                    Side::Inclusive
                } else {
                    Side::AtEntry
                },
            ))
        } else if m.counts() && m.metric + 1 == metric {
            Some((i, Side::Exclusive))
        } else {
            None
        }
    })
}

/// The `Metric` numbers a set's values travel under, in the order a profile lists them
/// (`RankProfile.event_metrics`): each counter's inclusive then exclusive number, each value at entry's one.
pub fn metric_numbers(bits: u32, out: &mut Vec<u32>) {
    out.clear();
    for (i, m) in ALL.iter().enumerate() {
        if bits & (1 << i) != 0 {
            out.push(m.metric as u32);
            if m.counts() {
                out.push(m.metric as u32 + 1);
            }
        }
    }
}

/// A short name for a `Metric` number of a per-event metric: "page-faults", "page-faults excl", "heap".
pub fn label(metric: i32) -> Option<String> {
    let (i, side) = of_metric(metric)?;
    let name = ALL[i].name;
    Some(match side {
        Side::Inclusive => format!("{name} incl"),
        Side::Exclusive => format!("{name} excl"),
        Side::AtEntry => name.to_string(),
    })
}

/// The `Metric` number of a name users give a per-event metric's values: "page-faults-inclusive",
/// "page-faults-exclusive" ("page-faults" alone: exclusive), "heap", "depth".
pub fn metric_named(name: &str) -> Option<i32> {
    let (base, side) = if let Some(b) = name.strip_suffix("-inclusive") {
        (b, Some(Side::Inclusive))
    } else if let Some(b) = name.strip_suffix("-exclusive") {
        (b, Some(Side::Exclusive))
    } else {
        (name, None)
    };
    let m = ALL.iter().find(|m| m.name == base)?;
    match (m.counts(), side) {
        (true, Some(Side::Inclusive)) => Some(m.metric),
        (true, _) => Some(m.metric + 1),
        (false, None) => Some(m.metric),
        (false, Some(_)) => None,
    }
}

/// Every name [`metric_named`] knows, in table order.
pub fn metric_words() -> Vec<String> {
    let mut out = Vec::new();
    for m in &ALL {
        out.push(m.name.to_string());
        if m.counts() {
            out.push(format!("{}-inclusive", m.name));
            out.push(format!("{}-exclusive", m.name));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_into_a_set_and_back() {
        let bits = parse_list("page-faults, context-switches,heap").unwrap();
        assert_eq!(names(bits), vec!["page-faults", "context-switches", "heap"]);
        assert_eq!(parse_list("").unwrap(), 0);
        let mut numbers = Vec::new();
        metric_numbers(bits, &mut numbers);
        assert_eq!(numbers, vec![18, 19, 20, 21, 40]);
    }

    #[test]
    fn an_unknown_name_is_named_with_the_nearest_valid_one() {
        let e = parse_list("page-faults,context-switchs").unwrap_err();
        assert!(
            e.starts_with("unknown counter \"context-switchs\" (did you mean \"context-switches\"?"),
            "{e}"
        );
        assert!(e.contains("valid: task-clock, page-faults"), "{e}");
        let e = parse_list("flops").unwrap_err();
        assert!(e.starts_with("unknown counter \"flops\" (valid: "), "{e}");
    }

    #[test]
    fn metric_numbers_name_their_metric_and_side() {
        for (i, m) in ALL.iter().enumerate() {
            if m.counts() {
                assert_eq!(of_metric(m.metric), Some((i, Side::Inclusive)));
                assert_eq!(of_metric(m.metric + 1), Some((i, Side::Exclusive)));
                assert_eq!(metric_named(&format!("{}-inclusive", m.name)), Some(m.metric));
                assert_eq!(metric_named(m.name), Some(m.metric + 1));
            } else {
                assert_eq!(of_metric(m.metric), Some((i, Side::AtEntry)));
                assert_eq!(metric_named(m.name), Some(m.metric));
            }
        }
        assert_eq!(of_metric(3), None);
        assert_eq!(label(19).as_deref(), Some("page-faults excl"));
        assert_eq!(label(41).as_deref(), Some("depth"));
        assert_eq!(metric_named("heap-exclusive"), None);
        let words = metric_words();
        assert_eq!(words.len(), 12 * 3 + 2);
        assert!(words.iter().all(|w| metric_named(w).is_some()));
    }
}
