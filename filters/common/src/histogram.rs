//! Histograms over ranks, built in ToM's three phases: the global range goes down, the leaf bins the values it
//! buffered, and the counts add up the tree.
//!
//! Bins are equal-width between lo and hi, the global min and max: a value `v` goes to bin
//! `floor((v - lo) / (hi - lo) * bins)`, computed exactly as written, clamped to `bins - 1` so the maximum
//! lands in the last bin; when `lo == hi` every value goes to bin 0. The index depends only on `v`, lo, hi and
//! bins, so counts made at different leaves add up to exactly what binning all ranks at once gives.

use std::collections::BTreeMap;

use canopy_filter_proto::v1::{Histogram, Range, StatsColumns};

use crate::metrics::Key;
use crate::summary::StatsMap;

/// The bin of `v` among `bins` equal bins between `lo` and `hi` (see the module documentation).
pub fn bin_index(v: f64, lo: f64, hi: f64, bins: usize) -> usize {
    Binning::new(lo, hi, bins).index(v)
}

/// [`bin_index`] with what depends only on the range worked out once, for binning many values against it.
#[derive(Debug, Clone, Copy)]
pub struct Binning {
    lo: f64,
    hi: f64,
    span: f64,
    bins: f64,
    last: usize,
    /// Whether `hi - lo` is finite; else every term is halved (values near f64::MAX).
    finite: bool,
    /// No bins, or `lo == hi`: everything goes to bin 0.
    degenerate: bool,
}

impl Binning {
    pub fn new(lo: f64, hi: f64, bins: usize) -> Binning {
        let span = hi - lo;
        Binning {
            lo,
            hi,
            span,
            bins: bins as f64,
            last: bins.saturating_sub(1),
            finite: span.is_finite(),
            degenerate: bins == 0 || lo == hi,
        }
    }

    /// The bin of `v`: `floor((v - lo) / (hi - lo) * bins)`, clamped to the last bin.
    #[inline]
    pub fn index(&self, v: f64) -> usize {
        if self.degenerate {
            return 0;
        }
        let x = if self.finite {
            (v - self.lo) / self.span * self.bins
        } else {
            // The span overflows: halving every term keeps the ratio and stays in range.
            (v / 2.0 - self.lo / 2.0) / (self.hi / 2.0 - self.lo / 2.0) * self.bins
        };
        // `as` truncates toward zero, saturates, and maps NaN to 0: for x >= 0 that is floor(x), and an x below
        // 0 (a value under lo, which a global min never leaves) lands at 0 as floor(x) would after the same
        // cast. No call to libm's floor, which the baseline x86-64 target cannot inline.
        (x as usize).min(self.last)
    }
}

#[cfg(test)]
mod overflow_tests {
    use super::*;

    #[test]
    fn a_span_that_overflows_still_bins_by_position() {
        let (lo, hi) = (-f64::MAX, f64::MAX);
        assert_eq!(bin_index(lo, lo, hi, 10), 0);
        assert_eq!(bin_index(0.0, lo, hi, 10), 5);
        assert_eq!(bin_index(hi, lo, hi, 10), 9);
    }
}

/// The global ranges for binning: one per (id, metric), lo = min and hi = max of its summary, sorted by key.
pub fn ranges_of(stats: &StatsMap) -> Vec<Range> {
    stats
        .iter()
        .filter(|(_, s)| s.count > 0)
        .map(|(&(id, metric), s)| Range {
            id,
            metric,
            lo: s.min,
            hi: s.max,
            app: String::new(),
        })
        .collect()
}

/// The global ranges for binning from merged columns: one per row, lo = its min and hi = its max, sorted by
/// (application, key); each names its row's application when the rows are broken down by application.
pub fn ranges_of_columns(c: &StatsColumns) -> Vec<Range> {
    (0..c.id.len())
        .map(|row| Range {
            id: c.id[row],
            metric: c.metric[row],
            lo: c.min[row],
            hi: c.max[row],
            app: crate::columns::app_of(c, row).to_string(),
        })
        .collect()
}

/// A row of [`Samples`]: the application it stands for ("" for every application) and its key.
#[derive(Debug, Clone, Default, PartialEq)]
struct SampleRow {
    app: String,
    key: Key,
}

