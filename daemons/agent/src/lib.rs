//! Canopy's leaf agent: the lowest level of the tree. It serves the ranks of its node (real ones through its
//! Unix socket and the application SDK, simulated ones, or both), runs each stream's filter over them, and
//! attaches to its parent.

#![forbid(unsafe_code)]

pub mod sim;
pub mod socket;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use canopy_core::config::{CheckConfig, LogFormat, check_host_port};
use canopy_core::node::{Input, LocalRanks, Node, NodeConfig, NodeError, ParentUp, unix_ns};
use canopy_core::transport::ParentLink;
use canopy_proto::v1::{NodeKind, ProfileBatch, control};
use prost::Message;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::sim::{Scenario, SimConfig, Simulator};

/// The agent's configuration (`[agent]` in canopy.toml, `CANOPY_AGENT_*`, flags).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// This node's id in the tree; unique among its parent's children. Default: agent@HOST.
    pub node_id: String,
    /// The parent's address (a relay or the front-end), host:port.
    pub parent: String,
    /// The Unix socket real ranks attach to through the SDK (CANOPY_AGENT_SOCKET on their side); "none" to
    /// serve simulated ranks only. Default: /run/canopy/agent.sock where /run/canopy exists, else
    /// $XDG_RUNTIME_DIR/canopy/agent.sock, else /tmp/canopy-UID/agent.sock.
    pub socket: String,
    /// Dumps held per rank until the tree starts collection (it waits for every rank the application
    /// announced); beyond it the oldest are dropped and counted.
    pub hold_dumps: usize,
    /// Simulated ranks this agent serves (0: none).
    pub simulate_ranks: u32,
    /// Events per simulated rank (the scenario may fix its own set).
    pub simulate_events: u32,
    /// Time between two rounds of the simulated ranks.
    pub simulate_period_ms: u64,
    /// flash, uintah or namd.
    pub simulate_scenario: String,
    /// The global number of this agent's first rank.
    pub rank_offset: u32,
    /// Ranks in the whole application (0: rank_offset + simulate_ranks).
    pub total_ranks: u32,
    /// Seed of the simulated data; the same seed gives the same profiles.
    pub seed: u64,
    /// The application id the simulated ranks report.
    pub app: String,
    /// Rounds to simulate before the ranks finish (0: until stopped).
    pub rounds: u64,
    pub log_format: LogFormat,
    /// Directories searched for filter plugins (libcanopy_filter_<name>.so), in order. Empty: the directory
    /// of the running executable, PREFIX/lib/canopy/filters beside its bin/, then /usr/lib/canopy/filters.
    pub filter_path: Vec<PathBuf>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            node_id: String::new(),
            parent: "127.0.0.1:7400".into(),
            socket: canopy_wire::default_socket_path().display().to_string(),
            hold_dumps: 256,
            simulate_ranks: 0,
            simulate_events: 20,
            simulate_period_ms: 100,
            simulate_scenario: "flash".into(),
            rank_offset: 0,
            total_ranks: 0,
            seed: 1,
            app: "sim".into(),
            rounds: 0,
            log_format: LogFormat::Text,
            filter_path: Vec::new(),
        }
    }
}

impl canopy_core::daemon::DaemonConfig for AgentConfig {
    fn log_format(&self) -> LogFormat {
        self.log_format
    }
}

