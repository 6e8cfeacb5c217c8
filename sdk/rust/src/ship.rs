//! The background thread that ships queued dumps to the leaf agent over its Unix socket, and the reader of the
//! agent's control. The application's threads never wait on either.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use canopy_wire::options::{Measure, metric};
use canopy_wire::v1::{
    AgentMessage, CounterSample, EventName, EventSample, RankAbsence, RankDump, RankFin, RankHello,
    RankMessage, RankProfile, StepMark, TraceEvent, TraceKind, agent_message, rank_message,
};
use canopy_wire::{RANK_PROTOCOL_VERSION, encode_frame, read_frame};
use prost::Message;

use crate::{Error, Kind, Sdk, Snapshot, lock, registry};

/// First and longest wait between two attempts to reach the agent.
const MIN_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The shortest and longest wait between two looks at the queue.
const MIN_POLL: Duration = Duration::from_millis(1);
const MAX_POLL: Duration = Duration::from_millis(20);
/// Trace events a queued snapshot's buffer keeps room for after it was shipped.
const TRACE_KEPT: usize = 4096;
/// A write the agent does not take within this time ends the connection; the dump is sent again on the next.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
struct LinkState {
    finishing: bool,
    outcome: Option<Result<(), Error>>,
    /// Why the agent is not reachable, or the last thing it said (shown in errors).
    status: String,
}

/// The connection's state as the application threads see it.
#[derive(Debug, Default)]
pub(crate) struct Link {
    state: Mutex<LinkState>,
    done: Condvar,
    delivered: AtomicU64,
    connected: AtomicBool,
}

impl Link {
    pub(crate) fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    pub(crate) fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// The agent's state in words, for error messages.
    pub(crate) fn describe(&self, socket: &Path) -> String {
        let st = lock(&self.state);
        if self.connected() {
            format!("agent at {} is slow", socket.display())
        } else if st.status.is_empty() {
            format!("agent at {} not reached yet", socket.display())
        } else {
            format!("agent at {}: {}", socket.display(), st.status)
        }
    }

    pub(crate) fn note(&self, status: String) {
        lock(&self.state).status = status;
    }

    fn finishing(&self) -> bool {
        lock(&self.state).finishing
    }

    fn conclude(&self, outcome: Result<(), Error>) {
        let mut st = lock(&self.state);
        if st.outcome.is_none() {
            st.outcome = Some(outcome);
        }
        self.done.notify_all();
    }

