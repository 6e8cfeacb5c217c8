//! What a node reacts to, grouped by where it comes from: a child, the parent, a rank of the leaf, or the root's
//! API. The transport, the agent and the front-end build these; the node applies each group in its own module.

use canopy_proto::v1::{DownMessage, Hello, MissingReason, StreamSpec, down_message, up_message};
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

/// The sender half a node uses to talk to one child.
pub type ChildSender = mpsc::Sender<Result<DownMessage, Status>>;

/// Everything a node reacts to.
#[derive(Debug)]
pub enum Input {
    Child(ChildEvent),
    Parent(ParentEvent),
    /// Events of the leaf's ranks, applied in order: a rank on the socket sends its own one by one, the simulated
    /// ranks a whole round at once (one input per round, not per rank, keeps the node's work per round small).
    Ranks(Vec<RankEvent>),
    Root(RootCommand),
}

/// From the transport's side of a child.
#[derive(Debug)]
pub enum ChildEvent {
    Attached {
        conn: u64,
        hello: Hello,
        peer: String,
        tx: ChildSender,
    },
    Message {
        conn: u64,
        id: String,
        msg: up_message::Msg,
    },
    Gone {
        conn: u64,
        id: String,
        reason: String,
    },
}

/// From the link to the parent.
#[derive(Debug)]
pub enum ParentEvent {
    Attached,
    Lost(String),
    Message(down_message::Msg),
    Refused(Refused),
}

/// From a rank of the leaf, real (the agent's socket) or simulated: both are rank sources with the same events
/// and the same source id, [`rank_source`].
#[derive(Debug, PartialEq)]
pub enum RankEvent {
    /// A rank attached (or came back): it takes part from round `from` on, and its application has `announced`
    /// ranks in all (0: unknown).
    Attached {
        source: String,
        from: u64,
        announced: u32,
    },
    /// One dump: the rank's profile (an encoded one-profile `ProfileBatch`), or why it has none (sampled out;
    /// stopped: collection stopped at this round).
    Round {
        source: String,
        rank: u32,
        round: u64,
        dump_unix_ns: u64,
        profile: Result<bytes::Bytes, MissingReason>,
    },
    /// The rank's dumps of rounds [from, end) were dropped before they reached the leaf (its queue was full): the
    /// rounds do not wait for it, and count it as dropped.
    RoundsDropped { source: String, from: u64, end: u64 },
    /// Names of events and counters the ranks use.
    Names(Vec<(u64, String)>),
    /// A rank left: finished after its rounds below `finished_end`, or lost (`None`).
    Detached {
        source: String,
        finished_end: Option<u64>,
    },
    /// Dumps the ranks could not deliver (as they reported them).
    DumpsDropped(u64),
    /// A rank left (hung up, or finished) before it ever delivered a dump or reported one dropped: it is forgotten.
    /// Rounds not yet open do not expect it (they would count it lost in every round to come), the rounds open now
    /// count it lost once, and its announced size no longer holds the start.
    Left { source: String, announced: u32 },
}

/// From the root's API (the front-end) or a test.
#[derive(Debug)]
pub enum RootCommand {
    /// Open a stream on the whole tree; the reply gets its id.
    OpenStream(StreamSpec, Option<oneshot::Sender<u32>>),
    /// Close a stream on the whole tree; the reply says whether it was open.
    CloseStream(u32, Option<oneshot::Sender<bool>>),
    /// Start or stop collection.
    Collection(Collection),
    /// New measurement options for every rank.
    Options(canopy_proto::v1::Options),
    /// Collect exactly the rounds `from` through `to` (both included); the reply says why not, if so.
    Window {
        from: u64,
        to: u64,
        reply: oneshot::Sender<Result<(), String>>,
    },
    /// Feed a stream from these ranks (ranges; empty: none) from a round no leaf has admitted yet; the reply
    /// gets that round, or says why not.
    Restage {
        stream: u32,
        ranks: String,
        reply: oneshot::Sender<Result<u64, String>>,
    },
}

