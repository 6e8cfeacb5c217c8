//! The store's rows shaped for the figures: which events to show (the top N), each event's mean and min–max band
//! round by round, histogram cells, and series aligned on rounds for stacked charts. No drawing here.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use canopy_proto::filters::v1::Metric;
use canopy_store::{HistogramRow, StatRow};

/// Event and counter names by id, with a readable stand-in for an id the store has no name for.
#[derive(Debug, Default)]
pub struct Names(HashMap<u64, String>);

impl Names {
    pub fn new(pairs: Vec<(u64, String)>) -> Names {
        Names(pairs.into_iter().collect())
    }

    /// The name of `id`; `0x<hex>` when the store has none, "other" for the utilization's activity 0.
    pub fn of(&self, id: u64) -> String {
        match self.0.get(&id) {
            Some(name) => name.clone(),
            None if id == 0 => "other".to_string(),
            None => format!("{id:#018x}"),
        }
    }
}

/// The unit of a `stats` or `histograms` metric as the store's `units` table gives it (`us`, `calls`, `faults`...),
/// `value` for an application counter, whose unit is its own: the export's `unit` column.
pub fn metric_unit(metric: Metric) -> &'static str {
    match canopy_store::metric_unit(metric).0 {
        "" => "value",
        unit => unit,
    }
}

/// A metric's unit as axis labels show it: `µs` for the store's `us`.
pub fn display_unit(metric: Metric) -> &'static str {
    match metric_unit(metric) {
        "us" => "µs",
        unit => unit,
    }
}

/// A metric as axis labels and titles say it: `exclusive time`, `inclusive time`, else its word.
pub fn metric_label(metric: Metric) -> String {
    use canopy_store::Word;
    match metric {
        Metric::Inclusive | Metric::Exclusive => format!("{} time", metric.word()),
        m => m.word().to_string(),
    }
}

/// The metric a stream's time figures show: exclusive time when the rows have it, else inclusive time, else
/// the first metric they have.
pub fn time_metric<'a>(metrics: impl Iterator<Item = &'a Metric>) -> Option<Metric> {
    let present: Vec<Metric> = metrics.copied().collect();
    [Metric::Exclusive, Metric::Inclusive]
        .into_iter()
        .find(|m| present.contains(m))
        .or_else(|| present.first().copied())
}

/// The `n` ids with the largest `weight` summed over their rows, largest first (ties: smaller id first).
pub fn top_ids(rows: impl Iterator<Item = (u64, f64)>, n: usize) -> Vec<u64> {
    top_keys(rows, n)
}

/// The `n` keys with the largest `weight` summed over their rows, largest first (ties: smaller key first); none
/// whose weights sum to zero.
fn top_keys<K: Ord + std::hash::Hash + Clone>(rows: impl Iterator<Item = (K, f64)>, n: usize) -> Vec<K> {
    let mut totals: HashMap<K, f64> = HashMap::new();
    for (key, weight) in rows {
        if weight.is_finite() {
            *totals.entry(key).or_default() += weight;
        }
    }
    // A series that stays zero (a byte counter of a call that moves none) says nothing.
    let mut ranked: Vec<(K, f64)> = totals.into_iter().filter(|(_, w)| *w != 0.0).collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.into_iter().take(n).map(|(key, _)| key).collect()
}

/// One series of a stats stream: the application its rows stand for (`None`: every application) and the event.
pub type Series = (Option<String>, u64);

/// The stats rows a stream's time figure reads: of `metric`, of no class, that arrived with their round.
pub fn plain_stats(rows: &[StatRow], metric: Metric) -> impl Iterator<Item = &StatRow> {
    rows.iter()
        .filter(move |r| r.metric == metric && r.class_id.is_none() && !r.late)
}

/// The events with the largest total mean over the rounds: ToM's "top events", per application when the rows
/// are broken down by application (the stats filter's `by_app`).
pub fn top_stats_events(rows: &[StatRow], metric: Metric, n: usize) -> Vec<Series> {
    top_keys(
        plain_stats(rows, metric).map(|r| ((r.app.clone(), r.id), r.mean.unwrap_or(0.0))),
        n,
    )
}

