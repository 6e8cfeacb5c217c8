//! Where a stream's filter runs on a node: inline on the node's task, or contained on a thread of its own.
//!
//! - **Inline** ([`Runner::Inline`]): the node calls the filter itself, under the crash guard and a panic catch.
//!   Nothing crosses a thread, so a round's inputs are merged while they are still in the cache of the core that
//!   read them, and the node's runtime is not woken once more per call. It is for the filters an operator trusts
//!   not to hang: by default the ones Canopy ships, whose readers are fuzzed and whose work is linear in their
//!   inputs. A call that hangs anyway holds the node; the [`InlineWatch`] says so in the log, naming the filter
//!   and the call, once per time-out while it lasts.
//! - **Contained** ([`Runner::Thread`]): the stream's instance lives on a thread of its own, which runs its calls
//!   one at a time while a tokio blocking task waits for the answer. A call stuck past the filter-call time-out
//!   fails only its stream, and its thread is abandoned (see `streams`).
//!
//! Either way a call's answer reaches the node's loop as a `Done` input, so the node handles the answers of both
//! kinds in one place and in the same order.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::filter::{FilterError, FilterInstance, Output};

/// How often the wait for a contained call looks whether its worker was abandoned.
const ABANDON_CHECK: Duration = Duration::from_millis(100);

/// A call into a stream's filter.
pub(crate) enum Call {
    Upstream {
        round: u64,
        phase: u32,
        inputs: Vec<bytes::Bytes>,
    },
    Downstream {
        round: u64,
        phase: u32,
        packet: bytes::Bytes,
    },
    Finalize {
        round: u64,
        phase: u32,
        payload: bytes::Bytes,
    },
    Names(Vec<(u64, String)>),
}

impl Call {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Call::Upstream { .. } => "upstream",
            Call::Downstream { .. } => "downstream",
            Call::Finalize { .. } => "finalize",
            Call::Names(_) => "names",
        }
    }

    fn run(self, filter: &mut dyn FilterInstance) -> Answer {
        match self {
            Call::Upstream { round, phase, inputs } => {
                let inputs: Vec<&[u8]> = inputs.iter().map(|b| b.as_ref()).collect();
                Answer::Output(filter.upstream(round, phase, &inputs))
            }
            Call::Downstream { round, phase, packet } => {
                Answer::Output(filter.downstream(round, phase, &packet))
            }
            Call::Finalize {
                round,
                phase,
                payload,
            } => Answer::Result(filter.finalize(round, phase, &payload)),
            Call::Names(pairs) => {
                filter.names(&pairs);
                Answer::Names
            }
        }
    }
}

/// What a call answered.
pub(crate) enum Answer {
    Output(Result<Output, FilterError>),
    Result(Result<Vec<u8>, FilterError>),
    Names,
}

impl Answer {
    /// The failed answer to a call named `call` of filter `filter`.
    pub(crate) fn failed(filter: &str, call: &'static str, reason: String) -> Answer {
        let e = FilterError::Failed {
            filter: filter.to_string(),
            reason,
        };
        match call {
            "finalize" => Answer::Result(Err(e)),
            _ => Answer::Output(Err(e)),
        }
    }
}

/// Runs one call, catching a panic; `Err` carries the failed answer, after which the instance is not trusted.
fn run_caught(call: Call, filter: &mut dyn FilterInstance, name: &str) -> Result<Answer, Answer> {
    let call_name = call.name();
    std::panic::catch_unwind(AssertUnwindSafe(|| call.run(filter))).map_err(|panic| {
        let reason = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        Answer::failed(name, call_name, format!("{call_name} panicked: {reason}"))
    })
}

/// A call for a stream's thread, and where its answer goes.
type Job = (Call, std::sync::mpsc::SyncSender<(Answer, u64)>);

/// Where a stream's calls run.
pub(crate) enum Runner {
    Inline(Inline),
    Thread(Contained),
}

/// A filter the node calls itself; `None` once a call panicked (the instance is then never called again, and
/// never destroyed).
pub(crate) struct Inline {
    filter: Option<Box<dyn FilterInstance>>,
    watch: Arc<InlineWatch>,
}

/// The node's ends of a stream's thread: its jobs, and the abandoned and counted-stuck flags.
pub(crate) struct Contained {
    jobs: std::sync::mpsc::SyncSender<Job>,
    /// Set when the node gives up on this worker: the wait for a running call ends (so nothing on the runtime
    /// waits for a stuck thread), and a stuck call that returns after all uncounts itself.
    abandoned: Arc<AtomicBool>,
    /// Set by the watchdog: the thread is counted stuck against its filter until it ends.
    counted: Arc<AtomicBool>,
    /// Set once the running call's answer is back (it may wait in the node's queue behind the node's own work).
    answered: Arc<AtomicBool>,
}

impl Drop for Contained {
    fn drop(&mut self) {
        // The thread ends after its current call (and destroys the filter on its way out).
        self.abandoned.store(true, Ordering::Relaxed);
    }
}

