//! `canopy up`: a complete local tree of real processes on loopback, with simulated ranks, watched live.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use canopy_store::{RoundCursor, StoreReader};
use canopy_topology::{NodeName, Topology};

use crate::daemons::{
    Daemon, Launch, REAP_POLL, RunDir, binaries_dir, check_filters, security_flags, signal, spawn, stop_all,
    wait_ready,
};
use crate::kinds::{ByKind, Kind};
use tokio::time::Instant;

#[derive(clap::Args, Debug, Clone)]
pub struct UpArgs {
    /// Simulated ranks in all.
    #[arg(long, default_value_t = 64)]
    ranks: u32,
    /// Leaf agents; the ranks are split evenly among them.
    #[arg(long, default_value_t = 4)]
    agents: usize,
    /// Most children per node; relays are added as needed.
    #[arg(long, default_value_t = 8)]
    fanout: usize,
    /// A shape instead of --agents/--fanout: an MRNet topology file, or a balanced spec (`b:F^D`, `b:F1xF2`)
    /// laid over loopback. The root is the front-end, inner nodes are relays, leaves are agents.
    #[arg(long, conflicts_with_all = ["agents", "fanout"])]
    topology: Option<String>,
    /// Rounds every rank dumps before finishing (0: until Ctrl-C).
    #[arg(long, default_value_t = 100)]
    rounds: u64,
    /// Milliseconds between two rounds.
    #[arg(long, default_value_t = 100)]
    period_ms: u64,
    /// Number rounds by time window rather than by dump count (the front-end's `time_rounds`).
    #[arg(long)]
    time_rounds: bool,
    #[command(flatten)]
    dir: RunDir,
    /// Filters to run as streams over the same ranks, comma-separated.
    #[arg(long, default_value = "stats", value_delimiter = ',')]
    filters: Vec<String>,
    /// A filter's parameters, NAME=JSON, e.g. classify='{"scheme":"pattern","pattern":"^MPI_"}' (repeatable).
    #[arg(long = "filter-params", value_name = "NAME=JSON")]
    filter_params: Vec<String>,
    /// flash, uintah, namd or workflow (a simulation, `lammps`, on all agents but the last two, which run its
    /// in-situ analyses `bonds` and `csym`; each round is a step of the workflow key "workflow").
    #[arg(long, default_value = "flash")]
    scenario: String,
    /// Make simulated ranks slower or faster for the whole run, RANKS:FACTOR (repeatable): `--plant 5,40:3`
    /// makes ranks 5 and 40 compute three times as long, so an analysis knows which ranks it must find.
    #[arg(long, value_name = "RANKS:FACTOR")]
    plant: Vec<String>,
    /// Events per simulated rank.
    #[arg(long, default_value_t = 20)]
    events: u32,
    /// Milliseconds a round waits for a missing child.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u32,
    /// Seed of the simulated data.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the tree's addresses and the summary only: no line or progress per round.
    #[arg(long)]
    quiet: bool,
    /// Keep the tree up after the ranks finish, until Ctrl-C: the front-end, its API and the store stay there for
    /// `canopy watch`, grpcurl or a second terminal to attach to.
    #[arg(long)]
    keep: bool,
    /// Let real ranks attach too: the first agent serves this Unix socket (run the application with
    /// CANOPY_AGENT_SOCKET set to it). The other agents serve simulated ranks only.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Plaintext instead of mutual TLS (the tree is on loopback either way). Without it, the run gets a CA of its
    /// own, its certificates and a bearer token in OUT/tls.
    #[arg(long)]
    insecure: bool,
    /// Publish every stored round to these Kafka brokers (host:port, comma-separated), each exactly once, on the
    /// topic canopy.<stream> (docs/kafka.md).
    #[arg(long, value_delimiter = ',', value_name = "HOST:PORT")]
    kafka_brokers: Vec<String>,
}

pub fn run(args: UpArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(up(args))
}

