//! Network helpers the daemons share: the accepted-connection stream their gRPC servers take, and the host's
//! name for default node ids and advertised addresses.

/// The host's name (`gethostname(2)`); empty if the system will not say.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What a listener allows any peer, known or not.
#[derive(Debug, Clone, Copy)]
pub struct ListenLimits {
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// How long a new connection may stay silent before its first byte (a TLS ClientHello, an HTTP/2 preface).
    pub first_byte: Duration,
}

impl Default for ListenLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            first_byte: FIRST_BYTE_TIMEOUT,
        }
    }
}

/// Connections a listener keeps open at once unless configured otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// How long a connection may stay silent before its first byte unless configured otherwise.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepted connections with Nagle's algorithm off (control and small envelopes must not wait for an ACK),
/// within `limits`, and what is left of them once the server has closed them ([`Connections`]).
///
/// A failed accept is never handed to the server, which would try again at once and spin (out of descriptors,
/// the listener stays readable): the listener waits instead, 10 ms doubling to 1 s while accepts keep failing,
/// and the failures are logged at most once a second with their count. A connection that was reset before it
/// could be taken is skipped without waiting.
pub fn incoming(
    listener: TcpListener,
    limits: ListenLimits,
) -> (impl tokio_stream::Stream<Item = io::Result<Conn>>, Connections) {
    let acceptor = Acceptor::new(listener, limits);
    let connections = Connections {
        open: acceptor.open.clone(),
        lingering: acceptor.lingering.clone(),
        max: limits.max_connections,
    };
    let stream = futures::stream::unfold(acceptor, |mut acceptor| async move {
        let stream = acceptor.next().await;
        Some((Ok(stream), acceptor))
    });
    (stream, connections)
}

/// The connections a listener accepted, lingering ones included (see [`Conn`]).
#[derive(Debug, Clone)]
pub struct Connections {
    open: Arc<Semaphore>,
    lingering: Arc<Semaphore>,
    max: usize,
}

impl Connections {
    /// Waits until every connection is closed, lingering ones included, or `deadline` passes: a daemon that
    /// exits first would reset the connections its peers are still reading.
    pub async fn closed_by(&self, deadline: tokio::time::Instant) {
        let all = u32::try_from(self.max).unwrap_or(u32::MAX);
        let _ = tokio::time::timeout_at(deadline, async {
            let _open = self.open.acquire_many(all).await;
            let _lingering = self.lingering.acquire_many(all).await;
        })
        .await;
    }
}

/// How long a connection the server closed waits for its peer to close too ([`Conn`]).
pub const LINGER: Duration = Duration::from_secs(5);

/// The longest and shortest waits after a failed accept.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

struct Acceptor {
    listener: TcpListener,
    limits: ListenLimits,
    open: Arc<Semaphore>,
    /// Closed connections waiting for their peers to close (at most as many as may be open).
    lingering: Arc<Semaphore>,
    backoff: Duration,
    /// Failed accepts, logged at most once a second.
    failures: crate::telemetry::EverySecond,
    /// Connections closed for the limit, logged at most once a second.
    over: crate::telemetry::EverySecond,
}

impl Acceptor {
    fn new(listener: TcpListener, limits: ListenLimits) -> Self {
        Self {
            listener,
            open: Arc::new(Semaphore::new(limits.max_connections)),
            lingering: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
            backoff: Duration::ZERO,
            failures: Default::default(),
            over: Default::default(),
        }
    }

