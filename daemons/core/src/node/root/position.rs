//! The root's side of every place the node's position decides: packets sent up are finalized into results, late
//! ranks are recorded, a failed stream fails the tree, collection starts once the ranks are there, a shutdown
//! drains the tree, and the run ends with a Fin-Ack down.

use bytes::Bytes;
use canopy_proto::v1::{Control, Coverage, Envelope, Fin, MissingReason, StreamError, StreamReady, control};
use tokio::time::Instant;

use super::Root;
use crate::engine::{GroupKey, Recount};
use crate::filter::Level;
use crate::node::position::{FailedAt, Position, late_envelope};
use crate::node::streams::{Call, Then};
use crate::node::*;

impl Position for Root {
    const LEVEL: Level = Level::Root;

    fn deadline(&self) -> Option<Instant> {
        [
            self.drain_deadline(),
            self.start_deadline(),
            self.starting.next_deadline(),
            self.awaited_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn forget_stream(&mut self, stream: u32) {
        self.starting.forget(stream);
    }

    /// The lowest round not closed in every stream (rounds close out of order: one above it may be closed, one
    /// below never opened yet).
    fn closed_below<U: Up>(node: &Node<U, Self>) -> u64 {
        node.engine
            .lowest_unclosed_round()
            .unwrap_or_else(|| node.next_round())
    }

    /// Opens the configured streams, takes up a continued run's rounds where it left them, and waits for its ranks.
    async fn begin<U: Up>(node: &mut Node<U, Self>) {
        let below = std::mem::take(&mut node.position.opts.closed_below);
        for spec in std::mem::take(&mut node.position.opts.streams) {
            node.open_stream_at_root(spec).await;
        }
        for (stream, round) in below {
            node.engine.closed_below(stream, round);
        }
        node.await_resumed_ranks();
        // Every id below the first free one that is not open was an earlier run's stream.
        for id in 1..node.position.opts.first_free_stream_id {
            node.streams.ended_before(id);
        }
    }

    /// Everything given to the sink is stored before the node exits.
    async fn end<U: Up>(node: &mut Node<U, Self>) {
        node.position.opts.sink.flush().await;
    }

    async fn on_timer<U: Up>(node: &mut Node<U, Self>, now: Instant) {
        node.first_rounds_due(now).await;
        let root = &node.position;
        let drain_over = root.drain_deadline().is_some_and(|d| d <= now);
        let start_due = root.start_deadline().is_some_and(|d| d <= now);
        let awaited_due = root.awaited_deadline().is_some_and(|d| d <= now);
        if awaited_due {
            node.give_up_awaited_ranks().await;
        }
        if start_due {
            // The start time-out: collection starts with the ranks that are there.
            node.ranks_changed().await;
        }
        if drain_over && !node.finish {
            tracing::warn!(
                live = node.engine.live_sources(),
                "drain time-out: closing the rounds still open"
            );
            let closed = node.engine.close_all();
            node.on_closed_all(closed).await;
            node.finish_root().await;
        }
    }

    /// Starts collection once the ranks are all there (a continued run's awaited ranks taken off first).
    async fn ranks_changed<U: Up>(node: &mut Node<U, Self>, ranks: u32, announced: u32) {
        let ranks = node.awaited_ranks_back(ranks).await;
        if node.position.starts(ranks, announced, Instant::now()) {
            let start = super::start(node.next_round());
            let action = Some(control::Action::Start(start));
            node.on_control(Control { action }).await;
        }
    }

    /// Drains the tree: every rank finishes, and the run ends when the tree does or at the drain's time-out.
    async fn shutdown<U: Up>(node: &mut Node<U, Self>) {
        let root = &mut node.position;
        if !root.drain(Instant::now()) {
            return;
        }
        tracing::info!(
            timeout_ms = root.opts.drain_timeout.as_millis() as u64,
            "draining the tree"
        );
        let action = Some(control::Action::Drain(canopy_proto::v1::Drain {}));
        node.on_control(Control { action }).await;
    }

    /// The run ends with the tree when it ends with its application or drains; otherwise the root waits for the
    /// next ranks.
    async fn below_finished<U: Up>(node: &mut Node<U, Self>) {
        if node.position.finishes_with_tree() {
            node.finish_root().await;
        }
    }

    async fn command<U: Up>(node: &mut Node<U, Self>, cmd: RootCommand) {
        node.on_root_command(cmd).await;
    }

    async fn stream_ready<U: Up>(node: &mut Node<U, Self>, ready: StreamReady) {
        node.stream_ready_at_root(ready).await;
    }

    /// Wherever the filter failed, the stream fails on the whole tree.
    async fn stream_failed<U: Up>(node: &mut Node<U, Self>, error: StreamError, _: FailedAt) {
        let reason = format!("node {}: {}", error.node_id, error.reason);
        node.fail_stream(error.stream_id, reason).await;
    }

    /// Finalized by the stream's filter into a result.
    async fn send_up<U: Up>(node: &mut Node<U, Self>, env: Envelope) {
        let call = Call::Finalize {
            round: env.round,
            phase: env.phase,
            payload: env.payload,
        };
        let then = Then::Finalize {
            round: env.round,
            phase: env.phase,
            coverage: env.coverage,
            first_dump: env.first_dump_unix_ns,
            late: env.late,
        };
        node.call_filter(env.stream_id, call, then).await;
    }

    /// Stored, with its result if it carries one (a multi-phase filter's early phase is no result: only its late
    /// ranks are recorded).
    async fn late_up<U: Up>(
        node: &mut Node<U, Self>,
        key: GroupKey,
        coverage: Coverage,
        first_dump: u64,
        mut payload: Bytes,
    ) {
        let last_phase = node.streams.phases(key.stream).unwrap_or(1).saturating_sub(1);
        if key.phase != last_phase {
            payload.clear();
        }
        if payload.is_empty() {
            // Nothing to finalize: the late ranks are still recorded.
            let Some(spec) = node.streams.live_spec(key.stream).cloned() else {
                return;
            };
            let result = RoundResult::of(spec, key, coverage, first_dump, Vec::new(), true);
            return node.position.opts.sink.result(result).await;
        }
        Self::send_up(node, late_envelope(key, coverage, first_dump, payload)).await;
    }

    /// To the sink, with the ranks never announced counted absent (a late result adds to a round counted
    /// already).
    async fn result<U: Up>(node: &mut Node<U, Self>, mut result: RoundResult) {
        if !result.late {
            let announced = node.announced_below();
            node.position.count_absent(&mut result.coverage, announced);
        }
        tracing::debug!(target: crate::LATENCY, node = %node.id, round = result.round, phase = result.phase,
            first_dump_ns = result.first_dump_unix_ns, at_ns = crate::node::unix_ns(), "round finalized");
        node.position.opts.sink.result(result).await;
    }

    async fn unfinished<U: Up>(node: &mut Node<U, Self>, stream: u32, round: u64) {
        node.store_unfinished_round(stream, round).await;
    }

    async fn recount<U: Up>(node: &mut Node<U, Self>, recounts: Vec<Recount>) {
        if let Some(first) = recounts.first() {
            tracing::info!(node = %node.id, child = %first.source, rounds = recounts.len(), from = first.round,
                "rounds closed without a child that finished before them: its ranks count as stopped there");
        }
        for r in recounts {
            // A multi-phase round still under way has no row yet. Its last phase's close counts a finished
            // source stopped itself; a round that ends unfinished is stored from the coverage remembered here.
            if let Some(cov) = node.route.under_way_mut(r.stream, r.round) {
                cov.recount(r.counted, MissingReason::Stopped, r.ranks, &r.apps, &r.source);
                continue;
            }
            node.position.opts.sink.recount(r).await;
        }
    }
}

impl<U: Up> Node<U, Root> {
    /// A multi-phase round whose last phase never reached the root still gets its row: no result, and every rank
    /// of its first phase counted late, so no rank-round disappears.
    pub(super) async fn store_unfinished_round(&mut self, stream: u32, round: u64) {
        // A stream that failed meanwhile still gets the row: its ranks are counted, not forgotten.
        let Some(spec) = self.streams.spec(stream).cloned() else {
            return;
        };
        let phases = self.streams.phases(stream).unwrap_or(1);
        let (mut coverage, first_dump) = self.route.recall(stream, round);
        coverage.uncover_all(MissingReason::Late);
        let result = RoundResult {
            stream: spec,
            round,
            phase: phases.saturating_sub(1),
            coverage,
            first_dump_unix_ns: first_dump,
            payload: Vec::new(),
            late: false,
        };
        Root::result(self, result).await;
    }

    /// The run is over: Fin is recorded, and Fin-Ack goes down so every node finishes.
    async fn finish_root(&mut self) {
        if self.fin_sent {
            return;
        }
        self.fin_sent = true;
        self.send_status().await;
        let fin = Fin {
            node_id: self.id.clone(),
            rounds_end: self.next_round(),
        };
        self.up.send(up_message::Msg::Fin(fin)).await;
        let action = Some(control::Action::FinAck(canopy_proto::v1::FinAck {}));
        self.on_control(Control { action }).await;
    }
}
