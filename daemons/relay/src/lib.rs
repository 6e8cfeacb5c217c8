//! Canopy's relay: an interior node of the tree. It attaches to its parent, serves `canopy.v1.Tree` to its
//! children, and merges their rounds through each stream's filter.

#![forbid(unsafe_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use canopy_core::node::{Node, NodeConfig, NodeError, ParentUp, RoleConfig};
use canopy_core::transport::{ParentLink, TreeService};
use canopy_proto::v1::NodeKind;
use canopy_runtime::config::{CheckConfig, ConfigIssue, LogFormat, check_addr};
use serde::{Deserialize, Serialize};

/// The relay's configuration (`[relay]` in canopy.toml, `CANOPY_RELAY_*`, and a `--kebab-case` flag per key).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct RelayConfig {
    /// This node's id in the tree; unique among its parent's children. Default: relay@HOST:PORT.
    #[arg(long)]
    pub node_id: String,
    /// The parent's address (a relay or the front-end), host:port; more, separated by commas, are the parents
    /// that adopt this node, in order, when its parent is lost.
    #[arg(long)]
    pub parent: String,
    /// Adopted by another parent of `parent`'s list, go back to the first once it has answered for this many
    /// seconds without a break (what was sent to the adopter is in its rounds, or late with its data); 0: stay.
    #[arg(long)]
    pub return_after_s: u64,
    /// Where children attach, ip:port (port 0 picks a free port).
    #[arg(long)]
    pub listen: String,
    /// Rounds that may be open at once before children are made to wait.
    #[arg(long)]
    pub max_rounds_in_flight: u64,
    /// Serve Prometheus metrics (`/metrics`) and a health check (`/health`) over HTTP at this ip:port (port 0
    /// picks a free one). Empty: no endpoint. Plain HTTP and read-only: bind it to a management network.
    #[arg(long)]
    pub metrics_listen: String,
    /// Log lines as text or as one JSON object each.
    #[arg(long, value_enum)]
    pub log_format: LogFormat,
    /// Threads that run the daemon's tasks. One (the default) hands a message from task to task on the same
    /// thread, with no wake-up of another; more let a node with many children or clients use more cores.
    #[arg(long)]
    pub worker_threads: usize,
    /// The memory this daemon may use, in MiB: the buffers that grow with load (the copies of what it sent up,
    /// kept until the root has them; at the front-end, rounds its store could not write yet) each take a quarter
    /// at most, and a resident size past it is logged.
    #[arg(long)]
    pub memory_budget_mb: u64,
    /// Directories searched for filter plugins (libcanopy_filter_<name>.so), in order; colon-separated as a
    /// flag. Empty: the directory of the running executable, PREFIX/lib/canopy/filters and
    /// PREFIX/lib64/canopy/filters beside its bin/, then /usr/lib/canopy/filters and /usr/lib64/canopy/filters.
    #[arg(long, value_delimiter = ':')]
    pub filter_path: Vec<PathBuf>,
    /// Milliseconds one call into a contained filter may run before the watchdog fails its stream (and only it);
    /// an inline call past it is logged as holding the node.
    #[arg(long)]
    pub filter_call_timeout_ms: u64,
    /// Filters run inline, on the node's own task; every other one runs contained, on a thread per stream, where
    /// a hang fails only its stream. Inline saves a hand-off between threads per call, but a hang holds the node.
    /// Default: the filters Canopy ships. Comma-separated as a flag; empty: every filter contained.
    #[arg(long, value_delimiter = ',')]
    pub inline_filters: Vec<String>,
    /// Written with the bound address once the relay serves (for launchers using port 0).
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Connections this node's port keeps open at once; more are closed as they come.
    #[arg(long)]
    pub max_connections: usize,
    /// PEM file of the CA every certificate of the tree chains to (`canopy certs` makes one).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// PEM file of this node's certificate (its names include canopy-node).
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM file of this node's private key (not readable by other users).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Plaintext instead of TLS: allowed on loopback addresses only.
    #[arg(long)]
    pub insecure: bool,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            node_id: String::new(),
            parent: "127.0.0.1:7400".into(),
            return_after_s: 30,
            listen: "0.0.0.0:7401".into(),
            max_rounds_in_flight: 64,
            metrics_listen: String::new(),
            log_format: LogFormat::Text,
            worker_threads: canopy_runtime::daemon::DEFAULT_WORKER_THREADS,
            memory_budget_mb: canopy_runtime::memory::DEFAULT_MEMORY_BUDGET_MB,
            filter_path: Vec::new(),
            filter_call_timeout_ms: canopy_core::node::DEFAULT_FILTER_CALL_TIMEOUT.as_millis() as u64,
            inline_filters: canopy_core::plugin::BUNDLED_FILTERS
                .iter()
                .map(|f| f.to_string())
                .collect(),
            ready_file: None,
            max_connections: canopy_runtime::net::DEFAULT_MAX_CONNECTIONS,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            insecure: false,
        }
    }
}

