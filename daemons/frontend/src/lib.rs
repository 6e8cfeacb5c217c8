//! Canopy's front-end: the root of the tree. It opens the streams, finalizes every round, writes the results
//! into the run's SQLite store, and serves `canopy.v1.Tree`, gRPC health and server reflection on one port.

#![forbid(unsafe_code)]

pub mod api;
pub mod app_metrics;
pub mod auto_detail;
pub mod config;
pub mod error;
pub mod kafka;
pub mod reflection;
pub mod resume;
pub mod selection;
mod sink;
pub mod state;
mod subscription;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use canopy_core::assembly::Assembly;
use canopy_core::node::{Node, NodeError, Root, RootHandle, RootOptions};
use canopy_core::transport::TreeService;
use canopy_proto::v1::{NodeKind, StreamSpec};
use canopy_runtime::ready::Ready;
use canopy_store::{Store, StoreError, Writer, WriterThread};
use state::State;

pub use config::{FrontendConfig, StreamParams};
use sink::{Committed, StoreUp};

pub use canopy_store::RunSummary;

#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("server failed: {0}")]
    Server(#[from] tonic::transport::Error),
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("TLS: {0}")]
    Tls(#[from] canopy_runtime::tls::TlsError),
    #[error("token file: {0}")]
    Tokens(#[from] canopy_runtime::auth::TokenFileError),
    #[error("Kafka export: {0}")]
    Kafka(String),
}

impl canopy_runtime::daemon::IsRefusal for FrontendError {
    fn is_refusal(&self) -> bool {
        false
    }
}

/// A front-end bound to its port, its store created and its root node built, ready to run.
pub struct Frontend {
    config: FrontendConfig,
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    store_path: PathBuf,
    node: Node<StoreUp, Root>,
    handles: canopy_core::node::NodeHandles,
    shared: Arc<State>,
    assembly: Assembly,
    writer: WriterThread,
    gate: canopy_runtime::auth::Gate,
    /// The streams of the configuration, opened at start.
    opened: Vec<StreamSpec>,
    /// The run's id, which the tree's nodes carry.
    run: canopy_core::run::RunId,
    /// Set when continuing a crashed run: the first child tells it from a new tree.
    resumed: Option<canopy_core::run::ResumeGate>,
    /// The application's latest rounds, for the metrics endpoint.
    app_metrics: Arc<app_metrics::AppMetrics>,
    /// Notified as each round is committed (the Kafka export reads the store from there).
    committed: Arc<tokio::sync::Notify>,
}

/// How a front-end's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Drained on `shutdown`, or at the application's end.
    Run,
    /// It was continuing a crashed run and a node of a new tree attached first: that run is ended, and a
    /// front-end bound now on the same `out` starts a new one.
    ForNewTree(String),
}

