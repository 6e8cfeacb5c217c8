//! Canopy's leaf agent: the lowest level of the tree. It serves the ranks of its node (real ones through its
//! Unix socket and the application SDK, simulated ones, or both), runs each stream's filter over them, and
//! attaches to its parent.

// Two audited exceptions: registering the simulated ranks' timerfd with the reactor (sim/timer.rs), and the
// allocator's settings (heap.rs).
#![deny(unsafe_code)]

pub mod heap;
pub mod samplers;
pub mod sim;
pub mod socket;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use canopy_core::assembly::Assembly;
use canopy_core::node::{LeafOptions, NodeError, ParentUp};
use canopy_proto::v1::{NodeKind, control};
use canopy_runtime::common::CommonConfig;
use canopy_runtime::config::{CheckConfig, ConfigIssue};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::sim::clock::{Schedule, SimulatedRanks};
use crate::sim::{Scenario, SimConfig, Simulator};

/// The agent's configuration (`[agent]` in canopy.toml, `CANOPY_AGENT_*`, and a `--kebab-case` flag per key).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, clap::Args)]
#[serde(default)]
pub struct AgentConfig {
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
    /// The Unix socket real ranks attach to through the SDK (CANOPY_AGENT_SOCKET on their side); "none" to
    /// serve simulated ranks only. Default: /run/canopy/agent.sock where /run/canopy exists, else
    /// $XDG_RUNTIME_DIR/canopy/agent.sock, else /tmp/canopy-UID/agent.sock.
    #[arg(long)]
    pub socket: String,
    /// The group whose members may use the socket: it is then mode 0660 in that group (and a directory the agent
    /// makes for it 0710), else 0600. Empty: none.
    #[arg(long)]
    pub socket_group: String,
    /// Who may use the socket, checked on every connection (SO_PEERCRED): user names or uids, and `@group` for a
    /// group's members; comma-separated as a flag. Empty: the agent's own user, and the socket_group's members.
    /// The agent's own user is always allowed.
    #[arg(long, value_delimiter = ',')]
    pub allowed_users: Vec<String>,
    /// Dumps held per rank until the tree starts collection (it waits for every rank the application
    /// announced); beyond it the oldest are dropped and counted.
    #[arg(long)]
    pub hold_dumps: usize,
    /// The largest application a rank on the socket may announce (its size, all nodes together) and the highest
    /// rank number it may claim: a hello past it is refused, so no local user can make the tree wait for ranks
    /// that will never come. Set it to the largest job the machine runs. At most 16,777,216.
    #[arg(long)]
    pub max_app_ranks: u32,
    /// The largest frame a rank may send on the socket, in bytes (a dump of some 20,000 events fits in the
    /// default, 1 MiB); a larger one ends the rank's connection.
    #[arg(long)]
    pub max_frame_bytes: usize,
    /// Simulated ranks this agent serves (0: none).
    #[arg(long)]
    pub simulate_ranks: u32,
    /// Events per simulated rank (the scenario may fix its own set).
    #[arg(long)]
    pub simulate_events: u32,
    /// Milliseconds between two rounds of the simulated ranks.
    #[arg(long)]
    pub simulate_period_ms: u64,
    /// Scenario of the simulated ranks: flash, uintah, namd or workflow (the application name chooses its part: bonds,
    /// csym, or else the simulation).
    #[arg(long)]
    pub simulate_scenario: String,
    /// Simulated ranks made slower or faster for the whole run, as RANKS:FACTOR (global rank numbers): `3,17:2.5`
    /// makes ranks 3 and 17 compute 2.5 times as long; `8-15:0.6` makes a group faster. Semicolon-separated as
    /// a flag. Tests and demonstrations know from them which ranks an analysis must find.
    #[arg(long, value_delimiter = ';')]
    pub simulate_plant: Vec<String>,
    /// The global number of this agent's first rank.
    #[arg(long)]
    pub rank_offset: u32,
    /// Ranks in the whole application (0: rank_offset + simulate_ranks).
    #[arg(long)]
    pub total_ranks: u32,
    /// Seed of the simulated data; the same seed gives the same profiles.
    #[arg(long)]
    pub seed: u64,
    /// The application id the simulated ranks report.
    #[arg(long)]
    pub app: String,
    /// Rounds to simulate before the ranks finish (0: until stopped).
    #[arg(long)]
    pub rounds: u64,
    /// The node samplers that run for the streams of the `nodes` filter: cpu, memory, network, disk, load
    /// (comma-separated as a flag). Empty: none (a node stream then names the node and its ranks only).
    #[arg(long, value_delimiter = ',')]
    pub samplers: Vec<String>,
    /// Milliseconds between two samples of the node, on a thread of the samplers' own; each round of a node
    /// stream takes the newest. 0: a sample per round, read as the round closes.
    #[arg(long)]
    pub sample_period_ms: u64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            common: CommonConfig::default(),
            parent: "127.0.0.1:7400".into(),
            return_after_s: 30,
            socket: canopy_wire::default_socket_path().display().to_string(),
            socket_group: String::new(),
            allowed_users: Vec::new(),
            hold_dumps: 256,
            max_app_ranks: DEFAULT_MAX_APP_RANKS,
            max_frame_bytes: 1 << 20,
            simulate_ranks: 0,
            simulate_events: 20,
            simulate_period_ms: 100,
            simulate_scenario: "flash".into(),
            simulate_plant: Vec::new(),
            rank_offset: 0,
            total_ranks: 0,
            seed: 1,
            app: "sim".into(),
            rounds: 0,
            samplers: samplers::SamplerKind::ALL
                .iter()
                .map(|k| k.name().to_string())
                .collect(),
            sample_period_ms: 0,
        }
    }
}

