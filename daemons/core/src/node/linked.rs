//! A node linked to a parent (a leaf agent or a relay): what it produces goes up its link, and the tree's policy
//! is the root's.

use bytes::Bytes;
use canopy_proto::v1::{
    Coverage, Envelope, Fin, Hello, NodeEvent, NodeState, StreamError, StreamReady, control, up_message,
};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Node;
use super::input::RootCommand;
use super::position::{FailedAt, Position, late_envelope};
use super::up::{RoundResult, Up};
use crate::engine::{GroupKey, Recount};
use crate::filter::Level;

/// What a node with a parent keeps of its own: the Hello its link sends, kept current.
pub struct Linked {
    hello: watch::Sender<Hello>,
}

impl Linked {
    pub(super) fn new(hello: watch::Sender<Hello>) -> Self {
        Self { hello }
    }
}

impl<U: Up> Node<U, Linked> {
    /// Sets the address this node's children reach it at, sent in its Hello.
    pub fn set_listen_addr(&mut self, addr: String) {
        self.position.hello.send_modify(|h| h.listen_addr = addr);
    }
}

impl Position for Linked {
    const LEVEL: Level = Level::Relay;

    fn deadline(&self) -> Option<Instant> {
        None
    }

    fn forget_stream(&mut self, _: u32) {}

    /// What the parent passed on.
    fn closed_below<U: Up>(node: &Node<U, Self>) -> u64 {
        node.credit.closed_below()
    }

    async fn begin<U: Up>(_: &mut Node<U, Self>) {}

    async fn end<U: Up>(_: &mut Node<U, Self>) {}

    async fn on_timer<U: Up>(_: &mut Node<U, Self>, _: Instant) {}

    /// Keeps the parent's view of this node's ranks current.
    async fn ranks_changed<U: Up>(node: &mut Node<U, Self>, ranks: u32, announced: u32) {
        let hello = &node.position.hello;
        let changed = hello.send_if_modified(|h| {
            let changed = h.ranks_below != ranks || h.ranks_announced != announced;
            h.ranks_below = ranks;
            h.ranks_announced = announced;
            changed
        });
        if changed {
            let ev = NodeEvent {
                node_id: node.id.clone(),
                kind: node.kind as i32,
                state: NodeState::Attached as i32,
                ranks_below: ranks,
                address: hello.borrow().listen_addr.clone(),
                ranks_announced: announced,
                ..Default::default()
            };
            node.up.send(up_message::Msg::NodeEvent(ev)).await;
        }
    }

    async fn shutdown<U: Up>(node: &mut Node<U, Self>) {
        match &mut node.leaf {
            // A leaf finishes its ranks, says so with Fin and leaves.
            Some(leaf) => {
                leaf.exit_after_fin = true;
                let drain = control::Action::Drain(canopy_proto::v1::Drain {});
                let _ = leaf.options.control.send(drain).await;
                node.counters.rank_dumps_dropped += leaf.drain();
                node.finish |= node.fin_sent;
            }
            // A relay leaves at once; its children re-attach when a relay comes back at the same address.
            None => node.finish = true,
        }
    }

    /// Fin goes up; a leaf told to shut down leaves with it.
    async fn below_finished<U: Up>(node: &mut Node<U, Self>) {
        node.fin_sent = true;
        tracing::info!(node = %node.id, "every rank below has finished: sending fin");
        let fin = Fin {
            node_id: node.id.clone(),
            rounds_end: node.next_round(),
        };
        node.up.send(up_message::Msg::Fin(fin)).await;
        node.finish |= node.leaf.as_ref().is_some_and(|leaf| leaf.exit_after_fin);
    }

    async fn command<U: Up>(node: &mut Node<U, Self>, cmd: RootCommand) {
        tracing::warn!(node = %node.id, "a root command reached a node that is not the root: {cmd:?}");
    }

    /// The root sets the stream's first round: the answer goes up.
    async fn stream_ready<U: Up>(node: &mut Node<U, Self>, ready: StreamReady) {
        node.up.send(up_message::Msg::StreamReady(ready)).await;
    }

    /// The stream stops here (if it failed here) and the root hears why.
    async fn stream_failed<U: Up>(node: &mut Node<U, Self>, error: StreamError, at: FailedAt) {
        if at == FailedAt::Here {
            node.streams.fail(error.stream_id);
            let _ = node.engine.close_stream(error.stream_id);
            // Its rounds under way here will not finish: they hold the window no longer.
            node.route.forget_stream(error.stream_id);
        }
        node.up.send(up_message::Msg::StreamError(error)).await;
    }

    async fn send_up<U: Up>(node: &mut Node<U, Self>, env: Envelope) {
        if env.phase == 0 && env.round < node.credit.closed_below() {
            // The root closed this round's first phase without it: it is late there, and only the nodes that
            // were in the round hear its later phases. Awaited until the route gave it up, it would hold the
            // window, so a subtree that fell behind (a relay back after a partition) would catch up one window
            // per route time-out and never reach the others.
            node.route.end(env.stream_id, env.round);
        }
        node.counters.bytes_out += env.payload.len() as u64;
        node.up.send(up_message::Msg::Envelope(env)).await;
    }

    async fn late_up<U: Up>(
        node: &mut Node<U, Self>,
        key: GroupKey,
        coverage: Coverage,
        first_dump: u64,
        payload: Bytes,
    ) {
        Self::send_up(node, late_envelope(key, coverage, first_dump, payload)).await;
    }

    /// Only the root finalizes: a result here is a fault of this node's, logged and dropped.
    async fn result<U: Up>(node: &mut Node<U, Self>, result: RoundResult) {
        tracing::error!(node = %node.id, stream = result.stream.stream_id, round = result.round,
            "a finalized result at a node that is not the root: dropped");
    }

    /// The root stores the round's row; its parent's route has it too.
    async fn unfinished<U: Up>(_: &mut Node<U, Self>, _: u32, _: u64) {}

    /// This node's rounds went up with the child's ranks counted as they were: only the root's own count of
    /// them, as it stores them, changes.
    async fn recount<U: Up>(_: &mut Node<U, Self>, _: Vec<Recount>) {}
}
