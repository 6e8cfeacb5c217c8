//! The root's commands and its streams: opened, restaged, closed and failed on the whole tree, each change
//! recorded by the root's sink, and each stream's first round set once the leaves say where they stand.

use canopy_proto::v1::{Control, OpenStream, StreamReady, StreamSpec, control, down_message};
use tokio::time::Instant;

use super::Root;
use crate::node::first_round;
use crate::node::*;

impl<U: Up> Node<U, Root> {
    pub(super) async fn on_root_command(&mut self, cmd: RootCommand) {
        match cmd {
            RootCommand::OpenStream(spec, reply) => {
                let id = self.open_stream_at_root(spec).await;
                if let Some(reply) = reply {
                    let _ = reply.send(id);
                }
            }
            RootCommand::CloseStream(id, reply) => {
                let closed = self.close_stream_at_root(id).await;
                if let Some(reply) = reply {
                    let _ = reply.send(closed);
                }
            }
            RootCommand::Collection(c) => {
                let action = self.position.collection(c, self.next_round());
                tracing::info!(?c, "collection control");
                self.on_control(Control { action: Some(action) }).await;
            }
            RootCommand::Options(o) => {
                tracing::info!(?o, "measurement options");
                let action = Some(control::Action::Options(o));
                self.on_control(Control { action }).await;
            }
            RootCommand::Window { from, to, reply } => {
                let _ = reply.send(self.window_at_root(from, to).await);
            }
            RootCommand::Restage { stream, ranks, reply } => {
                let _ = reply.send(self.restage_at_root(stream, ranks).await);
            }
        }
    }

    /// The first round no leaf may have admitted yet: the root's window limit (a leaf's window never passes its
    /// parent's credit), or the next round if collection numbers on from further up.
    fn first_unadmitted_round(&self) -> u64 {
        self.window.limit().max(self.next_round())
    }

    /// A window of rounds: starts collection if it is stopped, then tells every rank which rounds to report.
    async fn window_at_root(&mut self, from: u64, to: u64) -> Result<(), String> {
        if to < from {
            return Err(format!(
                "the window ends (round {to}) before it starts (round {from})"
            ));
        }
        let first = self.first_unadmitted_round();
        if from < first {
            return Err(format!(
                "round {from} is not in the future: the tree may already hold rounds below {first}; \
                 start the window at round {first} or later"
            ));
        }
        let first_round = self.next_round();
        let root = &mut self.position;
        let start = (!root.collecting()).then(|| root.collection(Collection::Start, first_round));
        tracing::info!(from, to, "window of rounds");
        if let Some(action) = start {
            self.on_control(Control { action: Some(action) }).await;
        }
        let action = control::Action::Window(canopy_proto::v1::Window {
            from_round: from,
            to_round: to,
        });
        self.on_control(Control { action: Some(action) }).await;
        Ok(())
    }

    /// New ranks for a stream from a round no leaf has admitted yet: its spec gains a stage, which every node
    /// below applies from that round on and the store records.
    async fn restage_at_root(&mut self, id: u32, ranks: String) -> Result<u64, String> {
        let Some(mut spec) = self.streams.live_spec(id).cloned() else {
            return Err(format!("stream {id} is not open"));
        };
        crate::ranks::RankSet::parse_or_none(&ranks).map_err(|e| e.to_string())?;
        let after_last = spec.stages.last().map_or(0, |s| s.from_round + 1);
        let from_round = self.first_unadmitted_round().max(after_last);
        // A stage whose rounds have all closed is dropped once the next one is in force everywhere.
        let closed_below = self.closed_below();
        while spec.stages.len() >= 2 && spec.stages[1].from_round <= closed_below {
            spec.stages.remove(0);
        }
        if spec.stages.len() >= feed::MAX_STAGES {
            return Err(format!(
                "stream {id} has {} changes of ranks under way; try again once its rounds close",
                spec.stages.len()
            ));
        }
        spec.stages
            .push(canopy_proto::v1::RankStage { from_round, ranks });
        self.streams.restage(id, &spec)?;
        tracing::info!(stream = id, from_round, "stream fed by new ranks");
        self.stream_state(&spec, StreamState::Open, None).await;
        let open = OpenStream {
            spec: Some(for_children(&spec)),
        };
        self.broadcast(down_message::Msg::OpenStream(open)).await;
        Ok(from_round)
    }

