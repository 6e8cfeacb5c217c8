//! The agent's Unix socket: real ranks attach through the application SDK, one connection per rank
//! (canopy/v1/rank.proto). Each rank is a source of the leaf's round engine; its dumps become its rounds, its
//! hang-up without FIN makes it lost, its FIN finishes it. Control from the tree reaches every rank, which
//! applies it at its next dump.

mod conn;
mod registry;

use std::path::{Path, PathBuf};

use canopy_core::node::Input;
use canopy_core::window::WindowGate;
use canopy_proto::v1::control;
use canopy_wire::v1::RankMessage;
use tokio::net::UnixListener;
use tokio::sync::mpsc;

use conn::connection;
use registry::Ranks;

/// Messages queued for one rank before it counts as not reading.
const RANK_QUEUE: usize = 64;
/// Events from all connections queued for the socket's task; beyond it, connections stop being read (the
/// SDK then queues, and drops and counts what it cannot queue).
const EVENT_QUEUE: usize = 1024;

/// Binds the socket at `path`: makes its directory, replaces a stale socket no agent listens on, and lets
/// every local user connect (ranks run as the job's user, the agent often as its own).
/// Why the agent cannot serve ranks on its socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("cannot create {}: {source}", dir.display())]
    CreateDir { dir: PathBuf, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    Inspect { path: PathBuf, source: std::io::Error },
    #[error("{} exists and is not a socket", path.display())]
    NotASocket { path: PathBuf },
    #[error("another agent is listening on {}", path.display())]
    InUse { path: PathBuf },
    #[error("cannot remove stale {}: {source}", path.display())]
    RemoveStale { path: PathBuf, source: std::io::Error },
    #[error("cannot listen on {}: {source}", path.display())]
    Listen { path: PathBuf, source: std::io::Error },
    #[error("cannot open {} to every user: {source}", path.display())]
    Permissions { path: PathBuf, source: std::io::Error },
}

pub fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    let at = || path.to_path_buf();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| SocketError::CreateDir {
            dir: dir.to_path_buf(),
            source,
        })?;
    }
    let listen = |source| SocketError::Listen { path: at(), source };
    let listener = match UnixListener::bind(path) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            use std::os::unix::fs::FileTypeExt;
            let meta = std::fs::symlink_metadata(path)
                .map_err(|source| SocketError::Inspect { path: at(), source })?;
            if !meta.file_type().is_socket() {
                return Err(SocketError::NotASocket { path: at() });
            }
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(SocketError::InUse { path: at() });
            }
            std::fs::remove_file(path).map_err(|source| SocketError::RemoveStale { path: at(), source })?;
            UnixListener::bind(path).map_err(listen)?
        }
        Err(e) => return Err(listen(e)),
    };
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|source| SocketError::Permissions { path: at(), source })?;
    Ok(listener)
}

/// Removes the socket file when the agent stops.
pub struct SocketFile(pub PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// What a connection tells the socket's task.
enum Event {
    Message(u64, RankMessage),
    /// The rank's rounds [from, end) never came: it dropped those dumps (its queue was full).
    Gap(u64, u64, u64),
    Closed(u64, String),
}

/// Serves the socket until the control channel closes (the node ended).
///
/// A rank's dump of a round at or above the leaf's window waits on its connection, which is not read meanwhile: a
/// rank that runs ahead of what the tree serves fills its own queue in the SDK, which drops and counts the dumps it
/// cannot queue, and no other rank waits for it. (Before collection starts the leaf's window is open; the leaf
/// holds each rank's dumps itself, bounded per rank.)
pub async fn serve(
    listener: UnixListener,
    inputs: mpsc::Sender<Input>,
    mut control: mpsc::UnboundedReceiver<control::Action>,
    window: WindowGate,
    max_frame_bytes: usize,
) {
    let limits = canopy_wire::FrameLimits {
        max_bytes: max_frame_bytes,
        ..Default::default()
    };
    let (events_tx, mut events) = mpsc::channel(EVENT_QUEUE);
    let mut ranks = Ranks::new(inputs);
    let mut next_conn = 0u64;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    next_conn += 1;
                    let (tx, rx) = mpsc::channel(RANK_QUEUE);
                    ranks.connected(next_conn, tx);
                    tokio::spawn(connection(next_conn, stream, events_tx.clone(), rx, window.clone(), limits));
                }
                Err(e) => {
                    tracing::warn!("agent socket: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            Some(event) = events.recv() => match event {
                Event::Message(conn, msg) => ranks.on_message(conn, msg).await,
                Event::Gap(conn, from, end) => ranks.on_gap(conn, from, end).await,
                Event::Closed(conn, reason) => ranks.on_closed(conn, reason).await,
            },
            action = control.recv() => match action {
                Some(a) => ranks.on_control(a).await,
                None => return,
            },
        }
    }
}
