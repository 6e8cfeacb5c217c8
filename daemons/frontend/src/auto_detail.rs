//! `canopy ctl detail --auto`: a detail stream fed only by the ranks that matter (seed 002, section 4): the top
//! outliers of an `outliers` stream and each cluster's representative from a `kmeans` stream. As their results
//! come, the stream moves to the latest ranks, at a round no leaf has admitted yet (the root's rank stages), so
//! every rank of the tree switches at the same round and the store records which ranks fed which rounds.

use std::collections::BTreeSet;
use std::sync::Arc;

use canopy_core::node::RootHandle;
use canopy_proto::filters::v1::{KmeansResult, OutliersResult};
use prost::Message;
use tokio::sync::broadcast;

use crate::state::State;

/// The streams whose results choose the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sources {
    pub outliers: Option<u32>,
    pub clusters: Option<u32>,
}

/// The ranks chosen so far: each source's latest round and its ranks.
#[derive(Debug, Default)]
struct Chosen {
    outliers: Option<(u64, BTreeSet<u32>)>,
    representatives: Option<(u64, BTreeSet<u32>)>,
}

impl Chosen {
    /// Takes in a source's result; true if it is that source's newest round.
    fn take(&mut self, sources: Sources, stream: u32, round: u64, payload: &[u8]) -> Result<bool, String> {
        let (slot, ranks) = if Some(stream) == sources.outliers {
            let r = OutliersResult::decode(payload).map_err(|e| format!("outliers result: {e}"))?;
            (&mut self.outliers, outlier_ranks(&r))
        } else if Some(stream) == sources.clusters {
            let r = KmeansResult::decode(payload).map_err(|e| format!("kmeans result: {e}"))?;
            (&mut self.representatives, representatives(&r))
        } else {
            return Ok(false);
        };
        if slot.as_ref().is_some_and(|(newest, _)| *newest >= round) {
            return Ok(false);
        }
        *slot = Some((round, ranks));
        Ok(true)
    }

    /// The ranks that feed the detail stream now, as ranges; `None` until every source has answered once.
    fn ranks(&self, sources: Sources) -> Option<String> {
        let outliers = match (sources.outliers, &self.outliers) {
            (Some(_), None) => return None,
            (_, o) => o.as_ref().map(|(_, r)| r),
        };
        let representatives = match (sources.clusters, &self.representatives) {
            (Some(_), None) => return None,
            (_, r) => r.as_ref().map(|(_, r)| r),
        };
        let all: BTreeSet<u32> = outliers
            .into_iter()
            .chain(representatives)
            .flatten()
            .copied()
            .collect();
        Some(ranges(&all))
    }
}

/// Every rank an outliers result keeps, over all its groups.
pub fn outlier_ranks(r: &OutliersResult) -> BTreeSet<u32> {
    r.groups
        .iter()
        .flat_map(|g| g.top.iter().map(|o| o.rank))
        .collect()
}

/// The representative of every cluster of a kmeans result.
pub fn representatives(r: &KmeansResult) -> BTreeSet<u32> {
    r.clusters
        .iter()
        .filter_map(|c| c.representative.as_ref().map(|rep| rep.rank))
        .collect()
}

/// Ranks as the ranges a stream's ranks are written in: `0-3,7`.
pub fn ranges(ranks: &BTreeSet<u32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut run: Option<(u32, u32)> = None;
    for &r in ranks {
        run = match run {
            Some((a, b)) if b.checked_add(1) == Some(r) => Some((a, r)),
            Some(done) => {
                parts.push(range_text(done));
                Some((r, r))
            }
            None => Some((r, r)),
        };
    }
    if let Some(done) = run {
        parts.push(range_text(done));
    }
    parts.join(",")
}

fn range_text((a, b): (u32, u32)) -> String {
    if a == b { a.to_string() } else { format!("{a}-{b}") }
}

