//! The real binaries as processes ([`Proc`]): a front-end, relays, agents and trees of them, started with their
//! ready files, stopped and reaped when dropped.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use canopy_launch::{Launch, ReadyWait};

use crate::*;

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
        let mut launch = Launch::new(bin_dir().join(name));
        launch
            .args(args.iter().copied())
            .args(security_args(name, args))
            .env("CANOPY_TLS_DIR", credentials().dir.display().to_string());
        for (k, v) in env {
            launch.env(*k, *v);
        }
        Proc::spawn(dir, label, &launch)
    }

    /// As `start`, with the process's limit on open descriptors (soft and hard) set to `fds`.
    pub fn start_with_fd_limit(dir: &Path, name: &str, label: &str, args: &[&str], fds: u32) -> Proc {
        let mut launch = Launch::new("sh");
        launch
            .args(["-c".to_string(), format!("ulimit -n {fds} && exec \"$0\" \"$@\"")])
            .args([bin_dir().join(name).display().to_string()])
            .args(args.iter().copied())
            .args(security_args(name, args));
        Proc::spawn(dir, label, &launch)
    }

    /// Starts `launch` as `canopy up` starts a daemon, its output into `dir/label.log`.
    pub(crate) fn spawn(dir: &Path, label: &str, launch: &Launch) -> Proc {
        let log = canopy_launch::log_path(label, dir);
        let file = canopy_launch::open_log(&log, false).expect("log file");
        let child = launch
            .command(&file)
            .expect("log file")
            .spawn()
            .expect("daemon starts");
        Proc {
            name: label.to_string(),
            child,
            log,
        }
    }

    /// CPU time the process has used so far (user and system), from /proc; zero once it is gone.
    pub fn cpu_time(&self) -> Duration {
        canopy_launch::cpu::read(self.child.id()).map_or(Duration::ZERO, |r| r.cpu)
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
pub fn wait_ready_file(path: &Path, proc_: &mut Proc) -> Ready {
    let wait = ReadyWait::new(&proc_.name, path, &proc_.log);
    loop {
        match wait.look(proc_.child.try_wait().ok().flatten()) {
            Ok(Some(ready)) => return ready,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("{e}\nthe whole log:\n{}", proc_.log_text()),
        }
    }
}

/// The front-end's ready file in `dir` (as [`start_frontend`] names it), read now.
pub fn frontend_ready(dir: &Path) -> Ready {
    let path = dir.join("frontend.ready");
    Ready::read(&path)
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no ready file at {}", path.display()))
}

/// The store a `canopy run` or `canopy up` printed (`..., store PATH` on a line of its own output).
pub fn printed_store(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| {
            l.split_once(", store ")
                .map(|(_, store)| store.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no store in the output:\n{stdout}"))
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
    let ready = wait_ready_file(&ready, &mut fe);
    let store = ready.store.expect("the front-end's ready file names its store");
    (fe, ready.addr.to_string(), store)
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
    let addr = wait_ready_file(&ready, &mut relay).addr.to_string();
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
