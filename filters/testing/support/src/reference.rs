//! Direct computations over all ranks at once, for tests to compare a tree's result with. They are written
//! from the profile fields and the documented formulas, sharing no code with the filters' merging.

use std::collections::BTreeMap;

use canopy_filter_proto::v1::{Histogram, Metric, Quantile, Summary};
use canopy_wire::v1::RankProfile;

/// (id, metric as i32).
pub type Key = (u64, i32);

/// One sample: the value and the (app, rank) holding it.
pub type Sample = (f64, String, u32);

/// The samples of every (id, metric) over `profiles`, straight from the profile fields.
pub fn samples<'a>(
    profiles: impl IntoIterator<Item = &'a RankProfile>,
    cumulative: bool,
) -> BTreeMap<Key, Vec<Sample>> {
    let mut m: BTreeMap<Key, Vec<Sample>> = BTreeMap::new();
    for p in profiles {
        let mut push = |key: Key, v: f64| m.entry(key).or_default().push((v, p.app.clone(), p.rank));
        for e in &p.events {
            if cumulative {
                push((e.event_id, Metric::Calls as i32), e.calls_total as f64);
                push((e.event_id, Metric::Inclusive as i32), e.incl_total_us);
                push((e.event_id, Metric::Exclusive as i32), e.excl_total_us);
            } else {
                push((e.event_id, Metric::Calls as i32), e.calls as f64);
                push((e.event_id, Metric::Inclusive as i32), e.incl_us);
                push((e.event_id, Metric::Exclusive as i32), e.excl_us);
            }
            // Per-event metrics, matched with the profile's list by position.
            let values = if cumulative { &e.metrics_total } else { &e.metrics };
            for (m, v) in p.event_metrics.iter().zip(values) {
                push((e.event_id, *m as i32), *v);
            }
        }
        for c in &p.counters {
            push(
                (c.counter_id, Metric::Counter as i32),
                if cumulative { c.total } else { c.value },
            );
        }
    }
    m
}

/// (application, id, metric as i32): the application is "" for rows over every application.
pub type AppKey = (String, u64, i32);

/// [`samples`] per application when `by_app` (keys sorted by application name, then id and metric), else
/// every application's together under the application "".
pub fn samples_by_app<'a>(
    profiles: impl IntoIterator<Item = &'a RankProfile>,
    cumulative: bool,
    by_app: bool,
) -> BTreeMap<AppKey, Vec<Sample>> {
    let mut per_app: BTreeMap<&str, Vec<&RankProfile>> = BTreeMap::new();
    for p in profiles {
        per_app
            .entry(if by_app { p.app.as_str() } else { "" })
            .or_default()
            .push(p);
    }
    per_app
        .into_iter()
        .flat_map(|(app, ps)| {
            samples(ps, cumulative)
                .into_iter()
                .map(move |((id, metric), v)| ((app.to_string(), id, metric), v))
        })
        .collect()
}

/// Neumaier's compensated sum: accurate, and a different computation from the filters' pairwise merge.
pub fn sum(values: impl Iterator<Item = f64>) -> f64 {
    let (mut s, mut c) = (0.0f64, 0.0f64);
    for v in values {
        let t = s + v;
        c += if s.abs() >= v.abs() {
            (s - t) + v
        } else {
            (v - t) + s
        };
        s = t;
    }
    s + c
}

/// The summary of all `values` at once: two-pass mean and population std; min and max with the smallest
/// (app, rank) on a tie.
pub struct Direct {
    pub count: u64,
    pub mean: f64,
    pub std: f64,
    pub min: Sample,
    pub max: Sample,
}

pub fn direct(values: &[Sample]) -> Direct {
    let n = values.len() as f64;
    let mean = sum(values.iter().map(|v| v.0)) / n;
    let std = (sum(values.iter().map(|v| (v.0 - mean) * (v.0 - mean))) / n).sqrt();
    let by_rank = |a: &Sample, b: &Sample| (&a.1, a.2).cmp(&(&b.1, b.2));
    let min = values
        .iter()
        .min_by(|a, b| a.0.total_cmp(&b.0).then(by_rank(a, b)))
        .cloned();
    let max = values
        .iter()
        .min_by(|a, b| b.0.total_cmp(&a.0).then(by_rank(a, b)))
        .cloned();
    let none = (f64::NAN, String::new(), 0);
    Direct {
        count: values.len() as u64,
        mean,
        std,
        min: min.unwrap_or_else(|| none.clone()),
        max: max.unwrap_or(none),
    }
}

