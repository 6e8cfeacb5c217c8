//! What the parent says: the link attached, its messages (the control stream, credits, resend requests) and
//! commands, and the nodes it says were adopted elsewhere.

use super::*;

impl<U: Up, P: Position> Node<U, P> {
    // ---- the parent ----

    pub(super) async fn on_parent(&mut self, ev: ParentEvent) {
        match ev {
            ParentEvent::Attached => self.on_parent_attached().await,
            ParentEvent::Lost(reason) => {
                tracing::warn!(node = %self.id, "lost the parent: {reason}; re-attaching")
            }
            ParentEvent::Message(msg) => self.on_parent_message(msg).await,
            ParentEvent::Refused(_) => {}
        }
    }

    pub(super) async fn on_parent_attached(&mut self) {
        let mut names: Vec<EventName> = self
            .names
            .iter()
            .map(|(id, name)| EventName {
                id: *id,
                name: name.clone(),
            })
            .collect();
        names.sort_by_key(|n| n.id);
        if !names.is_empty() {
            self.up
                .send(up_message::Msg::Names(NameDictionary { names }))
                .await;
        }
        let events: Vec<NodeEvent> = self.children.subtree().cloned().collect();
        for ev in events {
            self.up.send(up_message::Msg::NodeEvent(ev)).await;
        }
    }

    pub(super) async fn on_parent_message(&mut self, msg: down_message::Msg) {
        match msg {
            down_message::Msg::Welcome(_) => {}
            down_message::Msg::OpenStream(open) => {
                if let Some(spec) = open.spec {
                    self.open_stream(spec.clone()).await;
                    let open = OpenStream {
                        spec: Some(for_children(&spec)),
                    };
                    self.broadcast(down_message::Msg::OpenStream(open)).await;
                }
            }
            down_message::Msg::CloseStream(close) => {
                self.close_stream(close.stream_id).await;
                self.broadcast(down_message::Msg::CloseStream(close)).await;
            }
            down_message::Msg::Control(c) => self.on_control(c).await,
            down_message::Msg::Envelope(env) => self.on_downstream(env).await,
            down_message::Msg::Credit(c) => self.credit.heard(c.below, c.closed_below),
            // The link answers an adopter's request itself, from what it kept.
            down_message::Msg::Resend(_) => {}
            down_message::Msg::Adopted(a) => self.on_adopted_away(a.nodes).await,
            down_message::Msg::RoundsEnded(ended) => self.on_rounds_ended(ended).await,
            down_message::Msg::LiveStreams(table) => {
                // What the parent no longer runs ends here and below.
                for id in self.streams.ids() {
                    if !table.live.contains(&id) {
                        tracing::info!(node = %self.id, stream = id, "the parent does not run stream {id}: closing it");
                        self.close_stream(id).await;
                        let close = canopy_proto::v1::CloseStream { stream_id: id };
                        self.broadcast(down_message::Msg::CloseStream(close)).await;
                    }
                }
            }
        }
    }

    /// Control on its way down: recorded for children that attach later, passed to every child and to the leaf's
    /// ranks. At the leaf a start releases the dumps held for it.
    pub(super) async fn on_control(&mut self, c: Control) {
        let Some(action) = c.action.clone() else { return };
        self.control.record(&c);
        self.broadcast(down_message::Msg::Control(c)).await;
        if let Some(leaf) = &mut self.leaf {
            match &action {
                control::Action::Start(_) => {
                    leaf.start();
                    leaf.window = None;
                }
                control::Action::Stop(_) => leaf.window = None,
                control::Action::Window(w) => {
                    leaf.window = Some((w.from_round, w.to_round));
                    // Every rank reports from the window's first round, one still stopped too: a rank that hears
                    // a start and the window together says nothing before it, so no dump of its would resume it
                    // in time for that round.
                    if self.control.collecting() {
                        self.engine.resume_stopped(w.from_round);
                    }
                }
                _ => {}
            }
            let _ = leaf.options.control.send(action.clone()).await;
            if let control::Action::Drain(_) = action {
                // Before the start, the held detaches go in (as the window moves next) so the leaf can finish.
                self.counters.rank_dumps_dropped += leaf.drain();
            }
        }
        if let control::Action::FinAck(_) = action {
            tracing::info!(node = %self.id, "finished (fin-ack from the root)");
            self.fin_acked = true;
            self.finish = true;
        }
    }

    /// The parent says nodes below this one were adopted elsewhere while it was away: it answers for them no
    /// more.
    pub(super) async fn on_adopted_away(&mut self, nodes: Vec<String>) {
        for node in nodes {
            let Some(way) = self.children.way_from(&self.id, &node) else {
                continue;
            };
            let ranks = self.children.recorded(&node).map_or(0, |ev| ev.ranks_below);
            tracing::info!(node = %self.id, adopted = %node, via = %way, ranks,
                "a node below was adopted elsewhere: this node answers for its ranks no more");
            if way == node {
                let closed = self.engine.forget_source(&node);
                self.on_closed_all(closed).await;
            } else {
                self.engine.ranks_moved_away(&way, ranks);
            }
            self.children.forget(&node);
        }
        self.ranks_changed().await;
    }
}
