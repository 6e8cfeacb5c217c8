//! The ranks attached through the socket: who is attached on which connection, what each has reported, and the
//! control every rank gets. Each rank is a rank source of the leaf, fed as `RankEvent`s.

use std::collections::HashMap;

use canopy_core::node::{Input, RankEvent, rank_source};
use canopy_proto::v1::{MissingReason, control};
use canopy_wire::RANK_PROTOCOL_VERSION;
use canopy_wire::batch_of_one;
use canopy_wire::v1::{
    AgentMessage, Options, RankAbsence, RankControl, RankFinAck, RankHello, RankMessage, RankRefused,
    agent_message, rank_message,
};
use tokio::sync::mpsc;

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
pub(super) struct Ranks {
    inputs: mpsc::Sender<Input>,
    conns: HashMap<u64, Conn>,
    collecting: bool,
    options: Options,
    draining: bool,
    /// The running total of dumps each rank reported dropped, across its reconnections.
    dropped: HashMap<String, u64>,
}

impl Ranks {
    pub(super) fn new(inputs: mpsc::Sender<Input>) -> Self {
        Ranks {
            inputs,
            conns: HashMap::new(),
            collecting: true,
            options: Options::default(),
            draining: false,
            dropped: HashMap::new(),
        }
    }

    /// A new connection, not yet attached as a rank.
    pub(super) fn connected(&mut self, conn: u64, tx: mpsc::Sender<AgentMessage>) {
        self.conns.insert(
            conn,
            Conn {
                tx: Some(tx),
                rank: None,
            },
        );
    }

    fn control_message(&self) -> AgentMessage {
        AgentMessage {
            msg: Some(agent_message::Msg::Control(RankControl {
                collecting: self.collecting,
                options: Some(self.options.clone()),
            })),
        }
    }

    async fn send(&mut self, ev: RankEvent) {
        let _ = self.inputs.send(Input::Ranks(vec![ev])).await;
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

    pub(super) async fn on_message(&mut self, conn: u64, msg: RankMessage) {
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
        if h.nranks > canopy_proto::MAX_RANKS {
            let reason = format!(
                "rank {} of {} (pid {}) announces {} ranks, more than any node may answer for ({})",
                h.rank,
                h.app,
                h.pid,
                h.nranks,
                canopy_proto::MAX_RANKS
            );
            return self.refuse(conn, reason);
        }
        if h.nranks > 0 && h.rank >= h.nranks {
            let reason = format!(
                "rank {} of {} (pid {}) is not below the application's announced size {}",
                h.rank, h.app, h.pid, h.nranks
            );
            return self.refuse(conn, reason);
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
    pub(super) async fn on_gap(&mut self, conn: u64, from: u64, end: u64) {
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

    pub(super) async fn on_closed(&mut self, conn: u64, reason: String) {
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

    pub(super) async fn on_control(&mut self, action: control::Action) {
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
