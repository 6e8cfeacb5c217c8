//! tmux for the tests of the full-screen views: a detached session of a given size whose screen is read back with
//! `tmux capture-pane`, as a user would see it.
//!
//! tmux is installed by `.ci/run`, which says so with CANOPY_TMUX_TEST=1: then a missing tmux fails the test.
//! Elsewhere a test that needs tmux prints why it cannot run and passes.

#![allow(dead_code, reason = "each test file uses the helpers it needs")]

use std::process::Command;

/// Why the test cannot run here, if it cannot; with CANOPY_TMUX_TEST set, a missing tmux fails instead.
pub fn missing() -> Option<String> {
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
pub struct Session(pub String);

impl Session {
    pub fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux").args(args).output().expect("tmux runs");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The pane's text, wrapped lines joined (so a line wider than the pane shows as one long line).
    pub fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-J", "-t", &self.0])
    }

    pub fn keys(&self, keys: &str) {
        self.tmux(&["send-keys", "-t", &self.0, keys]);
    }

    /// Presses `q` and waits until the command has exited with 0; returns the screen it left.
    pub async fn quit(&self, what: &str) -> String {
        self.keys("q");
        #[allow(
            unused_assignments,
            reason = "each wait reads the screen afresh; the empty start is for a failure before the first read"
        )]
        let mut screen = String::new();
        canopy_integration_tests::assert_eventually!(
            {
                screen = self.screen();
                screen.contains("exited 0")
            },
            std::time::Duration::from_secs(30),
            "{what} did not quit on q:\n{screen}"
        );
        screen
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .status();
    }
}

impl Session {
    /// Starts `cmd` in a new detached session of `width` x `height`. The pane outlives the command, so a command
    /// that fails leaves its error (and its exit code) on screen.
    pub fn start(name: &str, width: u16, height: u16, cmd: &str) -> Session {
        let session = Session(format!("{name}-{}", std::process::id()));
        let cmd = format!("{cmd} ; echo \"exited $?\"; sleep 600");
        session.tmux(&[
            "new-session",
            "-d",
            "-s",
            &session.0,
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            &cmd,
        ]);
        session
    }

    pub fn resize(&self, width: u16, height: u16) {
        self.tmux(&[
            "resize-window",
            "-t",
            &self.0,
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
        ]);
    }
}

/// Every line of `screen` fits `width` columns (`capture-pane -J` joins a wrapped line into one longer line).
pub fn fits(screen: &str, width: usize, height: usize) -> bool {
    screen.lines().count() <= height && screen.lines().all(|l| l.chars().count() <= width)
}
