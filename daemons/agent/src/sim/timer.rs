//! Wake-ups at a wall-clock instant, to the OS timer's precision.
//!
//! Tokio's timer ticks in whole milliseconds counted from each runtime's start, so agents in separate processes
//! told to dump at the same instant would wake up to a millisecond apart, and that spread would count in every
//! round's latency. A timerfd armed at an absolute `CLOCK_REALTIME` instant wakes the task through the runtime's
//! reactor instead: within tens of microseconds, on no thread of its own.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

use canopy_core::node::unix_ns;
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A timer that sleeps until wall-clock instants. Without a timerfd (it could not be created) it sleeps on
/// tokio's timer, to the millisecond.
pub struct WallTimer {
    fd: Option<AsyncFd<Timer>>,
}

/// The timerfd, as the reactor takes it.
struct Timer(TimerFd);

impl AsRawFd for Timer {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl Default for WallTimer {
    fn default() -> Self {
        Self::new()
    }
}

impl WallTimer {
    #[allow(unsafe_code)] // registering a descriptor with the reactor; the safety argument is below
    pub fn new() -> Self {
        let fd = TimerFd::new(
            ClockId::CLOCK_REALTIME,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )
        .map_err(io::Error::from)
        .and_then(|fd| {
            // SAFETY: `Timer` owns the timerfd and gives its one descriptor for as long as it lives, which is as
            // long as the `AsyncFd` that owns it.
            unsafe { AsyncFd::register_with_interest(Timer(fd), Interest::READABLE) }.map_err(io::Error::from)
        });
        match fd {
            Ok(fd) => Self { fd: Some(fd) },
            Err(e) => {
                tracing::warn!("no timerfd ({e}): the simulated ranks wake on tokio's millisecond timer");
                Self { fd: None }
            }
        }
    }

    /// Sleeps until the wall-clock time `due_ns` (nanoseconds since the Unix epoch); at once if it has passed.
    pub async fn sleep_until(&self, due_ns: u64) {
        let now = unix_ns();
        if due_ns <= now {
            return;
        }
        let Some(fd) = &self.fd else {
            return tokio::time::sleep(Duration::from_nanos(due_ns - now)).await;
        };
        if let Err(e) = self.wait_on(fd, due_ns).await {
            tracing::warn!("timerfd failed ({e}): sleeping on tokio's timer");
            tokio::time::sleep(Duration::from_nanos(due_ns.saturating_sub(unix_ns()))).await;
        }
    }

    async fn wait_on(&self, fd: &AsyncFd<Timer>, due_ns: u64) -> io::Result<()> {
        let at = TimeSpec::new((due_ns / 1_000_000_000) as _, (due_ns % 1_000_000_000) as _);
        // Arming the timer again also clears an expiry that an earlier, cancelled sleep did not read.
        fd.get_ref()
            .0
            .set(Expiration::OneShot(at), TimerSetTimeFlags::TFD_TIMER_ABSTIME)?;
        loop {
            let mut ready = fd.readable().await?;
            match ready.try_io(|fd| fd.get_ref().0.wait().map_err(io::Error::from)) {
                Ok(done) => return done,
                // The readiness was stale (an expiry already read): wait for the next.
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wakes_at_the_instant_not_before() {
        let timer = WallTimer::new();
        assert!(timer.fd.is_some(), "this Linux machine has timerfd");
        for _ in 0..20 {
            let due = unix_ns() + 2_300_000;
            timer.sleep_until(due).await;
            let woke = unix_ns();
            assert!(woke >= due, "woke {} ns early", due - woke);
            // Tokio's timer alone would round up to its next millisecond tick; the timerfd is within a fraction.
            assert!(woke - due < 50_000_000, "woke {} us late", (woke - due) / 1000);
        }
    }

    #[tokio::test]
    #[allow(clippy::disallowed_methods)] // the expiry must pass while nothing polls the timer
    async fn a_cancelled_sleep_leaves_no_early_wakeup() {
        let timer = WallTimer::new();
        // A sleep dropped after its instant passed leaves an unread expiry behind.
        let due = unix_ns() + 1_000_000;
        let _ = tokio::time::timeout(Duration::from_micros(1), timer.sleep_until(due)).await;
        std::thread::sleep(Duration::from_millis(3));
        let next = unix_ns() + 20_000_000;
        timer.sleep_until(next).await;
        assert!(unix_ns() >= next, "the stale expiry woke the next sleep early");
    }

    #[tokio::test]
    async fn a_passed_instant_returns_at_once() {
        let timer = WallTimer::new();
        let before = unix_ns();
        timer.sleep_until(before - 1_000_000_000).await;
        assert!(unix_ns() - before < 50_000_000);
    }
}
