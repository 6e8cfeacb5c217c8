//! Test support for end-to-end tests of Canopy trees: a `TreeSandbox` that starts a front-end, relays and
//! agents in-process on loopback port 0, helpers to run the real binaries, and `assert_eventually!`.

#![forbid(unsafe_code)]
#![allow(
    clippy::disallowed_types,
    reason = "synchronous helpers that wait on real processes by the wall clock; no tokio clock to pause"
)]

pub mod accounting;
pub mod fault;
pub mod kafka;
pub mod netns;
pub mod test_rank;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use canopy_agent::AgentConfig;
use canopy_frontend::{Frontend, FrontendConfig};
use canopy_relay::{Relay, RelayConfig};
use canopy_topology::Topology;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use canopy_store::{
    HistogramRow, NodeSampleRow, ReductionRow, RoundRow, Select, StoreReader, StreamState, Table,
};
/// The store's typed reads, for the tests: no test writes SQL.
pub use fault::FaultProxy;
pub use netns::Lan;
pub use test_rank::{TestRank, work_dump};

/// Polls a condition until it holds or the time runs out, instead of sleeping a guessed time.
#[macro_export]
macro_rules! assert_eventually {
    ($cond:expr, $timeout:expr, $($msg:tt)+) => {{
        // tokio's clock, so a test on paused time waits in virtual time.
        let deadline = tokio::time::Instant::now() + $timeout;
        loop {
            if $cond {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                panic!($($msg)+);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }};
}

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
            drain_timeout_ms: 3000,
            streams: vec!["passthrough".into()],
            stream_params: Vec::new(),
            extra_filter_dirs: Vec::new(),
            subscriber_buffer: 1024,
            socket_dir: None,
            tls: false,
            filter_call_timeout_ms: canopy_core::node::DEFAULT_FILTER_CALL_TIMEOUT.as_millis() as u64,
            inline_filters: canopy_core::plugin::BUNDLED_FILTERS
                .iter()
                .map(|f| f.to_string())
                .collect(),
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
            node_id: topology.root().to_string(),
            max_rounds_in_flight: self.max_rounds_in_flight,
            filter_path: self.filter_path(),
            filter_call_timeout_ms: self.filter_call_timeout_ms,
            inline_filters: self.inline_filters.clone(),
            sync_mode: self.sync_mode.clone(),
            drain_timeout_ms: self.drain_timeout_ms,
            streams: self.streams.clone(),
            stream_params: self.stream_params.iter().cloned().collect(),
            subscriber_buffer: self.subscriber_buffer,
            tls_ca: self.node_tls().ca,
            tls_cert: self.node_tls().cert,
            tls_key: self.node_tls().key,
            insecure: self.node_tls().insecure,
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
                node_id: r.to_string(),
                parent: addr_of[&parent].clone(),
                listen: "127.0.0.1:0".into(),
                filter_path: self.filter_path(),
                filter_call_timeout_ms: self.filter_call_timeout_ms,
                inline_filters: self.inline_filters.clone(),
                tls_ca: self.node_tls().ca,
                tls_cert: self.node_tls().cert,
                tls_key: self.node_tls().key,
                insecure: self.node_tls().insecure,
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
            node_id: id.to_string(),
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
            filter_path: self.filter_path(),
            filter_call_timeout_ms: self.filter_call_timeout_ms,
            inline_filters: self.inline_filters.clone(),
            tls_ca: self.node_tls().ca,
            tls_cert: self.node_tls().cert,
            tls_key: self.node_tls().key,
            insecure: self.node_tls().insecure,
            ..AgentConfig::default()
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

/// Opens a run's store for typed reads (panics if it cannot be opened).
pub fn reader(store: &Path) -> StoreReader {
    StoreReader::open(store).unwrap_or_else(|e| panic!("open store: {e}"))
}

/// Reads every round of a store, by stream then round; none while the store cannot be read yet.
pub fn read_rounds(store: &Path) -> Vec<RoundRow> {
    StoreReader::open(store)
        .and_then(|r| r.rounds(Select::all()))
        .unwrap_or_default()
}

/// The directory of the built filter plugins: beside the running executable (a binary such as the bench), or
/// one up from it (a test executable in `target/debug/deps`).
/// A directory where the build's test plugins (`libcanopy_testfilter_NAME.so`, which no daemon finds on its
/// own, so a release build never offers them) are filters (`libcanopy_filter_NAME.so`, a link to each).
pub fn test_plugin_dir() -> PathBuf {
    let built = plugin_dir();
    let dir = built.join("test-filters");
    std::fs::create_dir_all(&dir).expect("test filter directory");
    for entry in std::fs::read_dir(&built).expect("plugin directory").flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if let Some(name) = file.strip_prefix("libcanopy_testfilter_") {
            let link = dir.join(format!("libcanopy_filter_{name}"));
            // Tests make it at once, side by side: one made it first.
            match std::os::unix::fs::symlink(entry.path(), &link) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => panic!("cannot link {}: {e}", link.display()),
            }
        }
    }
    dir
}

