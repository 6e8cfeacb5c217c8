//! The node runtime: one task per daemon that owns the round engine, the streams, the children and the way up,
//! and reacts to every input in order (so no locks guard the tree state).
//!
//! The same runtime serves all three roles. Each part owns its state: the children ([`children`]), the streams and
//! their filters ([`streams`]), what routing later packets needs ([`route`]), the control in force ([`control_state`]),
//! the leaf's ranks ([`leaf`]), the root's policy ([`root`]). What differs by role is decided in one place each,
//! on [`Role`]: where a packet sent up goes, what a late packet becomes, how a failed stream is reported, when the
//! node finishes.

mod children;
mod control_state;
mod credit;
mod feed;
mod first_round;
mod from_children;
mod from_parent;
mod input;
mod leaf;
mod lifecycle;
mod ranks;
mod resumed;
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
    Control, Credit, DownMessage, EventName, Fin, Hello, LiveStreams, NameDictionary, NodeEvent, NodeKind,
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
pub use root::RootOptions;
pub use samples::{NODES_FILTER, NodeSampler};
pub use status::{NodeCounters, NodeSnapshot};
pub use streams::{DEFAULT_FILTER_CALL_TIMEOUT, FILTER_QUEUE, MAX_STUCK_PER_FILTER};
pub use up::{ParentUp, RootSink, RoundResult, StreamState, Up};

use children::{ChildTable, Gone};
use control_state::ControlState;
use leaf::{Leaf, Placed};
use root::Root;
use route::Router;
use streams::{Known, StreamTable};

/// The role a node plays, with what only that role keeps.
pub enum RoleConfig {
    /// The leaf agent: its sources are ranks.
    Leaf(LeafOptions),
    /// An interior node: its sources are children.
    Relay,
    /// The front-end: its sources are children, and results go to the root's sink.
    Root(RootOptions),
}

/// How a node is set up.
pub struct NodeConfig {
    pub node_id: String,
    pub kind: NodeKind,
    pub filters: Arc<dyn FilterFactory>,
    /// Rounds that may be open at once; packets beyond wait (back pressure).
    pub max_rounds_in_flight: u64,
    pub role: RoleConfig,
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

enum Role {
    Leaf(Leaf),
    Relay,
    Root(Root),
}

impl Role {
    fn level(&self) -> Level {
        match self {
            Role::Leaf(_) => Level::Leaf,
            Role::Relay => Level::Relay,
            Role::Root(_) => Level::Root,
        }
    }
}

pub struct Node<U: Up> {
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
    role: Role,
    /// For a node with a parent: the Hello its link sends.
    hello: Option<watch::Sender<Hello>>,
    snapshot: watch::Sender<NodeSnapshot>,
    status_interval: Duration,
    highest_closed: Option<u64>,
    fin_sent: bool,
    /// A Fin-Ack went down: the children are finishing.
    fin_acked: bool,
    finish: bool,
}

impl<U: Up> Node<U> {
    /// Builds a node and the handles to feed it.
    pub fn new(config: NodeConfig, up: U) -> (Self, NodeHandles) {
        let (tx, rx) = mpsc::channel(INPUT_QUEUE);
        let (window, gate) = Window::new(config.max_rounds_in_flight);
        let hostname = canopy_runtime::net::hostname();
        let role = match config.role {
            RoleConfig::Leaf(opts) => Role::Leaf(Leaf::new(opts, config.node_id.clone(), hostname.clone())),
            RoleConfig::Relay => Role::Relay,
            RoleConfig::Root(opts) => Role::Root(Root::new(opts)),
        };
        let hello = Hello {
            node_id: config.node_id.clone(),
            kind: config.kind as i32,
            ranks_below: 0,
            protocol_version: canopy_proto::PROTOCOL_VERSION,
            listen_addr: String::new(),
            hostname,
            ranks_announced: 0,
            // The link sets them for each session.
            returning_from: String::new(),
            run_id: String::new(),
        };
        let (hello_tx, hello_rx) = watch::channel(hello);
        let (streams, filter_done) = StreamTable::new(config.filters, role.level());
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
            hello: (!matches!(role, Role::Root(_))).then_some(hello_tx),
            snapshot: snapshot_tx,
            role,
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

    /// Sets the address this node's children reach it at, sent in its Hello.
    pub fn set_listen_addr(&mut self, addr: String) {
        if let Some(h) = &self.hello {
            h.send_modify(|h| h.listen_addr = addr);
        }
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
        if let Role::Root(root) = &mut self.role {
            let below = std::mem::take(&mut root.opts.closed_below);
            for spec in std::mem::take(&mut root.opts.streams) {
                self.open_stream_at_root(spec).await;
            }
            for (stream, round) in below {
                self.engine.closed_below(stream, round);
            }
            self.await_resumed_ranks();
            // Every id below the first free one that is not open was an earlier run's stream.
            if let Role::Root(root) = &self.role {
                for id in 1..root.opts.first_free_stream_id {
                    self.streams.ended_before(id);
                }
            }
        }
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
        if let Role::Root(root) = &mut self.role {
            root.opts.sink.flush().await;
        }
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
            Input::Root(cmd) => self.on_root_command(cmd).await,
        }
        Ok(())
    }

