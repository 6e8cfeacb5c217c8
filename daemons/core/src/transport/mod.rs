//! The tree transport: the parent's side of `canopy.v1.Tree/Attach` (a tonic service that turns each child's
//! stream into node inputs) and the child's side (a link that attaches to the parent and re-attaches after a
//! failure).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use canopy_proto::v1::tree_client::TreeClient;
use canopy_proto::v1::tree_server::Tree;
use canopy_proto::v1::{DownMessage, Hello, UpMessage, Welcome, down_message, up_message};
use canopy_proto::{MAX_RANKS, PROTOCOL_VERSION};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::node::{ChildEvent, ChildSender, Input, ParentEvent, Refused};
use crate::run::RunId;
use crate::window::WindowGate;

mod held;
pub(crate) mod kept;
use held::Held;
use kept::Kept;

use canopy_proto::MAX_MESSAGE_BYTES;

/// How long a child may take to send its Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// How often each end of a tree connection pings the other when it has heard nothing, and how long it waits for
/// the answer before it gives the connection up: a stopped or unreachable peer is lost after 15 s at most.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest a link waits between two rounds of attempts to reach its parents (before the random part).
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How long a link that has sent its last message waits for the parent to end the stream.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);

/// Messages queued for one child before the node waits for that child to read them.
const CHILD_QUEUE: usize = 1024;

/// HTTP/2 flow-control window of every tree connection and stream, both ways. HTTP/2's default (64 KiB) is
/// smaller than a round's packet at a few hundred ranks, and a sender that runs out of window waits for the
/// receiver's window update: a round trip on every round. A connection buffers at most this much that its
/// reader has not taken yet.
pub const FLOW_WINDOW: u32 = 4 << 20;

/// The gRPC server of a tree node (relay or front-end): keep-alives that find a dead peer, the tree's
/// flow-control window, TLS when given (the handshake times out), and every call judged by `gate` first.
pub fn server(
    tls: Option<tonic::transport::ServerTlsConfig>,
    gate: canopy_runtime::auth::Gate,
) -> Result<
    tonic::transport::Server<tower_layer::Stack<canopy_runtime::auth::Gate, tower_layer::Identity>>,
    tonic::transport::Error,
> {
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    Ok(builder
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .initial_stream_window_size(Some(FLOW_WINDOW))
        .initial_connection_window_size(Some(FLOW_WINDOW))
        .layer(gate))
}

/// Why a parent turns a child away on Attach. The one mapping to a gRPC status is [`From<AttachError> for
/// Status`]; the child's link reads the codes of refusals back with [`is_refusal`].
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(
        "protocol version mismatch: child {child} speaks version {child_version}, parent {parent} speaks version {parent_version}"
    )]
    VersionMismatch {
        child: String,
        child_version: u32,
        parent: String,
        parent_version: u32,
    },
    #[error("hello has an empty node id")]
    EmptyNodeId,
    #[error("child {child} counts {ranks} ranks, more than any node may answer for ({max})")]
    TooManyRanks { child: String, ranks: u32, max: u32 },
    #[error("node id {child} is already attached to {parent}")]
    AlreadyAttached { child: String, parent: String },
    #[error(
        "node {child} belongs to run {child_run}, and {parent} to run {parent_run}: a node of another run is \
         refused, not merged (restart it to join this run)"
    )]
    OtherRun {
        child: String,
        child_run: String,
        parent: String,
        parent_run: String,
    },
    #[error(
        "{parent} was continuing run {run} and {child}, a node of a new tree (it carries no run id), attached \
         first: that run ends and a new one starts; attach again in a moment"
    )]
    NewTree {
        child: String,
        parent: String,
        run: String,
    },
    #[error("no hello within 10 s")]
    NoHello,
    #[error("the first message on Attach must be a Hello")]
    FirstNotHello,
    #[error("node is shutting down")]
    ShuttingDown,
    /// The child's stream failed before its hello.
    #[error("{}", .0.message())]
    Stream(Status),
}

