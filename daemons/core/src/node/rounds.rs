//! How packets flow through a node: a child's packet or a rank's dump into the engine, a closed group through
//! the filter, what the filter emitted down to the children and up to the parent (at the root, into results), late
//! packets, and the timers that close rounds.

use canopy_proto::v1::{Coverage, DownMessage, Envelope, MissingReason, down_message, up_message};
use tokio::time::Instant;

use super::*;

impl<U: Up> Node<U> {
    pub(super) async fn on_envelope(&mut self, source: String, env: Envelope) {
        self.counters.highest_seen = self.counters.highest_seen.max(env.round);
        tracing::debug!(target: crate::LATENCY, node = %self.id, child = %source, round = env.round, phase = env.phase,
            first_dump_ns = env.first_dump_unix_ns, at_ns = super::unix_ns(), "packet in");
        let key = GroupKey {
            stream: env.stream_id,
            round: env.round,
            phase: env.phase,
        };
        let coverage = env.coverage.unwrap_or_default();
        // Against the most the child ever answered for: a round that opened before ranks left below it counts them.
        let ranks_below = self.engine.ranks_ceiling(&source).unwrap_or(0);
        if let Err(reason) = crate::coverage::check_child_coverage(&coverage, ranks_below) {
            tracing::warn!(node = %self.id, child = %source, stream = env.stream_id, round = env.round,
                "packet refused: {reason}");
            self.counters.malformed += 1;
            return;
        }
        let arrival = Arrival {
            source,
            coverage,
            payload: env.payload.into(),
            first_dump_unix_ns: env.first_dump_unix_ns,
        };
        if env.late {
            return self.on_late(key, arrival).await;
        }
        match self.streams.known(key.stream) {
            Known::Live => {}
            Known::Failed | Known::Closed => return,
            Known::Unknown => {
                tracing::warn!(node = %self.id, child = %arrival.source, stream = key.stream,
                    "packet for a stream this node does not have");
                self.counters.malformed += 1;
                return;
            }
        }
        self.accept(key, arrival).await;
    }

    /// A packet from the parent for one of this node's streams (a multi-phase filter's later phase).
    pub(super) async fn on_downstream(&mut self, env: Envelope) {
        let Some(out) = self
            .streams
            .downstream(env.stream_id, env.round, env.phase, &env.payload)
        else {
            return;
        };
        match out {
            Ok(out) => {
                let (cov, first) = self.route.recall(env.stream_id, env.round);
                self.emit(env.stream_id, env.round, out, cov, first).await;
            }
            Err(e) => self.stream_error(env.stream_id, e.to_string()).await,
        }
    }

    // ---- rounds ----

    pub(super) async fn accept(&mut self, key: GroupKey, arrival: Arrival) {
        match self.engine.accept(key, arrival, Instant::now()) {
            Ok(Accepted::Pending) => {}
            Ok(Accepted::Closed(c)) => self.on_closed(c).await,
            Ok(Accepted::Late(a)) => self.on_late(key, a).await,
            Err(e) => {
                tracing::warn!(node = %self.id, "dropped a packet: {e}");
                self.counters.malformed += 1;
            }
        }
    }

    pub(super) async fn on_closed_all(&mut self, closed: Vec<Closed>) {
        for c in closed {
            self.on_closed(c).await;
        }
    }