/// The application each agent's simulated ranks report, in the order of the leaves: `sim` for one application;
/// for the workflow scenario its simulation `lammps` on every agent but the last two, `bonds` and `csym`.
fn agent_apps(scenario: &str, agents: usize) -> anyhow::Result<Vec<&'static str>> {
    if !scenario.eq_ignore_ascii_case("workflow") {
        return Ok(vec!["sim"; agents]);
    }
    if agents < 3 {
        bail!(
            "--scenario workflow needs at least 3 agents (the simulation, then one each for the analyses bonds and \
             csym); the tree has {agents}"
        );
    }
    let mut apps = vec!["lammps"; agents - 2];
    apps.extend(["bonds", "csym"]);
    Ok(apps)
}

async fn up(args: UpArgs) -> anyhow::Result<ExitCode> {
    let topology = match &args.topology {
        Some(t) if Path::new(t).is_file() => crate::topology_cmd::read_mrnet(Path::new(t))?,
        Some(spec) if spec.starts_with("kary:") => {
            bail!("--topology {spec}: a kary spec needs a hosts list; use --agents N --fanout F instead")
        }
        Some(spec) => Topology::from_spec(spec, &["127.0.0.1".to_string()])?,
        None => Topology::for_leaves(args.agents, args.fanout)?,
    };
    let leaves: Vec<NodeName> = topology.leaves().into_iter().cloned().collect();
    if topology.len() < 2 {
        bail!("the tree needs at least one agent below the front-end");
    }
    if (args.ranks as usize) < leaves.len() {
        bail!(
            "--ranks {} is fewer than the {} agents: every agent needs at least one rank",
            args.ranks,
            leaves.len()
        );
    }
    let bin_dir = binaries_dir()?;
    check_plants(&bin_dir, &args.plant)?;
    check_filters(&bin_dir, &args.filters, &args.filter_params)?;
    let logs = args.dir.prepare()?;
    let ready_dir = args.dir.ready_dir("up");
    std::fs::create_dir_all(&ready_dir)?;
    // A CA for this run alone: its key is never written, so no other certificate can join the tree.
    let creds = match args.insecure {
        true => None,
        false => Some(
            canopy_runtime::tls::write_credentials(&args.dir.out.join("tls"), &[], 30, true)
                .context("cannot make the run's certificates")?,
        ),
    };

    let tree = LocalTree {
        args: &args,
        topology: &topology,
        bin_dir: &bin_dir,
        logs: &logs,
        ready_dir: &ready_dir,
        creds: creds.as_ref(),
        security: security_flags(creds.as_ref()),
    };
    let mut daemons: Vec<Daemon> = Vec::new();
    let result = tree.launch_and_watch(&leaves, &mut daemons).await;
    // Whatever happened, leave no process behind.
    stop_all(&mut daemons).await;
    let _ = std::fs::remove_dir_all(&ready_dir);
    result
}

/// A local tree as `canopy up` lays it out: what every step of its launch and watch reads.
struct LocalTree<'a> {
    args: &'a UpArgs,
    topology: &'a Topology,
    bin_dir: &'a Path,
    logs: &'a Path,
    ready_dir: &'a Path,
    creds: Option<&'a canopy_runtime::tls::Credentials>,
    /// The TLS flags every daemon takes.
    security: Vec<String>,
}

