//! The writer thread: SQLite calls block, so the root hands what it records to this thread through a bounded
//! queue, in order, and goes on. Everything it takes is plain data; the payload of a round is any byte buffer
//! the caller wants back once the round is committed (to pass it on to live subscribers without a copy).

use std::collections::VecDeque;
use std::thread;
use std::time::Duration;
use tokio::time::Instant;

use canopy_proto::v1::{MissingReason, NodeEvent, StreamSpec};
use tokio::sync::{mpsc, oneshot};

use crate::gap::GapRun;
use crate::partial_log::{PARTIAL_LOG_INTERVAL, PartialLog};
use crate::profiles::PROFILE_BATCH_TYPE;
use crate::rounds::RoundRecord;
use crate::sql::now_unix_ns;
use crate::store::{Payload, Rows, Store};
use crate::tables::is_tabulated;
use crate::words::StreamState;
use crate::{StoreError, sql};

/// What the writer has stored, for the front-end's summary and for tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RunSummary {
    pub rounds: u64,
    pub full_rounds: u64,
    pub late_packets: u64,
    pub result_bytes: u64,
    pub store_errors: u64,
    /// Rounds whose results were let go because the store could not write them in time (their rows count their
    /// ranks as `store_failed`).
    pub store_failed_rounds: u64,
    /// Operations waiting for the store to write again.
    pub backlog: u64,
}

/// One finalized result of the root.
#[derive(Debug, Clone)]
pub struct Round<P> {
    /// For a late packet, `covered` is the ranks it brings. `closed_unix_ns` 0 is stamped with the time the
    /// writer takes the round.
    pub record: RoundRecord,
    pub phase: u32,
    pub late: bool,
    /// The stream's result type: how the payload is stored (profiles, tables, a blob).
    pub result_type: String,
    pub payload: P,
}

enum Op<P> {
    Round(Round<P>),
    Names(Vec<(u64, String)>),
    Node(NodeEvent),
    Stream {
        spec: StreamSpec,
        state: StreamState,
        failure: Option<String>,
        result_type: Option<String>,
    },
    Meta(String, String),
    /// A round counted a source's ranks late or unreachable though it finished before the round.
    Recount {
        stream_id: u32,
        round: u64,
        counted: MissingReason,
        ranks: u32,
        source: String,
        apps: Vec<(String, u32)>,
    },
    /// Rounds whose results were let go: their rows only.
    Gap(GapRun),
    Flush(oneshot::Sender<RunSummary>),
}

/// How long the writer waits between two tries of a store that failed.
const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// The most gap runs kept: past it, a round joins its stream's last run whatever its coverage (counted as that
/// run's first round's).
const MAX_GAP_RUNS: usize = 1 << 16;

/// The most operations kept for retry: past it, operations other than rounds are lost (and logged).
const MAX_BACKLOG_OPS: usize = 1 << 20;

/// The bytes kept for retry by default ([`Writer::spawn_with`] sets another).
const DEFAULT_RETRY_BYTES: usize = 64 << 20;

/// The way to the writer thread; cloned by whoever records. The thread ends once every clone is dropped and
/// the queue is empty.
pub struct Writer<P> {
    tx: mpsc::Sender<Op<P>>,
}

impl<P> Clone for Writer<P> {
    fn clone(&self) -> Self {
        Writer { tx: self.tx.clone() }
    }
}

impl<P> std::fmt::Debug for Writer<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

/// The writer thread, to wait for once its queue is closed.
#[derive(Debug)]
pub struct WriterThread(thread::JoinHandle<()>);

impl WriterThread {
    /// Waits until the writer has stored everything queued and closed the store (blocking).
    pub fn join(self) {
        let _ = self.0.join();
    }
}