    pub(super) async fn on_closed(&mut self, c: Closed) {
        let closed_ns = super::unix_ns();
        self.highest_closed = Some(self.highest_closed.map_or(c.key.round, |h| h.max(c.key.round)));
        // Arrivals that cover nothing and carry nothing (sampled-out ranks) count in coverage, not as inputs.
        let used: Vec<&Arrival> = c
            .inputs
            .iter()
            .filter(|a| !(a.payload.is_empty() && a.coverage.covered == 0))
            .collect();
        let inputs: Vec<&[u8]> = used.iter().map(|a| a.payload.as_ref()).collect();
        if c.key.phase == 0
            && let (Some(phases), Some(spec)) =
                (self.streams.phases(c.key.stream), self.streams.spec(c.key.stream))
        {
            // A multi-phase round is under way from here, not only once its filter's answer is routed: a window
            // that moved past it in between would fall back when the answer came.
            self.route
                .begin(c.key.stream, c.key.round, phases, spec.timeout_ms, Instant::now());
        }
        let Some(out) = self
            .streams
            .upstream(c.key.stream, c.key.round, c.key.phase, &inputs)
        else {
            return;
        };
        let out = match out {
            Ok(out) => out,
            Err(e) => return self.stream_error(c.key.stream, e.to_string()).await,
        };
        let mut coverage = c.coverage;
        for (i, reason) in &out.rejected {
            let Some(input) = used.get(*i) else { continue };
            uncover(&mut coverage, MissingReason::Malformed, input.coverage.covered);
            self.counters.malformed += 1;
            let filter = self
                .streams
                .spec(c.key.stream)
                .map(|s| s.filter.clone())
                .unwrap_or_default();
            tracing::warn!(node = %self.id, source = %input.source, stream = c.key.stream, round = c.key.round,
                "payload rejected by filter {filter}: {reason}");
        }
        tracing::debug!(target: crate::LATENCY, node = %self.id, round = c.key.round, phase = c.key.phase,
            first_dump_ns = c.first_dump_unix_ns, closed_ns, filtered_ns = super::unix_ns(), "round closed");
        self.route
            .remember(c.key.stream, c.key.round, &coverage, c.first_dump_unix_ns);
        // A first phase that emitted nothing ends its round here: no later phase will come for it.
        let ends = c.key.phase == 0 && out.up.is_empty() && out.down.is_empty();
        self.emit(c.key.stream, c.key.round, out, coverage, c.first_dump_unix_ns)
            .await;
        if ends {
            self.route.end(c.key.stream, c.key.round);
        }
    }

    /// Routes what a filter emitted: down to the children whose first phase made the round here, and up (at the
    /// root: finalized into results).
    pub(super) async fn emit(
        &mut self,
        stream: u32,
        round: u64,
        out: Output,
        coverage: Coverage,
        first_dump: u64,
    ) {
        if let (Some(phases), Some(spec)) = (self.streams.phases(stream), self.streams.spec(stream)) {
            self.route
                .track(stream, round, phases, spec.timeout_ms, &out, Instant::now());
        }
        if !out.down.is_empty() {
            let to = self.children.among(self.engine.participants(stream, round));
            for p in out.down {
                let env = Envelope {
                    stream_id: stream,
                    round,
                    phase: p.phase,
                    payload: p.payload,
                    ..Default::default()
                };
                for tx in &to {
                    let msg = down_message::Msg::Envelope(env.clone());
                    let _ = tx.send(Ok(DownMessage { msg: Some(msg) })).await;
                }
            }
        }
        for p in out.up {
            let env = Envelope {
                stream_id: stream,
                round,
                phase: p.phase,
                coverage: Some(coverage.clone()),
                payload: p.payload,
                late: false,
                first_dump_unix_ns: first_dump,
            };
            self.send_up(env).await;
        }
    }

    /// A packet this node sends up: to the parent, or at the root, finalized into a result.
    pub(super) async fn send_up(&mut self, env: Envelope) {
        let announced = match self.role {
            Role::Root(_) => self.announced_below(),
            _ => 0,
        };
        let Role::Root(root) = &mut self.role else {
            self.counters.bytes_out += env.payload.len() as u64;
            return self.up.send(up_message::Msg::Envelope(env)).await;
        };
        let Some(spec) = self.streams.live_spec(env.stream_id).cloned() else {
            return;
        };
        let finalized = self
            .streams
            .finalize(env.stream_id, env.round, env.phase, &env.payload);
        let late = env.late;
        let payload = match finalized {
            Some(Ok(payload)) => payload,
            // A late packet the filter cannot read (a multi-phase filter's early phase) is kept as a late arrival
            // without a result, and never fails the stream.
            Some(Err(e)) if late => {
                tracing::warn!(
                    stream = env.stream_id,
                    round = env.round,
                    phase = env.phase,
                    "late packet kept without a result: {e}"
                );
                Vec::new()
            }
            Some(Err(e)) => return self.stream_error(env.stream_id, e.to_string()).await,
            None => return,
        };
        let mut coverage = env.coverage.unwrap_or_default();
        if !late {
            root.count_absent(&mut coverage, announced);
        }
        let result = RoundResult {
            stream: spec,
            round: env.round,
            phase: env.phase,
            coverage,
            first_dump_unix_ns: env.first_dump_unix_ns,
            payload,
            late,
        };
        root.opts.sink.result(result).await;
    }

