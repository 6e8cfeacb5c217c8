//! Network helpers the daemons share: the accepted-connection stream their gRPC servers take, and the host's
//! name for default node ids and advertised addresses.

/// The host's name (`gethostname(2)`); empty if the system will not say.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Accepted connections with Nagle's algorithm off: control and small envelopes must not wait for an ACK.
pub fn incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|s| {
        let s = s?;
        s.set_nodelay(true)?;
        Ok(s)
    })
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
