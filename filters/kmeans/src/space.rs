//! The geometry every level computes the same way, so that a rank's distances are bit for bit the same
//! wherever they are computed: squared Euclidean distances summed in dimension order, the seeds on the box's
//! diagonal, and the centroid update.

/// The squared Euclidean distance between two points of the same dimension, summed in dimension order.
pub fn d2(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// The nearest of the flat `centroids` (each `dims` long) to `x`, and its squared distance; a tie goes to
/// the lowest cluster. With no dimensions every centroid is at distance 0, so cluster 0.
pub fn nearest(centroids: &[f64], dims: usize, x: &[f64]) -> (usize, f64) {
    if dims == 0 {
        return (0, 0.0);
    }
    let mut best = (0usize, f64::INFINITY);
    for (c, centroid) in centroids.chunks_exact(dims).enumerate() {
        let d = d2(centroid, x);
        if d < best.1 {
            best = (c, d);
        }
    }
    best
}

/// The paper's k starting points "uniformly spread across the bounding box": seed i at
/// `lo + (i + 0.5) / k * (hi - lo)` on every dimension, evenly spaced on the box's main diagonal.
pub fn seeds(k: u32, lo: &[f64], hi: &[f64]) -> Vec<f64> {
    let mut out = Vec::with_capacity(k as usize * lo.len());
    for i in 0..k {
        let t = (f64::from(i) + 0.5) / f64::from(k);
        out.extend(lo.iter().zip(hi).map(|(l, h)| l + t * (h - l)));
    }
    out
}

/// The new centroids from the clusters' sums and counts; an empty cluster keeps its previous centroid.
pub fn update(previous: &[f64], sums: &[f64], counts: &[u64], dims: usize) -> Vec<f64> {
    let mut out = previous.to_vec();
    if dims == 0 {
        return out;
    }
    for (c, (&n, sum)) in counts.iter().zip(sums.chunks_exact(dims)).enumerate() {
        if n > 0 {
            for (o, s) in out[c * dims..(c + 1) * dims].iter_mut().zip(sum) {
                *o = s / n as f64;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_lie_evenly_on_the_diagonal() {
        let s = seeds(2, &[0.0, 10.0], &[4.0, 20.0]);
        assert_eq!(s, [1.0, 12.5, 3.0, 17.5]);
        assert_eq!(seeds(1, &[2.0], &[2.0]), [2.0]);
    }

    #[test]
    fn nearest_takes_the_lowest_cluster_on_a_tie() {
        let c = [0.0, 0.0, 2.0, 0.0];
        assert_eq!(nearest(&c, 2, &[1.0, 0.0]), (0, 1.0));
        assert_eq!(nearest(&c, 2, &[1.5, 0.0]), (1, 0.25));
        assert_eq!(nearest(&[], 0, &[]), (0, 0.0));
    }

    #[test]
    fn an_empty_cluster_keeps_its_centroid() {
        let got = update(&[1.0, 1.0, 5.0, 5.0], &[6.0, 8.0, 0.0, 0.0], &[2, 0], 2);
        assert_eq!(got, [3.0, 4.0, 5.0, 5.0]);
    }
}
