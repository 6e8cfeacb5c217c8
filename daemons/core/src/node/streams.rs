//! The streams a node runs: each one's spec, its filter on this node, the ranks it is fed by (parsed once, at
//! open), and the time spent in its filter.
//!
//! A stream's filter runs one call at a time: the node queues a call with what to do with its answer ([`Then`]),
//! the call runs where the stream's filter runs (inline on the node's task, or contained on a thread of its own:
//! `runner`), and the answer comes back to the node's loop as a [`Done`] input, which starts the stream's next
//! call. A contained call that runs past the filter-call time-out fails its stream (the watchdog,
//! [`StreamTable::stuck`]); its thread cannot be stopped and is abandoned, and a node with
//! [`MAX_STUCK_PER_FILTER`] such threads of one filter opens no new stream of it.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use canopy_proto::v1::{Coverage, FilterTime, StreamSpec, SyncMode};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::feed::Feed;
pub(crate) use super::runner::{Answer, Call};
use super::runner::{InlineWatch, Runner};
use crate::engine::{GroupKey, StreamSync};
use crate::filter::{FilterFactory, Level};

/// How far past a filter call's time-out the watchdog may look before it concludes that the node itself did not
/// run (a stopped process, a starved one) rather than that the call is stuck.
const NODE_PAUSE: Duration = Duration::from_secs(1);

pub use canopy_runtime::common::DEFAULT_FILTER_CALL_TIMEOUT;

/// Calls that may wait for a stream's filter; one more fails the stream (its filter does not keep up). As many as
/// the node's input queue holds, so a burst the node took in (a don't-wait stream's pieces, one call each) fits.
pub const FILTER_QUEUE: usize = 4096;

/// Stuck calls of one filter a node tolerates (their threads abandoned) before it refuses new streams of it.
pub const MAX_STUCK_PER_FILTER: usize = 4;

/// What the node does with a call's answer: the state of the packet or round it was made for.
pub(crate) enum Then {
    /// A closed group's upstream: its coverage, with the source and coverage of each input (for rejections).
    Closed {
        key: GroupKey,
        coverage: Coverage,
        first_dump: u64,
        inputs: Vec<(String, Coverage)>,
    },
    /// A packet from the parent.
    Down {
        round: u64,
    },
    /// At the root: a packet sent up, finalized into a result.
    Finalize {
        round: u64,
        phase: u32,
        coverage: Option<Coverage>,
        first_dump: u64,
        late: bool,
    },
    /// At the leaf: a late rank's profile made into the packet the stream sends up.
    LateLeaf {
        key: GroupKey,
        coverage: Coverage,
        first_dump: u64,
    },
    Nothing,
}

/// A call's answer, back on the node's loop.
pub struct Done {
    stream: u32,
    generation: u64,
    then: Then,
    answer: Answer,
    micros: u64,
}

/// Where a stream's calls run, one at a time, in order.
struct Worker {
    generation: u64,
    filter: String,
    runner: Runner,
    /// The call running (or answered, its answer not yet handled) and when it started.
    busy: Option<(&'static str, Instant)>,
    queue: VecDeque<(Call, Then)>,
}

impl Worker {
    fn pending(&self) -> bool {
        self.busy.is_some() || !self.queue.is_empty()
    }
}

/// One stream on this node.
struct Stream {
    spec: StreamSpec,
    /// `None` once the stream failed here (or if it could not be created).
    worker: Option<Worker>,
    phases: u32,
    /// The failure was reported.
    failed: bool,
    /// The ranks that feed it, round by round (a detail stream names some; the rest count as sampled out).
    ranks: Feed,
}

/// What became of a call the node queued.
pub(crate) enum Queued {
    Yes,
    /// The stream is not live here.
    NotLive,
    /// Its filter does not keep up: the stream fails, for this reason.
    Full(String),
}

/// What a packet's stream is to this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Known {
    Live,
    /// Failed here: its packets are dropped quietly.
    Failed,
    /// Closed here: packets still in flight are dropped quietly.
    Closed,
    /// Never opened here: a packet for it is malformed.
    Unknown,
}