/// The raw values a leaf keeps for a round between phase 0 and phase 1, by the row its [`crate::fold::Fold`]
/// gave each key (rows are numbered from 0 in the order keys first appear), so keeping a value costs no lookup.
///
/// Values are kept in the order they come, each beside its row: a rank's values are written one after the
/// other into two flat buffers rather than scattered over a buffer per row, which at a thousand ranks is
/// megabytes apart. Binning reads them back in the same order.
///
/// [`Samples::clear`] keeps every buffer: a leaf that reuses its samples from round to round allocates (and
/// has the kernel zero) no new memory once the buffers have grown to the round's size.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// The first `len` rows are this round's; the rest keep their application's buffer for later rounds.
    rows: Vec<SampleRow>,
    len: usize,
    /// Every value kept this round, in the order added, and the row of each.
    values: Vec<f64>,
    row_of: Vec<u32>,
}

impl PartialEq for Samples {
    /// The same rows, and the same values in the same order for each row.
    fn eq(&self, other: &Samples) -> bool {
        self.rows[..self.len] == other.rows[..other.len]
            && (0..self.len as u32).all(|r| self.values_of(r).eq(other.values_of(r)))
    }
}

impl Samples {
    /// Empties the samples for a new round, keeping the buffers.
    pub fn clear(&mut self) {
        self.values.clear();
        self.row_of.clear();
        self.len = 0;
    }

    /// Keeps `v` of `key` in `row`, the row [`crate::fold::Fold::add`] returned for it; `app` is the
    /// application the row stands for ("" when the fold is not broken down by application), read when the row
    /// is new.
    ///
    /// # Panics
    /// If `row` is beyond the next new row. A row already held must hold `key`, as the fold's rows do: that is
    /// checked in debug builds only, since this runs for every value of every rank.
    #[inline(always)]
    pub fn add(&mut self, row: u32, app: &str, key: Key, v: f64) {
        let r = row as usize;
        if r < self.len {
            debug_assert_eq!(self.rows[r].key, key, "row {row} holds another key");
        } else {
            self.new_row(r, app, key);
        }
        self.values.push(v);
        self.row_of.push(row);
    }

    #[cold]
    fn new_row(&mut self, r: usize, app: &str, key: Key) {
        assert_eq!(r, self.len, "row {r} is not the next new row");
        if r == self.rows.len() {
            self.rows.push(SampleRow::default());
        }
        let new = &mut self.rows[r];
        new.app.clear();
        new.app.push_str(app);
        new.key = key;
        self.len += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The values kept in `row`, in the order added.
    fn values_of(&self, row: u32) -> impl Iterator<Item = f64> + '_ {
        self.values
            .iter()
            .zip(&self.row_of)
            .filter(move |(_, r)| **r == row)
            .map(|(v, _)| *v)
    }

    /// Bins the buffered values with the global `ranges`: one histogram per buffered (application, key) that
    /// has a range, sorted by (application, key). A row without a range (the root never saw it, which a correct
    /// tree cannot produce) is left out rather than binned against a guess.
    pub fn bin(&self, ranges: &[Range], bins: usize) -> Vec<Histogram> {
        let by_key: BTreeMap<(&str, Key), &Range> = ranges
            .iter()
            .map(|r| ((r.app.as_str(), (r.id, r.metric)), r))
            .collect();
        let mut order: Vec<u32> = (0..self.len as u32).collect();
        order.sort_unstable_by(|&a, &b| {
            let (a, b) = (&self.rows[a as usize], &self.rows[b as usize]);
            (a.app.as_str(), a.key).cmp(&(b.app.as_str(), b.key))
        });
        // Each row's binning and the offset of its counts, by row, so a value finds both in one look; a row
        // without a range has none.
        let mut slots: Vec<Option<(Binning, usize)>> = vec![None; self.len];
        let mut out = Vec::with_capacity(self.len);
        for r in order {
            let row = &self.rows[r as usize];
            let Some(range) = by_key.get(&(row.app.as_str(), row.key)) else {
                continue;
            };
            slots[r as usize] = Some((Binning::new(range.lo, range.hi, bins), out.len() * bins));
            out.push(Histogram {
                id: row.key.0,
                metric: row.key.1,
                lo: range.lo,
                hi: range.hi,
                counts: Vec::new(),
                app: row.app.clone(),
            });
        }
        // Every count in one buffer, `bins` per histogram, filled in one pass over the values.
        if bins == 0 {
            return out;
        }
        let mut counts = vec![0u64; out.len() * bins];
        for (&v, &r) in self.values.iter().zip(&self.row_of) {
            if let Some((binning, base)) = &slots[r as usize] {
                counts[base + binning.index(v)] += 1;
            }
        }
        for (h, c) in out.iter_mut().zip(counts.chunks_exact(bins)) {
            h.counts = c.to_vec();
        }
        out
    }
}

/// Histograms keyed by (application, id, metric), merged by adding counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistMap {
    map: BTreeMap<String, BTreeMap<Key, Histogram>>,
}

