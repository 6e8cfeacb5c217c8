//! Network helpers the daemons share: the accepted-connection stream their gRPC servers take, and the host's
//! name for default node ids and advertised addresses.

/// The host's name (`gethostname(2)`); empty if the system will not say.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

use std::io;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// Accepted connections with Nagle's algorithm off: control and small envelopes must not wait for an ACK.
///
/// A failed accept is never handed to the server, which would try again at once and spin (out of descriptors,
/// the listener stays readable): the listener waits instead, 10 ms doubling to 1 s while accepts keep failing,
/// and the failures are logged at most once a second with their count. A connection that was reset before it
/// could be taken is skipped without waiting.
pub fn incoming(listener: TcpListener) -> impl tokio_stream::Stream<Item = io::Result<TcpStream>> {
    futures::stream::unfold(Acceptor::new(listener), |mut acceptor| async move {
        let stream = acceptor.next().await;
        Some((Ok(stream), acceptor))
    })
}

/// The longest and shortest waits after a failed accept.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

struct Acceptor {
    listener: TcpListener,
    backoff: Duration,
    /// Failures since the last log line, and when that was.
    failures: u64,
    logged: Option<Instant>,
}

impl Acceptor {
    fn new(listener: TcpListener) -> Self {
        Self {
            listener,
            backoff: Duration::ZERO,
            failures: 0,
            logged: None,
        }
    }

    async fn next(&mut self) -> TcpStream {
        loop {
            match self.listener.accept().await {
                Ok((stream, _)) => {
                    self.backoff = Duration::ZERO;
                    // A peer gone already: nothing to serve.
                    if stream.set_nodelay(true).is_ok() {
                        return stream;
                    }
                }
                Err(e) => {
                    self.failures += 1;
                    if self.logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                        let addr = self
                            .listener
                            .local_addr()
                            .map(|a| a.to_string())
                            .unwrap_or_default();
                        tracing::warn!(%addr, failures = self.failures, "accepting a connection failed: {e}");
                        self.logged = Some(Instant::now());
                        self.failures = 0;
                    }
                    if is_one_connection(&e) {
                        continue;
                    }
                    self.backoff = (self.backoff * 2).clamp(ACCEPT_BACKOFF.0, ACCEPT_BACKOFF.1);
                    tokio::time::sleep(self.backoff).await;
                }
            }
        }
    }
}

/// Whether a failed accept concerns one connection only (the next may well succeed).
fn is_one_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::Interrupted
    )
}

/// Raises the soft limit on open descriptors to the hard limit, so a daemon serving many children and clients
/// does not run out below what the system allows it; returns the limit in force.
pub fn raise_fd_limit() -> io::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(hard.max(soft))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostname_is_the_kernels() {
        // The kernel's own record of the name; the helper must agree with it, trimmed.
        let proc = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        assert_eq!(hostname(), proc.trim());
        assert!(!hostname().is_empty());
    }

    #[tokio::test]
    async fn incoming_turns_nagle_off() {
        use tokio_stream::StreamExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut accepted = Box::pin(incoming(listener));
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let stream = accepted.next().await.unwrap().unwrap();
        assert!(stream.nodelay().unwrap());
    }
}