/// The streams of one node.
pub(crate) struct StreamTable {
    factory: Arc<dyn FilterFactory>,
    level: Level,
    streams: BTreeMap<u32, Stream>,
    closed: HashSet<u32>,
    /// Closed streams whose filter still has calls to answer (their last rounds), by id.
    closing: HashMap<u32, (StreamSpec, Worker)>,
    /// Calls into each stream's filter and the time they took (microseconds).
    time: BTreeMap<u32, (u64, u64)>,
    done: mpsc::UnboundedSender<Done>,
    next_generation: u64,
    call_timeout: Duration,
    /// Calls stuck past the time-out whose threads were abandoned, per filter (a thread whose call returns after
    /// all takes itself off).
    stuck: HashMap<String, Arc<AtomicUsize>>,
    /// The filters this node runs inline, on its own task; every other one is contained on a thread per stream.
    inline: HashSet<String>,
    /// Watches the inline calls (started with the first inline stream).
    watch: Option<Arc<InlineWatch>>,
}

impl StreamTable {
    pub(crate) fn new(
        factory: Arc<dyn FilterFactory>,
        level: Level,
    ) -> (Self, mpsc::UnboundedReceiver<Done>) {
        let (done, rx) = mpsc::unbounded_channel();
        let table = Self {
            factory,
            level,
            streams: BTreeMap::new(),
            closed: HashSet::new(),
            closing: HashMap::new(),
            time: BTreeMap::new(),
            done,
            next_generation: 0,
            call_timeout: DEFAULT_FILTER_CALL_TIMEOUT,
            stuck: HashMap::new(),
            inline: HashSet::new(),
            watch: None,
        };
        (table, rx)
    }

    pub(crate) fn set_call_timeout(&mut self, timeout: Duration) {
        self.call_timeout = timeout;
        if let Some(w) = &self.watch {
            w.set_timeout(timeout);
        }
    }

    /// The filters to run inline from now on (streams already open keep where they run).
    pub(crate) fn set_inline(&mut self, filters: impl IntoIterator<Item = String>) {
        self.inline = filters.into_iter().collect();
    }

    /// Where a new stream of `filter` runs.
    fn runner(
        &mut self,
        id: u32,
        filter_name: &str,
        filter: Box<dyn crate::filter::FilterInstance>,
    ) -> Result<Runner, String> {
        if self.inline.contains(filter_name) {
            let timeout = self.call_timeout;
            let watch = self.watch.get_or_insert_with(|| InlineWatch::start(timeout));
            return Ok(Runner::inline(filter, watch.clone()));
        }
        let stuck = self.stuck.entry(filter_name.to_string()).or_default().clone();
        Runner::contained(id, filter_name, filter, stuck)
    }

    /// Opens a stream: creates its filter, parses its ranks and tells it the names known so far. On an error the
    /// stream is kept as failed (so its packets are dropped quietly) and the reason is returned.
    pub(crate) fn open(
        &mut self,
        spec: StreamSpec,
        names: &HashMap<u64, String>,
    ) -> Result<StreamSync, String> {
        let id = spec.stream_id;
        let stuck = self
            .stuck
            .get(&spec.filter)
            .map_or(0, |n| n.load(Ordering::Relaxed));
        let created = if stuck >= MAX_STUCK_PER_FILTER {
            Err(format!(
                "filter {}: {stuck} of its calls are stuck on this node (their threads abandoned): no new stream of it",
                spec.filter
            ))
        } else {
            self.factory
                .create(&spec.filter, &spec.params, self.level)
                .map_err(|e| e.to_string())
        };
        let created = created
            .and_then(|filter| {
                let ranks = Feed::of(&spec)?;
                Ok((filter, ranks))
            })
            .and_then(|(filter, ranks)| {
                let StreamSync { mode, timeout } = sync_of(&spec);
                if mode == SyncMode::DontWait && filter.phases() > 1 {
                    // Its later phases need every packet of the round's first phase merged first.
                    return Err(format!(
                        "filter {} has {} phases and runs only in wait_for_all streams",
                        spec.filter,
                        filter.phases()
                    ));
                }
                Ok((filter, ranks, StreamSync { mode, timeout }))
            });
        match created {
            Ok((filter, ranks, sync)) => {
                self.next_generation += 1;
                let phases = filter.phases();
                let filter_name = spec.filter.clone();
                let runner = match self.runner(id, &filter_name, filter) {
                    Ok(runner) => runner,
                    Err(reason) => {
                        let failed = Stream {
                            spec,
                            worker: None,
                            phases,
                            failed: false,
                            ranks: Feed::default(),
                        };
                        self.streams.insert(id, failed);
                        return Err(reason);
                    }
                };
                self.streams.insert(
                    id,
                    Stream {
                        spec,
                        worker: Some(Worker {
                            generation: self.next_generation,
                            filter: filter_name,
                            runner,
                            busy: None,
                            queue: VecDeque::new(),
                        }),
                        phases,
                        failed: false,
                        ranks,
                    },
                );
                // A filter that classifies by name needs the names before the first round.
                if !names.is_empty() {
                    let pairs: Vec<(u64, String)> = names.iter().map(|(id, n)| (*id, n.clone())).collect();
                    self.submit(id, Call::Names(pairs), Then::Nothing);
                }
                Ok(sync)
            }
            Err(reason) => {
                self.streams.insert(
                    id,
                    Stream {
                        spec,
                        worker: None,
                        phases: 1,
                        failed: false,
                        ranks: Feed::default(),
                    },
                );
                Err(reason)
            }
        }
    }