impl Frontend {
    pub async fn bind(config: FrontendConfig) -> Result<Self, FrontendError> {
        // Credentials and the port first: a front-end that cannot serve leaves no empty run behind.
        let assembly = Assembly::new("frontend", &config.common, || "frontend".into())?;
        let gate = gate(&assembly, config.token_file.as_deref())?;
        let listener = canopy_runtime::daemon::bind(&config.listen).await?;
        // The run an earlier front-end on this `out` did not end (it died) goes on in the same store.
        let prior = match config.resume {
            true => resume::unfinished_run(&config.out, Duration::from_secs(config.resume_within_s))?,
            false => None,
        };
        let (mut store, run_id) = resume::open_store(&config.out, prior.as_ref())?;
        tracing::info!(run = %run_id, "the tree's nodes carry this run id");
        let addr = listener.local_addr()?;
        let store_path = store.path().to_path_buf();
        record_frontend(&mut store, assembly.node_id(), addr)?;
        let plan = resume::plan(config.configured_streams(), prior.as_ref());
        resume::record(&mut store, &plan, prior.as_ref())?;
        let opened = plan.open.clone();
        let first_free_stream_id = prior
            .as_ref()
            .and_then(|p| p.streams.iter().map(|s| s.stream_id).max())
            .unwrap_or(0)
            .max(plan.open.iter().map(|s| s.stream_id).max().unwrap_or(0))
            + 1;
        let filters = assembly.filters();
        let shared = State::new(config.subscriber_buffer);
        // Subscribers see a result once it is committed: one that reads the store and then follows the live
        // results misses nothing in between.
        let retry_bytes = match config.store_retry_mb {
            0 => canopy_runtime::memory::share(config.common.memory_budget_mb),
            mb => mb << 20,
        };
        let app_metrics = Arc::new(app_metrics::AppMetrics::new(config.metrics_top_events));
        let committed = Arc::new(tokio::sync::Notify::new());
        let (store_tx, writer) = Writer::spawn_with(store, 1024, retry_bytes, {
            let (shared, app_metrics, committed) = (shared.clone(), app_metrics.clone(), committed.clone());
            move |Committed(r)| {
                app_metrics.note(&r, &shared.result_type(r.stream.stream_id));
                let _ = shared.live.send(r);
                committed.notify_one();
            }
        })?;
        let up = StoreUp {
            writer: store_tx,
            filters: filters.clone(),
            shared: shared.clone(),
            app_metrics: app_metrics.clone(),
        };
        let role = RootOptions {
            expect_ranks: config.expect_ranks,
            start_timeout: (config.start_timeout_ms > 0)
                .then(|| Duration::from_millis(config.start_timeout_ms)),
            streams: opened.clone(),
            closed_below: plan.closed_below,
            // A restart waits for the ranks its run expected, as long as the start would for announced ones.
            resume_ranks: prior.as_ref().map_or(0, |p| p.expected_ranks),
            resume_wait: Duration::from_millis(
                config.start_timeout_ms.max(u64::from(config.stream_timeout_ms)),
            ),
            first_free_stream_id,
            exit_on_fin: config.exit_on_fin,
            drain_timeout: Duration::from_millis(config.drain_timeout_ms),
            sink: Box::new(up.clone()),
        };
        let (node, handles) = assembly.node(NodeKind::Frontend, role, config.max_rounds_in_flight, up);
        Ok(Self {
            config,
            listener,
            addr,
            store_path,
            node,
            handles,
            shared,
            assembly,
            writer,
            gate,
            opened,
            app_metrics,
            committed,
            resumed: prior
                .is_some()
                .then(|| canopy_core::run::ResumeGate::new(run_id.clone())),
            run: canopy_core::run::RunId::of_root(run_id),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The SQLite file this run writes.
    pub fn store_path(&self) -> PathBuf {
        self.store_path.clone()
    }

    /// Controls the tree from the root: start, stop, open and close streams.
    pub fn handle(&self) -> RootHandle {
        RootHandle::new(self.handles.inputs.clone())
    }

    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<Ended, FrontendError> {
        let Frontend {
            config,
            listener,
            addr,
            store_path,
            node,
            handles,
            shared,
            assembly,
            writer,
            gate,
            opened,
            run,
            resumed,
            app_metrics,
            committed,
        } = self;
        let filters = assembly.filters();
        let export = kafka::Export::start(&config, &store_path, committed)?;
        if let Some(triggers) = selection::Triggers::of(&config) {
            let root = RootHandle::new(handles.inputs.clone());
            selection::spawn(shared.clone(), root, store_path.clone(), triggers);
        }
        let tree = TreeService::new(
            assembly.node_id().to_string(),
            handles.inputs.clone(),
            handles.window.clone(),
        )
        .with_run(run);
        let tree = match &resumed {
            Some(gate) => tree.resuming(gate.clone()),
            None => tree,
        };
        // Server reflection knows every filter on the filter path (the API adds a filter's descriptors as its
        // stream opens).
        let (reflection, reflection_v1, reflection_alpha) = reflection::services(&known_filters(&filters))?;
        let api = api::FrontendApi {
            root: RootHandle::new(handles.inputs.clone()),
            shared: shared.clone(),
            filters: filters.clone(),
            store: store_path.clone(),
            reflection,
        };
        let api = canopy_proto::v1::frontend_server::FrontendServer::new(api)
            .max_encoding_message_size(canopy_proto::MAX_MESSAGE_BYTES);
        // A client certificate is asked for but not required: API clients may present a bearer token instead.
        let routes = tonic::service::Routes::new(tree.into_server())
            .add_service(api)
            .add_service(reflection_v1)
            .add_service(reflection_alpha);
        default_options(&config, &shared, &opened, &handles).await;
        let served = assembly
            .serve(routes, listener, config.max_connections, false, gate)
            .await?;
        let names = {
            let shared = shared.clone();
            move || shared.names_map()
        };
        let collectors = std::iter::once(app_metrics.collector(names))
            .chain(export.as_ref().map(kafka::Export::collector))
            .collect();
        let ready = Ready {
            store: Some(store_path.clone()),
            metrics: assembly.watch(&handles, collectors).await?,
            ..Ready::serving(addr)
        };
        if let Some(path) = &config.ready_file {
            ready.write(path)?;
        }
        tracing::info!(%addr, store = %store_path.display(), "front-end serving");
        canopy_runtime::notify::ready(&format!("serving on {addr}, store {}", store_path.display()));
        drop(handles);
        let result = node.run(stop_or_new_tree(shutdown, resumed.as_ref())).await;
        let new_tree = resumed
            .as_ref()
            .and_then(canopy_core::run::ResumeGate::new_tree_node);
        // Every result is out: subscriptions send what they hold and end with OK before the server stops. A
        // client behind by more than the connection's buffers still gets the run's last rounds; one that stopped
        // reading costs at most the subscriber drain.
        shared.end();
        let drain = Duration::from_millis(config.subscriber_drain_ms);
        shared
            .subscriptions_sent(tokio::time::Instant::now() + drain)
            .await;
        // A connection the server closed lingers until its client has read the last of it and closed it too.
        served.stop(tokio::time::Instant::now() + SERVER_STOP).await;
        close_store(writer, &store_path, result.is_ok(), new_tree.as_deref(), export).await?;
        tracing::info!(store = %store_path.display(), "front-end stopped");
        result?;
        Ok(new_tree.map_or(Ended::Run, Ended::ForNewTree))
    }
}

/// The modules every rank runs and the time rounds: options in force from the start, told to every child that
/// attaches. Queued before the server takes its first child, so the root records them before any attach or
/// Start: a child hears them first, and no rank dumps round 0 without them.
async fn default_options(
    config: &FrontendConfig,
    shared: &State,
    opened: &[StreamSpec],
    handles: &canopy_core::node::NodeHandles,
) {
    let mut utilization = false;
    for spec in opened {
        utilization |= shared.stream_filter(spec.stream_id, &spec.filter, true);
    }
    if !config.modules.is_empty() || utilization || config.time_rounds {
        shared.set_default_modules(config.modules.clone());
        shared.set_default_time_rounds(config.time_rounds);
        let options = shared.set_options(canopy_proto::v1::Options::default());
        RootHandle::new(handles.inputs.clone()).options(options).await;
    }
}

/// Who may call: with TLS, a peer with a node or client certificate, or a bearer token of `token_file`; on a
/// plaintext (loopback) port, anyone.
fn gate(
    assembly: &Assembly,
    token_file: Option<&std::path::Path>,
) -> Result<canopy_runtime::auth::Gate, FrontendError> {
    use canopy_runtime::auth::{Gate, Tokens};
    Ok(match (assembly.tls(), token_file) {
        (None, _) => Gate::open(),
        (Some(_), None) => Gate::new(Default::default()),
        (Some(_), Some(path)) => Gate::new(Tokens::load(path)?),
    })
}

/// The front-end itself in the run's store: its address and id, and its node attached.
fn record_frontend(store: &mut Store, node_id: &str, addr: SocketAddr) -> Result<(), FrontendError> {
    store.set_meta("frontend_addr", &addr.to_string())?;
    store.set_meta("node_id", node_id)?;
    store.put_node(&canopy_proto::v1::NodeEvent {
        node_id: node_id.to_string(),
        kind: NodeKind::Frontend as i32,
        state: canopy_proto::v1::NodeState::Attached as i32,
        address: addr.to_string(),
        ..Default::default()
    })?;
    Ok(())
}

/// `shutdown`, or, continuing a crashed run (`resumed`), a node of a new tree attaching first: that run ends.
async fn stop_or_new_tree(
    shutdown: impl Future<Output = ()>,
    resumed: Option<&canopy_core::run::ResumeGate>,
) {
    let new_tree = async {
        match resumed {
            Some(gate) => gate.new_tree().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = shutdown => {}
        node = new_tree => tracing::warn!(node = %node,
            "a node of a new tree attached first while this front-end was continuing a crashed run: \
             that run ends here, and a new run starts in a new store"),
    }
}

/// The store after the node: the writer drains its queue (the node's way up, dropped with it, was its input)
/// and ends; a run that ended well is marked ended (and why, when a new tree took the port), so a front-end
/// started on this `out` later begins a new one; the export sends what is left, and its connections closed,
/// the store leaves WAL mode, as a store the front-end alone wrote does.
async fn close_store(
    writer: WriterThread,
    store_path: &std::path::Path,
    ended_well: bool,
    new_tree: Option<&str>,
    export: Option<kafka::Export>,
) -> Result<(), FrontendError> {
    let _ = tokio::task::spawn_blocking(move || writer.join()).await;
    if ended_well {
        let mut store = Store::open(store_path)?;
        if let Some(node) = new_tree {
            store.set_meta(ENDED_BY, &format!("a new tree attached first ({node})"))?;
        }
        store.end_run(canopy_core::node::unix_ns() as i64)?;
    }
    if let Some(export) = export {
        export.finish().await;
        drop(Store::open(store_path)?);
    }
    Ok(())
}

/// How long the front-end, its run over and its subscriptions sent, waits for its server to stop and its clients
/// to close their connections.
const SERVER_STOP: Duration = Duration::from_secs(2);

/// Every filter on the filter path at start, with the descriptors it exports: server reflection knows every
/// service on the port and these filters' result types, so `grpcurl list`, `describe` and typed JSON of any
/// result need no proto files (a filter loaded later is added as its stream opens).
fn known_filters(filters: &canopy_core::plugin::PluginFilters) -> Vec<(String, Vec<u8>)> {
    use canopy_core::filter::FilterFactory;
    filters
        .names()
        .into_iter()
        .filter_map(|name| {
            let info = filters.info(&name).ok()?;
            Some((name, info.descriptors))
        })
        .collect()
}

/// `meta` key: why a run ended other than by its front-end's shutdown or the application's end.
pub const ENDED_BY: &str = "ended_by";

/// Runs a front-end until `shutdown` completes (then drains the tree) or, with `exit_on_fin`, the run ends. A
/// crashed run it was continuing that turns out to face a new tree ends, and a new run starts on the same port.
pub async fn run(
    config: FrontendConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), FrontendError> {
    use futures::FutureExt;
    let shutdown = shutdown.shared();
    loop {
        match Frontend::bind(config.clone())
            .await?
            .run(shutdown.clone())
            .await?
        {
            Ended::Run => return Ok(()),
            Ended::ForNewTree(node) => {
                tracing::info!(%node, "starting a new run for the new tree")
            }
        }
    }
}