/// Equal to 1e-9 relative, or 1e-12 absolute near zero.
pub fn close(got: f64, want: f64) -> bool {
    let d = (got - want).abs();
    d <= 1e-9 * got.abs().max(want.abs()) || d <= 1e-12
}

/// Checks a filter's summary against [`direct`]: count, min, max and their ranks exactly, mean and std
/// with [`close`].
pub fn check_summary(what: &str, s: &Summary, values: &[Sample]) -> Result<(), String> {
    let d = direct(values);
    let rank = |r: &Option<canopy_filter_proto::v1::RankRef>| {
        r.as_ref().map(|r| (r.app.clone(), r.rank)).unwrap_or_default()
    };
    let checks = [
        (s.count == d.count, format!("count {} vs {}", s.count, d.count)),
        (close(s.mean, d.mean), format!("mean {} vs {}", s.mean, d.mean)),
        (close(s.std, d.std), format!("std {} vs {}", s.std, d.std)),
        (
            s.count > 0 && close((s.m2 / s.count as f64).sqrt(), d.std),
            format!("m2 {} vs std {}", s.m2, d.std),
        ),
        (
            (s.min.to_bits(), rank(&s.min_rank)) == (d.min.0.to_bits(), (d.min.1.clone(), d.min.2)),
            format!("min {} at {:?} vs {:?}", s.min, rank(&s.min_rank), d.min),
        ),
        (
            (s.max.to_bits(), rank(&s.max_rank)) == (d.max.0.to_bits(), (d.max.1.clone(), d.max.2)),
            format!("max {} at {:?} vs {:?}", s.max, rank(&s.max_rank), d.max),
        ),
    ];
    match checks.into_iter().find(|(ok, _)| !ok) {
        Some((_, why)) => Err(format!("{what}: {why}")),
        None => Ok(()),
    }
}

/// The exact lower q-quantile of `values`, as DDSketch defines the quantile it approximates: the value of rank
/// floor(q * (n - 1)) (from 0) in increasing order.
pub fn lower_quantile(values: &[Sample], q: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().map(|s| s.0).collect();
    v.sort_by(f64::total_cmp);
    v[(q * (v.len() - 1) as f64).floor() as usize]
}

/// Checks a row's quantiles: exactly the `qs` asked for, in order, each within `accuracy` of
/// [`lower_quantile`] relative to it and between the values' min and max.
pub fn check_quantiles(
    what: &str,
    got: &[Quantile],
    values: &[Sample],
    qs: &[f64],
    accuracy: f64,
) -> Result<(), String> {
    let asked: Vec<f64> = got.iter().map(|g| g.q).collect();
    if asked != qs {
        return Err(format!("{what}: quantiles {asked:?}, asked for {qs:?}"));
    }
    let lo = values.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
    let hi = values.iter().map(|s| s.0).fold(f64::NEG_INFINITY, f64::max);
    for g in got {
        if !(lo..=hi).contains(&g.value) {
            return Err(format!(
                "{what}: q {} is {}, outside the values' [{lo}, {hi}]",
                g.q, g.value
            ));
        }
        let want = lower_quantile(values, g.q);
        // 1e-9 relative for the rounding of the bin's value.
        if (g.value - want).abs() > accuracy * want.abs() * (1.0 + 1e-9) {
            return Err(format!(
                "{what}: q {} is {}, the exact value {want} (relative accuracy {accuracy})",
                g.q, g.value
            ));
        }
    }
    Ok(())
}

/// Counts by brute force: each value's bin by the documented formula, lo and hi the global min and max.
pub fn histogram(values: &[Sample], bins: usize) -> (f64, f64, Vec<u64>) {
    let lo = values.iter().map(|v| v.0).fold(f64::INFINITY, f64::min);
    let hi = values.iter().map(|v| v.0).fold(f64::NEG_INFINITY, f64::max);
    let mut counts = vec![0u64; bins];
    for v in values {
        let i = if lo == hi {
            0
        } else {
            ((v.0 - lo) / (hi - lo) * bins as f64).floor() as usize
        };
        counts[i.min(bins - 1)] += 1;
    }
    (lo, hi, counts)
}