/// Moves the detail stream to the ranks the sources choose, until it closes or the run ends.
pub fn spawn(shared: Arc<State>, root: RootHandle, detail: u32, sources: Sources) {
    let mut results = shared.live.subscribe();
    tokio::spawn(async move {
        let mut chosen = Chosen::default();
        let mut current: Option<String> = None;
        loop {
            let result = match results.recv().await {
                Ok(r) => r,
                // Missed results only delay the move to the newest ranks.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            };
            match chosen.take(sources, result.stream.stream_id, result.round, &result.payload) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(
                        stream = detail,
                        "automatic detail: a source's result is unreadable: {e}"
                    );
                    continue;
                }
            }
            let Some(ranks) = chosen.ranks(sources) else {
                continue;
            };
            if current.as_deref() == Some(ranks.as_str()) {
                continue;
            }
            match root.restage(detail, ranks.clone()).await {
                Some(Ok(from_round)) => {
                    tracing::info!(stream = detail, from_round, ranks = %ranks, "automatic detail: new ranks");
                    shared.set_detail_ranks(detail, &ranks);
                    if !root.options(shared.effective_options()).await {
                        return;
                    }
                    current = Some(ranks);
                }
                Some(Err(e)) => {
                    tracing::info!(stream = detail, "automatic detail ends: {e}");
                    return;
                }
                None => return,
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::filters::v1::{KmeansCluster, Outlier, OutlierGroup, RankRef};

    fn outliers(groups: &[&[u32]]) -> Vec<u8> {
        OutliersResult {
            groups: groups
                .iter()
                .map(|ranks| OutlierGroup {
                    top: ranks
                        .iter()
                        .map(|&rank| Outlier {
                            rank,
                            ..Outlier::default()
                        })
                        .collect(),
                    ..OutlierGroup::default()
                })
                .collect(),
            ..OutliersResult::default()
        }
        .encode_to_vec()
    }

    fn clusters(reps: &[u32]) -> Vec<u8> {
        KmeansResult {
            clusters: reps
                .iter()
                .map(|&rank| KmeansCluster {
                    representative: Some(RankRef {
                        app: "a".into(),
                        rank,
                    }),
                    ..KmeansCluster::default()
                })
                .collect(),
            ..KmeansResult::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn ranges_read_as_a_stream_writes_them() {
        let set = |r: &[u32]| r.iter().copied().collect::<BTreeSet<u32>>();
        assert_eq!(ranges(&set(&[])), "");
        assert_eq!(ranges(&set(&[7])), "7");
        assert_eq!(
            ranges(&set(&[0, 1, 2, 3, 7, 9, 10, u32::MAX])),
            "0-3,7,9-10,4294967295"
        );
    }

    #[test]
    fn the_ranks_are_the_latest_outliers_and_representatives_once_both_answered() {
        let sources = Sources {
            outliers: Some(2),
            clusters: Some(3),
        };
        let mut c = Chosen::default();
        assert!(c.take(sources, 2, 5, &outliers(&[&[9, 4], &[5]])).unwrap());
        // Not before the clusters answered: the representatives belong in every set.
        assert_eq!(c.ranks(sources), None);
        assert!(c.take(sources, 3, 5, &clusters(&[0, 5, 12])).unwrap());
        assert_eq!(c.ranks(sources).as_deref(), Some("0,4-5,9,12"));
        // An older round (results of different rounds may come out of order) changes nothing.
        assert!(!c.take(sources, 2, 4, &outliers(&[&[1]])).unwrap());
        assert!(c.take(sources, 2, 6, &outliers(&[&[1]])).unwrap());
        assert_eq!(c.ranks(sources).as_deref(), Some("0-1,5,12"));
        // Another stream's results are not looked at; a source's unreadable result is an error.
        assert!(!c.take(sources, 9, 7, b"\xff").unwrap());
        assert!(c.take(sources, 3, 7, b"\xff\xff").is_err());
    }

    #[test]
    fn one_source_alone_chooses() {
        let sources = Sources {
            outliers: Some(2),
            clusters: None,
        };
        let mut c = Chosen::default();
        c.take(sources, 2, 0, &outliers(&[&[3]])).unwrap();
        assert_eq!(c.ranks(sources).as_deref(), Some("3"));
    }
}
