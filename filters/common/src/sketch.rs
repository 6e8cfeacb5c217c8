//! DDSketch (Masson, Rim and Lee, VLDB 2019): a quantile sketch with a relative-error guarantee that merges by
//! adding bin counts, so merging up any tree gives exactly the sketch of all the values at once.
//!
//! A positive value v goes to bin ceil(log_gamma(v)) with gamma = (1 + a) / (1 - a) for the relative accuracy
//! a; a bin stands for 2 gamma^i / (1 + gamma), within a of every value of the bin. Negative values go to a
//! second store by their absolute value; values too small to index (and NaN) count as zero. Each store keeps
//! dense bins from an offset and at most `max_bins` of them: beyond that the lowest bins collapse into the
//! lowest kept one, as DDSketch's collapsing-lowest store does. A collapse is a clamp of every index to
//! (highest index - max_bins + 1), and clamps compose, so even then the tree's sketch is the direct one.
//!
//! The bins travel as packed columns of `StatsColumns` (see [`crate::sketch_columns`]), which no maintained
//! crate's sketch exposes, hence this implementation.

/// The default relative accuracy: 1%.
pub const DEFAULT_ACCURACY: f64 = 0.01;
/// The default bound on the bins of one store, DDSketch's: at 1% it spans values 10^35 apart.
pub const DEFAULT_MAX_BINS: u32 = 2048;

/// The value-to-bin mapping of one relative accuracy, and the bound on bins: what every node of a stream
/// shares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spec {
    accuracy: f64,
    gamma: f64,
    inv_ln_gamma: f64,
    ln_gamma: f64,
    min_indexable: f64,
    /// The bin of f64::MAX, where infinity goes too.
    max_index: i32,
    max_bins: u32,
}

impl Spec {
    /// A spec of relative accuracy `accuracy` (in (0, 1)) and at most `max_bins` bins per store (at least 1).
    pub fn new(accuracy: f64, max_bins: u32) -> Result<Spec, String> {
        if !(accuracy > 0.0 && accuracy < 1.0) {
            return Err(format!(
                "relative accuracy must be between 0 and 1 (exclusive), got {accuracy}"
            ));
        }
        if max_bins == 0 {
            return Err("max_bins must be at least 1".to_string());
        }
        let gamma = (1.0 + accuracy) / (1.0 - accuracy);
        let ln_gamma = gamma.ln();
        let inv_ln_gamma = 1.0 / ln_gamma;
        Ok(Spec {
            accuracy,
            gamma,
            inv_ln_gamma,
            ln_gamma,
            // Below this, the index would leave the range whose bins map back to finite, normal values.
            min_indexable: f64::MIN_POSITIVE * gamma,
            max_index: (f64::MAX.ln() * inv_ln_gamma).ceil() as i32,
            max_bins,
        })
    }

    pub fn accuracy(&self) -> f64 {
        self.accuracy
    }

    pub fn max_bins(&self) -> u32 {
        self.max_bins
    }

    /// The bin of a positive value at least `min_indexable`; infinity goes to the bin of f64::MAX.
    #[inline]
    fn index(&self, v: f64) -> i32 {
        ((v.ln() * self.inv_ln_gamma).ceil() as i32).min(self.max_index)
    }

    /// The value a bin stands for: within the relative accuracy of every value mapped to it (the top bin's,
    /// which would pass f64::MAX, is f64::MAX).
    pub fn value(&self, index: i32) -> f64 {
        ((f64::from(index) * self.ln_gamma).exp() * (2.0 / (1.0 + self.gamma))).min(f64::MAX)
    }
}

/// Dense bins from `offset`, at most `max_bins` of them; empty when `bins` is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Store {
    offset: i32,
    bins: Vec<u64>,
}

impl Store {
    pub fn offset(&self) -> i32 {
        self.offset
    }

    pub fn bins(&self) -> &[u64] {
        &self.bins
    }

    fn clear(&mut self) {
        self.offset = 0;
        self.bins.clear();
    }