impl LocalTree<'_> {
    /// Starts the front-end, the relays and the agents, says where the tree is, watches the run to its end (or a
    /// signal) and prints its summary.
    async fn launch_and_watch(
        &self,
        leaves: &[NodeName],
        daemons: &mut Vec<Daemon>,
    ) -> anyhow::Result<ExitCode> {
        let (fe_addr, store) = self.start_frontend(daemons).await?;
        let mut addr_of: HashMap<NodeName, String> = HashMap::new();
        addr_of.insert(self.topology.root().clone(), fe_addr.clone());
        let relays = self.start_relays(&mut addr_of, daemons).await?;
        self.start_agents(leaves, &addr_of, daemons)?;
        self.print_where(&fe_addr, &store, relays, leaves.len());
        let interrupted = self.watch(&store, daemons).await?;
        // Agents and relays leave after the front-end's fin-ack.
        let deadline = Instant::now() + Duration::from_secs(5);
        for d in daemons.iter_mut().skip(1) {
            let left = deadline.saturating_duration_since(Instant::now());
            d.wait_reaped(left).await;
        }
        self.print_summary(&store, daemons, interrupted)?;
        Ok(ExitCode::SUCCESS)
    }

    /// The front-end, once it is ready: its address and the run's store.
    async fn start_frontend(&self, daemons: &mut Vec<Daemon>) -> anyhow::Result<(String, PathBuf)> {
        let args = self.args;
        let fe_ready = self.ready_dir.join("frontend");
        let mut fe = Launch::new(self.bin_dir.join("canopy-frontend"));
        fe.args([
            "--node-id",
            &self.topology.root().to_string(),
            "--listen",
            "127.0.0.1:0",
            "--exit-on-fin",
            if args.keep { "false" } else { "true" },
            // Every `canopy up` is a run of its own, even after one that was killed.
            "--resume",
            "false",
        ])
        .args(["--out".to_string(), args.dir.out.display().to_string()])
        .args(["--streams", &args.filters.join(",")])
        .args(["--time-rounds", if args.time_rounds { "true" } else { "false" }])
        .args(
            args.filter_params
                .iter()
                .flat_map(|p| ["--stream-params", p.as_str()]),
        )
        .args([
            "--expect-ranks",
            &args.ranks.to_string(),
            "--stream-timeout-ms",
            &args.timeout_ms.to_string(),
        ])
        .args(["--ready-file".to_string(), fe_ready.display().to_string()])
        .args(
            (!args.kafka_brokers.is_empty())
                .then(|| ["--kafka-brokers".to_string(), args.kafka_brokers.join(",")])
                .into_iter()
                .flatten(),
        )
        .args(self.security.iter().cloned());
        if let Some(c) = self.creds {
            fe.args(["--token-file".to_string(), c.tokens().display().to_string()]);
        }
        daemons.push(spawn("frontend", Kind::FrontEnd, fe, self.logs)?);
        let ready = wait_ready(&fe_ready, &mut daemons[0]).await?;
        let store = ready.store.context("the front-end's ready file names no store")?;
        Ok((ready.addr.to_string(), store))
    }

    /// Every relay, parents before children, each once it is ready; `addr_of` gains their addresses. Returns
    /// how many there are.
    async fn start_relays(
        &self,
        addr_of: &mut HashMap<NodeName, String>,
        daemons: &mut Vec<Daemon>,
    ) -> anyhow::Result<usize> {
        let topology = self.topology;
        let root = topology.root();
        let relays: Vec<NodeName> = topology
            .nodes()
            .filter(|n| *n != root && !topology.children(n).is_empty())
            .cloned()
            .collect();
        for relay in &relays {
            topology.parent(relay).context("relay without parent")?;
            let ready_file = self.ready_dir.join(format!("relay-{}", daemons.len()));
            let mut cmd = Launch::new(self.bin_dir.join("canopy-relay"));
            cmd.args([
                "--node-id",
                &relay.to_string(),
                "--listen",
                "127.0.0.1:0",
                "--parent",
                &parents(topology, relay, addr_of),
            ])
            .args(["--ready-file".to_string(), ready_file.display().to_string()])
            .args(self.security.iter().cloned());
            daemons.push(spawn(&relay.to_string(), Kind::Relay, cmd, self.logs)?);
            let n = daemons.len() - 1;
            let addr = wait_ready(&ready_file, &mut daemons[n]).await?.addr.to_string();
            // Started again, it listens where its children look for it.
            daemons[n].launch.set("--listen", &addr);
            addr_of.insert(relay.clone(), addr);
        }
        Ok(relays.len())
    }

    /// Every agent, the ranks split evenly (the first `ranks % agents` one more), each application's ranks
    /// numbered from 0.
    fn start_agents(
        &self,
        leaves: &[NodeName],
        addr_of: &HashMap<NodeName, String>,
        daemons: &mut Vec<Daemon>,
    ) -> anyhow::Result<()> {
        let args = self.args;
        let per = args.ranks / leaves.len() as u32;
        let extra = args.ranks % leaves.len() as u32;
        let ranks_of = |i: usize| per + u32::from((i as u32) < extra);
        let apps = agent_apps(&args.scenario, leaves.len())?;
        let mut offsets: HashMap<&str, u32> = HashMap::new();
        for (i, agent) in leaves.iter().enumerate() {
            let n = ranks_of(i);
            let app = apps[i];
            let offset = *offsets.entry(app).or_default();
            let total: u32 = (0..leaves.len()).filter(|&j| apps[j] == app).map(ranks_of).sum();
            self.topology.parent(agent).context("agent without parent")?;
            let mut cmd = Launch::new(self.bin_dir.join("canopy-agent"));
            let socket = match (&args.socket, i) {
                (Some(path), 0) => path.display().to_string(),
                _ => "none".to_string(),
            };
            cmd.args(self.security.iter().cloned())
                .args([
                    "--node-id",
                    &agent.to_string(),
                    "--parent",
                    &parents(self.topology, agent, addr_of),
                ])
                .args(["--socket", &socket])
                .args([
                    "--simulate-ranks",
                    &n.to_string(),
                    "--rank-offset",
                    &offset.to_string(),
                ])
                .args(["--app", app])
                .args([
                    "--total-ranks",
                    &total.to_string(),
                    "--rounds",
                    &args.rounds.to_string(),
                ])
                .args([
                    "--simulate-period-ms",
                    &args.period_ms.to_string(),
                    "--simulate-scenario",
                    &args.scenario,
                ])
                .args([
                    "--simulate-events",
                    &args.events.to_string(),
                    "--seed",
                    &args.seed.to_string(),
                ]);
            if !args.plant.is_empty() {
                cmd.args(["--simulate-plant".to_string(), args.plant.join(";")]);
            }
            daemons.push(spawn(&agent.to_string(), Kind::Agent, cmd, self.logs)?);
            *offsets.get_mut(app).expect("counted above") += n;
        }
        Ok(())
    }

    /// Where the tree is, always: a second terminal needs it even when the rounds are not shown.
    fn print_where(&self, fe_addr: &str, store: &Path, relays: usize, agents: usize) {
        let args = self.args;
        println!(
            "canopy up: front-end {fe_addr}, {relays} relays, {agents} agents, {} ranks ({} scenario), filters {}",
            args.ranks,
            args.scenario,
            args.filters.join(",")
        );
        println!("  store {}", store.display());
        println!("  logs  {}", self.logs.display());
        let first = args.filters.first().map(String::as_str).unwrap_or("stats");
        match self.creds {
            Some(c) => {
                let dir = c.dir.display();
                let grpcurl =
                    format!("grpcurl -cacert {dir}/ca.pem -H \"authorization: Bearer $(cat {dir}/token)\"");
                println!("  API   {grpcurl} {fe_addr} list");
                println!(
                    "        {grpcurl} -d '{{\"streamNames\": [\"{first}\"]}}' {fe_addr} canopy.v1.Frontend/Subscribe"
                );
                println!("        canopy watch --frontend {fe_addr} --tls-dir {dir}");
            }
            None => {
                println!("  API   grpcurl -plaintext {fe_addr} list");
                println!(
                    "        grpcurl -plaintext -d '{{\"streamNames\": [\"{first}\"]}}' {fe_addr} canopy.v1.Frontend/Subscribe"
                );
                println!("        canopy watch --frontend {fe_addr} --insecure");
            }
        }
        if args.keep {
            println!("  the tree stays up after the last round; Ctrl-C stops it cleanly (it drains first)");
        } else {
            println!("  Ctrl-C stops the run cleanly (the tree drains first)");
        }
    }

    /// Shows the rounds as they are stored and supervises the daemons until the front-end exits (the run's end)
    /// or a signal stops the run, which drains the tree first. Returns whether a signal stopped it.
    async fn watch(&self, store: &Path, daemons: &mut [Daemon]) -> anyhow::Result<bool> {
        let args = self.args;
        let total = (args.rounds > 0).then_some(args.rounds);
        // Quiet, nothing follows the store while the run goes on: a look opens it and reads its schema, the
        // largest part of what this process costs the machine the tree runs on. The summary reads it at the end.
        let mut watcher = (!args.quiet).then(|| {
            let show = if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                Show::Progress(progress_bar(total, args.filters.len()))
            } else {
                Show::Lines
            };
            StoreWatcher::new(store.to_path_buf(), show)
        });
        let mut tick = tokio::time::interval(REAP_POLL);
        let mut ticks = 0u64;
        // SIGTERM (kill, timeout, a batch system's end of job) and SIGHUP (the terminal closed) stop the run as
        // Ctrl-C does: the tree drains and no daemon is left running behind.
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        let interrupted;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    ticks += 1;
                    if ticks.is_multiple_of(2) {
                        watcher.iter_mut().for_each(StoreWatcher::show_new);
                    }
                    if let Some(status) = daemons[0].reap()? {
                        watcher.iter_mut().for_each(StoreWatcher::show_new);
                        if !status.success() {
                            bail!("the front-end exited with {status}; see {}", daemons[0].log.display());
                        }
                        interrupted = false;
                        break;
                    }
                    for d in daemons.iter_mut().skip(1) {
                        if let Some(line) = d.supervise(self.logs)? {
                            eprintln!("canopy up: {line}");
                        }
                    }
                }
                why = async {
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => "interrupted",
                        _ = terminate.recv() => "terminated",
                        _ = hangup.recv() => "hung up",
                    }
                } => {
                    eprintln!("canopy up: {why}, draining the tree");
                    signal(&daemons[0].child, nix::sys::signal::Signal::SIGTERM);
                    daemons[0].wait_reaped(Duration::from_secs(10)).await;
                    watcher.iter_mut().for_each(StoreWatcher::show_new);
                    interrupted = true;
                    break;
                }
            }
        }
        watcher.iter_mut().for_each(StoreWatcher::finish);
        Ok(interrupted)
    }

    /// The run's summary from its store, and each kind of daemon's CPU (also in `latest-cpu.json`).
    fn print_summary(&self, store: &Path, daemons: &[Daemon], interrupted: bool) -> anyhow::Result<()> {
        let mut by_kind = ByKind::default();
        for d in daemons {
            by_kind.add(d.kind, d.cpu_total());
        }
        let cannot_read = || format!("cannot read {}", store.display());
        let reader = StoreReader::open(store).with_context(cannot_read)?;
        let summary = reader.summary().with_context(cannot_read)?;
        // A workflow's applications each get their share of the rank-rounds covered.
        let per_app = reader
            .app_coverage(canopy_store::Select::all())
            .with_context(cannot_read)?;
        println!(
            "canopy up: {} rounds stored ({} streams), {} at full coverage, {:.1}% of rank-rounds covered, {} bytes of results, {} late packets{}",
            summary.rounds,
            summary.streams,
            summary.full_rounds,
            summary.coverage_pct(),
            summary.result_bytes,
            summary.late_packets,
            if interrupted { " (interrupted)" } else { "" }
        );
        if let Some(line) = canopy_report::report::coverage::per_app(&per_app) {
            println!("  per application: {line}");
        }
        let rounds = summary.rounds / summary.streams.max(1);
        println!("  {}", by_kind.line(rounds));
        let cpu_file = self.args.dir.out.join("latest-cpu.json");
        let json = serde_json::json!({ "store": store, "rounds": rounds, "cpu": by_kind });
        std::fs::write(&cpu_file, format!("{json:#}\n"))
            .with_context(|| format!("cannot write {}", cpu_file.display()))?;
        println!("  results: {}", store.display());
        println!(
            "  try: sqlite3 {} '{}'",
            store.display(),
            canopy_store::EXAMPLE_QUERY
        );
        Ok(())
    }
}

