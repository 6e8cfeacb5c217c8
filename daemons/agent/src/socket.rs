//! The agent's Unix socket: real ranks attach through the application SDK, one connection per rank
//! (canopy/v1/rank.proto). Each rank is a source of the leaf's round engine; its dumps become its rounds, its
//! hang-up without FIN makes it lost, its FIN finishes it. Control from the tree reaches every rank, which
//! applies it at its next dump.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use canopy_core::node::{Input, RankEvent, rank_source};
use canopy_core::window::WindowGate;
use canopy_proto::v1::{MissingReason, control};
use canopy_wire::v1::{
    AgentMessage, Options, RankAbsence, RankControl, RankFinAck, RankHello, RankMessage, RankRefused,
    agent_message, rank_message,
};
use canopy_wire::{MAX_FRAME, RANK_PROTOCOL_VERSION, batch_of_one, encode_frame};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

/// Messages queued for one rank before it counts as not reading.
const RANK_QUEUE: usize = 64;
/// Events from all connections queued for the socket's task; beyond it, connections stop being read (the
/// SDK then queues, and drops and counts what it cannot queue).
const EVENT_QUEUE: usize = 1024;

/// Binds the socket at `path`: makes its directory, replaces a stale socket no agent listens on, and lets
/// every local user connect (ranks run as the job's user, the agent often as its own).
pub fn bind(path: &Path) -> Result<UnixListener, String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let listener = match UnixListener::bind(path) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            use std::os::unix::fs::FileTypeExt;
            let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
            if !meta.file_type().is_socket() {
                return Err(format!("{} exists and is not a socket", path.display()));
            }
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(format!("another agent is listening on {}", path.display()));
            }
            std::fs::remove_file(path).map_err(|e| format!("cannot remove stale {}: {e}", path.display()))?;
            UnixListener::bind(path).map_err(|e| format!("cannot listen on {}: {e}", path.display()))?
        }
        Err(e) => return Err(format!("cannot listen on {}: {e}", path.display())),
    };
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| format!("cannot open {} to every user: {e}", path.display()))?;
    Ok(listener)
}