impl<P: AsRef<[u8]> + Send + 'static> Writer<P> {
    /// Starts the thread that owns `store`, with a queue of `queue` operations. `committed` is called on that
    /// thread with each round's payload once the round is committed, so a reader of the store that then
    /// follows what `committed` passes on misses nothing in between.
    pub fn spawn(
        store: Store,
        queue: usize,
        committed: impl FnMut(P) + Send + 'static,
    ) -> Result<(Writer<P>, WriterThread), StoreError> {
        Self::spawn_with(store, queue, DEFAULT_RETRY_BYTES, committed)
    }

    /// As [`Writer::spawn`], keeping at most `retry_bytes` of results for retry while the store fails (a full
    /// disk): past it the oldest rounds keep their coverage only, and their rows count their ranks as
    /// `store_failed`.
    pub fn spawn_with(
        store: Store,
        queue: usize,
        retry_bytes: usize,
        committed: impl FnMut(P) + Send + 'static,
    ) -> Result<(Writer<P>, WriterThread), StoreError> {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let thread = thread::Builder::new()
            .name("canopy-store".into())
            .spawn(move || {
                let writer = WriterLoop {
                    store,
                    summary: RunSummary::default(),
                    partial: PartialLog::new(PARTIAL_LOG_INTERVAL),
                    backlog: Backlog::new(retry_bytes),
                    failures: FailureLog::default(),
                    committed,
                };
                writer.run(rx)
            })
            .map_err(|source| StoreError::Thread {
                what: "writer",
                source,
            })?;
        Ok((Writer { tx }, WriterThread(thread)))
    }

    /// Queues one finalized result.
    pub async fn round(&self, round: Round<P>) {
        self.send(Op::Round(round)).await;
    }

    /// Queues event and counter names (id, name).
    pub async fn names(&self, names: Vec<(u64, String)>) {
        self.send(Op::Names(names)).await;
    }

    /// Queues a node's change of state.
    pub async fn node(&self, event: NodeEvent) {
        self.send(Op::Node(event)).await;
    }

    /// Queues the recount of a round that counted a source's ranks `counted` (late or unreachable) though the
    /// source finished before the round: they count as stopped there, and in its applications' rows by `apps`.
    pub async fn recount_stopped(
        &self,
        stream_id: u32,
        round: u64,
        counted: MissingReason,
        ranks: u32,
        source: String,
        apps: Vec<(String, u32)>,
    ) {
        self.send(Op::Recount {
            stream_id,
            round,
            counted,
            ranks,
            source,
            apps,
        })
        .await;
    }

    /// Queues a stream's change of state, with its result type once known.
    pub async fn stream(
        &self,
        spec: StreamSpec,
        state: StreamState,
        failure: Option<String>,
        result_type: Option<String>,
    ) {
        self.send(Op::Stream {
            spec,
            state,
            failure,
            result_type,
        })
        .await;
    }

    /// Queues a `meta` fact.
    pub async fn meta(&self, key: impl Into<String>, value: impl Into<String>) {
        self.send(Op::Meta(key.into(), value.into())).await;
    }

    /// Waits until everything queued before is stored; returns what the writer has stored so far (`None` if
    /// the thread has ended).
    pub async fn flush(&self) -> Option<RunSummary> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Op::Flush(tx)).await.ok()?;
        rx.await.ok()
    }

    async fn send(&self, op: Op<P>) {
        // The thread ends only when every sender is gone: a failure here cannot happen while self lives.
        let _ = self.tx.send(op).await;
    }
}

/// The writer thread's state: the store, what it has written, and what waits for the store to write again.
struct WriterLoop<P, C> {
    store: Store,
    summary: RunSummary,
    partial: PartialLog,
    backlog: Backlog<P>,
    failures: FailureLog,
    committed: C,
}

