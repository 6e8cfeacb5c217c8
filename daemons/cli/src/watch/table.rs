//! The tables of `canopy watch` for streams of summaries (stats, histogram) and of classes (classify), cut to
//! the terminal's width: the metric shown is chosen with `m`, the sort column with `s`, event names in place of
//! ids, and the columns that do not fit left out (the name is cut before a number column goes).

use std::collections::HashMap;

use canopy_proto::filters::v1::{ClassResult, EventStats, Histogram, Metric};

use crate::fit::{Column, Lines, lay_out, truncate};
use crate::render::{metric_word, name_of};

/// The metrics a result has summaries of, in the order `m` cycles them: exclusive, inclusive and calls first,
/// then counters and per-event metrics by number.
pub fn metrics_of(stats: &[EventStats]) -> Vec<i32> {
    let rank = |m: i32| match Metric::try_from(m) {
        Ok(Metric::Exclusive) => (0, m),
        Ok(Metric::Inclusive) => (1, m),
        Ok(Metric::Calls) => (2, m),
        _ => (3, m),
    };
    let mut ms: Vec<i32> = stats.iter().map(|s| s.metric).collect();
    ms.sort_by_key(|&m| rank(m));
    ms.dedup();
    ms
}

/// A metric's title with its unit, as the tables head it: `exclusive us`, `calls`, `page-faults excl (faults)`.
pub fn metric_title(m: i32) -> String {
    if let Some((k, _)) = canopy_wire::event_metrics::of_metric(m) {
        return format!("{} ({})", metric_word(m), canopy_wire::event_metrics::ALL[k].unit);
    }
    match Metric::try_from(m) {
        Ok(Metric::Exclusive) => "exclusive us".into(),
        Ok(Metric::Inclusive) => "inclusive us".into(),
        Ok(Metric::Calls) => "calls".into(),
        _ => metric_word(m),
    }
}

/// The column a table of summaries is sorted by (largest first; names alphabetically).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortBy {
    #[default]
    Mean,
    Max,
    Min,
    Std,
    Ranks,
    Name,
}

impl SortBy {
    pub fn next(self) -> SortBy {
        match self {
            SortBy::Mean => SortBy::Max,
            SortBy::Max => SortBy::Min,
            SortBy::Min => SortBy::Std,
            SortBy::Std => SortBy::Ranks,
            SortBy::Ranks => SortBy::Name,
            SortBy::Name => SortBy::Mean,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            SortBy::Mean => "mean",
            SortBy::Max => "max",
            SortBy::Min => "min",
            SortBy::Std => "std",
            SortBy::Ranks => "ranks",
            SortBy::Name => "event",
        }
    }
}

/// Whether the rows name more than one application (the stats filter's `by_app` over coupled applications), so
/// that the table shows each row's.
pub fn several_apps(stats: &[EventStats]) -> bool {
    stats.iter().any(|s| s.app != stats[0].app)
}

/// A row's label: its event's name, after its application's when `with_app`.
pub fn label(s: &EventStats, names: &HashMap<u64, String>, with_app: bool) -> String {
    if with_app {
        format!("{}: {}", s.app, name_of(names, s.id))
    } else {
        name_of(names, s.id)
    }
}

/// The summaries of `metric`, sorted by `by`.
pub fn sorted<'a>(
    stats: &'a [EventStats],
    metric: i32,
    by: SortBy,
    names: &HashMap<u64, String>,
) -> Vec<&'a EventStats> {
    let mut rows: Vec<&EventStats> = stats.iter().filter(|s| s.metric == metric).collect();
    let key = |s: &EventStats| {
        let sum = s.summary.clone().unwrap_or_default();
        match by {
            SortBy::Mean => sum.mean,
            SortBy::Max => sum.max,
            SortBy::Min => sum.min,
            SortBy::Std => sum.std,
            SortBy::Ranks => sum.count as f64,
            SortBy::Name => 0.0,
        }
    };
    if by == SortBy::Name {
        rows.sort_by_key(|s| (name_of(names, s.id), s.app.clone()));
    } else {
        rows.sort_by(|a, b| key(b).total_cmp(&key(a)));
    }
    rows
}

/// A number in at most `w` columns: one decimal while it fits, then none, then in scientific notation.
fn number(v: f64, w: usize) -> String {
    let s = format!("{v:.1}");
    if s.len() <= w {
        return s;
    }
    let s = format!("{v:.0}");
    if s.len() <= w {
        return s;
    }
    format!("{v:.1e}")
}

