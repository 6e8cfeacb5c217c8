//! A tree of daemons in this process on loopback port 0 ([`TreeBuilder`], [`TreeSandbox`]): a front-end, relays
//! and agents of simulated ranks, torn down when dropped.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use canopy_agent::AgentConfig;
use canopy_frontend::{Frontend, FrontendConfig};
use canopy_relay::{Relay, RelayConfig};
use canopy_runtime::common::CommonConfig;
use canopy_topology::Topology;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::*;

/// How a sandbox tree is shaped and what its ranks do.
#[derive(Debug, Clone)]
pub struct TreeBuilder {
    pub agents: usize,
    pub fanout: usize,
    pub ranks: u32,
    pub rounds: u64,
    pub period_ms: u64,
    pub timeout_ms: u32,
    pub scenario: String,
    /// Simulated ranks planted slower or faster, as `simulate_plant` writes them (`RANKS:FACTOR`).
    pub plant: Vec<String>,
    pub events: u32,
    pub exit_on_fin: bool,
    /// Ranks the root waits for before it starts collection (0: `ranks`).
    pub expect_ranks: u32,
    pub max_rounds_in_flight: u64,
    /// wait_for_all or dont_wait.
    pub sync_mode: String,
    pub drain_timeout_ms: u64,
    /// Filters opened as streams at start.
    pub streams: Vec<String>,
    /// Parameters by filter name (JSON).
    pub stream_params: Vec<(String, String)>,
    /// More directories on every node's filter path, after the build's own.
    pub extra_filter_dirs: Vec<PathBuf>,
    /// Results a Subscribe client may fall behind by.
    pub subscriber_buffer: usize,
    /// Agents serve real ranks on `DIR/agent-K.sock` (K from 0) instead of simulated ones.
    pub socket_dir: Option<PathBuf>,
    /// Mutual TLS between the nodes, with the tests' [`credentials`]; otherwise plaintext on loopback.
    pub tls: bool,
    /// Every node's `filter_call_timeout_ms`: how long a filter call may run before its stream fails.
    pub filter_call_timeout_ms: u64,
    /// Every node's `inline_filters` (the daemons' default: the filters Canopy ships).
    pub inline_filters: Vec<String>,
    /// The application each agent's simulated ranks report, by agent (agent K takes entry K modulo the length);
    /// empty: the agents' default.
    pub apps: Vec<String>,
}

impl Default for TreeBuilder {
    fn default() -> Self {
        Self {
            agents: 4,
            fanout: 2,
            ranks: 64,
            rounds: 20,
            period_ms: 10,
            timeout_ms: 1000,
            scenario: "flash".into(),
            plant: Vec::new(),
            events: 20,
            exit_on_fin: true,
            expect_ranks: 0,
            max_rounds_in_flight: 64,
            sync_mode: "wait_for_all".into(),
            drain_timeout_ms: FrontendConfig::default().drain_timeout_ms,
            streams: vec!["passthrough".into()],
            stream_params: Vec::new(),
            extra_filter_dirs: Vec::new(),
            subscriber_buffer: 1024,
            socket_dir: None,
            tls: false,
            filter_call_timeout_ms: CommonConfig::default().filter_call_timeout_ms,
            inline_filters: CommonConfig::default().inline_filters,
            apps: Vec::new(),
        }
    }
}

struct NodeTask {
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), String>>,
}

/// A running in-process tree.
pub struct TreeSandbox {
    /// Control of the tree at its root.
    pub root: canopy_core::node::RootHandle,
    pub frontend_addr: String,
    pub store: PathBuf,
    /// Every relay's address, by node id.
    pub relay_addrs: HashMap<String, String>,
    /// Every agent's parent address, by node id.
    pub agent_parents: HashMap<String, String>,
    nodes: HashMap<String, NodeTask>,
    frontend_id: String,
    _out: tempfile::TempDir,
}

fn spawn_node<F>(run: impl FnOnce(oneshot::Receiver<()>) -> F) -> NodeTask
where
    F: std::future::Future<Output = Result<(), String>> + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    NodeTask {
        shutdown: Some(tx),
        task: tokio::spawn(run(rx)),
    }
}

