//! `canopy top` on a real tree: in tmux at 80x24 (every node of the tree on screen, rounds per second above
//! zero while rounds run, nothing wider than the pane), and `--once` through a pipe (one row per node).
//!
//! The tmux test needs tmux, which `.ci/run` installs and says so with CANOPY_TMUX_TEST=1: then a missing tmux
//! fails the test. Elsewhere it prints why it cannot run and passes.

mod tmux;

use std::time::Duration;

use canopy_integration_tests::{TreeBuilder, assert_eventually, bin_dir};
use tmux::{Session, missing};

/// Four agents under two relays: frontend:0, relay:0 and relay:1, agent:0 to agent:3.
const NODES: [&str; 7] = [
    "frontend:0",
    "relay:0",
    "relay:1",
    "agent:0",
    "agent:1",
    "agent:2",
    "agent:3",
];

fn tree() -> TreeBuilder {
    TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 16,
        rounds: 0,
        period_ms: 100,
        // A one-phase and a two-phase stream: a round counts once at every node, whatever its phases.
        streams: vec!["stats".into(), "histogram".into()],
        exit_on_fin: false,
        ..TreeBuilder::default()
    }
}

/// The root's rounds per second from the header: `... root 9.9 rounds/s`.
fn root_rate(screen: &str) -> Option<f64> {
    let first = screen.lines().next()?;
    first
        .split(" root ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Each node's rounds per second, in the order of NODES; none while the table or a rate is not there.
fn rates(screen: &str) -> Option<Vec<f64>> {
    let header: Vec<&str> = screen.lines().nth(2)?.split_whitespace().collect();
    let col = header.iter().position(|h| *h == "rounds/s")?;
    NODES
        .iter()
        .map(|n| row(screen, n)?.split_whitespace().nth(col)?.parse().ok())
        .collect()
}

/// The row of a node: the line whose first word is its id.
fn row<'a>(screen: &'a str, node: &str) -> Option<&'a str> {
    screen.lines().find(|l| l.split_whitespace().next() == Some(node))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canopy_top_shows_every_node_live_in_tmux_at_80x24() {
    if missing().is_some() {
        return;
    }
    let tree = tree().start().await;
    let cmd = format!(
        "{} top --insecure --frontend {}",
        bin_dir().join("canopy").display(),
        tree.frontend_addr
    );
    let session = Session::start("canopy-top", 80, 24, &cmd);
    #[allow(
        unused_assignments,
        reason = "each wait reads the screen afresh; the empty start is for a failure before the first read"
    )]
    let mut screen = String::new();
    assert_eventually!(
        {
            screen = session.screen();
            NODES.iter().all(|n| row(&screen, n).is_some()) && root_rate(&screen).is_some_and(|r| r > 0.0)
        },
        Duration::from_secs(60),
        "not every node, or no rounds per second, at 80x24:\n{screen}"
    );
    assert!(tmux::fits(&screen, 80, 24), "wider than 80x24:\n{screen}");
    assert!(screen.contains("7 nodes: 2 relays, 4 agents"), "{screen}");
    // Indented by depth: the relays by two columns, the agents by four.
    assert!(screen.lines().any(|l| l.starts_with("  relay:1 ")), "{screen}");
    assert!(screen.lines().any(|l| l.starts_with("    agent:3 ")), "{screen}");
    // Every node is attached and the agents send bytes up.
    for n in NODES {
        assert!(row(&screen, n).unwrap().contains("attached"), "{n}:\n{screen}");
    }
    // Every node's rounds per second, once each has been seen twice: above zero, and sane.
    assert_eventually!(
        {
            screen = session.screen();
            rates(&screen).is_some_and(|r| r.iter().all(|r| *r > 0.0))
        },
        Duration::from_secs(30),
        "a node without rounds per second:\n{screen}"
    );
    // Ranks dump every 100 ms: a node closes about 10 rounds a second. The margin allows a catch-up after a
    // stall of a loaded machine; counting each phase of each stream would show 30.
    for rate in rates(&screen).unwrap() {
        assert!(rate < 20.0, "{rate} rounds/s:\n{screen}");
    }
    // At 80 columns → brings the columns on the right into view: the troubles and the filters' time.
    let table_head = |screen: &str| {
        screen
            .lines()
            .find(|l| l.starts_with("node "))
            .map(str::to_string)
    };
    assert!(
        table_head(&screen).is_some_and(|h| !h.contains("malformed")),
        "{screen}"
    );
    // Eight presses shift out state to late: malformed comes first after the node.
    for _ in 0..8 {
        session.keys("Right");
    }
    assert_eventually!(
        {
            screen = session.screen();
            table_head(&screen)
                .is_some_and(|h| h.contains("malformed") && h.contains("dropped") && h.contains("stats ms/s"))
        },
        Duration::from_secs(10),
        "→ did not shift the columns:\n{screen}"
    );
    assert!(tmux::fits(&screen, 80, 24), "{screen}");
    for _ in 0..8 {
        session.keys("Left");
    }
    // 200x60: redrawn with every column, the open stream's filter time included.
    session.resize(200, 60);
    assert_eventually!(
        {
            screen = session.screen();
            // Whole: a capture may catch the screen mid-redraw.
            screen.contains("stats ms/s")
                && screen.contains("histogram ms/s")
                && screen.contains("malformed")
                && NODES.iter().all(|n| row(&screen, n).is_some())
        },
        Duration::from_secs(30),
        "not redrawn at 200x60:\n{screen}"
    );
    assert!(tmux::fits(&screen, 200, 60), "{screen}");
    // `s` sorts by rounds/s and says so.
    session.keys("s");
    assert_eventually!(
        {
            screen = session.screen();
            screen.contains("sort: rounds/s")
        },
        Duration::from_secs(10),
        "s did not sort:\n{screen}"
    );
    session.quit("top").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canopy_top_once_prints_a_row_per_node_through_a_pipe() {
    let tree = tree().start().await;
    let store = tree.store.clone();
    assert_eventually!(
        canopy_integration_tests::read_rounds(&store).len() >= 3,
        Duration::from_secs(60),
        "no rounds"
    );
    let out = tokio::process::Command::new(bin_dir().join("canopy"))
        .args(["top", "--once", "--insecure", "--frontend", &tree.frontend_addr])
        .output()
        .await
        .expect("canopy runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1 + NODES.len(), "{text}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    // Piped: every column, the filter time of the open stream included.
    for col in [
        "node",
        "state",
        "kind",
        "ranks",
        "rounds/s",
        "lag",
        "in/s",
        "out/s",
        "late",
        "malformed",
        "dropped",
    ] {
        assert!(header.contains(&col), "{col}: {text}");
    }
    assert!(lines[0].contains("stats ms/s"), "{text}");
    for n in NODES {
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.split_whitespace().next() == Some(n))
                .count(),
            1,
            "{n}: {text}"
        );
    }
    let root = row(&text, "frontend:0").unwrap();
    let rate_col = header.iter().position(|h| *h == "rounds/s").unwrap();
    let rate: f64 = root.split_whitespace().nth(rate_col).unwrap().parse().unwrap();
    assert!(rate > 0.0, "{text}");
    // Bytes with units: the agents send their dumps up.
    let agent = row(&text, "agent:0").unwrap();
    assert!(agent.contains("B/s"), "{text}");
    assert!(text.contains("KiB/s") || text.contains("MiB/s"), "{text}");
    // An unreachable front-end: one line, a failure.
    let out = tokio::process::Command::new(bin_dir().join("canopy"))
        .args(["top", "--once", "--insecure", "--frontend", "127.0.0.1:1"])
        .output()
        .await
        .expect("canopy runs");
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot reach the front-end"), "{err}");
}