impl<P: AsRef<[u8]>, C: FnMut(P)> WriterLoop<P, C> {
    fn run(mut self, mut rx: mpsc::Receiver<Op<P>>) {
        // A clock for the retries' time-outs; the queue itself needs none.
        let clock = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .ok();
        let mut next_retry = Instant::now();
        loop {
            let op = match (&clock, self.backlog.is_empty()) {
                (Some(clock), false) => {
                    let wait = next_retry.saturating_duration_since(Instant::now());
                    match clock.block_on(async { tokio::time::timeout(wait, rx.recv()).await }) {
                        Ok(op) => op,
                        Err(_) => {
                            next_retry = self.retry();
                            continue;
                        }
                    }
                }
                _ => rx.blocking_recv(),
            };
            let Some(op) = op else { break };
            match op {
                Op::Flush(done) => {
                    if let Some(line) = self.partial.flush() {
                        tracing::info!("{line}");
                    }
                    let _ = done.send(self.summary());
                }
                // In order: nothing is written past what waits.
                op if !self.backlog.is_empty() => {
                    self.keep(op);
                    if Instant::now() >= next_retry {
                        next_retry = self.retry();
                    }
                }
                op => match self.apply(&op) {
                    Ok(()) => self.done(op),
                    Err(e) if e.is_retryable() => {
                        self.failures.failed(&e);
                        self.keep(op);
                        next_retry = Instant::now() + RETRY_INTERVAL;
                    }
                    Err(e) => {
                        self.summary.store_errors += 1;
                        tracing::error!("store write failed: {e}");
                    }
                },
            }
        }
        // The queue closed: a last try for what waits, then what could not be written is said.
        if !self.backlog.is_empty() {
            self.retry();
        }
        if !self.backlog.is_empty() {
            tracing::error!(
                operations = self.backlog.ops.len(),
                rounds = self.backlog.rounds(),
                "the store still fails as the run ends: its last rounds are not in the store"
            );
        }
        if let Some(line) = self.partial.flush() {
            tracing::info!("{line}");
        }
    }

    fn summary(&self) -> RunSummary {
        RunSummary {
            backlog: self.backlog.ops.len() as u64,
            store_failed_rounds: self.backlog.gap_rounds,
            ..self.summary
        }
    }

    /// Keeps `op` for retry, within the backlog's bounds.
    fn keep(&mut self, op: Op<P>) {
        if let Some(lost) = self.backlog.push(op) {
            self.summary.store_errors += 1;
            tracing::error!("the store's backlog is full: {lost} is lost");
        }
    }

    /// Writes what waits, oldest first, until the store fails again; returns when to try next.
    fn retry(&mut self) -> Instant {
        while let Some(op) = self.backlog.ops.pop_front() {
            self.backlog.bytes -= weight(&op);
            match self.apply(&op) {
                Ok(()) => self.done(op),
                Err(e) if e.is_retryable() => {
                    self.failures.failed(&e);
                    self.backlog.bytes += weight(&op);
                    self.backlog.ops.push_front(op);
                    return Instant::now() + RETRY_INTERVAL;
                }
                Err(e) => {
                    self.summary.store_errors += 1;
                    tracing::error!("store write failed: {e}");
                }
            }
        }
        self.backlog.stripped = 0;
        self.backlog.gap_runs = 0;
        self.failures.recovered();
        Instant::now()
    }

    /// Writes one operation (a flush has nothing to write).
    fn apply(&mut self, op: &Op<P>) -> Result<(), StoreError> {
        let store = &mut self.store;
        match op {
            Op::Round(r) => write_round(store, r),
            Op::Names(names) => store.put_names(names).map(|collisions| {
                for c in collisions {
                    tracing::error!(id = format!("{:#018x}", c.id), existing = %c.existing, new = %c.new,
                        "event name hash collision: both names share one id");
                }
            }),
            Op::Node(ev) => store.put_node(ev),
            Op::Stream {
                spec,
                state,
                failure,
                result_type,
            } => store.put_stream(spec, *state, failure.as_deref(), result_type.as_deref()),
            Op::Meta(k, v) => store.set_meta(k, v),
            Op::Recount {
                stream_id,
                round,
                counted,
                ranks,
                source,
                apps,
            } => store.recount_stopped(*stream_id, *round, *counted, *ranks, source, apps),
            Op::Gap(run) => store.write_gap(run),
            Op::Flush(_) => Ok(()),
        }
    }

    /// What follows a written operation: the summary, and a round's payload to the subscribers.
    fn done(&mut self, op: Op<P>) {
        match op {
            Op::Round(r) if r.late => {
                self.summary.late_packets += 1;
                (self.committed)(r.payload);
            }
            Op::Round(r) => {
                self.summary.rounds += 1;
                self.summary.result_bytes += r.payload.as_ref().len() as u64;
                if r.record.covered == r.record.expected {
                    self.summary.full_rounds += 1;
                }
                if let Some(line) = self.partial.record(Instant::now(), &r.record) {
                    tracing::info!("{line}");
                }
                // Subscribers see a result once it is committed: one that reads the store and then follows the
                // live results misses nothing in between.
                (self.committed)(r.payload);
            }
            Op::Gap(run) => {
                self.summary.rounds += run.rounds();
                tracing::warn!(
                    stream = %run.first.stream_name,
                    from = run.first.round,
                    to = run.last,
                    "rounds whose results the store could not keep are stored with their ranks as store_failed"
                );
            }
            _ => {}
        }
    }
}

