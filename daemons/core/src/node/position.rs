//! Where a node stands: at the root, or linked to a parent. The root's policy differs from every other node's
//! in a few places (where a packet sent up goes, what a late packet becomes, how a failed stream is reported, when
//! the node finishes, its own deadlines), and each of those is a method of [`Position`], implemented once by
//! [`Root`](super::Root) in the root's module and once by [`Linked`](super::linked::Linked). The rest of the node
//! is the same code at every level, and reaches the root's state only through its own type.

use std::future::Future;

use bytes::Bytes;
use canopy_proto::v1::{Coverage, Envelope, Hello, StreamError, StreamReady};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Node;
use super::input::RootCommand;
use super::leaf::LeafOptions;
use super::linked::Linked;
use super::root::{Root, RootOptions};
use super::up::{RoundResult, Up};
use crate::engine::{GroupKey, Recount};
use crate::filter::Level;

/// What a node does where its position decides. Each hook is given the whole node, whose `position` field is the
/// implementing type, so the root's hooks read the root's state with no match on a role.
pub trait Position: Send + Sized + 'static {
    /// The level a node here runs its filters at when its sources are children (a leaf's are ranks).
    const LEVEL: Level;

    /// The earliest deadline of this position's own (the root's start, drain and waits).
    fn deadline(&self) -> Option<Instant>;

    /// A stream closed here: what this position kept for its start goes.
    fn forget_stream(&mut self, stream: u32);

    /// The watermark below which the nodes below may let go of what they keep for the rounds the root closed.
    fn closed_below<U: Up>(node: &Node<U, Self>) -> u64;

    /// Before the node's first input.
    fn begin<U: Up>(node: &mut Node<U, Self>) -> impl Future<Output = ()> + Send;

    /// After the node's last input, before its children are closed.
    fn end<U: Up>(node: &mut Node<U, Self>) -> impl Future<Output = ()> + Send;

    /// This position's deadlines that passed at `now`.
    fn on_timer<U: Up>(node: &mut Node<U, Self>, now: Instant) -> impl Future<Output = ()> + Send;

    /// The ranks below changed: `ranks` attached, `announced` the largest application size announced.
    fn ranks_changed<U: Up>(
        node: &mut Node<U, Self>,
        ranks: u32,
        announced: u32,
    ) -> impl Future<Output = ()> + Send;

    /// The daemon asked the node to stop.
    fn shutdown<U: Up>(node: &mut Node<U, Self>) -> impl Future<Output = ()> + Send;

    /// Everything below has finished and no round is open.
    fn below_finished<U: Up>(node: &mut Node<U, Self>) -> impl Future<Output = ()> + Send;

    /// A command of the front-end's.
    fn command<U: Up>(node: &mut Node<U, Self>, cmd: RootCommand) -> impl Future<Output = ()> + Send;

    /// A leaf's answer to a stream opened while ranks dumped.
    fn stream_ready<U: Up>(node: &mut Node<U, Self>, ready: StreamReady) -> impl Future<Output = ()> + Send;

    /// A stream's filter failed, on this node or below it.
    fn stream_failed<U: Up>(
        node: &mut Node<U, Self>,
        error: StreamError,
        at: FailedAt,
    ) -> impl Future<Output = ()> + Send;

    /// A packet this node sends up.
    fn send_up<U: Up>(node: &mut Node<U, Self>, env: Envelope) -> impl Future<Output = ()> + Send;

    /// A packet for a round already closed here, made into what a late packet carries up.
    fn late_up<U: Up>(
        node: &mut Node<U, Self>,
        key: GroupKey,
        coverage: Coverage,
        first_dump: u64,
        payload: Bytes,
    ) -> impl Future<Output = ()> + Send;

    /// A finalized result.
    fn result<U: Up>(node: &mut Node<U, Self>, result: RoundResult) -> impl Future<Output = ()> + Send;

    /// A multi-phase round whose last phase never came back.
    fn unfinished<U: Up>(
        node: &mut Node<U, Self>,
        stream: u32,
        round: u64,
    ) -> impl Future<Output = ()> + Send;

    /// Closed rounds that counted a child's ranks late or unreachable, though it finished before them: the root
    /// recounts them as stopped where it stores them; another node sent those rounds up long ago.
    fn recount<U: Up>(node: &mut Node<U, Self>, recounts: Vec<Recount>) -> impl Future<Output = ()> + Send;
}

/// A late packet as it goes up: its coverage, and its payload if it still carries one.
pub(super) fn late_envelope(key: GroupKey, coverage: Coverage, first_dump: u64, payload: Bytes) -> Envelope {
    Envelope {
        stream_id: key.stream,
        round: key.round,
        phase: key.phase,
        coverage: Some(coverage),
        payload,
        late: true,
        first_dump_unix_ns: first_dump,
    }
}

/// Where a stream's filter failed, as the node that hears of it sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedAt {
    /// On this node: the stream stops here first.
    Here,
    /// On a node below, which stopped it there.
    Below,
}

/// The role a node is built for: the leaf's options, [`Relay`], or the root's options. Each gives the node its
/// [`Position`] and, at a leaf, its ranks' options.
pub trait RoleConfig: Send + 'static {
    type Position: Position;

    /// The position, which keeps `hello` if it has a parent to send it to.
    fn into_parts(self, hello: watch::Sender<Hello>) -> (Self::Position, Option<LeafOptions>);
}

/// An interior node: its sources are children, and it has a parent.
#[derive(Debug, Clone, Copy, Default)]
pub struct Relay;

impl RoleConfig for LeafOptions {
    type Position = Linked;

    fn into_parts(self, hello: watch::Sender<Hello>) -> (Linked, Option<LeafOptions>) {
        (Linked::new(hello), Some(self))
    }
}

impl RoleConfig for Relay {
    type Position = Linked;

    fn into_parts(self, hello: watch::Sender<Hello>) -> (Linked, Option<LeafOptions>) {
        (Linked::new(hello), None)
    }
}

impl RoleConfig for RootOptions {
    type Position = Root;

    fn into_parts(self, _: watch::Sender<Hello>) -> (Root, Option<LeafOptions>) {
        (Root::new(self), None)
    }
}
