//! The agent's socket as another local user, or a careless or hostile process of the same user, meets it: a
//! private directory and socket, every connection's credentials checked, and hellos that cannot poison a run
//! (one size per application, one connection per rank, a first round within reach, and ranks that leave before
//! their first dump forgotten rather than lost in every round). Real agents, real Unix sockets; the tests run as
//! root and use `nobody` (uid 65534) as the other user.

#![allow(
    clippy::disallowed_types,
    reason = "synchronous tests that wait on real processes by the wall clock; no tokio clock to pause"
)]

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use canopy_integration_tests::{
    Proc, bin_dir, read_rounds, start_frontend, start_relay, start_socket_agent, wait_for,
};
use canopy_proto::v1::MissingReason;
use canopy_wire::v1::{AgentMessage, RankDump, RankFin, RankHello, RankMessage, agent_message, rank_message};
use canopy_wire::{RANK_PROTOCOL_VERSION, encode_frame, read_frame};
use nix::sys::signal::Signal;

const NOBODY: u32 = 65534;

#[allow(
    clippy::disallowed_methods,
    reason = "a synchronous pause between two refusals, so the second lands in the next second of the log"
)]
fn pause(d: Duration) {
    std::thread::sleep(d);
}

/// Waits until the agent serves `path` (connects as this process: only for agents that let root in).
fn wait_socket(path: &Path, agent: &mut Proc) {
    wait_for("the agent's socket", Duration::from_secs(20), || {
        if let Ok(Some(status)) = agent.child.try_wait() {
            panic!("agent exited with {status}:\n{}", agent.log_text());
        }
        path.exists() && UnixStream::connect(path).is_ok()
    });
}

/// Waits until the agent's log says it serves its socket.
fn wait_serving(agent: &mut Proc) {
    wait_for("the agent to serve its socket", Duration::from_secs(20), || {
        if let Ok(Some(status)) = agent.child.try_wait() {
            panic!("agent exited with {status}:\n{}", agent.log_text());
        }
        agent.log_text().contains("serving ranks on the socket")
    });
}

/// A rank speaking the socket protocol by hand.
struct RawRank {
    stream: UnixStream,
}

impl RawRank {
    fn hello(socket: &Path, app: &str, rank: u32, nranks: u32, next_round: u64) -> RawRank {
        let stream = UnixStream::connect(socket).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut raw = RawRank { stream };
        raw.send(rank_message::Msg::Hello(RankHello {
            protocol_version: RANK_PROTOCOL_VERSION,
            app: app.into(),
            rank,
            nranks,
            pid: std::process::id(),
            next_round,
        }));
        raw
    }

    fn send(&mut self, msg: rank_message::Msg) {
        let mut frame = Vec::new();
        encode_frame(&RankMessage { msg: Some(msg) }, &mut frame);
        self.stream.write_all(&frame).unwrap();
    }

    fn read(&mut self) -> AgentMessage {
        read_frame(&mut self.stream, &mut Vec::new()).unwrap()
    }

    /// The agent accepted the hello (its first control came).
    fn accepted(mut self) -> RawRank {
        match self.read().msg {
            Some(agent_message::Msg::Control(_)) => self,
            other => panic!("not accepted: {other:?}"),
        }
    }

    /// The agent refused the hello: its reason, and the connection closed.
    fn refused(mut self) -> String {
        let reason = match self.read().msg {
            Some(agent_message::Msg::Refused(r)) => r.reason,
            other => panic!("not refused: {other:?}"),
        };
        assert_eq!(
            self.stream.read(&mut [0u8; 8]).unwrap(),
            0,
            "the refused connection is closed"
        );
        reason
    }

    fn dump(&mut self, app: &str, rank: u32, round: u64) {
        let dump = canopy_integration_tests::work_dump(app, rank, round);
        self.send(rank_message::Msg::Dump(dump));
    }
}

fn mode_of(path: &Path) -> (u32, u32, u32) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    (meta.mode() & 0o7777, meta.uid(), meta.gid())
}

/// The agent's command, in plaintext on loopback (its parent is never there).
fn agent_command() -> Command {
    let mut cmd = Command::new(bin_dir().join("canopy-agent"));
    cmd.arg("--insecure");
    cmd
}

