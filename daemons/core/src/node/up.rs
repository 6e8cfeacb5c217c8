//! The way up from a node: a link to the parent, or at the root the front-end's store. A relay's and a leaf's way
//! up carries messages only; results exist only at the root, so only the root's way up takes them.

use std::future::Future;

use futures::future::BoxFuture;

use canopy_proto::v1::{Coverage, StreamSpec, UpMessage, up_message};

pub use crate::engine::Recount;
use tokio::sync::mpsc;

/// One result at the root.
#[derive(Debug, Clone)]
pub struct RoundResult {
    pub stream: StreamSpec,
    pub round: u64,
    pub phase: u32,
    pub coverage: Coverage,
    pub first_dump_unix_ns: u64,
    pub payload: Vec<u8>,
    pub late: bool,
}

impl RoundResult {
    /// The result of the group `key` of `stream`.
    pub(crate) fn of(
        stream: StreamSpec,
        key: crate::engine::GroupKey,
        coverage: Coverage,
        first_dump_unix_ns: u64,
        payload: Vec<u8>,
        late: bool,
    ) -> Self {
        Self {
            stream,
            round: key.round,
            phase: key.phase,
            coverage,
            first_dump_unix_ns,
            payload,
            late,
        }
    }
}

pub use canopy_proto::StreamState;

/// The way up: a parent link, or at the root the front-end's store, which hears every message the tree sends
/// up (names, node events, status, fin).
pub trait Up: Send + 'static {
    /// Sends one message toward the root (at the root: records it).
    fn send(&mut self, msg: up_message::Msg) -> impl Future<Output = ()> + Send;
}

/// Where the root puts what only the root produces: finalized results and the streams' states. Given to the node
/// with its root options, so a relay's or a leaf's way up has no root-only methods.
pub trait RootSink: Send + Sync + 'static {
    /// One finalized result.
    fn result(&mut self, result: RoundResult) -> BoxFuture<'_, ()>;
    /// A stream changed state.
    fn stream_state<'a>(
        &'a mut self,
        spec: &'a StreamSpec,
        state: StreamState,
        failure: Option<&'a str>,
    ) -> BoxFuture<'a, ()>;
    /// A closed round counted a source's ranks late or unreachable, though the source finished before the round:
    /// they count as stopped there.
    fn recount(&mut self, recount: Recount) -> BoxFuture<'_, ()>;
    /// Waits until everything given so far is stored (before the node exits).
    fn flush(&mut self) -> BoxFuture<'_, ()>;
}

/// A parent link's queue as the way up. When the node ends, the queue closes and the link delivers what it holds
/// before it hangs up (see `transport::ParentLink`).
pub struct ParentUp {
    pub tx: mpsc::Sender<UpMessage>,
}

impl Up for ParentUp {
    async fn send(&mut self, msg: up_message::Msg) {
        let msg = UpMessage { msg: Some(msg) };
        if matches!(msg.msg, Some(up_message::Msg::Status(_))) {
            // Status is periodic and replaced by the next one: it never waits for a parent that is away.
            let _ = self.tx.try_send(msg);
        } else {
            let _ = self.tx.send(msg).await;
        }
    }
}
