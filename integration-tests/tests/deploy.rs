//! Deployment under systemd, from the daemons' side of the contract (systemd is not PID 1 in the test
//! machines): the installed units verify, a bad configuration fails at their ExecStartPre naming the key,
//! the daemons report readiness and stopping over NOTIFY_SOCKET, and a daemon killed and started again, as
//! Restart= does, is rejoined by its children.

#![allow(
    clippy::disallowed_types,
    reason = "synchronous tests that wait on real processes by the wall clock; no tokio clock to pause"
)]

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use canopy_integration_tests::{Proc, bin_dir, read_rounds, start_frontend, wait_ready_file};
use nix::sys::signal::Signal;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Installs the build (the profile beside the test) under `root` with deploy/install.sh, units in
/// `root/units`, and returns the unit files.
fn install(root: &Path) -> Vec<PathBuf> {
    let profile = bin_dir().file_name().unwrap().to_string_lossy().into_owned();
    let status = Command::new(repo().join("deploy/install.sh"))
        .arg("--prefix")
        .arg(root.join("usr"))
        .arg("--unitdir")
        .arg(root.join("units"))
        .arg("--confdir")
        .arg(root.join("etc"))
        .args(["--profile", &profile])
        .env("CARGO_TARGET_DIR", bin_dir().parent().unwrap())
        .stdout(std::process::Stdio::null())
        .status()
        .expect("deploy/install.sh runs");
    assert!(status.success(), "install.sh failed");
    let mut units: Vec<PathBuf> = std::fs::read_dir(root.join("units"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    units.sort();
    units
}

fn verify(units: &[PathBuf]) -> std::process::Output {
    Command::new("systemd-analyze")
        .arg("verify")
        .args(units)
        .output()
        .expect("systemd-analyze is installed (.ci/run installs systemd)")
}

#[test]
fn every_installed_unit_verifies_and_a_broken_one_does_not() {
    let root = tempfile::tempdir().unwrap();
    let units = install(root.path());
    let names: Vec<String> = units
        .iter()
        .map(|u| u.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "canopy-agent.service",
            "canopy-frontend.service",
            "canopy-relay.service"
        ]
    );
    let out = verify(&units);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The installed filter path holds the standard filters only: the plugin the tests build to misbehave is in
    // the build tree, never where an installed daemon looks.
    let mut plugins: Vec<String> = std::fs::read_dir(root.path().join("usr/lib/canopy/filters"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    plugins.sort();
    assert_eq!(
        plugins,
        [
            "libcanopy_filter_classify.so",
            "libcanopy_filter_histogram.so",
            "libcanopy_filter_kmeans.so",
            "libcanopy_filter_latency.so",
            "libcanopy_filter_nodes.so",
            "libcanopy_filter_outliers.so",
            "libcanopy_filter_passthrough.so",
            "libcanopy_filter_stats.so",
            "libcanopy_filter_utilization.so"
        ]
    );
    for unit in &units {
        let text = std::fs::read_to_string(unit).unwrap();
        for needed in [
            "Type=notify",
            "ExecStartPre=",
            " validate --config /etc/canopy/canopy.toml",
            "Restart=on-failure",
            "ProtectSystem=strict",
            "NoNewPrivileges=yes",
            "User=canopy",
            "LimitNOFILE=",
        ] {
            assert!(text.contains(needed), "{}: no {needed}", unit.display());
        }
    }
    // The check can fail: a unit whose command does not exist is refused.
    let broken = root.path().join("units/canopy-broken.service");
    let text = std::fs::read_to_string(&units[0]).unwrap();
    std::fs::write(&broken, text.replace("/canopy-agent ", "/canopy-agnet ")).unwrap();
    let out = verify(&[broken]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("canopy-agnet"));
}

/// The ExecStartPre command of a unit, split on spaces.
fn exec_start_pre(unit: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(unit).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStartPre="))
        .expect("an ExecStartPre line");
    line.split_whitespace().map(str::to_string).collect()
}

#[test]
fn a_bad_config_fails_each_unit_at_validate_with_the_key_named() {
    let root = tempfile::tempdir().unwrap();
    install(root.path());
    let bad = root.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[frontend]\nlisten = \"nowhere\"\n[relay]\nparent = \"relay-host\"\n[agent]\nhold_dumps = -1\n",
    )
    .unwrap();
    let expect = [
        ("canopy-agent.service", "`agent.hold_dumps`"),
        ("canopy-frontend.service", "`frontend.listen`"),
        ("canopy-relay.service", "`relay.parent`"),
    ];
    for (unit, key) in expect {
        let mut cmd = exec_start_pre(&root.path().join("units").join(unit));
        for arg in &mut cmd {
            if arg == "/etc/canopy/canopy.toml" {
                *arg = bad.display().to_string();
            }
        }
        let out = Command::new(&cmd[0]).args(&cmd[1..]).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{unit}: {cmd:?}");
        // One line on stderr: what the journal shows for the failed ExecStartPre.
        let err = String::from_utf8_lossy(&out.stderr);
        let line = err.lines().find(|l| l.contains(key));
        assert!(
            line.is_some_and(|l| l.contains(&bad.display().to_string())),
            "{unit}: {err}"
        );
    }
    // The example configuration passes every unit's check.
    for (unit, _) in expect {
        let cmd = exec_start_pre(&root.path().join("units").join(unit));
        let cmd: Vec<String> = cmd
            .into_iter()
            .map(|a| {
                if a == "/etc/canopy/canopy.toml" {
                    root.path().join("etc/canopy.toml").display().to_string()
                } else {
                    a
                }
            })
            .collect();
        let out = Command::new(&cmd[0]).args(&cmd[1..]).output().unwrap();
        assert!(
            out.status.success(),
            "{unit}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Datagrams received on a NOTIFY_SOCKET until `until` appears (or the time-out).
fn notifications(socket: &UnixDatagram, until: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    let mut all = String::new();
    let mut buf = [0u8; 4096];
    while !all.contains(until) && Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buf) {
            all.push_str(&String::from_utf8_lossy(&buf[..n]));
            all.push('\n');
        }
    }
    all
}

#[test]
fn daemons_tell_systemd_when_they_serve_and_when_they_stop() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let ready = dir.path().join("fe.ready");
    let out = dir.path().join("out");
    let mut fe = Proc::start_with_env(
        dir.path(),
        "canopy-frontend",
        "frontend",
        &[
            "--listen",
            "127.0.0.1:0",
            "--out",
            out.to_str().unwrap(),
            "--ready-file",
            ready.to_str().unwrap(),
        ],
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            // WatchdogSec=4s: the root's task feeds it as its status ticks.
            ("WATCHDOG_USEC", "4000000"),
        ],
    );
    let addr = wait_ready_file(&ready, &mut fe).addr.to_string();
    let got = notifications(&socket, "READY=1", Duration::from_secs(10));
    assert!(
        got.contains("READY=1") && got.contains(&format!("STATUS=serving on {addr}")),
        "{got}"
    );
    // Fed again and again while the node turns: at least two pings within 2.5 half-intervals.
    let got = notifications(&socket, "never", Duration::from_secs(5));
    assert!(got.matches("WATCHDOG=1").count() >= 2, "{got}");
    // An agent is ready once its socket takes ranks.
    let agent_socket = dir.path().join("agent.sock");
    let _agent = Proc::start_with_env(
        dir.path(),
        "canopy-agent",
        "agent",
        &["--parent", &addr, "--socket", agent_socket.to_str().unwrap()],
        &[("NOTIFY_SOCKET", path.to_str().unwrap())],
    );
    let got = notifications(&socket, "serving ranks on", Duration::from_secs(10));
    assert!(got.contains("READY=1\nSTATUS=serving ranks on"), "{got}");
    assert!(agent_socket.exists());
    // A relay is ready once it listens for children, and names its parent.
    let _relay = Proc::start_with_env(
        dir.path(),
        "canopy-relay",
        "relay",
        &[
            "--node-id",
            "relay-0",
            "--parent",
            &addr,
            "--listen",
            "127.0.0.1:0",
        ],
        &[("NOTIFY_SOCKET", path.to_str().unwrap())],
    );
    let got = notifications(&socket, &format!("parent {addr}"), Duration::from_secs(10));
    assert!(
        got.contains("READY=1\nSTATUS=serving on 127.0.0.1:") && got.contains(&format!(", parent {addr}")),
        "{got}"
    );
    fe.signal(Signal::SIGTERM);
    let got = notifications(&socket, "STOPPING=1", Duration::from_secs(10));
    assert!(got.contains("STOPPING=1"), "{got}");
    assert!(fe.wait_timeout(Duration::from_secs(10)).is_some());
}

fn start_relay_on(dir: &Path, parent: &str, listen: &str) -> Proc {
    canopy_integration_tests::start_relay(dir, "relay-0", parent, listen).0
}

#[test]
fn a_relay_killed_and_started_again_on_its_port_is_rejoined_and_the_tree_heals() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, addr, store) = start_frontend(
        dir.path(),
        &["--expect-ranks", "16", "--stream-timeout-ms", "500"],
    );
    let listen = canopy_integration_tests::unused_addr();
    let relay = start_relay_on(dir.path(), &addr, &listen);
    let agent = |id: &str, offset: &str| {
        Proc::start(
            dir.path(),
            "canopy-agent",
            id,
            &[
                "--node-id",
                id,
                "--parent",
                &listen,
                "--socket",
                "none",
                "--simulate-ranks",
                "8",
                "--rank-offset",
                offset,
                "--total-ranks",
                "16",
                "--simulate-period-ms",
                "20",
            ],
        )
    };
    let _a0 = agent("agent-0", "0");
    let _a1 = agent("agent-1", "8");
    let wait = |what: &str, cond: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            #[allow(
                clippy::disallowed_methods,
                reason = "a synchronous poll of another process; no runtime worker is blocked"
            )]
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait("10 full rounds", &|| {
        read_rounds(&store).iter().filter(|r| r.covered == 16).count() >= 10
    });
    relay.signal(Signal::SIGKILL);
    drop(relay);
    #[allow(
        clippy::disallowed_methods,
        reason = "lets the children notice the lost parent; there is no event to wait on from here"
    )]
    std::thread::sleep(Duration::from_millis(700));
    // The agents' way to the root went through the dead relay: they show as lost with it, never attached.
    wait("the agents shown lost with the relay", &|| {
        let nodes = canopy_integration_tests::reader(&store)
            .nodes()
            .unwrap_or_default();
        ["agent-0", "agent-1"].iter().all(|id| {
            nodes.iter().any(|n| {
                n.node_id == *id
                    && n.state == canopy_proto::v1::NodeState::Lost
                    && n.detail.as_deref() == Some("lost with relay-0, its way to the root")
            })
        })
    });
    let before = read_rounds(&store).last().map_or(0, |r| r.round);
    // As Restart=on-failure would: the same command, the same port.
    let _relay = start_relay_on(dir.path(), &addr, &listen);
    wait("full rounds after the restart", &|| {
        read_rounds(&store)
            .iter()
            .filter(|r| r.round > before + 5 && r.covered == 16)
            .count()
            >= 10
    });
    // Back under the restarted relay, they are attached again.
    wait("the agents attached again", &|| {
        let nodes = canopy_integration_tests::reader(&store)
            .nodes()
            .unwrap_or_default();
        nodes
            .iter()
            .filter(|n| n.node_id.starts_with("agent-") && n.state == canopy_proto::v1::NodeState::Attached)
            .count()
            == 2
    });
    // While the relay was away its ranks were counted, never dropped silently.
    for r in read_rounds(&store) {
        assert_eq!(r.expected, 16, "{r:?}");
    }
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(15)).is_some());
}
