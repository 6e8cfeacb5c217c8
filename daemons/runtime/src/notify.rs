//! systemd's notify protocol (sd_notify, through the `sd-notify` crate): a `Type=notify` unit learns that the
//! daemon serves and why it stops, and a unit with `WatchdogSec=` hears from the daemon as long as its node's
//! task turns. Without `NOTIFY_SOCKET` (not under systemd) nothing is sent.

use std::time::Duration;

use sd_notify::NotifyState;
use tokio::sync::watch;

fn send(states: &[NotifyState<'_>]) -> bool {
    if std::env::var_os("NOTIFY_SOCKET").is_none_or(|p| p.is_empty()) {
        return false;
    }
    match sd_notify::notify(states) {
        Ok(()) => true,
        Err(e) => {
            let path = std::env::var_os("NOTIFY_SOCKET").unwrap_or_default();
            tracing::warn!("cannot notify systemd at {}: {e}", path.to_string_lossy());
            false
        }
    }
}

/// Tells systemd the daemon serves (`READY=1`), with a status line `systemctl status` shows.
pub fn ready(status: &str) -> bool {
    send(&[NotifyState::Ready, NotifyState::Status(status)])
}

/// Tells systemd the daemon is stopping.
pub fn stopping(status: &str) -> bool {
    send(&[NotifyState::Stopping, NotifyState::Status(status)])
}

/// The watchdog interval systemd asked for (`WatchdogSec=`, as `WATCHDOG_USEC` for this process), if any.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled().filter(|d| !d.is_zero())
}

/// Keeps systemd's watchdog fed while `beats` changes: one `WATCHDOG=1` per change, at most one per half
/// interval. `beats` is the node's snapshot, renewed at every status tick (`beat`) by the node's own task, so a
/// node whose task stops turning stops the pings and systemd restarts the daemon. Returns when the node is gone
/// (the sender dropped), or at once without a watchdog.
pub async fn watchdog<T>(beats: watch::Receiver<T>, beat: Duration) {
    let Some(interval) = watchdog_interval() else {
        return;
    };
    feed(beats, beat, interval, || send(&[NotifyState::Watchdog])).await;
}

/// The watchdog's rule, with `ping` the notification: a ping per change of `beats`, at most one per half
/// `interval`; none while `beats` does not change.
async fn feed<T>(
    mut beats: watch::Receiver<T>,
    beat: Duration,
    interval: Duration,
    mut ping: impl FnMut() -> bool,
) {
    if interval < beat * 3 {
        tracing::warn!(
            watchdog_ms = interval.as_millis() as u64,
            status_ms = beat.as_millis() as u64,
            "the systemd watchdog interval is under three status ticks: a busy node may be restarted; \
             set WatchdogSec= to 10s or more"
        );
    }
    let mut last: Option<tokio::time::Instant> = None;
    while beats.changed().await.is_ok() {
        let now = tokio::time::Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < interval / 2) {
            continue;
        }
        if ping() {
            last = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// The node's task ticks every second: the watchdog (10 s) hears at most one ping per 5 s while it does, and
    /// none once it stops, so systemd restarts a daemon whose node no longer turns.
    #[tokio::test(start_paused = true)]
    async fn the_watchdog_is_fed_while_the_node_ticks_and_starves_when_it_stops() {
        let (tx, rx) = watch::channel(0u64);
        let pings = Arc::new(AtomicU32::new(0));
        let counted = pings.clone();
        let fed = tokio::spawn(feed(
            rx,
            Duration::from_secs(1),
            Duration::from_secs(10),
            move || {
                counted.fetch_add(1, Ordering::Relaxed);
                true
            },
        ));
        for tick in 1..=20 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.send_replace(tick);
            tokio::task::yield_now().await;
        }
        // 20 s of ticks: a ping at the first, then one per 5 s.
        assert_eq!(pings.load(Ordering::Relaxed), 4);
        // The task stops turning: a minute passes with no tick, and no ping.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(pings.load(Ordering::Relaxed), 4);
        // The node is gone: the feeding ends.
        drop(tx);
        fed.await.unwrap();
    }

    #[test]
    fn without_notify_socket_nothing_is_sent() {
        // Tests never run under a notify-type unit; the variable is unset in their environment.
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            assert!(!super::ready("serving"));
        }
    }
}
