//! The history of a utilization stream that `canopy watch` draws: the last ten seconds of bins, fed by the
//! stream's `UtilizationResult`s in any order, and the bars and shares the views and the plain lines show.

use std::collections::{BTreeMap, HashMap};

use canopy_proto::filters::v1::UtilizationResult;

/// A whole bin: a share of 250 is all of its time.
pub const FULL: u32 = 250;
/// How much time the history keeps, in microseconds: the stacked view's ten seconds.
pub const WINDOW_US: u64 = 10_000_000;
/// The most bins the history keeps, whatever their width: ten seconds of 1 ms bins, twice over.
pub const MAX_BINS: usize = 20_000;
/// The name of a bin's time in no activity (250 less the bin's shares). For a program measured only by its
/// MPI wrapper, that is the time it computes.
pub const UNTRACKED: &str = "untracked (compute)";
/// The activity id of "other": the activities below the filter's threshold, folded together.
pub const OTHER: u64 = 0;

/// One bin: the ranks it averages over and each activity's share (0 to 250).
#[derive(Debug, Clone, Default, PartialEq)]
struct Bin {
    ranks: u32,
    shares: Vec<(u64, u32)>,
}

/// One bar of a view: the mean share of each activity over the bins with data in the bar's time, as fractions
/// of the whole in stacking order (bottom first), and the untracked remainder.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub parts: Vec<(u64, f64)>,
    pub untracked: f64,
}

/// Each activity's mean share over some bins, as fractions, largest first, and the untracked remainder.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shares {
    pub activities: Vec<(u64, f64)>,
    pub untracked: f64,
    /// Bins with data the shares are over.
    pub bins: usize,
}

/// The bins of one utilization stream, by the time they begin (microseconds since the Unix epoch): a bin that
/// arrives twice is kept once, a late one takes its place, and bins older than ten seconds before the newest
/// are dropped.
#[derive(Debug, Default)]
pub struct History {
    bins: BTreeMap<u64, Bin>,
    bin_us: u32,
    names: HashMap<u64, String>,
    /// Each activity's place in the order of first appearance: its colour and its place in the stack.
    slots: HashMap<u64, usize>,
}

/// Why a result was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadResult(pub String);

impl std::fmt::Display for BadResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The bins of a result, checked: (start in microseconds, bin), in time order.
fn bins_of(r: &UtilizationResult) -> Result<Vec<(u64, Bin)>, BadResult> {
    if r.bin_us == 0 {
        return Err(BadResult("a bin of 0 us".into()));
    }
    let records: usize = r.counts.iter().map(|&c| c as usize).sum();
    if records != r.activity.len() || records != r.share.len() {
        return Err(BadResult(format!(
            "{} records counted, {} activities and {} shares",
            records,
            r.activity.len(),
            r.share.len()
        )));
    }
    let start = r.start_unix_ns / 1000;
    let mut out = Vec::with_capacity(r.counts.len());
    let mut next = 0;
    for (i, &count) in r.counts.iter().enumerate() {
        let mut bin = Bin {
            // A result without per-bin ranks still has data in every bin that has records.
            ranks: r.ranks.get(i).copied().unwrap_or(r.profiles.max(1)),
            shares: Vec::with_capacity(count as usize),
        };
        for k in next..next + count as usize {
            let Some(&id) = r.activities.get(r.activity[k] as usize) else {
                return Err(BadResult(format!(
                    "record {k} names activity {} of {}",
                    r.activity[k],
                    r.activities.len()
                )));
            };
            let share = r.share[k].min(FULL);
            match bin.shares.iter_mut().find(|(a, _)| *a == id) {
                Some((_, s)) => *s = (*s + share).min(FULL),
                None => bin.shares.push((id, share)),
            }
        }
        next += count as usize;
        out.push((start + i as u64 * u64::from(r.bin_us), bin));
    }
    Ok(out)
}

impl History {
    /// Takes a result's bins. Bins older than the window before the newest are dropped; so is everything when
    /// the result does not hold together.
    pub fn push(&mut self, r: &UtilizationResult) -> Result<(), BadResult> {
        let bins = bins_of(r)?;
        self.bin_us = r.bin_us;
        for (id, name) in r.activities.iter().zip(&r.names) {
            if !name.is_empty() {
                self.names.insert(*id, name.clone());
            }
        }
        for &id in &r.activities {
            let next = self.slots.len();
            self.slots.entry(id).or_insert(next);
        }
        for (t, bin) in bins {
            if t + WINDOW_US < self.newest_end() {
                continue;
            }
            self.bins.insert(t, bin);
        }
        let oldest = self.newest_end().saturating_sub(WINDOW_US);
        self.bins = self.bins.split_off(&oldest);
        while self.bins.len() > MAX_BINS {
            self.bins.pop_first();
        }
        Ok(())
    }

    /// The end of the newest bin (microseconds since the Unix epoch), 0 before any.
    pub fn newest_end(&self) -> u64 {
        self.bins
            .last_key_value()
            .map_or(0, |(t, _)| t + u64::from(self.bin_us))
    }