impl CheckConfig for AgentConfig {
    fn check(&self) -> Result<(), (String, String)> {
        check_host_port("parent", &self.parent)?;
        if self.simulate_ranks == 0 && self.socket == "none" {
            return Err((
                "socket".into(),
                "is none and simulate_ranks is 0: the agent would serve no ranks".into(),
            ));
        }
        if self.socket.is_empty() {
            return Err(("socket".into(), "is empty (a path, or none)".into()));
        }
        if self.hold_dumps == 0 {
            return Err(("hold_dumps".into(), "must be at least 1".into()));
        }
        if self.simulate_period_ms == 0 {
            return Err(("simulate_period_ms".into(), "must be at least 1".into()));
        }
        if let Err(e) = self.simulate_scenario.parse::<Scenario>() {
            return Err(("simulate_scenario".into(), e.to_string()));
        }
        if self.total_ranks != 0 && self.total_ranks < self.rank_offset.saturating_add(self.simulate_ranks) {
            return Err((
                "total_ranks".into(),
                "is smaller than rank_offset + simulate_ranks".into(),
            ));
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("agent socket: {0}")]
    Socket(String),
}

impl canopy_core::daemon::IsRefusal for AgentError {
    fn is_refusal(&self) -> bool {
        matches!(
            self,
            AgentError::Node(NodeError::Refused(_)) | AgentError::Socket(_)
        )
    }
}

/// Runs an agent until its ranks finish and the root acknowledges, `shutdown` completes, or the parent
/// refuses it.
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()> + Send) -> Result<(), AgentError> {
    let node_id = if config.node_id.is_empty() {
        canopy_core::daemon::default_node_id("agent", "")
    } else {
        config.node_id.clone()
    };
    let scenario: Scenario = config.simulate_scenario.parse().unwrap_or(Scenario::Flash);
    let simulator = Simulator::new(SimConfig {
        scenario,
        ranks: config.simulate_ranks,
        events: config.simulate_events,
        rank_offset: config.rank_offset,
        total_ranks: config.total_ranks,
        seed: config.seed,
        app: config.app.clone(),
    });
    let ranks: Vec<u32> = (config.rank_offset..config.rank_offset + config.simulate_ranks).collect();
    let socket = match config.socket.as_str() {
        "none" => None,
        path => {
            let path = PathBuf::from(path);
            let listener = socket::bind(&path).map_err(AgentError::Socket)?;
            Some((listener, socket::SocketFile(path)))
        }
    };
    let (control_tx, mut control_rx) = mpsc::channel::<control::Action>(16);
    let (up_tx, up_rx) = mpsc::channel(256);
    let node_config = NodeConfig {
        node_id: node_id.clone(),
        kind: NodeKind::Agent,
        filters: canopy_core::plugin::filters_from(&config.filter_path),
        // The leaf's ranks dump each round whole, so at most one round per stream is ever open here.
        max_rounds_in_flight: 64,
        root: None,
        local: Some(LocalRanks {
            ranks,
            names: simulator.names(),
            control: control_tx,
        }),
        status_interval: Duration::from_secs(1),
    };
    let (node, handles) = Node::new(node_config, ParentUp { tx: up_tx });
    let link = ParentLink {
        parent: config.parent.clone(),
        hello: handles.hello.clone(),
        outbound: up_rx,
        inputs: handles.inputs.clone(),
    };
    let link = tokio::spawn(link.run());
    let schedule = Schedule {
        period: Duration::from_millis(config.simulate_period_ms),
        rounds: config.rounds,
    };
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
    let sim = (config.simulate_ranks > 0).then(|| {
        tracing::info!(ranks = config.simulate_ranks, scenario = %scenario, "serving simulated ranks");
        tokio::spawn(simulate(
            simulator,
            schedule,
            sim_rx,
            handles.inputs.clone(),
            handles.window.clone(),
        ))
    });
    let (serve, socket_file) = match socket {
        Some((listener, file)) => {
            tracing::info!(socket = %file.0.display(), "serving ranks on the socket");
            let serve = socket::serve(
                listener,
                handles.inputs.clone(),
                sock_rx,
                config.hold_dumps,
                handles.window.clone(),
            );
            (Some(tokio::spawn(serve)), Some(file))
        }
        None => (None, None),
    };
    tracing::info!(node = %node_id, parent = %config.parent, "agent attaching");
    // Ready once the socket accepts ranks: they queue there until the parent is reached.
    canopy_core::notify::ready(&format!(
        "serving ranks on {}, parent {}",
        config.socket, config.parent
    ));
    drop(handles);
    let result = node.run(shutdown).await;
    for task in sim.iter().chain(serve.iter()) {
        task.abort();
    }
    fanout.abort();
    link.abort();
    drop(socket_file);
    result?;
    Ok(())
}

/// How long after the tree's start (at least; ten periods if longer) a node counts as rejoining rather than
/// starting late.
const REJOIN_AFTER: Duration = Duration::from_millis(500);

struct Schedule {
    period: Duration,
    rounds: u64,
}