    /// Counts one value at `index`, growing the bins to cover it and collapsing the lowest beyond `max_bins`.
    #[inline]
    fn add(&mut self, index: i32, max_bins: u32) {
        let len = self.bins.len() as i64;
        let (lo, hi) = (i64::from(self.offset), i64::from(self.offset) + len - 1);
        let i = i64::from(index);
        if len > 0 && i >= lo && i <= hi {
            let b = &mut self.bins[(i - lo) as usize];
            *b = b.saturating_add(1);
            return;
        }
        self.cover(i, max_bins);
        let at = (i.max(i64::from(self.offset)) - i64::from(self.offset)) as usize;
        self.bins[at] = self.bins[at].saturating_add(1);
    }

    /// Grows the bins to cover index `i` (the lowest kept bin takes it when it falls below the bound).
    fn cover(&mut self, i: i64, max_bins: u32) {
        let len = self.bins.len() as i64;
        let (lo, hi) = if len == 0 {
            (i, i)
        } else {
            let lo = i64::from(self.offset);
            (lo.min(i), (lo + len - 1).max(i))
        };
        let new_lo = lo.max(hi - i64::from(max_bins) + 1);
        if len > 0 && new_lo > i64::from(self.offset) {
            // Collapse the bins below new_lo into new_lo.
            let k = ((new_lo - i64::from(self.offset)) as usize).min(self.bins.len());
            let collapsed = self.bins.drain(..k).fold(0u64, u64::saturating_add);
            let first_kept = i64::from(self.offset) + k as i64;
            if self.bins.is_empty() || first_kept != new_lo {
                self.bins.clear();
                self.bins.push(0);
            }
            self.offset = new_lo as i32;
            self.bins[0] = self.bins[0].saturating_add(collapsed);
        } else if len > 0 && new_lo < i64::from(self.offset) {
            let grow = (i64::from(self.offset) - new_lo) as usize;
            self.bins.splice(0..0, std::iter::repeat_n(0, grow));
            self.offset = new_lo as i32;
        } else if len == 0 {
            self.offset = new_lo as i32;
        }
        self.bins.resize((hi - new_lo + 1) as usize, 0);
    }
}

/// One row's sketch, as a leaf builds it; its buffers are reused from round to round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sketch {
    zero: u64,
    pos: Store,
    neg: Store,
}

impl Sketch {
    /// Empties the sketch, keeping its buffers.
    pub fn clear(&mut self) {
        self.zero = 0;
        self.pos.clear();
        self.neg.clear();
    }

    /// Counts `v`. Allocates only when the bins grow.
    #[inline]
    pub fn add(&mut self, spec: &Spec, v: f64) {
        if v >= spec.min_indexable {
            self.pos.add(spec.index(v), spec.max_bins);
        } else if v <= -spec.min_indexable {
            self.neg.add(spec.index(-v), spec.max_bins);
        } else {
            self.zero = self.zero.saturating_add(1);
        }
    }

    pub fn view(&self) -> View<'_> {
        View {
            zero: self.zero,
            pos_offset: self.pos.offset,
            pos: &self.pos.bins,
            neg_offset: self.neg.offset,
            neg: &self.neg.bins,
        }
    }
}

/// A sketch's counts wherever they lie (a leaf's [`Sketch`] or a packet's columns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View<'a> {
    pub zero: u64,
    pub pos_offset: i32,
    pub pos: &'a [u64],
    pub neg_offset: i32,
    pub neg: &'a [u64],
}