    /// The width of the newest result's bins, in microseconds.
    pub fn bin_us(&self) -> u32 {
        self.bin_us
    }

    /// Bins held.
    pub fn len(&self) -> usize {
        self.bins.len()
    }

    /// The name of an activity as the results gave it: "other" for 0, `None` for an id no result named.
    pub fn name(&self, id: u64) -> Option<&str> {
        match self.names.get(&id) {
            Some(n) => Some(n),
            None if id == OTHER => Some("other"),
            None => None,
        }
    }

    /// An activity's place in the order the history first saw it: the same activity keeps its colour.
    pub fn slot(&self, id: u64) -> usize {
        self.slots.get(&id).copied().unwrap_or(usize::MAX)
    }

    /// The stacking order: activities in order of first appearance, "other" above them.
    fn stack_key(&self, id: u64) -> (bool, usize) {
        (id == OTHER, self.slot(id))
    }

    /// The mean shares over the bins with data that begin in `from..to` (microseconds since the epoch).
    pub fn shares(&self, from: u64, to: u64) -> Shares {
        let mut sums: HashMap<u64, u64> = HashMap::new();
        let mut bins = 0usize;
        for bin in self.bins.range(from..to.max(from)).map(|(_, b)| b) {
            if bin.ranks == 0 {
                continue;
            }
            bins += 1;
            for &(id, s) in &bin.shares {
                *sums.entry(id).or_default() += u64::from(s);
            }
        }
        if bins == 0 {
            return Shares::default();
        }
        let whole = (bins as u64 * u64::from(FULL)) as f64;
        let mut activities: Vec<(u64, f64)> =
            sums.into_iter().map(|(id, s)| (id, s as f64 / whole)).collect();
        activities.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then(self.stack_key(a.0).cmp(&self.stack_key(b.0)))
        });
        let tracked: f64 = activities.iter().map(|a| a.1).sum();
        Shares {
            activities,
            untracked: (1.0 - tracked).max(0.0),
            bins,
        }
    }

    /// The shares over the whole history.
    pub fn window_shares(&self) -> Shares {
        self.shares(0, u64::MAX)
    }

    /// `n` bars of `width_us` each, oldest first, the last ending at the newest bin's end rounded up to a whole
    /// bar (so a bar always covers the same stretch of time as the view scrolls). A bar whose time holds no bin
    /// with data is `None`.
    pub fn bars(&self, n: usize, width_us: u64) -> Vec<Option<Bar>> {
        let width_us = width_us.max(1);
        let end = self.newest_end().div_ceil(width_us) * width_us;
        (0..n)
            .map(|k| {
                let from = end.saturating_sub((n - k) as u64 * width_us);
                let to = end.saturating_sub((n - k - 1) as u64 * width_us);
                let s = self.shares(from, to);
                (s.bins > 0).then(|| {
                    let mut parts = s.activities;
                    parts.retain(|p| p.1 > 0.0);
                    parts.sort_by_key(|p| self.stack_key(p.0));
                    Bar {
                        parts,
                        untracked: s.untracked,
                    }
                })
            })
            .collect()
    }
}

/// The mean shares over one result's bins with data; `None` if it does not hold together.
pub fn period_shares(r: &UtilizationResult) -> Option<(History, Shares)> {
    let mut h = History::default();
    h.push(r).ok()?;
    let s = h.window_shares();
    Some((h, s))
}

/// A percentage with one decimal.
pub fn percent(f: f64) -> String {
    format!("{:.1}%", f * 100.0)
}

/// The plain line of one period: the stream, its round and ranks, its top activities and the untracked time.
/// `fallback` names the activities the result left unnamed.
pub fn summary_line(
    stream: &str,
    round: u64,
    r: &UtilizationResult,
    fallback: &HashMap<u64, String>,
    top: usize,
) -> String {
    let Some((h, s)) = period_shares(r) else {
        return format!("{stream} round {round}  malformed utilization result");
    };
    let mut line = format!(
        "{stream} round {round}  ranks {}  {} ms",
        r.profiles,
        r.counts.len() as u64 * u64::from(r.bin_us) / 1000
    );
    if s.bins == 0 {
        line.push_str("  no data");
        return line;
    }
    for (id, f) in s.activities.iter().take(top) {
        line.push_str(&format!("  {} {}", display_name(&h, fallback, *id), percent(*f)));
    }
    if s.activities.len() > top {
        let rest: f64 = s.activities[top..].iter().map(|a| a.1).sum();
        line.push_str(&format!(
            "  (+{} more {})",
            s.activities.len() - top,
            percent(rest)
        ));
    }
    line.push_str(&format!("  {UNTRACKED} {}", percent(s.untracked)));
    line
}