pub fn plugin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let here = exe.parent().expect("executable dir").to_path_buf();
    let candidates = [
        here.clone(),
        here.parent().map(Path::to_path_buf).unwrap_or_default(),
    ];
    candidates
        .into_iter()
        .find(|d| d.join("libcanopy_filter_passthrough.so").is_file())
        .unwrap_or_else(|| {
            panic!(
                "filter plugins are not built near {}: run `cargo build --workspace` first",
                here.display()
            )
        })
}

/// The directory of the built daemons: beside the running executable (a binary such as the bench), or one up
/// from it (`target/debug` for a test executable in `target/debug/deps`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let here = exe.parent().expect("executable dir").to_path_buf();
    let dir = if here.join("canopy-agent").is_file() {
        here
    } else {
        here.parent().expect("target dir").to_path_buf()
    };
    for name in ["canopy", "canopy-frontend", "canopy-relay", "canopy-agent"] {
        assert!(
            dir.join(name).is_file(),
            "{name} is not built in {}: run `cargo build --workspace` before the tests (README's test command does)",
            dir.display()
        );
    }
    dir
}

/// The credentials of every daemon and client the tests start as processes: one CA for the test binary (made on
/// first use, its key thrown away), as `canopy up` makes one per run. Directories left by test binaries that have
/// ended are removed.
pub fn credentials() -> &'static canopy_runtime::tls::Credentials {
    static CREDS: std::sync::OnceLock<canopy_runtime::tls::Credentials> = std::sync::OnceLock::new();
    CREDS.get_or_init(|| {
        let tmp = std::env::temp_dir();
        if let Ok(entries) = std::fs::read_dir(&tmp) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(pid) = name
                    .strip_prefix("canopy-test-tls-")
                    .and_then(|p| p.parse::<u32>().ok())
                else {
                    continue;
                };
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let dir = tmp.join(format!("canopy-test-tls-{}", std::process::id()));
        canopy_runtime::tls::write_credentials(&dir, &[], 1, true).expect("the tests' certificates")
    })
}

/// The flags a daemon started by the tests gets for TLS: the node certificate (and, at the front-end, the token
/// file). Nothing if the test chose (`--insecure`, `--tls-ca`) or the program is not a daemon.
fn security_args(name: &str, args: &[&str]) -> Vec<String> {
    let daemon = matches!(name, "canopy-frontend" | "canopy-relay" | "canopy-agent");
    if !daemon || args.iter().any(|a| matches!(*a, "--insecure" | "--tls-ca")) {
        return Vec::new();
    }
    let creds = credentials();
    let node = creds.node();
    let path = |p: Option<PathBuf>| p.unwrap_or_default().display().to_string();
    let mut flags = vec![
        "--tls-ca".to_string(),
        path(node.ca),
        "--tls-cert".to_string(),
        path(node.cert),
        "--tls-key".to_string(),
        path(node.key),
    ];
    if name == "canopy-frontend" && !args.contains(&"--token-file") {
        flags.extend(["--token-file".to_string(), creds.tokens().display().to_string()]);
    }
    flags
}