impl View<'_> {
    /// The number of values, `None` past u64.
    pub fn count(&self) -> Option<u64> {
        let mut n = self.zero;
        for &c in self.pos.iter().chain(self.neg) {
            n = n.checked_add(c)?;
        }
        Some(n)
    }

    /// The lower q-quantile: the bin value of the value of rank floor(q * (count - 1)) (from 0) in increasing
    /// order, as DDSketch defines it; `None` for an empty sketch.
    pub fn quantile(&self, spec: &Spec, q: f64) -> Option<f64> {
        let n: u128 = u128::from(self.zero)
            + self
                .pos
                .iter()
                .chain(self.neg)
                .map(|&c| u128::from(c))
                .sum::<u128>();
        if n == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * (n - 1) as f64).floor() as u128;
        let mut seen = 0u128;
        // The most negative values first: the highest bins of the negative store.
        for (k, &c) in self.neg.iter().enumerate().rev() {
            seen += u128::from(c);
            if seen > rank {
                return Some(-spec.value(self.neg_offset + k as i32));
            }
        }
        seen += u128::from(self.zero);
        if seen > rank {
            return Some(0.0);
        }
        for (k, &c) in self.pos.iter().enumerate() {
            seen += u128::from(c);
            if seen > rank {
                return Some(spec.value(self.pos_offset + k as i32));
            }
        }
        None
    }
}