impl canopy_runtime::daemon::DaemonConfig for AgentConfig {
    fn common(&self) -> &CommonConfig {
        &self.common
    }
}

impl AgentConfig {
    /// Who may use the socket, as `socket_group` and `allowed_users` say; the error names the key.
    pub fn socket_access(&self) -> Result<socket::Access, ConfigIssue> {
        socket::Access::from_config(&self.allowed_users, &self.socket_group).map_err(|e| {
            let key = match e {
                socket::AccessError::NoGroup(ref g) if self.socket_group.trim() == g => "socket_group",
                _ => "allowed_users",
            };
            ConfigIssue::new(key, e.to_string())
        })
    }
}

impl AgentConfig {
    /// The planted ranks of the simulated ones, as `simulate_plant` writes them.
    pub fn plants(&self) -> Result<Vec<sim::plant::Plant>, sim::plant::PlantError> {
        self.simulate_plant
            .iter()
            .filter(|p| !p.trim().is_empty())
            .map(|p| p.parse())
            .collect()
    }

    /// The samplers `samplers` names; the error names the key.
    pub fn sampler_kinds(&self) -> Result<Vec<samplers::SamplerKind>, ConfigIssue> {
        samplers::parse_names(&self.samplers).map_err(|e| ConfigIssue::new("samplers", e))
    }
}

/// The default `max_app_ranks`: a million ranks, more than any job of most machines.
pub const DEFAULT_MAX_APP_RANKS: u32 = 1 << 20;

/// The most events the simulated ranks keep in all (ranks x events): each keeps its cumulative profile.
pub const MAX_SIMULATED_SLOTS: u64 = 1 << 24;