/// A loopback port that is free now and below the kernel's ephemeral range, for a daemon told to listen on it.
///
/// A port the kernel picked for a bind to port 0 and then released is free, but it is in the ephemeral range: a
/// daemon started after may be handed the same port for a listener of its own on port 0 (or an outgoing
/// connection), and then fail to bind the one it was told. Ports below the range are never handed out that way.
/// Calls try the ports of a sequence that starts at a place drawn from the process id, so test processes that
/// run at once start far apart.
pub fn unused_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const SPAN: u32 = 8_000;
    // The range's first port, 32768 unless the kernel says otherwise.
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let first = ephemeral.saturating_sub(SPAN).max(1_024);
    let span = ephemeral.saturating_sub(first).max(1);
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let port = first + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        if let Ok(port) = u16::try_from(port)
            && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    panic!("no free loopback port between {first} and {}", first + span);
}

/// `127.0.0.1:` and an [`unused_port`].
pub fn unused_addr() -> String {
    format!("127.0.0.1:{}", unused_port())
}

/// Polls `cond` every 20 ms until it holds; panics naming `what` once `timeout` has passed. For the tests that
/// wait on real processes by the wall clock.
#[allow(
    clippy::disallowed_methods,
    reason = "a synchronous poll of other processes; no runtime worker is blocked"
)]
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `GET path` on `addr` over plain HTTP/1.1: the status code, the head and the body.
pub fn http_get(addr: &str, path: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    conn.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, head.to_string(), body.to_string())
}

/// A real daemon process; killed when dropped.
pub struct Proc {
    pub name: String,
    pub child: std::process::Child,
    pub log: PathBuf,
}

impl Proc {
    /// Its resident size in KiB (`VmRSS`), 0 once it has ended.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    /// Starts `bin_dir()/name args...`, stdout and stderr into a log file in `dir`.
    pub fn start(dir: &Path, name: &str, label: &str, args: &[&str]) -> Proc {
        Proc::start_with_env(dir, name, label, args, &[])
    }

    /// As `start`, with more environment variables.
    pub fn start_with_env(dir: &Path, name: &str, label: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut cmd = std::process::Command::new(bin_dir().join(name));
        cmd.args(args)
            .args(security_args(name, args))
            .env("CANOPY_TLS_DIR", &credentials().dir)
            .envs(env.iter().copied());
        Proc::spawn(dir, label, cmd)
    }

    /// As `start`, with the process's limit on open descriptors (soft and hard) set to `fds`.
    pub fn start_with_fd_limit(dir: &Path, name: &str, label: &str, args: &[&str], fds: u32) -> Proc {
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c")
            .arg(format!("ulimit -n {fds} && exec \"$0\" \"$@\""))
            .arg(bin_dir().join(name))
            .args(args)
            .args(security_args(name, args));
        Proc::spawn(dir, label, cmd)
    }

    /// Runs `cmd` with stdout and stderr into `dir/label.log`.
    pub(crate) fn spawn(dir: &Path, label: &str, mut cmd: std::process::Command) -> Proc {
        let log = dir.join(format!("{label}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("daemon starts");
        Proc {
            name: label.to_string(),
            child,
            log,
        }
    }

    /// CPU time the process has used so far (user and system), from /proc.
    pub fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the command's closing parenthesis; utime and stime are the 12th and 13th, in 1/100 s.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let ticks: u64 = after
            .split_whitespace()
            .skip(11)
            .take(2)
            .filter_map(|f| f.parse::<u64>().ok())
            .sum();
        Duration::from_millis(ticks * 10)
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig);
    }

