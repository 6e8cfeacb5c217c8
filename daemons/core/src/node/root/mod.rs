//! The root: its policy (stream ids, when collection starts, start and stop, the drain at shutdown, and whether the
//! run finishes when the tree does), and the node's flows that only the root has: its commands and streams
//! ([`streams`]), results and the run's end ([`position`]), and a continued run's wait for its ranks
//! ([`resumed`]).

use std::time::Duration;

use canopy_proto::v1::{Coverage, MissingReason, Start, StreamSpec, control};
use tokio::time::Instant;

use super::input::Collection;
use super::up::RootSink;

mod position;
mod resumed;
mod streams;

/// The root's options.
pub struct RootOptions {
    /// Start collection once this many ranks are attached (0: at the first child).
    pub expect_ranks: u32,
    /// Start collection this long after the first rank attached even if some announced ranks have not (they
    /// count as absent); `None`: wait for them all.
    pub start_timeout: Option<Duration>,
    /// Streams to open at start.
    pub streams: Vec<StreamSpec>,
    /// Streams continued from an earlier run of this root (a restart on the same store): each with the round
    /// below which its rounds are stored already.
    pub closed_below: Vec<(u32, u64)>,
    /// The ranks the continued run expected when its earlier root died (0: a new run). Until they are attached
    /// again, every round waits for them to its time-out and counts the missing ones late; past `resume_wait`,
    /// lost. No round closes as whole while part of the tree has yet to come back.
    pub resume_ranks: u32,
    pub resume_wait: Duration,
    /// The lowest id a stream opened later may take: the ids below were this run's already (0: none were).
    pub first_free_stream_id: u32,
    /// Finish the node once every child has sent Fin (a run that ends with its application).
    pub exit_on_fin: bool,
    /// How long a drain waits for the tree before closing what is left.
    pub drain_timeout: Duration,
    /// Where results and stream states go.
    pub sink: Box<dyn RootSink>,
}

impl std::fmt::Debug for RootOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RootOptions")
            .field("expect_ranks", &self.expect_ranks)
            .field("start_timeout", &self.start_timeout)
            .field("streams", &self.streams)
            .field("resume_ranks", &self.resume_ranks)
            .field("exit_on_fin", &self.exit_on_fin)
            .field("drain_timeout", &self.drain_timeout)
            .finish_non_exhaustive()
    }
}

/// The root's policy and what it alone keeps; the node's [`Position`](super::position::Position) at the top of
/// the tree.
pub struct Root {
    pub(crate) opts: RootOptions,
    /// Collection was started (or stopped) once: attaching ranks no longer start it.
    started: bool,
    /// When the first rank attached while collection waited: the start time-out counts from there.
    waiting_since: Option<Instant>,
    /// Collection started at the time-out, without every announced rank.
    started_short: bool,
    /// The last collection control was a stop.
    stopped: bool,
    draining_until: Option<Instant>,
    next_stream_id: u32,
    /// Streams opened while ranks dumped, waiting for the leaves' rounds to set their first round.
    pub(crate) starting: super::first_round::Starting,
    /// After a restart, the ranks of the run that have not come back yet.
    pub(crate) awaited: Option<Awaited>,
}

/// The engine's source that stands for the ranks a restarted root's run expected and that have not attached
/// again.
pub(crate) const AWAITED_SOURCE: &str = "(ranks not back since the restart)";

/// The ranks a restarted root still waits for.
#[derive(Debug)]
pub(crate) struct Awaited {
    /// The ranks the run expected.
    pub(crate) run_ranks: u32,
    /// Those still missing (the awaited source's ranks).
    pub(crate) missing: u32,
    /// When the wait ends: the awaited ranks then count as lost.
    pub(crate) until: Instant,
    pub(crate) given_up: bool,
}

impl Root {
    pub(crate) fn new(opts: RootOptions) -> Self {
        let next_stream_id = opts.first_free_stream_id.max(1);
        Self {
            opts,
            started: false,
            waiting_since: None,
            started_short: false,
            stopped: false,
            draining_until: None,
            next_stream_id,
            starting: Default::default(),
            awaited: None,
        }
    }