/// `canopy up` on a terminal: one progress line, redrawn in place and within 80 columns, with the rounds done,
/// the rate and the coverage; then the summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canopy_up_draws_one_progress_line_in_tmux_at_80x24() {
    if missing().is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The pane stays after canopy up exits, so its last screen can be read.
    let cmd = format!(
        "{} up --agents 2 --ranks 8 --rounds 60 --period-ms 50 --filters stats,histogram --insecure --out {}; sleep 60",
        bin_dir().join("canopy").display(),
        dir.path().join("out").display()
    );
    let session = Session::start("canopy-up-progress", 80, 24, &cmd);
    #[allow(
        unused_assignments,
        reason = "each wait reads the screen afresh; the empty start is for a failure before the first read"
    )]
    let mut screen = String::new();
    assert_eventually!(
        {
            screen = session.screen();
            screen.contains("rounds stored (2 streams)")
        },
        Duration::from_secs(60),
        "canopy up did not finish:\n{screen}"
    );
    let progress: Vec<&str> = screen.lines().filter(|l| l.contains(" rounds  ")).collect();
    assert_eq!(progress.len(), 1, "not one progress line:\n{screen}");
    let line = progress[0];
    assert!(line.chars().count() <= 80, "{line}");
    assert!(
        line.contains("60/60 rounds") && line.contains("rounds/s") && line.contains("coverage "),
        "{line}"
    );
}
