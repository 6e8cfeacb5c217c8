//! The parts every daemon wires around its node, from the keys every daemon has ([`CommonConfig`]): the node's
//! name, TLS keys and filters; the node itself; its link to a parent; its metrics endpoint and systemd
//! watchdog; its gRPC port with health; and the order they stop in. A daemon's library is then its role (leaf,
//! relay, root) and its few own parts (the agent's ranks, the front-end's store and API).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use canopy_proto::v1::NodeKind;
use canopy_proto::v1::tree_server::TreeServer;
use canopy_runtime::common::CommonConfig;
use canopy_runtime::tls::{Tls, TlsError};
use prometheus_client::collector::Collector;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::node::{Node, NodeConfig, NodeHandles, RoleConfig, Up};
use crate::plugin::PluginFilters;
use crate::run::RunId;
use canopy_proto::v1::UpMessage;

use crate::transport::{ParentLink, TreeService};

/// How often a node reports its figures (up the tree, to the metrics endpoint and the watchdog).
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// How long a node that has finished waits for its link to deliver what it holds.
pub const LINK_DRAIN: Duration = Duration::from_secs(5);

/// A daemon's node and the parts around it, as its common keys set them up.
pub struct Assembly {
    node_id: String,
    common: CommonConfig,
    tls: Option<Tls>,
    filters: Arc<PluginFilters>,
}

impl Assembly {
    /// Names the node (its configured id, else `default_id()`), tags the daemon's logs with it, and loads its
    /// TLS keys and its filter path.
    pub fn new(
        role: &'static str,
        common: &CommonConfig,
        default_id: impl FnOnce() -> String,
    ) -> Result<Self, TlsError> {
        let node_id = match common.node_id.as_str() {
            "" => default_id(),
            id => id.to_string(),
        };
        canopy_runtime::telemetry::set_node(role, &node_id);
        Ok(Self {
            tls: common.tls().load()?,
            filters: crate::plugin::filters_from(&common.filter_path),
            common: common.clone(),
            node_id,
        })
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The node's certificate and CA; `None`: plaintext (loopback only).
    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref()
    }

    /// The filters on the node's filter path.
    pub fn filters(&self) -> Arc<PluginFilters> {
        self.filters.clone()
    }

    /// The node of `role`, sending what it produces to `up`, with the daemon's filters and their time-out.
    pub fn node<U: Up, R: RoleConfig>(
        &self,
        kind: NodeKind,
        role: R,
        max_rounds_in_flight: u64,
        up: U,
    ) -> (Node<U, R::Position>, NodeHandles) {
        let config = NodeConfig {
            node_id: self.node_id.clone(),
            kind,
            filters: self.filters.clone(),
            max_rounds_in_flight,
            status_interval: STATUS_INTERVAL,
        };
        let (mut node, handles) = Node::new(config, role, up);
        node.set_filter_call_timeout(self.common.filter_call_timeout());
        node.set_inline_filters(&self.common.inline_filters);
        (node, handles)
    }

    /// The link that attaches the node to its parent (`parents`: the first, then those that adopt it, comma
    /// separated) and carries `outbound` up; spawned, it runs until the node's way up closes and what it holds
    /// is delivered.
    pub fn parent_link(
        &self,
        parents: &str,
        return_after_s: u64,
        handles: &NodeHandles,
        outbound: mpsc::Receiver<UpMessage>,
        run: RunId,
    ) -> ParentLink {
        ParentLink {
            parents: canopy_runtime::config::parents(parents),
            hello: handles.hello.clone(),
            outbound,
            inputs: handles.inputs.clone(),
            tls: self.tls.as_ref().map(Tls::client),
            run,
            return_after: (return_after_s > 0).then(|| Duration::from_secs(return_after_s)),
            kept_bytes: canopy_runtime::memory::share(self.common.memory_budget_mb),
        }
    }

    /// The node's metrics endpoint (with the daemon's own `collectors`), when `metrics_listen` asks for one,
    /// and the systemd watchdog fed by the node's reports. Returns the endpoint's bound address.
    pub async fn watch(
        &self,
        handles: &NodeHandles,
        collectors: Vec<Box<dyn Collector>>,
    ) -> std::io::Result<Option<SocketAddr>> {
        let metrics = match self.common.metrics_listen.as_str() {
            "" => None,
            listen => Some(
                crate::metrics::spawn(listen, &self.node_id, handles.snapshot.clone(), collectors).await?,
            ),
        };
        tokio::spawn(canopy_runtime::notify::watchdog(
            handles.snapshot.clone(),
            STATUS_INTERVAL,
        ));
        Ok(metrics)
    }

    /// Serves `routes` (the tree service among them) and gRPC health on `listener`, every call judged by `gate`
    /// first; `client_cert_required`: a peer without a node certificate cannot finish the TLS handshake.
    pub async fn serve(
        &self,
        routes: tonic::service::Routes,
        listener: tokio::net::TcpListener,
        max_connections: usize,
        client_cert_required: bool,
        gate: canopy_runtime::auth::Gate,
    ) -> Result<Served, tonic::transport::Error> {
        // gRPC health for load balancers and probes: serving until the node finishes.
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<TreeServer<TreeService>>().await;
        let (stop, stopped) = oneshot::channel::<()>();
        let limits = canopy_runtime::net::ListenLimits {
            max_connections,
            ..Default::default()
        };
        let (incoming, connections) = canopy_runtime::net::incoming(listener, limits);
        let tls = self.tls.as_ref().map(|t| t.server(client_cert_required));
        let server = tokio::spawn(
            crate::transport::server(tls, gate)?
                .add_routes(routes.add_service(health_service))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                }),
        );
        Ok(Served {
            health,
            stop,
            server,
            connections,
        })
    }
}

/// A node's gRPC port, serving.
pub struct Served {
    health: tonic_health::server::HealthReporter,
    stop: oneshot::Sender<()>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    connections: canopy_runtime::net::Connections,
}

impl Served {
    /// Reports not serving, stops taking calls, and waits until `by` for the server to stop and for its
    /// connections to close (a client reads the last of what it was sent, then closes).
    pub async fn stop(self, by: Instant) {
        self.health.set_not_serving::<TreeServer<TreeService>>().await;
        let _ = self.stop.send(());
        let _ = tokio::time::timeout_at(by, self.server).await;
        self.connections.closed_by(by).await;
    }
}

/// Waits up to [`LINK_DRAIN`] for a finished node's link to deliver what it holds, then ends it.
pub async fn drain_link(mut link: JoinHandle<()>) {
    if tokio::time::timeout(LINK_DRAIN, &mut link).await.is_err() {
        link.abort();
    }
}