impl From<AttachError> for Status {
    fn from(e: AttachError) -> Status {
        let msg = e.to_string();
        match e {
            AttachError::VersionMismatch { .. } | AttachError::OtherRun { .. } => {
                Status::failed_precondition(msg)
            }
            AttachError::EmptyNodeId | AttachError::FirstNotHello | AttachError::TooManyRanks { .. } => {
                Status::invalid_argument(msg)
            }
            AttachError::AlreadyAttached { .. } => Status::already_exists(msg),
            AttachError::NoHello => Status::deadline_exceeded(msg),
            AttachError::ShuttingDown | AttachError::NewTree { .. } => Status::unavailable(msg),
            AttachError::Stream(status) => status,
        }
    }
}

/// Whether a status a parent answered Attach with refuses this node for good (re-attaching cannot help).
pub fn is_refusal(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::FailedPrecondition | tonic::Code::AlreadyExists | tonic::Code::InvalidArgument
    )
}

/// The parent's side of Attach.
#[derive(Clone)]
pub struct TreeService {
    node_id: String,
    inputs: mpsc::Sender<Input>,
    /// Attached children by id: their connection number and the sender of their down stream.
    attached: Arc<Mutex<HashMap<String, (u64, ChildSender)>>>,
    next_conn: Arc<std::sync::atomic::AtomicU64>,
    /// Rounds below the window's limit may be read; a child whose next packet is at or above it waits.
    window: WindowGate,
    /// The node's run: given to children in the Welcome; a child of another run is refused.
    run: RunId,
    /// At a root continuing a crashed run: the first child tells the run from a new tree.
    resumed: Option<crate::run::ResumeGate>,
}

impl TreeService {
    pub fn new(node_id: String, inputs: mpsc::Sender<Input>, window: WindowGate) -> Self {
        Self {
            node_id,
            inputs,
            attached: Arc::default(),
            next_conn: Arc::new(std::sync::atomic::AtomicU64::new(1)),
            window,
            run: RunId::default(),
            resumed: None,
        }
    }

    /// A root continuing a crashed run: the first child to attach decides whether the run goes on.
    pub fn resuming(self, gate: crate::run::ResumeGate) -> Self {
        Self {
            resumed: Some(gate),
            ..self
        }
    }

    /// The node's run (the one its link learns, or the root's own).
    pub fn with_run(self, run: RunId) -> Self {
        Self { run, ..self }
    }

    /// The tonic server for this service, with Canopy's message limits.
    pub fn into_server(self) -> canopy_proto::v1::tree_server::TreeServer<Self> {
        canopy_proto::v1::tree_server::TreeServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn admit(&self, hello: &Hello, tx: &ChildSender) -> Result<u64, AttachError> {
        if hello.protocol_version != PROTOCOL_VERSION {
            let e = AttachError::VersionMismatch {
                child: hello.node_id.clone(),
                child_version: hello.protocol_version,
                parent: self.node_id.clone(),
                parent_version: PROTOCOL_VERSION,
            };
            tracing::error!(child = %hello.node_id, child_version = hello.protocol_version,
                parent_version = PROTOCOL_VERSION, "refused child: {e}");
            return Err(e);
        }
        if hello.node_id.is_empty() {
            return Err(AttachError::EmptyNodeId);
        }
        if !self.run.admits(&hello.run_id) {
            let e = AttachError::OtherRun {
                child: hello.node_id.clone(),
                child_run: hello.run_id.clone(),
                parent: self.node_id.clone(),
                parent_run: self.run.get(),
            };
            tracing::error!(child = %hello.node_id, "refused child: {e}");
            return Err(e);
        }
        if let Some(gate) = &self.resumed
            && !gate.admits(&hello.node_id, &hello.run_id)
        {
            let e = AttachError::NewTree {
                child: hello.node_id.clone(),
                parent: self.node_id.clone(),
                run: self.run.get(),
            };
            tracing::warn!(child = %hello.node_id, "{e}");
            return Err(e);
        }
        let ranks = hello.ranks_below.max(hello.ranks_announced);
        if ranks > MAX_RANKS {
            let e = AttachError::TooManyRanks {
                child: hello.node_id.clone(),
                ranks,
                max: MAX_RANKS,
            };
            tracing::error!(child = %hello.node_id, "refused child: {e}");
            return Err(e);
        }
        let mut attached = self.attached.lock().expect("attached registry");
        // A registration whose stream is already gone (a child restarted before its old reader noticed) is stale.
        attached.retain(|_, (_, tx)| !tx.is_closed());
        if attached.contains_key(&hello.node_id) {
            let e = AttachError::AlreadyAttached {
                child: hello.node_id.clone(),
                parent: self.node_id.clone(),
            };
            tracing::error!(child = %hello.node_id, "refused child: {e}");
            return Err(e);
        }
        let conn = self.next_conn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        attached.insert(hello.node_id.clone(), (conn, tx.clone()));
        Ok(conn)
    }
}

#[tonic::async_trait]
impl Tree for TreeService {
    type AttachStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<DownMessage, Status>> + Send>>;