fn write_round<P: AsRef<[u8]>>(store: &mut Store, r: &Round<P>) -> Result<(), StoreError> {
    let bytes = r.payload.as_ref();
    let stored = if r.result_type == PROFILE_BATCH_TYPE {
        Payload::Profiles(bytes)
    } else {
        Payload::Blob {
            phase: r.phase,
            payload: bytes,
        }
    };
    // The result's rows go in the round's own transaction: one commit per round.
    let rows = is_tabulated(&r.result_type).then_some(Rows {
        result_type: &r.result_type,
        payload: bytes,
    });
    if r.late {
        let rec = &r.record;
        return store.write_late(
            rec.stream_id,
            rec.round,
            rec.covered,
            bytes.len() as u64,
            stored,
            rows,
        );
    }
    if r.record.closed_unix_ns == 0 {
        let record = RoundRecord {
            closed_unix_ns: sql::unsigned(now_unix_ns()),
            ..r.record.clone()
        };
        return store.write_round_with(&record, stored, rows);
    }
    store.write_round_with(&r.record, stored, rows)
}

/// What an operation costs to keep beside its own bytes.
const BASE_WEIGHT: usize = 256;

/// How far back a round's stream's gap run is looked for.
const GAP_SEARCH: usize = 64;

/// The bytes an operation holds while it waits.
fn weight<P: AsRef<[u8]>>(op: &Op<P>) -> usize {
    BASE_WEIGHT
        + match op {
            Op::Round(r) => r.payload.as_ref().len() + r.result_type.len(),
            Op::Names(names) => names.iter().map(|(_, n)| n.len() + 8).sum(),
            Op::Meta(k, v) => k.len() + v.len(),
            Op::Recount { source, apps, .. } => {
                source.len() + apps.iter().map(|(a, _)| a.len() + 4).sum::<usize>()
            }
            _ => 0,
        }
}

/// What waits for the store to write again, in order, within `limit` bytes: past it the oldest rounds let go of
/// their results and keep their coverage ([`GapRun`]).
struct Backlog<P> {
    ops: VecDeque<Op<P>>,
    bytes: usize,
    limit: usize,
    /// Every operation before this index holds no result.
    stripped: usize,
    gap_runs: usize,
    /// Rounds let go since the start.
    gap_rounds: u64,
}