/// Removes the socket file when the agent stops.
pub struct SocketFile(pub PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

enum Event {
    Message(u64, RankMessage),
    /// The rank's rounds [from, end) never came: it dropped those dumps (its queue was full).
    Gap(u64, u64, u64),
    Closed(u64, String),
}

struct Conn {
    tx: Option<mpsc::Sender<AgentMessage>>,
    rank: Option<Attached>,
}

struct Attached {
    app: String,
    rank: u32,
    pid: u32,
    source: String,
    /// The round after the last one the rank dumped.
    next_round: u64,
    finished: bool,
}

impl Attached {
    fn who(&self) -> String {
        format!("rank {} of {} (pid {})", self.rank, self.app, self.pid)
    }
}

/// The ranks attached through the socket, and the control they get.
struct Ranks {
    inputs: mpsc::Sender<Input>,
    conns: HashMap<u64, Conn>,
    collecting: bool,
    options: Options,
    draining: bool,
    /// The running total of dumps each rank reported dropped, across its reconnections.
    dropped: HashMap<String, u64>,
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
) {
    let (events_tx, mut events) = mpsc::channel(EVENT_QUEUE);
    let mut ranks = Ranks {
        inputs,
        conns: HashMap::new(),
        collecting: true,
        options: Options::default(),
        draining: false,
        dropped: HashMap::new(),
    };
    let mut next_conn = 0u64;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    next_conn += 1;
                    let (tx, rx) = mpsc::channel(RANK_QUEUE);
                    ranks.conns.insert(next_conn, Conn { tx: Some(tx), rank: None });
                    tokio::spawn(connection(next_conn, stream, events_tx.clone(), rx, window.clone()));
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

/// Reads frames from one rank and writes what the agent sends it.
async fn connection(
    id: u64,
    stream: UnixStream,
    events: mpsc::Sender<Event>,
    mut outbound: mpsc::Receiver<AgentMessage>,
    mut gate: WindowGate,
) {
    let (mut rd, mut wr) = stream.into_split();
    let mut writer = tokio::spawn(async move {
        let mut frame = Vec::new();
        while let Some(msg) = outbound.recv().await {
            frame.clear();
            encode_frame(&msg, &mut frame);
            if wr.write_all(&frame).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    let mut buf = Vec::new();
    // The round the rank's next dump should carry: a later one means it dropped the ones between.
    let mut next_round: Option<u64> = None;
    let reason = loop {
        let mut prefix = [0u8; 4];
        // The agent closing the connection (a refusal, a protocol error) ends the writer, and the reading.
        let read = tokio::select! {
            r = rd.read_exact(&mut prefix) => r,
                        _ = &mut writer => {
                let _ = events.send(Event::Closed(id, "closed by the agent".into())).await;
                return;
            }
        };
        match read {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break "connection closed".to_string(),
            Err(e) => break format!("read failed: {e}"),
        }
        let len = match canopy_wire::frame_len(prefix) {
            Ok(len) => len,
            Err(e) => break format!("bad frame: {e}"),
        };
        debug_assert!(len <= MAX_FRAME);
        buf.resize(len, 0);
        if let Err(e) = rd.read_exact(&mut buf).await {
            break format!("connection closed inside a frame: {e}");
        }
        match RankMessage::decode(buf.as_slice()) {
            Ok(msg) if msg.msg.is_some() => {
                // A dump's round, or a FIN's end, past the round expected next: the rank dropped the ones between
                // (at a FIN, the ones after the last it delivered).
                let reached = match &msg.msg {
                    Some(rank_message::Msg::Hello(h)) => {
                        next_round = Some(h.next_round);
                        None
                    }
                    Some(rank_message::Msg::Dump(d)) => Some((d.round, d.round.saturating_add(1))),
                    Some(rank_message::Msg::Fin(f)) => Some((f.rounds_end, f.rounds_end)),
                    None => None,
                };
                if let Some((end, after)) = reached {
                    // The gap goes ahead of the dump's wait for the window: the rounds it leaves out must not wait
                    // for this rank.
                    if let Some(next) = next_round.filter(|next| end > *next)
                        && events.send(Event::Gap(id, next, end)).await.is_err()
                    {
                        break "the agent is stopping".into();
                    }
                    next_round = Some(next_round.unwrap_or(0).max(after));
                }
                if let Some(rank_message::Msg::Dump(d)) = &msg.msg
                    && !gate.admit(d.round).await
                {
                    break "the agent is stopping".into();
                }
                if events.send(Event::Message(id, msg)).await.is_err() {
                    break "the agent is stopping".into();
                }
            }
            Ok(_) => break "bad message: empty".into(),
            Err(e) => break format!("bad message: {e}"),
        }
    };
    let _ = events.send(Event::Closed(id, reason)).await;
    // The writer ends when the socket's task drops this rank's sender.
    let _ = writer.await;
}

impl Ranks {
    fn control_message(&self) -> AgentMessage {
        AgentMessage {
            msg: Some(agent_message::Msg::Control(RankControl {
                collecting: self.collecting,
                options: Some(self.options.clone()),
            })),
        }
    }

    async fn send(&mut self, ev: RankEvent) {
        let _ = self.inputs.send(Input::Rank(ev)).await;
    }

    /// Refuses a connection: the rank is told why, the connection closes.
    fn refuse(&mut self, conn: u64, reason: String) {
        tracing::warn!("agent socket: refused a rank: {reason}");
        if let Some(c) = self.conns.get_mut(&conn)
            && let Some(tx) = c.tx.take()
        {
            let _ = tx.try_send(AgentMessage {
                msg: Some(agent_message::Msg::Refused(RankRefused { reason })),
            });
        }
    }

    /// Closes a connection that broke the protocol; its rank, if attached, is lost.
    async fn drop_conn(&mut self, conn: u64, reason: String) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.tx = None;
        }
        self.on_closed(conn, reason).await;
    }

    async fn on_message(&mut self, conn: u64, msg: RankMessage) {
        let attached = self.conns.get(&conn).is_some_and(|c| c.rank.is_some());
        match msg.msg {
            Some(rank_message::Msg::Hello(h)) if !attached => self.on_hello(conn, h).await,
            Some(rank_message::Msg::Hello(_)) => {
                self.drop_conn(conn, "bad message: a second hello".into()).await
            }
            _ if !attached => {
                let reason = "bad message: a dump or fin before the hello".to_string();
                tracing::warn!("agent socket: {reason}; closing the connection");
                self.conns.remove(&conn);
            }
            Some(rank_message::Msg::Dump(d)) => self.on_dump(conn, d).await,
            Some(rank_message::Msg::Fin(f)) => {
                // Dumps dropped after the last one delivered are counted with the FIN.
                if let Some(a) = self.conns.get(&conn).and_then(|c| c.rank.as_ref()) {
                    let (source, who) = (a.source.clone(), a.who());
                    self.count_dropped(&source, &who, f.dropped).await;
                }
                let Some(a) = self.conns.get_mut(&conn).and_then(|c| c.rank.as_mut()) else {
                    return;
                };
                if a.finished {
                    // A second FIN, or one after a drain: the rank's end stands.
                    if let Some(tx) = self.conns.get(&conn).and_then(|c| c.tx.as_ref()) {
                        let _ = tx.try_send(AgentMessage {
                            msg: Some(agent_message::Msg::FinAck(RankFinAck {})),
                        });
                    }
                    return;
                }
                a.finished = true;
                tracing::info!(rounds = f.rounds_end, dropped = f.dropped, "{} finished", a.who());
                let detached = RankEvent::Detached {
                    source: a.source.clone(),
                    finished_end: Some(f.rounds_end.max(a.next_round)),
                };
                self.send(detached).await;
                if let Some(tx) = self.conns.get(&conn).and_then(|c| c.tx.as_ref()) {
                    let _ = tx.try_send(AgentMessage {
                        msg: Some(agent_message::Msg::FinAck(RankFinAck {})),
                    });
                }
            }
            None => {}
        }
    }

    async fn on_hello(&mut self, conn: u64, h: RankHello) {
        if h.protocol_version != RANK_PROTOCOL_VERSION {
            let reason = format!(
                "rank {} of {} (pid {}) speaks rank protocol {}, this agent {RANK_PROTOCOL_VERSION}",
                h.rank, h.app, h.pid, h.protocol_version
            );
            return self.refuse(conn, reason);
        }
        if h.app.is_empty() {
            return self.refuse(
                conn,
                format!("rank {} (pid {}) names no application", h.rank, h.pid),
            );
        }
        let twin = self
            .conns
            .values()
            .filter_map(|c| c.rank.as_ref())
            .find(|a| a.app == h.app && a.rank == h.rank && !a.finished);
        if let Some(twin) = twin {
            let reason = format!(
                "rank {} of {} (pid {}) is already attached (pid {})",
                h.rank, h.app, h.pid, twin.pid
            );
            return self.refuse(conn, reason);
        }
        let source = rank_source(&h.app, h.rank);
        tracing::info!(
            from_round = h.next_round,
            nranks = h.nranks,
            "rank {} of {} (pid {}) attached",
            h.rank,
            h.app,
            h.pid
        );
        let control = self.control_message();
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if let Some(tx) = &c.tx {
            let _ = tx.try_send(control);
        }
        c.rank = Some(Attached {
            app: h.app,
            rank: h.rank,
            pid: h.pid,
            source: source.clone(),
            next_round: h.next_round,
            finished: false,
        });
        self.send(RankEvent::Attached {
            source,
            from: h.next_round,
            announced: h.nranks,
        })
        .await;
    }

    async fn on_dump(&mut self, conn: u64, d: canopy_wire::v1::RankDump) {
        if !d.names.is_empty() {
            let names = d.names.into_iter().map(|n| (n.id, n.name)).collect();
            self.send(RankEvent::Names(names)).await;
        }
        let Some(a) = self.conns.get(&conn).and_then(|c| c.rank.as_ref()) else {
            return;
        };
        let (source, who) = (a.source.clone(), a.who());
        self.count_dropped(&source, &who, d.dropped).await;
        let Some(a) = self.conns.get_mut(&conn).and_then(|c| c.rank.as_mut()) else {
            return;
        };
        if self.draining || a.finished {
            return;
        }
        let profile = match RankAbsence::try_from(d.absence) {
            Ok(RankAbsence::Unspecified) => Ok(batch_of_one(&d.profile)),
            Ok(RankAbsence::SampledOut) => Err(MissingReason::SampledOut),
            Ok(RankAbsence::Stopped) => Err(MissingReason::Stopped),
            Err(_) => {
                let reason = format!("bad message: unknown absence {} in round {}", d.absence, d.round);
                return self.drop_conn(conn, reason).await;
            }
        };
        a.next_round = a.next_round.max(d.round.saturating_add(1));
        let round = RankEvent::Round {
            source: a.source.clone(),
            rank: a.rank,
            round: d.round,
            dump_unix_ns: d.dump_unix_ns,
            profile,
        };
        self.send(round).await;
    }

    /// Counts what a rank reports it dropped beyond what it reported before (its total survives reconnects).
    async fn count_dropped(&mut self, source: &str, who: &str, total: u64) {
        let known = self.dropped.entry(source.to_string()).or_default();
        if total > *known {
            let fresh = total - *known;
            *known = total;
            tracing::warn!(dropped = fresh, total, "{who} reports dumps it could not deliver");
            self.send(RankEvent::DumpsDropped(fresh)).await;
        }
    }

    /// A rank's dumps of rounds [from, end) were dropped in the application: the rounds stop waiting for it.
    async fn on_gap(&mut self, conn: u64, from: u64, end: u64) {
        let Some(a) = self.conns.get_mut(&conn).and_then(|c| c.rank.as_mut()) else {
            return;
        };
        if self.draining || a.finished {
            return;
        }
        tracing::debug!(from, end, "{}: rounds dropped before they left the rank", a.who());
        a.next_round = a.next_round.max(end);
        let dropped = RankEvent::RoundsDropped {
            source: a.source.clone(),
            from,
            end,
        };
        self.send(dropped).await;
    }

    async fn on_closed(&mut self, conn: u64, reason: String) {
        let Some(c) = self.conns.remove(&conn) else { return };
        let Some(a) = c.rank else { return };
        if a.finished {
            return;
        }
        tracing::warn!("{} vanished ({reason}): its rounds close as lost", a.who());
        let lost = RankEvent::Detached {
            source: a.source,
            finished_end: None,
        };
        self.send(lost).await;
    }

    async fn on_control(&mut self, action: control::Action) {
        match action {
            control::Action::Start(_) => self.collecting = true,
            control::Action::Stop(_) => self.collecting = false,
            control::Action::Options(o) => {
                let period = if o.period_ms == 0 {
                    self.options.period_ms
                } else {
                    o.period_ms
                };
                self.options = Options {
                    period_ms: period,
                    ..o
                };
            }
            control::Action::Drain(_) => {
                self.draining = true;
                let mut finished = Vec::new();
                for c in self.conns.values_mut() {
                    if let Some(a) = c.rank.as_mut().filter(|a| !a.finished) {
                        a.finished = true;
                        finished.push(RankEvent::Detached {
                            source: a.source.clone(),
                            finished_end: Some(a.next_round),
                        });
                    }
                }
                for input in finished {
                    self.send(input).await;
                }
                return;
            }
            control::Action::FinAck(_) => return,
        }
        let msg = self.control_message();
        for c in self.conns.values() {
            if let (Some(tx), Some(a)) = (&c.tx, &c.rank)
                && tx.try_send(msg.clone()).is_err()
            {
                tracing::warn!("{} is not reading control; it gets the next change", a.who());
            }
        }
    }
}