    fn next_deadline(&self) -> Option<Instant> {
        let (drain, start, first_rounds, awaited) = match &self.role {
            Role::Root(root) => (
                root.drain_deadline(),
                root.start_deadline(),
                root.starting.next_deadline(),
                root.awaited_deadline(),
            ),
            _ => (None, None, None, None),
        };
        [
            self.engine.next_deadline(),
            self.engine.next_give_up(),
            self.route.next_deadline(),
            self.streams.next_deadline(),
            drain,
            start,
            first_rounds,
            awaited,
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
        let own = match &self.role {
            Role::Leaf(leaf) => leaf.announced(),
            _ => 0,
        };
        self.children.announced().max(own)
    }

    /// Keeps the parent's view of this node's ranks current; at the root, starts collection once they are all
    /// there.
    async fn ranks_changed(&mut self) {
        let mut ranks = self.engine.ranks_expected();
        let announced = self.announced_below();
        if let Role::Root(_) = &self.role {
            ranks = self.awaited_ranks_back(ranks).await;
        }
        if let Role::Root(root) = &mut self.role {
            if root.starts(ranks, announced, Instant::now()) {
                let start = root::start(self.highest_closed.map_or(0, |h| h + 1));
                let action = Some(control::Action::Start(start));
                self.on_control(Control { action }).await;
            }
            return;
        }
        let Some(hello) = &self.hello else { return };
        let changed = hello.send_if_modified(|h| {
            let changed = h.ranks_below != ranks || h.ranks_announced != announced;
            h.ranks_below = ranks;
            h.ranks_announced = announced;
            changed
        });
        if changed {
            let ev = NodeEvent {
                node_id: self.id.clone(),
                kind: self.kind as i32,
                state: NodeState::Attached as i32,
                ranks_below: ranks,
                address: hello.borrow().listen_addr.clone(),
                ranks_announced: announced,
                ..Default::default()
            };
            self.up.send(up_message::Msg::NodeEvent(ev)).await;
        }
    }

    fn next_round(&self) -> u64 {
        self.highest_closed.map_or(0, |h| h + 1)
    }

    /// The root's watermark, which releases what the nodes below keep of the rounds it closed: at the root, the
    /// lowest round not closed in every stream (rounds close out of order: one above it may be closed, one below
    /// never opened yet); elsewhere, what the parent passed on.
    fn closed_below(&self) -> u64 {
        match &self.role {
            Role::Root(_) => self
                .engine
                .lowest_unclosed_round()
                .unwrap_or_else(|| self.next_round()),
            _ => self.credit.closed_below(),
        }
    }

    async fn on_shutdown(&mut self) {
        match &mut self.role {
            Role::Root(root) => {
                if !root.drain(Instant::now()) {
                    return;
                }
                tracing::info!(
                    timeout_ms = root.opts.drain_timeout.as_millis() as u64,
                    "draining the tree"
                );
                let action = Some(control::Action::Drain(canopy_proto::v1::Drain {}));
                self.on_control(Control { action }).await;
            }
            // A leaf finishes its ranks, says so with Fin and leaves.
            Role::Leaf(leaf) => {
                leaf.exit_after_fin = true;
                let drain = control::Action::Drain(canopy_proto::v1::Drain {});
                let _ = leaf.options.control.send(drain).await;
                self.counters.rank_dumps_dropped += leaf.drain();
                self.finish |= self.fin_sent;
            }
            // A relay leaves at once; its children re-attach when a relay comes back at the same address.
            Role::Relay => self.finish = true,
        }
    }

    /// Sends Fin up (or, at the root, Fin-Ack down) once nothing below is live and no round is open.
    async fn check_fin(&mut self) {
        // Every source must be finished or lost, at least one finished: when all are lost the ranks below did not
        // finish, and a Fin would report them as stopped.
        let holding = matches!(&self.role, Role::Leaf(leaf) if leaf.holds());
        let done = self.engine.has_sources()
            && self.engine.live_sources() == 0
            && self.engine.stopped_sources() == 0
            && self.engine.any_finished()
            && !self.engine.has_open_groups()
            && !self.route.is_awaiting()
            && !self.streams.busy()
            && !holding;
        if self.fin_sent || !done {
            return;
        }
        let exit_after_fin = match &self.role {
            Role::Root(root) if root.finishes_with_tree() => return self.finish_root().await,
            Role::Root(_) => return,
            Role::Leaf(leaf) => leaf.exit_after_fin,
            Role::Relay => false,
        };
        self.fin_sent = true;
        tracing::info!(node = %self.id, "every rank below has finished: sending fin");
        let fin = Fin {
            node_id: self.id.clone(),
            rounds_end: self.next_round(),
        };
        self.up.send(up_message::Msg::Fin(fin)).await;
        self.finish |= exit_after_fin;
    }

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
            let (unbounded, lowest_held) = match &self.role {
                Role::Leaf(leaf) => (!leaf.started(), leaf.lowest_held()),
                _ => (false, None),
            };
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
