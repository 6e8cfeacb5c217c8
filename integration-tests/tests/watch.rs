//! `canopy watch` on a real terminal: a tree of simulated NAMD ranks with a utilization stream, watched inside
//! tmux at 80x24 and then at 200x60, the screen read back with `tmux capture-pane` as a user would see it.
//!
//! It needs tmux, which `.ci/run` installs and says so with CANOPY_TMUX_TEST=1: then a missing tmux fails the
//! test. Elsewhere the test prints why it cannot run and passes.

mod tmux;

use std::time::Duration;

use canopy_integration_tests::{TreeBuilder, assert_eventually, bin_dir};
use tmux::{Session, missing};

/// The row of the 0% mark of the first chart, counted from the top.
fn zero_row(screen: &str) -> Option<usize> {
    screen.lines().position(|l| l.starts_with("  0%│"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canopy_watch_draws_utilization_in_tmux_and_redraws_on_resize() {
    if missing().is_some() {
        return;
    }
    let tree = TreeBuilder {
        agents: 2,
        fanout: 2,
        ranks: 8,
        rounds: 0,
        period_ms: 100,
        scenario: "namd".into(),
        streams: vec!["utilization".into()],
        exit_on_fin: false,
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let session = Session(format!("canopy-watch-{}", std::process::id()));
    // The pane outlives the command, so a watch that fails leaves its error (and its exit code) on screen.
    let cmd = format!(
        "{} watch --insecure --frontend {} ; echo \"watch exited $?\"; sleep 600",
        bin_dir().join("canopy").display(),
        tree.frontend_addr
    );
    session.tmux(&[
        "new-session",
        "-d",
        "-s",
        &session.0,
        "-x",
        "80",
        "-y",
        "24",
        &cmd,
    ]);

    // 80x24: bars (two to a column, in half blocks), the axis, the NAMD entry methods and Idle in the legend (the
    // simulated ranks are always in an entry method or idle: no untracked time).
    #[allow(
        unused_assignments,
        reason = "each wait reads the screen afresh; the empty start is for a failure before the first read"
    )]
    let mut screen = String::new();
    assert_eventually!(
        {
            screen = session.screen();
            screen.contains("10 s, 100 ms bars")
                && screen.contains('▌')
                && screen.contains("100%│")
                && screen.contains("ComputeNonbonded")
                && screen.contains("Idle")
        },
        Duration::from_secs(60),
        "no utilization view at 80x24:\n{screen}"
    );
    assert!(screen.lines().count() <= 24, "{screen}");
    assert!(
        screen.lines().all(|l| l.chars().count() <= 80),
        "a line wider than 80 columns:\n{screen}"
    );
    let small = zero_row(&screen).expect("the 0% row");
    assert!(small < 24, "{screen}");

    // 200x60: the view redraws larger, a column a bar and the legend beside it.
    session.tmux(&["resize-window", "-t", &session.0, "-x", "200", "-y", "60"]);
    assert_eventually!(
        {
            screen = session.screen();
            zero_row(&screen).is_some_and(|r| r > 40)
                && screen.contains("share over 10 s")
                && screen.contains('█')
                && screen.lines().any(|l| l.chars().count() > 100)
        },
        Duration::from_secs(30),
        "the view did not redraw at 200x60:\n{screen}"
    );
    assert!(screen.lines().all(|l| l.chars().count() <= 200), "{screen}");

    // 'h': the latest 250 ms at 1 ms a bar.
    session.keys("h");
    assert_eventually!(
        {
            screen = session.screen();
            screen.contains("250 ms, 1 ms bars") && screen.contains("share over 250 ms")
        },
        Duration::from_secs(30),
        "no high-resolution view:\n{screen}"
    );

    // 'q' quits and gives the terminal back.
    let screen = session.quit("watch").await;
    assert!(!screen.contains("100%│"), "the view stayed on screen:\n{screen}");
}

/// The shown stream and its round and coverage, from the header's first line:
/// `stats: round 12  9.8 rounds/s  coverage 16/16  run 0:05`.
fn header(screen: &str) -> Option<(String, u64, u32, u32)> {
    let first = screen.lines().next()?;
    let (before, after) = first.split_once(": round ")?;
    let stream = before.rsplit("  ").next()?.to_string();
    let round = after.split_whitespace().next()?.parse().ok()?;
    let cov = first.split("coverage ").nth(1)?.split_whitespace().next()?;
    let (covered, expected) = cov.split_once('/')?;
    Some((stream, round, covered.parse().ok()?, expected.parse().ok()?))
}

fn summaries_tree() -> TreeBuilder {
    TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 16,
        rounds: 0,
        period_ms: 200,
        streams: vec!["stats".into(), "histogram".into(), "classify".into()],
        stream_params: vec![("stats".into(), r#"{"quantiles": true}"#.into())],
        exit_on_fin: false,
        ..TreeBuilder::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canopy_watch_shows_every_stream_in_tmux_with_a_true_header_at_80x24_and_200x60() {
    if missing().is_some() {
        return;
    }
    let tree = summaries_tree().start().await;
    let cmd = format!(
        "{} watch --insecure --frontend {}",
        bin_dir().join("canopy").display(),
        tree.frontend_addr
    );
    let session = Session::start("canopy-watch-tables", 80, 24, &cmd);
    #[allow(
        unused_assignments,
        reason = "each wait reads the screen afresh; the empty start is for a failure before the first read"
    )]
    let mut screen = String::new();
    // Every stream is named on the third line once its first round has arrived.
    assert_eventually!(
        {
            screen = session.screen();
            screen.lines().nth(2).is_some_and(|l| {
                ["classify [classify]", "histogram [histogram]", "stats [stats]"]
                    .iter()
                    .all(|s| l.contains(s))
            })
        },
        Duration::from_secs(60),
        "not every stream on the stream line:\n{screen}"
    );
    // Tab until each stream has been shown: its name in the header, its view below.
    let mut shown = std::collections::BTreeSet::new();
    for _ in 0..6 {
        assert_eventually!(
            {
                screen = session.screen();
                header(&screen).is_some_and(|(s, ..)| {
                    (s == "stats"
                        && screen.contains("event (exclusive us)")
                        && screen.contains("mean (exclusive us) over the last 60 rounds"))
                        || (s == "histogram" && screen.contains("histograms (exclusive us)"))
                        || (s == "classify" && screen.contains("reduction factor"))
                })
            },
            Duration::from_secs(60),
            "no view of a stream at 80x24:\n{screen}"
        );
        assert!(tmux::fits(&screen, 80, 24), "wider than 80x24:\n{screen}");
        let (stream, round, covered, expected) = header(&screen).unwrap();
        assert!(
            screen.lines().nth(2).unwrap().contains(&format!("{stream} [")),
            "{screen}"
        );
        // The header's round is one the store has, with the coverage the header gives.
        let store = tree.store.clone();
        let stream_name = stream.clone();
        assert_eventually!(
            canopy_integration_tests::read_rounds(&store)
                .iter()
                .any(|r| r.stream == stream_name
                    && r.round == round
                    && r.covered == covered
                    && r.expected == expected),
            Duration::from_secs(10),
            "{stream} round {round} at {covered}/{expected} is not in the store:\n{screen}"
        );
        assert_eq!((covered, expected), (16, 16), "{screen}");
        // Names, never ids: no event shown as 16 hex digits in a table of summaries.
        if stream != "classify" {
            assert!(screen.contains("MPI_"), "{screen}");
        }
        shown.insert(stream.clone());
        if shown.len() == 3 {
            break;
        }
        session.keys("Tab");
        // The next view replaces this one before the next check.
        assert_eventually!(
            header(&session.screen()).is_some_and(|(s, ..)| s != stream),
            Duration::from_secs(10),
            "Tab did not switch the stream:\n{}",
            session.screen()
        );
    }
    assert_eq!(shown.len(), 3, "{shown:?}");

    // Back to the stats stream; `m` shows the next metric, named in the table's heading.
    for _ in 0..3 {
        if header(&session.screen()).is_some_and(|(s, ..)| s == "stats") {
            break;
        }
        session.keys("Tab");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eventually!(
        {
            screen = session.screen();
            header(&screen).is_some_and(|(s, ..)| s == "stats") && screen.contains("event (exclusive us)")
        },
        Duration::from_secs(10),
        "not back on stats:\n{screen}"
    );
    // The stats stream has quantiles (p50, p90 and p99): p50 and p99 fit at 80 columns.
    assert!(
        screen.lines().any(|l| l.contains(" p50 ") && l.contains(" p99 ")),
        "no p50 and p99 columns at 80x24:\n{screen}"
    );
    session.keys("m");
    assert_eventually!(
        {
            screen = session.screen();
            screen.contains("event (inclusive us)") && !screen.contains("event (exclusive us)")
        },
        Duration::from_secs(10),
        "m did not change the metric:\n{screen}"
    );

    // 200x60: redrawn larger, every column of the table, nothing wrapped.
    session.resize(200, 60);
    assert_eventually!(
        {
            screen = session.screen();
            screen.contains("max@rank") && screen.lines().count() > 24
        },
        Duration::from_secs(30),
        "not redrawn at 200x60:\n{screen}"
    );
    assert!(tmux::fits(&screen, 200, 60), "{screen}");
    let (_, round, ..) = header(&screen).unwrap();
    assert!(round > 0, "{screen}");
    // The header counts the run's time (from the store's start), and names the front-end and the troubles.
    assert_eventually!(
        {
            screen = session.screen();
            screen.lines().next().is_some_and(|l| l.contains("  run "))
        },
        Duration::from_secs(10),
        "no run time in the header:
{screen}"
    );
    let second = screen.lines().nth(1).unwrap();
    assert!(
        second.contains(&tree.frontend_addr) && second.contains("lost 0") && second.contains("dropped 0"),
        "{screen}"
    );
    // Every stream is reachable by Tab at 200x60 too, each fitting.
    let mut shown = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let Some((stream, ..)) = header(&session.screen()) else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        screen = session.screen();
        assert!(tmux::fits(&screen, 200, 60), "{screen}");
        shown.insert(stream.clone());
        if shown.len() == 3 {
            break;
        }
        session.keys("Tab");
        assert_eventually!(
            header(&session.screen()).is_some_and(|(s, ..)| s != stream),
            Duration::from_secs(10),
            "Tab did not switch the stream at 200x60:\n{}",
            session.screen()
        );
    }
    assert_eq!(shown.len(), 3, "{shown:?}");
    // And back to 80x24, still fitting.
    session.resize(80, 24);
    assert_eventually!(
        {
            screen = session.screen();
            // At 80 columns the spread goes before the ranks holding the extremes.
            !screen.contains("std") && screen.contains("max@rank") && header(&screen).is_some()
        },
        Duration::from_secs(30),
        "not redrawn at 80x24:\n{screen}"
    );
    assert!(tmux::fits(&screen, 80, 24), "{screen}");

    session.quit("watch").await;
}

/// A simulation and its analysis feed one tree: the stats view gives each row's application in a column of its
/// own, and at 80x24 p50 and p99 still fit beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canopy_watch_shows_each_application_s_stats_rows_at_80x24() {
    if missing().is_some() {
        return;
    }
    let tree = TreeBuilder {
        streams: vec!["stats".into()],
        apps: vec!["sim".into(), "analysis".into()],
        ..summaries_tree()
    }
    .start()
    .await;
    let cmd = format!(
        "{} watch --insecure --frontend {}",
        bin_dir().join("canopy").display(),
        tree.frontend_addr
    );
    let session = Session::start("canopy-watch-apps", 80, 24, &cmd);
    #[allow(
        unused_assignments,
        reason = "each wait reads the screen afresh; the empty start is for a failure before the first read"
    )]
    let mut screen = String::new();
    assert_eventually!(
        {
            screen = session.screen();
            screen.contains("event (exclusive us)")
        },
        Duration::from_secs(60),
        "no stats table at 80x24:\n{screen}"
    );
    assert!(tmux::fits(&screen, 80, 24), "wider than 80x24:\n{screen}");
    let heading = screen
        .lines()
        .find(|l| l.contains("event (exclusive us)"))
        .unwrap();
    let words: Vec<&str> = heading.split_whitespace().collect();
    for label in ["app", "mean↓", "p50", "max", "max@rank"] {
        assert!(words.contains(&label), "{label}:\n{screen}");
    }
    // Rows of both applications, each naming its own.
    for app in ["sim", "analysis"] {
        assert!(
            screen.lines().any(|l| l.split_whitespace().nth(1) == Some(app)),
            "no row of {app}:\n{screen}"
        );
    }
    session.quit("watch").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canopy_watch_json_lines_parse_and_name_their_events() {
    let tree = summaries_tree().start().await;
    let store = tree.store.clone();
    assert_eventually!(
        canopy_integration_tests::read_rounds(&store).len() >= 6,
        Duration::from_secs(60),
        "no rounds"
    );
    let out = tokio::process::Command::new(bin_dir().join("canopy"))
        .args([
            "watch",
            "--insecure",
            "--frontend",
            &tree.frontend_addr,
            "--json",
            "--updates",
            "6",
        ])
        .output()
        .await
        .expect("canopy runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 6, "{text}");
    for l in &lines {
        let names = l["names"].as_object().unwrap_or_else(|| panic!("no names: {l}"));
        // Every summary's id of a stats or histogram result has its name.
        if let Some(stats) = l["result"]["stats"].as_array() {
            assert!(!stats.is_empty(), "{l}");
            for s in stats {
                let id = s["id"].as_str().unwrap();
                assert!(names.contains_key(id), "{id} unnamed: {l}");
            }
            assert!(names.values().any(|n| n == "MPI_Allreduce"), "{l}");
        }
    }
    assert!(lines.iter().any(|l| l["result"]["stats"].is_array()), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canopy_watch_ends_with_the_runs_last_rounds_and_its_store_when_the_run_ends() {
    let tree = TreeBuilder {
        agents: 2,
        fanout: 2,
        ranks: 8,
        rounds: 40,
        period_ms: 50,
        streams: vec!["stats".into()],
        exit_on_fin: true,
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let out = tokio::process::Command::new(bin_dir().join("canopy"))
        .args([
            "watch",
            "--insecure",
            "--plain",
            "--frontend",
            &tree.frontend_addr,
        ])
        .output()
        .await
        .expect("canopy runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = text.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!(
            "canopy watch: the run ended; stats round 39 coverage 8/8; store {0} (canopy report {0})",
            tree.store.display()
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canopy_watch_says_in_one_line_that_the_frontend_is_unreachable() {
    let out = tokio::process::Command::new(bin_dir().join("canopy"))
        .args(["watch", "--insecure", "--frontend", "127.0.0.1:1"])
        .output()
        .await
        .expect("canopy runs");
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot reach the front-end at 127.0.0.1:1"), "{err}");
    assert!(out.stdout.is_empty());
}