/// The agent started with `args`, expected to refuse to start: its exit code and stderr.
fn agent_refuses(args: &[&str]) -> (Option<i32>, String) {
    let out = agent_command()
        .args(["--parent", "127.0.0.1:9"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An agent process running as `nobody`, its socket at `socket`.
fn agent_as_nobody(dir: &Path, socket: &Path) -> Proc {
    let log = dir.join("agent-nobody.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut cmd = agent_command();
    cmd.args(["--node-id", "agent-nobody", "--parent", "127.0.0.1:9", "--socket"])
        .arg(socket)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file);
    Proc {
        name: "agent-nobody".into(),
        child: cmd.spawn().unwrap(),
        log,
    }
}

/// The Rust example (application `stencil-rs`) as one rank of a one-rank application, run as `uid`/`gid`;
/// returns its output once it ends.
fn stencil_as(socket: &Path, uid: u32, gid: u32) -> String {
    let out = Command::new(bin_dir().join("canopy-stencil"))
        .args(["20", "16", "1000"])
        .env_clear()
        .env("CANOPY_AGENT_SOCKET", socket)
        .env("CANOPY_RANK", "0")
        .env("CANOPY_NRANKS", "1")
        .env("CANOPY_FINALIZE_TIMEOUT_MS", "3000")
        .uid(uid)
        .gid(gid)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A temporary directory others may enter (root's own are 0700): for what `nobody` must reach.
fn open_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn the_socket_and_the_directory_the_agent_makes_for_it_are_private() {
    let dir = open_tempdir();
    // Alone: a directory of mode 0700 and a socket of mode 0600, both the agent's.
    let socket = dir.path().join("run").join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", "127.0.0.1:9", &socket);
    wait_socket(&socket, &mut agent);
    assert_eq!(mode_of(socket.parent().unwrap()), (0o700, 0, 0));
    assert_eq!(mode_of(&socket), (0o600, 0, 0));
    // nobody cannot even reach it.
    let out = stencil_as(&socket, NOBODY, NOBODY);
    assert!(out.contains("Permission denied"), "{out}");
    drop(agent);

    // With a group: the directory 0710 and the socket 0660, both in that group, and its members get in.
    let socket = dir.path().join("grp").join("agent.sock");
    let args = [
        "--node-id",
        "agent-grp",
        "--parent",
        "127.0.0.1:9",
        "--socket",
        socket.to_str().unwrap(),
        "--socket-group",
        "nogroup",
    ];
    let mut agent = Proc::start(dir.path(), "canopy-agent", "agent-grp", &args);
    wait_socket(&socket, &mut agent);
    assert_eq!(mode_of(socket.parent().unwrap()), (0o710, 0, NOBODY));
    assert_eq!(mode_of(&socket), (0o660, 0, NOBODY));
    let out = stencil_as(&socket, NOBODY, NOBODY);
    assert!(!out.contains("not delivered"), "{out}\n{}", agent.log_text());
    wait_for("the member's rank", Duration::from_secs(10), || {
        agent.log_text().contains("rank 0 of stencil-rs")
    });
    let log = agent.log_text();
    assert!(
        log.contains("rank 0 of stencil-rs") && log.contains("attached"),
        "{log}"
    );
    assert!(!log.contains("refused a"), "{log}");
}

#[test]
fn a_directory_another_user_owns_or_may_write_is_refused_and_named() {
    let dir = open_tempdir();
    // Another user's directory: they could swap the socket for theirs and receive the ranks' hellos.
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = theirs.join("agent.sock");
    let (code, err) = agent_refuses(&["--socket", socket.to_str().unwrap()]);
    assert_eq!(code, Some(76), "{err}");
    assert!(
        err.contains(&format!(
            "{} is owned by uid 65534, not by this agent's user (uid 0): another user could replace the socket in \
             it; remove it or choose another --socket",
            theirs.display()
        )),
        "{err}"
    );
    assert!(!socket.exists(), "nothing was bound there");

    // The agent's own directory, but writable by others.
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (code, err) = agent_refuses(&["--socket", open.join("agent.sock").to_str().unwrap()]);
    assert_eq!(code, Some(76), "{err}");
    assert!(
        err.contains(&format!(
            "{} has mode 0777, writable by other users: they could replace the socket in it; make it 0700 or choose \
             another --socket",
            open.display()
        )),
        "{err}"
    );
    // /tmp itself: shared by every user.
    let (code, err) = agent_refuses(&["--socket", "/tmp/canopy-test-shared.sock"]);
    assert_eq!(code, Some(76), "{err}");
    assert!(
        err.contains("/tmp has mode 1777, writable by other users"),
        "{err}"
    );

    // A symbolic link in the directory's place: whoever owns it could point it elsewhere later.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&theirs, &link).unwrap();
    let (code, err) = agent_refuses(&["--socket", link.join("agent.sock").to_str().unwrap()]);
    assert_eq!(code, Some(76), "{err}");
    assert!(
        err.contains(&format!(
            "{} is a symbolic link: give the socket's directory itself",
            link.display()
        )),
        "{err}"
    );

    // And names that do not resolve are refused by validate, with the key.
    let out = Command::new(bin_dir().join("canopy-agent"))
        .args(["validate", "--socket-group", "no-such-group-here"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`--socket-group` (from command-line flags): no group named \"no-such-group-here\""),
        "{err}"
    );
    let out = Command::new(bin_dir().join("canopy-agent"))
        .args(["validate", "--allowed-users", "root,no-such-user-here"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`--allowed-users` (from command-line flags): no user named \"no-such-user-here\""),
        "{err}"
    );
}

/// Every line of `log` that says a connection was refused, with the count of those it says were not logged.
fn refusal_lines(log: &str) -> (usize, u64) {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("refused a connection"))
        .collect();
    let unlogged = lines
        .iter()
        .filter_map(|l| l.split(" more refused since the last such line").next())
        .filter_map(|l| l.rsplit('(').next())
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum();
    (lines.len(), unlogged)
}

#[test]
fn another_users_connection_is_refused_by_its_credentials_and_logged_at_most_once_a_second() {
    let dir = open_tempdir();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::os::unix::fs::chown(&run, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = run.join("agent.sock");
    let mut agent = agent_as_nobody(dir.path(), &socket);
    wait_serving(&mut agent);
    assert_eq!(mode_of(&socket), (0o600, NOBODY, NOBODY));

    // Root passes the file modes, not the agent's check: it is not the agent's user, nor listed.
    let reason = RawRank::hello(&socket, "intruder", 0, 1, 0).refused();
    assert_eq!(
        reason,
        format!(
            "uid 0 (pid {}) may not use this agent's socket (allowed: uid 65534)",
            std::process::id()
        )
    );
    wait_for("the refusal in the log", Duration::from_secs(10), || {
        agent.log_text().contains("refused a connection")
    });
    assert!(
        agent.log_text().contains(&format!(
            "agent socket: refused a connection: uid 0 (pid {}) may not use this agent's socket",
            std::process::id()
        )),
        "{}",
        agent.log_text()
    );
    // A stranger that reconnects in a loop: each connection refused, the log a line a second at most.
    for _ in 0..50 {
        let _ = RawRank::hello(&socket, "intruder", 0, 1, 0).refused();
    }
    pause(Duration::from_millis(1100));
    let _ = RawRank::hello(&socket, "intruder", 0, 1, 0).refused();
    wait_for("the last refusal's line", Duration::from_secs(10), || {
        let (lines, unlogged) = refusal_lines(&agent.log_text());
        lines as u64 + unlogged == 52
    });
    let (lines, _) = refusal_lines(&agent.log_text());
    assert!(lines <= 4, "{lines} lines for 52 refusals:\n{}", agent.log_text());

    // The agent's own user is served.
    let out = stencil_as(&socket, NOBODY, NOBODY);
    assert!(!out.contains("not delivered"), "{out}");
    let log = agent.log_text();
    assert!(
        log.contains("rank 0 of stencil-rs") && log.contains("attached"),
        "{log}"
    );
}

#[test]
fn a_group_member_that_is_not_allowed_is_refused_by_its_credentials() {
    let dir = open_tempdir();
    let socket = dir.path().join("grp").join("agent.sock");
    // The socket's group may reach it, but only root is allowed to use it.
    let args = [
        "--node-id",
        "agent-grp",
        "--parent",
        "127.0.0.1:9",
        "--socket",
        socket.to_str().unwrap(),
        "--socket-group",
        "nogroup",
        "--allowed-users",
        "root",
    ];
    let mut agent = Proc::start(dir.path(), "canopy-agent", "agent-grp", &args);
    wait_socket(&socket, &mut agent);
    let out = stencil_as(&socket, NOBODY, NOBODY);
    assert!(out.contains("dumps were not delivered"), "{out}");
    let log = agent.log_text();
    assert!(
        log.contains("agent socket: refused a connection: uid 65534 (pid ")
            && log.contains("may not use this agent's socket (allowed: uid 0)"),
        "{log}"
    );
    assert!(!log.contains("rank 0 of stencil-rs"), "{log}");
}

#[test]
fn hellos_that_would_poison_a_run_are_refused_with_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", "127.0.0.1:9", &socket);
    wait_socket(&socket, &mut agent);
    let pid = std::process::id();
    let mut first = RawRank::hello(&socket, "app", 0, 3, 0).accepted();

    // Another size than the application's first rank announced.
    let reason = RawRank::hello(&socket, "app", 1, 4, 0).refused();
    assert_eq!(
        reason,
        format!(
            "rank 1 of app (pid {pid}) announces 4 ranks, but app has 3 (announced first by rank 0, pid {pid})"
        )
    );
    let reason = RawRank::hello(&socket, "app", 1, 0, 0).refused();
    assert!(reason.contains("announces 0 ranks, but app has 3"), "{reason}");

    // The same rank while the first connection is open, even once it finished.
    first.send(rank_message::Msg::Fin(RankFin {
        rounds_end: 0,
        dropped: 0,
    }));
    assert!(matches!(first.read().msg, Some(agent_message::Msg::FinAck(_))));
    let reason = RawRank::hello(&socket, "app", 0, 3, 0).refused();
    assert_eq!(
        reason,
        format!("rank 0 of app (pid {pid}) is already attached (pid {pid})")
    );

    // A first round far past the agent's rounds (collection has not started: they begin at 0).
    let reason = RawRank::hello(&socket, "far", 0, 1, 1 << 40).refused();
    assert_eq!(
        reason,
        format!(
            "rank 0 of far (pid {pid}) starts at round 1099511627776, more than 65536 rounds past this agent's \
             rounds (below 0)"
        )
    );
    let _in_reach = RawRank::hello(&socket, "near", 0, 1, 65536).accepted();

    // Once the first connection closes, its rank may attach again; and since no rank of `app` ever dumped, a
    // size announced by ranks that all left fixes nothing.
    assert!(agent.log_text().contains(&format!(
        "rank 0 of app (pid {pid}) finished before its first dump"
    )));
    drop(first);
    let mut again = None;
    wait_for(
        "the first connection to close",
        Duration::from_secs(10),
        || match RawRank::hello(&socket, "app", 0, 8, 0).read().msg {
            Some(agent_message::Msg::Control(_)) => {
                again = Some(());
                true
            }
            _ => false,
        },
    );
    assert!(again.is_some());
}

#[test]
fn a_flood_of_refused_hellos_is_logged_at_most_once_a_second_with_the_count_held_back() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", "127.0.0.1:9", &socket);
    wait_socket(&socket, &mut agent);
    let _first = RawRank::hello(&socket, "app", 0, 3, 0).accepted();
    let started = std::time::Instant::now();
    let floods = 300;
    for _ in 0..floods {
        let reason = RawRank::hello(&socket, "app", 1, 4, 0).refused();
        assert!(reason.contains("announces 4 ranks, but app has 3"), "{reason}");
    }
    let seconds = started.elapsed().as_secs() + 1;
    // The last held-back refusals are told by the next line: one more, a second later.
    #[allow(
        clippy::disallowed_methods,
        reason = "the log's limit is by the wall clock: nothing to wait on but a second"
    )]
    std::thread::sleep(Duration::from_millis(1100));
    let _ = RawRank::hello(&socket, "app", 1, 4, 0).refused();
    let log = agent.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("refused a rank")).collect();
    assert!(
        lines.len() as u64 <= seconds + 2,
        "{} lines for {floods} refusals in {seconds} s",
        lines.len()
    );
    let held: u64 = lines
        .iter()
        .filter_map(|l| l.split(" more refused since the last such line").next())
        .filter_map(|l| l.rsplit('(').next())
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum();
    assert_eq!(
        lines.len() as u64 + held,
        floods + 1,
        "every refusal counted once: {lines:?}"
    );
}