/// An activity's name: as a result gave it, else as the front-end's event names give it, else its id.
pub fn display_name(h: &History, fallback: &HashMap<u64, String>, id: u64) -> String {
    h.name(id)
        .map(str::to_string)
        .or_else(|| fallback.get(&id).cloned())
        .unwrap_or_else(|| format!("{id:016x}"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A result of `bins` bins of 1 ms from `start_ms`, each with the same (activity id, name, share) records.
    pub(crate) fn result(start_ms: u64, bins: usize, records: &[(u64, &str, u32)]) -> UtilizationResult {
        let mut sorted = records.to_vec();
        sorted.sort_by_key(|r| r.0);
        let mut r = UtilizationResult {
            start_unix_ns: start_ms * 1_000_000,
            bin_us: 1000,
            activities: sorted.iter().map(|r| r.0).collect(),
            names: sorted.iter().map(|r| r.1.to_string()).collect(),
            profiles: 8,
            threshold: 25,
            ..Default::default()
        };
        for _ in 0..bins {
            r.counts.push(sorted.len() as u32);
            r.ranks.push(8);
            for (i, rec) in sorted.iter().enumerate() {
                r.activity.push(i as u32);
                r.share.push(rec.2);
            }
        }
        r
    }

    const T0: u64 = 1_700_000_000_000;

    #[test]
    fn a_bar_is_the_mean_of_its_bins_with_the_remainder_untracked() {
        let mut h = History::default();
        h.push(&result(
            T0,
            1000,
            &[(7, "MPI_Allreduce", 125), (9, "MPI_Waitall", 50)],
        ))
        .unwrap();
        assert_eq!(h.len(), 1000);
        let bars = h.bars(100, 100_000);
        assert_eq!(bars.len(), 100);
        // One second of data: the last ten bars.
        assert!(bars[..90].iter().all(Option::is_none));
        let last = bars[99].clone().unwrap();
        assert_eq!(last.parts, vec![(7, 0.5), (9, 0.2)]);
        assert!((last.untracked - 0.3).abs() < 1e-9);
        let s = h.window_shares();
        assert_eq!(s.activities, vec![(7, 0.5), (9, 0.2)]);
        assert_eq!(h.name(7), Some("MPI_Allreduce"));
        assert_eq!(h.name(0), Some("other"));
    }

    #[test]
    fn late_and_repeated_results_are_kept_once_in_time_order() {
        let mut h = History::default();
        let a = result(T0 + 1000, 1000, &[(7, "a", 250)]);
        let b = result(T0, 1000, &[(9, "b", 100)]);
        h.push(&a).unwrap();
        h.push(&b).unwrap();
        h.push(&a).unwrap();
        assert_eq!(h.len(), 2000);
        assert_eq!(h.newest_end(), (T0 + 2000) * 1000);
        let bars = h.bars(100, 100_000);
        assert_eq!(bars[89].clone().unwrap().parts, vec![(9, 0.4)]);
        assert_eq!(bars[99].clone().unwrap().parts, vec![(7, 1.0)]);
    }

    #[test]
    fn only_the_last_ten_seconds_are_kept() {
        let mut h = History::default();
        for s in 0..15 {
            h.push(&result(T0 + s * 1000, 1000, &[(7, "a", 100)])).unwrap();
        }
        assert_eq!(h.len(), 10_000);
        // A result older than the window is dropped on arrival.
        h.push(&result(T0, 1000, &[(7, "a", 100)])).unwrap();
        assert_eq!(h.len(), 10_000);
        // Tiny bins are bounded by count.
        let mut tiny = result(T0 + 20_000, 1, &[(7, "a", 100)]);
        tiny.bin_us = 1;
        tiny.counts = vec![1; 50_000];
        tiny.ranks = vec![1; 50_000];
        tiny.activity = vec![0; 50_000];
        tiny.share = vec![10; 50_000];
        h.push(&tiny).unwrap();
        assert!(h.len() <= MAX_BINS);
    }

    #[test]
    fn a_result_that_does_not_hold_together_is_refused() {
        let mut h = History::default();
        let mut r = result(T0, 10, &[(7, "a", 100)]);
        r.share.pop();
        assert!(h.push(&r).is_err());
        let mut r = result(T0, 10, &[(7, "a", 100)]);
        r.activity[3] = 5;
        assert!(h.push(&r).is_err());
        assert_eq!(h.len(), 0);
    }

    #[test]
    fn bins_without_ranks_are_no_data() {
        let mut h = History::default();
        let mut r = result(T0, 200, &[(7, "a", 100)]);
        for k in 0..100 {
            r.ranks[k] = 0;
        }
        h.push(&r).unwrap();
        let bars = h.bars(2, 100_000);
        assert_eq!(bars[0], None);
        assert_eq!(bars[1].clone().unwrap().parts, vec![(7, 0.4)]);
    }

    #[test]
    fn the_plain_line_names_the_top_activities_and_the_untracked_time() {
        let r = result(
            T0,
            1000,
            &[(0, "other", 5), (7, "MPI_Allreduce", 125), (9, "", 50)],
        );
        let names = HashMap::from([(9, "MPI_Waitall".to_string())]);
        let line = summary_line("util", 12, &r, &names, 5);
        assert_eq!(
            line,
            "util round 12  ranks 8  1000 ms  MPI_Allreduce 50.0%  MPI_Waitall 20.0%  other 2.0%  \
             untracked (compute) 28.0%"
        );
        assert!(!line.contains('\x1b'));
    }
}