/// A node's `--parent`: its parent, then every ancestor up to the root, which adopt it in turn when the one it
/// is attached to is lost.
fn parents(topology: &Topology, node: &NodeName, addr_of: &HashMap<NodeName, String>) -> String {
    let mut list = Vec::new();
    let mut at = topology.parent(node);
    while let Some(p) = at {
        if let Some(addr) = addr_of.get(p) {
            list.push(addr.clone());
        }
        at = topology.parent(p);
    }
    list.join(",")
}

/// The agents read the plants: one `canopy-agent validate` checks them before any daemon starts, so a bad one
/// is refused with the agent's own message instead of an agent that never attaches.
fn check_plants(bin_dir: &Path, plants: &[String]) -> anyhow::Result<()> {
    if plants.is_empty() {
        return Ok(());
    }
    let out = std::process::Command::new(bin_dir.join("canopy-agent"))
        .args([
            "validate",
            "--insecure",
            "--socket",
            "none",
            "--simulate-ranks",
            "1",
        ])
        .args(["--simulate-plant", &plants.join(";")])
        .output()
        .context("cannot run canopy-agent to check --plant")?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let why = err.trim().rsplit_once("): ").map_or(err.trim(), |(_, why)| why);
    bail!("--plant: {why}")
}

/// How the rounds are shown as they land.
enum Show {
    /// A line per round and stream (output that is not a terminal: a log, a pipe).
    Lines,
    /// One progress line redrawn in place (a terminal).
    Progress(indicatif::ProgressBar),
}

