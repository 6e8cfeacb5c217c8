//! What a leaf does with its ranks: their vectors from phase 0 until the round's last pass, the bounding box
//! they span, and each pass's assignment to the centroids from the root.

use canopy_filter_common::metrics;
use canopy_filter_common::select::Selection;
use canopy_filter_common::{Values, ranks};
use canopy_filter_proto::v1::{KmeansPacket, KmeansPart, KmeansRun, Metric, RankRef};
use canopy_wire::v1::RankProfile;

use crate::merge::{check_dims, check_ks};
use crate::space;

/// A leaf's ranks of one round, kept from phase 0 until the last pass.
#[derive(Debug, Default)]
pub struct Points {
    ranks: Vec<RankRef>,
    /// Per rank, (event id, value) of its selected events, sorted by id, each once (repeats added).
    sparse: Vec<Vec<(u64, f64)>>,
    /// The dimensions `dense` is over.
    dims: Vec<u64>,
    /// The ranks' vectors over `dims`, flat: rank i is dense[i * dims .. (i + 1) * dims].
    dense: Vec<f64>,
    /// Per run, each rank's cluster in the previous iteration (empty before the first).
    previous: Vec<Vec<u32>>,
}

/// A rank's selected (event id, value) pairs: `metric` of the events the selection keeps, sorted by id, an
/// event reported twice added up.
pub fn vector(p: &RankProfile, selection: &mut Selection, metric: Metric, values: Values) -> Vec<(u64, f64)> {
    let mut all: Vec<(u64, f64)> = Vec::with_capacity(p.events.len());
    metrics::each_value(p, values, metric, |id, v| all.push((id, v)));
    let mut kept: Vec<(u64, f64)> = all
        .into_iter()
        .filter(|(id, _)| selection.get(*id).is_some())
        .collect();
    kept.sort_by_key(|(id, _)| *id);
    let mut out: Vec<(u64, f64)> = Vec::with_capacity(kept.len());
    for (id, v) in kept {
        match out.last_mut() {
            Some(last) if last.0 == id => last.1 += v,
            _ => out.push((id, v)),
        }
    }
    out.retain(|(_, v)| v.is_finite());
    out
}

/// A packet from above is usable here: dims sorted, the stream's runs, k finite centroids of every dim each.
pub fn check_down(p: &KmeansPacket, ks: &[u32]) -> Result<(), String> {
    check_dims(&p.dims)?;
    check_ks(p, ks)?;
    let dims = p.dims.len();
    for r in &p.runs {
        if r.centroids.len() != r.k as usize * dims {
            return Err(format!(
                "k {}: {} centroid values for {} clusters of {dims} dimensions",
                r.k,
                r.centroids.len(),
                r.k
            ));
        }
        if let Some(bad) = r.centroids.iter().find(|v| !v.is_finite()) {
            return Err(format!("k {}: the centroid value {bad} is not finite", r.k));
        }
    }
    Ok(())
}

impl Points {
    /// The ranks and their vectors (profiles sorted by rank, as `decode::profiles` gives them).
    pub fn new(ranks: Vec<RankRef>, sparse: Vec<Vec<(u64, f64)>>) -> Points {
        Points {
            ranks,
            sparse,
            ..Default::default()
        }
    }

    /// Phase 0: the dims these ranks report and the box they span, with 0 for a rank without a dim.
    pub fn box_packet(&self) -> KmeansPacket {
        let mut dims: Vec<u64> = self.sparse.iter().flatten().map(|(id, _)| *id).collect();
        dims.sort_unstable();
        dims.dedup();
        let mut lo = vec![f64::INFINITY; dims.len()];
        let mut hi = vec![f64::NEG_INFINITY; dims.len()];
        let mut seen = vec![0usize; dims.len()];
        for v in &self.sparse {
            for (id, x) in v {
                let Ok(i) = dims.binary_search(id) else { continue };
                lo[i] = lo[i].min(*x);
                hi[i] = hi[i].max(*x);
                seen[i] += 1;
            }
        }
        for i in 0..dims.len() {
            if seen[i] < self.sparse.len() {
                lo[i] = lo[i].min(0.0);
                hi[i] = hi[i].max(0.0);
            }
        }
        KmeansPacket {
            dims,
            lo,
            hi,
            ranks: self.ranks.len() as u64,
            runs: Vec::new(),
        }
    }