/// Produces the simulated ranks' rounds on the tree's clock: round `first_round + k` is dumped at
/// `start + k * period`, so an agent that starts late (or again) joins at the tree's current round.
async fn simulate(
    mut sim: Simulator,
    schedule: Schedule,
    mut control: mpsc::UnboundedReceiver<control::Action>,
    inputs: mpsc::Sender<Input>,
    mut window: tokio::sync::watch::Receiver<u64>,
) {
    let mut period_ns = schedule.period.as_nanos() as u64;
    let mut anchor: Option<(u64, u64)> = None;
    let mut next_round = 0u64;
    let names: std::collections::HashMap<u64, String> = sim.names().into_iter().collect();
    let mut options = canopy_core::options::Measure::default();
    loop {
        let wait = match anchor {
            None => None,
            Some((t0, first)) => {
                let round = next_round;
                let due = t0 + round.saturating_sub(first) * period_ns;
                Some(Duration::from_nanos(due.saturating_sub(unix_ns())))
            }
        };
        let action = match wait {
            None => control.recv().await,
            Some(d) => tokio::select! {
                a = control.recv() => a,
                _ = tokio::time::sleep(d) => {
                    let round = next_round;
                    let dump = unix_ns();
                    let mut profiles = Vec::new();
                    let mut sampled_out = Vec::new();
                    for p in sim.round(round) {
                        if options.samples_out(p.rank) {
                            sampled_out.push(p.rank);
                            continue;
                        }
                        let p = options.apply(stamp(p, dump), &names);
                        profiles.push((p.rank, ProfileBatch { profiles: vec![p] }.encode_to_vec()));
                    }
                    let local = Input::LocalRound { round, dump_unix_ns: dump, profiles, sampled_out };
                    // Ranks the tree cannot keep up with fall behind their clock rather than run ahead of the
                    // window of rounds in flight.
                    if !canopy_core::transport::wait_in_window(&mut window, &inputs, round).await {
                        return;
                    }
                    if inputs.send(local).await.is_err() {
                        return;
                    }
                    next_round += 1;
                    if schedule.rounds > 0 && next_round >= schedule.rounds {
                        tracing::info!(rounds = next_round, "simulated ranks finished");
                        let _ = inputs.send(Input::LocalFinished).await;
                        return;
                    }
                    continue;
                }
            },
        };
        match action {
            Some(control::Action::Start(s)) => {
                // Round k is every rank's k-th dump: a node that got Start a little late dumps the rounds it
                // missed at once; one that joins long after the start (a restart) begins at the current round.
                let since = unix_ns().saturating_sub(s.start_unix_ns);
                let rejoin_after = (REJOIN_AFTER.as_nanos() as u64).max(10 * period_ns);
                next_round = if since > rejoin_after {
                    next_round.max(s.first_round + since / period_ns)
                } else {
                    next_round.max(s.first_round)
                };
                anchor = Some((s.start_unix_ns, s.first_round));
            }
            Some(control::Action::Stop(_)) => anchor = None,
            Some(control::Action::Options(o)) => {
                match canopy_core::options::Measure::from_options(&o) {
                    Ok(m) => {
                        tracing::info!(?o, "measurement options changed");
                        options = m;
                    }
                    Err(e) => tracing::error!("measurement options ignored: {e}"),
                }
                if o.period_ms > 0 && anchor.is_some() {
                    // The new period counts from now, from the next round on.
                    period_ns = o.period_ms.saturating_mul(1_000_000).max(1);
                    anchor = Some((unix_ns(), next_round));
                } else if o.period_ms > 0 {
                    period_ns = o.period_ms.saturating_mul(1_000_000).max(1);
                }
            }
            Some(control::Action::Drain(_)) => {
                tracing::info!(rounds = next_round, "drained: simulated ranks finished");
                let _ = inputs.send(Input::LocalFinished).await;
                return;
            }
            Some(control::Action::FinAck(_)) | None => return,
        }
    }
}

fn stamp(mut p: canopy_proto::v1::RankProfile, dump: u64) -> canopy_proto::v1::RankProfile {
    p.dump_unix_ns = dump;
    p
}
