//! The node runtime: one task per daemon that owns the round engine, the stream filters, the children and the
//! way up, and reacts to every input in order (so no locks guard the tree state).
//!
//! The same runtime serves all three roles: the leaf agent (sources are its ranks), relays (sources are
//! children), and the front-end (sources are children, and results go to the store instead of a parent).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use canopy_proto::v1::{
    Control, Coverage, DownMessage, Envelope, EventName, Fin, Hello, MissingReason, NameDictionary,
    NodeEvent, NodeKind, NodeState, NodeStatus, OpenStream, Start, StreamError, StreamSpec, SyncMode,
    control, down_message, up_message,
};
use tokio::sync::{mpsc, watch};

use crate::engine::{Accepted, Arrival, Closed, GroupKey, RoundEngine, SourceState, StreamSync, uncover};
use crate::filter::{Filter, FilterFactory, Level, Output};
use crate::transport::{ChildSender, Refused};

/// Everything a node reacts to.
#[derive(Debug)]
pub enum Input {
    ChildAttached {
        conn: u64,
        hello: Hello,
        peer: String,
        tx: ChildSender,
    },
    ChildMessage {
        conn: u64,
        id: String,
        msg: up_message::Msg,
    },
    ChildGone {
        conn: u64,
        id: String,
        reason: String,
    },
    ParentAttached,
    ParentLost(String),
    ParentMessage(down_message::Msg),
    Refused(Refused),
    /// The leaf's ranks dumped a round: (rank, encoded one-profile `ProfileBatch`) each, and the ranks rank
    /// sampling left out of it.
    LocalRound {
        round: u64,
        dump_unix_ns: u64,
        profiles: Vec<(u32, Vec<u8>)>,
        sampled_out: Vec<u32>,
    },
    /// The leaf's ranks will dump no more rounds.
    LocalFinished,
    /// A rank attached through the agent's socket (or came back): it takes part from round `from` on, and its
    /// application has `announced` ranks in all (0: unknown).
    RankAttached {
        source: String,
        from: u64,
        announced: u32,
    },
    /// One dump of a socket rank: its profile (an encoded one-profile ProfileBatch), or why it has none
    /// (sampled out; stopped: collection stopped at this round).
    RankRound {
        source: String,
        rank: u32,
        round: u64,
        dump_unix_ns: u64,
        profile: Result<Vec<u8>, MissingReason>,
    },
    /// A socket rank's dumps of rounds [from, end) were dropped in the application (its queue was full): the
    /// rounds do not wait for it, and count it as dropped.
    RankRoundsDropped {
        source: String,
        from: u64,
        end: u64,
    },
    /// Names of events and counters the socket ranks use.
    RankNames(Vec<(u64, String)>),
    /// A socket rank left: finished after its rounds below `finished_end`, or lost (`None`).
    RankDetached {
        source: String,
        finished_end: Option<u64>,
    },
    /// Dumps the leaf's ranks could not deliver (as they reported them) or the agent could not place.
    RankDumpsDropped(u64),
    /// At the root: open a stream on the whole tree; the reply gets its id.
    OpenStream(StreamSpec, Option<tokio::sync::oneshot::Sender<u32>>),
    /// A child's packet for `round` waits for the window of rounds in flight to reach it.
    WindowWait {
        round: u64,
    },
    /// At the root: close a stream on the whole tree; the reply says whether it was open.
    CloseStream(u32, Option<tokio::sync::oneshot::Sender<bool>>),
    /// At the root: start or stop collection.
    Collection(Collection),
    /// At the root: new measurement options for every rank.
    Options(canopy_proto::v1::Options),
}

/// One result at the root.
#[derive(Debug, Clone)]
pub struct RoundResult {
    pub stream: StreamSpec,
    pub round: u64,
    pub phase: u32,
    pub coverage: Coverage,
    pub first_dump_unix_ns: u64,
    pub payload: Vec<u8>,
    pub late: bool,
}

