//! What the root decides: each round's seeds (or the last refit's centroids), each iteration's new centroids
//! and when to stop, the k chosen with k "auto", and the result.

use canopy_filter_proto::v1::{KmeansCluster, KmeansFit, KmeansPacket, KmeansResult, KmeansRun};

use crate::config::Config;
use crate::space;

/// One k of a round at the root.
#[derive(Debug, Clone)]
struct Run {
    k: u32,
    centroids: Vec<f64>,
    iterations: u32,
    converged: bool,
    /// No more iterations for this k: it converged or reached max_iterations.
    done: bool,
}

/// The centroids of the last refit, for the rounds that only assign.
#[derive(Debug, Clone)]
pub struct Fitted {
    dims: Vec<u64>,
    centroids: Vec<Vec<f64>>,
}

/// A round at the root, from phase 0 to its last phase.
#[derive(Debug, Clone)]
pub struct Round {
    /// Phase 0 merged: dims, box and ranks.
    boxed: KmeansPacket,
    runs: Vec<Run>,
    /// Iterations whose sums came up so far.
    pub iteration: u32,
    pub refit: bool,
}

impl Round {
    /// A round from its merged phase 0: it iterates from the seeds when `refit` or when `last` does not fit its
    /// dims, and otherwise assigns the ranks to the last refit's centroids.
    pub fn start(boxed: KmeansPacket, config: &Config, refit: bool, last: Option<&Fitted>) -> Round {
        let reuse = last.filter(|f| !refit && f.dims == boxed.dims && f.centroids.len() == config.ks.len());
        let runs = config
            .ks
            .iter()
            .enumerate()
            .map(|(i, &k)| Run {
                k,
                centroids: match reuse {
                    Some(f) => f.centroids[i].clone(),
                    None => space::seeds(k, &boxed.lo, &boxed.hi),
                },
                iterations: 0,
                converged: false,
                done: reuse.is_some() || config.max_iterations == 0,
            })
            .collect();
        Round {
            boxed,
            runs,
            iteration: 0,
            refit: reuse.is_none(),
        }
    }

    pub fn dims(&self) -> usize {
        self.boxed.dims.len()
    }

    /// Every k is done: what goes down next is the last pass.
    pub fn done(&self) -> bool {
        self.runs.iter().all(|r| r.done)
    }

