//! Test support for end-to-end tests of Canopy trees: a `TreeSandbox` that starts a front-end, relays and
//! agents in-process on loopback port 0, helpers to run the real binaries, and `assert_eventually!`.

#![forbid(unsafe_code)]
#![allow(
    clippy::disallowed_types,
    reason = "synchronous helpers that wait on real processes by the wall clock; no tokio clock to pause"
)]

pub mod accounting;
pub mod fault;
mod figures;
pub mod kafka;
pub mod netns;
mod procs;
mod sandbox;
mod stored;
pub mod test_rank;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use canopy_runtime::ready::Ready;
pub use canopy_store::{
    HistogramRow, NodeSampleRow, ReductionRow, RoundRow, Select, StoreReader, StreamState, Table,
};
/// The store's typed reads, for the tests: no test writes SQL.
pub use fault::FaultProxy;
pub use figures::*;
pub use netns::Lan;
pub use procs::*;
pub use sandbox::*;
pub use stored::*;
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
