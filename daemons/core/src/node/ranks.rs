//! The leaf's ranks as the node applies them: placed by the leaf (held before the start), then attached, dumped,
//! dropped or detached in the engine.

use canopy_proto::v1::{Coverage, EventName, MissingReason};

use super::first_round::{Fed, KEPT_ROUNDS};

use super::*;

impl<U: Up, P: Position> Node<U, P> {
    // ---- the leaf's ranks ----

    pub(super) async fn on_rank(&mut self, ev: RankEvent) {
        let Some(leaf) = &mut self.leaf else {
            tracing::warn!(node = %self.id, "a rank event reached a node that is not a leaf: {ev:?}");
            return;
        };
        match leaf.place(ev) {
            Placed::Now(ev) => self.apply_rank(ev).await,
            Placed::Held { dropped } => self.counters.rank_dumps_dropped += dropped,
        }
    }

    /// Releases the leaf's held dumps that the window admits.
    pub(super) async fn release_held(&mut self) -> bool {
        let limit = self.window.limit();
        let Some(leaf) = &mut self.leaf else {
            return false;
        };
        let released = leaf.release(limit);
        let any = !released.is_empty();
        for ev in released {
            self.apply_rank(ev).await;
        }
        any
    }

    pub(super) async fn apply_rank(&mut self, ev: RankEvent) {
        match ev {
            RankEvent::Attached { source, from, .. } => {
                self.engine.add_source_from(&source, 1, from);
                if let Some((app, _)) = parse_rank_source(&source) {
                    self.engine.set_composition(&source, vec![(app.to_string(), 1)]);
                }
                self.ranks_changed().await;
            }
            RankEvent::Round {
                source,
                rank,
                round,
                dump_unix_ns,
                profile,
            } => {
                self.on_rank_round(source, rank, round, dump_unix_ns, profile)
                    .await
            }
            RankEvent::RoundsDropped { source, from, end } => {
                let closed = self.engine.drop_rounds(&source, from, end);
                self.on_closed_all(closed).await;
            }
            RankEvent::Names(names) => {
                let names = names
                    .into_iter()
                    .map(|(id, name)| EventName { id, name })
                    .collect();
                self.on_names(names).await
            }
            RankEvent::Detached { source, finished_end } => {
                let state = match finished_end {
                    Some(end) => SourceState::Finished { end },
                    None => SourceState::Lost,
                };
                let closed = self.engine.set_source_state(&source, state);
                self.on_closed_all(closed).await;
            }
            RankEvent::DumpsDropped(n) => self.counters.rank_dumps_dropped += n,
            RankEvent::Left { source, .. } => {
                let closed = self.engine.forget_source(&source);
                self.on_closed_all(closed).await;
                self.ranks_changed().await;
            }
        }
    }

    /// A rank's dump of a round outside the window of rounds: before the window the rank counts as stopped from this
    /// round and is expected again from the window's first round (every rank resumes there); after it, as stopped.
    async fn outside_window(&mut self, source: &str, round: u64, from: u64) {
        let state = self.engine.source_state(source);
        let closed = if round < from {
            if state == Some(SourceState::Live) && self.engine.source_from(source) == Some(from) {
                return;
            }
            let closed = self
                .engine
                .set_source_state(source, SourceState::Stopped { end: round });
            self.engine.resume_source(source, from);
            closed
        } else {
            if matches!(state, Some(SourceState::Stopped { .. })) {
                return;
            }
            self.engine
                .set_source_state(source, SourceState::Stopped { end: round })
        };
        self.on_closed_all(closed).await;
    }

