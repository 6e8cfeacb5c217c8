//! The writer thread: SQLite calls block, so the root hands what it records to this thread through a bounded
//! queue, in order, and goes on. Everything it takes is plain data; the payload of a round is any byte buffer
//! the caller wants back once the round is committed (to pass it on to live subscribers without a copy).

use std::thread;
use tokio::time::Instant;

use canopy_proto::v1::{NodeEvent, StreamSpec};
use tokio::sync::{mpsc, oneshot};

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
    Flush(oneshot::Sender<RunSummary>),
}

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
        let (tx, rx) = mpsc::channel(queue.max(1));
        let thread = thread::Builder::new()
            .name("canopy-store".into())
            .spawn(move || run(store, rx, committed))
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

fn run<P: AsRef<[u8]>>(mut store: Store, mut rx: mpsc::Receiver<Op<P>>, mut committed: impl FnMut(P)) {
    let mut summary = RunSummary::default();
    let mut partial = PartialLog::new(PARTIAL_LOG_INTERVAL);
    while let Some(op) = rx.blocking_recv() {
        let res = match op {
            Op::Round(r) => store_round(&mut store, &mut summary, &mut partial, r, &mut committed),
            Op::Names(names) => store.put_names(&names).map(|collisions| {
                for c in collisions {
                    tracing::error!(id = format!("{:#018x}", c.id), existing = %c.existing, new = %c.new,
                        "event name hash collision: both names share one id");
                }
            }),
            Op::Node(ev) => store.put_node(&ev),
            Op::Stream {
                spec,
                state,
                failure,
                result_type,
            } => store.put_stream(&spec, state, failure.as_deref(), result_type.as_deref()),
            Op::Meta(k, v) => store.set_meta(&k, &v),
            Op::Flush(done) => {
                if let Some(line) = partial.flush() {
                    tracing::info!("{line}");
                }
                let _ = done.send(summary);
                Ok(())
            }
        };
        if let Err(e) = res {
            summary.store_errors += 1;
            tracing::error!("store write failed: {e}");
        }
    }
}

fn store_round<P: AsRef<[u8]>>(
    store: &mut Store,
    summary: &mut RunSummary,
    partial: &mut PartialLog,
    r: Round<P>,
    committed: &mut impl FnMut(P),
) -> Result<(), StoreError> {
    let Round {
        mut record,
        phase,
        late,
        result_type,
        payload,
    } = r;
    let bytes = payload.as_ref();
    let stored = if result_type == PROFILE_BATCH_TYPE {
        Payload::Profiles(bytes)
    } else {
        Payload::Blob {
            phase,
            payload: bytes,
        }
    };
    // The result's rows go in the round's own transaction: one commit per round.
    let rows = is_tabulated(&result_type).then_some(Rows {
        result_type: &result_type,
        payload: bytes,
    });
    let res = if late {
        summary.late_packets += 1;
        store.write_late(
            record.stream_id,
            record.round,
            record.covered,
            bytes.len() as u64,
            stored,
            rows,
        )
    } else {
        if record.closed_unix_ns == 0 {
            record.closed_unix_ns = sql::unsigned(now_unix_ns());
        }
        store.write_round_with(&record, stored, rows)
    };
    res?;
    if !late {
        summary.rounds += 1;
        summary.result_bytes += bytes.len() as u64;
        if record.covered == record.expected {
            summary.full_rounds += 1;
        }
        if let Some(line) = partial.record(Instant::now(), &record) {
            tracing::info!("{line}");
        }
    }
    // Subscribers see a result once it is committed: one that reads the store and then follows the live
    // results misses nothing in between.
    committed(payload);
    Ok(())
}