    /// When the wait for the ranks of a restarted run ends, if one is under way.
    pub(crate) fn awaited_deadline(&self) -> Option<Instant> {
        self.awaited.as_ref().filter(|a| !a.given_up).map(|a| a.until)
    }

    /// Gives a stream without an id the next free one; ids given by hand move the next free one past them.
    pub(crate) fn assign_id(&mut self, spec: &mut StreamSpec) {
        if spec.stream_id == 0 {
            spec.stream_id = self.next_stream_id;
        }
        self.next_stream_id = self.next_stream_id.max(spec.stream_id + 1);
    }

    /// Whether collection starts now, with `attached` ranks below and `announced` the largest application size
    /// they announced. Ranks that announce their application's size hold the start until all are attached, so
    /// the first rounds do not close before the last rank's first dump; but no longer than the start time-out
    /// after the first rank attached, so a wrong announcement (or a rank that never comes) cannot block the run.
    pub(crate) fn starts(&mut self, attached: u32, announced: u32, now: Instant) -> bool {
        if self.started || self.draining_until.is_some() || attached == 0 {
            return false;
        }
        let since = *self.waiting_since.get_or_insert(now);
        let target = self.opts.expect_ranks.max(announced);
        if attached >= target {
            self.started = true;
            tracing::info!(
                ranks = attached,
                "all expected ranks attached: starting collection"
            );
            return true;
        }
        if self.opts.start_timeout.is_some_and(|t| now >= since + t) {
            self.started = true;
            self.started_short = true;
            tracing::warn!(
                attached,
                expected = target,
                "start time-out: starting collection without the ranks not attached (counted absent)"
            );
            return true;
        }
        if announced > 0 {
            tracing::info!(attached, waiting_for = target, "waiting for ranks to attach");
        }
        false
    }

    /// When the start time-out ends the wait for ranks, if one is under way.
    pub(crate) fn start_deadline(&self) -> Option<Instant> {
        if self.started {
            return None;
        }
        Some(self.waiting_since? + self.opts.start_timeout?)
    }

    /// A round's result counts the ranks that were announced but never attached as absent, once collection
    /// started without them.
    pub(crate) fn count_absent(&self, coverage: &mut Coverage, announced: u32) {
        let target = self.opts.expect_ranks.max(announced);
        if !self.started_short || coverage.expected >= target {
            return;
        }
        let absent = target - coverage.expected;
        coverage.expected = target;
        coverage.add_missing(MissingReason::Absent, absent);
    }

    /// Stop pauses every rank; Start resumes them, numbering on from `first_round`. Either marks collection
    /// started: a child attaching while collection is stopped must not start it.
    pub(crate) fn collection(&mut self, c: Collection, first_round: u64) -> control::Action {
        self.started = true;
        self.stopped = c == Collection::Stop;
        match c {
            Collection::Stop => control::Action::Stop(canopy_proto::v1::Stop {}),
            Collection::Start => control::Action::Start(start(first_round)),
        }
    }

    /// Whether the ranks collect now: collection started and not stopped since.
    pub(crate) fn collecting(&self) -> bool {
        self.started && !self.stopped
    }

    /// Begins the drain; false if one is under way.
    pub(crate) fn drain(&mut self, now: Instant) -> bool {
        if self.draining_until.is_some() {
            return false;
        }
        self.draining_until = Some(now + self.opts.drain_timeout);
        true
    }

    pub(crate) fn drain_deadline(&self) -> Option<Instant> {
        self.draining_until
    }

    /// The tree finishing finishes the run: it ends with its application, or a drain is under way.
    pub(crate) fn finishes_with_tree(&self) -> bool {
        self.opts.exit_on_fin || self.draining_until.is_some()
    }
}

/// A Start that numbers rounds on from `first_round`, stamped now.
pub(crate) fn start(first_round: u64) -> Start {
    Start {
        start_unix_ns: super::unix_ns(),
        first_round,
        rejoin: false,
    }
}