/// The narrowest an event's name is cut to before a number column is left out.
const NAME_MIN: u16 = 22;

/// The width of the application column (a longer name is cut): narrow enough that, at 80 columns, a stream with
/// quantiles still shows p50 and p99 beside it.
const APP_WIDTH: u16 = 8;

/// The quantiles the watch tables show when a stream has them: p50 and p99.
const SHOWN_QUANTILES: [(f64, &str); 2] = [(0.5, "p50"), (0.99, "p99")];

/// A row's value of quantile `q`, if its stream asks for it.
fn quantile(s: &EventStats, q: f64) -> Option<f64> {
    s.quantiles.iter().find(|x| x.q == q).map(|x| x.value)
}

/// A table of summaries of `metric`: event, its application (when the rows name more than one), ranks, mean,
/// min, p50 and p99 (when the stream has them), max, std, the rank of the maximum; the sort column marked with
/// `↓`. With quantiles, they take the place of min and std at 80 columns; the application is kept as the mean
/// is.
pub fn stats_lines(
    stats: &[EventStats],
    names: &HashMap<u64, String>,
    metric: i32,
    by: SortBy,
    width: u16,
    top: usize,
) -> Lines {
    let mark = |s: SortBy, label: &str| {
        if s == by {
            format!("{label}↓")
        } else {
            label.to_string()
        }
    };
    let rows: Vec<&EventStats> = sorted(stats, metric, by, names).into_iter().take(top).collect();
    let shown: Vec<(f64, &str)> = SHOWN_QUANTILES
        .into_iter()
        .filter(|&(q, _)| rows.iter().any(|s| quantile(s, q).is_some()))
        .collect();
    // Priorities (0 kept first) without quantiles, and with them.
    let with = !shown.is_empty();
    let col = |width, plain, quantiles| Column {
        width,
        priority: if with { quantiles } else { plain },
    };
    let mut head = vec![
        mark(SortBy::Name, &format!("event ({})", metric_title(metric))),
        mark(SortBy::Ranks, "ranks"),
        mark(SortBy::Mean, "mean"),
        mark(SortBy::Min, "min"),
    ];
    // The ranks holding the extremes outrank the spread: at 80 columns they are what shows where the
    // imbalance is.
    head.push("min@rank".to_string());
    let mut cols = vec![
        col(0, 0, 0),
        col(6, 3, 3),
        col(11, 0, 0),
        col(11, 2, 4),
        col(8, 2, 4),
    ];
    let with_app = several_apps(stats);
    if with_app {
        head.insert(1, "app".to_string());
        cols.insert(1, col(APP_WIDTH, 0, 0));
    }
    for (_, label) in &shown {
        head.push(label.to_string());
        cols.push(col(11, 2, 2));
    }
    head.extend([
        mark(SortBy::Max, "max"),
        "max@rank".to_string(),
        mark(SortBy::Std, "std"),
    ]);
    cols.extend([col(11, 1, 1), col(8, 1, 1), col(11, 4, 5)]);
    let body: Vec<Vec<String>> = rows
        .into_iter()
        .map(|s| {
            let sum = s.summary.clone().unwrap_or_default();
            let rank_of = |r: &Option<canopy_proto::filters::v1::RankRef>| {
                r.as_ref().map(|r| r.rank.to_string()).unwrap_or_default()
            };
            let mut cells = vec![
                name_of(names, s.id),
                sum.count.to_string(),
                number(sum.mean, 11),
                number(sum.min, 11),
                rank_of(&sum.min_rank),
            ];
            if with_app {
                cells.insert(1, s.app.clone());
            }
            for &(q, _) in &shown {
                cells.push(quantile(s, q).map(|v| number(v, 11)).unwrap_or_default());
            }
            cells.extend([number(sum.max, 11), rank_of(&sum.max_rank), number(sum.std, 11)]);
            cells
        })
        .collect();
    lay_out(&head, &body, &cols, width, NAME_MIN)
}

/// A histogram's counts as one block character a bin, the fullest bin a full block.
pub fn bins_line(counts: &[u64]) -> String {
    const LEVELS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let most = counts.iter().copied().max().unwrap_or(0).max(1);
    counts
        .iter()
        .map(|&c| {
            if c == 0 {
                '·'
            } else {
                LEVELS[(c * 8).div_ceil(most).clamp(1, 8) as usize]
            }
        })
        .collect()
}