impl TreeBuilder {
    /// Starts the tree: front-end first, then relays top-down, then agents; returns once all are started.
    pub async fn start(self) -> TreeSandbox {
        canopy_runtime::telemetry::trace_init();
        let out = tempfile::tempdir().expect("temp dir");
        // With no agents the sandbox is a lone front-end, for tests that attach hand-made children.
        let topology = Topology::for_leaves(self.agents.max(1), self.fanout).expect("topology");
        let fe_config = FrontendConfig {
            listen: "127.0.0.1:0".into(),
            out: out.path().to_path_buf(),
            expect_ranks: if self.expect_ranks == 0 {
                self.ranks
            } else {
                self.expect_ranks
            },
            exit_on_fin: self.exit_on_fin,
            stream_timeout_ms: self.timeout_ms,
            common: self.common(&topology.root().to_string()),
            max_rounds_in_flight: self.max_rounds_in_flight,
            sync_mode: self.sync_mode.clone(),
            drain_timeout_ms: self.drain_timeout_ms,
            streams: self.streams.clone(),
            stream_params: self.stream_params.iter().cloned().collect(),
            subscriber_buffer: self.subscriber_buffer,
            ..FrontendConfig::default()
        };
        let fe = Frontend::bind(fe_config).await.expect("front-end binds");
        let frontend_addr = fe.local_addr().to_string();
        let root_handle = fe.handle();
        let store = fe.store_path();
        let mut nodes = HashMap::new();
        nodes.insert(
            topology.root().to_string(),
            spawn_node(|rx| async move {
                fe.run(async {
                    let _ = rx.await;
                })
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
            }),
        );
        let mut addr_of: HashMap<String, String> = HashMap::new();
        addr_of.insert(topology.root().to_string(), frontend_addr.clone());
        let mut relay_addrs = HashMap::new();
        let root = topology.root().clone();
        let relays: Vec<_> = topology
            .nodes()
            .filter(|n| self.agents > 0 && **n != root && !topology.children(n).is_empty())
            .cloned()
            .collect();
        for r in relays {
            let parent = topology.parent(&r).unwrap().to_string();
            let config = RelayConfig {
                common: self.common(&r.to_string()),
                parent: addr_of[&parent].clone(),
                listen: "127.0.0.1:0".into(),
                ..RelayConfig::default()
            };
            let relay = Relay::bind(config).await.expect("relay binds");
            let addr = relay.local_addr().to_string();
            addr_of.insert(r.to_string(), addr.clone());
            relay_addrs.insert(r.to_string(), addr);
            nodes.insert(
                r.to_string(),
                spawn_node(|rx| async move {
                    relay
                        .run(async {
                            let _ = rx.await;
                        })
                        .await
                        .map_err(|e| e.to_string())
                }),
            );
        }
        let leaves: Vec<_> = topology
            .leaves()
            .into_iter()
            .filter(|_| self.agents > 0)
            .cloned()
            .collect();
        let per = self.ranks / leaves.len().max(1) as u32;
        let mut agent_parents = HashMap::new();
        for (i, a) in leaves.iter().enumerate() {
            let parent = addr_of[&topology.parent(a).unwrap().to_string()].clone();
            let mut config = self.agent_config(&a.to_string(), &parent, per, i as u32 * per);
            if !self.apps.is_empty() {
                config.app = self.apps[i % self.apps.len()].clone();
            }
            if let Some(dir) = &self.socket_dir {
                config.socket = dir.join(format!("agent-{i}.sock")).display().to_string();
                config.simulate_ranks = 0;
            }
            agent_parents.insert(a.to_string(), parent);
            nodes.insert(a.to_string(), spawn_agent(config));
        }
        TreeSandbox {
            root: root_handle,
            frontend_addr,
            store,
            relay_addrs,
            agent_parents,
            nodes,
            frontend_id: topology.root().to_string(),
            _out: out,
        }
    }

    /// Every node's filter path: the build's plugins, the test plugins, then the extra directories.
    pub fn filter_path(&self) -> Vec<PathBuf> {
        let mut path = vec![plugin_dir(), test_plugin_dir()];
        path.extend(self.extra_filter_dirs.iter().cloned());
        path
    }