impl CheckConfig for AgentConfig {
    fn check(&self) -> Result<(), ConfigIssue> {
        self.common.check()?;
        canopy_runtime::config::check_parents("parent", &self.parent)?;
        if self.simulate_ranks == 0 && self.socket == "none" {
            return Err(ConfigIssue::new(
                "socket",
                "is none and simulate_ranks is 0: the agent would serve no ranks",
            ));
        }
        if self.socket.is_empty() {
            return Err(ConfigIssue::new("socket", "is empty (a path, or none)"));
        }
        self.socket_access()?;
        if !(4096..=canopy_wire::MAX_FRAME).contains(&self.max_frame_bytes) {
            return Err(ConfigIssue::new(
                "max_frame_bytes",
                format!("must be from 4096 to {} bytes", canopy_wire::MAX_FRAME),
            ));
        }
        if !(1..=canopy_proto::MAX_RANKS).contains(&self.max_app_ranks) {
            return Err(ConfigIssue::new(
                "max_app_ranks",
                format!("must be from 1 to {}", canopy_proto::MAX_RANKS),
            ));
        }
        if self.hold_dumps == 0 {
            return Err(ConfigIssue::new("hold_dumps", "must be at least 1"));
        }
        if self.simulate_period_ms == 0 {
            return Err(ConfigIssue::new("simulate_period_ms", "must be at least 1"));
        }
        if let Err(e) = self.simulate_scenario.parse::<Scenario>() {
            return Err(ConfigIssue::new("simulate_scenario", e.to_string()));
        }
        if let Err(e) = self.plants() {
            return Err(ConfigIssue::new("simulate_plant", e.to_string()));
        }
        if self.simulate_ranks > canopy_proto::MAX_RANKS {
            return Err(ConfigIssue::new(
                "simulate_ranks",
                format!(
                    "is more than any node may answer for ({})",
                    canopy_proto::MAX_RANKS
                ),
            ));
        }
        let slots = u64::from(self.simulate_ranks) * u64::from(self.simulate_events);
        if slots > MAX_SIMULATED_SLOTS {
            return Err(ConfigIssue::new(
                "simulate_events",
                format!(
                    "times simulate_ranks is {slots}, more than {MAX_SIMULATED_SLOTS} (about 1 GiB of simulated profiles)"
                ),
            ));
        }
        self.sampler_kinds()?;
        if self.sample_period_ms != 0 && !(10..=3_600_000).contains(&self.sample_period_ms) {
            return Err(ConfigIssue::new(
                "sample_period_ms",
                "must be 0 (a sample per round) or from 10 to 3600000 (an hour)",
            ));
        }
        if u64::from(self.rank_offset) + u64::from(self.simulate_ranks) > u64::from(canopy_proto::MAX_RANKS) {
            return Err(ConfigIssue::new(
                "rank_offset",
                format!(
                    "plus simulate_ranks is {}, past the highest rank number a tree carries ({})",
                    u64::from(self.rank_offset) + u64::from(self.simulate_ranks),
                    canopy_proto::MAX_RANKS
                ),
            ));
        }
        if self.total_ranks > canopy_proto::MAX_RANKS {
            return Err(ConfigIssue::new(
                "total_ranks",
                format!("is more than a tree carries ({})", canopy_proto::MAX_RANKS),
            ));
        }
        if self.total_ranks != 0 && self.total_ranks < self.rank_offset.saturating_add(self.simulate_ranks) {
            return Err(ConfigIssue::new(
                "total_ranks",
                "is smaller than rank_offset + simulate_ranks",
            ));
        }
        // Last: a wrong value elsewhere is the more useful message.
        let parents = canopy_runtime::config::parents(&self.parent);
        let addrs: Vec<(&str, &str)> = parents.iter().map(|p| ("parent", p.as_str())).collect();
        self.common.tls().check(&addrs)?;
        Ok(())
    }

