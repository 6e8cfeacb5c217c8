//! The shutdown future the daemons' mains pass to `run`: SIGINT or SIGTERM.

/// Completes on the first SIGINT or SIGTERM.
pub async fn signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: shutting down"),
        _ = term => tracing::info!("terminated: shutting down"),
    }
}
