//! The node runtime: one task per daemon that owns the round engine, the streams, the children and the way up,
//! and reacts to every input in order (so no locks guard the tree state).
//!
//! The same runtime serves all three roles. Each part owns its state: the children ([`children`]), the streams and
//! their filters ([`streams`]), what routing later packets needs ([`route`]), the control in force ([`control_state`]),
//! the leaf's ranks ([`leaf`]). What differs at the root is a type of its own, the node's [`Position`]: [`Root`]
//! (its policy and flows in [`root`]) or [`Linked`] to a parent ([`linked`]). Where a packet sent up goes, what a
//! late packet becomes, how a failed stream is reported, when the node finishes and the root's deadlines are each
//! one method of it, so no code of the node asks which role it plays.

mod children;
mod control_state;
mod credit;
mod feed;
mod fin_pace;
mod first_round;
mod from_children;
mod from_parent;
mod input;
mod leaf;
mod lifecycle;
mod linked;
mod position;
mod ranks;
mod root;
mod rounds;
mod route;
mod runner;
mod samples;
mod status;
mod streams;
#[cfg(test)]
mod tests;
mod up;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use canopy_proto::MAX_RANKS;
use canopy_proto::v1::{
    Control, Credit, DownMessage, EventName, Hello, LiveStreams, NameDictionary, NodeEvent, NodeKind,
    NodeState, NodeStatus, OpenStream, StreamSpec, Want, control, down_message, up_message,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::engine::{Accepted, Arrival, Closed, GroupKey, RoundEngine, SourceState};
use crate::filter::{FilterFactory, Level, Output};
use crate::window::{Window, WindowGate, WindowState};

pub use feed::MAX_STAGES;
pub use input::{
    ChildEvent, ChildSender, Collection, Input, ParentEvent, RankEvent, Refused, RootCommand, RootHandle,
    parse_rank_source, rank_source,
};
pub use leaf::LeafOptions;
pub use linked::Linked;
pub use position::{Relay, RoleConfig};
pub use root::{Root, RootOptions};
pub use samples::{NODES_FILTER, NodeSampler};
pub use status::{NodeCounters, NodeSnapshot};
pub use streams::{DEFAULT_FILTER_CALL_TIMEOUT, FILTER_QUEUE, MAX_STUCK_PER_FILTER};
pub use up::{ParentUp, Recount, RootSink, RoundResult, StreamState, Up};

use children::{ChildTable, Gone};
use control_state::ControlState;
use leaf::{Leaf, Placed};
use position::{FailedAt, Position};
use route::Router;
use streams::{Known, StreamTable};

/// How a node is set up.
pub struct NodeConfig {
    pub node_id: String,
    pub kind: NodeKind,
    pub filters: Arc<dyn FilterFactory>,
    /// Rounds that may be open at once; packets beyond wait (back pressure).
    pub max_rounds_in_flight: u64,
    pub status_interval: Duration,
}

/// Why a node stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Refused(#[from] Refused),
}

/// The handles a daemon keeps to feed a node and to serve its children.
pub struct NodeHandles {
    pub inputs: mpsc::Sender<Input>,
    /// Where every producer of rounds waits for the window.
    pub window: WindowGate,
    /// For a node with a parent: the Hello the link sends, kept current.
    pub hello: watch::Receiver<Hello>,
    /// The node's figures, renewed at every status tick and when it finishes.
    pub snapshot: watch::Receiver<NodeSnapshot>,
}

/// Inputs queued before the node's task applies back pressure to the transport.
const INPUT_QUEUE: usize = 4096;

/// How long a finished node waits for its children to hang up, so the last control is not cut off.
const CHILDREN_HANG_UP: Duration = Duration::from_secs(2);

/// One node of the tree, sending what it produces up `U`, at the root or linked to a parent as `P` says.
pub struct Node<U: Up, P: Position> {
    id: String,
    kind: NodeKind,
    up: U,
    inputs: mpsc::Receiver<Input>,
    engine: RoundEngine,
    streams: StreamTable,
    /// The answers of the streams' filter calls, which run off this task.
    filter_done: mpsc::UnboundedReceiver<streams::Done>,
    children: ChildTable,
    route: Router,
    control: ControlState,
    names: HashMap<u64, String>,
    counters: NodeCounters,
    window: Window,
    credit: credit::Credit,
    position: P,
    /// At a leaf agent: its ranks, the node's sources.
    leaf: Option<Leaf>,
    snapshot: watch::Sender<NodeSnapshot>,
    status_interval: Duration,
    highest_closed: Option<u64>,
    fin_sent: bool,
    /// A Fin-Ack went down: the children are finishing.
    fin_acked: bool,
    finish: bool,
}