    /// Waits for the process to exit; `None` if it is still running after `timeout`.
    #[allow(
        clippy::disallowed_methods,
        reason = "a synchronous poll of another process; no runtime worker is blocked"
    )]
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for a ready file a daemon writes once it serves, and returns its contents.
#[allow(
    clippy::disallowed_methods,
    reason = "a synchronous poll of another process; no runtime worker is blocked"
)]
pub fn wait_ready_file(path: &Path, proc_: &mut Proc) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return s;
        }
        if let Ok(Some(status)) = proc_.child.try_wait() {
            panic!(
                "{} exited with {status} before ready:\n{}",
                proc_.name,
                proc_.log_text()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{} not ready in 20 s:\n{}",
            proc_.name,
            proc_.log_text()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The value of a `key=value` line.
pub fn ready_field(ready: &str, key: &str) -> String {
    ready
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
        .unwrap_or_else(|| ready.trim().to_string())
}

/// A front-end on port 0 with `extra` flags; returns it, its address and its store.
pub fn start_frontend(dir: &Path, extra: &[&str]) -> (Proc, String, std::path::PathBuf) {
    start_frontend_with(dir, extra, None)
}

/// As [`start_frontend`], with the process's limit on open descriptors set to `fds` if given.
pub fn start_frontend_with(
    dir: &Path,
    extra: &[&str],
    fds: Option<u32>,
) -> (Proc, String, std::path::PathBuf) {
    let ready = dir.join("frontend.ready");
    let out = dir.join("out");
    let mut args = vec![
        "--out",
        out.to_str().unwrap(),
        "--ready-file",
        ready.to_str().unwrap(),
    ];
    // Port 0 unless the test chose an address.
    if !extra.contains(&"--listen") {
        args.extend(["--listen", "127.0.0.1:0"]);
    }
    args.extend_from_slice(extra);
    let mut fe = match fds {
        Some(fds) => Proc::start_with_fd_limit(dir, "canopy-frontend", "frontend", &args, fds),
        None => Proc::start(dir, "canopy-frontend", "frontend", &args),
    };
    let contents = wait_ready_file(&ready, &mut fe);
    (
        fe,
        ready_field(&contents, "addr"),
        ready_field(&contents, "store").into(),
    )
}

/// A leaf agent process serving real ranks on `socket` (and no simulated ones).
pub fn start_socket_agent(dir: &Path, id: &str, parent: &str, socket: &Path) -> Proc {
    let args = [
        "--node-id",
        id,
        "--parent",
        parent,
        "--socket",
        socket.to_str().expect("socket path"),
    ];
    Proc::start(dir, "canopy-agent", id, &args)
}

/// Compiles the SDK's C example (sdk/examples/c/stencil.c) into `dir` with the system's C compiler, against
/// the libcanopy built beside the daemons; `plain` builds it without instrumentation.
pub fn build_c_example(dir: &Path, plain: bool) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let name = if plain { "stencil-plain" } else { "stencil" };
    build_c_program(dir, &root.join("sdk/examples/c/stencil.c"), name, plain)
}

/// Compiles the C program `source` into `dir/name` with the system's C compiler, against the libcanopy built
/// beside the daemons (without it, and with `-DCANOPY_DISABLE`, when `plain`).
pub fn build_c_program(dir: &Path, source: &Path, name: &str, plain: bool) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = dir.join(name);
    let mut cc = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.arg("-O2").arg("-o").arg(&out).arg(source);
    if plain {
        cc.arg("-DCANOPY_DISABLE");
    } else {
        let lib = bin_dir();
        assert!(
            lib.join("libcanopy.so").is_file(),
            "libcanopy.so is not built in {}: run `cargo build --workspace` first",
            lib.display()
        );
        cc.arg("-I")
            .arg(root.join("sdk/c/include"))
            .arg(format!("-L{}", lib.display()))
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-lcanopy");
    }
    let status = cc.status().expect("a C compiler (cc) is installed");
    assert!(status.success(), "compiling {} failed", source.display());
    out
}

/// The built `canopy` command, with the tests' client certificate (`CANOPY_TLS_DIR`).
pub fn canopy_command() -> std::process::Command {
    let mut cmd = std::process::Command::new(bin_dir().join("canopy"));
    cmd.env("CANOPY_TLS_DIR", &credentials().dir);
    cmd
}