    /// Asks the shipper to finish and waits for the outcome, up to `timeout`.
    pub(crate) fn finish(&self, sdk: &Sdk, timeout: Duration) -> Result<(), Error> {
        lock(&self.state).finishing = true;
        sdk.wake_shipper();
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
        let mut st = lock(&self.state);
        loop {
            if let Some(outcome) = st.outcome.clone() {
                return outcome;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout(timeout));
            }
            st = self
                .done
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// One connection to the agent.
struct Conn {
    stream: UnixStream,
    dead: Arc<AtomicBool>,
    /// The agent sent its first RankControl: it accepted the hello, dumps may go.
    welcomed: Arc<AtomicBool>,
    /// Names this connection has carried.
    sent: HashSet<u64>,
    /// Notices (unavailable counters) this connection has carried.
    notices: usize,
}

/// The names of every timer and counter, refreshed from the registry when a dump names a new one.
#[derive(Default)]
struct Names {
    by_id: HashMap<u64, String>,
    timer_ids: Vec<u64>,
    counter_ids: Vec<u64>,
    /// Whether the options in force report each id; cleared when the options change.
    reports: HashMap<u64, bool>,
    reports_for: u64,
}

impl Names {
    fn refresh(&mut self) {
        let (timers, counters) = registry().names_since(self.timer_ids.len(), self.counter_ids.len());
        for (id, name) in timers {
            self.timer_ids.push(id);
            self.by_id.insert(id, name);
        }
        for (id, name) in counters {
            self.counter_ids.push(id);
            self.by_id.insert(id, name);
        }
    }

    fn timer_id(&mut self, index: u32) -> u64 {
        if index as usize >= self.timer_ids.len() {
            self.refresh();
        }
        self.timer_ids[index as usize]
    }

    fn counter_id(&mut self, index: u32) -> u64 {
        if index as usize >= self.counter_ids.len() {
            self.refresh();
        }
        self.counter_ids[index as usize]
    }

    fn reports(&mut self, measure: &Measure, generation: u64, id: u64) -> bool {
        if generation != self.reports_for {
            self.reports.clear();
            self.reports_for = generation;
        }
        if let Some(r) = self.reports.get(&id) {
            return *r;
        }
        let r = measure.reports(self.by_id.get(&id).map(String::as_str).unwrap_or(""));
        self.reports.insert(id, r);
        r
    }
}

/// The shipper's loop: (re)connect with back-off, send queued dumps in order, finish on request.
pub(crate) fn run(sdk: &'static Sdk) {
    let mut conn: Option<Conn> = None;
    let mut backoff = MIN_BACKOFF;
    let mut next_try = Instant::now();
    let mut names = Names::default();
    let mut frame = Vec::new();
    let mut poll = MAX_POLL;
    let mut last_dump = 0u64;
    loop {
        if let Some(c) = conn.as_ref().filter(|c| c.dead.load(Ordering::Acquire)) {
            // Both halves: the agent must see the hang-up, or it keeps the rank attached and refuses it back.
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
            conn = None;
            sdk.link.connected.store(false, Ordering::Relaxed);
            // A refusal or a broken connection backs off like a failed connect.
            next_try = Instant::now() + backoff;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        let finishing = sdk.link.finishing();
        if conn.is_none() && (Instant::now() >= next_try || finishing) {
            match connect(sdk) {
                Ok(c) => {
                    conn = Some(c);
                    sdk.link.connected.store(true, Ordering::Relaxed);
                }
                Err(e) => {
                    sdk.link.note(e);
                    next_try = Instant::now() + backoff;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        let Some(c) = conn.as_mut() else {
            if finishing {
                let st = lock(&sdk.state);
                let undelivered = st.dropped + st.ready.len() as u64;
                drop(st);
                sdk.link.conclude(if undelivered == 0 {
                    Ok(())
                } else {
                    Err(Error::Undelivered {
                        dropped: undelivered,
                        agent: sdk.link.describe(&sdk.config.socket),
                    })
                });
                return;
            }
            std::thread::park_timeout(next_try.saturating_duration_since(Instant::now()));
            continue;
        };
        if !c.welcomed.load(Ordering::Acquire) {
            // Nothing goes before the agent accepts the hello, so a refusal loses no dump.
            std::thread::park_timeout(Duration::from_millis(5));
            continue;
        }
        let snap = lock(&sdk.state).ready.pop_front();
        let Some(mut snap) = snap else {
            if finishing {
                let (rounds_end, dropped) = {
                    let st = lock(&sdk.state);
                    (st.next_round, st.dropped)
                };
                let fin = RankMessage {
                    msg: Some(rank_message::Msg::Fin(RankFin { rounds_end, dropped })),
                };
                frame.clear();
                encode_frame(&fin, &mut frame);
                if c.stream.write_all(&frame).is_err() {
                    c.dead.store(true, Ordering::Release);
                    continue;
                }
                // The reader concludes on the agent's FINACK (or its hang-up).
                return;
            }
            std::thread::park_timeout(poll);
            continue;
        };
        // Poll at half the time between two dumps, within bounds.
        if last_dump > 0 && snap.dump_unix_ns > last_dump {
            let half = Duration::from_nanos((snap.dump_unix_ns - last_dump) / 2);
            poll = half.clamp(MIN_POLL, MAX_POLL);
        }
        last_dump = snap.dump_unix_ns;
        let dropped = lock(&sdk.state).dropped;
        frame.clear();
        encode_dump(sdk, &snap, dropped, &mut names, c, &mut frame);
        if frame.len() - 4 > canopy_wire::MAX_FRAME {
            // The agent would close the connection over it, and it would be sent again first every time.
            sdk.link.note(format!(
                "a dump of {} bytes is over the frame limit; dropped",
                frame.len()
            ));
            let mut st = lock(&sdk.state);
            st.dropped += 1;
            st.free.push(snap);
            continue;
        }
        match c.stream.write_all(&frame) {
            Ok(()) => {
                backoff = MIN_BACKOFF;
                sdk.link.delivered.fetch_add(1, Ordering::Relaxed);
                // A large trace's buffer is let go, so the queue does not keep the largest trace per slot.
                if snap.trace.capacity() > TRACE_KEPT {
                    snap.trace = Vec::new();
                }
                lock(&sdk.state).free.push(snap);
            }
            Err(e) => {
                sdk.link.note(format!("lost the connection: {e}"));
                c.dead.store(true, Ordering::Release);
                // Sent again, first, on the next connection.
                lock(&sdk.state).ready.push_front(snap);
            }
        }
    }
}

fn connect(sdk: &'static Sdk) -> Result<Conn, String> {
    let path = &sdk.config.socket;
    let stream = UnixStream::connect(path).map_err(|e| format!("cannot connect: {e}"))?;
    stream
        .set_write_timeout(Some(WRITE_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let next_round = {
        let st = lock(&sdk.state);
        st.ready.front().map_or(st.next_round, |s| s.round)
    };
    let hello = RankMessage {
        msg: Some(rank_message::Msg::Hello(RankHello {
            protocol_version: RANK_PROTOCOL_VERSION,
            app: sdk.config.app.clone(),
            rank: sdk.config.rank,
            nranks: sdk.config.nranks,
            pid: std::process::id(),
            next_round,
        })),
    };
    let mut frame = Vec::new();
    encode_frame(&hello, &mut frame);
    (&stream)
        .write_all(&frame)
        .map_err(|e| format!("hello not sent: {e}"))?;
    let dead = Arc::new(AtomicBool::new(false));
    let welcomed = Arc::new(AtomicBool::new(false));
    let reader = stream.try_clone().map_err(|e| e.to_string())?;
    let (reader_dead, reader_welcomed) = (dead.clone(), welcomed.clone());
    std::thread::Builder::new()
        .name("canopy-control".into())
        .spawn(move || read_control(sdk, reader, reader_dead, reader_welcomed))
        .map_err(|e| format!("no reader thread: {e}"))?;
    Ok(Conn {
        stream,
        dead,
        welcomed,
        sent: HashSet::new(),
        notices: 0,
    })
}

/// Reads what the agent sends: control (applied at the next dump), FINACK, or a refusal.
fn read_control(sdk: &'static Sdk, mut stream: UnixStream, dead: Arc<AtomicBool>, welcomed: Arc<AtomicBool>) {
    let mut buf = Vec::new();
    loop {
        match read_frame::<AgentMessage>(&mut stream, &mut buf) {
            Ok(AgentMessage {
                msg: Some(agent_message::Msg::Control(c)),
            }) => {
                sdk.set_control(c);
                welcomed.store(true, Ordering::Release);
                sdk.wake_shipper();
            }
            Ok(AgentMessage {
                msg: Some(agent_message::Msg::FinAck(_)),
            }) => {
                // Everything queued was delivered; dumps dropped earlier were not.
                let dropped = lock(&sdk.state).dropped;
                sdk.link.conclude(if dropped == 0 {
                    Ok(())
                } else {
                    Err(Error::Undelivered {
                        dropped,
                        agent: "the agent acknowledged the rest".into(),
                    })
                });
            }
            Ok(AgentMessage {
                msg: Some(agent_message::Msg::Refused(r)),
            }) => {
                sdk.link.note(format!("refused: {}", r.reason));
                break;
            }
            Ok(_) => {}
            Err(e) => {
                if !matches!(e, canopy_wire::FrameError::Closed) {
                    sdk.link.note(format!("bad message from the agent: {e}"));
                } else {
                    sdk.link.note("the agent closed the connection".into());
                }
                break;
            }
        }
    }
    dead.store(true, Ordering::Release);
    let _ = stream.shutdown(std::net::Shutdown::Both);
    if sdk.link.finishing() {
        let st = lock(&sdk.state);
        let undelivered = st.dropped + st.ready.len() as u64;
        drop(st);
        sdk.link.conclude(Err(Error::Undelivered {
            dropped: undelivered,
            agent: sdk.link.describe(&sdk.config.socket),
        }));
    }
    sdk.wake_shipper();
}

fn absence(kind: Kind) -> RankAbsence {
    match kind {
        Kind::Profile => RankAbsence::Unspecified,
        Kind::SampledOut => RankAbsence::SampledOut,
        Kind::Stopped => RankAbsence::Stopped,
    }
}

/// Encodes one dump as a frame: the profile under the options it was taken with, and the names this
/// connection has not carried yet.
fn encode_dump(
    sdk: &Sdk,
    snap: &Snapshot,
    dropped: u64,
    names: &mut Names,
    conn: &mut Conn,
    frame: &mut Vec<u8>,
) {
    let sent = &mut conn.sent;
    let mut dump = RankDump {
        round: snap.round,
        dump_unix_ns: snap.dump_unix_ns,
        absence: absence(snap.kind) as i32,
        dropped,
        ..Default::default()
    };
    if snap.kind == Kind::Profile {
        let metrics = snap.measure.metrics();
        let has = |bit: u32| metric::reports(metrics, bit);
        let mut profile = RankProfile {
            app: sdk.config.app.clone(),
            rank: sdk.config.rank,
            round: snap.round,
            dump_unix_ns: snap.dump_unix_ns,
            metrics,
            ..Default::default()
        };
        let us = |ns: u64| ns as f64 / 1000.0;
        profile.event_metrics.clone_from(&snap.event_metrics);
        let k = snap.event_metrics.len();
        for (n, (index, share, total)) in snap.timers.iter().enumerate() {
            let id = names.timer_id(*index);
            if !names.reports(&snap.measure, snap.measure_gen, id) {
                continue;
            }
            let mut e = EventSample {
                event_id: id,
                ..Default::default()
            };
            if has(metric::CALLS) {
                (e.calls, e.subrs, e.calls_total, e.subrs_total) =
                    (share.calls, share.subrs, total.calls, total.subrs);
            }
            if has(metric::INCLUSIVE) {
                (e.incl_us, e.incl_total_us) = (us(share.incl_ns), us(total.incl_ns));
            }
            if has(metric::EXCLUSIVE) {
                (e.excl_us, e.excl_total_us) = (us(share.excl_ns), us(total.excl_ns));
            }
            if k > 0 {
                let values = &snap.metric_values[2 * k * n..2 * k * (n + 1)];
                e.metrics = values[..k].to_vec();
                e.metrics_total = values[k..].to_vec();
            }
            profile.events.push(e);
        }
        if has(metric::COUNTERS) {
            for (index, value, total) in &snap.counters {
                let id = names.counter_id(*index);
                if names.reports(&snap.measure, snap.measure_gen, id) {
                    profile.counters.push(CounterSample {
                        counter_id: id,
                        value: *value,
                        total: *total,
                    });
                }
            }
        }
        for (thread, r) in &snap.trace {
            let kind = TraceKind::try_from(i32::from(r.kind)).unwrap_or_default();
            let mut e = TraceEvent {
                unix_ns: crate::trace::unix_ns(r),
                kind: kind as i32,
                thread: *thread,
                ..Default::default()
            };
            match kind {
                TraceKind::Begin | TraceKind::End => e.id = names.timer_id(r.a),
                TraceKind::Send => (e.peer, e.bytes) = (r.a, r.bytes),
                _ => {}
            }
            profile.trace.push(e);
        }
        profile.trace_lost = snap.trace_lost;
        profile.marks = snap
            .marks
            .iter()
            .map(|m| StepMark {
                key_id: m.key_id,
                step: m.step,
                stop: m.stop,
                unix_ns: m.unix_ns,
            })
            .collect();
        profile.marks_lost = snap.marks_lost;
        if snap.has_utilization {
            profile.utilization = Some(snap.utilization.clone());
        }
        let fresh: Vec<u64> = profile
            .events
            .iter()
            .map(|e| e.event_id)
            .chain(profile.counters.iter().map(|c| c.counter_id))
            .chain(profile.trace.iter().filter(|t| t.id != 0).map(|t| t.id))
            .chain(profile.marks.iter().map(|m| m.key_id))
            .filter(|id| !sent.contains(id))
            .collect();
        for id in fresh {
            // Marks repeat their keys' ids.
            if sent.contains(&id) {
                continue;
            }
            if !names.by_id.contains_key(&id) {
                names.refresh();
            }
            if let Some(name) = names.by_id.get(&id) {
                dump.names.push(EventName {
                    id,
                    name: name.clone(),
                });
                sent.insert(id);
            }
        }
        dump.profile = profile.encode_to_vec();
    }
    if crate::perf::unavailable_count() > conn.notices {
        let all = crate::perf::unavailable();
        for (name, reason) in all.iter().skip(conn.notices) {
            dump.notices
                .push(format!("counter {name:?} is unavailable ({reason})"));
        }
        conn.notices = all.len();
    }
    let msg = RankMessage {
        msg: Some(rank_message::Msg::Dump(dump)),
    };
    encode_frame(&msg, frame);
}