impl<U: Up, P: Position> Node<U, P> {
    /// Builds a node of `role` and the handles to feed it.
    pub fn new<R: RoleConfig<Position = P>>(config: NodeConfig, role: R, up: U) -> (Self, NodeHandles) {
        let (tx, rx) = mpsc::channel(INPUT_QUEUE);
        let (window, gate) = Window::new(config.max_rounds_in_flight);
        let hostname = canopy_runtime::net::hostname();
        let hello = Hello {
            node_id: config.node_id.clone(),
            kind: config.kind as i32,
            ranks_below: 0,
            protocol_version: canopy_proto::PROTOCOL_VERSION,
            listen_addr: String::new(),
            hostname: hostname.clone(),
            ranks_announced: 0,
            // The link sets them for each session.
            returning_from: String::new(),
            run_id: String::new(),
        };
        let (hello_tx, hello_rx) = watch::channel(hello);
        let (position, leaf) = role.into_parts(hello_tx);
        let level = if leaf.is_some() { Level::Leaf } else { P::LEVEL };
        let leaf = leaf.map(|opts| Leaf::new(opts, config.node_id.clone(), hostname));
        let (streams, filter_done) = StreamTable::new(config.filters, level);
        let (snapshot_tx, snapshot_rx) = watch::channel(NodeSnapshot {
            kind: config.kind,
            ..NodeSnapshot::default()
        });
        let node = Node {
            id: config.node_id,
            kind: config.kind,
            up,
            inputs: rx,
            engine: RoundEngine::new(),
            streams,
            filter_done,
            children: ChildTable::default(),
            route: Router::default(),
            control: ControlState::default(),
            names: HashMap::new(),
            counters: NodeCounters::default(),
            window,
            credit: credit::Credit::default(),
            snapshot: snapshot_tx,
            position,
            leaf,
            status_interval: config.status_interval,
            highest_closed: None,
            fin_sent: false,
            fin_acked: false,
            finish: false,
        };
        let handles = NodeHandles {
            inputs: tx,
            window: gate,
            hello: hello_rx,
            snapshot: snapshot_rx,
        };
        (node, handles)
    }

    /// How long one call into a filter may run before the watchdog fails its stream
    /// ([`streams::DEFAULT_FILTER_CALL_TIMEOUT`] unless set).
    pub fn set_filter_call_timeout(&mut self, timeout: Duration) {
        self.streams.set_call_timeout(timeout);
    }

    /// The filters this node runs inline, on its own task, rather than contained on a thread per stream (none
    /// unless set; the daemons' `inline_filters`). Set it before streams open: an open stream keeps where it runs.
    pub fn set_inline_filters(&mut self, filters: &[String]) {
        self.streams
            .set_inline(filters.iter().filter(|f| !f.is_empty()).cloned());
    }

    /// Counters for tests and status.
    pub fn counters(&self) -> NodeCounters {
        self.counters
    }

    /// Runs until the tree finishes (Fin/FinAck), the parent refuses this node, or `shutdown` completes (at the
    /// root, a shutdown drains the tree first).
    pub async fn run(mut self, shutdown: impl Future<Output = ()> + Send) -> Result<(), NodeError> {
        tokio::pin!(shutdown);
        let mut shutdown_seen = false;
        P::begin(&mut self).await;
        let mut status = tokio::time::interval(self.status_interval);
        status.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !self.finish {
            let deadline = self.next_deadline();
            tokio::select! {
                input = self.inputs.recv() => match input {
                    Some(input) => self.handle(input).await?,
                    None => break,
                },
                Some(done) = self.filter_done.recv() => self.on_filter_done(done).await,
                _ = sleep_until(deadline) => self.on_timer().await,
                _ = status.tick() => self.send_status().await,
                _ = self.window.waited() => {}
                _ = &mut shutdown, if !shutdown_seen => {
                    shutdown_seen = true;
                    self.on_shutdown().await;
                }
            }
            // Cheap, and catches every way the tree can become finished (a result coming back, a child's Fin).
            self.check_fin().await;
            self.move_window().await;
        }
        P::end(&mut self).await;
        self.close_children().await;
        // The daemon's last view: the final figures, finished.
        self.finish = true;
        self.publish_snapshot(self.status());
        Ok(())
    }

    async fn handle(&mut self, input: Input) -> Result<(), NodeError> {
        match input {
            Input::Child(ev) => self.on_child(ev).await,
            Input::Parent(ParentEvent::Refused(r)) => return Err(NodeError::Refused(r)),
            Input::Parent(ev) => self.on_parent(ev).await,
            Input::Ranks(evs) => {
                for ev in evs {
                    self.on_rank(ev).await;
                }
            }
            Input::Root(cmd) => P::command(self, cmd).await,
        }
        Ok(())
    }

