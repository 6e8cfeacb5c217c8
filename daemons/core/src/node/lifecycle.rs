//! Streams over their life on this node: opened and closed as the parent says (the root's own commands are the
//! root's, in [`root`](super::root)), and failed when a filter fails.

use canopy_proto::v1::{EventName, NameDictionary, StreamError, StreamReady, StreamSpec, up_message};

use super::*;

impl<U: Up, P: Position> Node<U, P> {
    // ---- streams ----

    pub(super) async fn open_stream(&mut self, mut spec: StreamSpec) -> bool {
        let id = spec.stream_id;
        if let Some(known) = self.streams.spec(id) {
            // The first round is set once: the root's (a stream opened while ranks dumped) ends a leaf's wait, and
            // the stream goes on from the round it started at whatever a parent says later (a restarted root
            // reopens its streams from the next round it knows).
            if known.first_round.is_none()
                && let Some(first) = spec.first_round
            {
                self.streams.set_first_round(id, first);
                let kept = match &mut self.leaf {
                    Some(leaf) => leaf.waiting.release(id, first),
                    None => Vec::new(),
                };
                self.feed_kept(id, kept).await;
            }
            spec.first_round = self.streams.spec(id).and_then(|s| s.first_round);
        }
        match self.streams.spec(id) {
            // The parent tells a child that comes back what it already runs.
            Some(known) if *known == spec => return true,
            // An adopter (a level higher than the lost parent) gives a longer time-out: the same stream, which
            // goes on with its filter and the rounds it holds.
            Some(known)
                if StreamSpec {
                    timeout_ms: spec.timeout_ms,
                    ..known.clone()
                } == spec =>
            {
                self.streams.set_timeout(id, spec.timeout_ms);
                self.engine.open_stream(id, streams::sync_of(&spec));
                return true;
            }
            // New rank stages (the root moved an automatic detail stream): the same stream, fed by other ranks from
            // a round no leaf has admitted yet.
            Some(known)
                if StreamSpec {
                    stages: spec.stages.clone(),
                    timeout_ms: spec.timeout_ms,
                    ..known.clone()
                } == spec =>
            {
                self.streams.set_timeout(id, spec.timeout_ms);
                if let Err(e) = self.streams.restage(id, &spec) {
                    tracing::warn!(node = %self.id, stream = id, "rank stages refused: {e}");
                }
                return true;
            }
            // The same id for another stream (a root restarted with another table): the old one ends here first,
            // so none of its packets reach the new filter.
            Some(known) => {
                tracing::warn!(node = %self.id, stream = id, old = %known.filter, new = %spec.filter,
                    "the parent reopened stream {id} with another spec: closing the old one");
                self.close_stream(id).await;
            }
            None => {}
        }
        let first_round = spec.first_round;
        match self.streams.open(spec, &self.names) {
            Ok(sync) => {
                self.engine.open_stream(id, sync);
                if first_round.is_none() {
                    self.wait_for_first_round(id).await;
                }
                true
            }
            Err(reason) => {
                self.stream_error(id, reason).await;
                false
            }
        }
    }

    /// At a leaf, a stream with no first round yet: its dumps are kept from the first round not dumped here, and
    /// the root hears which.
    async fn wait_for_first_round(&mut self, id: u32) {
        let ranks = self.engine.ranks_expected();
        let Some(leaf) = &mut self.leaf else {
            return;
        };
        let next_round = leaf.highest_dumped.map_or(0, |h| h.saturating_add(1));
        leaf.waiting.wait(id, next_round);
        let ready = StreamReady {
            stream_id: id,
            next_round,
            ranks,
        };
        self.up.send(up_message::Msg::StreamReady(ready)).await;
    }

    pub(super) async fn close_stream(&mut self, id: u32) {
        if let Some(leaf) = &mut self.leaf {
            leaf.waiting.forget(id);
        }
        self.position.forget_stream(id);
        let closed = self.engine.close_stream(id);
        self.on_closed_all(closed).await;
        self.streams.close(id);
        // Rounds cut short by the close will not finish; packets still on their way are expected, not malformed.
        self.route.forget_stream(id);
    }

    /// A filter failed on this node: the stream stops here and the root hears why.
    pub(super) async fn stream_error(&mut self, stream: u32, reason: String) {
        tracing::error!(node = %self.id, stream, "stream failed: {reason}");
        self.counters.streams_failed += 1;
        let error = StreamError {
            stream_id: stream,
            node_id: self.id.clone(),
            reason,
        };
        P::stream_failed(self, error, FailedAt::Here).await;
    }

    /// A leaf's answer to a stream opened while ranks dumped: it goes up to the root, which may set the stream's
    /// first round.
    pub(super) async fn on_stream_ready(&mut self, ready: StreamReady) {
        P::stream_ready(self, ready).await;
    }

    /// New names go up; a known id with another name goes up too, so the root can report the collision.
    pub(super) async fn on_names(&mut self, names: Vec<EventName>) {
        let mut fresh = Vec::new();
        for n in names {
            if self.names.get(&n.id) != Some(&n.name) {
                self.names.entry(n.id).or_insert_with(|| n.name.clone());
                fresh.push(n);
            }
        }
        if !fresh.is_empty() {
            let pairs: Vec<(u64, String)> = fresh.iter().map(|n| (n.id, n.name.clone())).collect();
            self.streams.names(&pairs);
            self.up
                .send(up_message::Msg::Names(NameDictionary { names: fresh }))
                .await;
        }
    }
}