    /// Opens a stream at the root and on the tree; returns its id (the stream may have failed at the root, which
    /// its recorded state says).
    pub(super) async fn open_stream_at_root(&mut self, mut spec: StreamSpec) -> u32 {
        self.position.assign_id(&mut spec);
        let id = spec.stream_id;
        // While ranks dump, the leaves say where each stands before the stream's first round is set (see
        // `first_round`); otherwise no leaf has dumped a round past the next one.
        let waits = self.position.collecting() && self.engine.ranks_expected() > 0;
        spec.first_round = (!waits).then(|| self.next_round());
        if waits {
            self.position.starting.begin(id, Instant::now());
        }
        if self.open_stream(spec.clone()).await {
            tracing::info!(stream = id, name = %spec.name, filter = %spec.filter, "stream open");
            self.stream_state(&spec, StreamState::Open, None).await;
            let open = OpenStream {
                spec: Some(for_children(&spec)),
            };
            self.broadcast(down_message::Msg::OpenStream(open)).await;
        }
        id
    }

    /// The leaves answered (or the wait ended): the stream's first round is set here and on the tree.
    async fn set_first_round_at_root(&mut self, id: u32, first_round: u64) {
        self.streams.set_first_round(id, first_round);
        let Some(spec) = self.streams.live_spec(id).cloned() else {
            return;
        };
        tracing::info!(stream = id, first_round, "stream's first round set");
        self.stream_state(&spec, StreamState::Open, None).await;
        let open = OpenStream {
            spec: Some(for_children(&spec)),
        };
        self.broadcast(down_message::Msg::OpenStream(open)).await;
    }

    /// A leaf's answer to a stream opened while ranks dumped, which may set the stream's first round.
    pub(super) async fn stream_ready_at_root(&mut self, mut ready: StreamReady) {
        // No agent dumps a round its parent's credit has not admitted: an answer past that is false, and would
        // hold the stream's first round off for as long as it says.
        let limit = self.first_unadmitted_round();
        if ready.next_round > limit {
            tracing::warn!(
                stream = ready.stream_id,
                next_round = ready.next_round,
                limit,
                "a leaf's StreamReady names a round no leaf has admitted: taken as round {limit}"
            );
            self.counters.malformed += 1;
            ready.next_round = limit;
        }
        let expected = self.engine.ranks_expected();
        if let Some(first) =
            self.position
                .starting
                .answer(ready.stream_id, ready.next_round, ready.ranks, expected)
        {
            self.set_first_round_at_root(ready.stream_id, first).await;
        }
    }

    /// The root's waits for the leaves that ended at `now`: each stream's first round is one no leaf has
    /// admitted yet, so none has dumped it, whether or not its answer came.
    pub(super) async fn first_rounds_due(&mut self, now: Instant) {
        let expected = self.engine.ranks_expected();
        for (id, answered) in self.position.starting.due(now) {
            let first = self.first_unadmitted_round();
            tracing::warn!(
                stream = id,
                first_round = first,
                answered,
                expected,
                "the leaves of {answered} of {expected} ranks said where they stand within {:?}: the stream starts at \
                 round {first}, the first the root has not admitted",
                first_round::ROOT_WAIT
            );
            self.set_first_round_at_root(id, first).await;
        }
    }

    async fn close_stream_at_root(&mut self, id: u32) -> bool {
        let Some(spec) = self.streams.live_spec(id).cloned() else {
            tracing::warn!(stream = id, "close of a stream that is not open");
            return false;
        };
        self.close_stream(id).await;
        tracing::info!(stream = id, name = %spec.name, "stream closed");
        self.stream_state(&spec, StreamState::Closed, None).await;
        let close = canopy_proto::v1::CloseStream { stream_id: id };
        self.broadcast(down_message::Msg::CloseStream(close)).await;
        true
    }

    /// A stream changed state: the sink records it.
    async fn stream_state(&mut self, spec: &StreamSpec, state: StreamState, failure: Option<&str>) {
        self.position.opts.sink.stream_state(spec, state, failure).await;
    }

    /// The stream fails on the whole tree.
    pub(super) async fn fail_stream(&mut self, stream: u32, reason: String) {
        let Some(spec) = self.streams.fail(stream) else {
            return;
        };
        let _ = self.engine.close_stream(stream);
        // Its rounds under way will not finish: each gets its row now (its ranks counted late), and they hold
        // the window no longer.
        for round in self.route.take_stream(stream) {
            self.store_unfinished_round(stream, round).await;
        }
        self.stream_state(&spec, StreamState::Failed, Some(&reason)).await;
        let close = canopy_proto::v1::CloseStream { stream_id: stream };
        self.broadcast(down_message::Msg::CloseStream(close)).await;
    }
}
