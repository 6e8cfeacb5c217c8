//! How Canopy's daemons are started on one machine, the same way for `canopy up` and `canopy run` as for the
//! integration tests: a daemon's command with its output to its log ([`Launch`]), the wait for its ready file
//! ([`ReadyWait`]), its CPU from /proc ([`cpu`]), and the policy that starts a relay or agent that died again
//! ([`restart`]).

#![forbid(unsafe_code)]
#![allow(
    clippy::disallowed_types,
    reason = "std's Instant: the launcher and the tests time other processes, which no paused runtime clock speeds up, \
              and a test's thread has no runtime"
)]

pub mod cpu;
mod ready;
pub mod restart;

use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub use ready::{NotReady, READY_TIMEOUT, ReadyWait};

/// How to start a daemon (again): its program, arguments and environment.
#[derive(Debug, Clone)]
pub struct Launch {
    program: PathBuf,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    dir: Option<PathBuf>,
}

impl Launch {
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            envs: Vec::new(),
            dir: None,
        }
    }

    pub fn args<I, S>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Runs the daemon in `dir` rather than the launcher's working directory.
    pub fn current_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.dir = Some(dir.into());
        self
    }

    /// Replaces the value that follows `flag`.
    pub fn set(&mut self, flag: &str, value: &str) {
        if let Some(i) = self.args.iter().position(|a| a == flag)
            && let Some(v) = self.args.get_mut(i + 1)
        {
            *v = value.to_string();
        }
    }

    /// The daemon's command: no input, its output and errors to `log`, in a process group of its own (Ctrl-C
    /// at a terminal reaches the launcher, which stops its daemons in order).
    pub fn command(&self, log: &File) -> std::io::Result<Command> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log.try_clone()?)
            .process_group(0);
        if let Some(dir) = &self.dir {
            cmd.current_dir(dir);
        }
        Ok(cmd)
    }
}

/// The log of the daemon `name` in `logs` (a name's `:` and `/` become `-`).
pub fn log_path(name: &str, logs: &Path) -> PathBuf {
    logs.join(format!("{}.log", name.replace([':', '/'], "-")))
}

/// Opens a daemon's log: made anew, or appended to when the daemon is started `again`.
pub fn open_log(path: &Path, again: bool) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(again)
        .truncate(!again)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_is_set_again_and_the_log_gets_the_output() {
        let dir = std::env::temp_dir().join(format!("canopy-launch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut launch = Launch::new("sh");
        launch.args(["-c", "echo \"$GREETING $0\"", "old"]);
        launch.set("-c", "echo \"$GREETING $0 again\"");
        launch.env("GREETING", "hello");
        let log = log_path("relay:1", &dir);
        assert!(log.ends_with("relay-1.log"));
        for again in [false, true] {
            let file = open_log(&log, again).unwrap();
            let status = launch.command(&file).unwrap().status().unwrap();
            assert!(status.success());
        }
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text, "hello old again\nhello old again\n");
        let file = open_log(&log, false).unwrap();
        drop(file);
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