/// The progress line: rounds done of the run's (per stream), the rate, coverage and late packets so far.
fn progress_bar(total: Option<u64>, streams: usize) -> indicatif::ProgressBar {
    // Drawn on stdout from the first draw: a line drawn elsewhere first would stay above the live one. The bar
    // is short, so the line fits 80 columns with a long run's counts.
    let template = match total {
        Some(_) => "{elapsed_precise} [{bar:16}] {pos}/{len} rounds  {msg}",
        None => "{elapsed_precise} {spinner} {pos} rounds  {msg}",
    };
    let bar = indicatif::ProgressBar::with_draw_target(total, indicatif::ProgressDrawTarget::stdout());
    let style = indicatif::ProgressStyle::with_template(template)
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(format!("{streams} stream{}", if streams == 1 { "" } else { "s" }));
    bar
}

/// Follows the store as rounds land and shows them.
struct StoreWatcher {
    path: PathBuf,
    cursor: RoundCursor,
    show: Show,
    /// Per stream, the rounds stored; and over all rounds, rank-rounds covered and expected.
    rounds: HashMap<String, u64>,
    covered: u64,
    expected: u64,
    partial: u64,
}

impl StoreWatcher {
    fn new(path: PathBuf, show: Show) -> Self {
        Self {
            path,
            cursor: RoundCursor::default(),
            show,
            rounds: HashMap::new(),
            covered: 0,
            expected: 0,
            partial: 0,
        }
    }