/// Runs `canopy ARGS` (the built one) and returns its stdout, asserting it succeeded.
pub fn canopy_cli(args: &[&str]) -> String {
    let out = std::process::Command::new(bin_dir().join("canopy"))
        .args(args)
        .env("CANOPY_TLS_DIR", &credentials().dir)
        .output()
        .expect("canopy runs");
    assert!(
        out.status.success(),
        "canopy {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A relay process with `id`, attached to `parent`, listening on `listen` (port 0: the kernel picks); returns it
/// once it serves, with the address it serves on.
pub fn start_relay(dir: &Path, id: &str, parent: &str, listen: &str) -> (Proc, String) {
    start_relay_with(dir, id, parent, listen, &[])
}

/// As [`start_relay`], with more flags.
pub fn start_relay_with(dir: &Path, id: &str, parent: &str, listen: &str, extra: &[&str]) -> (Proc, String) {
    let ready = dir.join(format!("{id}.ready"));
    let _ = std::fs::remove_file(&ready);
    let mut args = vec![
        "--node-id",
        id,
        "--parent",
        parent,
        "--listen",
        listen,
        "--ready-file",
        ready.to_str().expect("ready path"),
    ];
    args.extend_from_slice(extra);
    let mut relay = Proc::start(dir, "canopy-relay", id, &args);
    let addr = wait_ready_file(&ready, &mut relay).trim().to_string();
    (relay, addr)
}

/// An agent process serving simulated ranks only (no socket).
pub struct SimAgent<'a> {
    pub id: &'a str,
    /// Its parent, then the parents that adopt it in turn, comma-separated.
    pub parents: &'a str,
    pub ranks: u32,
    /// The first rank's number.
    pub offset: u32,
    /// Ranks in the whole application.
    pub total: u32,
    pub period_ms: u64,
    /// Rounds before its ranks finish (0: until stopped).
    pub rounds: u64,
}

impl SimAgent<'_> {
    pub fn start(&self, dir: &Path) -> Proc {
        self.start_with(dir, &[])
    }

    /// As [`SimAgent::start`], with more flags (`--app`, `--simulate-scenario`, ...).
    pub fn start_with(&self, dir: &Path, extra: &[&str]) -> Proc {
        let args = self.args();
        let args: Vec<&str> = args
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
            .collect();
        Proc::start(dir, "canopy-agent", self.id, &args)
    }

    /// Its flags, for a command of the test's own (an agent on a host of a [`Lan`]).
    pub fn args(&self) -> Vec<String> {
        [
            "--node-id",
            self.id,
            "--parent",
            self.parents,
            "--socket",
            "none",
            "--simulate-ranks",
            &self.ranks.to_string(),
            "--rank-offset",
            &self.offset.to_string(),
            "--total-ranks",
            &self.total.to_string(),
            "--simulate-period-ms",
            &self.period_ms.to_string(),
            "--rounds",
            &self.rounds.to_string(),
        ]
        .map(String::from)
        .to_vec()
    }
}

/// A front-end (stats and passthrough, ending its run at every rank's FIN) and one agent serving ranks on a Unix
/// socket, in `dir`: the smallest real tree a program's ranks report to.
pub struct SocketTree {
    pub fe: Proc,
    pub agent: Proc,
    pub store: PathBuf,
    pub socket: PathBuf,
}

pub fn start_socket_tree(dir: &Path) -> SocketTree {
    let (fe, addr, store) = start_frontend(dir, &["--streams", "stats,passthrough", "--exit-on-fin", "true"]);
    let socket = dir.join("agent.sock");
    let mut agent = start_socket_agent(dir, "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    SocketTree {
        fe,
        agent,
        store,
        socket,
    }
}

impl SocketTree {
    /// Waits for the front-end to end its run (every rank's FIN) and returns the store.
    pub fn finished(mut self) -> PathBuf {
        let status = self.fe.wait_timeout(Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| s.success()),
            "front-end did not finish:\n{}",
            self.fe.log_text()
        );
        self.store
    }
}

