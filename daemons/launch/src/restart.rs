//! A relay or agent that dies is started again, as systemd's `Restart=on-failure` would: after 100 ms, doubling
//! to 5 s while it keeps dying within 10 s of its start. One that exits cleanly, is refused by its parent (76) or
//! has a bad configuration (64) is not.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

/// The shortest and the longest wait before a start again.
pub const RESTART_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// A daemon up this long before it died is restarted after the shortest back-off again.
pub const STABLE_AFTER: Duration = Duration::from_secs(10);

/// Where a supervised daemon stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Supervision {
    Running { since: Instant, backoff: Duration },
    Restarting { at: Instant, backoff: Duration },
    Done,
}

/// What follows a supervised daemon's exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterExit {
    /// Started again after this back-off.
    Restart(Duration),
    /// Not started again.
    Stays,
}

/// Whether a daemon that exited with `status` is started again.
pub fn restarts_after(status: ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    if status.signal().is_some() {
        return true;
    }
    let refused = i32::from(canopy_runtime::daemon::EXIT_REFUSED);
    !matches!(status.code(), Some(0))
        && status.code() != Some(canopy_runtime::config::EXIT_CONFIG)
        && status.code() != Some(refused)
}

impl Supervision {
    /// A daemon started at `now`.
    pub fn started(now: Instant) -> Self {
        Supervision::Running {
            since: now,
            backoff: Duration::ZERO,
        }
    }

    /// The running daemon exited with `status` at `now`.
    pub fn exited(&mut self, status: ExitStatus, now: Instant) -> AfterExit {
        let Supervision::Running { since, backoff } = *self else {
            return AfterExit::Stays;
        };
        if !restarts_after(status) {
            *self = Supervision::Done;
            return AfterExit::Stays;
        }
        let backoff = if now.duration_since(since) >= STABLE_AFTER {
            RESTART_BACKOFF.0
        } else {
            (backoff * 2).clamp(RESTART_BACKOFF.0, RESTART_BACKOFF.1)
        };
        *self = Supervision::Restarting {
            at: now + backoff,
            backoff,
        };
        AfterExit::Restart(backoff)
    }

    /// Whether the daemon is to be started again now.
    pub fn due(&self, now: Instant) -> bool {
        matches!(*self, Supervision::Restarting { at, .. } if now >= at)
    }

    /// The daemon was started again at `now`; its back-off is kept for the next exit.
    pub fn restarted(&mut self, now: Instant) {
        if let Supervision::Restarting { backoff, .. } = *self {
            *self = Supervision::Running { since: now, backoff };
        }
    }

    pub fn is_running(&self) -> bool {
        matches!(self, Supervision::Running { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    #[test]
    fn a_daemon_that_keeps_dying_waits_longer_each_time_and_a_stable_one_starts_over() {
        let t0 = Instant::now();
        let killed = ExitStatus::from_raw(9);
        let mut s = Supervision::started(t0);
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..8 {
            now += Duration::from_millis(10);
            let AfterExit::Restart(wait) = s.exited(killed, now) else {
                panic!("a killed daemon is restarted")
            };
            assert!(!s.due(now + wait - Duration::from_millis(1)));
            now += wait;
            assert!(s.due(now));
            s.restarted(now);
            waits.push(wait.as_millis());
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        now += STABLE_AFTER;
        assert_eq!(s.exited(killed, now), AfterExit::Restart(RESTART_BACKOFF.0));
    }

    #[test]
    fn a_clean_exit_a_refusal_and_a_bad_config_are_not_restarted() {
        for code in [0, 64, 76] {
            let mut s = Supervision::started(Instant::now());
            assert_eq!(
                s.exited(ExitStatus::from_raw(code << 8), Instant::now()),
                AfterExit::Stays
            );
            assert_eq!(s, Supervision::Done);
        }
        let mut s = Supervision::started(Instant::now());
        assert!(matches!(
            s.exited(ExitStatus::from_raw(1 << 8), Instant::now()),
            AfterExit::Restart(_)
        ));
    }
}