    /// The configuration of one sandbox agent.
    pub fn agent_config(&self, id: &str, parent: &str, ranks: u32, offset: u32) -> AgentConfig {
        AgentConfig {
            common: self.common(id),
            parent: parent.to_string(),
            socket: "none".into(),
            simulate_ranks: ranks,
            simulate_events: self.events,
            simulate_period_ms: self.period_ms,
            simulate_scenario: self.scenario.clone(),
            simulate_plant: self.plant.clone(),
            rank_offset: offset,
            total_ranks: self.ranks,
            rounds: self.rounds,
            ..AgentConfig::default()
        }
    }

    /// The keys every node of the sandbox shares, for node `id`.
    pub fn common(&self, id: &str) -> CommonConfig {
        let tls = self.node_tls();
        CommonConfig {
            node_id: id.to_string(),
            filter_path: self.filter_path(),
            filter_call_timeout_ms: self.filter_call_timeout_ms,
            inline_filters: self.inline_filters.clone(),
            tls_ca: tls.ca,
            tls_cert: tls.cert,
            tls_key: tls.key,
            insecure: tls.insecure,
            ..CommonConfig::default()
        }
    }

    /// Every node's TLS keys: the tests' node certificate, or plaintext.
    pub fn node_tls(&self) -> canopy_runtime::tls::TlsFiles {
        match self.tls {
            true => credentials().node(),
            false => canopy_runtime::tls::TlsFiles {
                insecure: true,
                ..Default::default()
            },
        }
    }
}

fn spawn_agent(config: AgentConfig) -> NodeTask {
    spawn_node(|rx| async move {
        canopy_agent::run(config, async {
            let _ = rx.await;
        })
        .await
        .map_err(|e| e.to_string())
    })
}

impl TreeSandbox {
    /// Waits for the front-end to finish (the run ended with every child's Fin) and returns its result.
    pub async fn wait_frontend(&mut self, timeout: Duration) -> Result<(), String> {
        let node = self.nodes.get_mut(&self.frontend_id).expect("front-end task");
        match tokio::time::timeout(timeout, &mut node.task).await {
            Ok(joined) => joined.map_err(|e| e.to_string())?,
            Err(_) => Err(format!("front-end did not finish within {timeout:?}")),
        }
    }

    /// Sends a node its shutdown (at the front-end: a drain).
    pub fn shutdown(&mut self, id: &str) {
        if let Some(tx) = self.nodes.get_mut(id).and_then(|n| n.shutdown.take()) {
            let _ = tx.send(());
        }
    }

    /// Drains the front-end, as its SIGTERM does.
    pub fn drain_frontend(&mut self) {
        let id = self.frontend_id.clone();
        self.shutdown(&id);
    }

    /// Ends a node abruptly, as a crash would: its connections drop without a word.
    pub fn kill(&mut self, id: &str) {
        if let Some(n) = self.nodes.remove(id) {
            n.task.abort();
        }
    }

    /// Starts another agent in the tree (for duplicate ids, late joiners).
    pub fn add_agent(&mut self, key: &str, config: AgentConfig) {
        self.nodes.insert(key.to_string(), spawn_agent(config));
    }

    /// Waits for a node's task to end and returns its result.
    pub async fn wait_node(&mut self, key: &str, timeout: Duration) -> Result<(), String> {
        let node = self.nodes.get_mut(key).expect("node task");
        match tokio::time::timeout(timeout, &mut node.task).await {
            Ok(joined) => joined.map_err(|e| e.to_string())?,
            Err(_) => Err(format!("{key} did not finish within {timeout:?}")),
        }
    }

    pub fn rounds(&self) -> Vec<RoundRow> {
        read_rounds(&self.store)
    }

    /// Waits for the run to end and asserts that the store holds `rounds` rounds, each covering all `ranks`.
    pub async fn assert_finished_full(&mut self, rounds: usize, ranks: u32) {
        self.wait_frontend(Duration::from_secs(30))
            .await
            .expect("the tree goes on and finishes");
        let stored = self.rounds();
        assert_eq!(stored.len(), rounds, "{stored:#?}");
        assert!(
            stored.iter().all(|r| r.covered == ranks && r.expected == ranks),
            "{stored:#?}"
        );
    }
}

impl Drop for TreeSandbox {
    fn drop(&mut self) {
        for n in self.nodes.values() {
            n.task.abort();
        }
    }
}
