//! The agent's Unix socket: real ranks attach through the application SDK, one connection per rank
//! (canopy/v1/rank.proto). Each rank is a source of the leaf's round engine; its dumps become its rounds, its
//! hang-up without FIN makes it lost, its FIN finishes it. Control from the tree reaches every rank, which
//! applies it at its next dump.

mod access;
mod conn;
mod registry;
mod time_window;

pub use access::{Access, AccessError};

use std::path::{Path, PathBuf};

use canopy_core::node::Input;
use canopy_core::window::WindowGate;
use canopy_proto::v1::control;
use canopy_wire::v1::RankMessage;
use nix::unistd::Uid;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

use conn::connection;
pub use registry::Tenancy;
use registry::{Peer, Ranks};

/// Messages queued for one rank before it counts as not reading.
const RANK_QUEUE: usize = 64;
/// Events from all connections queued for the socket's task; beyond it, connections stop being read (the
/// SDK then queues, and drops and counts what it cannot queue).
const EVENT_QUEUE: usize = 1024;

/// Why the agent cannot serve ranks on its socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("cannot create {}: {source}", dir.display())]
    CreateDir { dir: PathBuf, source: std::io::Error },
    #[error(
        "{} is owned by uid {owner}, not by this agent's user (uid {own}): another user could replace the \
         socket in it; remove it or choose another --socket",
        dir.display()
    )]
    DirOwner { dir: PathBuf, owner: u32, own: u32 },
    #[error(
        "{} has mode {mode:04o}, writable by other users: they could replace the socket in it; make it 0700 or \
         choose another --socket",
        dir.display()
    )]
    DirWritable { dir: PathBuf, mode: u32 },
    #[error("{} is a symbolic link: give the socket's directory itself", dir.display())]
    DirSymlink { dir: PathBuf },
    #[error("{} is not a directory", dir.display())]
    NotADirectory { dir: PathBuf },
    #[error("cannot give {} to group {gid}: {source}", path.display())]
    Group {
        path: PathBuf,
        gid: u32,
        source: std::io::Error,
    },
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
    #[error("{0}")]
    Access(String),
}

/// The agent's listening socket and who may use it.
pub struct Listener {
    listener: UnixListener,
    access: Access,
}

/// Binds the socket at `path` for the agent's own user only (see [`bind_with`]).
pub fn bind(path: &Path) -> Result<Listener, SocketError> {
    bind_with(path, Access::default())
}

