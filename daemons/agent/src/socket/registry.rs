//! The ranks attached through the socket: who is attached on which connection, what each has reported, and the
//! control every rank gets. Each rank is a rank source of the leaf, fed as `RankEvent`s.

use std::collections::{HashMap, HashSet};

use super::time_window::TimeWindow;
use canopy_core::node::{Input, RankEvent, rank_source};
use canopy_core::window::WindowGate;
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
    peer: Peer,
    rank: Option<Attached>,
}

/// Who is at the other end of a connection, from the kernel (SO_PEERCRED), not from what it says of itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Peer {
    pub uid: u32,
    pub pid: Option<u32>,
}

/// What the agent's configuration lets a hello claim.
#[derive(Debug, Clone, Default)]
pub struct Tenancy {
    /// The application of this agent's simulated ranks: no rank of the socket may join it.
    pub simulated_app: Option<String>,
    /// The largest application size a hello may announce (`max_app_ranks`).
    pub max_app_ranks: u32,
}

impl Tenancy {
    /// Why a hello's own claims are refused by this agent's configuration: another protocol, no application or
    /// too long a name, the simulated ranks' application, or a size or rank out of bounds.
    fn refusal(&self, h: &RankHello) -> Option<String> {
        if h.protocol_version != RANK_PROTOCOL_VERSION {
            let reason = format!(
                "rank {} of {} (pid {}) speaks rank protocol {}, this agent {RANK_PROTOCOL_VERSION}",
                h.rank, h.app, h.pid, h.protocol_version
            );
            return Some(reason);
        }
        if h.app.is_empty() {
            return Some(format!("rank {} (pid {}) names no application", h.rank, h.pid));
        }
        if h.app.len() > canopy_proto::MAX_APP_NAME {
            return Some(format!(
                "rank {} (pid {}) names an application of {} bytes, longer than the {} allowed",
                h.rank,
                h.pid,
                h.app.len(),
                canopy_proto::MAX_APP_NAME
            ));
        }
        if self.simulated_app.as_deref() == Some(h.app.as_str()) {
            let reason = format!(
                "rank {} of {} (pid {}) names the application of this agent's simulated ranks",
                h.rank, h.app, h.pid
            );
            return Some(reason);
        }
        if h.nranks > self.max_app_ranks {
            let reason = format!(
                "rank {} of {} (pid {}) announces {} ranks, more than this agent's max_app_ranks ({})",
                h.rank, h.app, h.pid, h.nranks, self.max_app_ranks
            );
            return Some(reason);
        }
        if h.nranks == 0 && h.rank >= self.max_app_ranks {
            let reason = format!(
                "rank {} of {} (pid {}) is not below this agent's max_app_ranks ({})",
                h.rank, h.app, h.pid, self.max_app_ranks
            );
            return Some(reason);
        }
        if h.nranks > 0 && h.rank >= h.nranks {
            let reason = format!(
                "rank {} of {} (pid {}) is not below the application's announced size {}",
                h.rank, h.app, h.pid, h.nranks
            );
            return Some(reason);
        }
        None
    }
}

struct Attached {
    app: String,
    rank: u32,
    pid: u32,
    source: String,
    /// The application's size it announced.
    nranks: u32,
    /// The round after the last one the rank dumped.
    next_round: u64,
    /// It dumped (or reported a gap) since it attached.
    dumped: bool,
    finished: bool,
    /// Notices from the rank logged so far (at most `MAX_NOTICES`).
    notices: usize,
}

/// The most notices the agent logs from one connection, and the longest line of one: a rank cannot flood the
/// agent's log.
const MAX_NOTICES: usize = 16;
const MAX_NOTICE_CHARS: usize = 300;

/// An application's size, as its first rank announced it: every other rank must announce the same. Kept while
/// one of its ranks is connected, and for the rest of the run once one of them dumped (a hello that comes and goes
/// without a dump cannot fix the size of an application that starts later).
struct AppSize {
    nranks: u32,
    /// Who announced it: rank and pid.
    by: (u32, u32),
    /// The user the application belongs to on this agent: its first rank's (SO_PEERCRED). Another user's hello
    /// for it is refused, so no user can add ranks to another's rounds or hold a rank id another needs.
    uid: u32,
    connected: usize,
    dumped: bool,
}