impl Runner {
    pub(crate) fn inline(filter: Box<dyn FilterInstance>, watch: Arc<InlineWatch>) -> Runner {
        Runner::Inline(Inline {
            filter: Some(filter),
            watch,
        })
    }

    /// Starts a stream's thread, which owns its filter and runs its calls in order; it ends when the runner is
    /// dropped (after its current call) or after a panic (whose answer fails the stream), destroying the filter.
    pub(crate) fn contained(
        stream: u32,
        filter_name: &str,
        mut filter: Box<dyn FilterInstance>,
        stuck: Arc<AtomicUsize>,
    ) -> Result<Runner, String> {
        let (jobs, rx) = std::sync::mpsc::sync_channel::<Job>(1);
        let abandoned = Arc::new(AtomicBool::new(false));
        let counted = Arc::new(AtomicBool::new(false));
        let stuck_flag = counted.clone();
        let name = filter_name.to_string();
        std::thread::Builder::new()
            .name(format!("filter-{stream}"))
            .spawn(move || {
                while let Ok((call, answer)) = rx.recv() {
                    let started = Instant::now();
                    let out = run_caught(call, filter.as_mut(), &name);
                    let micros = started.elapsed().as_micros() as u64;
                    match out {
                        Ok(a) => {
                            let _ = answer.send((a, micros));
                        }
                        Err(a) => {
                            let _ = answer.send((a, micros));
                            // Its state is not trusted: never called again, never destroyed.
                            std::mem::forget(filter);
                            return;
                        }
                    }
                }
                drop(filter);
                if counted.swap(false, Ordering::Relaxed) {
                    // The watchdog counted this thread stuck; its call returned after all.
                    stuck.fetch_sub(1, Ordering::Relaxed);
                    tracing::warn!(filter = %name, stream, "a filter call abandoned as stuck returned");
                }
            })
            .map_err(|e| format!("filter {filter_name}: cannot start its thread: {e}"))?;
        Ok(Runner::Thread(Contained {
            jobs,
            abandoned,
            counted: stuck_flag,
            answered: Arc::new(AtomicBool::new(false)),
        }))
    }

    /// Whether a call of this runner can be abandoned by the watchdog (a contained one).
    pub(crate) fn is_contained(&self) -> bool {
        matches!(self, Runner::Thread(_))
    }

    /// Whether the running call of a contained runner has answered (always true inline: the answer is made on
    /// the node's task).
    pub(crate) fn answered(&self) -> bool {
        match self {
            Runner::Inline(_) => true,
            Runner::Thread(c) => c.answered.load(Ordering::Acquire),
        }
    }

    /// Marks a contained runner's thread as counted stuck against its filter (the thread uncounts itself if its
    /// call ever returns).
    pub(crate) fn count_stuck(&self) {
        if let Runner::Thread(c) = self {
            c.counted.store(true, Ordering::Relaxed);
        }
    }

    /// Runs `call`; its answer, with the microseconds it took, reaches `answered` (on this task for an inline
    /// runner, from a blocking task for a contained one). False if a contained runner's thread has ended: the
    /// call is handed back with it.
    pub(crate) fn run<F>(&mut self, filter_name: &str, call: Call, answered: F) -> Result<(), (Call, F)>
    where
        F: FnOnce(Answer, u64) + Send + 'static,
    {
        match self {
            Runner::Inline(inline) => {
                let name = call.name();
                let Some(filter) = inline.filter.as_mut() else {
                    answered(
                        Answer::failed(filter_name, name, format!("{name}: the filter panicked before")),
                        0,
                    );
                    return Ok(());
                };
                let started = Instant::now();
                let out = {
                    let _running = inline.watch.begin(filter_name, name);
                    run_caught(call, filter.as_mut(), filter_name)
                };
                let micros = started.elapsed().as_micros() as u64;
                let answer = out.unwrap_or_else(|failed| {
                    // Its state is not trusted: never called again, never destroyed.
                    std::mem::forget(inline.filter.take());
                    failed
                });
                answered(answer, micros);
                Ok(())
            }
            Runner::Thread(c) => {
                let name = call.name();
                let (answer_tx, answer_rx) = std::sync::mpsc::sync_channel(1);
                if let Err(std::sync::mpsc::SendError((call, _))) = c.jobs.send((call, answer_tx)) {
                    return Err((call, answered));
                }
                let (abandoned, done) = (c.abandoned.clone(), c.answered.clone());
                done.store(false, Ordering::Release);
                let lost = Answer::failed(
                    filter_name,
                    name,
                    format!("{name}: the filter's thread ended in the call"),
                );
                // A blocking task waits, so a paused test clock does not move while a filter computes.
                tokio::task::spawn_blocking(move || {
                    let (answer, micros) = loop {
                        match answer_rx.recv_timeout(ABANDON_CHECK) {
                            Ok(got) => break got,
                            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                                if abandoned.load(Ordering::Relaxed) =>
                            {
                                return;
                            }
                            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break (lost, 0),
                        }
                    };
                    done.store(true, Ordering::Release);
                    answered(answer, micros);
                });
                Ok(())
            }
        }
    }
}

