//! systemd's readiness protocol (sd_notify): a `Type=notify` unit learns that the daemon serves, and why it
//! stops, from datagrams on the socket named in `NOTIFY_SOCKET`. Without that variable (not under systemd)
//! every call does nothing.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (newline-separated `KEY=VALUE` lines) to systemd; returns whether it was sent.
pub fn notify(state: &str) -> bool {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET").filter(|p| !p.is_empty()) else {
        return false;
    };
    let Ok(socket) = UnixDatagram::unbound() else {
        return false;
    };
    let bytes = path.as_encoded_bytes();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        // An abstract socket: the name after '@'.
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name)
            .and_then(|addr| socket.send_to_addr(state.as_bytes(), &addr))
    } else {
        socket.send_to(state.as_bytes(), &path)
    };
    match sent {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!("cannot notify systemd at {}: {e}", path.to_string_lossy());
            false
        }
    }
}

/// Tells systemd the daemon serves (`READY=1`), with a status line `systemctl status` shows.
pub fn ready(status: &str) -> bool {
    notify(&format!("READY=1\nSTATUS={status}"))
}

/// Tells systemd the daemon is stopping.
pub fn stopping(status: &str) -> bool {
    notify(&format!("STOPPING=1\nSTATUS={status}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn without_notify_socket_nothing_is_sent() {
        // Tests never run under a notify-type unit; the variable is unset in their environment.
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            assert!(!super::ready("serving"));
        }
    }
}