/// How far past the agent's current rounds a hello's first round may be: as many dumps as an SDK's queue can
/// hold (CANOPY_QUEUE_DUMPS is at most 65,536), so a rank that re-attaches with its queue full is in reach.
pub(super) const FIRST_ROUND_REACH: u64 = 1 << 16;

impl Attached {
    fn who(&self) -> String {
        format!("rank {} of {} (pid {})", self.rank, self.app, self.pid)
    }
}

/// The ranks attached through the socket, and the control they get.
pub(super) struct Ranks {
    inputs: mpsc::Sender<Input>,
    tenancy: Tenancy,
    conns: HashMap<u64, Conn>,
    collecting: bool,
    options: Options,
    /// The tree's clock from the latest Start, (start_unix_ns, first_round): time rounds count from it.
    clock: (u64, u64),
    /// The window of rounds in force, (from, to): the ranks report those rounds only.
    window_of_rounds: Option<(u64, u64)>,
    draining: bool,
    /// The running total of dumps each rank reported dropped, across its reconnections.
    dropped: HashMap<String, u64>,
    /// The leaf's window: where its rounds are, for a hello's first round.
    window: WindowGate,
    /// The connection each attached rank is on (by its source id), finished or not, until it closes.
    attached: HashMap<String, u64>,
    /// Each application's announced size.
    apps: HashMap<String, AppSize>,
    /// The ranks that dumped (or reported dumps dropped) at least once: one that leaves before is forgotten, not
    /// lost.
    dumped: HashSet<String>,
    /// Refused hellos, logged at most once a second (a local flood of bad hellos cannot fill the log).
    refusals: canopy_runtime::telemetry::EverySecond,
}

impl Ranks {
    pub(super) fn new(inputs: mpsc::Sender<Input>, window: WindowGate, tenancy: Tenancy) -> Self {
        Ranks {
            inputs,
            tenancy,
            conns: HashMap::new(),
            collecting: true,
            options: Options::default(),
            clock: (0, 0),
            window_of_rounds: None,
            draining: false,
            dropped: HashMap::new(),
            window,
            attached: HashMap::new(),
            apps: HashMap::new(),
            dumped: HashSet::new(),
            refusals: Default::default(),
        }
    }

    /// A rank delivered (or reported dropped) a dump: it took part in the run.
    fn took_part(&mut self, source: &str, app: &str) {
        if !self.dumped.contains(source) {
            self.dumped.insert(source.to_string());
        }
        if let Some(size) = self.apps.get_mut(app) {
            size.dumped = true;
        }
    }

    /// How a rank that finished or hung up leaves: forgotten if it never dumped (it would count as lost, or
    /// stopped, in every round to come), else finished after its rounds below `finished_end`, or lost.
    fn leaving(&self, a: &Attached, finished_end: Option<u64>) -> RankEvent {
        if self.dumped.contains(&a.source) {
            return RankEvent::Detached {
                source: a.source.clone(),
                finished_end,
            };
        }
        let how = if finished_end.is_some() {
            "finished"
        } else {
            "hung up"
        };
        tracing::warn!(
            "{} {how} before its first dump: forgotten, rounds from now on do not expect it",
            a.who()
        );
        RankEvent::Left {
            source: a.source.clone(),
            announced: a.nranks,
        }
    }

    /// A new connection, not yet attached as a rank.
    pub(super) fn connected(&mut self, conn: u64, tx: mpsc::Sender<AgentMessage>, peer: Peer) {
        self.conns.insert(
            conn,
            Conn {
                tx: Some(tx),
                peer,
                rank: None,
            },
        );
    }

    /// The control in force for a rank of `app`: the options carry its application's entry alone, the only one
    /// it runs (the SDK lays it over the global options).
    fn control_message(&self, app: &str) -> AgentMessage {
        let mut options = self.options.clone();
        options.apps.retain(|a| a.app == app);
        AgentMessage {
            msg: Some(agent_message::Msg::Control(RankControl {
                collecting: self.collecting,
                options: Some(options),
                start_unix_ns: self.clock.0,
                first_round: self.clock.1,
                windowed: self.window_of_rounds.is_some(),
                window_from: self.window_of_rounds.map_or(0, |w| w.0),
                window_to: self.window_of_rounds.map_or(0, |w| w.1),
            })),
        }
    }

    async fn send(&mut self, ev: RankEvent) {
        let _ = self.inputs.send(Input::Ranks(vec![ev])).await;
    }