/// The inline calls of one node, watched from a thread of their own: a call that runs past the time-out holds
/// the node's task, and nothing on that task can say so.
pub(crate) struct InlineWatch {
    running: Mutex<Option<Running>>,
    timeout: Mutex<Duration>,
}

/// Wall time, not tokio's: the watch's thread is outside the runtime, and a paused test clock must not make a
/// call look stuck.
#[allow(clippy::disallowed_types, reason = "read on a plain thread outside tokio")]
type WallInstant = std::time::Instant;

struct Running {
    filter: String,
    call: &'static str,
    since: WallInstant,
    /// How many time-outs it has been reported for.
    reported: u32,
}

/// Ends the watch of a call when dropped (a panic included).
pub(crate) struct Watched<'a>(&'a InlineWatch);

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        if let Ok(mut r) = self.0.running.lock() {
            *r = None;
        }
    }
}

impl InlineWatch {
    /// A watch, with its thread; the thread ends once the watch is dropped.
    pub(crate) fn start(timeout: Duration) -> Arc<InlineWatch> {
        let watch = Arc::new(InlineWatch {
            running: Mutex::new(None),
            timeout: Mutex::new(timeout),
        });
        let weak = Arc::downgrade(&watch);
        let spawned = std::thread::Builder::new()
            .name("filter-watch".into())
            .spawn(move || watch_inline(weak));
        if let Err(e) = spawned {
            tracing::warn!("cannot start the watch of inline filter calls: {e}");
        }
        watch
    }

    pub(crate) fn set_timeout(&self, timeout: Duration) {
        if let Ok(mut t) = self.timeout.lock() {
            *t = timeout;
        }
    }

    fn timeout(&self) -> Duration {
        self.timeout.lock().map_or(Duration::from_secs(10), |t| *t)
    }

    fn begin(&self, filter: &str, call: &'static str) -> Watched<'_> {
        if let Ok(mut r) = self.running.lock() {
            *r = Some(Running {
                filter: filter.to_string(),
                call,
                since: WallInstant::now(),
                reported: 0,
            });
        }
        Watched(self)
    }

    /// The report of a call running past another time-out, if there is one.
    fn overdue(&self, now: WallInstant) -> Option<String> {
        let timeout = self.timeout();
        let mut running = self.running.lock().ok()?;
        let r = running.as_mut()?;
        let elapsed = now.saturating_duration_since(r.since);
        if elapsed < timeout * (r.reported + 1) {
            return None;
        }
        r.reported += 1;
        Some(format!(
            "filter {}: {} call running inline for {} ms (filter_call_timeout_ms {}): the node is held until it \
             returns; a filter that may hang belongs out of inline_filters, on a thread of its own",
            r.filter,
            r.call,
            elapsed.as_millis(),
            timeout.as_millis()
        ))
    }
}

/// The watch's thread: looks four times per time-out; ends when the node's watch is gone.
fn watch_inline(watch: Weak<InlineWatch>) {
    loop {
        let Some(w) = watch.upgrade() else { return };
        let pause = (w.timeout() / 4).max(Duration::from_millis(5));
        if let Some(report) = w.overdue(WallInstant::now()) {
            tracing::error!("{report}");
        }
        drop(w);
        #[allow(
            clippy::disallowed_methods,
            reason = "a plain thread that watches the node's task from outside tokio"
        )]
        std::thread::sleep(pause);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_running_past_the_time_out_is_reported_once_per_time_out_and_not_after_it_returns() {
        let watch = InlineWatch::start(Duration::from_millis(50));
        let t0 = WallInstant::now();
        let running = watch.begin("stats", "upstream");
        assert_eq!(watch.overdue(t0 + Duration::from_millis(40)), None);
        let report = watch
            .overdue(t0 + Duration::from_millis(60))
            .expect("past the time-out");
        assert!(
            report.starts_with("filter stats: upstream call running inline for ")
                && report.contains("(filter_call_timeout_ms 50): the node is held until it returns"),
            "{report}"
        );
        // Once per time-out while it lasts.
        assert_eq!(watch.overdue(t0 + Duration::from_millis(90)), None);
        assert!(watch.overdue(t0 + Duration::from_millis(110)).is_some());
        drop(running);
        assert_eq!(watch.overdue(t0 + Duration::from_secs(10)), None);
        // A new time-out applies to the calls after it.
        watch.set_timeout(Duration::from_secs(1));
        let _running = watch.begin("histogram", "finalize");
        assert_eq!(
            watch.overdue(WallInstant::now() + Duration::from_millis(500)),
            None
        );
        assert!(
            watch
                .overdue(WallInstant::now() + Duration::from_millis(1100))
                .is_some()
        );
    }
}