    fn show_new(&mut self) {
        // Opened for each look and closed after it: a reader held open when the front-end exits would keep it
        // from folding the WAL into the file and removing it.
        let Ok(reader) = StoreReader::open(&self.path) else {
            return;
        };
        let rows = reader.new_rounds(&mut self.cursor).unwrap_or_default();
        drop(reader);
        for r in &rows {
            *self.rounds.entry(r.stream.clone()).or_default() += 1;
            self.covered += u64::from(r.covered);
            self.expected += u64::from(r.expected);
            self.partial += u64::from(r.covered < r.expected);
        }
        match &self.show {
            Show::Lines => {
                for r in rows {
                    let pct = if r.expected > 0 {
                        100.0 * f64::from(r.covered) / f64::from(r.expected)
                    } else {
                        0.0
                    };
                    let missing = r
                        .missing_reason
                        .map(|m| format!("  missing {m}"))
                        .unwrap_or_default();
                    println!(
                        "  {:<12} round {:>5}  coverage {:>5}/{:<5} {pct:>5.1}%  {:>9} B{missing}",
                        r.stream, r.round, r.covered, r.expected, r.result_bytes
                    );
                }
            }
            Show::Progress(bar) => {
                // A round is done once every stream has it.
                let done = self.rounds.values().copied().min().unwrap_or(0);
                bar.set_position(done);
                let pct = if self.expected > 0 {
                    100.0 * self.covered as f64 / self.expected as f64
                } else {
                    100.0
                };
                let partial = match self.partial {
                    0 => String::new(),
                    n => format!(", {n} partial"),
                };
                let secs = bar.elapsed().as_secs_f64();
                let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
                bar.set_message(format!("{rate:.1} rounds/s  coverage {pct:.1}%{partial}"));
            }
        }
    }

    /// Leaves the progress line as it last was, so the summary follows it.
    fn finish(&mut self) {
        if let Show::Progress(bar) = &self.show {
            bar.abandon();
            println!();
        }
    }
}