    fn addr(&self) -> String {
        self.listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    async fn next(&mut self) -> Conn {
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    self.backoff = Duration::ZERO;
                    let Ok(permit) = self.open.clone().try_acquire_owned() else {
                        if let Some(held) = self.over.pass() {
                            tracing::warn!(
                                addr = %self.addr(), %peer, closed = held + 1,
                                "closing new connections: {} are open, the most this listener keeps",
                                self.limits.max_connections
                            );
                        }
                        continue;
                    };
                    // A peer gone already: nothing to serve.
                    if stream.set_nodelay(true).is_ok() {
                        return Conn {
                            stream: Some(stream),
                            _permit: permit,
                            lingering: self.lingering.clone(),
                            silence: Some(Box::pin(tokio::time::sleep(self.limits.first_byte))),
                        };
                    }
                }
                Err(e) => {
                    if let Some(held) = self.failures.pass() {
                        tracing::warn!(addr = %self.addr(), failures = held + 1, "accepting a connection failed: {e}");
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

/// An accepted connection: it holds its place under the listener's limit until closed, and fails its first read
/// if the peer sends nothing within the first-byte time-out.
///
/// Dropped by the server, it closes gracefully ("lingering close"): it sends its end of the stream and reads
/// (and throws away) what the peer still sends until the peer closes too, at most [`LINGER`]. Closing a socket
/// with bytes from the peer unread makes the kernel reset the connection, and a reset destroys what the peer has
/// received but not yet read: a subscriber reading the last rounds of a run as the front-end stops (its window
/// updates still arriving) would lose them. Its place under the limit is free at once, so peers that never close
/// (a flood of silent connections cut off at the first-byte time-out) do not keep new ones out; the lingering
/// sockets have a budget of their own as large, and beyond it a connection is closed outright.
pub struct Conn {
    /// Always `Some` until dropped.
    stream: Option<TcpStream>,
    _permit: OwnedSemaphorePermit,
    lingering: Arc<Semaphore>,
    /// Until the first byte arrives.
    silence: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Conn {
    fn io(&mut self) -> &mut TcpStream {
        self.stream
            .as_mut()
            .expect("a connection has its stream until dropped")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let (Some(stream), Ok(runtime), Ok(slot)) = (
            self.stream.take(),
            tokio::runtime::Handle::try_current(),
            self.lingering.clone().try_acquire_owned(),
        ) else {
            return;
        };
        runtime.spawn(async move {
            linger(stream, LINGER).await;
            drop(slot);
        });
    }
}

/// Sends our end of `stream`, then reads until the peer closes its end (or fails, or `limit` passes).
async fn linger(mut stream: TcpStream, limit: Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if stream.shutdown().await.is_err() {
        return;
    }
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(limit, async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(self.io()).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.silence = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match self.silence.as_mut().map(|s| s.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the peer sent nothing after connecting",
                ))),
                _ => Poll::Pending,
            },
            other => other,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(self.io()).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.io()).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.io()).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.io()).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(TcpStream::is_write_vectored)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream
            .as_ref()
            .expect("a connection has its stream until dropped")
            .connect_info()
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
        let mut accepted = Box::pin(incoming(listener, ListenLimits::default()).0);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let conn = accepted.next().await.unwrap().unwrap();
        assert!(conn.stream.as_ref().unwrap().nodelay().unwrap());
    }

    #[tokio::test]
    async fn a_listener_keeps_at_most_its_limit_open() {
        use tokio::io::AsyncReadExt;
        use tokio_stream::StreamExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ListenLimits {
            max_connections: 2,
            ..Default::default()
        };
        let mut accepted = Box::pin(incoming(listener, limits).0);
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let first = accepted.next().await.unwrap().unwrap();
        let _second = accepted.next().await.unwrap().unwrap();
        // The third is closed as it is accepted: its client reads the end of the stream.
        let next = tokio::time::timeout(Duration::from_millis(300), accepted.next()).await;
        assert!(next.is_err(), "a third connection was handed to the server");
        let mut byte = [0u8; 1];
        assert_eq!(clients[2].read(&mut byte).await.unwrap(), 0);
        // One closes (its client still open, so it lingers): the next connection takes its place.
        drop(first);
        let _fourth = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(accepted.next().await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn a_silent_connection_fails_its_first_read() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        use tokio_stream::StreamExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ListenLimits {
            first_byte: Duration::from_millis(100),
            ..Default::default()
        };
        let mut accepted = Box::pin(incoming(listener, limits).0);
        let _silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut conn = accepted.next().await.unwrap().unwrap();
        let mut buf = [0u8; 8];
        let err = conn.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        // One that speaks in time is not cut off later, however long it then pauses.
        let mut talker = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut conn = accepted.next().await.unwrap().unwrap();
        talker.write_all(b"x").await.unwrap();
        assert_eq!(conn.read(&mut buf).await.unwrap(), 1);
        let pause = tokio::time::timeout(Duration::from_millis(300), conn.read(&mut buf)).await;
        assert!(pause.is_err(), "a connection that spoke was cut off: {pause:?}");
    }

    /// A connection the server closes with bytes of its peer unread still delivers all it sent: closed outright,
    /// the kernel would reset it and the peer would lose what it had received but not yet read.
    #[tokio::test]
    async fn a_closed_connection_delivers_all_it_sent_though_its_peer_wrote_more() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        use tokio_stream::StreamExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (accepted, connections) = incoming(listener, ListenLimits::default());
        let mut accepted = Box::pin(accepted);
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut conn = accepted.next().await.unwrap().unwrap();
        // What the server never reads, as a subscriber's window updates.
        client.write_all(&[7u8; 1000]).await.unwrap();
        let sent = vec![1u8; 32 * 1024];
        conn.write_all(&sent).await.unwrap();
        drop(conn);
        // The peer reads late, after the server is done with the connection.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut received = Vec::new();
        client
            .read_to_end(&mut received)
            .await
            .expect("the connection ends without a reset");
        assert_eq!(received, sent);
        // The peer closes: the lingering end closes too, and the listener holds no connection.
        drop(client);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        connections.closed_by(deadline).await;
        assert!(
            tokio::time::Instant::now() < deadline,
            "the closed connection still lingers"
        );
    }

    /// A peer that never closes its end holds a closed connection at most [`LINGER`].
    #[tokio::test(start_paused = true)]
    async fn a_lingering_connection_gives_up_on_a_peer_that_never_closes() {
        use tokio_stream::StreamExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (accepted, connections) = incoming(listener, ListenLimits::default());
        let mut accepted = Box::pin(accepted);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let conn = accepted.next().await.unwrap().unwrap();
        let start = tokio::time::Instant::now();
        drop(conn);
        connections.closed_by(start + LINGER * 2).await;
        let waited = start.elapsed();
        assert!(waited >= LINGER && waited < LINGER * 2, "{waited:?}");
    }
}