    async fn attach(
        &self,
        request: Request<Streaming<UpMessage>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let peer = request.remote_addr().map(|a| a.to_string()).unwrap_or_default();
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
            .await
            .map_err(|_| AttachError::NoHello)?
            .map_err(AttachError::Stream)?;
        let hello = match first.and_then(|m| m.msg) {
            Some(up_message::Msg::Hello(h)) => h,
            _ => return Err(AttachError::FirstNotHello.into()),
        };
        let (tx, rx) = mpsc::channel(CHILD_QUEUE);
        let conn = self.admit(&hello, &tx)?;
        let id = hello.node_id.clone();
        tracing::info!(child = %id, kind = hello.kind, ranks_below = hello.ranks_below, %peer, "child attached");
        let welcome = Welcome {
            parent_id: self.node_id.clone(),
            protocol_version: PROTOCOL_VERSION,
            run_id: self.run.get(),
        };
        let _ = tx
            .send(Ok(DownMessage {
                msg: Some(down_message::Msg::Welcome(welcome)),
            }))
            .await;
        if self
            .inputs
            .send(Input::Child(ChildEvent::Attached {
                conn,
                hello,
                peer,
                tx,
            }))
            .await
            .is_err()
        {
            self.attached.lock().expect("attached registry").remove(&id);
            return Err(AttachError::ShuttingDown.into());
        }
        let inputs = self.inputs.clone();
        let attached = self.attached.clone();
        let window = self.window.clone();
        // The packets read from this child: every credit going down says how many, so the child keeps those this
        // node has not read yet.
        let taken = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = taken.clone();
        tokio::spawn(async move {
            let reason = read_child(conn, &id, inbound, &inputs, window, &counted).await;
            {
                let mut attached = attached.lock().expect("attached registry");
                if attached.get(&id).is_some_and(|(c, _)| *c == conn) {
                    attached.remove(&id);
                }
            }
            let _ = inputs
                .send(Input::Child(ChildEvent::Gone { conn, id, reason }))
                .await;
        });
        let down = tokio_stream::StreamExt::map(ReceiverStream::new(rx), move |mut msg| {
            if let Ok(DownMessage {
                msg: Some(down_message::Msg::Credit(c)),
            }) = &mut msg
            {
                c.taken = taken.load(std::sync::atomic::Ordering::Acquire) + 1;
            }
            msg
        });
        Ok(Response::new(Box::pin(down)))
    }
}

/// Reads one child's stream into node inputs until it ends, and says why it ended. What may not reach the node
/// yet waits in [`Held`], which says what passes.
async fn read_child(
    conn: u64,
    id: &str,
    mut inbound: Streaming<UpMessage>,
    inputs: &mpsc::Sender<Input>,
    mut window: WindowGate,
    taken: &std::sync::atomic::AtomicU64,
) -> String {
    let mut held = Held::default();
    // A child sends its status every second: a stream that ends after a longer silence was ended by the server's
    // keep-alive (hyper ends it as if the child had), not by the child.
    let mut heard = tokio::time::Instant::now();
    let forward = |msg: up_message::Msg| {
        Input::Child(ChildEvent::Message {
            conn,
            id: id.to_string(),
            msg,
        })
    };
    let reason = loop {
        tokio::select! {
            next = inbound.message(), if held.has_room() => match next {
                Ok(Some(UpMessage { msg: Some(msg) })) => {
                    heard = tokio::time::Instant::now();
                    if let up_message::Msg::Want(w) = &msg {
                        // Flow control, not data: it never waits behind held packets.
                        window.want(w.round);
                        continue;
                    }
                    if let up_message::Msg::Envelope(e) = &msg {
                        tracing::debug!(target: crate::LATENCY, child = %id, round = e.round, phase = e.phase,
                            first_dump_ns = e.first_dump_unix_ns, at_ns = crate::node::unix_ns(), "packet read");
                        // Read in the order the child sent them: the child counts its packets the same way.
                        taken.fetch_add(1, std::sync::atomic::Ordering::Release);
                    }
                    if held.passes(&msg, &window) {
                        if inputs.send(forward(msg)).await.is_err() {
                            return "node stopped".into();
                        }
                        continue;
                    }
                    let first = held.first_round().is_none();
                    held.hold(msg);
                    if first && let Some(round) = held.first_round() {
                        // Tell the node what is waiting: with no round open it moves the window here.
                        window.want(round);
                    }
                }
                Ok(Some(UpMessage { msg: None })) => {}
                Ok(None) if heard.elapsed() >= KEEPALIVE_INTERVAL => {
                    break format!(
                        "keep-alive time-out: nothing from the child for {:.0} s, and no answer to pings",
                        heard.elapsed().as_secs_f64()
                    )
                }
                Ok(None) => break "stream closed by child".to_string(),
                Err(status) => break format!("stream failed: {}", status.message()),
            },
            moved = window.moved(), if !held.is_empty() => {
                if moved.is_none() {
                    return "node stopped".into();
                }
                for msg in held.release(&window) {
                    if inputs.send(forward(msg)).await.is_err() {
                        return "node stopped".into();
                    }
                }
                if let Some(round) = held.first_round() {
                    window.want(round);
                }
            }
        }
    };
    // What the child sent before it left still reaches the node, in order, as the window allows.
    while let Some(msg) = held.pop() {
        if let up_message::Msg::Envelope(env) = &msg
            && !held::admitted(env, &window)
            && !window.admit(env.round).await
        {
            return "node stopped".into();
        }
        if inputs.send(forward(msg)).await.is_err() {
            return "node stopped".into();
        }
    }
    reason
}

/// The child's side: keeps one Attach stream to the parent, re-attaching with back-off after failures.
pub struct ParentLink {
    /// The parents this node may attach to, in order of preference: the first, then (when it is lost or cannot
    /// be reached) the next, around the list. An adopted node goes back to the first once it answers again for
    /// `return_after` (if set).
    pub parents: Vec<String>,
    /// The Hello to send; the node keeps it current (its ranks below change as children attach).
    pub hello: watch::Receiver<Hello>,
    pub outbound: mpsc::Receiver<UpMessage>,
    pub inputs: mpsc::Sender<Input>,
    /// The node's certificate and the CA its parent's must chain to; `None`: plaintext (loopback only).
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    /// The node's run, learnt from the first Welcome and said in every Hello.
    pub run: RunId,
    /// Attached to another parent than the first of `parents` (adopted), go back to the first once it has
    /// answered for this long without a break; `None`: stay with the adopter.
    pub return_after: Option<Duration>,
    /// The most bytes of copies kept for resending (a share of the daemon's memory budget); past it the oldest
    /// go, and are counted.
    pub kept_bytes: usize,
}

/// A link's state across its sessions (attachments to a parent): what it sent up and may have to send again.
#[derive(Default)]
struct Sessions {
    /// The current session (counted from 1 as sessions begin).
    current: u64,
    kept: Kept,
    /// Packets an adopter asked for again, sent before anything new.
    again: std::collections::VecDeque<UpMessage>,
    /// The node id of the parent of the last session: the next Hello says it, so the same parent (or one restarted
    /// on its address) asks for what it lacks.
    last_parent: String,
}

impl ParentLink {
    /// Runs until the node stops or the parent refuses this node (then `Input::Refused` is sent).
    pub async fn run(mut self) {
        let mut backoff = Self::backoff();
        let mut failures = 0u32;
        // The last reason logged for each parent: a new one is logged at once.
        let mut last_reason: HashMap<String, String> = HashMap::new();
        let mut pending: Option<UpMessage> = None;
        let mut sessions = Sessions {
            kept: Kept::with_bound(self.kept_bytes),
            ..Sessions::default()
        };
        let mut at = 0usize;
        loop {
            let parent = self.parents.get(at).cloned().unwrap_or_default();
            // Adopted: the preferred parent is watched, to go back to it once it is healthy again.
            let preferred = (at != 0).then(|| self.parents[0].clone());
            match self
                .session(&parent, preferred, &mut pending, &mut sessions)
                .await
            {
                Ok(()) => return,
                Err(SessionEnd::Refused(message)) => {
                    let refused = Refused {
                        parent: parent.clone(),
                        message,
                    };
                    tracing::error!("{refused}");
                    let _ = self
                        .inputs
                        .send(Input::Parent(ParentEvent::Refused(refused)))
                        .await;
                    return;
                }
                Err(SessionEnd::Return) => {
                    sessions
                        .kept
                        .session_ended(sessions.current, tokio::time::Instant::now());
                    let _ = self
                        .inputs
                        .send(Input::Parent(ParentEvent::Lost(
                            "back to the preferred parent".into(),
                        )))
                        .await;
                    at = 0;
                    backoff = Self::backoff();
                    failures = 0;
                    continue;
                }
                Err(SessionEnd::Lost { attached, reason }) => {
                    if attached {
                        sessions
                            .kept
                            .session_ended(sessions.current, tokio::time::Instant::now());
                        backoff = Self::backoff();
                        failures = 0;
                        let _ = self
                            .inputs
                            .send(Input::Parent(ParentEvent::Lost(reason.clone())))
                            .await;
                    }
                    failures += 1;
                    if attached {
                        // Also the normal end of a finished tree, which stops this link right after.
                        tracing::info!(parent = %parent, "parent stream ended: {reason}");
                    } else if failures == 1
                        || failures.is_multiple_of(20)
                        || last_reason.get(&parent) != Some(&reason)
                    {
                        // A TLS fault (another tree's CA, plaintext against TLS) is named at once, and again
                        // whenever the reason changes.
                        let said = canopy_runtime::tls_hint::with_hint(&reason);
                        tracing::warn!(parent = %parent, attempts = failures, "cannot reach parent: {said}");
                    }
                    last_reason.insert(parent.clone(), reason);
                    // The next parent of the list at once; the back-off only once every one of them was tried.
                    if self.parents.len() > 1 {
                        at = (at + 1) % self.parents.len();
                        if !attached && at != 0 {
                            if self.outbound.is_closed() && self.outbound.is_empty() {
                                return;
                            }
                            tracing::info!(parent = %self.parents[at], "trying the next parent");
                            continue;
                        }
                    }
                }
            }
            if self.outbound.is_closed() && self.outbound.is_empty() {
                // The node ended while the parent was away: nothing is left to deliver.
                return;
            }
            tokio::time::sleep(backoff.next().unwrap_or(MAX_BACKOFF)).await;
        }
    }