    pub(crate) fn known(&self, id: u32) -> Known {
        match self.streams.get(&id) {
            Some(s) if s.worker.is_some() => Known::Live,
            Some(_) => Known::Failed,
            None if self.closed.contains(&id) => Known::Closed,
            None => Known::Unknown,
        }
    }

    /// The spec of a stream that is live here.
    pub(crate) fn live_spec(&self, id: u32) -> Option<&StreamSpec> {
        self.streams
            .get(&id)
            .filter(|s| s.worker.is_some())
            .map(|s| &s.spec)
    }

    pub(crate) fn spec(&self, id: u32) -> Option<&StreamSpec> {
        self.streams.get(&id).map(|s| &s.spec)
    }

    /// A stream's time-out changed (an adopter is a level higher than the lost parent, so it gives its children
    /// a longer one): the stream goes on, with its filter and its rounds in flight.
    /// New rank stages for a stream (its spec otherwise the same); the error says why they are refused.
    pub(crate) fn restage(&mut self, id: u32, spec: &StreamSpec) -> Result<(), String> {
        let Some(s) = self.streams.get_mut(&id) else {
            return Err(format!("stream {id} is not open here"));
        };
        s.ranks.restage(spec)?;
        s.spec.stages = spec.stages.clone();
        Ok(())
    }

    /// The root set the first round of a stream opened while ranks dumped.
    pub(crate) fn set_first_round(&mut self, id: u32, first_round: u64) {
        if let Some(s) = self.streams.get_mut(&id) {
            s.spec.first_round = Some(first_round);
            s.ranks.first_round = Some(first_round);
        }
    }

    pub(crate) fn set_timeout(&mut self, id: u32, timeout_ms: u32) {
        if let Some(s) = self.streams.get_mut(&id) {
            s.spec.timeout_ms = timeout_ms;
        }
    }

    /// A stream that ended before this node began (an earlier run of this root had it): its packets still on
    /// their way are expected, not malformed.
    pub(crate) fn ended_before(&mut self, id: u32) {
        if !self.streams.contains_key(&id) {
            self.closed.insert(id);
        }
    }

    /// Every stream this node runs or keeps as failed, in id order.
    pub(crate) fn ids(&self) -> Vec<u32> {
        self.streams.keys().copied().collect()
    }

    /// The live streams' specs, in id order.
    pub(crate) fn live_specs(&self) -> impl Iterator<Item = &StreamSpec> {
        self.streams
            .values()
            .filter(|s| s.worker.is_some())
            .map(|s| &s.spec)
    }

    /// The live streams and the ranks that feed each.
    pub(crate) fn feeds(&self) -> impl Iterator<Item = (u32, &Feed)> {
        self.streams
            .iter()
            .filter(|(_, s)| s.worker.is_some())
            .map(|(id, s)| (*id, &s.ranks))
    }

    /// Whether a stream carries the node's samples instead of its ranks' profiles (see `samples`).
    pub(crate) fn is_node_stream(&self, id: u32) -> bool {
        self.spec(id)
            .is_some_and(|s| s.filter == super::samples::NODES_FILTER)
    }

    /// Removes a closed stream; its packets still in flight are expected from now on. The calls its filter has
    /// queued (the rounds the close cut short) are still answered.
    pub(crate) fn close(&mut self, id: u32) -> Option<StreamSpec> {
        self.closed.insert(id);
        let s = self.streams.remove(&id)?;
        if let Some(w) = s.worker.filter(Worker::pending) {
            self.closing.insert(id, (s.spec.clone(), w));
        }
        Some(s.spec)
    }

    /// The spec a closed stream's last answers are stored with, at the root.
    pub(crate) fn closing_spec(&self, id: u32) -> Option<&StreamSpec> {
        self.closing.get(&id).map(|(spec, _)| spec)
    }

    /// Marks a stream failed here; returns its spec the first time. Its queued calls are dropped; a call still
    /// running is answered into nothing.
    pub(crate) fn fail(&mut self, id: u32) -> Option<StreamSpec> {
        let s = self.streams.get_mut(&id)?;
        s.worker = None;
        if s.failed {
            return None;
        }
        s.failed = true;
        Some(s.spec.clone())
    }