impl HistMap {
    pub fn new() -> HistMap {
        HistMap::default()
    }

    /// Checks that every histogram has `bins` counts, so a bad packet can be rejected before any of it merges.
    pub fn check(histograms: &[Histogram], bins: usize) -> Result<(), String> {
        match histograms.iter().find(|h| h.counts.len() != bins) {
            Some(h) => Err(format!(
                "histogram of event {:016x} metric {} has {} bins, expected {bins}",
                h.id,
                h.metric,
                h.counts.len()
            )),
            None => Ok(()),
        }
    }

    /// Adds the counts of `histograms` (checked with [`HistMap::check`]) to this map.
    pub fn merge(&mut self, histograms: &[Histogram]) {
        for h in histograms {
            let of_app = match self.map.get_mut(h.app.as_str()) {
                Some(m) => m,
                None => self.map.entry(h.app.clone()).or_default(),
            };
            match of_app.get_mut(&(h.id, h.metric)) {
                // Counts binned against another range cannot add up; such a packet is a protocol error
                // upstream (the phases exist to prevent it), so it is left out rather than merged wrongly.
                Some(mine) if mine.lo != h.lo || mine.hi != h.hi || mine.counts.len() != h.counts.len() => {}
                Some(mine) => {
                    for (c, add) in mine.counts.iter_mut().zip(&h.counts) {
                        *c += add;
                    }
                }
                None => {
                    of_app.insert((h.id, h.metric), h.clone());
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The histograms sorted by (application, id, metric).
    pub fn to_vec(&self) -> Vec<Histogram> {
        self.map.values().flat_map(|m| m.values().cloned()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_filter_proto::v1::RankRef;

    #[test]
    fn bin_edges() {
        assert_eq!(bin_index(0.0, 0.0, 10.0, 10), 0);
        assert_eq!(bin_index(0.999, 0.0, 10.0, 10), 0);
        assert_eq!(bin_index(1.0, 0.0, 10.0, 10), 1);
        assert_eq!(bin_index(9.99, 0.0, 10.0, 10), 9);
        // The maximum lands in the last bin.
        assert_eq!(bin_index(10.0, 0.0, 10.0, 10), 9);
        assert_eq!(bin_index(1e15, 1e-12, 1e15, 5), 4);
        // A degenerate range puts everything in bin 0.
        assert_eq!(bin_index(3.0, 3.0, 3.0, 4), 0);
        // Out of range and NaN are clamped, never a panic.
        assert_eq!(bin_index(-1.0, 0.0, 1.0, 4), 0);
        assert_eq!(bin_index(7.0, 0.0, 1.0, 4), 3);
        assert_eq!(bin_index(f64::NAN, 0.0, 1.0, 4), 0);
        assert_eq!(bin_index(1.0, 0.0, 1.0, 1), 0);
    }

    proptest::proptest! {
        /// Binning against a range worked out once gives the bin the formula as written gives, with floor.
        #[test]
        fn binning_is_the_formula_with_floor(
            lo in -1e6f64..1e6,
            width in 0f64..1e6,
            bins in 1usize..50,
            at in -0.5f64..1.5,
        ) {
            let hi = lo + width;
            let v = lo + at * width;
            let expected = if lo == hi {
                0
            } else {
                (((v - lo) / (hi - lo) * bins as f64).floor() as usize).min(bins - 1)
            };
            proptest::prop_assert_eq!(Binning::new(lo, hi, bins).index(v), expected);
        }
    }

    proptest::proptest! {
        /// Binning the kept samples gives, per (application, key) with a range, the counts of binning that
        /// key's values one by one, sorted by (application, key); keys without a range are left out. The rows
        /// are numbered in the order keys first appear, as a fold numbers them, and values of different rows
        /// interleave as ranks' values do.
        #[test]
        fn binning_samples_is_binning_each_keys_values(
            values in proptest::collection::vec((0usize..2, 0u64..6, 1i32..3, -50i32..50), 0..80),
            missing in proptest::collection::vec((0usize..2, 0u64..6, 1i32..3), 0..4),
            bins in 0usize..6,
            twice in proptest::bool::ANY,
        ) {
            let apps = ["x", ""];
            let mut samples = Samples::default();
            let mut rows: Vec<(&str, Key)> = Vec::new();
            let mut by_key: BTreeMap<(&str, Key), Vec<f64>> = BTreeMap::new();
            // A first round of other values, so the second reuses the buffers.
            let rounds = if twice { 2 } else { 1 };
            for round in 0..rounds {
                samples.clear();
                rows.clear();
                by_key.clear();
                for &(app, id, metric, v) in &values {
                    let (app, key, v) = (apps[app], (id + round, metric), f64::from(v) / 4.0);
                    let row = match rows.iter().position(|r| *r == (app, key)) {
                        Some(r) => r,
                        None => {
                            rows.push((app, key));
                            rows.len() - 1
                        }
                    };
                    samples.add(row as u32, app, key, v);
                    by_key.entry((app, key)).or_default().push(v);
                }
            }
            let ranges: Vec<Range> = by_key
                .iter()
                .filter(|&(&(app, key), _)| !missing.iter().any(|&(a, i, m)| (apps[a], (i, m)) == (app, key)))
                .map(|(&(app, (id, metric)), vs)| Range {
                    id,
                    metric,
                    lo: vs.iter().copied().fold(f64::INFINITY, f64::min),
                    hi: vs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    app: app.to_string(),
                })
                .collect();
            let expected: Vec<Histogram> = ranges
                .iter()
                .map(|r| {
                    let mut counts = vec![0u64; bins];
                    for &v in &by_key[&(r.app.as_str(), (r.id, r.metric))] {
                        if bins > 0 {
                            counts[bin_index(v, r.lo, r.hi, bins)] += 1;
                        }
                    }
                    let (id, metric, lo, hi, app) = (r.id, r.metric, r.lo, r.hi, r.app.clone());
                    Histogram { id, metric, lo, hi, counts, app }
                })
                .collect();
            proptest::prop_assert_eq!(samples.bin(&ranges, bins), expected);
        }
    }

    #[test]
    fn cleared_samples_reuse_their_rows_and_bin_as_new_ones() {
        let ranges = [(1, 0.0, 4.0), (2, -1.0, 1.0), (3, 5.0, 5.0)].map(|(id, lo, hi)| Range {
            id,
            metric: 1,
            lo,
            hi,
            app: "b".into(),
        });
        let mut reused = Samples::default();
        // A first round with more keys and values than the second, its keys in another order.
        for _ in 0..2 {
            for (row, id) in [3, 2, 1].into_iter().enumerate() {
                reused.add(row as u32, "a", (id, 1), 5.0);
            }
        }
        let kept = (reused.values.as_ptr(), reused.rows[0].app.as_ptr());
        reused.clear();
        assert!(reused.is_empty());
        let mut fresh = Samples::default();
        for (row, id, v) in [(0, 1, 4.0), (1, 2, -1.0), (0, 1, 0.5), (1, 2, 0.25)] {
            reused.add(row, "b", (id, 1), v);
            fresh.add(row, "b", (id, 1), v);
        }
        assert_eq!(reused, fresh);
        assert_eq!(
            (reused.values.as_ptr(), reused.rows[0].app.as_ptr()),
            kept,
            "the values' buffer and the first row's are reused"
        );
        assert_eq!(reused.bin(&ranges, 4), fresh.bin(&ranges, 4));
        assert_eq!(
            reused.bin(&ranges, 4).len(),
            2,
            "the first round's third key is gone"
        );
    }

    #[test]
    #[should_panic(expected = "is not the next new row")]
    fn a_row_past_the_next_new_one_is_a_broken_contract() {
        let mut s = Samples::default();
        s.add(1, "", (1, 1), 0.0);
    }

    #[test]
    fn bins_then_merges_by_adding() {
        let rank = RankRef {
            app: "a".into(),
            rank: 0,
        };
        let mut stats = StatsMap::new();
        let mut left = Samples::default();
        let mut right = Samples::default();
        // Key (5, 1) first on the right, so its rows are in another order than the keys.
        right.add(0, "", (5, 1), 7.0);
        for (i, v) in [0.0, 1.0, 2.0, 3.0, 4.0].into_iter().enumerate() {
            stats.add((1, 2), v, &rank);
            if i % 2 == 0 {
                left.add(0, "", (1, 2), v)
            } else {
                right.add(1, "", (1, 2), v)
            }
        }
        stats.add((5, 1), 7.0, &rank);
        let ranges = ranges_of(&stats);
        let mut m = HistMap::new();
        for h in [left.bin(&ranges, 2), right.bin(&ranges, 2)] {
            HistMap::check(&h, 2).unwrap();
            m.merge(&h);
        }
        let out = m.to_vec();
        assert_eq!(out.len(), 2);
        assert_eq!(
            (out[0].id, out[0].lo, out[0].hi, out[0].counts.clone()),
            (1, 0.0, 4.0, vec![2, 3])
        );
        assert_eq!((out[1].id, out[1].counts.clone()), (5, vec![1, 0]));
        assert!(
            HistMap::check(&out, 3)
                .unwrap_err()
                .contains("has 2 bins, expected 3")
        );
    }
}