#[test]
fn a_thousand_hellos_are_refused_or_forgotten_and_later_rounds_count_the_real_ranks_only() {
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, fe_addr, store) = start_frontend(dir.path(), &["--streams", "stats"]);
    // Through a relay: the agent's smaller count of ranks must reach the front-end through it.
    let (_relay, relay_addr) = start_relay(dir.path(), "relay-0", &fe_addr, "127.0.0.1:0");
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", &relay_addr, &socket);
    wait_socket(&socket, &mut agent);
    let mut ranks: Vec<RawRank> = (0..3)
        .map(|r| RawRank::hello(&socket, "raw", r, 3, 0).accepted())
        .collect();
    let dump_rounds = |ranks: &mut [RawRank], rounds: std::ops::Range<u64>| {
        for round in rounds {
            for (i, r) in ranks.iter_mut().enumerate() {
                r.dump("raw", i as u32, round);
            }
        }
    };
    dump_rounds(&mut ranks, 0..5);
    wait_for("rounds 0-4", Duration::from_secs(20), || {
        read_rounds(&store).len() >= 5
    });

    // 1,000 hellos with distinct ranks under the application's name: past its announced size, or announcing
    // another size. All refused.
    for rank in 3..503 {
        let reason = RawRank::hello(&socket, "raw", rank, 3, 0).refused();
        assert!(
            reason.ends_with("is not below the application's announced size 3"),
            "{reason}"
        );
    }
    for rank in 3..503 {
        let reason = RawRank::hello(&socket, "raw", rank, 1003, 0).refused();
        assert!(reason.contains("announces 1003 ranks, but raw has 3"), "{reason}");
    }
    // 1,000 more under an application of their own: they attach, and leave without a dump.
    for batch in 0..4u32 {
        let forged: Vec<RawRank> = (batch * 250..(batch + 1) * 250)
            .map(|r| RawRank::hello(&socket, "forged", r, 1000, 5).accepted())
            .collect();
        drop(forged);
    }
    wait_for(
        "the forged ranks to be forgotten",
        Duration::from_secs(20),
        || agent.log_text().matches("hung up before its first dump").count() >= 1000,
    );

    dump_rounds(&mut ranks, 5..10);
    wait_for("rounds 5-9", Duration::from_secs(20), || {
        read_rounds(&store).len() >= 10
    });
    let rounds = read_rounds(&store);
    for r in &rounds[..10] {
        assert_eq!((r.covered, r.expected), (3, 3), "{r:?}");
        assert_eq!(r.missing.get(MissingReason::Lost), 0, "{r:?}");
    }
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(10)).is_some());
}