/// Makes sure the socket's directory is the agent's own: made with mode 0700 (0710 and the socket's group, with
/// one) if it is missing; an existing one must be a directory (not a symbolic link) owned by the agent's user and
/// writable by no one else, or another user could swap the socket for theirs.
fn private_dir(dir: &Path, access: &Access) -> Result<(), SocketError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let at = || dir.to_path_buf();
    let own = Uid::effective().as_raw();
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|source| SocketError::CreateDir { dir: at(), source })?;
            let meta = std::fs::symlink_metadata(dir)
                .map_err(|source| SocketError::Inspect { path: at(), source })?;
            // Made here (or by someone else in the meantime, which the checks below refuse): the group may reach
            // the socket through it, never list or change it.
            if meta.is_dir()
                && meta.uid() == own
                && let Some(gid) = access.socket_group()
            {
                std::os::unix::fs::chown(dir, None, Some(gid)).map_err(|source| SocketError::Group {
                    path: at(),
                    gid,
                    source,
                })?;
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o710))
                    .map_err(|source| SocketError::CreateDir { dir: at(), source })?;
            }
            std::fs::symlink_metadata(dir).map_err(|source| SocketError::Inspect { path: at(), source })?
        }
        Err(source) => return Err(SocketError::Inspect { path: at(), source }),
    };
    if meta.file_type().is_symlink() {
        return Err(SocketError::DirSymlink { dir: at() });
    }
    if !meta.is_dir() {
        return Err(SocketError::NotADirectory { dir: at() });
    }
    if meta.uid() != own {
        return Err(SocketError::DirOwner {
            dir: at(),
            owner: meta.uid(),
            own,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(SocketError::DirWritable { dir: at(), mode });
    }
    Ok(())
}

/// Binds the socket at `path` for the users `access` allows: its directory is the agent's own (see
/// `private_dir`), a stale socket no agent listens on is replaced, and the socket is made with mode 0600 (0660
/// with a socket group, then given to that group): the mode is set by the umask at bind, never changed after.
pub fn bind_with(path: &Path, access: Access) -> Result<Listener, SocketError> {
    use nix::sys::stat::{Mode, umask};
    let at = || path.to_path_buf();
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => dir,
        None => Path::new("."),
    };
    private_dir(dir, &access)?;
    let mask = if access.socket_group().is_some() {
        0o117
    } else {
        0o177
    };
    // The umask is the process's: set for the bind alone (the agent binds once, at start, before it serves).
    let bind = || {
        let previous = umask(Mode::from_bits_truncate(mask));
        let bound = UnixListener::bind(path);
        umask(previous);
        bound
    };
    let listen = |source| SocketError::Listen { path: at(), source };
    let listener = match bind() {
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
            bind().map_err(listen)?
        }
        Err(e) => return Err(listen(e)),
    };
    if let Some(gid) = access.socket_group() {
        // The group changes, not the mode: until it does, the socket is the agent's group's, and every peer is
        // checked against `access` whatever the file lets through.
        std::os::unix::fs::lchown(path, None, Some(gid)).map_err(|source| SocketError::Group {
            path: at(),
            gid,
            source,
        })?;
    }
    Ok(Listener { listener, access })
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
    listener: Listener,
    inputs: mpsc::Sender<Input>,
    mut control: mpsc::UnboundedReceiver<control::Action>,
    window: WindowGate,
    max_frame_bytes: usize,
    tenancy: Tenancy,
) {
    let limits = canopy_wire::FrameLimits {
        max_bytes: max_frame_bytes,
        ..Default::default()
    };
    let (events_tx, mut events) = mpsc::channel(EVENT_QUEUE);
    let Listener { listener, access } = listener;
    let mut refusals = canopy_runtime::telemetry::EverySecond::default();
    let mut ranks = Ranks::new(inputs, window.clone(), tenancy);
    let mut next_conn = 0u64;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let peer = match admit(&stream, &access) {
                        Ok(peer) => peer,
                        Err(reason) => {
                            if let Some(held) = refusals.pass() {
                                tracing::warn!("agent socket: refused a connection: {reason}{}", held_back(held));
                            }
                            tokio::spawn(refuse(stream, reason));
                            continue;
                        }
                    };
                    next_conn += 1;
                    let (tx, rx) = mpsc::channel(RANK_QUEUE);
                    ranks.connected(next_conn, tx, peer);
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

/// The connection's peer from its credentials (SO_PEERCRED) if it may use the socket, else why not.
fn admit(stream: &UnixStream, access: &Access) -> Result<Peer, String> {
    let cred = stream
        .peer_cred()
        .map_err(|e| format!("cannot read the peer's credentials: {e}"))?;
    match access.check(cred.uid(), cred.gid(), cred.pid()) {
        Some(reason) => Err(reason),
        None => Ok(Peer {
            uid: cred.uid(),
            pid: cred.pid().and_then(|p| u32::try_from(p).ok()),
        }),
    }
}

/// Tells a refused peer why, then closes its connection once it has read what the peer sent so far (at most
/// 64 KiB; closing over unread bytes would reset the connection before the peer reads the reason), all within a
/// second.
async fn refuse(mut stream: UnixStream, reason: String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let msg = canopy_wire::v1::AgentMessage {
        msg: Some(canopy_wire::v1::agent_message::Msg::Refused(
            canopy_wire::v1::RankRefused { reason },
        )),
    };
    let mut frame = Vec::new();
    canopy_wire::encode_frame(&msg, &mut frame);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
        let _ = stream.write_all(&frame).await;
        let _ = stream.shutdown().await;
        let mut scratch = [0u8; 4096];
        let mut read = 0;
        while read < 64 << 10 {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
    })
    .await;
}

/// The tail of a refusal's log line that counts the refusals held back since the last such line.
pub(crate) fn held_back(held: u64) -> String {
    match held {
        0 => String::new(),
        n => format!(" ({n} more refused since the last such line)"),
    }
}