impl RelayConfig {
    /// The TLS keys, as the runtime checks and loads them.
    pub fn tls(&self) -> canopy_runtime::tls::TlsFiles {
        canopy_runtime::tls::TlsFiles {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            insecure: self.insecure,
        }
    }
}

impl canopy_runtime::daemon::DaemonConfig for RelayConfig {
    fn log_format(&self) -> LogFormat {
        self.log_format
    }
    fn node_id(&self) -> &str {
        &self.node_id
    }
    fn worker_threads(&self) -> usize {
        self.worker_threads
    }
    fn memory_budget_mb(&self) -> u64 {
        self.memory_budget_mb
    }
}

impl CheckConfig for RelayConfig {
    fn check(&self) -> Result<(), ConfigIssue> {
        canopy_runtime::daemon::check_worker_threads(self.worker_threads)?;
        canopy_runtime::memory::check(self.memory_budget_mb)?;
        if !(10..=3_600_000).contains(&self.filter_call_timeout_ms) {
            return Err(ConfigIssue::new(
                "filter_call_timeout_ms",
                "must be between 10 and 3600000 (an hour)",
            ));
        }
        canopy_runtime::config::check_parents("parent", &self.parent)?;
        check_addr("listen", &self.listen)?;
        if !self.metrics_listen.is_empty() {
            check_addr("metrics_listen", &self.metrics_listen)?;
        }
        if self.max_connections == 0 {
            return Err(ConfigIssue::new("max_connections", "must be at least 1"));
        }
        if self.max_rounds_in_flight == 0 {
            return Err(ConfigIssue::new("max_rounds_in_flight", "must be at least 1"));
        }
        // Last: a wrong value elsewhere is the more useful message.
        let mut addrs = vec![("listen", self.listen.as_str())];
        let parents = canopy_runtime::config::parents(&self.parent);
        addrs.extend(parents.iter().map(|p| ("parent", p.as_str())));
        self.tls().check(&addrs)?;
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("tree server failed: {0}")]
    Server(#[from] tonic::transport::Error),
    #[error("TLS: {0}")]
    Tls(#[from] canopy_runtime::tls::TlsError),
}

impl canopy_runtime::daemon::IsRefusal for RelayError {
    fn is_refusal(&self) -> bool {
        matches!(self, RelayError::Node(NodeError::Refused(_)))
    }
}

/// How often the relay's node reports its figures (up the tree, to the metrics endpoint and the watchdog).
const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// A relay bound to its port, ready to run.
pub struct Relay {
    config: RelayConfig,
    tls: Option<canopy_runtime::tls::Tls>,
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
}

impl Relay {
    pub async fn bind(config: RelayConfig) -> Result<Self, RelayError> {
        let tls = config.tls().load()?;
        let listener = canopy_runtime::daemon::bind(&config.listen).await?;
        let addr = listener.local_addr()?;
        Ok(Self {
            config,
            tls,
            listener,
            addr,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), RelayError> {
        let Relay {
            config,
            tls,
            listener,
            addr,
        } = self;
        let node_id = if config.node_id.is_empty() {
            canopy_runtime::daemon::default_node_id("relay", &addr.port().to_string())
        } else {
            config.node_id.clone()
        };
        canopy_runtime::telemetry::set_node("relay", &node_id);
        let (up_tx, up_rx) = tokio::sync::mpsc::channel(256);
        let node_config = NodeConfig {
            node_id: node_id.clone(),
            kind: NodeKind::Relay,
            filters: canopy_core::plugin::filters_from(&config.filter_path),
            max_rounds_in_flight: config.max_rounds_in_flight,
            role: RoleConfig::Relay,
            status_interval: STATUS_INTERVAL,
        };
        let (mut node, handles) = Node::new(node_config, ParentUp { tx: up_tx });
        if !config.metrics_listen.is_empty() {
            canopy_core::metrics::spawn(
                &config.metrics_listen,
                &node_id,
                handles.snapshot.clone(),
                Vec::new(),
            )
            .await?;
        }
        tokio::spawn(canopy_runtime::notify::watchdog(
            handles.snapshot.clone(),
            STATUS_INTERVAL,
        ));
        node.set_listen_addr(advertised(addr));
        node.set_filter_call_timeout(Duration::from_millis(config.filter_call_timeout_ms));
        node.set_inline_filters(&config.inline_filters);
        // The run this relay belongs to: learnt from its parent, given to its children.
        let run = canopy_core::run::RunId::default();
        let link = ParentLink {
            parents: canopy_runtime::config::parents(&config.parent),
            hello: handles.hello.clone(),
            outbound: up_rx,
            inputs: handles.inputs.clone(),
            tls: tls.as_ref().map(|t| t.client()),
            run: run.clone(),
            return_after: (config.return_after_s > 0).then(|| Duration::from_secs(config.return_after_s)),
            kept_bytes: canopy_runtime::memory::share(config.memory_budget_mb),
        };
        let mut link = tokio::spawn(link.run());
        let service =
            TreeService::new(node_id.clone(), handles.inputs.clone(), handles.window.clone()).with_run(run);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let limits = canopy_runtime::net::ListenLimits {
            max_connections: config.max_connections,
            ..Default::default()
        };
        // Only the tree's daemons call a relay: a peer without a node certificate cannot finish the handshake.
        let gate = match tls {
            Some(_) => canopy_runtime::auth::Gate::new(Default::default()),
            None => canopy_runtime::auth::Gate::open(),
        };
        // gRPC health for load balancers and probes: serving until the node finishes.
        let (health_reporter, health) = tonic_health::server::health_reporter();
        health_reporter
            .set_serving::<canopy_proto::v1::tree_server::TreeServer<TreeService>>()
            .await;
        let server = tokio::spawn(
            canopy_core::transport::server(tls.map(|t| t.server(true)), gate)?
                .add_service(service.into_server())
                .add_service(health)
                .serve_with_incoming_shutdown(canopy_runtime::net::incoming(listener, limits).0, async {
                    let _ = stop_rx.await;
                }),
        );
        if let Some(path) = &config.ready_file {
            canopy_runtime::ready::Ready::serving(addr).write(path)?;
        }
        tracing::info!(node = %node_id, %addr, parent = %config.parent, "relay serving");
        canopy_runtime::notify::ready(&format!("serving on {addr}, parent {}", config.parent));
        drop(handles);
        let result = node.run(shutdown).await;
        health_reporter
            .set_not_serving::<canopy_proto::v1::tree_server::TreeServer<TreeService>>()
            .await;
        let _ = stop_tx.send(());
        // The node's way up closed with it: the link delivers what it holds, then hangs up.
        if tokio::time::timeout(Duration::from_secs(5), &mut link)
            .await
            .is_err()
        {
            link.abort();
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
        result?;
        Ok(())
    }
}

/// Runs a relay until `shutdown` completes or the tree finishes.
pub async fn run(config: RelayConfig, shutdown: impl Future<Output = ()> + Send) -> Result<(), RelayError> {
    Relay::bind(config).await?.run(shutdown).await
}

/// The address children and the topology view should use: a wildcard bind is named by the host.
fn advertised(addr: SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        format!("{}:{}", canopy_runtime::net::hostname(), addr.port())
    } else {
        addr.to_string()
    }
}