/// Whether the rows name more than one application, so that a series' label names its application.
fn several_apps(rows: &[StatRow]) -> bool {
    let mut apps = rows.iter().map(|r| &r.app);
    let first = apps.next();
    apps.any(|a| Some(a) != first)
}

/// One round of an event: its mean over the ranks and the range of their values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BandPoint {
    pub round: u64,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

/// An event's mean with its min–max band, round by round.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    pub label: String,
    pub points: Vec<BandPoint>,
}

/// The bands of `series`, in their order; rounds without a mean are left out, a missing min or max is the mean.
/// When the rows name more than one application, each band's label is "application: event".
pub fn bands(rows: &[StatRow], metric: Metric, series: &[Series], names: &Names) -> Vec<Band> {
    let labelled = several_apps(rows);
    series
        .iter()
        .map(|(app, id)| {
            let mut points: Vec<BandPoint> = plain_stats(rows, metric)
                .filter(|r| r.id == *id && r.app == *app)
                .filter_map(|r| {
                    let mean = r.mean.filter(|m| m.is_finite())?;
                    Some(BandPoint {
                        round: r.round,
                        mean,
                        min: r.min.filter(|v| v.is_finite()).unwrap_or(mean),
                        max: r.max.filter(|v| v.is_finite()).unwrap_or(mean),
                    })
                })
                .collect();
            points.sort_by_key(|p| p.round);
            points.dedup_by_key(|p| p.round);
            let label = match app {
                Some(app) if labelled => format!("{app}: {}", names.of(*id)),
                None if labelled => format!("all: {}", names.of(*id)),
                _ => names.of(*id),
            };
            Band { label, points }
        })
        .collect()
}

/// Seconds between the first dumps of consecutive rounds: the time an iteration took, when the ranks dump once
/// per iteration (the MPI wrapper's `CANOPY_MPI_DUMP_ON`, the SDK's `canopy_dump`). A round after a gap, or
/// without a time, has none.
pub fn round_durations(rounds: &[canopy_store::RoundRow]) -> Vec<(u64, f64)> {
    rounds
        .windows(2)
        .filter_map(|w| {
            let (a, b) = (w[0].first_dump_unix_ns?, w[1].first_dump_unix_ns?);
            (w[1].round == w[0].round + 1 && b >= a).then(|| (w[1].round, (b - a) as f64 / 1e9))
        })
        .collect()
}

/// Per round, the share (%) of its duration a rank spent in MPI on average: the exclusive time of every `MPI_`
/// event summed over the ranks (each row's mean times the ranks it counts), over the ranks of the round
/// (`ranks`, its covered ranks) and its duration; at most 100. A round without its ranks has none.
pub fn mpi_share(
    rows: &[StatRow],
    names: &Names,
    durations: &[(u64, f64)],
    ranks: &BTreeMap<u64, u32>,
) -> Vec<(u64, f64)> {
    // Rows over every application when there are any, else each application's: never both, or twice.
    let whole = rows.iter().any(|r| r.app.is_none());
    let mut in_mpi: BTreeMap<u64, f64> = BTreeMap::new();
    for r in plain_stats(rows, Metric::Exclusive) {
        if r.app.is_none() == whole && names.of(r.id).starts_with("MPI_") {
            let mean = r.mean.filter(|m| m.is_finite()).unwrap_or(0.0);
            *in_mpi.entry(r.round).or_default() += mean * r.count as f64;
        }
    }
    durations
        .iter()
        .filter(|(_, secs)| *secs > 0.0)
        .filter_map(|(round, secs)| {
            let n = f64::from(*ranks.get(round).filter(|n| **n > 0)?);
            let us = in_mpi.get(round)? / n;
            Some((*round, (us / (secs * 1e6) * 100.0).min(100.0)))
        })
        .collect()
}