/// Checks a filter's histogram against [`histogram`]: range and counts exactly.
pub fn check_histogram(what: &str, h: &Histogram, values: &[Sample], bins: usize) -> Result<(), String> {
    let (lo, hi, counts) = histogram(values, bins);
    if (h.lo, h.hi, &h.counts) != (lo, hi, &counts) {
        return Err(format!(
            "{what}: histogram [{}, {}] {:?} vs [{lo}, {hi}] {counts:?}",
            h.lo, h.hi, h.counts
        ));
    }
    Ok(())
}

/// k-means over all points at once, as seed 002 describes it, for the kmeans filter's tests to compare with.
#[derive(Debug, Clone)]
pub struct Kmeans {
    /// The final centroids.
    pub centroids: Vec<Vec<f64>>,
    /// Each point's cluster, against the final centroids.
    pub assignment: Vec<usize>,
    /// Each point's squared distance to its centroid.
    pub d2: Vec<f64>,
    /// Assignment passes taken, the last being the one that changed nothing when `converged`.
    pub iterations: u32,
    pub converged: bool,
}

/// Lloyd's k-means over `points` (each as long as the others): the box is each dimension's min and max over the
/// points; seed i is at `lo + (i + 0.5) / k * (hi - lo)` on every dimension; each iteration assigns every point
/// to its nearest centroid (squared Euclidean distance, a tie to the lowest cluster) and stops when no point
/// changed cluster since the previous iteration (every point counts as changed in the first), and otherwise
/// moves each centroid to its cluster's mean (compensated sums; an empty cluster keeps its centroid), up to
/// `max_iterations`. The points are then assigned to the final centroids.
pub fn kmeans(points: &[Vec<f64>], k: usize, max_iterations: u32) -> Kmeans {
    let dims = points.first().map_or(0, Vec::len);
    let lo: Vec<f64> = (0..dims)
        .map(|d| points.iter().map(|p| p[d]).fold(f64::INFINITY, f64::min))
        .collect();
    let hi: Vec<f64> = (0..dims)
        .map(|d| points.iter().map(|p| p[d]).fold(f64::NEG_INFINITY, f64::max))
        .collect();
    let mut centroids: Vec<Vec<f64>> = (0..k)
        .map(|i| {
            let t = (i as f64 + 0.5) / k as f64;
            (0..dims).map(|d| lo[d] + t * (hi[d] - lo[d])).collect()
        })
        .collect();
    let nearest = |centroids: &[Vec<f64>], p: &[f64]| -> (usize, f64) {
        let mut best = (0, f64::INFINITY);
        for (c, centroid) in centroids.iter().enumerate() {
            let mut d2 = 0.0;
            for d in 0..dims {
                d2 += (p[d] - centroid[d]) * (p[d] - centroid[d]);
            }
            if dims == 0 {
                d2 = 0.0;
            }
            if d2 < best.1 {
                best = (c, d2);
            }
        }
        best
    };
    let mut previous: Option<Vec<usize>> = None;
    let (mut iterations, mut converged) = (0, false);
    for j in 1..=max_iterations {
        iterations = j;
        let now: Vec<usize> = points.iter().map(|p| nearest(&centroids, p).0).collect();
        let changed = match &previous {
            None => points.len(),
            Some(prev) => prev.iter().zip(&now).filter(|(a, b)| a != b).count(),
        };
        if changed == 0 {
            converged = true;
            break;
        }
        for (c, centroid) in centroids.iter_mut().enumerate() {
            let members: Vec<&Vec<f64>> = points
                .iter()
                .zip(&now)
                .filter(|(_, a)| **a == c)
                .map(|(p, _)| p)
                .collect();
            if members.is_empty() {
                continue;
            }
            for (d, x) in centroid.iter_mut().enumerate() {
                *x = sum(members.iter().map(|p| p[d])) / members.len() as f64;
            }
        }
        previous = Some(now);
    }
    let (assignment, d2) = points.iter().map(|p| nearest(&centroids, p)).unzip();
    Kmeans {
        centroids,
        assignment,
        d2,
        iterations,
        converged,
    }
}