    fn common_mut(&mut self) -> Option<&mut CommonConfig> {
        Some(&mut self.common)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("agent socket: {0}")]
    Socket(#[from] socket::SocketError),
    #[error("TLS: {0}")]
    Tls(#[from] canopy_runtime::tls::TlsError),
    #[error("node samplers: cannot start their thread: {0}")]
    Samplers(std::io::Error),
    #[error("metrics endpoint: {0}")]
    Metrics(std::io::Error),
}

impl canopy_runtime::daemon::IsRefusal for AgentError {
    fn is_refusal(&self) -> bool {
        matches!(
            self,
            AgentError::Node(NodeError::Refused(_)) | AgentError::Socket(_) | AgentError::Tls(_)
        )
    }
}

/// The rank socket `socket` names, bound with the access `socket_group` and `allowed_users` give; `None` for
/// `none`. The file is removed when the returned [`socket::SocketFile`] drops.
fn bind_socket(config: &AgentConfig) -> Result<Option<(socket::Listener, socket::SocketFile)>, AgentError> {
    if config.socket == "none" {
        return Ok(None);
    }
    let path = PathBuf::from(&config.socket);
    let access = config
        .socket_access()
        .map_err(|e| AgentError::Socket(socket::SocketError::Access(e.to_string())))?;
    let listener = socket::bind_with(&path, access).map_err(AgentError::Socket)?;
    Ok(Some((listener, socket::SocketFile(path))))
}

/// The simulated ranks the configuration asks for, feeding the node behind `handles` and obeying `control`.
fn simulated_ranks(
    config: &AgentConfig,
    handles: &canopy_core::node::NodeHandles,
    control: mpsc::UnboundedReceiver<control::Action>,
) -> SimulatedRanks {
    let scenario: Scenario = config.simulate_scenario.parse().unwrap_or(Scenario::Flash);
    tracing::info!(ranks = config.simulate_ranks, scenario = %scenario, "serving simulated ranks");
    SimulatedRanks {
        sim: Simulator::new(SimConfig {
            scenario,
            ranks: config.simulate_ranks,
            events: config.simulate_events,
            rank_offset: config.rank_offset,
            total_ranks: config.total_ranks,
            seed: config.seed,
            app: config.app.clone(),
            plants: config.plants().unwrap_or_default(),
        }),
        schedule: Schedule {
            period: Duration::from_millis(config.simulate_period_ms),
            rounds: config.rounds,
        },
        control,
        inputs: handles.inputs.clone(),
        window: handles.window.clone(),
    }
}

/// Runs an agent until its ranks finish and the root acknowledges, `shutdown` completes, or the parent
/// refuses it.
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()> + Send) -> Result<(), AgentError> {
    let assembly = Assembly::new("agent", &config.common, || {
        canopy_runtime::daemon::default_node_id("agent", "")
    })?;
    let node_id = assembly.node_id().to_string();
    let socket = bind_socket(&config)?;
    let kinds = config.sampler_kinds().unwrap_or_default();
    let sampler = samplers::node_sampler(&kinds, config.sample_period_ms, &samplers::Roots::default())
        .map_err(AgentError::Samplers)?;
    let (control_tx, mut control_rx) = mpsc::channel::<control::Action>(16);
    let (up_tx, up_rx) = mpsc::channel(256);
    let role = LeafOptions {
        control: control_tx,
        hold_dumps: config.hold_dumps,
        hold_bytes: canopy_runtime::memory::share(config.common.memory_budget_mb),
        sampler,
    };
    // The leaf's ranks dump each round whole, so at most one round per stream is ever open here.
    let (node, handles) = assembly.node(NodeKind::Agent, role, 64, ParentUp { tx: up_tx });
    assembly
        .watch(&handles, Vec::new())
        .await
        .map_err(AgentError::Metrics)?;
    let run = canopy_core::run::RunId::default();
    let link = assembly.parent_link(&config.parent, config.return_after_s, &handles, up_rx, run);
    let link = tokio::spawn(link.run());
    // Control from the tree goes to the simulated ranks and to the socket's ranks alike. Unbounded (control is
    // rare and small): the node waits on this hand-off, and the socket's task may be waiting on the node.
    let (sim_tx, sim_rx) = mpsc::unbounded_channel();
    let (sock_tx, sock_rx) = mpsc::unbounded_channel();
    let fanout = tokio::spawn(async move {
        while let Some(action) = control_rx.recv().await {
            let _ = sim_tx.send(action.clone());
            let _ = sock_tx.send(action);
        }
    });
    let sim =
        (config.simulate_ranks > 0).then(|| tokio::spawn(simulated_ranks(&config, &handles, sim_rx).run()));
    let (serve, socket_file) = match socket {
        Some((listener, file)) => {
            tracing::info!(socket = %file.0.display(), "serving ranks on the socket");
            let serve = socket::serve(
                listener,
                handles.inputs.clone(),
                sock_rx,
                handles.window.clone(),
                config.max_frame_bytes,
                socket::Tenancy {
                    simulated_app: (config.simulate_ranks > 0).then(|| config.app.clone()),
                    max_app_ranks: config.max_app_ranks,
                },
            );
            (Some(tokio::spawn(serve)), Some(file))
        }
        None => (None, None),
    };
    tracing::info!(node = %node_id, parent = %config.parent, "agent attaching");
    // Ready once the socket accepts ranks: they queue there until the parent is reached.
    canopy_runtime::notify::ready(&format!(
        "serving ranks on {}, parent {}",
        config.socket, config.parent
    ));
    drop(handles);
    // With one worker thread (the default) this thread handles the rounds, the simulated ranks' and the inline
    // filters' alike: its heap is faulted in now rather than during the first one.
    heap::warm(heap::WARM);
    let result = node.run(shutdown).await;
    for task in sim.iter().chain(serve.iter()) {
        task.abort();
    }
    fanout.abort();
    // The node's way up closed with it: the link delivers what it holds, then hangs up.
    canopy_core::assembly::drain_link(link).await;
    drop(socket_file);
    result?;
    Ok(())
}