/// The histogram rows a stream's figures read: of `metric`, of no class, that arrived with their round.
pub fn plain_bins(rows: &[HistogramRow], metric: Metric) -> impl Iterator<Item = &HistogramRow> {
    rows.iter()
        .filter(move |r| r.metric == metric && r.class_id.is_none() && !r.late)
}

/// The events whose histograms hold the most time: the count of each bin times its midpoint, over the rounds.
pub fn top_histogram_events(rows: &[HistogramRow], metric: Metric, n: usize) -> Vec<u64> {
    top_ids(
        plain_bins(rows, metric).map(|r| {
            let mid = match (r.lo, r.hi) {
                (Some(lo), Some(hi)) => (lo + hi) / 2.0,
                _ => 1.0,
            };
            (r.id, r.count as f64 * mid)
        }),
        n,
    )
}

/// One bin of one round (or of `rounds` rounds from `round` on, merged): where it lies on the value axis and how
/// many ranks it holds (summed over the rounds merged).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeatCell {
    pub round: u64,
    pub rounds: u64,
    pub lo: f64,
    pub hi: f64,
    pub count: u64,
}

/// Merges consecutive rounds into columns so that at most `columns` remain: each column spans the same number of
/// rounds, its range is the union of theirs, cut into as many equal bins as a round has, and each bin of a
/// round adds its count to the column's bin holding its midpoint. Cells are returned as they are when they
/// already fit.
pub fn merge_rounds(cells: &[HeatCell], columns: usize) -> Vec<HeatCell> {
    let rounds: BTreeSet<u64> = cells.iter().map(|c| c.round).collect();
    let (Some(&first), Some(&last)) = (rounds.first(), rounds.last()) else {
        return Vec::new();
    };
    if rounds.len() <= columns.max(1) {
        return cells.to_vec();
    }
    let span = (last - first + 1).div_ceil(columns.max(1) as u64);
    let mut per_round: HashMap<u64, usize> = HashMap::new();
    for c in cells {
        *per_round.entry(c.round).or_default() += 1;
    }
    let bins = per_round.values().copied().max().unwrap_or(1).max(1);
    let mut groups: BTreeMap<u64, Vec<&HeatCell>> = BTreeMap::new();
    for c in cells {
        groups.entry((c.round - first) / span).or_default().push(c);
    }
    let mut out = Vec::with_capacity(groups.len() * bins);
    for (g, members) in groups {
        let lo = members.iter().map(|c| c.lo).fold(f64::INFINITY, f64::min);
        let hi = members.iter().map(|c| c.hi).fold(f64::NEG_INFINITY, f64::max);
        let width = (hi - lo) / bins as f64;
        let mut counts = vec![0u64; bins];
        for c in members {
            let mid = (c.lo + c.hi) / 2.0;
            let i = if width > 0.0 {
                (((mid - lo) / width).floor() as usize).min(bins - 1)
            } else {
                0
            };
            counts[i] += c.count;
        }
        let round = first + g * span;
        out.extend(counts.into_iter().enumerate().map(|(i, count)| HeatCell {
            round,
            rounds: span,
            lo: lo + i as f64 * width,
            hi: if i + 1 == bins {
                hi
            } else {
                lo + (i + 1) as f64 * width
            },
            count,
        }));
    }
    out
}

/// An event's bins round by round. With `by_value`, a bin spans its bounds (`lo`..`hi`, which move from round to
/// round with the ranks' range); else, or when a round lacks bounds, its index (`bin`..`bin + 1`). A round whose
/// values were all equal has one bin of zero width: it is drawn as a thin band around the value.
pub fn heat_cells(
    rows: &[HistogramRow],
    metric: Metric,
    id: u64,
    app: Option<&str>,
    by_value: bool,
) -> Vec<HeatCell> {
    plain_bins(rows, metric)
        .filter(|r| r.id == id && r.app.as_deref() == app)
        .map(|r| {
            let (lo, hi) = match (by_value, r.lo, r.hi) {
                (true, Some(lo), Some(hi)) if lo.is_finite() && hi.is_finite() => (lo, hi),
                _ => (f64::from(r.bin), f64::from(r.bin) + 1.0),
            };
            HeatCell {
                round: r.round,
                rounds: 1,
                lo,
                hi,
                count: r.count,
            }
        })
        .collect()
}

