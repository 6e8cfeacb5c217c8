//! The tree's messages, as a node takes them: a child's `Tree/Attach` request body (gRPC's length-prefixed
//! `UpMessage`s: its hello, then names, envelopes, node events, status, fin) through the parent's
//! `TreeService` (the hello's checks, the window's hold) into a relay's or the root's node; and the
//! `DownMessage`s a parent sends (streams opened and closed, control, packets coming down, credit) into a
//! leaf's or a relay's node.
//!
//! Each input runs a real node on a current-thread runtime with in-process filters (a cheap echo, and the
//! stats and histogram filters through their Rust API), until what it was given is handled. Time does not
//! move: the round time-outs never fire, so a round closes when its children have delivered.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use canopy_core::filter::{FilterError, FilterFactory, FilterInstance, Level, Output, Packet};
use canopy_core::node::{
    ChildEvent, Input, LeafOptions, Node, NodeConfig, NodeHandles, ParentEvent, RankEvent, Relay, RoleConfig,
    RootOptions, RootSink, RoundResult, StreamState, Up,
};
use canopy_core::transport::TreeService;
use canopy_filter_test::Collect;
use canopy_proto::MAX_MESSAGE_BYTES;
use canopy_proto::v1::tree_server::Tree;
use canopy_proto::v1::{
    DownMessage, Hello, NodeKind, OpenStream, StreamSpec, SyncMode, UpMessage, down_message, up_message,
};
use futures_like::BoxFuture;
use tokio::sync::mpsc;
use tonic::codec::Codec;

use crate::input::Input as Bytes_;

/// `futures::future::BoxFuture`, without the dependency.
mod futures_like {
    pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;
}

/// Scheduler turns an input may take to be handled; a child whose packets wait for a window that will not
/// move (time stands still) stops there.
const SETTLE: usize = 4000;

/// The filters a fuzzed stream may name.
const FILTERS: [&str; 3] = ["echo", "stats", "histogram"];

/// One byte picks the node's role (relay or root) and the stream's filter and sync mode; the rest is the body
/// of the child's Attach request.
pub fn tree_attach(data: &[u8]) {
    let mut input = Bytes_::new(data);
    let head = input.byte();
    let root = head & 1 == 1;
    let spec = spec_of(head >> 1);
    let body = Bytes::copy_from_slice(input.rest());
    run(async move {
        let handles = spawn_node(if root {
            Role::Root(spec.clone())
        } else {
            Role::Relay
        });
        if !root {
            open(&handles.inputs, spec).await;
        }
        let service = TreeService::new("n".into(), handles.inputs.clone(), handles.window.clone());
        let decoder = tonic_prost::ProstCodec::<UpMessage, UpMessage>::default().decoder();
        let body = http_body_util::Full::new(body);
        let request = tonic::codec::Streaming::new_request(decoder, body, None, Some(MAX_MESSAGE_BYTES));
        match service.attach(tonic::Request::new(request)).await {
            // The down stream ends once the child's stream is read to its end and the node has let it go.
            Ok(response) => {
                let mut down = response.into_inner();
                settle(async move { while tokio_stream::StreamExt::next(&mut down).await.is_some() {} })
                    .await;
            }
            Err(status) => {
                let _ = status.message();
            }
        }
    });
}

/// One byte picks the node's role (leaf or relay); the rest is a sequence of length-delimited `DownMessage`s
/// from its parent. A leaf has one rank that dumps a round after each message; a relay has one child.
pub fn tree_down(data: &[u8]) {
    let mut input = Bytes_::new(data);
    let leaf = input.byte() & 1 == 1;
    let mut rest = input.rest();
    let mut msgs = Vec::new();
    while !rest.is_empty() && msgs.len() < 64 {
        match <DownMessage as prost::Message>::decode_length_delimited(&mut rest) {
            Ok(m) => msgs.push(m),
            Err(_) => break,
        }
    }
    run(async move {
        let (control_tx, mut control_rx) = mpsc::channel(1024);
        tokio::spawn(async move { while control_rx.recv().await.is_some() {} });
        let role = if leaf {
            Role::Leaf(LeafOptions {
                control: control_tx,
                hold_dumps: 4,
                hold_bytes: 1 << 20,
                sampler: None,
            })
        } else {
            Role::Relay
        };
        let handles = spawn_node(role);
        let inputs = handles.inputs.clone();
        let _ = inputs.send(Input::Parent(ParentEvent::Attached)).await;
        let source = canopy_core::node::rank_source("a", 0);
        if leaf {
            let attached = RankEvent::Attached {
                source: source.clone(),
                from: 0,
                announced: 1,
            };
            let _ = inputs.send(Input::Ranks(vec![attached])).await;
        } else {
            let (tx, mut rx) = mpsc::channel(1024);
            tokio::spawn(async move { while rx.recv().await.is_some() {} });
            let hello = Hello {
                node_id: "child".into(),
                kind: NodeKind::Agent as i32,
                ranks_below: 2,
                protocol_version: canopy_proto::PROTOCOL_VERSION,
                ..Default::default()
            };
            let attached = ChildEvent::Attached {
                conn: 1,
                hello,
                peer: "child".into(),
                tx,
            };
            let _ = inputs.send(Input::Child(attached)).await;
        }
        for (round, msg) in msgs.into_iter().enumerate() {
            if let Some(msg) = msg.msg {
                let _ = inputs.send(Input::Parent(ParentEvent::Message(msg))).await;
            }
            if leaf {
                let dump = RankEvent::Round {
                    source: source.clone(),
                    rank: 0,
                    round: round as u64,
                    dump_unix_ns: 1,
                    profile: Ok(canopy_filter_test::one_event_profile(0, 1.0 + round as f64).into()),
                };
                let _ = inputs.send(Input::Ranks(vec![dump])).await;
            }
        }
        // Handled once the node's queue is empty and stays so.
        settle(async move {
            loop {
                tokio::task::yield_now().await;
                if inputs.capacity() == inputs.max_capacity() {
                    for _ in 0..16 {
                        tokio::task::yield_now().await;
                    }
                    if inputs.capacity() == inputs.max_capacity() {
                        return;
                    }
                }
            }
        })
        .await;
        drop(handles);
    });
}