/// Start or stop collection, from the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collection {
    Start,
    Stop,
}

/// Why a link gave up for good.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("parent {parent} refused this node: {message}")]
pub struct Refused {
    pub parent: String,
    pub message: String,
}

/// The engine's source id for a rank of the leaf: the same for a simulated rank and a rank on the socket.
pub fn rank_source(app: &str, rank: u32) -> String {
    format!("rank:{app}:{rank}")
}

/// The (app, rank) of a [`rank_source`] id; `None` for any other source.
pub fn parse_rank_source(source: &str) -> Option<(&str, u32)> {
    let (app, rank) = source.strip_prefix("rank:")?.rsplit_once(':')?;
    Some((app, rank.parse().ok()?))
}

/// Drives a tree from its root (the front-end's API uses it; so do tests).
#[derive(Clone)]
pub struct RootHandle {
    inputs: mpsc::Sender<Input>,
}

impl RootHandle {
    pub fn new(inputs: mpsc::Sender<Input>) -> Self {
        Self { inputs }
    }

    async fn send(&self, cmd: RootCommand) -> bool {
        self.inputs.send(Input::Root(cmd)).await.is_ok()
    }

    /// Opens a stream on every node; a stream id of 0 gets the next free id.
    pub async fn open_stream(&self, spec: StreamSpec) -> bool {
        self.send(RootCommand::OpenStream(spec, None)).await
    }

    /// Opens a stream and returns the id it got (0 if the node has stopped).
    pub async fn open_stream_id(&self, spec: StreamSpec) -> u32 {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if !self.send(RootCommand::OpenStream(spec, Some(tx))).await {
            return 0;
        }
        rx.await.unwrap_or(0)
    }

    /// Closes a stream on every node; its open rounds close with what they hold.
    pub async fn close_stream(&self, stream_id: u32) -> bool {
        self.send(RootCommand::CloseStream(stream_id, None)).await
    }

    /// Closes a stream and says whether it was open at the root (`None`: the node has stopped).
    pub async fn close_stream_checked(&self, stream_id: u32) -> Option<bool> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if !self.send(RootCommand::CloseStream(stream_id, Some(tx))).await {
            return None;
        }
        rx.await.ok()
    }

    pub async fn collection(&self, c: Collection) -> bool {
        self.send(RootCommand::Collection(c)).await
    }

    /// Collects exactly the rounds `from` through `to`: `from` must be a round no leaf has admitted yet. `None`:
    /// the node has stopped.
    pub async fn window(&self, from: u64, to: u64) -> Option<Result<(), String>> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        if !self.send(RootCommand::Window { from, to, reply }).await {
            return None;
        }
        rx.await.ok()
    }

    /// Feeds a stream from other ranks (ranges; empty: none) from a round no leaf has admitted yet, which the
    /// answer gives. `None`: the node has stopped.
    pub async fn restage(&self, stream: u32, ranks: String) -> Option<Result<u64, String>> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        if !self.send(RootCommand::Restage { stream, ranks, reply }).await {
            return None;
        }
        rx.await.ok()
    }

    /// Replaces every rank's measurement options from its next dump on (check them first with
    /// `options::Measure::from_options`).
    pub async fn options(&self, o: canopy_proto::v1::Options) -> bool {
        self.send(RootCommand::Options(o)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_source_reads_back_as_its_app_and_rank() {
        assert_eq!(parse_rank_source(&rank_source("lulesh", 7)), Some(("lulesh", 7)));
        // An application's name may hold the separator; the rank is what follows the last one.
        assert_eq!(parse_rank_source(&rank_source("a:b", 0)), Some(("a:b", 0)));
        assert_eq!(parse_rank_source("relay:0"), None);
        assert_eq!(parse_rank_source("rank:a:x"), None);
    }
}