/// A rank's utilization profile of one round, as stored.
pub struct UtilizationProfile {
    pub rank: u32,
    /// Its bins (each 250 shares whole).
    pub bins: usize,
    /// (bin, activity name, share).
    pub records: Vec<(usize, String, u32)>,
}

/// Every utilization profile the passthrough stream stored, each checked whole.
pub fn stored_utilization(store: &Path) -> Vec<UtilizationProfile> {
    let stored = reader(store);
    let names: HashMap<u64, String> = stored.names().unwrap().into_iter().collect();
    let passthrough = stored
        .stream_named("passthrough")
        .unwrap()
        .expect("a passthrough stream");
    let mut out = Vec::new();
    for round in stored
        .rounds(Select::all().stream(passthrough.stream_id))
        .unwrap()
    {
        let Some(bytes) = stored.profile_batch(passthrough.stream_id, round.round).unwrap() else {
            continue;
        };
        let batch = <canopy_wire::v1::ProfileBatch as prost::Message>::decode(bytes.as_slice()).unwrap();
        for p in &batch.profiles {
            let Some(u) = &p.utilization else { continue };
            canopy_wire::utilization::check(u).unwrap();
            let records = canopy_wire::utilization::records(u)
                .map(|(bin, id, share)| {
                    let name = names.get(&id).cloned().unwrap_or_else(|| "other".into());
                    (bin, name, share)
                })
                .collect();
            out.push(UtilizationProfile {
                rank: p.rank,
                bins: u.counts.len(),
                records,
            });
        }
    }
    out
}

/// Waits until the agent's Unix socket accepts connections; panics with the agent's log if it exits first.
pub fn wait_socket(path: &Path, agent: &mut Proc) {
    wait_for("the agent's socket", Duration::from_secs(20), || {
        if let Ok(Some(status)) = agent.child.try_wait() {
            panic!("agent exited with {status}:\n{}", agent.log_text());
        }
        // The file appears at bind(), a moment before the agent listens: connect to be sure. (A connection with
        // no hello is closed quietly.)
        path.exists() && std::os::unix::net::UnixStream::connect(path).is_ok()
    });
}

/// The ids the store's dictionary gives a name.
pub fn ids_named(store: &Path, name: &str) -> std::collections::HashSet<u64> {
    reader(store)
        .names()
        .unwrap()
        .into_iter()
        .filter(|(_, n)| n == name)
        .map(|(id, _)| id)
        .collect()
}

/// Per rank, the calls of the event `name` stored over all rounds (the sum of every round's calls, checked
/// against the last running total).
pub fn stored_calls(store: &Path, name: &str) -> std::collections::BTreeMap<u32, u64> {
    let stored = reader(store);
    let ids = ids_named(store, name);
    let mut per_rank: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
    for s in stored.samples(Select::all()).unwrap() {
        if ids.contains(&s.event_id) {
            let row = per_rank.entry(s.rank).or_default();
            row.0 += s.calls.unwrap_or(0);
            row.1 = row.1.max(s.calls_total.unwrap_or(0));
        }
    }
    per_rank
        .into_iter()
        .map(|(rank, (sum, total))| {
            assert_eq!(
                sum, total,
                "{name}, rank {rank}: the rounds' calls add up to the running total"
            );
            (rank, sum)
        })
        .collect()
}

/// Per rank, the last total of the counter `name`.
pub fn stored_counter(store: &Path, name: &str) -> std::collections::BTreeMap<u32, f64> {
    let stored = reader(store);
    let ids: std::collections::HashSet<u64> = stored
        .names()
        .unwrap()
        .into_iter()
        .filter(|(_, n)| n == name)
        .map(|(id, _)| id)
        .collect();
    let mut last: std::collections::BTreeMap<u32, (u64, f64)> = std::collections::BTreeMap::new();
    for c in stored.counters(Select::all()).unwrap() {
        if ids.contains(&c.counter_id) {
            let row = last.entry(c.rank).or_insert((0, 0.0));
            if c.round >= row.0 {
                *row = (c.round, c.total.unwrap_or(0.0));
            }
        }
    }
    last.into_iter().map(|(rank, (_, total))| (rank, total)).collect()
}