    fn next_deadline(&self) -> Option<Instant> {
        [
            self.engine.next_deadline(),
            self.engine.next_give_up(),
            self.route.next_deadline(),
            self.streams.next_deadline(),
            self.position.deadline(),
            self.leaf.as_ref().and_then(|leaf| leaf.fin_pace.deadline()),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    // ---- the tree's size, start and end ----

    async fn node_event(&mut self, ev: NodeEvent) {
        let resend = self.adoption(&ev).await;
        let child = ev.node_id.clone();
        self.children.record(&ev);
        self.up.send(up_message::Msg::NodeEvent(ev)).await;
        if let Some(lost) = resend {
            self.ask_resend(&child, &lost).await;
        }
    }

    /// The largest application size announced below this node.
    fn announced_below(&self) -> u32 {
        let own = self.leaf.as_ref().map_or(0, Leaf::announced);
        self.children.announced().max(own)
    }

    /// The ranks below changed: the parent hears of it, or at the root collection may start.
    async fn ranks_changed(&mut self) {
        let ranks = self.engine.ranks_expected();
        let announced = self.announced_below();
        P::ranks_changed(self, ranks, announced).await;
    }

    fn next_round(&self) -> u64 {
        self.highest_closed.map_or(0, |h| h + 1)
    }

    /// The root's watermark, which releases what the nodes below keep of the rounds it closed.
    fn closed_below(&self) -> u64 {
        P::closed_below(self)
    }

    async fn on_shutdown(&mut self) {
        P::shutdown(self).await;
    }

    /// Sends Fin up (or, at the root, Fin-Ack down) once nothing below is live and no round is open.
    async fn check_fin(&mut self) {
        // Every source must be finished or lost, at least one finished: when all are lost the ranks below did not
        // finish, and a Fin would report them as stopped. A drain also finishes a node with nothing below at all
        // (an agent no rank has attached to, a relay no child has): there is nothing to wait for.
        let holding = self.leaf.as_ref().is_some_and(Leaf::holds);
        let nothing_below = !self.engine.has_sources() && self.children.is_empty();
        let finished_below = match nothing_below {
            false => self.engine.any_finished(),
            true => self.control.draining(),
        };
        let done = finished_below
            && self.engine.live_sources() == 0
            && self.engine.stopped_sources() == 0
            && !self.engine.has_open_groups()
            && !self.route.is_awaiting()
            && !self.streams.busy()
            && !holding;
        if self.fin_sent || !done {
            if let Some(leaf) = &mut self.leaf {
                leaf.fin_pace.release();
            }
            return;
        }
        // A leaf's Fin goes at the pace of its rounds, not during its last one (fin_pace.rs).
        if let Some(leaf) = &mut self.leaf
            && leaf.fin_pace.hold(Instant::now())
        {
            return;
        }
        P::below_finished(self).await;
    }

    fn status(&self) -> NodeStatus {
        self.counters.status(
            &self.id,
            self.engine.stats(),
            self.engine.lowest_open_round(),
            self.streams.filter_time(),
        )
    }

    async fn send_status(&mut self) {
        let st = self.status();
        self.publish_snapshot(st.clone());
        self.up.send(up_message::Msg::Status(st)).await;
    }

    /// Renews the daemon's view of this node.
    fn publish_snapshot(&self, status: NodeStatus) {
        let stream_names = status
            .filter_time
            .iter()
            .filter_map(|t| Some((t.stream_id, self.streams.spec(t.stream_id)?.name.clone())))
            .collect();
        let snapshot = NodeSnapshot {
            kind: self.kind,
            status,
            children: self.children.connected() as u64,
            ranks_below: u64::from(self.engine.ranks_expected()),
            live_sources: self.engine.live_sources() as u64,
            input_queue: self.inputs.len() as u64,
            ticks: self.snapshot.borrow().ticks + 1,
            finished: self.finish,
            engine: self.engine.stats(),
            stream_names,
        };
        self.snapshot.send_replace(snapshot);
    }

    async fn broadcast(&mut self, msg: down_message::Msg) {
        for tx in self.children.all() {
            let _ = tx
                .send(Ok(DownMessage {
                    msg: Some(msg.clone()),
                }))
                .await;
        }
    }

    /// Moves the window after each input; at a leaf, the held dumps it now admits go in, which may move it again.
    async fn move_window(&mut self) {
        loop {
            let (unbounded, lowest_held) = self
                .leaf
                .as_ref()
                .map_or((false, None), |leaf| (!leaf.started(), leaf.lowest_held()));
            let limit = self.window.update(WindowState {
                lowest_open: self.engine.lowest_open_round(),
                lowest_awaited: self.route.lowest_awaited(),
                highest_closed: self.highest_closed,
                lowest_held,
                unbounded,
                inputs_pending: !self.inputs.is_empty(),
                credit: self.credit.cap(),
            });
            let step = self.window.credit_step();
            if let Some(below) = self.credit.give(limit, step, self.window.answered()) {
                let closed_below = self.closed_below();
                self.broadcast(down_message::Msg::Credit(Credit {
                    below,
                    closed_below,
                    taken: 0,
                }))
                .await;
            }
            if let Some(round) = self.credit.want(self.window.waiting_beyond()) {
                self.up.send(up_message::Msg::Want(Want { round })).await;
            }
            if !self.release_held().await {
                break;
            }
            self.check_fin().await;
        }
    }
}

/// The stream as a node's children run it: each level down waits three quarters as long, so a partial result
/// from below still reaches its parent before the parent's own time-out (the time-out counts from the first
/// arrival at each node).
pub fn for_children(spec: &StreamSpec) -> StreamSpec {
    StreamSpec {
        timeout_ms: (spec.timeout_ms / 4 * 3).max(1),
        ..spec.clone()
    }
}

pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