    /// The vectors over `dims` (an event outside them is left out: the root did not see it in phase 0).
    fn project(&mut self, dims: &[u64]) {
        if self.dims == dims && self.dense.len() == self.ranks.len() * dims.len() {
            return;
        }
        self.dims = dims.to_vec();
        self.dense = vec![0.0; self.ranks.len() * dims.len()];
        for (r, v) in self.sparse.iter().enumerate() {
            for (id, x) in v {
                if let Ok(i) = dims.binary_search(id) {
                    self.dense[r * dims.len() + i] = *x;
                }
            }
        }
    }

    fn point(&self, r: usize) -> &[f64] {
        let d = self.dims.len();
        &self.dense[r * d..(r + 1) * d]
    }

    /// An iteration: every rank to its nearest centroid of each run; per cluster the sum of its vectors and
    /// its count, and the ranks whose cluster changed.
    pub fn iterate(&mut self, down: &KmeansPacket) -> KmeansPacket {
        self.project(&down.dims);
        let d = self.dims.len();
        let n = self.ranks.len();
        self.previous.resize(down.runs.len(), Vec::new());
        let mut runs = Vec::with_capacity(down.runs.len());
        for (run, previous) in down.runs.iter().zip(std::mem::take(&mut self.previous)) {
            let k = run.k as usize;
            let mut sums = vec![0.0; k * d];
            let mut counts = vec![0u64; k];
            let mut now = Vec::with_capacity(n);
            for r in 0..n {
                let x = self.point(r);
                let (c, _) = space::nearest(&run.centroids, d, x);
                for (s, v) in sums[c * d..(c + 1) * d].iter_mut().zip(x) {
                    *s += v;
                }
                counts[c] += 1;
                now.push(c as u32);
            }
            let changed = if previous.len() == n {
                previous.iter().zip(&now).filter(|(a, b)| a != b).count()
            } else {
                n
            };
            self.previous.push(now);
            runs.push(KmeansRun {
                k: run.k,
                sums,
                counts,
                changed: changed as u64,
                ..Default::default()
            });
        }
        KmeansPacket {
            ranks: n as u64,
            runs,
            ..Default::default()
        }
    }

    /// The last pass: every rank to its nearest final centroid of each run; per cluster its ranks, its
    /// representative and the squared distances.
    pub fn last(&mut self, down: &KmeansPacket) -> KmeansPacket {
        self.project(&down.dims);
        let d = self.dims.len();
        let mut runs = Vec::with_capacity(down.runs.len());
        for run in &down.runs {
            let mut members: Vec<Vec<(&str, u32)>> = vec![Vec::new(); run.k as usize];
            let mut parts = vec![KmeansPart::default(); run.k as usize];
            for (r, rank) in self.ranks.iter().enumerate() {
                let (c, d2) = space::nearest(&run.centroids, d, self.point(r));
                members[c].push((rank.app.as_str(), rank.rank));
                let one = KmeansPart {
                    ranks: Vec::new(),
                    size: 1,
                    representative: Some(rank.clone()),
                    representative_d2: d2,
                    sum_d2: d2,
                    max_d2: d2,
                };
                crate::merge::merge_part(&mut parts[c], &one);
            }
            for (part, m) in parts.iter_mut().zip(members) {
                part.ranks = ranks::compress(m);
            }
            runs.push(KmeansRun {
                k: run.k,
                clusters: parts,
                ..Default::default()
            });
        }
        KmeansPacket {
            ranks: self.ranks.len() as u64,
            runs,
            ..Default::default()
        }
    }
}
