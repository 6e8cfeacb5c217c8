//! How packets flow through a node: a child's packet or a rank's dump into the engine, a closed group through
//! the filter, what the filter emitted down to the children and up to the parent (at the root, into results), late
//! packets, and the timers that close rounds.

use canopy_proto::v1::{Coverage, DownMessage, Envelope, MissingReason, down_message};
use tokio::time::Instant;

use super::streams::{Answer, Call, Done, Queued, Then};
use super::*;

impl<U: Up, P: Position> Node<U, P> {
    pub(super) async fn on_envelope(&mut self, source: String, env: Envelope) {
        self.counters.highest_seen = self.counters.highest_seen.max(env.round);
        tracing::debug!(target: crate::LATENCY, node = %self.id, child = %source, round = env.round, phase = env.phase,
            first_dump_ns = env.first_dump_unix_ns, at_ns = super::unix_ns(), "packet in");
        let key = GroupKey {
            stream: env.stream_id,
            round: env.round,
            phase: env.phase,
        };
        if self.engine.is_stale(&source, env.round) {
            self.counters.stale_packets += 1;
            if self.counters.stale_packets == 1 || self.counters.stale_packets.is_multiple_of(100) {
                tracing::info!(node = %self.id, child = %source, round = env.round, count = self.counters.stale_packets,
                    "dropped a packet held from before the child was lost: the nodes adopted meanwhile sent its ranks again");
            }
            return;
        }
        let coverage = env.coverage.unwrap_or_default();
        // Against the most the child ever answered for: a round that opened before ranks left below it counts them.
        let ranks_below = self.engine.ranks_ceiling(&source).unwrap_or(0);
        if let Err(reason) = coverage.check_child(ranks_below) {
            tracing::warn!(node = %self.id, child = %source, stream = env.stream_id, round = env.round,
                "packet refused: {reason}");
            self.counters.malformed += 1;
            return;
        }
        let arrival = Arrival {
            source,
            coverage,
            payload: env.payload,
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
        let call = Call::Downstream {
            round: env.round,
            phase: env.phase,
            packet: env.payload,
        };
        let then = Then::Down { round: env.round };
        self.call_filter(env.stream_id, call, then).await;
    }

    /// Queues a call into a stream's filter; a stream whose filter does not keep up fails.
    pub(super) async fn call_filter(&mut self, stream: u32, call: Call, then: Then) -> bool {
        match self.streams.submit(stream, call, then) {
            Queued::Yes => true,
            Queued::NotLive => false,
            Queued::Full(reason) => {
                self.stream_error(stream, reason).await;
                false
            }
        }
    }

    /// A filter call's answer, back from its worker: the packet or round it was made for goes on.
    pub(super) async fn on_filter_done(&mut self, done: Done) {
        let Some((stream, then, answer)) = self.streams.done(done) else {
            return;
        };
        match (then, answer) {
            (
                Then::Closed {
                    key,
                    coverage,
                    first_dump,
                    inputs,
                },
                Answer::Output(out),
            ) => match out {
                Ok(out) => self.on_filtered(key, coverage, first_dump, &inputs, out).await,
                Err(e) => self.stream_error(stream, e.to_string()).await,
            },
            (Then::Down { round }, Answer::Output(out)) => match out {
                Ok(out) => {
                    let (cov, first) = self.route.recall(stream, round);
                    self.emit(stream, round, out, cov, first).await;
                }
                Err(e) => self.stream_error(stream, e.to_string()).await,
            },
            (
                Then::Finalize {
                    round,
                    phase,
                    coverage,
                    first_dump,
                    late,
                },
                Answer::Result(result),
            ) => {
                let payload = match result {
                    Ok(payload) => payload,
                    // A late packet the filter cannot read (a multi-phase filter's early phase) is kept as a late
                    // arrival without a result, and never fails the stream.
                    Err(e) if late => {
                        tracing::warn!(stream, round, phase, "late packet kept without a result: {e}");
                        Vec::new()
                    }
                    Err(e) => return self.stream_error(stream, e.to_string()).await,
                };
                let key = GroupKey { stream, round, phase };
                self.finalized(key, coverage.unwrap_or_default(), first_dump, late, payload)
                    .await;
            }
            (
                Then::LateLeaf {
                    key,
                    coverage,
                    first_dump,
                },
                Answer::Output(out),
            ) => {
                let payload = match out {
                    Ok(out) if out.rejected.is_empty() => out
                        .up
                        .into_iter()
                        .next()
                        .map(|p| p.payload.into())
                        .unwrap_or_default(),
                    Ok(_) | Err(_) => bytes::Bytes::new(),
                };
                P::late_up(self, key, coverage, first_dump, payload).await;
            }
            (Then::Nothing, _) => {}
            (_, Answer::Names) | (_, Answer::Result(_)) | (Then::Finalize { .. }, Answer::Output(_)) => {
                tracing::error!(node = %self.id, stream, "a filter call answered with the wrong kind of answer");
            }
        }
    }

    // ---- rounds ----

    pub(super) async fn accept(&mut self, key: GroupKey, arrival: Arrival) {
        match self.engine.accept(key, arrival, Instant::now()) {
            Ok(Accepted::Pending) => {}
            Ok(Accepted::Closed(c)) => self.on_closed(c).await,
            Ok(Accepted::Late(a)) => {
                if key.phase == 0 && self.streams.phases(key.stream).is_some_and(|p| p > 1) {
                    self.round_ended_for(&a.source, key.stream, key.round).await;
                }
                self.on_late(key, a).await
            }
            Ok(Accepted::Again) => {
                tracing::debug!(node = %self.id, stream = key.stream, round = key.round,
                    "a late packet sent again: its data counts once");
            }
            Err(e) => {
                tracing::warn!(node = %self.id, "dropped a packet: {e}");
                self.counters.malformed += 1;
            }
        }
    }

    /// A child's first phase of a multi-phase round came after the round closed here: the round's later phases go
    /// only to the sources that were in it, so the child hears that it ended without it and stops waiting for them.
    /// (A rank at a leaf waits for nothing.)
    async fn round_ended_for(&mut self, child: &str, stream: u32, round: u64) {
        let Some(tx) = self.children.sender(child) else {
            return;
        };
        let ended = canopy_proto::v1::RoundsEnded {
            stream_id: stream,
            rounds: vec![round],
        };
        let msg = down_message::Msg::RoundsEnded(ended);
        let _ = tx.send(Ok(DownMessage { msg: Some(msg) })).await;
    }

    /// Rounds of a multi-phase stream the parent closed without this node: no later phase will come down for
    /// them. They stop holding the window here, and the children that were in them hear the same.
    pub(super) async fn on_rounds_ended(&mut self, ended: canopy_proto::v1::RoundsEnded) {
        let stream = ended.stream_id;
        for round in ended.rounds {
            self.route.end(stream, round);
            let to = self
                .children
                .among(self.engine.participants(stream, round).as_deref());
            let msg = down_message::Msg::RoundsEnded(canopy_proto::v1::RoundsEnded {
                stream_id: stream,
                rounds: vec![round],
            });
            for tx in to {
                let _ = tx
                    .send(Ok(DownMessage {
                        msg: Some(msg.clone()),
                    }))
                    .await;
            }
        }
    }

    pub(super) async fn on_closed_all(&mut self, closed: Vec<Closed>) {
        for c in closed {
            self.on_closed(c).await;
        }
    }

    /// At a leaf, the dumps of rounds that closed no longer count against its bound on bytes held.
    fn leaf_rounds_closed(&mut self) {
        let lowest_open = self.engine.lowest_open_round();
        if let Some(leaf) = &mut self.leaf {
            leaf.rounds_closed_below(lowest_open);
        }
    }

    pub(super) async fn on_closed(&mut self, c: Closed) {
        self.leaf_rounds_closed();
        if let Some(leaf) = &mut self.leaf {
            leaf.fin_pace.closed(c.key.round, Instant::now());
        }
        let closed_ns = super::unix_ns();
        self.highest_closed = Some(self.highest_closed.map_or(c.key.round, |h| h.max(c.key.round)));
        // Arrivals that cover nothing and carry nothing (sampled-out ranks) count in coverage, not as inputs. The
        // closed group is taken apart: each input's source and coverage move on with it, uncopied.
        let used: Vec<Arrival> = c
            .inputs
            .into_iter()
            .filter(|a| !(a.payload.is_empty() && a.coverage.covered == 0))
            .collect();
        let stream = c.key.stream;
        let (inputs, sources): (Vec<bytes::Bytes>, Vec<(String, Coverage)>) = match &mut self.leaf {
            // A node stream's leaf input is the node's sample, which answers for every rank the round covers.
            Some(leaf) if c.key.phase == 0 && self.streams.is_node_stream(stream) => {
                let ranks = used
                    .iter()
                    .filter(|a| a.coverage.covered > 0)
                    .filter_map(|a| parse_rank_source(&a.source));
                let sample = leaf.samples.input(c.key.round, ranks);
                let source = format!("the node's sample of round {}", c.key.round);
                (vec![sample.into()], vec![(source, c.coverage.clone())])
            }
            _ => used
                .into_iter()
                .map(|a| (a.payload, (a.source, a.coverage)))
                .unzip(),
        };
        tracing::debug!(target: crate::LATENCY, node = %self.id, round = c.key.round, phase = c.key.phase,
            first_dump_ns = c.first_dump_unix_ns, closed_ns, "round closed");
        let call = Call::Upstream {
            round: c.key.round,
            phase: c.key.phase,
            inputs,
        };
        let then = Then::Closed {
            key: c.key,
            coverage: c.coverage,
            first_dump: c.first_dump_unix_ns,
            inputs: sources,
        };
        if self.call_filter(stream, call, then).await
            && c.key.phase == 0
            && let (Some(phases), Some(spec)) = (self.streams.phases(stream), self.streams.spec(stream))
        {
            // A multi-phase round is under way from here, not only once its filter's answer is routed: a window
            // that moved past it in between would fall back when the answer came.
            self.route
                .begin(stream, c.key.round, phases, spec.timeout_ms, Instant::now());
        }
    }

    /// A round's result, finalized by its stream's filter (at the root), goes to the position's results.
    async fn finalized(
        &mut self,
        key: GroupKey,
        coverage: Coverage,
        first_dump: u64,
        late: bool,
        payload: Vec<u8>,
    ) {
        // A stream closed meanwhile still stores the rounds its close cut short.
        let Some(spec) = self
            .streams
            .spec(key.stream)
            .or_else(|| self.streams.closing_spec(key.stream))
            .cloned()
        else {
            return;
        };
        P::result(
            self,
            RoundResult::of(spec, key, coverage, first_dump, payload, late),
        )
        .await;
    }

    /// A closed group's filter answered: rejected inputs are counted, and what it emitted goes on.
    async fn on_filtered(
        &mut self,
        key: GroupKey,
        mut coverage: Coverage,
        first_dump: u64,
        inputs: &[(String, Coverage)],
        out: Output,
    ) {
        for (i, reason) in &out.rejected {
            let Some((source, covered)) = inputs.get(*i) else {
                continue;
            };
            coverage.uncover_input(MissingReason::Malformed, covered);
            self.counters.malformed += 1;
            let filter = self
                .streams
                .spec(key.stream)
                .map(|s| s.filter.clone())
                .unwrap_or_default();
            tracing::warn!(node = %self.id, source = %source, stream = key.stream, round = key.round,
                "payload rejected by filter {filter}: {reason}");
        }
        tracing::debug!(target: crate::LATENCY, node = %self.id, round = key.round, phase = key.phase,
            first_dump_ns = first_dump, filtered_ns = super::unix_ns(), "round filtered");
        self.route.remember(key.stream, key.round, &coverage, first_dump);
        // A first phase that emitted nothing ends its round here: no later phase will come for it.
        let ends = key.phase == 0 && out.up.is_empty() && out.down.is_empty();
        self.emit(key.stream, key.round, out, coverage, first_dump).await;
        if ends {
            self.route.end(key.stream, key.round);
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
            let to = self
                .children
                .among(self.engine.participants(stream, round).as_deref());
            for p in out.down {
                let env = Envelope {
                    stream_id: stream,
                    round,
                    phase: p.phase,
                    payload: p.payload.into(),
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
                payload: p.payload.into(),
                late: false,
                first_dump_unix_ns: first_dump,
            };
            P::send_up(self, env).await;
        }
    }

    /// A packet for a round already closed here goes up as late; a late rank's raw profile is first made into the
    /// packet a single-phase filter sends (a multi-phase round has moved on, so only its coverage goes up).
    pub(super) async fn on_late(&mut self, key: GroupKey, a: Arrival) {
        tracing::debug!(node = %self.id, source = %a.source, stream = key.stream, round = key.round, "late packet");
        // A node stream's sample of the round went up with it: a late rank adds only its coverage.
        if self.leaf.is_some()
            && self.streams.phases(key.stream) == Some(1)
            && !self.streams.is_node_stream(key.stream)
        {
            let call = Call::Upstream {
                round: key.round,
                phase: key.phase,
                inputs: vec![a.payload.clone()],
            };
            let then = Then::LateLeaf {
                key,
                coverage: a.coverage.clone(),
                first_dump: a.first_dump_unix_ns,
            };
            if self.call_filter(key.stream, call, then).await {
                return;
            }
        }
        let payload = match &self.leaf {
            // A multi-phase round has moved on (or the stream is not live): only the coverage goes up.
            Some(_) => bytes::Bytes::new(),
            // A child's payload is a slice of the buffer its stream was read into: kept for resending (perhaps
            // long) it gets an allocation of its own, so the bound on what is kept counts what is kept.
            None => bytes::Bytes::copy_from_slice(&a.payload),
        };
        P::late_up(self, key, a.coverage, a.first_dump_unix_ns, payload).await;
    }

    pub(super) async fn on_timer(&mut self) {
        let now = Instant::now();
        // The watchdog: a filter call that runs past the time-out fails its stream, and only its stream.
        for (stream, reason) in self.streams.stuck(now) {
            self.stream_error(stream, reason).await;
        }
        let closed = self.engine.expire(now);
        self.on_closed_all(closed).await;
        for child in self.engine.give_up_unreachable(now) {
            tracing::warn!(node = %self.id, %child,
                "child unreachable for longer than it keeps what it sent: its ranks count as lost from now on");
        }
        for (stream, round) in self.route.expired(now) {
            tracing::warn!(node = %self.id, stream, round, "the round's last phase never came back");
            P::unfinished(self, stream, round).await;
        }
        P::on_timer(self, now).await;
    }
}
