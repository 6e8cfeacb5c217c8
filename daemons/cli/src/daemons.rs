//! The daemons `canopy up` and `canopy run` start on this machine: how each is launched (and launched again),
//! its log, its readiness, its supervision (a relay or agent that dies is started again, as systemd would) and
//! its end; and the checks against the daemons' own binaries before any of them starts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use canopy_launch::restart::{AfterExit, Supervision};
use canopy_launch::{ReadyWait, cpu, log_path, open_log};
use canopy_runtime::ready::Ready;
use tokio::process::{Child, Command};
use tokio::time::Instant;

pub(crate) use canopy_launch::Launch;

use crate::kinds::Kind;

/// Where `canopy up` and `canopy run` put a run: the same flag, default and checks for both.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct RunDir {
    /// Directory for the run: its SQLite store, the daemons' logs and (canopy run) its report.
    #[arg(
        short = 'o',
        long = "output",
        visible_alias = "out",
        value_name = "DIR",
        default_value = "canopy-out"
    )]
    pub(crate) out: PathBuf,
}

impl RunDir {
    /// Refuses a directory the run cannot use, and makes its `logs`; returns where the logs go.
    pub(crate) fn prepare(&self) -> anyhow::Result<PathBuf> {
        canopy_runtime::outdir::check_out_dir(&self.out).map_err(|e| anyhow::anyhow!("--output: {e}"))?;
        let logs = self.out.join("logs");
        std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
        Ok(logs)
    }

    /// Where the daemons' ready files go for this process's `command` (`up`, `run`).
    pub(crate) fn ready_dir(&self, command: &str) -> PathBuf {
        self.out.join(format!(".{command}-{}", std::process::id()))
    }
}

pub(crate) struct Daemon {
    pub(crate) name: String,
    pub(crate) kind: Kind,
    pub(crate) launch: Launch,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
    /// The last CPU reading of the process, taken before it is reaped.
    cpu: Duration,
    /// The CPU of the processes this daemon ran as before it was restarted.
    cpu_before: Duration,
    supervision: Supervision,
}

impl Daemon {
    /// Takes a CPU reading, and the exit status once the process has exited (after its last reading).
    pub(crate) fn reap(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        if let Some(pid) = self.child.id()
            && let Some(r) = cpu::read(pid)
        {
            self.cpu = r.cpu;
            if !r.exited {
                return Ok(None);
            }
        }
        self.child.try_wait()
    }

    /// Looks after a relay or agent: one that died is started again after its back-off. Returns a line to print
    /// when something happened.
    pub(crate) fn supervise(&mut self, logs: &Path) -> anyhow::Result<Option<String>> {
        let now = Instant::now();
        if self.supervision.is_running() {
            let Ok(Some(status)) = self.reap() else {
                return Ok(None);
            };
            return Ok(match self.supervision.exited(status, now.into_std()) {
                AfterExit::Stays => (!status.success())
                    .then(|| format!("{} exited with {status}; see {}", self.name, self.log.display())),
                AfterExit::Restart(backoff) => Some(format!(
                    "{} exited with {status}; restarting it in {} ms (see {})",
                    self.name,
                    backoff.as_millis(),
                    self.log.display()
                )),
            });
        }
        if !self.supervision.due(now.into_std()) {
            return Ok(None);
        }
        let fresh = start(&self.name, &self.launch, logs, true)?;
        self.cpu_before += self.cpu;
        self.cpu = Duration::ZERO;
        self.child = fresh;
        self.supervision.restarted(now.into_std());
        Ok(Some(format!("{} restarted", self.name)))
    }

    /// CPU of every process this daemon ran as.
    pub(crate) fn cpu_total(&self) -> Duration {
        self.cpu_before + self.cpu
    }

    /// Waits up to `limit` for the process to exit, reading its CPU until then.
    pub(crate) async fn wait_reaped(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.reap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(REAP_POLL).await;
        }
    }
}