/// A stream on filter `FILTERS[b % 3]`, waiting for all its children or not.
fn spec_of(b: u8) -> StreamSpec {
    let sync = if b & 4 == 0 {
        SyncMode::WaitForAll
    } else {
        SyncMode::DontWait
    };
    StreamSpec {
        stream_id: 1,
        name: "s".into(),
        filter: FILTERS[usize::from(b & 3) % FILTERS.len()].into(),
        params: String::new(),
        sync_mode: sync as i32,
        timeout_ms: 100,
        ..Default::default()
    }
}

enum Role {
    Leaf(LeafOptions),
    Relay,
    Root(StreamSpec),
}

/// The node of `role`, running on the current runtime until it ends.
fn spawn_node(role: Role) -> NodeHandles {
    match role {
        Role::Leaf(opts) => spawn(NodeKind::Agent, opts),
        Role::Relay => spawn(NodeKind::Relay, Relay),
        Role::Root(spec) => spawn(
            NodeKind::Frontend,
            RootOptions {
                expect_ranks: 0,
                start_timeout: None,
                streams: vec![spec],
                closed_below: Vec::new(),
                resume_ranks: 0,
                resume_wait: std::time::Duration::ZERO,
                first_free_stream_id: 0,
                exit_on_fin: true,
                drain_timeout: Duration::from_secs(1),
                sink: Box::new(Discard),
            },
        ),
    }
}

fn spawn<R: RoleConfig>(kind: NodeKind, role: R) -> NodeHandles {
    let config = NodeConfig {
        node_id: "n".into(),
        kind,
        filters: Arc::new(Filters),
        max_rounds_in_flight: 8,
        status_interval: Duration::from_secs(3600),
    };
    let (node, handles) = Node::new(config, role, Discard);
    tokio::spawn(node.run(std::future::pending()));
    handles
}

/// Opens a stream at a relay, as its parent would.
async fn open(inputs: &mpsc::Sender<Input>, spec: StreamSpec) {
    let _ = inputs.send(Input::Parent(ParentEvent::Attached)).await;
    let open = down_message::Msg::OpenStream(OpenStream { spec: Some(spec) });
    let _ = inputs.send(Input::Parent(ParentEvent::Message(open))).await;
}

/// Runs one input on a runtime of its own: whatever it left waiting goes with the runtime.
fn run(f: impl Future<Output = ()>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime");
    rt.block_on(f);
}

/// Runs `f` for at most [`SETTLE`] turns of the scheduler.
async fn settle(f: impl Future<Output = ()>) {
    tokio::pin!(f);
    for _ in 0..SETTLE {
        tokio::select! {
            biased;
            () = &mut f => return,
            () = tokio::task::yield_now() => {}
        }
    }
}

/// The way up, and the root's store: takes everything, keeps nothing.
struct Discard;

impl Up for Discard {
    async fn send(&mut self, msg: up_message::Msg) {
        drop(msg);
    }
}