    /// The delays between rounds of attempts: from 50 ms, doubling to 2 s, each with a random part (up to as
    /// much again) so the children of a lost node do not all retry at the same moments.
    fn backoff() -> backon::ExponentialBackoff {
        use backon::BackoffBuilder;
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(MAX_BACKOFF)
            .with_jitter()
            .without_max_times()
            .build()
    }

    async fn session(
        &mut self,
        parent: &str,
        preferred: Option<String>,
        pending: &mut Option<UpMessage>,
        sessions: &mut Sessions,
    ) -> Result<(), SessionEnd> {
        let lost = |attached: bool, reason: String| SessionEnd::Lost { attached, reason };
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{}", parent))
            .map_err(|e| SessionEnd::Refused(format!("bad parent address {}: {e}", parent)))?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| SessionEnd::Refused(format!("bad TLS settings: {}", error_chain(&e))))?;
        }
        let endpoint = endpoint
            .connect_timeout(Duration::from_secs(2))
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .initial_stream_window_size(Some(FLOW_WINDOW))
            .initial_connection_window_size(Some(FLOW_WINDOW))
            .tcp_nodelay(true);
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| lost(false, error_chain(&e)))?;
        let mut client = TreeClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        // One slot: what the transport has not taken yet is lost if the stream breaks, so keep it small.
        let (tx, rx) = mpsc::channel::<UpMessage>(1);
        // The node queues an event about itself each time its count of ranks changes, after it updates the Hello:
        // those queued before the Hello is read are older than it. Sent after it, they would take the parent back
        // to older counts (ranks that attach one by one while the parent is away: 4, then 1, 2, 3, 4), which it
        // reads as ranks that left before their first dump.
        let mut superseded = self.outbound.len();
        let hello = Hello {
            returning_from: sessions.last_parent.clone(),
            run_id: self.run.get(),
            ..self.hello.borrow().clone()
        };
        let own_id = hello.node_id.clone();
        if pending.as_ref().is_some_and(|msg| is_own_count(msg, &own_id)) {
            *pending = None;
        }
        let _ = tx
            .send(UpMessage {
                msg: Some(up_message::Msg::Hello(hello)),
            })
            .await;
        let response =
            client
                .attach(ReceiverStream::new(rx))
                .await
                .map_err(|s| match is_refusal(s.code()) {
                    true => SessionEnd::Refused(s.message().to_string()),
                    false => lost(false, format!("{}: {}", s.code(), s.message())),
                })?;
        let mut inbound = response.into_inner();
        match inbound.message().await {
            Ok(Some(DownMessage {
                msg: Some(down_message::Msg::Welcome(w)),
            })) => {
                if let Err(own) = self.run.learn(&w.run_id) {
                    return Err(SessionEnd::Refused(format!(
                        "parent {} ({parent}) belongs to run {}, this node to run {own}: a parent of another run is \
                         refused (restart this node to join that run)",
                        w.parent_id, w.run_id
                    )));
                }
                tracing::info!(parent = %parent, parent_id = %w.parent_id, run = %w.run_id, "attached to parent");
                sessions.last_parent = w.parent_id;
            }
            Ok(_) => return Err(lost(false, "parent did not answer with a welcome".into())),
            Err(s) => {
                return Err(match is_refusal(s.code()) {
                    true => SessionEnd::Refused(s.message().to_string()),
                    false => lost(false, s.message().to_string()),
                });
            }
        }
        sessions.current += 1;
        if self
            .inputs
            .send(Input::Parent(ParentEvent::Attached))
            .await
            .is_err()
        {
            return Ok(());
        }
        let (back_tx, mut back) = tokio::sync::oneshot::channel::<()>();
        let watch = match (preferred, self.return_after) {
            (Some(addr), Some(hold)) => Some(tokio::spawn(watch_preferred(
                addr,
                self.tls.is_some(),
                hold,
                back_tx,
            ))),
            _ => None,
        };
        let _watch = AbortOnDrop(watch);
        loop {
            if pending.is_none() {
                *pending = sessions.again.pop_front();
            }
            if let Some(msg) = pending.take() {
                // A copy of every packet, kept until the root has closed its round: what the parent takes may
                // die with it.
                let copy = match &msg.msg {
                    Some(up_message::Msg::Envelope(env)) => Some(env.clone()),
                    _ => None,
                };
                if let Err(e) = tx.send(msg).await {
                    *pending = Some(e.0);
                    return Err(lost(true, "parent stream closed".into()));
                }
                if let Some(env) = copy {
                    sessions.kept.keep(sessions.current, env);
                }
                if !sessions.again.is_empty() {
                    continue;
                }
            }
            tokio::select! {
                out = self.outbound.recv() => match out {
                    Some(msg) => {
                        if superseded > 0 {
                            superseded -= 1;
                            if is_own_count(&msg, &own_id) {
                                continue;
                            }
                        }
                        if let Some(up_message::Msg::Envelope(e)) = &msg.msg {
                            tracing::debug!(target: crate::LATENCY, node = %self.hello.borrow().node_id, round = e.round,
                                phase = e.phase, first_dump_ns = e.first_dump_unix_ns, at_ns = crate::node::unix_ns(),
                                "packet out");
                        }
                        *pending = Some(msg)
                    }
                    None => {
                        // The node ended. Ending the up stream lets the parent read everything sent before; it then
                        // ends the down stream, and only then is it certain that nothing was cut off.
                        drop(tx);
                        let drained = async { while let Ok(Some(_)) = inbound.message().await {} };
                        if tokio::time::timeout(CLOSE_TIMEOUT, drained).await.is_err() {
                            tracing::warn!(parent = %parent, "parent did not end the stream after this node's last message");
                        }
                        return Ok(());
                    }
                },
                Ok(()) = &mut back, if pending.is_none() => {
                    // Between two messages: what was sent is read by this parent before the stream ends.
                    tracing::info!(parent = %parent, preferred = %self.parents[0],
                        "going back to the preferred parent, healthy again");
                    drop(tx);
                    let drained = async { while let Ok(Some(_)) = inbound.message().await {} };
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, drained).await;
                    return Err(SessionEnd::Return);
                }
                down = inbound.message() => match down {
                    Ok(Some(DownMessage { msg: Some(down_message::Msg::Resend(resend)) })) => {
                        let again = sessions.kept.resend(sessions.current, &resend);
                        tracing::debug!(parent = %parent, session = sessions.current,
                            again = ?again.iter().map(|e| (e.stream_id, e.round, e.phase)).collect::<Vec<_>>(),
                            "packets sent again");
                        match resend.lost == own_id {
                            true => tracing::info!(parent = %parent, packets = again.len(),
                                "back with the same parent: sending again what it does not hold"),
                            false => tracing::info!(parent = %parent, lost = %resend.lost, packets = again.len(),
                                "adopted: sending again what the lost node had not passed on"),
                        }
                        sessions.again.extend(again.into_iter().map(|env| UpMessage {
                            msg: Some(up_message::Msg::Envelope(env)),
                        }));
                    }
                    Ok(Some(DownMessage { msg: Some(msg) })) => {
                        if let down_message::Msg::Credit(c) = &msg && c.closed_below > 0 {
                            sessions.kept.release(sessions.current, c.closed_below, c.taken);
                        }
                        if self.inputs.send(Input::Parent(ParentEvent::Message(msg))).await.is_err() {
                            return Ok(());
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => return Err(lost(true, "parent closed the stream".into())),
                    Err(s) => return Err(lost(true, format!("{}: {}", s.code(), s.message()))),
                }
            }
        }
    }
}