#[test]
fn an_announcement_from_a_rank_that_left_before_its_first_dump_does_not_hold_the_start() {
    let dir = tempfile::tempdir().unwrap();
    // A minute's start time-out: a start held by the forged announcement would not come within the test's wait.
    let (mut fe, addr, store) =
        start_frontend(dir.path(), &["--streams", "stats", "--start-timeout-ms", "60000"]);
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    // A rank announcing a million ranks comes and goes before the application starts.
    drop(RawRank::hello(&socket, "forged", 0, 1_000_000, 0).accepted());
    wait_for("the forged rank to be forgotten", Duration::from_secs(10), || {
        agent.log_text().contains("hung up before its first dump")
    });
    let mut ranks: Vec<RawRank> = (0..2)
        .map(|r| RawRank::hello(&socket, "app", r, 2, 0).accepted())
        .collect();
    for round in 0..3 {
        for (i, r) in ranks.iter_mut().enumerate() {
            r.dump("app", i as u32, round);
        }
    }
    wait_for("rounds 0-2", Duration::from_secs(15), || {
        read_rounds(&store).len() >= 3
    });
    for r in read_rounds(&store).iter().take(3) {
        assert_eq!((r.covered, r.expected), (2, 2), "{r:?}");
    }
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(10)).is_some());
}