/// The way up: a parent link, or the front-end's store at the root.
pub trait Up: Send + 'static {
    /// Sends one message toward the root (at the root: records it).
    fn send(&mut self, msg: up_message::Msg) -> impl Future<Output = ()> + Send;
    /// At the root: one finalized result.
    fn result(&mut self, result: RoundResult) -> impl Future<Output = ()> + Send;
    /// At the root: a stream changed state (`open`, `closed`, `failed`).
    fn stream_state(
        &mut self,
        _spec: &StreamSpec,
        _state: &str,
        _failure: Option<&str>,
    ) -> impl Future<Output = ()> + Send {
        async {}
    }
    /// Waits until what was sent has left this node (before exiting).
    fn flush(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// A parent link's queue as the way up.
pub struct ParentUp {
    pub tx: mpsc::Sender<canopy_proto::v1::UpMessage>,
}

impl Up for ParentUp {
    async fn send(&mut self, msg: up_message::Msg) {
        let msg = canopy_proto::v1::UpMessage { msg: Some(msg) };
        if matches!(msg.msg, Some(up_message::Msg::Status(_))) {
            // Status is periodic and replaced by the next one: it never waits for a parent that is away.
            let _ = self.tx.try_send(msg);
        } else {
            let _ = self.tx.send(msg).await;
        }
    }

    async fn result(&mut self, result: RoundResult) {
        tracing::error!(
            stream = result.stream.stream_id,
            round = result.round,
            "result produced below the root"
        );
    }

    async fn flush(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(3);
        while self.tx.capacity() < self.tx.max_capacity() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The link hands the last message to the transport; give it a moment on the wire.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The root's options.
#[derive(Debug, Clone)]
pub struct RootOptions {
    /// Start collection once this many ranks are attached (0: at the first child).
    pub expect_ranks: u32,
    /// Streams to open at start.
    pub streams: Vec<StreamSpec>,
    /// Finish the node once every child has sent Fin (a run that ends with its application).
    pub exit_on_fin: bool,
    /// How long a drain waits for the tree before closing what is left.
    pub drain_timeout: Duration,
}

/// How a node is set up.
pub struct NodeConfig {
    pub node_id: String,
    pub kind: NodeKind,
    pub filters: Arc<dyn FilterFactory>,
    /// Rounds that may be open at once; packets beyond wait (back pressure).
    pub max_rounds_in_flight: u64,
    pub root: Option<RootOptions>,
    /// The leaf's ranks: their numbers, the names they use, and where to send them control.
    pub local: Option<LocalRanks>,
    pub status_interval: Duration,
}

pub struct LocalRanks {
    pub ranks: Vec<u32>,
    pub names: Vec<(u64, String)>,
    pub control: mpsc::Sender<control::Action>,
}

/// Why a node stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Refused(#[from] Refused),
}

struct StreamRt {
    spec: StreamSpec,
    filter: Option<Box<dyn Filter>>,
    failed: Option<String>,
}

struct Child {
    conn: u64,
    tx: Option<ChildSender>,
    finished: bool,
}

/// Counters a node reports about itself.
#[derive(Debug, Default, Clone, Copy)]
pub struct NodeCounters {
    pub malformed: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub streams_failed: u64,
    pub rank_dumps_dropped: u64,
}

/// Round coverage remembered for packets a downstream call emits upward (the histogram's last phase).
const COVERAGE_MEMORY: usize = 4096;

pub struct Node<U: Up> {
    id: String,
    kind: NodeKind,
    level: Level,
    filters: Arc<dyn FilterFactory>,
    up: U,
    engine: RoundEngine,
    streams: BTreeMap<u32, StreamRt>,
    children: HashMap<String, Child>,
    inputs: mpsc::Receiver<Input>,
    window: watch::Sender<u64>,
    max_in_flight: u64,
    highest_closed: Option<u64>,
    hello: Option<watch::Sender<Hello>>,
    names: HashMap<u64, String>,
    subtree: BTreeMap<String, NodeEvent>,
    last_control: Option<Control>,
    /// The measurement options in force, replayed to children that attach later.
    last_options: Option<Control>,
    coverage_memory: HashMap<(u32, u64), (Coverage, u64)>,
    coverage_order: VecDeque<(u32, u64)>,
    counters: NodeCounters,
    fin_sent: bool,
    local: Option<LocalRanks>,
    root: Option<RootState>,
    status_interval: Duration,
    finish: bool,
    /// A leaf told to shut down leaves once its Fin is sent.
    exit_after_fin: bool,
    /// A drain is under way: children that attach now are told to drain too.
    draining: bool,
    /// The highest round a child waited for while no round was open.
    wait_hint: u64,
    /// At a leaf: every round below this was dumped by the local ranks.
    local_end: u64,
    /// Calls into each stream's filter and the time they took (microseconds).
    filter_time: BTreeMap<u32, (u64, u64)>,
    /// The highest round any packet or local dump brought here.
    highest_seen: u64,
    /// Streams closed here: their packets still in flight are dropped quietly.
    closed_streams: std::collections::HashSet<u32>,
    /// The largest application size announced by ranks below: this node's own (a leaf's socket ranks) and each
    /// child's.
    announced_local: u32,
    announced: HashMap<String, u32>,
    /// At the root: rounds whose packets went down (a multi-phase filter's range) and whose result has not come
    /// back up yet; the run does not finish while one is awaited (up to its deadline).
    awaiting: HashMap<(u32, u64), Instant>,
}

struct RootState {
    opts: RootOptions,
    started: bool,
    draining_until: Option<Instant>,
    next_stream_id: u32,
}

/// The handles a daemon keeps to feed a node and to serve its children.
pub struct NodeHandles {
    pub inputs: mpsc::Sender<Input>,
    pub window: watch::Receiver<u64>,
    /// For a node with a parent: the Hello the link sends, kept current.
    pub hello: watch::Receiver<Hello>,
}

/// Inputs queued before the node's task applies back pressure to the transport.
const INPUT_QUEUE: usize = 4096;

impl<U: Up> Node<U> {
    /// Builds a node and the handles to feed it.
    pub fn new(config: NodeConfig, up: U) -> (Self, NodeHandles) {
        let (tx, rx) = mpsc::channel(INPUT_QUEUE);
        let (window_tx, window_rx) = watch::channel(config.max_rounds_in_flight);
        let level = if config.root.is_some() {
            Level::Root
        } else if config.local.is_some() {
            Level::Leaf
        } else {
            Level::Relay
        };
        let mut engine = RoundEngine::new();
        let mut names = HashMap::new();
        if let Some(local) = &config.local {
            for r in &local.ranks {
                engine.add_source(&rank_source(*r), 1);
            }
            names.extend(local.names.iter().cloned());
        }
        let hello = Hello {
            node_id: config.node_id.clone(),
            kind: config.kind as i32,
            ranks_below: engine.ranks_expected(),
            protocol_version: canopy_proto::PROTOCOL_VERSION,
            listen_addr: String::new(),
            hostname: hostname(),
            ranks_announced: 0,
        };
        let (hello_tx, hello_rx) = watch::channel(hello);
        let root = config.root.map(|opts| RootState {
            opts,
            started: false,
            draining_until: None,
            next_stream_id: 1,
        });
        let node = Node {
            id: config.node_id,
            kind: config.kind,
            level,
            filters: config.filters,
            up,
            engine,
            streams: BTreeMap::new(),
            children: HashMap::new(),
            inputs: rx,
            window: window_tx,
            max_in_flight: config.max_rounds_in_flight.max(1),
            highest_closed: None,
            hello: if root.is_none() { Some(hello_tx) } else { None },
            names,
            subtree: BTreeMap::new(),
            last_control: None,
            last_options: None,
            coverage_memory: HashMap::new(),
            coverage_order: VecDeque::new(),
            counters: NodeCounters::default(),
            fin_sent: false,
            local: config.local,
            root,
            status_interval: config.status_interval,
            finish: false,
            exit_after_fin: false,
            draining: false,
            wait_hint: 0,
            local_end: 0,
            closed_streams: std::collections::HashSet::new(),
            filter_time: BTreeMap::new(),
            highest_seen: 0,
            awaiting: HashMap::new(),
            announced_local: 0,
            announced: HashMap::new(),
        };
        (
            node,
            NodeHandles {
                inputs: tx,
                window: window_rx,
                hello: hello_rx,
            },
        )
    }

    /// Sets the address this node's children reach it at, sent in its Hello.
    pub fn set_listen_addr(&mut self, addr: String) {
        if let Some(h) = &self.hello {
            h.send_modify(|h| h.listen_addr = addr);
        }
    }

    /// Runs until the tree finishes (Fin/FinAck), the parent refuses this node, or `shutdown` completes
    /// (at the root, a shutdown drains the tree first).
    pub async fn run(mut self, shutdown: impl Future<Output = ()> + Send) -> Result<(), NodeError> {
        tokio::pin!(shutdown);
        let mut shutdown_seen = false;
        if let Some(root) = &self.root {
            for spec in root.opts.streams.clone() {
                self.open_stream_at_root(spec).await;
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
                _ = sleep_until(deadline) => self.on_timer().await,
                _ = status.tick() => self.send_status().await,
                _ = &mut shutdown, if !shutdown_seen => {
                    shutdown_seen = true;
                    self.on_shutdown().await;
                }
            }
            // Cheap, and catches every way the tree can become finished (a result coming back, a child's Fin).
            self.check_fin().await;
            self.update_window();
        }
        self.up.flush().await;
        self.close_children().await;
        Ok(())
    }

    fn next_deadline(&self) -> Option<Instant> {
        let awaited = self.awaiting.values().min().copied();
        let drain = self.root.as_ref().and_then(|r| r.draining_until);
        let drain = match (drain, awaited) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match (self.engine.next_deadline(), drain) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    async fn handle(&mut self, input: Input) -> Result<(), NodeError> {
        match input {
            Input::ChildAttached {
                conn,
                hello,
                peer,
                tx,
            } => self.on_child_attached(conn, hello, peer, tx).await,
            Input::ChildMessage { conn, id, msg } => {
                if self.children.get(&id).is_some_and(|c| c.conn == conn) {
                    self.on_child_message(id, msg).await;
                }
            }
            Input::ChildGone { conn, id, reason } => self.on_child_gone(conn, id, reason).await,
            Input::ParentAttached => self.on_parent_attached().await,
            Input::ParentLost(reason) => {
                tracing::warn!(node = %self.id, "lost the parent: {reason}; re-attaching")
            }
            Input::ParentMessage(msg) => self.on_parent_message(msg).await,
            Input::Refused(r) => return Err(NodeError::Refused(r)),
            Input::LocalRound {
                round,
                dump_unix_ns,
                profiles,
                sampled_out,
            } => {
                self.on_local_round(round, dump_unix_ns, profiles, sampled_out)
                    .await
            }
            Input::LocalFinished => {
                let ranks: Vec<u32> = self.local.as_ref().map(|l| l.ranks.clone()).unwrap_or_default();
                for r in ranks {
                    // The ranks dumped every round below local_end; they are stopped from there on.
                    let end = self.local_end;
                    let closed = self
                        .engine
                        .set_source_state(&rank_source(r), SourceState::Finished { end });
                    self.on_closed_all(closed).await;
                }
                self.check_fin().await;
            }
            Input::OpenStream(spec, reply) => {
                let id = self.open_stream_at_root(spec).await;
                if let Some(reply) = reply {
                    let _ = reply.send(id);
                }
            }
            Input::CloseStream(id, reply) => {
                let closed = self.close_stream_at_root(id).await;
                if let Some(reply) = reply {
                    let _ = reply.send(closed);
                }
            }
            Input::Collection(c) => self.collection_at_root(c).await,
            Input::Options(o) => {
                if self.root.is_some() {
                    tracing::info!(?o, "measurement options");
                    self.on_control(Control {
                        action: Some(control::Action::Options(o)),
                    })
                    .await;
                }
            }
            Input::RankAttached {
                source,
                from,
                announced,
            } => {
                self.engine.add_source_from(&source, 1, from);
                self.announced_local = self.announced_local.max(announced);
                self.ranks_changed().await;
                self.maybe_start().await;
            }
            Input::RankRound {
                source,
                rank,
                round,
                dump_unix_ns,
                profile,
            } => {
                self.on_rank_round(source, rank, round, dump_unix_ns, profile)
                    .await
            }
            Input::RankNames(names) => {
                self.on_names(
                    names
                        .into_iter()
                        .map(|(id, name)| EventName { id, name })
                        .collect(),
                )
                .await
            }
            Input::RankDetached { source, finished_end } => {
                let state = match finished_end {
                    Some(end) => SourceState::Finished { end },
                    None => SourceState::Lost,
                };
                let closed = self.engine.set_source_state(&source, state);
                self.on_closed_all(closed).await;
                self.check_fin().await;
            }
            Input::RankDumpsDropped(n) => self.counters.rank_dumps_dropped += n,
            Input::RankRoundsDropped { source, from, end } => {
                self.local_end = self.local_end.max(end);
                let closed = self.engine.drop_rounds(&source, from, end);
                self.on_closed_all(closed).await;
            }
            Input::WindowWait { round } => {
                if !self.engine.has_open_groups() {
                    self.wait_hint = self.wait_hint.max(round);
                }
            }
        }
        Ok(())
    }

    async fn on_child_attached(&mut self, conn: u64, hello: Hello, peer: String, tx: ChildSender) {
        let id = hello.node_id.clone();
        for rt in self.streams.values().filter(|s| s.failed.is_none()) {
            let open = down_message::Msg::OpenStream(OpenStream {
                spec: Some(for_children(&rt.spec)),
            });
            let _ = tx.send(Ok(DownMessage { msg: Some(open) })).await;
        }
        // Options first: the Start that follows may make the child dump at once.
        for c in self.last_options.iter().chain(self.last_control.iter()) {
            let _ = tx
                .send(Ok(DownMessage {
                    msg: Some(down_message::Msg::Control(c.clone())),
                }))
                .await;
        }
        if self.draining {
            let drain = Control {
                action: Some(control::Action::Drain(canopy_proto::v1::Drain {})),
            };
            let _ = tx
                .send(Ok(DownMessage {
                    msg: Some(down_message::Msg::Control(drain)),
                }))
                .await;
        }
        self.children.insert(
            id.clone(),
            Child {
                conn,
                tx: Some(tx),
                finished: false,
            },
        );
        self.engine.add_source(&id, hello.ranks_below);
        self.announced.insert(id.clone(), hello.ranks_announced);
        let address = if hello.listen_addr.is_empty() {
            peer
        } else {
            hello.listen_addr.clone()
        };
        let ev = NodeEvent {
            node_id: id,
            parent_id: self.id.clone(),
            kind: hello.kind,
            state: NodeState::Attached as i32,
            ranks_below: hello.ranks_below,
            address,
            detail: String::new(),
            ranks_announced: hello.ranks_announced,
        };
        self.node_event(ev).await;
        self.ranks_changed().await;
        self.maybe_start().await;
    }

    async fn on_child_gone(&mut self, conn: u64, id: String, reason: String) {
        let Some(child) = self.children.get_mut(&id) else {
            return;
        };
        if child.conn != conn {
            return;
        }
        child.tx = None;
        let finished = child.finished;
        if !finished {
            tracing::warn!(node = %self.id, child = %id, "child lost: {reason}");
            let closed = self.engine.set_source_state(&id, SourceState::Lost);
            self.on_closed_all(closed).await;
            let mut ev = self.subtree.get(&id).cloned().unwrap_or_default();
            ev.node_id = id.clone();
            ev.parent_id = self.id.clone();
            ev.state = NodeState::Lost as i32;
            ev.detail = reason;
            self.node_event(ev).await;
        }
        self.check_fin().await;
    }

    async fn on_child_message(&mut self, id: String, msg: up_message::Msg) {
        match msg {
            up_message::Msg::Envelope(env) => {
                self.counters.bytes_in += env.payload.len() as u64;
                self.on_envelope(id, env).await;
            }
            up_message::Msg::Names(dict) => self.on_names(dict.names).await,
            up_message::Msg::NodeEvent(ev) => {
                if ev.node_id == id {
                    // A relay's count of ranks below changed as its own children came and went.
                    self.engine.set_ranks_below(&id, ev.ranks_below);
                    self.announced.insert(id.clone(), ev.ranks_announced);
                    self.ranks_changed().await;
                    self.maybe_start().await;
                }
                self.node_event(ev).await;
            }
            up_message::Msg::Status(st) => self.up.send(up_message::Msg::Status(st)).await,
            up_message::Msg::Fin(fin) => {
                if let Some(c) = self.children.get_mut(&id) {
                    c.finished = true;
                }
                let end = fin.rounds_end;
                let closed = self.engine.set_source_state(&id, SourceState::Finished { end });
                self.on_closed_all(closed).await;
                let mut ev = self.subtree.get(&id).cloned().unwrap_or_default();
                ev.node_id = id;
                ev.parent_id = self.id.clone();
                ev.state = NodeState::Finished as i32;
                self.node_event(ev).await;
                self.check_fin().await;
            }
            up_message::Msg::StreamError(e) => {
                if self.level == Level::Root {
                    self.fail_stream(e.stream_id, format!("node {}: {}", e.node_id, e.reason))
                        .await;
                } else {
                    self.up.send(up_message::Msg::StreamError(e)).await;
                }
            }
            up_message::Msg::Hello(_) => {
                tracing::warn!(node = %self.id, child = %id, "ignored a second hello from a child");
                self.counters.malformed += 1;
            }
        }
    }

    /// New names go up; a known id with another name goes up too, so the root can report the collision.
    async fn on_names(&mut self, names: Vec<EventName>) {
        let mut fresh = Vec::new();
        for n in names {
            if self.names.get(&n.id) != Some(&n.name) {
                self.names.entry(n.id).or_insert_with(|| n.name.clone());
                fresh.push(n);
            }
        }
        if !fresh.is_empty() {
            let pairs: Vec<(u64, String)> = fresh.iter().map(|n| (n.id, n.name.clone())).collect();
            for rt in self.streams.values_mut() {
                if let Some(f) = rt.filter.as_mut() {
                    f.names(&pairs);
                }
            }
            self.up
                .send(up_message::Msg::Names(NameDictionary { names: fresh }))
                .await;
        }
    }

    /// One dump of a socket rank. A rank told to stop says so once, at its first stopped dump: it counts as
    /// stopped from that round on until it reports again.
    async fn on_rank_round(
        &mut self,
        source: String,
        rank: u32,
        round: u64,
        dump_unix_ns: u64,
        profile: Result<Vec<u8>, MissingReason>,
    ) {
        self.local_end = self.local_end.max(round.saturating_add(1));
        self.highest_seen = self.highest_seen.max(round);
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
        let (payload, coverage) = match profile {
            Ok(p) => (
                p,
                Coverage {
                    covered: 1,
                    expected: 1,
                    missing: vec![],
                },
            ),
            Err(MissingReason::Stopped) => {
                let closed = self
                    .engine
                    .set_source_state(&source, SourceState::Stopped { end: round });
                self.on_closed_all(closed).await;
                return;
            }
            Err(reason) => (Vec::new(), absent(reason)),
        };
        self.accept_local(source, rank, round, dump_unix_ns, payload, coverage)
            .await;
    }

    /// Places one local rank's dump in every stream's round.
    async fn accept_local(
        &mut self,
        source: String,
        rank: u32,
        round: u64,
        dump_unix_ns: u64,
        payload: Vec<u8>,
        coverage: Coverage,
    ) {
        let absent = absent(MissingReason::SampledOut);
        let streams: Vec<(u32, crate::ranks::RankSet)> = self
            .streams
            .iter()
            .filter(|(_, s)| s.failed.is_none())
            .map(|(id, s)| {
                (
                    *id,
                    crate::ranks::RankSet::parse(&s.spec.ranks).unwrap_or_default(),
                )
            })
            .collect();
        let now = Instant::now();
        for (stream, chosen) in streams {
            // A stream fed by chosen ranks only (detail) counts the others as sampled out.
            let (payload, coverage) = if chosen.contains(rank) {
                (payload.clone(), coverage.clone())
            } else {
                (Vec::new(), absent.clone())
            };
            let key = GroupKey {
                stream,
                round,
                phase: 0,
            };
            let arrival = Arrival {
                source: source.clone(),
                coverage,
                payload,
                first_dump_unix_ns: dump_unix_ns,
            };
            match self.engine.accept(key, arrival, now) {
                Ok(Accepted::Pending) => {}
                Ok(Accepted::Closed(c)) => self.on_closed(c).await,
                Ok(Accepted::Late(a)) => self.on_late(key, a).await,
                Err(e) => {
                    self.counters.malformed += 1;
                    tracing::warn!(node = %self.id, "dropped a local profile: {e}")
                }
            }
        }
    }

    async fn on_envelope(&mut self, source: String, env: Envelope) {
        self.highest_seen = self.highest_seen.max(env.round);
        let key = GroupKey {
            stream: env.stream_id,
            round: env.round,
            phase: env.phase,
        };
        let arrival = Arrival {
            source,
            coverage: env.coverage.unwrap_or_default(),
            payload: env.payload,
            first_dump_unix_ns: env.first_dump_unix_ns,
        };
        if env.late {
            self.on_late(key, arrival).await;
            return;
        }
        match self.streams.get(&key.stream) {
            Some(rt) if rt.failed.is_none() => {}
            Some(_) => return,
            None if self.closed_streams.contains(&key.stream) => return,
            None => {
                tracing::warn!(node = %self.id, child = %arrival.source, stream = key.stream,
                    "packet for a stream this node does not have");
                self.counters.malformed += 1;
                return;
            }
        }
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

    async fn on_local_round(
        &mut self,
        round: u64,
        dump_unix_ns: u64,
        profiles: Vec<(u32, Vec<u8>)>,
        sampled_out: Vec<u32>,
    ) {
        // A sampled-out rank still answers for its round, with no profile: the round does not wait for it, and
        // its coverage says why it is absent.
        let absent = absent(MissingReason::SampledOut);
        let profiles: Vec<(u32, Vec<u8>, Coverage)> = profiles
            .into_iter()
            .map(|(r, p)| {
                (
                    r,
                    p,
                    Coverage {
                        covered: 1,
                        expected: 1,
                        missing: vec![],
                    },
                )
            })
            .chain(sampled_out.into_iter().map(|r| (r, Vec::new(), absent.clone())))
            .collect();
        self.local_end = self.local_end.max(round + 1);
        self.highest_seen = self.highest_seen.max(round);
        for (rank, payload, coverage) in profiles {
            self.accept_local(rank_source(rank), rank, round, dump_unix_ns, payload, coverage)
                .await;
        }
    }

    async fn on_closed_all(&mut self, closed: Vec<Closed>) {
        for c in closed {
            self.on_closed(c).await;
        }
    }

    async fn on_closed(&mut self, c: Closed) {
        self.highest_closed = Some(self.highest_closed.map_or(c.key.round, |h| h.max(c.key.round)));
        let Some(rt) = self.streams.get_mut(&c.key.stream) else {
            return;
        };
        let Some(filter) = rt.filter.as_mut() else { return };
        // Arrivals that cover nothing and carry nothing (sampled-out ranks) count in coverage, not as inputs.
        let used: Vec<usize> = (0..c.inputs.len())
            .filter(|i| !(c.inputs[*i].payload.is_empty() && c.inputs[*i].coverage.covered == 0))
            .collect();
        let inputs: Vec<&[u8]> = used.iter().map(|i| c.inputs[*i].payload.as_slice()).collect();
        let started = Instant::now();
        let out = filter.upstream(c.key.round, c.key.phase, &inputs);
        time_filter(&mut self.filter_time, c.key.stream, started);
        let out = match out {
            Ok(out) => out,
            Err(e) => {
                self.stream_error(c.key.stream, e.to_string()).await;
                return;
            }
        };
        let mut coverage = c.coverage;
        for (i, reason) in &out.rejected {
            let Some(input) = used.get(*i).and_then(|i| c.inputs.get(*i)) else {
                continue;
            };
            uncover(&mut coverage, MissingReason::Malformed, input.coverage.covered);
            self.counters.malformed += 1;
            tracing::warn!(node = %self.id, source = %input.source, stream = c.key.stream, round = c.key.round,
                "payload rejected by filter {}: {reason}", rt.spec.filter);
        }
        self.remember_coverage(c.key.stream, c.key.round, &coverage, c.first_dump_unix_ns);
        self.emit(
            c.key.stream,
            c.key.round,
            out,
            coverage,
            c.first_dump_unix_ns,
            false,
        )
        .await;
    }

    async fn on_late(&mut self, key: GroupKey, a: Arrival) {
        tracing::debug!(node = %self.id, source = %a.source, stream = key.stream, round = key.round, "late packet");
        if self.level == Level::Root {
            // A late packet is recorded whatever its phase. The filter finalizes it if it can (a late
            // passthrough batch is still every rank's profile); one it cannot read (a multi-phase filter's
            // early phase) is kept as a late arrival without a result, and never fails the stream.
            let Some(rt) = self.streams.get_mut(&key.stream) else {
                return;
            };
            let Some(filter) = rt.filter.as_mut() else { return };
            let finalized = if a.payload.is_empty() {
                Ok(Vec::new())
            } else {
                filter.finalize(key.round, key.phase, &a.payload)
            };
            let payload = match finalized {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(
                        stream = key.stream,
                        round = key.round,
                        phase = key.phase,
                        "late packet kept without a result: {e}"
                    );
                    Vec::new()
                }
            };
            let result = RoundResult {
                stream: rt.spec.clone(),
                round: key.round,
                phase: key.phase,
                coverage: a.coverage,
                first_dump_unix_ns: a.first_dump_unix_ns,
                payload,
                late: true,
            };
            self.up.result(result).await;
        } else {
            let mut payload = a.payload;
            if self.level == Level::Leaf {
                // A late rank's raw profile is not the filter's packet: a single-phase filter turns it into
                // one; a multi-phase round has moved on, so only its coverage goes up.
                payload = self.late_leaf_packet(key, &payload);
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
            self.counters.bytes_out += env.payload.len() as u64;
            self.up.send(up_message::Msg::Envelope(env)).await;
        }
    }

    fn late_leaf_packet(&mut self, key: GroupKey, raw: &[u8]) -> Vec<u8> {
        let Some(filter) = self
            .streams
            .get_mut(&key.stream)
            .and_then(|rt| rt.filter.as_mut())
        else {
            return Vec::new();
        };
        if filter.phases() > 1 {
            return Vec::new();
        }
        match filter.upstream(key.round, key.phase, &[raw]) {
            Ok(out) if out.rejected.is_empty() => {
                out.up.into_iter().next().map(|p| p.payload).unwrap_or_default()
            }
            Ok(_) | Err(_) => Vec::new(),
        }
    }

    /// Routes what a filter emitted: down to every child, up to the parent, or (at the root) into results.
    async fn emit(
        &mut self,
        stream: u32,
        round: u64,
        out: Output,
        coverage: Coverage,
        first_dump: u64,
        late: bool,
    ) {
        // A multi-phase round is under way here from its first packet until this node sends up its last phase.
        let (phases, timeout) = self.streams.get(&stream).map_or((1, 1000), |rt| {
            (
                rt.filter.as_ref().map_or(1, |f| f.phases()),
                u64::from(rt.spec.timeout_ms),
            )
        });
        if phases > 1 && !late {
            let last = phases - 1;
            if out.up.iter().any(|p| p.phase == last) {
                self.awaiting.remove(&(stream, round));
            } else if out.up.iter().chain(out.down.iter()).any(|p| p.phase < last) {
                let deadline = Instant::now() + Duration::from_millis(2 * timeout + 1000);
                self.awaiting.entry((stream, round)).or_insert(deadline);
            }
        }
        if !out.down.is_empty() {
            // Later phases go only to the children whose first phase made the round here.
            let to: Vec<ChildSender> = self
                .children
                .iter()
                .filter(|(id, _)| {
                    self.engine
                        .participants(stream, round)
                        .is_none_or(|p| p.contains(*id))
                })
                .filter_map(|(_, c)| c.tx.clone())
                .collect();
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
            if self.level == Level::Root {
                let Some(rt) = self.streams.get_mut(&stream) else {
                    return;
                };
                let Some(filter) = rt.filter.as_mut() else { return };
                let started = Instant::now();
                let finalized = filter.finalize(round, p.phase, &p.payload);
                time_filter(&mut self.filter_time, stream, started);
                match finalized {
                    Ok(payload) => {
                        let result = RoundResult {
                            stream: rt.spec.clone(),
                            round,
                            phase: p.phase,
                            coverage: coverage.clone(),
                            first_dump_unix_ns: first_dump,
                            payload,
                            late,
                        };
                        self.up.result(result).await;
                    }
                    Err(e) => self.stream_error(stream, e.to_string()).await,
                }
            } else {
                self.counters.bytes_out += p.payload.len() as u64;
                let env = Envelope {
                    stream_id: stream,
                    round,
                    phase: p.phase,
                    coverage: Some(coverage.clone()),
                    payload: p.payload,
                    late,
                    first_dump_unix_ns: first_dump,
                };
                self.up.send(up_message::Msg::Envelope(env)).await;
            }
        }
    }

    fn remember_coverage(&mut self, stream: u32, round: u64, cov: &Coverage, first_dump: u64) {
        if self
            .coverage_memory
            .insert((stream, round), (cov.clone(), first_dump))
            .is_none()
        {
            self.coverage_order.push_back((stream, round));
            while self.coverage_order.len() > COVERAGE_MEMORY {
                if let Some(k) = self.coverage_order.pop_front() {
                    self.coverage_memory.remove(&k);
                }
            }
        }
    }

    async fn on_parent_attached(&mut self) {
        let mut names: Vec<EventName> = self
            .names
            .iter()
            .map(|(id, name)| EventName {
                id: *id,
                name: name.clone(),
            })
            .collect();
        names.sort_by_key(|n| n.id);
        if !names.is_empty() {
            self.up
                .send(up_message::Msg::Names(NameDictionary { names }))
                .await;
        }
        let events: Vec<NodeEvent> = self.subtree.values().cloned().collect();
        for ev in events {
            self.up.send(up_message::Msg::NodeEvent(ev)).await;
        }
    }

    async fn on_parent_message(&mut self, msg: down_message::Msg) {
        match msg {
            down_message::Msg::Welcome(_) => {}
            down_message::Msg::OpenStream(open) => {
                if let Some(spec) = open.spec {
                    self.open_stream(spec.clone()).await;
                    self.broadcast(down_message::Msg::OpenStream(OpenStream {
                        spec: Some(for_children(&spec)),
                    }))
                    .await;
                }
            }
            down_message::Msg::CloseStream(close) => {
                self.close_stream(close.stream_id).await;
                self.broadcast(down_message::Msg::CloseStream(close)).await;
            }
            down_message::Msg::Control(c) => self.on_control(c).await,
            down_message::Msg::Envelope(env) => self.on_downstream(env).await,
        }
    }

    async fn on_control(&mut self, c: Control) {
        let Some(action) = c.action.clone() else { return };
        match action {
            control::Action::Start(_) | control::Action::Stop(_) => self.last_control = Some(c.clone()),
            control::Action::Options(ref o) => {
                // A period of 0 keeps the one in force: children that attach later must learn it too.
                let mut o = o.clone();
                if o.period_ms == 0
                    && let Some(control::Action::Options(prev)) =
                        self.last_options.as_ref().and_then(|p| p.action.clone())
                {
                    o.period_ms = prev.period_ms;
                }
                self.last_options = Some(Control {
                    action: Some(control::Action::Options(o)),
                });
            }
            control::Action::Drain(_) => self.draining = true,
            control::Action::FinAck(_) => {}
        }
        self.broadcast(down_message::Msg::Control(c)).await;
        if let Some(local) = &self.local {
            let _ = local.control.send(action.clone()).await;
        }
        if let control::Action::FinAck(_) = action {
            tracing::info!(node = %self.id, "finished (fin-ack from the root)");
            self.finish = true;
        }
    }

    async fn on_downstream(&mut self, env: Envelope) {
        let Some(rt) = self.streams.get_mut(&env.stream_id) else {
            return;
        };
        let Some(filter) = rt.filter.as_mut() else { return };
        let started = Instant::now();
        let out = filter.downstream(env.round, env.phase, &env.payload);
        time_filter(&mut self.filter_time, env.stream_id, started);
        match out {
            Ok(out) => {
                let (cov, first) = self
                    .coverage_memory
                    .get(&(env.stream_id, env.round))
                    .cloned()
                    .unwrap_or_default();
                self.emit(env.stream_id, env.round, out, cov, first, false).await;
            }
            Err(e) => self.stream_error(env.stream_id, e.to_string()).await,
        }
    }

    async fn open_stream(&mut self, spec: StreamSpec) -> bool {
        let id = spec.stream_id;
        if self.streams.contains_key(&id) {
            return true;
        }
        match self.filters.create(&spec.filter, &spec.params, self.level) {
            Ok(_) if crate::ranks::RankSet::parse(&spec.ranks).is_err() => {
                let reason = crate::ranks::RankSet::parse(&spec.ranks)
                    .err()
                    .unwrap_or_default();
                self.streams.insert(
                    id,
                    StreamRt {
                        spec,
                        filter: None,
                        failed: None,
                    },
                );
                self.stream_error(id, reason).await;
                false
            }
            Ok(mut filter) => {
                // A filter that classifies by name needs the names before the first round.
                let names: Vec<(u64, String)> = self.names.iter().map(|(id, n)| (*id, n.clone())).collect();
                if !names.is_empty() {
                    filter.names(&names);
                }
                let mode = SyncMode::try_from(spec.sync_mode).unwrap_or(SyncMode::WaitForAll);
                let mode = if mode == SyncMode::Unspecified {
                    SyncMode::WaitForAll
                } else {
                    mode
                };
                if mode == SyncMode::DontWait && filter.phases() > 1 {
                    // Its later phases need every packet of the round's first phase merged first.
                    let reason = format!(
                        "filter {} has {} phases and runs only in wait_for_all streams",
                        spec.filter,
                        filter.phases()
                    );
                    self.streams.insert(
                        id,
                        StreamRt {
                            spec,
                            filter: None,
                            failed: None,
                        },
                    );
                    self.stream_error(id, reason).await;
                    return false;
                }
                let timeout = Duration::from_millis(u64::from(spec.timeout_ms.max(1)));
                self.engine.open_stream(id, StreamSync { mode, timeout });
                self.streams.insert(
                    id,
                    StreamRt {
                        spec,
                        filter: Some(filter),
                        failed: None,
                    },
                );
                true
            }
            Err(e) => {
                // Marked failed by stream_error, which also tells the root (or, at the root, the store).
                self.streams.insert(
                    id,
                    StreamRt {
                        spec,
                        filter: None,
                        failed: None,
                    },
                );
                self.stream_error(id, e.to_string()).await;
                false
            }
        }
    }

    /// Opens a stream at the root and on the tree; returns its id (the stream may have failed at the root,
    /// which its recorded state says).
    async fn open_stream_at_root(&mut self, mut spec: StreamSpec) -> u32 {
        let Some(root) = self.root.as_mut() else { return 0 };
        if spec.stream_id == 0 {
            spec.stream_id = root.next_stream_id;
        }
        root.next_stream_id = root.next_stream_id.max(spec.stream_id + 1);
        let id = spec.stream_id;
        if self.open_stream(spec.clone()).await {
            tracing::info!(stream = spec.stream_id, name = %spec.name, filter = %spec.filter, "stream open");
            self.up.stream_state(&spec, "open", None).await;
            self.broadcast(down_message::Msg::OpenStream(OpenStream {
                spec: Some(for_children(&spec)),
            }))
            .await;
        }
        id
    }

    async fn close_stream_at_root(&mut self, id: u32) -> bool {
        if self.root.is_none() {
            return false;
        }
        let Some(spec) = self
            .streams
            .get(&id)
            .filter(|rt| rt.failed.is_none())
            .map(|rt| rt.spec.clone())
        else {
            tracing::warn!(stream = id, "close of a stream that is not open");
            return false;
        };
        self.close_stream(id).await;
        tracing::info!(stream = id, name = %spec.name, "stream closed");
        self.up.stream_state(&spec, "closed", None).await;
        self.broadcast(down_message::Msg::CloseStream(canopy_proto::v1::CloseStream {
            stream_id: id,
        }))
        .await;
        true
    }

    /// Stop pauses every rank; Start resumes them, numbering on from the last round closed.
    async fn collection_at_root(&mut self, c: Collection) {
        let Some(root) = self.root.as_mut() else { return };
        let action = match c {
            // Marked started: a child attaching while collection is stopped must not start it.
            Collection::Stop => {
                root.started = true;
                control::Action::Stop(canopy_proto::v1::Stop {})
            }
            Collection::Start => {
                root.started = true;
                let first_round = self.highest_closed.map_or(0, |h| h + 1);
                control::Action::Start(Start {
                    start_unix_ns: unix_ns(),
                    first_round,
                })
            }
        };
        tracing::info!(?c, "collection control");
        self.on_control(Control { action: Some(action) }).await;
    }

    async fn close_stream(&mut self, id: u32) {
        let closed = self.engine.close_stream(id);
        self.on_closed_all(closed).await;
        self.streams.remove(&id);
        // Rounds cut short by the close will not finish; packets still on their way are expected, not malformed.
        self.awaiting.retain(|(s, _), _| *s != id);
        self.closed_streams.insert(id);
    }

    /// A filter failed on this node: the stream stops here and the root hears why.
    async fn stream_error(&mut self, stream: u32, reason: String) {
        tracing::error!(node = %self.id, stream, "stream failed: {reason}");
        self.counters.streams_failed += 1;
        if self.level == Level::Root {
            self.fail_stream(stream, format!("node {}: {reason}", self.id))
                .await;
        } else {
            if let Some(rt) = self.streams.get_mut(&stream) {
                rt.failed = Some(reason.clone());
                rt.filter = None;
            }
            let _ = self.engine.close_stream(stream);
            let e = StreamError {
                stream_id: stream,
                node_id: self.id.clone(),
                reason,
            };
            self.up.send(up_message::Msg::StreamError(e)).await;
        }
    }

    async fn fail_stream(&mut self, stream: u32, reason: String) {
        let Some(rt) = self.streams.get_mut(&stream) else {
            return;
        };
        if rt.failed.is_some() {
            return;
        }
        rt.failed = Some(reason.clone());
        rt.filter = None;
        let spec = rt.spec.clone();
        let _ = self.engine.close_stream(stream);
        self.up.stream_state(&spec, "failed", Some(&reason)).await;
        self.broadcast(down_message::Msg::CloseStream(canopy_proto::v1::CloseStream {
            stream_id: stream,
        }))
        .await;
    }

    async fn node_event(&mut self, ev: NodeEvent) {
        self.subtree.insert(ev.node_id.clone(), ev.clone());
        self.up.send(up_message::Msg::NodeEvent(ev)).await;
    }

    /// Keeps the parent's view of this node's ranks current.
    async fn ranks_changed(&mut self) {
        let ranks = self.engine.ranks_expected();
        let announced = self.announced_below();
        let Some(hello) = &self.hello else { return };
        let changed = hello.send_if_modified(|h| {
            let changed = h.ranks_below != ranks || h.ranks_announced != announced;
            h.ranks_below = ranks;
            h.ranks_announced = announced;
            changed
        });
        if changed {
            let h = hello.borrow().clone();
            let ev = NodeEvent {
                node_id: self.id.clone(),
                kind: self.kind as i32,
                state: NodeState::Attached as i32,
                ranks_below: ranks,
                address: h.listen_addr,
                ranks_announced: announced,
                ..Default::default()
            };
            self.up.send(up_message::Msg::NodeEvent(ev)).await;
        }
    }

    /// The largest application size announced below this node.
    fn announced_below(&self) -> u32 {
        self.announced
            .values()
            .copied()
            .fold(self.announced_local, u32::max)
    }

    async fn maybe_start(&mut self) {
        let expected = self.engine.ranks_expected();
        let announced = self.announced_below();
        let Some(root) = self.root.as_mut() else { return };
        if root.started || root.draining_until.is_some() {
            return;
        }
        // Ranks that announce their application's size hold the start until all of them are attached, so the
        // first rounds do not close before the last rank's first dump.
        let target = root.opts.expect_ranks.max(announced);
        if expected == 0 || expected < target {
            if announced > 0 && expected > 0 {
                tracing::info!(
                    attached = expected,
                    waiting_for = target,
                    "waiting for ranks to attach"
                );
            }
            return;
        }
        root.started = true;
        tracing::info!(
            ranks = expected,
            "all expected ranks attached: starting collection"
        );
        let first_round = self.highest_closed.map_or(0, |h| h + 1);
        let start = Start {
            start_unix_ns: unix_ns(),
            first_round,
        };
        let start = Control {
            action: Some(control::Action::Start(start)),
        };
        self.on_control(start).await;
    }

    async fn on_shutdown(&mut self) {
        match self.root.as_mut() {
            Some(root) => {
                if root.draining_until.is_some() {
                    return;
                }
                let timeout = root.opts.drain_timeout;
                root.draining_until = Some(Instant::now() + timeout);
                tracing::info!(timeout_ms = timeout.as_millis() as u64, "draining the tree");
                self.on_control(Control {
                    action: Some(control::Action::Drain(canopy_proto::v1::Drain {})),
                })
                .await;
                self.check_fin().await;
            }
            None => {
                // A leaf finishes its ranks, says so with Fin and leaves; a relay leaves at once, and its
                // children re-attach when a relay comes back at the same address.
                if let Some(local) = &self.local {
                    self.exit_after_fin = true;
                    let _ = local
                        .control
                        .send(control::Action::Drain(canopy_proto::v1::Drain {}))
                        .await;
                    if self.fin_sent {
                        self.finish = true;
                    }
                } else {
                    self.finish = true;
                }
            }
        }
    }

    async fn on_timer(&mut self) {
        let now = Instant::now();
        let closed = self.engine.expire(now);
        self.on_closed_all(closed).await;
        let expired: Vec<(u32, u64)> = self
            .awaiting
            .iter()
            .filter(|(_, deadline)| **deadline <= now)
            .map(|(k, _)| *k)
            .collect();
        for (stream, round) in expired {
            self.awaiting.remove(&(stream, round));
            tracing::warn!(node = %self.id, stream, round, "the round's last phase never came back");
            if self.level == Level::Root {
                self.store_unfinished_round(stream, round).await;
            }
        }
        let drain_over = self
            .root
            .as_ref()
            .and_then(|r| r.draining_until)
            .is_some_and(|d| d <= now);
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

    /// A multi-phase round whose last phase never reached the root still gets its row: no result, and every
    /// rank of its first phase counted late, so no rank-round disappears.
    async fn store_unfinished_round(&mut self, stream: u32, round: u64) {
        let Some(rt) = self.streams.get(&stream) else {
            return;
        };
        let (mut coverage, first_dump) = self
            .coverage_memory
            .get(&(stream, round))
            .cloned()
            .unwrap_or_default();
        let covered = coverage.covered;
        uncover(&mut coverage, MissingReason::Late, covered);
        let phase = rt.filter.as_ref().map_or(0, |f| f.phases().saturating_sub(1));
        let result = RoundResult {
            stream: rt.spec.clone(),
            round,
            phase,
            coverage,
            first_dump_unix_ns: first_dump,
            payload: Vec::new(),
            late: false,
        };
        self.up.result(result).await;
    }

    /// Sends Fin up (or, at the root, Fin-Ack down) once nothing below is live and no round is open.
    async fn check_fin(&mut self) {
        // Every source must be finished or lost, at least one finished: when all are lost the ranks below did
        // not finish, and a Fin would report them as stopped.
        let done = self.engine.has_sources()
            && self.engine.live_sources() == 0
            && self.engine.stopped_sources() == 0
            && self.engine.any_finished()
            && !self.engine.has_open_groups()
            && self.awaiting.is_empty();
        if self.fin_sent || !done {
            return;
        }
        match &self.root {
            Some(root) if root.opts.exit_on_fin || root.draining_until.is_some() => self.finish_root().await,
            Some(_) => {}
            None => {
                self.fin_sent = true;
                tracing::info!(node = %self.id, "every rank below has finished: sending fin");
                let fin = Fin {
                    node_id: self.id.clone(),
                    rounds_end: self.highest_closed.map_or(0, |h| h + 1),
                };
                self.up.send(up_message::Msg::Fin(fin)).await;
                if self.exit_after_fin {
                    self.finish = true;
                }
            }
        }
    }

    async fn finish_root(&mut self) {
        if self.fin_sent {
            return;
        }
        self.fin_sent = true;
        self.send_status().await;
        self.up
            .send(up_message::Msg::Fin(Fin {
                node_id: self.id.clone(),
                rounds_end: self.highest_closed.map_or(0, |h| h + 1),
            }))
            .await;
        self.on_control(Control {
            action: Some(control::Action::FinAck(canopy_proto::v1::FinAck {})),
        })
        .await;
    }

    async fn send_status(&mut self) {
        let s = self.engine.stats();
        let st = NodeStatus {
            node_id: self.id.clone(),
            rounds_closed: s.closed,
            rounds_partial: s.partial,
            late_arrivals: s.late_packets,
            malformed: self.counters.malformed,
            bytes_in: self.counters.bytes_in,
            bytes_out: self.counters.bytes_out,
            streams_failed: self.counters.streams_failed,
            rank_dumps_dropped: self.counters.rank_dumps_dropped,
            lag_rounds: self
                .engine
                .lowest_open_round()
                .map_or(0, |low| self.highest_seen.saturating_sub(low) + 1),
            filter_time: self
                .filter_time
                .iter()
                .map(|(id, (calls, micros))| canopy_proto::v1::FilterTime {
                    stream_id: *id,
                    calls: *calls,
                    micros: *micros,
                })
                .collect(),
        };
        self.up.send(up_message::Msg::Status(st)).await;
    }

    async fn broadcast(&mut self, msg: down_message::Msg) {
        for child in self.children.values() {
            if let Some(tx) = &child.tx {
                let _ = tx
                    .send(Ok(DownMessage {
                        msg: Some(msg.clone()),
                    }))
                    .await;
            }
        }
    }

    /// Ends every child's stream and waits briefly for the children to hang up, so Fin-Ack is not cut off.
    async fn close_children(&mut self) {
        let txs: Vec<ChildSender> = self.children.values_mut().filter_map(|c| c.tx.take()).collect();
        let deadline = Instant::now() + Duration::from_secs(2);
        for tx in txs {
            while tx.capacity() < tx.max_capacity() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    fn update_window(&mut self) {
        // With no round open, the window starts after the last closed round, or at the round a waiting child
        // asked for (a child rejoining far ahead while no other child is delivering).
        // A multi-phase round whose first phase went up stays in the window until this node sends up its last
        // phase: a leaf that ran ahead with first phases would queue them in front of the later phases its parent
        // waits for.
        let active = self.engine.lowest_open_round();
        let awaited = self.awaiting.keys().map(|(_, round)| *round).min();
        let floor = match (active, awaited) {
            (Some(a), Some(b)) => a.min(b),
            (Some(floor), None) | (None, Some(floor)) => floor,
            (None, None) => self.highest_closed.map_or(0, |h| h + 1).max(self.wait_hint),
        };
        let limit = floor.saturating_add(self.max_in_flight);
        self.window.send_if_modified(|w| {
            let changed = *w != limit;
            *w = limit;
            changed
        });
    }

    /// Counters for tests and status.
    pub fn counters(&self) -> NodeCounters {
        self.counters
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

fn time_filter(times: &mut BTreeMap<u32, (u64, u64)>, stream: u32, started: Instant) {
    let t = times.entry(stream).or_default();
    t.0 += 1;
    t.1 += started.elapsed().as_micros() as u64;
}

/// The coverage of one rank that answers for a round without a profile, and why.
fn absent(reason: MissingReason) -> Coverage {
    Coverage {
        covered: 0,
        expected: 1,
        missing: vec![canopy_proto::v1::Missing {
            reason: reason as i32,
            ranks: 1,
        }],
    }
}

/// The engine's source id for a leaf's rank.
pub fn rank_source(rank: u32) -> String {
    format!("rank:{rank}")
}

pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Start or stop collection, from the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collection {
    Start,
    Stop,
}

/// Drives a tree from its root (the front-end's API uses it; so do tests).
#[derive(Clone)]
pub struct RootHandle {
    inputs: mpsc::Sender<Input>,
}

impl RootHandle {
    pub fn new(inputs: mpsc::Sender<Input>) -> Self {
        Self { inputs }
    }

    /// Opens a stream on every node; a stream id of 0 gets the next free id.
    pub async fn open_stream(&self, spec: StreamSpec) -> bool {
        self.inputs.send(Input::OpenStream(spec, None)).await.is_ok()
    }

    /// Opens a stream and returns the id it got (0 if the node has stopped).
    pub async fn open_stream_id(&self, spec: StreamSpec) -> u32 {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.inputs.send(Input::OpenStream(spec, Some(tx))).await.is_err() {
            return 0;
        }
        rx.await.unwrap_or(0)
    }

    /// Closes a stream on every node; its open rounds close with what they hold.
    pub async fn close_stream(&self, stream_id: u32) -> bool {
        self.inputs
            .send(Input::CloseStream(stream_id, None))
            .await
            .is_ok()
    }

    /// Closes a stream and says whether it was open at the root (`None`: the node has stopped).
    pub async fn close_stream_checked(&self, stream_id: u32) -> Option<bool> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.inputs
            .send(Input::CloseStream(stream_id, Some(tx)))
            .await
            .ok()?;
        rx.await.ok()
    }

    pub async fn collection(&self, c: Collection) -> bool {
        self.inputs.send(Input::Collection(c)).await.is_ok()
    }

    /// Replaces every rank's measurement options from its next dump on (check them first with
    /// `options::Measure::from_options`).
    pub async fn options(&self, o: canopy_proto::v1::Options) -> bool {
        self.inputs.send(Input::Options(o)).await.is_ok()
    }
}
