//! Streams over their life: opened and closed by the root's commands, on the tree and on this node, and failed
//! when a filter fails anywhere.

use canopy_proto::v1::{
    Control, EventName, NameDictionary, OpenStream, StreamError, StreamReady, StreamSpec, control,
    down_message, up_message,
};

use super::*;

impl<U: Up> Node<U> {
    // ---- the root's commands ----

    pub(super) async fn on_root_command(&mut self, cmd: RootCommand) {
        if !matches!(self.role, Role::Root(_)) {
            tracing::warn!(node = %self.id, "a root command reached a node that is not the root: {cmd:?}");
            return;
        }
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
                let first_round = self.next_round();
                let Role::Root(root) = &mut self.role else { return };
                let action = root.collection(c, first_round);
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
        let Role::Root(root) = &mut self.role else {
            return Err("not the root".into());
        };
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
        let Role::Root(root) = &mut self.role else {
            return 0;
        };
        root.assign_id(&mut spec);
        let id = spec.stream_id;
        // While ranks dump, the leaves say where each stands before the stream's first round is set (see
        // `first_round`); otherwise no leaf has dumped a round past the next one.
        let waits = root.collecting() && self.engine.ranks_expected() > 0;
        spec.first_round = (!waits).then(|| self.next_round());
        if waits && let Role::Root(root) = &mut self.role {
            root.starting.begin(id, Instant::now());
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
    pub(super) async fn set_first_round_at_root(&mut self, id: u32, first_round: u64) {
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

    /// A leaf's answer to a stream opened while ranks dumped: at the root, it may set the stream's first round;
    /// elsewhere it goes up.
    pub(super) async fn on_stream_ready(&mut self, mut ready: StreamReady) {
        if !matches!(self.role, Role::Root(_)) {
            self.up.send(up_message::Msg::StreamReady(ready)).await;
            return;
        }
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
        let Role::Root(root) = &mut self.role else {
            return;
        };
        if let Some(first) = root
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
        let Role::Root(root) = &mut self.role else {
            return;
        };
        for (id, answered) in root.starting.due(now) {
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

    pub(super) async fn close_stream_at_root(&mut self, id: u32) -> bool {
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

    pub(super) async fn stream_state(
        &mut self,
        spec: &StreamSpec,
        state: StreamState,
        failure: Option<&str>,
    ) {
        if let Role::Root(root) = &mut self.role {
            root.opts.sink.stream_state(spec, state, failure).await;
        }
    }

    // ---- streams ----

    pub(super) async fn open_stream(&mut self, mut spec: StreamSpec) -> bool {
        let id = spec.stream_id;
        if let Some(known) = self.streams.spec(id) {
            // The first round is set once: the root's (a stream opened while ranks dumped) ends a leaf's wait, and
            // the stream goes on from the round it started at whatever a parent says later (a restarted root
            // reopens its streams from the next round it knows).
            if known.first_round.is_none()
                && let Some(first) = spec.first_round
            {
                self.streams.set_first_round(id, first);
                let kept = match &mut self.role {
                    Role::Leaf(leaf) => leaf.waiting.release(id, first),
                    _ => Vec::new(),
                };
                self.feed_kept(id, kept).await;
            }
            spec.first_round = self.streams.spec(id).and_then(|s| s.first_round);
        }
        match self.streams.spec(id) {
            // The parent tells a child that comes back what it already runs.
            Some(known) if *known == spec => return true,
            // An adopter (a level higher than the lost parent) gives a longer time-out: the same stream, which
            // goes on with its filter and the rounds it holds.
            Some(known)
                if StreamSpec {
                    timeout_ms: spec.timeout_ms,
                    ..known.clone()
                } == spec =>
            {
                self.streams.set_timeout(id, spec.timeout_ms);
                self.engine.open_stream(id, streams::sync_of(&spec));
                return true;
            }
            // New rank stages (the root moved an automatic detail stream): the same stream, fed by other ranks from
            // a round no leaf has admitted yet.
            Some(known)
                if StreamSpec {
                    stages: spec.stages.clone(),
                    timeout_ms: spec.timeout_ms,
                    ..known.clone()
                } == spec =>
            {
                self.streams.set_timeout(id, spec.timeout_ms);
                if let Err(e) = self.streams.restage(id, &spec) {
                    tracing::warn!(node = %self.id, stream = id, "rank stages refused: {e}");
                }
                return true;
            }
            // The same id for another stream (a root restarted with another table): the old one ends here first,
            // so none of its packets reach the new filter.
            Some(known) => {
                tracing::warn!(node = %self.id, stream = id, old = %known.filter, new = %spec.filter,
                    "the parent reopened stream {id} with another spec: closing the old one");
                self.close_stream(id).await;
            }
            None => {}
        }
        let first_round = spec.first_round;
        match self.streams.open(spec, &self.names) {
            Ok(sync) => {
                self.engine.open_stream(id, sync);
                if first_round.is_none() {
                    self.wait_for_first_round(id).await;
                }
                true
            }
            Err(reason) => {
                self.stream_error(id, reason).await;
                false
            }
        }
    }

    /// At a leaf, a stream with no first round yet: its dumps are kept from the first round not dumped here, and
    /// the root hears which.
    async fn wait_for_first_round(&mut self, id: u32) {
        let ranks = self.engine.ranks_expected();
        let Role::Leaf(leaf) = &mut self.role else {
            return;
        };
        let next_round = leaf.highest_dumped.map_or(0, |h| h.saturating_add(1));
        leaf.waiting.wait(id, next_round);
        let ready = StreamReady {
            stream_id: id,
            next_round,
            ranks,
        };
        self.up.send(up_message::Msg::StreamReady(ready)).await;
    }

    pub(super) async fn close_stream(&mut self, id: u32) {
        match &mut self.role {
            Role::Leaf(leaf) => leaf.waiting.forget(id),
            Role::Root(root) => root.starting.forget(id),
            Role::Relay => {}
        }
        let closed = self.engine.close_stream(id);
        self.on_closed_all(closed).await;
        self.streams.close(id);
        // Rounds cut short by the close will not finish; packets still on their way are expected, not malformed.
        self.route.forget_stream(id);
    }

    /// A filter failed on this node: the stream stops here and the root hears why.
    pub(super) async fn stream_error(&mut self, stream: u32, reason: String) {
        tracing::error!(node = %self.id, stream, "stream failed: {reason}");
        self.counters.streams_failed += 1;
        if let Role::Root(_) = self.role {
            return self
                .fail_stream(stream, format!("node {}: {reason}", self.id))
                .await;
        }
        self.streams.fail(stream);
        let _ = self.engine.close_stream(stream);
        // Its rounds under way here will not finish: they hold the window no longer.
        self.route.forget_stream(stream);
        let e = StreamError {
            stream_id: stream,
            node_id: self.id.clone(),
            reason,
        };
        self.up.send(up_message::Msg::StreamError(e)).await;
    }

    /// At the root: the stream fails on the whole tree.
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

    /// New names go up; a known id with another name goes up too, so the root can report the collision.
    pub(super) async fn on_names(&mut self, names: Vec<EventName>) {
        let mut fresh = Vec::new();
        for n in names {
            if self.names.get(&n.id) != Some(&n.name) {
                self.names.entry(n.id).or_insert_with(|| n.name.clone());
                fresh.push(n);
            }
        }
        if !fresh.is_empty() {
            let pairs: Vec<(u64, String)> = fresh.iter().map(|n| (n.id, n.name.clone())).collect();
            self.streams.names(&pairs);
            self.up
                .send(up_message::Msg::Names(NameDictionary { names: fresh }))
                .await;
        }
    }
}