/// A rank's notices (a counter it could not open) reach the agent's log, but no more than a few per connection
/// and each cut to one line: a rank cannot flood the log or forge lines of its own.
#[test]
fn a_ranks_notices_are_logged_a_few_per_connection_each_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", "127.0.0.1:9", &socket);
    wait_socket(&socket, &mut agent);
    let mut rank = RawRank::hello(&socket, "noisy", 0, 1, 0).accepted();
    for round in 0..50 {
        rank.send(rank_message::Msg::Dump(RankDump {
            round,
            dump_unix_ns: 1,
            absence: canopy_wire::v1::RankAbsence::Stopped as i32,
            notices: vec![
                format!("notice {round}\nrank 9 of forged (pid 1): a line of its own"),
                "x".repeat(10_000),
            ],
            ..Default::default()
        }));
    }
    let pid = std::process::id();
    let prefix = format!("rank 0 of noisy (pid {pid}): ");
    wait_for("the notices in the log", Duration::from_secs(10), || {
        agent.log_text().contains("xxxxxxxx")
    });
    pause(Duration::from_millis(300));
    let log = agent.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(&prefix)).collect();
    assert_eq!(lines.len(), 16, "{log}");
    assert!(lines.iter().all(|l| l.len() < 500), "a notice is cut to a line");
    assert!(lines[0].contains("notice 0 rank 9 of forged"), "{}", lines[0]);
    assert!(!log.lines().any(|l| l.starts_with("rank 9 of forged")), "{log}");
}