impl RootSink for Discard {
    fn result(&mut self, result: RoundResult) -> BoxFuture<'_, ()> {
        drop(result);
        Box::pin(async {})
    }

    fn stream_state<'a>(
        &'a mut self,
        _spec: &'a StreamSpec,
        _state: StreamState,
        _failure: Option<&'a str>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    fn recount(&mut self, recount: canopy_core::node::Recount) -> BoxFuture<'_, ()> {
        drop(recount);
        Box::pin(async {})
    }

    fn flush(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

struct Filters;

impl FilterFactory for Filters {
    fn create(&self, name: &str, params: &str, level: Level) -> Result<Box<dyn FilterInstance>, FilterError> {
        let level = match level {
            Level::Leaf => canopy_filter_sdk::Level::Leaf,
            Level::Relay => canopy_filter_sdk::Level::Relay,
            Level::Root => canopy_filter_sdk::Level::Root,
        };
        match name {
            "echo" => Ok(Box::new(Echo)),
            "stats" => sdk::<canopy_filter_stats::StatsFilter>(params, level),
            "histogram" => sdk::<canopy_filter_histogram::HistogramFilter>(params, level),
            _ => Err(FilterError::Unknown {
                name: name.into(),
                available: FILTERS.join(", "),
                suggestion: None,
            }),
        }
    }

    fn names(&self) -> Vec<String> {
        FILTERS.map(String::from).to_vec()
    }
}

/// Sends up what it is given, concatenated (at most 4 KiB), and rejects an input that starts with 0xEE.
struct Echo;

impl FilterInstance for Echo {
    fn upstream(&mut self, _round: u64, phase: u32, inputs: &[&[u8]]) -> Result<Output, FilterError> {
        let mut out = Output::default();
        let mut payload = Vec::new();
        for (i, input) in inputs.iter().enumerate() {
            if input.first() == Some(&0xEE) {
                out.rejected.push((i, "starts with 0xEE".into()));
            } else {
                payload.extend_from_slice(&input[..input.len().min(4096 - payload.len().min(4096))]);
            }
        }
        out.up.push(Packet { phase, payload });
        Ok(out)
    }

    fn downstream(&mut self, _round: u64, phase: u32, packet: &[u8]) -> Result<Output, FilterError> {
        Ok(Output {
            down: vec![Packet {
                phase,
                payload: packet.to_vec(),
            }],
            ..Default::default()
        })
    }

    fn finalize(&mut self, _round: u64, _phase: u32, payload: &[u8]) -> Result<Vec<u8>, FilterError> {
        Ok(payload.to_vec())
    }
}

/// A filter of the plugin SDK, called in process as the plugin host would call it.
struct Sdk<F>(F);

fn sdk<F: canopy_filter_sdk::Filter + Sync>(
    params: &str,
    level: canopy_filter_sdk::Level,
) -> Result<Box<dyn FilterInstance>, FilterError> {
    F::create(params, level)
        .map(|f| Box::new(Sdk(f)) as Box<dyn FilterInstance>)
        .map_err(|reason| FilterError::BadParams {
            filter: F::NAME.into(),
            reason,
        })
}

fn output(c: Collect) -> Output {
    let packets = |v: Vec<(u32, Vec<u8>)>| {
        v.into_iter()
            .map(|(phase, payload)| Packet { phase, payload })
            .collect()
    };
    Output {
        up: packets(c.up),
        down: packets(c.down),
        rejected: c.rejects,
    }
}

impl<F: canopy_filter_sdk::Filter + Sync> FilterInstance for Sdk<F> {
    fn upstream(&mut self, round: u64, phase: u32, inputs: &[&[u8]]) -> Result<Output, FilterError> {
        let mut c = Collect::default();
        self.0
            .upstream(round, phase, inputs, &mut c)
            .map_err(|reason| failed::<F>(reason))?;
        Ok(output(c))
    }

    fn downstream(&mut self, round: u64, phase: u32, packet: &[u8]) -> Result<Output, FilterError> {
        let mut c = Collect::default();
        self.0
            .downstream(round, phase, packet, &mut c)
            .map_err(|reason| failed::<F>(reason))?;
        Ok(output(c))
    }

    fn finalize(&mut self, round: u64, phase: u32, payload: &[u8]) -> Result<Vec<u8>, FilterError> {
        self.0
            .finalize(round, phase, payload)
            .map_err(|reason| failed::<F>(reason))
    }

    fn names(&mut self, names: &[(u64, String)]) {
        let names: Vec<(u64, &str)> = names.iter().map(|(id, n)| (*id, n.as_str())).collect();
        self.0.names(&names);
    }

    fn phases(&self) -> u32 {
        F::PHASES
    }
}

fn failed<F: canopy_filter_sdk::Filter>(reason: String) -> FilterError {
    FilterError::Failed {
        filter: F::NAME.into(),
        reason,
    }
}

/// The body of an Attach request: each message as gRPC frames it (no compression, a 4-byte length).
pub fn grpc_body(msgs: &[UpMessage]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in msgs {
        let bytes = prost::Message::encode_to_vec(m);
        out.push(0);
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(&bytes);
    }
    out
}