    /// A packet for a round already closed here goes up as late; a late rank's raw profile is first made into the
    /// packet a single-phase filter sends (a multi-phase round has moved on, so only its coverage goes up).
    pub(super) async fn on_late(&mut self, key: GroupKey, a: Arrival) {
        tracing::debug!(node = %self.id, source = %a.source, stream = key.stream, round = key.round, "late packet");
        let payload = match &self.role {
            Role::Leaf(_) => self
                .streams
                .late_leaf_packet(key.stream, key.round, key.phase, &a.payload),
            Role::Relay | Role::Root(_) => a.payload.to_vec(),
        };
        if payload.is_empty()
            && let Role::Root(root) = &mut self.role
        {
            // Nothing to finalize: the late ranks are still recorded.
            let Some(spec) = self.streams.live_spec(key.stream).cloned() else {
                return;
            };
            let result = RoundResult {
                stream: spec,
                round: key.round,
                phase: key.phase,
                coverage: a.coverage,
                first_dump_unix_ns: a.first_dump_unix_ns,
                payload,
                late: true,
            };
            return root.opts.sink.result(result).await;
        }
        let env = Envelope {
            stream_id: key.stream,
            round: key.round,
            phase: key.phase,
            coverage: Some(a.coverage),
            payload,
            late: true,
            first_dump_unix_ns: a.first_dump_unix_ns,
        };
        self.send_up(env).await;
    }

    pub(super) async fn on_timer(&mut self) {
        let now = Instant::now();
        let closed = self.engine.expire(now);
        self.on_closed_all(closed).await;
        for (stream, round) in self.route.expired(now) {
            tracing::warn!(node = %self.id, stream, round, "the round's last phase never came back");
            if let Role::Root(_) = self.role {
                self.store_unfinished_round(stream, round).await;
            }
        }
        let (drain_over, start_due) = match &self.role {
            Role::Root(root) => (
                root.drain_deadline().is_some_and(|d| d <= now),
                root.start_deadline().is_some_and(|d| d <= now),
            ),
            _ => (false, false),
        };
        if start_due {
            // The start time-out: collection starts with the ranks that are there.
            self.ranks_changed().await;
        }
        if drain_over && !self.finish {
            tracing::warn!(
                live = self.engine.live_sources(),
                "drain time-out: closing the rounds still open"
            );
            let closed = self.engine.close_all();
            self.on_closed_all(closed).await;
            self.finish_root().await;
        }
    }

    /// A multi-phase round whose last phase never reached the root still gets its row: no result, and every rank
    /// of its first phase counted late, so no rank-round disappears.
    pub(super) async fn store_unfinished_round(&mut self, stream: u32, round: u64) {
        // A stream that failed meanwhile still gets the row: its ranks are counted, not forgotten.
        let Some(spec) = self.streams.spec(stream).cloned() else {
            return;
        };
        let phases = self.streams.phases(stream).unwrap_or(1);
        let (mut coverage, first_dump) = self.route.recall(stream, round);
        let covered = coverage.covered;
        uncover(&mut coverage, MissingReason::Late, covered);
        let announced = self.announced_below();
        if let Role::Root(root) = &self.role {
            root.count_absent(&mut coverage, announced);
        }
        let result = RoundResult {
            stream: spec,
            round,
            phase: phases.saturating_sub(1),
            coverage,
            first_dump_unix_ns: first_dump,
            payload: Vec::new(),
            late: false,
        };
        if let Role::Root(root) = &mut self.role {
            root.opts.sink.result(result).await;
        }
    }
}
