//! Canopy's relay: an interior node of the tree. It attaches to its parent, serves `canopy.v1.Tree` to its
//! children, and merges their rounds through each stream's filter.

#![forbid(unsafe_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use canopy_core::assembly::Assembly;
use canopy_core::node::{self, NodeError, ParentUp};
use canopy_core::transport::TreeService;
use canopy_proto::v1::NodeKind;
use canopy_runtime::common::CommonConfig;
use canopy_runtime::config::{CheckConfig, ConfigIssue, check_addr};
use canopy_runtime::ready::Ready;
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

/// A relay bound to its port, ready to run.
pub struct Relay {
    config: RelayConfig,
    assembly: Assembly,
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
}

impl Relay {
    pub async fn bind(config: RelayConfig) -> Result<Self, RelayError> {
        let listener = canopy_runtime::daemon::bind(&config.listen).await?;
        let addr = listener.local_addr()?;
        let assembly = Assembly::new("relay", &config.common, || {
            canopy_runtime::daemon::default_node_id("relay", &addr.port().to_string())
        })?;
        Ok(Self {
            config,
            assembly,
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
            assembly,
            listener,
            addr,
        } = self;
        let node_id = assembly.node_id().to_string();
        let (up_tx, up_rx) = tokio::sync::mpsc::channel(256);
        let (mut node, handles) = assembly.node(
            NodeKind::Relay,
            node::Relay,
            config.max_rounds_in_flight,
            ParentUp { tx: up_tx },
        );
        node.set_listen_addr(advertised(addr));
        let metrics = assembly.watch(&handles, Vec::new()).await?;
        // The run this relay belongs to: learnt from its parent, given to its children.
        let run = canopy_core::run::RunId::default();
        let link = assembly.parent_link(
            &config.parent,
            config.return_after_s,
            &handles,
            up_rx,
            run.clone(),
        );
        let link = tokio::spawn(link.run());
        let service =
            TreeService::new(node_id.clone(), handles.inputs.clone(), handles.window.clone()).with_run(run);
        // Only the tree's daemons call a relay: a peer without a node certificate cannot finish the handshake.
        let gate = match assembly.tls() {
            Some(_) => canopy_runtime::auth::Gate::new(Default::default()),
            None => canopy_runtime::auth::Gate::open(),
        };
        let served = assembly
            .serve(
                tonic::service::Routes::new(service.into_server()),
                listener,
                config.max_connections,
                true,
                gate,
            )
            .await?;
        if let Some(path) = &config.ready_file {
            Ready {
                metrics,
                ..Ready::serving(addr)
            }
            .write(path)?;
        }
        tracing::info!(node = %node_id, %addr, parent = %config.parent, "relay serving");
        canopy_runtime::notify::ready(&format!("serving on {addr}, parent {}", config.parent));
        drop(handles);
        let result = node.run(shutdown).await;
        // The node's way up closed with it: the link delivers what it holds, then hangs up, while the port
        // stops taking calls.
        tokio::join!(
            canopy_core::assembly::drain_link(link),
            served.stop(tokio::time::Instant::now() + SERVER_STOP)
        );
        result?;
        Ok(())
    }
}

/// How long the relay, its node finished, waits for its server to stop.
const SERVER_STOP: Duration = Duration::from_secs(2);

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