    /// Phases of the stream's rounds, for a live stream.
    pub(crate) fn phases(&self, id: u32) -> Option<u32> {
        let s = self.streams.get(&id)?;
        s.worker.as_ref().map(|_| s.phases)
    }

    pub(crate) fn names(&mut self, pairs: &[(u64, String)]) {
        let live: Vec<u32> = self.feeds().map(|(id, _)| id).collect();
        for id in live {
            self.submit(id, Call::Names(pairs.to_vec()), Then::Nothing);
        }
    }

    /// Queues a call into a live stream's filter; its answer comes back as a [`Done`].
    pub(crate) fn submit(&mut self, id: u32, call: Call, then: Then) -> Queued {
        // A closed stream's filter still finishes the rounds its close cut short (at the root, into results).
        let (spec, worker) = match self.streams.get_mut(&id) {
            Some(s) => (&s.spec, s.worker.as_mut()),
            None => match self.closing.get_mut(&id) {
                Some((spec, w)) => (&*spec, Some(w)),
                None => return Queued::NotLive,
            },
        };
        let Some(w) = worker else {
            return Queued::NotLive;
        };
        if w.queue.len() >= FILTER_QUEUE {
            let running = w
                .busy
                .map(|(call, since)| {
                    format!(
                        " behind a {call} call running for {} ms",
                        since.elapsed().as_millis()
                    )
                })
                .unwrap_or_default();
            return Queued::Full(format!(
                "filter {}: {FILTER_QUEUE} calls queued{running}: the filter does not keep up",
                spec.filter
            ));
        }
        w.queue.push_back((call, then));
        Self::start(w, id, &self.done);
        Queued::Yes
    }

    /// Starts the worker's next call if none runs. Its answer reaches the node's loop as a [`Done`], from the
    /// node's own task for an inline filter, from a blocking task for a contained one.
    fn start(w: &mut Worker, stream: u32, done: &mpsc::UnboundedSender<Done>) {
        if w.busy.is_some() {
            return;
        }
        let Some((call, then)) = w.queue.pop_front() else {
            return;
        };
        let name = call.name();
        w.busy = Some((name, Instant::now()));
        let (generation, tx) = (w.generation, done.clone());
        let answered = move |answer, micros| {
            let _ = tx.send(Done {
                stream,
                generation,
                then,
                answer,
                micros,
            });
        };
        if let Err((_, answered)) = w.runner.run(&w.filter, call, answered) {
            // The thread ended (a panic before): the answer fails the stream.
            let reason = format!("{name}: the filter's thread has ended");
            answered(Answer::failed(&w.filter, name, reason), 0);
        }
    }

    /// A call's answer: the next call of its stream starts, and what the node does with the answer is returned,
    /// unless the stream failed, or was reopened, meanwhile.
    pub(crate) fn done(&mut self, d: Done) -> Option<(u32, Then, Answer)> {
        let t = self.time.entry(d.stream).or_default();
        t.0 += 1;
        t.1 += d.micros;
        // The worker of the answer's generation: the live stream's, or that of a closed one still finishing its
        // calls (a stream id the parent reopened has both).
        let live = self
            .streams
            .get(&d.stream)
            .and_then(|s| s.worker.as_ref())
            .is_some_and(|w| w.generation == d.generation);
        let w = if live {
            self.streams.get_mut(&d.stream)?.worker.as_mut()?
        } else {
            self.closing
                .get_mut(&d.stream)
                .map(|(_, w)| w)
                .filter(|w| w.generation == d.generation)?
        };
        w.busy = None;
        Self::start(w, d.stream, &self.done);
        if !live && self.closing.get(&d.stream).is_some_and(|(_, w)| !w.pending()) {
            self.closing.remove(&d.stream);
        }
        Some((d.stream, d.then, d.answer))
    }

    /// Any call queued or running, on a live or closing stream: the node does not finish before they are answered.
    pub(crate) fn busy(&self) -> bool {
        !self.closing.is_empty()
            || self
                .streams
                .values()
                .any(|s| s.worker.as_ref().is_some_and(Worker::pending))
    }

