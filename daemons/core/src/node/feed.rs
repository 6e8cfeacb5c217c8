//! The ranks that feed a stream, round by round: the spec's ranks, then each later stage from its round on (a
//! detail stream chosen automatically moves to new ranks at a round no leaf has admitted yet).

use canopy_proto::v1::{RankStage, StreamSpec};

use crate::ranks::RankSet;

/// At most this many stages are kept on a stream; the root drops the oldest first.
pub const MAX_STAGES: usize = 16;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Feed {
    first: RankSet,
    /// (from round, ranks), sorted by round.
    stages: Vec<(u64, RankSet)>,
    /// The stream's first round (see `first_round`); `None` while the root waits for the leaves.
    pub(crate) first_round: Option<u64>,
}

impl Feed {
    /// The feed a spec describes; the error names the bad ranks.
    pub(crate) fn of(spec: &StreamSpec) -> Result<Feed, String> {
        let first = RankSet::parse(&spec.ranks).map_err(|e| e.to_string())?;
        Ok(Feed {
            first,
            stages: stages(&spec.stages)?,
            first_round: spec.first_round,
        })
    }

    /// Replaces the later stages (the spec's ranks are the same).
    pub(crate) fn restage(&mut self, spec: &StreamSpec) -> Result<(), String> {
        self.stages = stages(&spec.stages)?;
        Ok(())
    }

    /// The ranks in force at `round`.
    pub(crate) fn at(&self, round: u64) -> &RankSet {
        self.stages
            .iter()
            .rev()
            .find(|(from, _)| *from <= round)
            .map_or(&self.first, |(_, ranks)| ranks)
    }
}

fn stages(stages: &[RankStage]) -> Result<Vec<(u64, RankSet)>, String> {
    if stages.len() > MAX_STAGES {
        return Err(format!(
            "{} rank stages on one stream; at most {MAX_STAGES}",
            stages.len()
        ));
    }
    let mut out = Vec::with_capacity(stages.len());
    for s in stages {
        if out.last().is_some_and(|(from, _)| *from >= s.from_round) {
            return Err(format!(
                "rank stages out of order: round {} after round {}",
                s.from_round,
                out.last().map_or(0, |(from, _)| *from)
            ));
        }
        let ranks = RankSet::parse_or_none(&s.ranks)
            .map_err(|e| format!("stage from round {}: {e}", s.from_round))?;
        out.push((s.from_round, ranks));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(ranks: &str, stages: &[(u64, &str)]) -> StreamSpec {
        StreamSpec {
            ranks: ranks.into(),
            stages: stages
                .iter()
                .map(|(from_round, ranks)| RankStage {
                    from_round: *from_round,
                    ranks: ranks.to_string(),
                })
                .collect(),
            ..StreamSpec::default()
        }
    }

    #[test]
    fn each_round_is_fed_by_the_stage_in_force() {
        let feed = Feed::of(&spec("1,2", &[(10, "5"), (20, "")])).unwrap();
        assert!(feed.at(0).contains(1) && !feed.at(9).contains(5));
        assert!(feed.at(10).contains(5) && !feed.at(19).contains(1));
        // An empty stage feeds nothing, unlike empty spec ranks (every rank).
        assert!(!feed.at(20).contains(5) && !feed.at(u64::MAX).contains(0));
        assert!(Feed::of(&spec("", &[])).unwrap().at(7).contains(12345));
    }

    #[test]
    fn bad_stages_are_refused_with_their_reason() {
        assert_eq!(
            Feed::of(&spec("", &[(10, "1"), (10, "2")])).unwrap_err(),
            "rank stages out of order: round 10 after round 10"
        );
        assert_eq!(
            Feed::of(&spec("", &[(3, "x")])).unwrap_err(),
            "stage from round 3: bad rank range \"x\": expected N or N-M"
        );
        let many: Vec<(u64, &str)> = (0..=MAX_STAGES as u64).map(|r| (r, "1")).collect();
        assert!(Feed::of(&spec("", &many)).unwrap_err().contains("at most 16"));
    }
}
