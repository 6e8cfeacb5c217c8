//! The tree transport: the parent's side of `canopy.v1.Tree/Attach` (a tonic service that turns each child's
//! stream into node inputs) and the child's side (a link that attaches to the parent and re-attaches after a
//! failure).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use canopy_proto::v1::tree_server::Tree;
use canopy_proto::v1::{DownMessage, Hello, UpMessage, Welcome, down_message, up_message};
use canopy_proto::{MAX_RANKS, PROTOCOL_VERSION};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::node::{ChildEvent, ChildSender, Input};
use crate::run::RunId;
use crate::window::WindowGate;

mod held;
pub(crate) mod kept;
mod parent;
use held::Held;
pub use parent::ParentLink;

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