/// How often an adopted node checks whether its preferred parent answers.
const PREFERRED_CHECK: Duration = Duration::from_secs(1);

/// Aborts a task when dropped: the preferred parent is watched for as long as the session lasts.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}

/// Says on `back` once the parent at `addr` has answered every check for `hold` without a break.
async fn watch_preferred(addr: String, tls: bool, hold: Duration, back: tokio::sync::oneshot::Sender<()>) {
    let mut since: Option<tokio::time::Instant> = None;
    let mut tick = tokio::time::interval(PREFERRED_CHECK);
    loop {
        tick.tick().await;
        if !answers(&addr, tls).await {
            since = None;
            continue;
        }
        let now = tokio::time::Instant::now();
        if now.duration_since(*since.get_or_insert(now)) >= hold {
            let _ = back.send(());
            return;
        }
    }
}

/// Whether a process serves at `addr`, not just its kernel: a stopped process's port still accepts connections,
/// but nothing answers on them. Over TLS the server's first handshake message, in plaintext its HTTP/2 settings
/// frame, must come within a second.
async fn answers(addr: &str, tls: bool) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let hello: &[u8] = match tls {
            // A TLS 1.2 ClientHello record's header is enough to make a live TLS server answer with an alert.
            true => &[0x16, 0x03, 0x01, 0x00, 0x00],
            false => b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
        };
        s.write_all(hello).await.ok()?;
        let mut buf = [0u8; 9];
        let n = s.read(&mut buf).await.ok()?;
        // An answer, or the connection closed by the server process itself (a TLS server refusing the record).
        Some(n > 0 || tls)
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), probe).await,
        Ok(Some(true))
    )
}

/// Whether `msg` is node `id`'s report of its own count of ranks (an event about a child names the child's parent).
fn is_own_count(msg: &UpMessage, id: &str) -> bool {
    matches!(&msg.msg, Some(up_message::Msg::NodeEvent(ev))
        if ev.node_id == id && ev.parent_id.is_empty() && ev.state == canopy_proto::v1::NodeState::Attached as i32)
}

enum SessionEnd {
    Refused(String),
    Lost {
        attached: bool,
        reason: String,
    },
    /// The session was ended to go back to the preferred parent, which answered for the hold-down time.
    Return,
}

pub use canopy_runtime::tls_hint::error_chain;