/// How often `canopy up` looks at its daemons: their CPU, whether they exited. Reading /proc for a large
/// tree costs `canopy up` itself some CPU, so not more often than this.
pub(crate) const REAP_POLL: Duration = Duration::from_millis(100);

/// The front-end loads the filters: one `canopy-frontend validate` checks the names and their parameters before
/// any daemon starts, so a slip (`histogramm`) is refused with the filters there are, naming `--filters`.
pub(crate) fn check_filters(bin_dir: &Path, filters: &[String], params: &[String]) -> anyhow::Result<()> {
    let out = std::process::Command::new(bin_dir.join("canopy-frontend"))
        .args([
            "validate",
            "--insecure",
            "--listen",
            "127.0.0.1:0",
            "--streams",
            &filters.join(","),
        ])
        .args(params.iter().flat_map(|p| ["--stream-params", p.as_str()]))
        .output()
        .context("cannot run canopy-frontend to check --filters")?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let why = err
        .trim()
        .rsplit_once("(from command-line flags): ")
        .map_or(err.trim(), |(_, why)| why);
    let flag = if err.contains("--stream-params") {
        "--filter-params"
    } else {
        "--filters"
    };
    bail!("{flag}: {why}")
}

pub(crate) fn binaries_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the canopy executable")?;
    let dir = exe
        .parent()
        .context("the canopy executable has no directory")?
        .to_path_buf();
    for name in ["canopy-frontend", "canopy-relay", "canopy-agent"] {
        if !dir.join(name).is_file() {
            bail!(
                "{name} not found beside {}: build the whole workspace (cargo build --release --workspace)",
                exe.display()
            );
        }
    }
    Ok(dir)
}

pub(crate) fn spawn(name: &str, kind: Kind, launch: Launch, logs: &Path) -> anyhow::Result<Daemon> {
    let child = start(name, &launch, logs, false)?;
    Ok(Daemon {
        name: name.to_string(),
        kind,
        launch,
        child,
        log: log_path(name, logs),
        cpu: Duration::ZERO,
        cpu_before: Duration::ZERO,
        supervision: Supervision::started(Instant::now().into_std()),
    })
}

/// Starts a daemon's process, its output to its log (appended to when it is started again).
fn start(name: &str, launch: &Launch, logs: &Path, again: bool) -> anyhow::Result<Child> {
    let log = log_path(name, logs);
    let file = open_log(&log, again).with_context(|| format!("cannot create {}", log.display()))?;
    let mut cmd = Command::from(launch.command(&file)?);
    cmd.kill_on_drop(true);
    cmd.spawn().with_context(|| format!("cannot start {name}"))
}

pub(crate) async fn wait_ready(path: &Path, daemon: &mut Daemon) -> anyhow::Result<Ready> {
    let wait = ReadyWait::new(&daemon.name, path, &daemon.log);
    loop {
        if let Some(ready) = wait.look(daemon.child.try_wait()?)? {
            return Ok(ready);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
    }
}

pub(crate) async fn stop_all(daemons: &mut [Daemon]) {
    for d in daemons.iter_mut() {
        if let Ok(None) = d.child.try_wait() {
            signal(&d.child, nix::sys::signal::Signal::SIGTERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for d in daemons.iter_mut() {
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, d.child.wait()).await.is_err() {
            let _ = d.child.kill().await;
        }
    }
}

/// Every daemon's flags for the tree's security: the run's node certificate, or plaintext.
pub(crate) fn security_flags(creds: Option<&canopy_runtime::tls::Credentials>) -> Vec<String> {
    match creds {
        Some(c) => {
            let node = c.node();
            let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
            vec![
                "--tls-ca".into(),
                path(&node.ca),
                "--tls-cert".into(),
                path(&node.cert),
                "--tls-key".into(),
                path(&node.key),
            ]
        }
        None => vec!["--insecure".into()],
    }
}