/// Merges stores (offset, bins) into `out` (appended): the union of their ranges, the lowest bins collapsed
/// beyond `max_bins`, trimmed of empty bins at both ends. Returns the merged offset and number of bins.
/// `max_bins` bounds what is appended whatever the inputs' offsets.
pub fn merge_stores<'a>(
    stores: impl Iterator<Item = (i32, &'a [u64])> + Clone,
    max_bins: u32,
    out: &mut Vec<u64>,
) -> (i32, u32) {
    // The highest and lowest non-empty bins over all inputs.
    let mut range: Option<(i64, i64)> = None;
    for (offset, bins) in stores.clone() {
        let first = bins.iter().position(|&c| c > 0);
        let last = bins.iter().rposition(|&c| c > 0);
        if let (Some(f), Some(l)) = (first, last) {
            let (f, l) = (i64::from(offset) + f as i64, i64::from(offset) + l as i64);
            range = Some(range.map_or((f, l), |(lo, hi)| (lo.min(f), hi.max(l))));
        }
    }
    let Some((lo, hi)) = range else {
        return (0, 0);
    };
    let lo = lo.max(hi - i64::from(max_bins) + 1);
    let start = out.len();
    out.resize(start + (hi - lo + 1) as usize, 0);
    let merged = &mut out[start..];
    for (offset, bins) in stores {
        for (k, &c) in bins.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let i = (i64::from(offset) + k as i64).max(lo);
            let b = &mut merged[(i - lo) as usize];
            *b = b.saturating_add(c);
        }
    }
    (lo as i32, (hi - lo + 1) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec() -> Spec {
        Spec::new(DEFAULT_ACCURACY, DEFAULT_MAX_BINS).unwrap()
    }

    /// The exact lower quantile of `values`.
    fn exact(values: &[f64], q: f64) -> f64 {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        v[(q * (v.len() - 1) as f64).floor() as usize]
    }

    #[test]
    fn specs_refuse_bad_accuracy_and_bins() {
        for a in [0.0, 1.0, -0.1, f64::NAN, 2.0] {
            assert_eq!(
                Spec::new(a, 10).unwrap_err(),
                format!("relative accuracy must be between 0 and 1 (exclusive), got {a}")
            );
        }
        assert_eq!(Spec::new(0.01, 0).unwrap_err(), "max_bins must be at least 1");
    }

    #[test]
    fn every_value_maps_to_a_bin_within_the_accuracy() {
        let s = spec();
        for v in [1e-300, 1e-12, 0.5, 1.0, 1.0202, 42.0, 1e15, 1e300, f64::MAX] {
            let got = s.value(s.index(v));
            assert!((got - v).abs() <= s.accuracy() * v * (1.0 + 1e-9), "{v} -> {got}");
        }
        assert_eq!(s.value(s.index(f64::INFINITY)), f64::MAX);
    }

    #[test]
    fn zeros_negatives_and_nan() {
        let s = spec();
        let mut k = Sketch::default();
        for v in [-8.0, -1.0, 0.0, f64::NAN, 3.0] {
            k.add(&s, v);
        }
        let view = k.view();
        assert_eq!(view.count(), Some(5));
        assert_eq!(view.zero, 2);
        let q = |q| view.quantile(&s, q).unwrap();
        assert!((q(0.0) + 8.0).abs() <= 0.08);
        assert!((q(0.25) + 1.0).abs() <= 0.01);
        assert_eq!(q(0.5), 0.0);
        assert!((q(1.0) - 3.0).abs() <= 0.03);
        assert_eq!(Sketch::default().view().quantile(&s, 0.5), None);
    }

    #[test]
    fn bins_beyond_the_bound_collapse_into_the_lowest_kept() {
        let s = Spec::new(0.01, 8).unwrap();
        let mut k = Sketch::default();
        // 1, 10, 100: indexes 0, 116, 233: far more than 8 bins apart.
        for v in [100.0, 1.0, 10.0, 1.0] {
            k.add(&s, v);
        }
        let view = k.view();
        assert_eq!(view.pos.len(), 8);
        assert_eq!(view.pos[0], 3, "1, 1 and 10 collapsed into the lowest kept bin");
        assert_eq!(*view.pos.last().unwrap(), 1);
        assert_eq!(view.pos_offset + 7, s.index(100.0));
        // The top quantile keeps its guarantee.
        assert!((view.quantile(&s, 1.0).unwrap() - 100.0).abs() <= 1.0);
    }

    #[test]
    fn merging_stores_is_bounded_whatever_the_offsets() {
        let mut out = Vec::new();
        let a = [1u64, 0, 2];
        let b = [5u64];
        let got = merge_stores([(i32::MIN, &a[..]), (i32::MAX, &b[..])].into_iter(), 4, &mut out);
        assert_eq!(got, (i32::MAX - 3, 4));
        assert_eq!(out, vec![3, 0, 0, 5]);
        out.clear();
        assert_eq!(
            merge_stores([(7, &[0u64, 0][..])].into_iter(), 4, &mut out),
            (0, 0)
        );
        assert!(out.is_empty());
    }

    proptest! {
        /// Every quantile is within the relative accuracy of the exact one, and adding values one by one
        /// into several sketches then merging them gives the sketch of all values at once, whatever the split
        /// and the order, with or without collapsing.
        #[test]
        fn quantiles_are_accurate_and_merging_is_exact(
            values in prop::collection::vec(
                prop_oneof![Just(0.0), -1e6f64..1e6, 1e-3f64..1.0, 1e6f64..1e12],
                1..300,
            ),
            parts in 1usize..5,
            max_bins in prop_oneof![Just(DEFAULT_MAX_BINS), 1u32..40],
            q in 0.0f64..=1.0,
        ) {
            let s = Spec::new(DEFAULT_ACCURACY, max_bins).unwrap();
            let mut all = Sketch::default();
            let mut split = vec![Sketch::default(); parts];
            for (i, &v) in values.iter().enumerate() {
                all.add(&s, v);
                split[(i * 7) % parts].add(&s, v);
            }
            let mut counts = Vec::new();
            let views: Vec<View<'_>> = split.iter().rev().map(Sketch::view).collect();
            let (po, pn) = merge_stores(views.iter().map(|v| (v.pos_offset, v.pos)), max_bins, &mut counts);
            let (no, nn) = merge_stores(views.iter().map(|v| (v.neg_offset, v.neg)), max_bins, &mut counts);
            let merged = View {
                zero: views.iter().map(|v| v.zero).sum(),
                pos_offset: po,
                pos: &counts[..pn as usize],
                neg_offset: no,
                neg: &counts[pn as usize..(pn + nn) as usize],
            };
            let direct = all.view();
            prop_assert_eq!(merged.count(), Some(values.len() as u64));
            prop_assert_eq!((merged.pos_offset, merged.pos), (direct.pos_offset, direct.pos));
            prop_assert_eq!((merged.neg_offset, merged.neg), (direct.neg_offset, direct.neg));
            prop_assert_eq!(merged.zero, direct.zero);
            if max_bins == DEFAULT_MAX_BINS {
                let got = direct.quantile(&s, q).unwrap();
                let want = exact(&values, q);
                prop_assert!(
                    (got - want).abs() <= s.accuracy() * want.abs() * (1.0 + 1e-9),
                    "q {} got {} want {}", q, got, want
                );
            }
        }
    }
}
