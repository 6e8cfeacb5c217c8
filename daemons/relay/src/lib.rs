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
use canopy_runtime::common::CommonConfig;
use canopy_runtime::config::{CheckConfig, ConfigIssue, check_addr};
use serde::{Deserialize, Serialize};

/// The relay's configuration (`[relay]` in canopy.toml, `CANOPY_RELAY_*`, and a `--kebab-case` flag per key).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, clap::Args)]
#[serde(default)]
pub struct RelayConfig {
    /// The keys every daemon has.
    #[serde(flatten, skip_deserializing)]
    #[command(flatten)]
    pub common: CommonConfig,
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
    /// Written with the bound address once the relay serves (for launchers using port 0).
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Connections this node's port keeps open at once; more are closed as they come.
    #[arg(long)]
    pub max_connections: usize,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            common: CommonConfig::default(),
            parent: "127.0.0.1:7400".into(),
            return_after_s: 30,
            listen: "0.0.0.0:7401".into(),
            max_rounds_in_flight: 64,
            ready_file: None,
            max_connections: canopy_runtime::net::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl canopy_runtime::daemon::DaemonConfig for RelayConfig {
    fn common(&self) -> &CommonConfig {
        &self.common
    }
}

impl CheckConfig for RelayConfig {
    fn check(&self) -> Result<(), ConfigIssue> {
        self.common.check()?;
        canopy_runtime::config::check_parents("parent", &self.parent)?;
        check_addr("listen", &self.listen)?;
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
        self.common.tls().check(&addrs)?;
        Ok(())
    }

    fn common_mut(&mut self) -> Option<&mut CommonConfig> {
        Some(&mut self.common)
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
        let tls = config.common.tls().load()?;
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
        let node_id = if config.common.node_id.is_empty() {
            canopy_runtime::daemon::default_node_id("relay", &addr.port().to_string())
        } else {
            config.common.node_id.clone()
        };
        canopy_runtime::telemetry::set_node("relay", &node_id);
        let (up_tx, up_rx) = tokio::sync::mpsc::channel(256);
        let node_config = NodeConfig {
            node_id: node_id.clone(),
            kind: NodeKind::Relay,
            filters: canopy_core::plugin::filters_from(&config.common.filter_path),
            max_rounds_in_flight: config.max_rounds_in_flight,
            role: RoleConfig::Relay,
            status_interval: STATUS_INTERVAL,
        };
        let (mut node, handles) = Node::new(node_config, ParentUp { tx: up_tx });
        if !config.common.metrics_listen.is_empty() {
            canopy_core::metrics::spawn(
                &config.common.metrics_listen,
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
        node.set_filter_call_timeout(Duration::from_millis(config.common.filter_call_timeout_ms));
        node.set_inline_filters(&config.common.inline_filters);
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
            kept_bytes: canopy_runtime::memory::share(config.common.memory_budget_mb),
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