    /// Refuses a connection: the rank is told why, the connection closes.
    fn refuse(&mut self, conn: u64, reason: String) {
        if let Some(held) = self.refusals.pass() {
            tracing::warn!("agent socket: refused a rank: {reason}{}", super::held_back(held));
        }
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
                let end = f.rounds_end.max(a.next_round);
                let Some(a) = self.conns.get(&conn).and_then(|c| c.rank.as_ref()) else {
                    return;
                };
                let detached = self.leaving(a, Some(end));
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

    async fn on_hello(&mut self, conn: u64, mut h: RankHello) {
        let Some(peer) = self.conns.get(&conn).map(|c| c.peer) else {
            return;
        };
        // The pid is the kernel's where it is known: a hello cannot name another process.
        h.pid = peer.pid.unwrap_or(h.pid);
        if let Some(reason) = self.tenancy.refusal(&h).or_else(|| self.conflict(&h, peer.uid)) {
            return self.refuse(conn, reason);
        }
        let source = rank_source(&h.app, h.rank);
        // In time rounds a rank dumps first the round of the window under way: it is expected from there, and the
        // rounds before count it as not attached yet (neither lost nor late).
        let from = self
            .time_round_now()
            .map_or(h.next_round, |r| r.max(h.next_round));
        tracing::info!(
            from_round = from,
            nranks = h.nranks,
            "rank {} of {} (pid {}) attached",
            h.rank,
            h.app,
            h.pid
        );
        let control = self.control_message(&h.app);
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if let Some(tx) = &c.tx {
            let _ = tx.try_send(control);
        }
        let size = self.apps.entry(h.app.clone()).or_insert(AppSize {
            nranks: h.nranks,
            by: (h.rank, h.pid),
            uid: peer.uid,
            connected: 0,
            dumped: false,
        });
        size.connected += 1;
        self.attached.insert(source.clone(), conn);
        c.rank = Some(Attached {
            app: h.app,
            rank: h.rank,
            pid: h.pid,
            source: source.clone(),
            nranks: h.nranks,
            next_round: from,
            dumped: false,
            finished: false,
            notices: 0,
        });
        self.send(RankEvent::Attached {
            source,
            from,
            announced: h.nranks,
        })
        .await;
    }

    /// Why a hello cannot attach beside the ranks already here: its application is another user's, or has another
    /// size; the rank is attached already; or its first round is out of the agent's reach.
    fn conflict(&self, h: &RankHello, uid: u32) -> Option<String> {
        if let Some(size) = self.apps.get(&h.app)
            && size.uid != uid
        {
            let reason = format!(
                "rank {} of {} (pid {}, uid {}) may not join {}: on this agent it belongs to uid {} (its rank {}, \
                 pid {})",
                h.rank, h.app, h.pid, uid, h.app, size.uid, size.by.0, size.by.1
            );
            return Some(reason);
        }
        if let Some(size) = self.apps.get(&h.app)
            && size.nranks != h.nranks
        {
            let reason = format!(
                "rank {} of {} (pid {}) announces {} ranks, but {} has {} (announced first by rank {}, pid {})",
                h.rank, h.app, h.pid, h.nranks, h.app, size.nranks, size.by.0, size.by.1
            );
            return Some(reason);
        }
        // The same rank while its first connection is open (finished or not): one connection per rank.
        let twin = self
            .attached
            .get(&rank_source(&h.app, h.rank))
            .and_then(|c| self.conns.get(c))
            .and_then(|c| c.rank.as_ref());
        if let Some(twin) = twin {
            let reason = format!(
                "rank {} of {} (pid {}) is already attached (pid {})",
                h.rank, h.app, h.pid, twin.pid
            );
            return Some(reason);
        }
        // A first round far past the leaf's rounds would count the rank as missing in every round until then. The
        // leaf takes rounds below its window's limit now (before collection starts, from round 0).
        let here = match self.window.limit() {
            u64::MAX => 0,
            limit => limit,
        };
        if h.next_round > here.saturating_add(FIRST_ROUND_REACH) {
            let reason = format!(
                "rank {} of {} (pid {}) starts at round {}, more than {FIRST_ROUND_REACH} rounds past this \
                 agent's rounds (below {here})",
                h.rank, h.app, h.pid, h.next_round
            );
            return Some(reason);
        }
        None
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
        for notice in d.notices.iter().take(MAX_NOTICES.saturating_sub(a.notices)) {
            let line: String = notice
                .chars()
                .take(MAX_NOTICE_CHARS)
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            tracing::warn!("{who}: {line}");
            a.notices += 1;
        }
        if self.draining || a.finished {
            return;
        }
        let profile = match RankAbsence::try_from(d.absence) {
            Ok(RankAbsence::Unspecified) => Ok(batch_of_one(&d.profile).into()),
            Ok(RankAbsence::SampledOut) => Err(MissingReason::SampledOut),
            Ok(RankAbsence::Stopped) => Err(MissingReason::Stopped),
            Err(_) => {
                let reason = format!("bad message: unknown absence {} in round {}", d.absence, d.round);
                return self.drop_conn(conn, reason).await;
            }
        };
        a.next_round = a.next_round.max(d.round.saturating_add(1));
        a.dumped = true;
        let round = RankEvent::Round {
            source: a.source.clone(),
            rank: a.rank,
            round: d.round,
            dump_unix_ns: d.dump_unix_ns,
            profile,
        };
        let (source, app) = (a.source.clone(), a.app.clone());
        self.took_part(&source, &app);
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
        let time_rounds = canopy_wire::options::time_rounds(&self.options);
        let Some(a) = self.conns.get_mut(&conn).and_then(|c| c.rank.as_mut()) else {
            return;
        };
        if self.draining || a.finished {
            return;
        }
        // Rounds before the one the rank attached at (the window under way, in time rounds) are no gap.
        let from = from.max(a.next_round);
        if from >= end {
            return;
        }
        if !a.dumped && time_rounds {
            // In time rounds a rank's first round is the window under way when it got the tree's clock, which may
            // be later than at its hello (or than its hello's own round, when the period is the rank's own): it
            // attached there, and the rounds before count it as not attached yet.
            a.next_round = end;
            let attached = RankEvent::Attached {
                source: a.source.clone(),
                from: end,
                // Announced once, at the hello.
                announced: 0,
            };
            return self.send(attached).await;
        }
        a.dumped = true;
        tracing::debug!(from, end, "{}: rounds dropped before they left the rank", a.who());
        a.next_round = a.next_round.max(end);
        let dropped = RankEvent::RoundsDropped {
            source: a.source.clone(),
            from,
            end,
        };
        let (source, app) = (a.source.clone(), a.app.clone());
        self.took_part(&source, &app);
        self.send(dropped).await;
    }

    pub(super) async fn on_closed(&mut self, conn: u64, reason: String) {
        let Some(c) = self.conns.remove(&conn) else { return };
        let Some(a) = c.rank else { return };
        if self.attached.get(&a.source) == Some(&conn) {
            self.attached.remove(&a.source);
        }
        if let Some(size) = self.apps.get_mut(&a.app) {
            size.connected = size.connected.saturating_sub(1);
            if size.connected == 0 && !size.dumped {
                self.apps.remove(&a.app);
            }
        }
        if a.finished {
            return;
        }
        if self.dumped.contains(&a.source) {
            tracing::warn!("{} vanished ({reason}): its rounds close as lost", a.who());
        }
        let gone = self.leaving(&a, None);
        self.send(gone).await;
    }

    /// In time rounds with a known period (the options' period_ms) and the tree's clock, the round of the window
    /// under way: the first a rank that attaches now dumps. A rank's own CANOPY_DUMP_PERIOD_MS is not known here:
    /// without period_ms a rank is expected from its hello's round until its first dump says where it attached.
    fn time_round_now(&self) -> Option<u64> {
        if !self.collecting || !canopy_wire::options::time_rounds(&self.options) {
            return None;
        }
        let window = TimeWindow::from_start(self.clock.0, self.clock.1, self.options.period_ms)?;
        Some(window.round_at(canopy_core::node::unix_ns()))
    }

    pub(super) async fn on_control(&mut self, action: control::Action) {
        match action {
            control::Action::Start(s) => {
                self.collecting = true;
                self.clock = (s.start_unix_ns, s.first_round);
                self.window_of_rounds = None;
            }
            control::Action::Stop(_) => {
                self.collecting = false;
                self.window_of_rounds = None;
            }
            control::Action::Window(w) => self.window_of_rounds = Some((w.from_round, w.to_round)),
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
        for c in self.conns.values() {
            if let (Some(tx), Some(a)) = (&c.tx, &c.rank)
                && tx.try_send(self.control_message(&a.app)).is_err()
            {
                tracing::warn!("{} is not reading control; it gets the next change", a.who());
            }
        }
    }
}