    /// One dump of a rank. A rank told to stop says so once, at its first stopped dump: it counts as stopped from
    /// that round on until it reports again. A dump of a round outside the window of rounds in force counts as
    /// the rank's stop (once), so the window starts and ends at the same round at every rank.
    pub(super) async fn on_rank_round(
        &mut self,
        source: String,
        rank: u32,
        round: u64,
        dump_unix_ns: u64,
        profile: Result<bytes::Bytes, MissingReason>,
    ) {
        self.counters.highest_seen = self.counters.highest_seen.max(round);
        if let Some(leaf) = &mut self.leaf {
            leaf.highest_dumped = Some(leaf.highest_dumped.map_or(round, |h| h.max(round)));
        }
        let window = self
            .leaf
            .as_ref()
            .filter(|leaf| leaf.outside_window(round))
            .and_then(|leaf| leaf.window);
        if let Some((from, _)) = window {
            return self.outside_window(&source, round, from).await;
        }
        match self.engine.source_state(&source) {
            None => {
                tracing::warn!(node = %self.id, %source, round, "dump from a rank that is not attached");
                return;
            }
            Some(SourceState::Stopped { .. }) if profile != Err(MissingReason::Stopped) => {
                self.engine.resume_source(&source, round);
            }
            _ => {}
        }
        let app = parse_rank_source(&source).map_or("", |(app, _)| app);
        let (payload, coverage) = match profile {
            Ok(p) => (p, Coverage::full(app)),
            Err(MissingReason::Stopped) => {
                let closed = self
                    .engine
                    .set_source_state(&source, SourceState::Stopped { end: round });
                return self.on_closed_all(closed).await;
            }
            Err(reason) => (bytes::Bytes::new(), Coverage::absent(app, reason)),
        };
        let lowest_open = self.engine.lowest_open_round();
        if let Some(leaf) = &mut self.leaf
            && !leaf.admit_open(lowest_open, round, payload.len())
        {
            // Past the leaf's bound on bytes held in open rounds: the dump is refused, its rank-round dropped.
            self.counters.rank_dumps_dropped += 1;
            let refused = leaf.refused_for_memory();
            if refused.is_power_of_two() {
                tracing::warn!(node = %self.id, %source, round, refused, bytes = payload.len(),
                    "the rounds open here hold the agent's share of memory_budget_mb: a rank's dump is refused and \
                     its rank-round counts as dropped (raise memory_budget_mb, or lower the window)");
            }
            let closed = self.engine.drop_rounds(&source, round, round + 1);
            return self.on_closed_all(closed).await;
        }
        // A stream fed by chosen ranks only (detail) counts the others as sampled out.
        let feeds: Vec<(u32, bool, bool, Option<u64>)> = self
            .streams
            .feeds()
            .map(|(id, feed)| {
                let chosen = feed.at(round).contains(rank);
                (id, chosen, self.streams.is_node_stream(id), feed.first_round)
            })
            .collect();
        // Every stream shares the one payload; the last takes the dump's source and coverage as they are.
        let mut dump = Some((source, payload, coverage));
        let last = feeds.len().saturating_sub(1);
        for (i, (stream, chosen, node_stream, first_round)) in feeds.into_iter().enumerate() {
            let Some((source, payload, coverage)) = (if i == last { dump.take() } else { dump.clone() })
            else {
                break;
            };
            // A node stream counts the rank and takes the node's sample instead when the round closes
            // (`samples`).
            let (payload, coverage) = match (chosen, node_stream) {
                (true, false) => (payload, coverage),
                (true, true) => (bytes::Bytes::new(), coverage),
                (false, _) => {
                    let app = parse_rank_source(&source).map_or("", |(app, _)| app);
                    (
                        bytes::Bytes::new(),
                        Coverage::absent(app, MissingReason::SampledOut),
                    )
                }
            };
            let key = GroupKey {
                stream,
                round,
                phase: 0,
            };
            let arrival = Arrival {
                source,
                coverage,
                payload,
                first_dump_unix_ns: dump_unix_ns,
            };
            self.feed_stream(key, first_round, arrival).await;
        }
    }

    /// A dump into a stream's round: now, kept until the root sets the stream's first round, or not at all below
    /// that round (see `first_round`).
    async fn feed_stream(&mut self, key: GroupKey, first_round: Option<u64>, arrival: Arrival) {
        let fed = match &mut self.leaf {
            Some(leaf) => leaf.waiting.feed(key.stream, first_round, key.round, arrival),
            None => Fed::Now(arrival),
        };
        match fed {
            Fed::Now(arrival) => self.accept(key, arrival).await,
            Fed::Kept | Fed::Before => {}
            Fed::KeptShort { round } => {
                tracing::warn!(node = %self.id, stream = key.stream, round,
                    "no first round from the root after {KEPT_ROUNDS} rounds of dumps: the oldest let their payloads \
                     go, and should the stream start at or before round {round} its ranks count there as dropped");
            }
        }
    }

    /// Feeds a stream the dumps a leaf kept for it, round by round.
    pub(super) async fn feed_kept(&mut self, stream: u32, dumps: Vec<(u64, Vec<Arrival>)>) {
        for (round, arrivals) in dumps {
            let key = GroupKey {
                stream,
                round,
                phase: 0,
            };
            for arrival in arrivals {
                self.accept(key, arrival).await;
            }
        }
    }
}