/// The histograms of `metric` for the events in `order` (the table's order), a line each: name, range, bins.
pub fn histogram_lines(
    hists: &[Histogram],
    order: &[u64],
    names: &HashMap<u64, String>,
    metric: i32,
    width: u16,
    top: usize,
) -> Vec<String> {
    // Broken down by application, an event has a histogram per application, in the order of their names.
    let mut by_id: HashMap<u64, Vec<&Histogram>> = HashMap::new();
    for h in hists.iter().filter(|h| h.metric == metric) {
        by_id.entry(h.id).or_default().push(h);
    }
    let with_app = hists.iter().any(|h| h.app != hists[0].app);
    // The order comes from the stats rows, which name an event once per application: each event once.
    let mut seen = std::collections::HashSet::new();
    order
        .iter()
        .filter(|id| seen.insert(**id))
        .filter_map(|id| by_id.get(id))
        .flatten()
        .take(top)
        .map(|h| {
            let range = format!("{}..{}", number(h.lo, 10), number(h.hi, 10));
            let bins = bins_line(&h.counts);
            let name_w = usize::from(width)
                .saturating_sub(range.chars().count() + bins.chars().count() + 4)
                .clamp(8, 30);
            let name = if with_app {
                format!("{}: {}", h.app, name_of(names, h.id))
            } else {
                name_of(names, h.id)
            };
            let line = format!("{:<name_w$}  {range}  {bins}", truncate(&name, name_w));
            truncate(&line, usize::from(width))
        })
        .collect()
}

