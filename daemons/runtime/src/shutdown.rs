//! A daemon's signals: SIGINT and SIGTERM, counted on a thread of their own.
//!
//! The first starts a clean shutdown; a second one, or a shutdown still running after
//! [`FORCE_AFTER`](crate::daemon::FORCE_AFTER), ends the process without waiting. The thread has a runtime of its
//! own, so a daemon whose workers are all busy (a long filter call on its one worker, say) still counts signals
//! and times its forced exit.

use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

/// What the signal thread tells the daemon's main.
pub(crate) struct Signals {
    /// Completes on the first signal.
    pub first: tokio::sync::watch::Receiver<bool>,
    /// Says why the process must end now.
    pub force: tokio::sync::oneshot::Receiver<&'static str>,
}

/// Starts the signal thread; `force_after` is how long a clean shutdown may take after the first signal.
pub(crate) fn start(force_after: Duration) -> std::io::Result<Signals> {
    let (first_tx, first) = tokio::sync::watch::channel(false);
    let (force_tx, force) = tokio::sync::oneshot::channel();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Listening starts before the daemon does: a signal from then on is never missed.
    let (mut int, mut term) = runtime.block_on(async {
        Ok::<_, std::io::Error>((signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?))
    })?;
    std::thread::Builder::new()
        .name("canopy-signals".into())
        .spawn(move || {
            runtime.block_on(async move {
                let mut next = async || {
                    tokio::select! {
                        _ = int.recv() => tracing::info!("interrupted: shutting down"),
                        _ = term.recv() => tracing::info!("terminated: shutting down"),
                    }
                };
                next().await;
                first_tx.send_replace(true);
                let why = tokio::select! {
                    _ = next() => "a second signal",
                    _ = tokio::time::sleep(force_after) => "the clean shutdown took too long",
                };
                let _ = force_tx.send(why);
            })
        })?;
    Ok(Signals { first, force })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::{Signal, raise};

    /// Signals to this process, counted by the thread alone (the tests' runtime only waits): the first is the
    /// shutdown and a second forces the exit; then, with another thread, a shutdown past its time is forced.
    /// One test, so no other sees these signals.
    #[test]
    fn the_first_signal_shuts_down_and_a_second_or_the_time_forces_the_exit() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let Signals { mut first, force } = start(Duration::from_secs(600)).unwrap();
        assert!(!*first.borrow());
        raise(Signal::SIGTERM).unwrap();
        rt.block_on(async {
            first.wait_for(|f| *f).await.unwrap();
            raise(Signal::SIGTERM).unwrap();
            assert_eq!(force.await.unwrap(), "a second signal");
        });

        let Signals { first, force } = start(Duration::from_millis(50)).unwrap();
        raise(Signal::SIGINT).unwrap();
        assert_eq!(rt.block_on(force).unwrap(), "the clean shutdown took too long");
        assert!(*first.borrow());
    }
}
