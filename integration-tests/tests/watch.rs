//! `canopy watch` on a real terminal: a tree of simulated NAMD ranks with a utilization stream, watched inside
//! tmux at 80x24 and then at 200x60, the screen read back with `tmux capture-pane` as a user would see it.
//!
//! It needs tmux, which `.ci/run` installs and says so with CANOPY_TMUX_TEST=1: then a missing tmux fails the
//! test. Elsewhere the test prints why it cannot run and passes.

use std::process::Command;
use std::time::Duration;

use canopy_integration_tests::{TreeBuilder, assert_eventually, bin_dir};

/// Why the test cannot run here, if it cannot; with CANOPY_TMUX_TEST set, a missing tmux fails instead.
fn missing() -> Option<String> {
    let found = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return None;
    }
    let why = "tmux is not installed (apt-get install tmux)".to_string();
    assert!(
        std::env::var_os("CANOPY_TMUX_TEST").is_none(),
        "CANOPY_TMUX_TEST is set but the tmux test cannot run: {why}"
    );
    eprintln!("skipped: {why}");
    Some(why)
}

/// A detached tmux session, killed when the test ends however it ends.
struct Session(String);

impl Session {
    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux").args(args).output().expect("tmux runs");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The pane's text, wrapped lines joined (so a line wider than the pane shows as one long line).
    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-J", "-t", &self.0])
    }

    fn keys(&self, keys: &str) {
        self.tmux(&["send-keys", "-t", &self.0, keys]);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .status();
    }
}

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
    session.keys("q");
    assert_eventually!(
        {
            screen = session.screen();
            screen.contains("watch exited 0")
        },
        Duration::from_secs(30),
        "watch did not quit on q:\n{screen}"
    );
    assert!(!screen.contains("100%│"), "the view stayed on screen:\n{screen}");
}