/// Series aligned on the same rounds, for stacked areas: `values[i]` of a series belongs to `rounds[i]`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Stack {
    pub rounds: Vec<u64>,
    pub series: Vec<(String, Vec<f64>)>,
}

impl Stack {
    /// Builds a stack from `(round, series label, value)` triples; a series absent from a round is 0 there.
    /// Series keep the order of their first appearance.
    pub fn from_points(points: impl Iterator<Item = (u64, String, f64)>) -> Stack {
        let mut rounds = BTreeSet::new();
        let mut order: Vec<String> = Vec::new();
        let mut values: HashMap<String, BTreeMap<u64, f64>> = HashMap::new();
        for (round, label, value) in points {
            rounds.insert(round);
            let by_round = values.entry(label.clone()).or_insert_with(|| {
                order.push(label.clone());
                BTreeMap::new()
            });
            *by_round.entry(round).or_default() += value;
        }
        let rounds: Vec<u64> = rounds.into_iter().collect();
        let series = order
            .into_iter()
            .map(|label| {
                let by_round = &values[&label];
                let v = rounds
                    .iter()
                    .map(|r| by_round.get(r).copied().unwrap_or(0.0))
                    .collect();
                (label, v)
            })
            .collect();
        Stack { rounds, series }
    }

    /// Keeps the `n` series with the largest sums and adds the others up into one series named `rest`.
    pub fn keep_largest(mut self, n: usize, rest: &str) -> Stack {
        if self.series.len() <= n {
            return self;
        }
        let sum = |v: &Vec<f64>| v.iter().sum::<f64>();
        self.series.sort_by(|a, b| sum(&b.1).total_cmp(&sum(&a.1)));
        let others = self.series.split_off(n);
        let mut folded = vec![0.0; self.rounds.len()];
        for (_, v) in &others {
            for (f, x) in folded.iter_mut().zip(v) {
                *f += x;
            }
        }
        self.series.push((rest.to_string(), folded));
        self
    }

