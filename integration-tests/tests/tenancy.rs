//! Several users on one agent socket, and hostile hellos from the agent's own users: an application belongs to
//! the user of its first rank (by the kernel's credentials), a simulated rank cannot be claimed, and no hello may
//! announce an application larger than the agent allows. Real agents and front-ends, real Unix sockets, ranks as
//! processes of their own; the tests run as root and use `nobody` (uid 65534) as the other user.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use canopy_integration_tests::{Proc, TestRank, bin_dir, read_rounds, start_frontend, wait_for};
use canopy_proto::v1::MissingReason;
use nix::sys::signal::Signal;

const NOBODY: (u32, u32) = (65534, 65534);

fn wait_serving(agent: &mut Proc) {
    wait_for("the agent to serve its socket", Duration::from_secs(20), || {
        if let Ok(Some(status)) = agent.child.try_wait() {
            panic!("agent exited with {status}:\n{}", agent.log_text());
        }
        agent.log_text().contains("serving ranks on the socket")
    });
}

/// An agent under `parent` whose socket the members of group `nogroup` (nobody's) may use, as docs/deploy.md
/// sets up a shared node.
fn shared_agent(dir: &Path, parent: &str, socket: &Path, extra: &[&str]) -> Proc {
    let mut args = vec![
        "--node-id",
        "agent-0",
        "--parent",
        parent,
        "--socket",
        socket.to_str().unwrap(),
        "--socket-group",
        "nogroup",
    ];
    args.extend_from_slice(extra);
    let mut agent = Proc::start(dir, "canopy-agent", "agent-0", &args);
    wait_serving(&mut agent);
    agent
}

/// A temporary directory others may enter (root's own are 0700).
fn open_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn two_users_on_one_socket_neither_join_nor_take_each_others_applications() {
    let dir = open_tempdir();
    // Its ranks are dropped, not finished, before the tree stops: the drain waits out its time-out, kept short.
    let (mut fe, fe_addr, store) =
        start_frontend(dir.path(), &["--streams", "stats", "--drain-timeout-ms", "2000"]);
    let socket = dir.path().join("run").join("agent.sock");
    let agent = shared_agent(dir.path(), &fe_addr, &socket, &[]);

    // Root's application: its rank 0 attaches first, so the application is root's on this agent.
    let root0 = TestRank::start(&socket, "shared", 0, 2, 5, None);
    root0.assert_accepted();
    // Nobody may use the socket, but not to add a rank to root's application.
    let intruder = TestRank::start(&socket, "shared", 1, 2, 20, Some(NOBODY));
    assert_eq!(
        intruder.refusal(),
        format!(
            "rank 1 of shared (pid {}, uid 65534) may not join shared: on this agent it belongs to uid 0 (its rank \
             0, pid {})",
            intruder.pid(),
            root0.pid()
        )
    );
    // Root's own rank 1 is not held out by the refused one.
    let root1 = TestRank::start(&socket, "shared", 1, 2, 5, None);
    root1.assert_accepted();
    wait_for("rounds 0-4", Duration::from_secs(20), || {
        read_rounds(&store).len() >= 5
    });
    for r in read_rounds(&store).iter().take(5) {
        assert_eq!((r.covered, r.expected), (2, 2), "{r:?}");
    }

    // Nobody's application is nobody's: root cannot take a rank of it either, and the refusal says whose it is.
    let theirs = TestRank::start(&socket, "theirs", 0, 1, 0, Some(NOBODY));
    theirs.assert_accepted();
    let taken = TestRank::start(&socket, "theirs", 0, 1, 0, None);
    assert_eq!(
        taken.refusal(),
        format!(
            "rank 0 of theirs (pid {}, uid 0) may not join theirs: on this agent it belongs to uid 65534 (its rank \
             0, pid {})",
            taken.pid(),
            theirs.pid()
        )
    );
    let log = agent.log_text();
    assert!(
        log.contains("agent socket: refused a rank: rank 1 of shared (pid"),
        "{log}"
    );
    drop((root0, root1, theirs));
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(10)).is_some());
}

#[test]
fn a_hello_cannot_claim_a_simulated_rank_nor_announce_more_ranks_than_the_agent_allows() {
    let dir = open_tempdir();
    let (mut fe, fe_addr, store) = start_frontend(dir.path(), &["--streams", "stats"]);
    let socket = dir.path().join("run").join("agent.sock");
    let extra = [
        "--simulate-ranks",
        "4",
        "--simulate-period-ms",
        "50",
        "--app",
        "sim",
        "--max-app-ranks",
        "64",
    ];
    let agent = shared_agent(dir.path(), &fe_addr, &socket, &extra);
    wait_for("round 2", Duration::from_secs(20), || {
        read_rounds(&store).len() >= 3
    });

    // A rank of the simulated application, from another user and from the agent's own.
    for user in [Some(NOBODY), None] {
        let forged = TestRank::start(&socket, "sim", 2, 4, 0, user);
        assert_eq!(
            forged.refusal(),
            format!(
                "rank 2 of sim (pid {}) names the application of this agent's simulated ranks",
                forged.pid()
            )
        );
    }
    // An application of 16,777,216 ranks, and a rank number past the bound with no size announced.
    let huge = TestRank::start(&socket, "huge", 0, 1 << 24, 0, Some(NOBODY));
    assert_eq!(
        huge.refusal(),
        format!(
            "rank 0 of huge (pid {}) announces 16777216 ranks, more than this agent's max_app_ranks (64)",
            huge.pid()
        )
    );
    let far = TestRank::start(&socket, "far", 64, 0, 0, Some(NOBODY));
    assert_eq!(
        far.refusal(),
        format!(
            "rank 64 of far (pid {}) is not below this agent's max_app_ranks (64)",
            far.pid()
        )
    );

    // Every round, before and after, holds the four simulated ranks and no one else.
    let seen = read_rounds(&store).len();
    wait_for("ten more rounds", Duration::from_secs(20), || {
        read_rounds(&store).len() >= seen + 10
    });
    let rounds = read_rounds(&store);
    for r in &rounds[..seen + 10] {
        assert_eq!((r.covered, r.expected), (4, 4), "{r:?}");
        assert_eq!(r.missing.get(MissingReason::Lost), 0, "{r:?}");
    }
    assert!(agent.log_text().contains("refused a rank"));
    // Within the bound, an application of the user's own is served.
    TestRank::start(&socket, "near", 63, 64, 0, Some(NOBODY)).assert_accepted();
    fe.signal(Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(10)).is_some());
}

#[test]
fn an_agent_refuses_rank_numbers_past_what_a_tree_carries() {
    let validate = |args: &[&str]| {
        let out = Command::new(bin_dir().join("canopy-agent"))
            .arg("validate")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = validate(&["--rank-offset", "4294967295", "--simulate-ranks", "4"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains(
            "`--rank-offset` (from command-line flags): plus simulate_ranks is 4294967299, past the highest rank \
             number a tree carries (16777216)"
        ),
        "{err}"
    );
    let (code, err) = validate(&["--max-app-ranks", "0"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("`--max-app-ranks` (from command-line flags): must be from 1 to 16777216"),
        "{err}"
    );
}