    /// When the watchdog next looks at a running call.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let live = self.streams.values().filter_map(|s| s.worker.as_ref());
        let closing = self.closing.values().map(|(_, w)| w);
        live.chain(closing)
            .filter(|w| w.runner.is_contained())
            .filter_map(|w| w.busy)
            .map(|(_, since)| since + self.call_timeout)
            .min()
    }

    /// Whether a call busy since `since` has run past the time-out at `now`. A call found far past it was not
    /// watched that long: the node itself did not run (its process was stopped, or starved of the processor), so
    /// the call is given its whole time-out again from now rather than blamed for the pause.
    fn overdue(
        &self,
        stream: u32,
        busy: &mut Option<(&'static str, Instant)>,
        now: Instant,
    ) -> Option<Duration> {
        let (call, since) = (*busy)?;
        let elapsed = now.saturating_duration_since(since);
        if elapsed < self.call_timeout {
            return None;
        }
        let late = elapsed - self.call_timeout;
        if late > NODE_PAUSE {
            tracing::info!(
                stream,
                call,
                late_ms = late.as_millis() as u64,
                "the node did not run for a while past a filter call's time-out: the call's time starts again"
            );
            *busy = Some((call, now));
            return None;
        }
        Some(elapsed)
    }

    /// The watchdog: every live stream whose filter call has run past the time-out, with the reason it fails.
    /// Its worker is abandoned (the thread cannot be stopped) and counted against its filter.
    pub(crate) fn stuck(&mut self, now: Instant) -> Vec<(u32, String)> {
        let mut out = Vec::new();
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            let mut busy = match self.streams.get(&id).and_then(|s| s.worker.as_ref()) {
                // An answer already back (waiting behind the node's own work) is not a stuck call.
                Some(w) if w.runner.is_contained() && !w.runner.answered() => w.busy,
                _ => continue,
            };
            let overdue = self.overdue(id, &mut busy, now);
            let s = self.streams.get_mut(&id).expect("a stream of the table");
            let Some(w) = s.worker.as_mut() else { continue };
            w.busy = busy;
            let Some(elapsed) = overdue else { continue };
            let call = busy.map_or("", |(call, _)| call);
            // Counted here; the thread uncounts itself if the call ever returns.
            let n = self.stuck.entry(s.spec.filter.clone()).or_default();
            let n = n.fetch_add(1, Ordering::Relaxed) + 1;
            w.runner.count_stuck();
            s.worker = None;
            out.push((
                id,
                format!(
                    "filter {}: {call} call stuck for {} ms (filter_call_timeout_ms {}); its thread is abandoned \
                     ({} stuck on this node)",
                    s.spec.filter,
                    elapsed.as_millis(),
                    self.call_timeout.as_millis(),
                    n
                ),
            ));
        }
        // A closed stream's call stuck the same way is abandoned too, with nothing left to fail: its last rounds
        // go unanswered, and the node does not wait for them to finish.
        let mut stuck = Vec::new();
        let ids: Vec<u32> = self.closing.keys().copied().collect();
        for id in ids {
            let mut busy = match self.closing.get(&id) {
                Some((_, w)) if w.runner.is_contained() && !w.runner.answered() => w.busy,
                _ => continue,
            };
            let overdue = self.overdue(id, &mut busy, now);
            if let Some((_, w)) = self.closing.get_mut(&id) {
                w.busy = busy;
            }
            if overdue.is_some() {
                stuck.push(id);
            }
        }
        for id in stuck {
            let Some((spec, w)) = self.closing.remove(&id) else {
                continue;
            };
            let n = self.stuck.entry(spec.filter.clone()).or_default();
            let n = n.fetch_add(1, Ordering::Relaxed) + 1;
            w.runner.count_stuck();
            tracing::error!(stream = id, filter = %spec.filter, stuck = n,
                "a closed stream's filter call is stuck past filter_call_timeout_ms: its thread is abandoned and \
                 its last rounds go unanswered");
        }
        out
    }

    pub(crate) fn filter_time(&self) -> Vec<FilterTime> {
        self.time
            .iter()
            .map(|(id, (calls, micros))| FilterTime {
                stream_id: *id,
                calls: *calls,
                micros: *micros,
            })
            .collect()
    }
}

/// How a stream's rounds synchronize, from its spec (an unset mode waits for all).
pub(crate) fn sync_of(spec: &StreamSpec) -> StreamSync {
    let mode = match SyncMode::try_from(spec.sync_mode) {
        Ok(SyncMode::DontWait) => SyncMode::DontWait,
        _ => SyncMode::WaitForAll,
    };
    StreamSync {
        mode,
        timeout: Duration::from_millis(u64::from(spec.timeout_ms.max(1))),
    }
}

/// What a call costs through the table, inline and contained on a stream's thread, against the same call made
/// directly. Prints, never fails on a time: `cargo test -p canopy-core hand_off -- --ignored --nocapture`.
#[cfg(test)]
mod hand_off;