/// A Python interpreter that imports every module of `modules`: `CANOPY_PYTHON` if set, else `python3`. None
/// (the check is skipped, and says so) when it cannot; with `CANOPY_PYTHON_TEST` set (CI installs them) a missing
/// module fails the test instead.
pub fn python_with(modules: &[&str]) -> Option<String> {
    let python = std::env::var("CANOPY_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let import = format!("import {}", modules.join(", "));
    let out = std::process::Command::new(&python).args(["-c", &import]).output();
    let found = out.as_ref().is_ok_and(|o| o.status.success());
    if found {
        return Some(python);
    }
    let why = match out {
        Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
        Err(e) => e.to_string(),
    };
    assert!(
        std::env::var_os("CANOPY_PYTHON_TEST").is_none(),
        "CANOPY_PYTHON_TEST is set but {python} cannot `{import}`: {why}"
    );
    eprintln!("skipped a Python check: {python} cannot `{import}` ({why})");
    None
}

/// The DOM headless Chromium builds from an HTML page (`--dump-dom`), or None (the check is skipped, and says
/// so) where Chromium is not installed; with `CANOPY_CHROMIUM_TEST` set (CI installs it) that fails the test.
pub fn browser_dom(page: &Path) -> Option<String> {
    let found = std::process::Command::new("chromium")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CANOPY_CHROMIUM_TEST").is_none(),
            "CANOPY_CHROMIUM_TEST is set but chromium is not installed (apt-get install chromium)"
        );
        eprintln!("skipped the browser check: chromium is not installed (apt-get install chromium)");
        return None;
    }
    let out = std::process::Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The figures of a report page (its file or a browser's DOM of it), by name, each with its SVG.
pub fn svg_figures(html: &str) -> std::collections::HashMap<String, String> {
    html.split("<figure data-figure=\"")
        .skip(1)
        .map(|f| {
            let (name, rest) = f.split_once('"').unwrap();
            let svg = rest.split("</figure>").next().unwrap();
            (name.to_string(), svg.to_string())
        })
        .collect()
}

/// The points of every `<polyline>` of an SVG, one count per line.
pub fn polyline_points(svg: &str) -> Vec<usize> {
    svg.split("<polyline")
        .skip(1)
        .filter_map(|p| p.split("points=\"").nth(1)?.split('"').next())
        .map(|pts| pts.split_whitespace().count())
        .collect()
}

/// Every figure of a browser's DOM of a report drew data over the run's `rounds`: a series (a line with a point
/// per round, or per round after the first: the stats figure leaves the start-up out, and a round's time is
/// from the one before) or a heat map (a cell per round and bin, ten bins or more). Returns the figures' names.
pub fn assert_figures_drawn(dom: &str, rounds: usize) -> Vec<String> {
    let figs = svg_figures(dom);
    assert!(!figs.is_empty(), "no figure in the page");
    assert_eq!(
        dom.matches("<svg").count(),
        figs.len(),
        "a figure that is not one SVG"
    );
    for name in figs.keys() {
        assert_figure_drawn(dom, name, rounds);
    }
    let mut names: Vec<String> = figs.into_keys().collect();
    names.sort();
    names
}

/// The figure `name` of a browser's DOM of a report drew data over `rounds`, as [`assert_figures_drawn`] says.
pub fn assert_figure_drawn(dom: &str, name: &str, rounds: usize) {
    let figs = svg_figures(dom);
    let svg = figs
        .get(name)
        .unwrap_or_else(|| panic!("no figure {name} in the page, only {:?}", figs.keys()));
    let points = polyline_points(svg);
    let series = points.contains(&rounds) || points.contains(&(rounds - 1));
    let cells = svg.matches("<rect").count() >= rounds * 10;
    assert!(
        series || cells,
        "figure {name} drew no data over {rounds} rounds: lines of {:?} points, {} rects",
        polyline_points(svg),
        svg.matches("<rect").count()
    );
}
