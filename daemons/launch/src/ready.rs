//! The wait for a starting daemon's ready file: ready, still starting, or failed with what its log says. One look
//! at a time, so a launcher on a runtime and a test on a thread sleep their own way between looks.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use canopy_runtime::ready::{Ready, ReadyError};

/// How long a daemon may take to write its ready file.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The lines of a daemon's log an error quotes.
const LOG_TAIL: usize = 5;

/// Why a daemon did not become ready.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error("{name} exited with {status} before it was ready:\n{tail}")]
    Exited {
        name: String,
        status: ExitStatus,
        /// The last lines of its log.
        tail: String,
    },
    #[error("{name} was not ready after {} s; see {}", .after.as_secs(), .log.display())]
    TimedOut {
        name: String,
        after: Duration,
        log: PathBuf,
    },
    #[error(transparent)]
    File(#[from] ReadyError),
}

/// The wait for one daemon's ready file.
#[derive(Debug, Clone)]
pub struct ReadyWait {
    name: String,
    path: PathBuf,
    log: PathBuf,
    deadline: Instant,
    timeout: Duration,
}

impl ReadyWait {
    /// Waits for `path`, written by the daemon `name` whose output goes to `log`, for [`READY_TIMEOUT`] from now.
    pub fn new(name: &str, path: &Path, log: &Path) -> Self {
        Self::within(name, path, log, READY_TIMEOUT)
    }

    pub fn within(name: &str, path: &Path, log: &Path, timeout: Duration) -> Self {
        Self {
            name: name.to_string(),
            path: path.to_path_buf(),
            log: log.to_path_buf(),
            deadline: Instant::now() + timeout,
            timeout,
        }
    }

    /// One look: the ready file if it is there; `None` while the daemon starts (`exited` is its exit status, if it
    /// has exited); an error once it exited without one, or past the time-out.
    pub fn look(&self, exited: Option<ExitStatus>) -> Result<Option<Ready>, NotReady> {
        if let Some(ready) = Ready::read(&self.path)? {
            return Ok(Some(ready));
        }
        if let Some(status) = exited {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(LOG_TAIL).collect();
            return Err(NotReady::Exited {
                name: self.name.clone(),
                status,
                tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            });
        }
        if Instant::now() >= self.deadline {
            return Err(NotReady::TimedOut {
                name: self.name.clone(),
                after: self.timeout,
                log: self.log.clone(),
            });
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    fn dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("canopy-ready-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_ready_file_is_read_and_an_exit_before_it_quotes_the_log() {
        let dir = dir("exit");
        let (path, log) = (dir.join("r.ready"), dir.join("r.log"));
        let lines: Vec<String> = (1..=8).map(|i| format!("line {i}")).collect();
        std::fs::write(&log, lines.join("\n")).unwrap();
        let wait = ReadyWait::new("relay:1", &path, &log);
        assert!(wait.look(None).unwrap().is_none());
        let err = wait.look(Some(ExitStatus::from_raw(64 << 8))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "relay:1 exited with exit status: 64 before it was ready:\nline 4\nline 5\nline 6\nline 7\nline 8"
        );
        std::fs::write(&path, "addr=127.0.0.1:7400\n").unwrap();
        let ready = wait.look(Some(ExitStatus::from_raw(0))).unwrap().unwrap();
        assert_eq!(ready.addr.to_string(), "127.0.0.1:7400");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_daemon_past_the_time_out_is_named_with_its_log() {
        let dir = dir("slow");
        let (path, log) = (dir.join("a.ready"), dir.join("a.log"));
        let wait = ReadyWait::within("agent:0", &path, &log, Duration::ZERO);
        let err = wait.look(None).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("agent:0 was not ready after 0 s; see {}", log.display())
        );
        std::fs::write(&path, "addr=nowhere\n").unwrap();
        assert!(matches!(wait.look(None), Err(NotReady::File(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