    /// The sum of every series at each round: the top of the stack.
    pub fn totals(&self) -> Vec<f64> {
        (0..self.rounds.len())
            .map(|i| self.series.iter().map(|(_, v)| v[i]).sum())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(round: u64, id: u64, mean: f64, min: f64, max: f64) -> StatRow {
        StatRow {
            stream_id: 1,
            round,
            class_id: None,
            id,
            metric: Metric::Exclusive,
            count: 4,
            mean: Some(mean),
            std: Some(0.0),
            min: Some(min),
            max: Some(max),
            min_app: None,
            min_rank: None,
            max_app: None,
            max_rank: None,
            late: false,
            app: None,
        }
    }

    fn of_app(app: &str, mut row: StatRow) -> StatRow {
        row.app = Some(app.into());
        row
    }

    fn series(ids: &[u64]) -> Vec<Series> {
        ids.iter().map(|&id| (None, id)).collect()
    }

    #[test]
    fn top_events_rank_by_total_mean_over_rounds() {
        let rows = vec![
            stat(0, 1, 10.0, 9.0, 11.0),
            stat(1, 1, 10.0, 9.0, 11.0),
            stat(0, 2, 15.0, 1.0, 30.0),
            stat(0, 3, 1.0, 1.0, 1.0),
            stat(1, 3, 1.0, 1.0, 1.0),
        ];
        // 1: 20 over two rounds beats 2: 15 in one; 3 is last.
        assert_eq!(top_stats_events(&rows, Metric::Exclusive, 2), series(&[1, 2]));
        assert_eq!(top_stats_events(&rows, Metric::Exclusive, 8), series(&[1, 2, 3]));
        // Another metric, a class's rows or late rows do not count.
        let mut other = stat(0, 4, 1000.0, 0.0, 0.0);
        other.metric = Metric::Calls;
        let mut classed = stat(0, 5, 1000.0, 0.0, 0.0);
        classed.class_id = Some(7);
        let mut late = stat(0, 6, 1000.0, 0.0, 0.0);
        late.late = true;
        let rows = [rows, vec![other, classed, late]].concat();
        assert_eq!(top_stats_events(&rows, Metric::Exclusive, 3), series(&[1, 2, 3]));
    }

    #[test]
    fn series_that_stay_zero_are_not_top_events() {
        let rows = vec![
            stat(0, 1, 0.0, 0.0, 0.0),
            stat(1, 1, 0.0, 0.0, 0.0),
            stat(0, 2, 3.0, 1.0, 5.0),
        ];
        assert_eq!(top_stats_events(&rows, Metric::Exclusive, 8), series(&[2]));
    }

    #[test]
    fn a_rounds_duration_is_the_time_between_first_dumps_and_mpi_its_share() {
        let round = |round: u64, at_ms: Option<u64>| canopy_store::RoundRow {
            stream_id: 1,
            stream: "stats".into(),
            round,
            covered: 1,
            expected: 1,
            missing: Default::default(),
            missing_reason: None,
            unreachable_nodes: None,
            late_ranks: 0,
            result_bytes: 0,
            pieces: 1,
            first_dump_unix_ns: at_ms.map(|ms| ms * 1_000_000),
            closed_unix_ns: None,
        };
        // Round 3 is missing: round 4 has no duration; round 6 has no time.
        let rounds = [
            round(0, Some(1000)),
            round(1, Some(1500)),
            round(2, Some(2500)),
            round(4, Some(9000)),
            round(5, Some(9100)),
            round(6, None),
        ];
        let d = round_durations(&rounds);
        assert_eq!(d, vec![(1, 0.5), (2, 1.0), (5, 0.1)]);
        let names = Names::new(vec![
            (1, "MPI_Allreduce".into()),
            (2, "MPI_Send".into()),
            (3, "solve".into()),
        ]);
        // Round 1: 100 ms + 150 ms of MPI in 500 ms; round 2: 2 s of MPI in 1 s is at most 100%.
        let rows = vec![
            stat(1, 1, 100_000.0, 0.0, 0.0),
            stat(1, 2, 150_000.0, 0.0, 0.0),
            stat(1, 3, 999_000.0, 0.0, 0.0),
            stat(2, 1, 2_000_000.0, 0.0, 0.0),
        ];
        let of_count = |count: u64, r: StatRow| StatRow { count, ..r };
        let rows: Vec<StatRow> = rows.into_iter().map(|r| of_count(4, r)).collect();
        let ranks: BTreeMap<u64, u32> = [(1, 4), (2, 4)].into();
        assert_eq!(mpi_share(&rows, &names, &d, &ranks), vec![(1, 50.0), (2, 100.0)]);
        // An event only some ranks call counts over every rank of the round: one rank of 8 in MPI_Wait for
        // 400 ms of a 500 ms round is 10% on average, not 80%.
        let one = vec![of_count(1, stat(1, 2, 400_000.0, 0.0, 0.0))];
        let eight: BTreeMap<u64, u32> = [(1, 8)].into();
        assert_eq!(mpi_share(&one, &names, &d, &eight), vec![(1, 10.0)]);
        // Per application: each row counts by its ranks (3 ranks at 100 ms, 1 at 300 ms: 150 ms of 500).
        let of_app = |app: &str, count: u64, r: StatRow| StatRow {
            app: Some(app.into()),
            count,
            ..r
        };
        let rows = vec![
            of_app("sim", 3, stat(1, 1, 100_000.0, 0.0, 0.0)),
            of_app("viz", 1, stat(1, 1, 300_000.0, 0.0, 0.0)),
        ];
        assert_eq!(mpi_share(&rows, &names, &d, &ranks), vec![(1, 30.0)]);
    }

    #[test]
    fn ties_go_to_the_smaller_id() {
        let rows = vec![stat(0, 9, 5.0, 5.0, 5.0), stat(0, 4, 5.0, 5.0, 5.0)];
        assert_eq!(top_stats_events(&rows, Metric::Exclusive, 1), series(&[4]));
    }

    #[test]
    fn each_application_has_its_own_series_labelled_with_it() {
        let rows = vec![
            of_app("sim", stat(0, 1, 10.0, 9.0, 11.0)),
            of_app("viz", stat(0, 1, 2.0, 1.0, 3.0)),
            of_app("sim", stat(1, 1, 12.0, 9.0, 13.0)),
            of_app("viz", stat(0, 2, 5.0, 5.0, 5.0)),
        ];
        let top = top_stats_events(&rows, Metric::Exclusive, 2);
        assert_eq!(top, vec![(Some("sim".into()), 1), (Some("viz".into()), 2)]);
        let names = Names::new(vec![(1, "solve".into()), (2, "render".into())]);
        let b = bands(&rows, Metric::Exclusive, &top, &names);
        assert_eq!(
            (b[0].label.as_str(), b[1].label.as_str()),
            ("sim: solve", "viz: render")
        );
        // The sim series holds sim's rounds alone, not viz's row of the same event.
        assert_eq!(
            b[0].points.iter().map(|p| (p.round, p.mean)).collect::<Vec<_>>(),
            [(0, 10.0), (1, 12.0)]
        );
        // One application alone: labels are the events', as before.
        let one = vec![of_app("sim", stat(0, 1, 10.0, 9.0, 11.0))];
        let b = bands(
            &one,
            Metric::Exclusive,
            &top_stats_events(&one, Metric::Exclusive, 1),
            &names,
        );
        assert_eq!(b[0].label, "solve");
    }

    #[test]
    fn bands_follow_rounds_with_names_and_fill_missing_extremes() {
        let mut no_min = stat(2, 1, 4.0, 0.0, 6.0);
        no_min.min = None;
        let rows = vec![stat(1, 1, 3.0, 1.0, 5.0), no_min, stat(0, 1, 2.0, 1.0, 3.0)];
        let names = Names::new(vec![(1, "MPI_Send".into())]);
        let b = bands(&rows, Metric::Exclusive, &series(&[1, 2]), &names);
        assert_eq!(b[0].label, "MPI_Send");
        assert_eq!(b[1].label, "0x0000000000000002");
        assert!(b[1].points.is_empty());
        let p = &b[0].points;
        assert_eq!(p.iter().map(|p| p.round).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!((p[1].mean, p[1].min, p[1].max), (3.0, 1.0, 5.0));
        assert_eq!((p[2].min, p[2].max), (4.0, 6.0));
    }

    #[test]
    fn the_time_metric_prefers_exclusive_then_inclusive() {
        assert_eq!(
            time_metric([Metric::Calls, Metric::Inclusive, Metric::Exclusive].iter()),
            Some(Metric::Exclusive)
        );
        assert_eq!(
            time_metric([Metric::Calls, Metric::Inclusive].iter()),
            Some(Metric::Inclusive)
        );
        assert_eq!(time_metric([Metric::Calls].iter()), Some(Metric::Calls));
        assert_eq!(time_metric([].iter()), None);
        assert_eq!(metric_unit(Metric::Exclusive), "us");
        assert_eq!(display_unit(Metric::Exclusive), "µs");
        assert_eq!(metric_unit(Metric::PageFaultsExclusive), "faults");
        assert_eq!(metric_unit(Metric::HeapAtEntry), "bytes");
        assert_eq!(metric_unit(Metric::Counter), "value");
        assert_eq!(metric_label(Metric::Exclusive), "exclusive time");
        assert_eq!(metric_label(Metric::Calls), "calls");
    }

    fn bin(round: u64, id: u64, bin: u32, lo: f64, hi: f64, count: u64) -> HistogramRow {
        HistogramRow {
            stream_id: 2,
            round,
            class_id: None,
            id,
            metric: Metric::Exclusive,
            bin,
            lo: Some(lo),
            hi: Some(hi),
            count,
            late: false,
            app: None,
        }
    }

    #[test]
    fn histogram_top_weighs_counts_by_bin_midpoints_and_cells_keep_bounds() {
        let rows = vec![
            bin(0, 1, 0, 0.0, 10.0, 8),    // 8 * 5 = 40
            bin(0, 2, 0, 100.0, 200.0, 1), // 150
            bin(1, 1, 1, 10.0, 20.0, 2),   // 30
        ];
        assert_eq!(top_histogram_events(&rows, Metric::Exclusive, 2), vec![2, 1]);
        let cells = heat_cells(&rows, Metric::Exclusive, 1, None, true);
        assert_eq!(cells, vec![cell(0, 0.0, 10.0, 8), cell(1, 10.0, 20.0, 2)]);
        let by_index = heat_cells(&rows, Metric::Exclusive, 1, None, false);
        assert_eq!((by_index[1].lo, by_index[1].hi), (1.0, 2.0));
    }

    fn cell(round: u64, lo: f64, hi: f64, count: u64) -> HeatCell {
        HeatCell {
            round,
            rounds: 1,
            lo,
            hi,
            count,
        }
    }

    #[test]
    fn rounds_merge_into_columns_keeping_every_count() {
        // Rounds 0..6, two bins each; round r spans r..r+2.
        let cells: Vec<HeatCell> = (0..6)
            .flat_map(|r| {
                let lo = r as f64;
                [cell(r, lo, lo + 1.0, 3), cell(r, lo + 1.0, lo + 2.0, 1)]
            })
            .collect();
        assert_eq!(merge_rounds(&cells, 6), cells, "already fits");
        let merged = merge_rounds(&cells, 2);
        // Two columns of three rounds, two bins each, over the union of their ranges.
        assert_eq!(merged.len(), 4);
        assert_eq!(
            merged.iter().map(|c| c.count).sum::<u64>(),
            cells.iter().map(|c| c.count).sum::<u64>()
        );
        assert_eq!(merged[0], cell(0, 0.0, 2.0, 3 + 3 + 1).with_rounds(3));
        assert_eq!(merged[1], cell(0, 2.0, 4.0, 1 + 1 + 3).with_rounds(3));
        assert_eq!((merged[2].round, merged[2].lo, merged[2].hi), (3, 3.0, 5.0));
        assert_eq!(merge_rounds(&[], 4), Vec::new());
    }

    impl HeatCell {
        fn with_rounds(mut self, rounds: u64) -> HeatCell {
            self.rounds = rounds;
            self
        }
    }

    #[test]
    fn stacks_align_series_on_rounds_and_fold_the_smallest() {
        let s = Stack::from_points(
            [
                (0, "a".to_string(), 3.0),
                (0, "b".to_string(), 1.0),
                (2, "a".to_string(), 2.0),
                (2, "c".to_string(), 5.0),
                (2, "c".to_string(), 1.0),
            ]
            .into_iter(),
        );
        assert_eq!(s.rounds, [0, 2]);
        assert_eq!(
            s.series,
            [
                ("a".to_string(), vec![3.0, 2.0]),
                ("b".to_string(), vec![1.0, 0.0]),
                ("c".to_string(), vec![0.0, 6.0]),
            ]
        );
        assert_eq!(s.totals(), [4.0, 8.0]);
        let kept = s.keep_largest(1, "rest");
        assert_eq!(
            kept.series,
            [
                ("c".to_string(), vec![0.0, 6.0]),
                ("rest".to_string(), vec![4.0, 2.0]),
            ]
        );
        assert_eq!(kept.totals(), [4.0, 8.0]);
    }
}