    /// What goes down: the dims and every k's centroids.
    pub fn down(&self) -> KmeansPacket {
        KmeansPacket {
            dims: self.boxed.dims.clone(),
            runs: self
                .runs
                .iter()
                .map(|r| KmeansRun {
                    k: r.k,
                    centroids: r.centroids.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// An iteration's merged sums: a k whose assignments did not change has converged and keeps its
    /// centroids; the others move theirs to their clusters' means (an empty cluster keeps its centroid) and
    /// stop at max_iterations.
    pub fn step(&mut self, sums: &KmeansPacket, max_iterations: u32) {
        self.iteration += 1;
        let dims = self.dims();
        for (run, s) in self.runs.iter_mut().zip(&sums.runs) {
            if run.done {
                continue;
            }
            run.iterations = self.iteration;
            if s.changed == 0 {
                run.converged = true;
                run.done = true;
                continue;
            }
            run.centroids = space::update(&run.centroids, &s.sums, &s.counts, dims);
            run.done = self.iteration >= max_iterations;
        }
    }

    /// The centroids this round ends with, for the rounds that only assign.
    pub fn fitted(&self) -> Fitted {
        Fitted {
            dims: self.boxed.dims.clone(),
            centroids: self.runs.iter().map(|r| r.centroids.clone()).collect(),
        }
    }

    /// The result from the last phase's merged clusters. `names` gives a dim's name (empty when unknown).
    pub fn result(
        &self,
        parts: KmeansPacket,
        config: &Config,
        names: impl Fn(u64) -> String,
    ) -> KmeansResult {
        let dims = self.dims();
        let fits: Vec<KmeansFit> = self
            .runs
            .iter()
            .zip(&parts.runs)
            .map(|(run, p)| KmeansFit {
                k: run.k,
                fit: p.clusters.iter().map(|c| c.sum_d2).sum(),
                iterations: run.iterations,
                converged: run.converged,
            })
            .collect();
        let chosen = match config.improvement {
            Some(threshold) => choose(&fits, threshold),
            None => 0,
        };
        let run = &self.runs[chosen];
        let clusters = parts
            .runs
            .into_iter()
            .nth(chosen)
            .map(|r| r.clusters)
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(c, part)| {
                let rms = if part.size == 0 {
                    0.0
                } else {
                    (part.sum_d2 / part.size as f64).sqrt()
                };
                KmeansCluster {
                    cluster: c as u32,
                    size: part.size,
                    ranks: part.ranks,
                    representative: part.representative,
                    centroid: run.centroids[c * dims..(c + 1) * dims].to_vec(),
                    rms,
                    max_distance: part.max_d2.sqrt(),
                    sum_squares: part.sum_d2,
                }
            })
            .collect();
        let fit = &fits[chosen];
        KmeansResult {
            k: run.k,
            clusters,
            fit: fit.fit,
            iterations: fit.iterations,
            converged: fit.converged,
            refit: self.refit,
            dims: self.boxed.dims.clone(),
            lo: self.boxed.lo.clone(),
            hi: self.boxed.hi.clone(),
            names: self.boxed.dims.iter().map(|id| names(*id)).collect(),
            ranks: parts.ranks,
            metric: config.metric as i32,
            scheme: config.scheme.describe(),
            fits,
        }
    }
}

/// With k "auto": the smallest k for which one more cluster reduces the fit by less than `threshold` times the
/// fit of k = 1 (the ranks' total sum of squares about their mean), or the largest k when every step reduces it
/// more. Measuring each step against the total, not against the previous fit, keeps the noise inside
/// well-separated groups from passing for structure. A total of 0 cannot improve.
pub fn choose(fits: &[KmeansFit], threshold: f64) -> usize {
    let total = fits.first().map_or(0.0, |f| f.fit);
    for i in 0..fits.len().saturating_sub(1) {
        if total <= 0.0 || fits[i].fit - fits[i + 1].fit < threshold * total {
            return i;
        }
    }
    fits.len().saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fits(values: &[f64]) -> Vec<KmeansFit> {
        values
            .iter()
            .enumerate()
            .map(|(i, &fit)| KmeansFit {
                k: i as u32 + 1,
                fit,
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn auto_stops_where_the_fit_stops_improving() {
        // Of a total of 100: 100 -> 40 (60), 40 -> 10 (30), 10 -> 5 (5, half of the fit but 5% of the total).
        assert_eq!(choose(&fits(&[100.0, 40.0, 10.0, 5.0]), 0.1), 2);
        // Every step improves enough: the largest k.
        assert_eq!(choose(&fits(&[100.0, 50.0, 20.0]), 0.1), 2);
        assert_eq!(choose(&fits(&[100.0, 91.0, 20.0]), 0.1), 0);
        // A perfect fit stops at once.
        assert_eq!(choose(&fits(&[0.0, 0.0]), 0.1), 0);
        assert_eq!(choose(&fits(&[5.0]), 0.1), 0);
    }

    #[test]
    fn a_round_without_refit_reuses_the_last_centroids_when_dims_agree() {
        let config = Config::parse(r#"{"k": 2}"#).unwrap();
        let boxed = KmeansPacket {
            dims: vec![1],
            lo: vec![0.0],
            hi: vec![4.0],
            ranks: 3,
            ..Default::default()
        };
        let fresh = Round::start(boxed.clone(), &config, true, None);
        assert!(fresh.refit && !fresh.done());
        assert_eq!(fresh.down().runs[0].centroids, [1.0, 3.0]);
        let last = Fitted {
            dims: vec![1],
            centroids: vec![vec![0.5, 3.5]],
        };
        let reuse = Round::start(boxed.clone(), &config, false, Some(&last));
        assert!(!reuse.refit && reuse.done());
        assert_eq!(reuse.down().runs[0].centroids, [0.5, 3.5]);
        let other = Fitted {
            dims: vec![2],
            ..last
        };
        assert!(Round::start(boxed, &config, false, Some(&other)).refit);
    }
}