impl<P: AsRef<[u8]>> Backlog<P> {
    fn new(limit: usize) -> Self {
        Backlog {
            ops: VecDeque::new(),
            bytes: 0,
            limit,
            stripped: 0,
            gap_runs: 0,
            gap_rounds: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Rounds waiting, with or without their results.
    fn rounds(&self) -> u64 {
        self.ops
            .iter()
            .map(|op| match op {
                Op::Round(r) if !r.late => 1,
                Op::Gap(run) => run.rounds(),
                _ => 0,
            })
            .sum()
    }

    /// Keeps `op`; returns what was lost instead, if the backlog holds all it may.
    fn push(&mut self, op: Op<P>) -> Option<&'static str> {
        if self.ops.len() >= MAX_BACKLOG_OPS && !matches!(op, Op::Round(_)) {
            return Some(match op {
                Op::Names(_) => "a batch of event names",
                Op::Node(_) => "a node's change of state",
                Op::Stream { .. } => "a stream's change of state",
                Op::Recount { .. } => "the recount of a finished source's ranks",
                _ => "a meta fact",
            });
        }
        self.bytes += weight(&op);
        self.ops.push_back(op);
        while self.bytes > self.limit && self.strip_oldest() {}
        None
    }

    /// Lets go of the oldest result still held: a round keeps its coverage, joining its stream's gap run when it
    /// follows it; a late packet (its ranks already counted late in its round) is let go whole. Returns whether
    /// there was one.
    fn strip_oldest(&mut self) -> bool {
        let Some(at) = (self.stripped..self.ops.len()).find(|&i| matches!(self.ops[i], Op::Round(_))) else {
            self.stripped = self.ops.len();
            return false;
        };
        let Some(Op::Round(round)) = self.ops.remove(at) else {
            return false;
        };
        self.bytes = self
            .bytes
            .saturating_sub(BASE_WEIGHT + round.payload.as_ref().len() + round.result_type.len());
        self.stripped = at;
        if round.late {
            return true;
        }
        self.gap_rounds += 1;
        let run = GapRun::of(round.record);
        let forced = self.gap_runs >= MAX_GAP_RUNS;
        // The stream's latest run is among the last few operations before (each stream has one open run).
        let previous = (at.saturating_sub(GAP_SEARCH)..at)
            .rev()
            .find(|&i| matches!(&self.ops[i], Op::Gap(g) if g.first.stream_id == run.first.stream_id));
        let run = match previous.map(|i| &mut self.ops[i]) {
            Some(Op::Gap(prev)) => match prev.extend(run, forced) {
                Ok(()) => return true,
                Err(run) => run,
            },
            _ => run,
        };
        let op = Op::Gap(run);
        self.bytes += weight(&op);
        self.ops.insert(at, op);
        self.gap_runs += 1;
        self.stripped = at + 1;
        true
    }
}

/// Failed writes, logged at most once a second with the count since the last line, and the recovery once.
#[derive(Default)]
struct FailureLog {
    last: Option<Instant>,
    held: u64,
    failing: bool,
}

impl FailureLog {
    fn failed(&mut self, e: &StoreError) {
        self.failing = true;
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1))
        {
            self.held += 1;
            return;
        }
        let held = std::mem::take(&mut self.held);
        self.last = Some(now);
        tracing::error!(
            failed_since_last_line = held,
            "store write failed, kept for retry: {e}"
        );
    }

    fn recovered(&mut self) {
        if std::mem::take(&mut self.failing) {
            tracing::warn!(
                failed_since_last_line = std::mem::take(&mut self.held),
                "the store writes again: what waited is written"
            );
            self.last = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::v1::MissingReason;

    fn round(stream_id: u32, round: u64, bytes: usize) -> Op<Vec<u8>> {
        Op::Round(Round {
            record: RoundRecord {
                stream_id,
                stream_name: format!("s{stream_id}"),
                round,
                covered: 4,
                expected: 4,
                ..Default::default()
            },
            phase: 0,
            late: false,
            result_type: "x".into(),
            payload: vec![0; bytes],
        })
    }

    #[test]
    fn past_its_bound_the_backlog_keeps_the_coverage_of_its_oldest_rounds_as_one_run_per_stream() {
        // Room for about ten rounds of 1 KiB.
        let mut b = Backlog::new(10 * (1024 + BASE_WEIGHT + 1));
        b.push(Op::Meta("k".into(), "v".into()));
        for r in 0..100 {
            assert_eq!(b.push(round(1, r, 1024)), None);
            assert_eq!(b.push(round(2, r, 1024)), None);
            assert!(b.bytes <= b.limit, "{} > {}", b.bytes, b.limit);
        }
        assert_eq!(b.rounds(), 200, "every round waits, with or without its result");
        let gaps: Vec<&GapRun> = b
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Gap(g) => Some(g),
                _ => None,
            })
            .collect();
        assert_eq!(gaps.len(), 2, "one run per stream");
        for g in &gaps {
            assert_eq!(g.first.round, 0);
            assert_eq!(g.first.missing, vec![(MissingReason::StoreFailed, 4)]);
        }
        let let_go: u64 = gaps.iter().map(|g| g.rounds()).sum();
        assert_eq!(let_go, b.gap_rounds);
        // The rounds kept whole are the newest, in order after the runs.
        let kept: Vec<(u32, u64)> = b
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Round(r) => Some((r.record.stream_id, r.record.round)),
                _ => None,
            })
            .collect();
        assert_eq!(kept.len() as u64 + let_go, 200);
        assert_eq!(kept.last(), Some(&(2, 99)));
        assert!(
            matches!(b.ops[0], Op::Meta(..)),
            "what holds no result stays in its place"
        );
    }
}