/// A classify result: a summary line, then a line per class (id, members, ranks, an example event).
pub fn class_lines(r: &ClassResult, width: u16, top: usize) -> Lines {
    let head = vec![
        "example event".to_string(),
        "class".to_string(),
        "size".to_string(),
        "ranks".to_string(),
    ];
    let cols = [
        Column {
            width: 0,
            priority: 0,
        },
        Column {
            width: 16,
            priority: 2,
        },
        Column {
            width: 6,
            priority: 0,
        },
        Column {
            width: 16,
            priority: 1,
        },
    ];
    let body: Vec<Vec<String>> = r
        .classes
        .iter()
        .take(top)
        .map(|c| {
            let ranks: Vec<String> = c
                .ranks
                .iter()
                .map(|g| {
                    if g.first == g.last {
                        g.first.to_string()
                    } else {
                        format!("{}-{}", g.first, g.last)
                    }
                })
                .collect();
            vec![
                c.example_event.clone(),
                format!("{:016x}", c.class_id),
                c.size.to_string(),
                ranks.join(","),
            ]
        })
        .collect();
    lay_out(&head, &body, &cols, width, 14)
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::filters::v1::{Class, RankRange, Summary};

    fn row(id: u64, metric: Metric, mean: f64, count: u64) -> EventStats {
        EventStats {
            id,
            metric: metric as i32,
            summary: Some(Summary {
                count,
                mean,
                min: mean - 1.0,
                max: mean * 2.0,
                std: 0.5,
                ..Default::default()
            }),
            quantiles: Vec::new(),
            app: String::new(),
        }
    }

    fn names() -> HashMap<u64, String> {
        [
            (1, "MPI_Allreduce".to_string()),
            (
                2,
                "a_rather_long_function_name_from_a_template_instantiation".to_string(),
            ),
            (3, "compute".to_string()),
        ]
        .into()
    }

    fn stats() -> Vec<EventStats> {
        vec![
            row(1, Metric::Exclusive, 50.0, 8),
            row(2, Metric::Exclusive, 900.0, 4),
            row(3, Metric::Exclusive, 300.0, 8),
            row(1, Metric::Calls, 7.0, 8),
            row(3, Metric::Inclusive, 400.0, 8),
            row(1, Metric::PageFaultsExclusive, 3.0, 8),
        ]
    }

    #[test]
    fn metrics_cycle_exclusive_inclusive_calls_then_the_others() {
        assert_eq!(
            metrics_of(&stats()),
            vec![
                Metric::Exclusive as i32,
                Metric::Inclusive as i32,
                Metric::Calls as i32,
                Metric::PageFaultsExclusive as i32
            ]
        );
        assert_eq!(metric_title(Metric::Exclusive as i32), "exclusive us");
        assert_eq!(
            metric_title(Metric::PageFaultsExclusive as i32),
            "page-faults excl (faults)"
        );
    }

    #[test]
    fn sort_orders_put_the_largest_first_and_names_alphabetically() {
        let s = stats();
        let n = names();
        let ids = |by| -> Vec<u64> {
            sorted(&s, Metric::Exclusive as i32, by, &n)
                .iter()
                .map(|r| r.id)
                .collect()
        };
        assert_eq!(ids(SortBy::Mean), vec![2, 3, 1]);
        assert_eq!(ids(SortBy::Ranks)[2], 2);
        assert_eq!(ids(SortBy::Name), vec![1, 2, 3]);
        let mut by = SortBy::Mean;
        for _ in 0..6 {
            by = by.next();
        }
        assert_eq!(by, SortBy::Mean);
    }

    #[test]
    fn a_stats_table_fits_80_columns_with_names_cut_and_the_widest_has_every_column() {
        let s = stats();
        let n = names();
        for width in [40u16, 60, 80, 120, 200] {
            let t = stats_lines(&s, &n, Metric::Exclusive as i32, SortBy::Mean, width, 10);
            assert_eq!(t.rows.len(), 3);
            for l in std::iter::once(&t.header).chain(&t.rows) {
                assert!(l.chars().count() <= usize::from(width), "{width}: {l}");
            }
            assert!(t.header.contains("mean↓"), "{}", t.header);
            assert!(t.rows[0].starts_with("a_rather"), "{:?}", t.rows);
            assert!(t.rows[2].starts_with("MPI_Allreduce"), "{:?}", t.rows);
        }
        let narrow = stats_lines(&s, &n, Metric::Exclusive as i32, SortBy::Mean, 80, 10);
        assert!(narrow.rows[0].contains('…'), "{:?}", narrow.rows);
        // At 80 columns the ranks holding the extremes stay.
        assert!(
            narrow.header.contains("min@rank") && narrow.header.contains("max@rank"),
            "{}",
            narrow.header
        );
        let wide = stats_lines(&s, &n, Metric::Exclusive as i32, SortBy::Max, 200, 10);
        assert!(
            wide.header.contains("max@rank") && wide.header.contains("max↓"),
            "{}",
            wide.header
        );
        assert!(wide.rows[0].contains("1800.0"), "{:?}", wide.rows);
        // Another metric: its title heads the table and only its rows are shown.
        let calls = stats_lines(&s, &n, Metric::Calls as i32, SortBy::Mean, 80, 10);
        assert!(calls.header.starts_with("event (calls)"), "{}", calls.header);
        assert_eq!(calls.rows.len(), 1);
    }

    #[test]
    fn an_app_column_shows_when_the_rows_name_more_than_one_application() {
        let n = names();
        let of = |app: &str, r: EventStats| EventStats { app: app.into(), ..r };
        let one: Vec<EventStats> = stats().into_iter().map(|r| of("simulation", r)).collect();
        let t = stats_lines(&one, &n, Metric::Exclusive as i32, SortBy::Mean, 80, 10);
        assert!(!t.header.split_whitespace().any(|w| w == "app"), "{}", t.header);
        let mut two = one.clone();
        two.push(of("analysis", row(1, Metric::Exclusive, 7.0, 2)));
        for width in [60u16, 80, 120] {
            let t = stats_lines(&two, &n, Metric::Exclusive as i32, SortBy::Mean, width, 10);
            for l in std::iter::once(&t.header).chain(&t.rows) {
                assert!(l.chars().count() <= usize::from(width), "{width}: {l}");
            }
            assert!(
                t.header.split_whitespace().any(|w| w == "app"),
                "{width}: {}",
                t.header
            );
            assert!(t.header.contains("mean↓"), "{width}: {}", t.header);
            // The same event, once per application, each row saying which.
            let allreduce: Vec<&String> = t.rows.iter().filter(|r| r.starts_with("MPI_Allreduce")).collect();
            assert_eq!(allreduce.len(), 2, "{width}: {:?}", t.rows);
            assert!(allreduce.iter().any(|r| r.contains("simulat…")), "{allreduce:?}");
            assert!(allreduce.iter().any(|r| r.contains("analysis")), "{allreduce:?}");
        }
        // With quantiles, p50 still fits beside the application and the rank of the max at 80 columns.
        for r in &mut two {
            r.quantiles = [(0.5, 1.0), (0.99, 2.0)]
                .map(|(q, value)| canopy_proto::filters::v1::Quantile { q, value })
                .to_vec();
        }
        let t = stats_lines(&two, &n, Metric::Exclusive as i32, SortBy::Mean, 80, 10);
        let words: Vec<&str> = t.header.split_whitespace().collect();
        for label in ["app", "mean↓", "p50", "max", "max@rank"] {
            assert!(words.contains(&label), "{label}: {}", t.header);
        }
        for l in std::iter::once(&t.header).chain(&t.rows) {
            assert!(l.chars().count() <= 80, "{l}");
        }
    }

    #[test]
    fn quantiles_show_as_p50_and_p99_in_place_of_min_and_std_at_80_columns_beside_the_rank_of_the_max() {
        let qs = |p50: f64, p99: f64| {
            [(0.5, p50), (0.9, p50 + 1.0), (0.99, p99)]
                .map(|(q, value)| canopy_proto::filters::v1::Quantile { q, value })
                .to_vec()
        };
        let mut s = stats();
        s[0].quantiles = qs(48.5, 97.25);
        s[1].quantiles = qs(880.0, 1750.0);
        s[2].quantiles = qs(299.0, 590.0);
        let n = names();
        let t = stats_lines(&s, &n, Metric::Exclusive as i32, SortBy::Mean, 80, 10);
        for l in std::iter::once(&t.header).chain(&t.rows) {
            assert!(l.chars().count() <= 80, "{l}");
        }
        let words: Vec<&str> = t.header.split_whitespace().collect();
        assert_eq!(
            words[words.len() - 5..],
            ["mean↓", "p50", "p99", "max", "max@rank"],
            "{}",
            t.header
        );
        assert!(
            t.rows[0].contains("880.0") && t.rows[0].contains("1750.0"),
            "{:?}",
            t.rows
        );
        assert!(!t.header.contains("p90"), "{}", t.header);
        let wide = stats_lines(&s, &n, Metric::Exclusive as i32, SortBy::Mean, 200, 10);
        for label in ["min", "p50", "p99", "max", "std", "max@rank"] {
            assert!(wide.header.contains(label), "{label}: {}", wide.header);
        }
        // A metric whose rows have no quantiles keeps the table it had.
        let calls = stats_lines(&s, &n, Metric::Calls as i32, SortBy::Mean, 80, 10);
        assert!(
            !calls.header.contains("p50") && calls.header.contains("min"),
            "{}",
            calls.header
        );
    }

    #[test]
    fn histograms_are_a_line_of_block_characters_in_the_tables_order() {
        assert_eq!(bins_line(&[0, 1, 4, 8]), "·▁▄█");
        let h = |id, lo, hi| Histogram {
            id,
            metric: Metric::Exclusive as i32,
            lo,
            hi,
            counts: vec![1, 2, 0, 4],
            app: String::new(),
        };
        let lines = histogram_lines(
            &[h(1, 0.0, 10.0), h(3, 5.0, 9.5)],
            &[3, 2, 1],
            &names(),
            Metric::Exclusive as i32,
            80,
            5,
        );
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0].starts_with("compute") && lines[0].ends_with("5.0..9.5  ▂▄·█"),
            "{lines:?}"
        );
        assert!(lines[1].starts_with("MPI_Allreduce"), "{lines:?}");
        // Per application, each of an event's histograms is a line naming its application.
        let of = |app: &str, id, lo, hi| Histogram {
            app: app.into(),
            ..h(id, lo, hi)
        };
        let lines = histogram_lines(
            &[of("analysis", 3, 1.0, 2.0), of("sim", 3, 5.0, 9.5)],
            &[3, 3],
            &names(),
            Metric::Exclusive as i32,
            80,
            5,
        );
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].starts_with("analysis: compute") && lines[0].contains("1.0..2.0"),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with("sim: compute") && lines[1].contains("5.0..9.5"),
            "{lines:?}"
        );
    }

    #[test]
    fn a_class_table_names_each_class_by_an_example_and_its_ranks() {
        let r = ClassResult {
            classes: vec![Class {
                class_id: 0xabc,
                size: 6,
                example_event: "MPI_Allreduce".into(),
                ranks: vec![
                    RankRange {
                        app: String::new(),
                        first: 0,
                        last: 3,
                    },
                    RankRange {
                        app: String::new(),
                        first: 6,
                        last: 7,
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let t = class_lines(&r, 80, 10);
        let cells: Vec<&str> = t.rows[0].split_whitespace().collect();
        assert_eq!(cells, ["MPI_Allreduce", "0000000000000abc", "6", "0-3,6-7"]);
        let narrow = class_lines(&r, 40, 10);
        assert!(narrow.rows[0].chars().count() <= 40);
        assert!(narrow.rows[0].contains("0-3,6-7"), "{:?}", narrow.rows);
    }
}
