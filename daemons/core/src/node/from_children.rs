//! What a node's children say: a child attached (admitted, or refused), its messages (packets, status, node
//! events, flow control), and its end; and a node below adopted from one child to another, whose rounds are then
//! asked for again.

use super::*;

impl<U: Up, P: Position> Node<U, P> {
    // ---- children ----

    pub(super) async fn on_child(&mut self, ev: ChildEvent) {
        match ev {
            ChildEvent::Attached {
                conn,
                hello,
                peer,
                tx,
            } => self.on_child_attached(conn, hello, peer, tx).await,
            ChildEvent::Message { conn, id, msg } => {
                if self.children.is_current(&id, conn) {
                    self.on_child_message(id, msg).await;
                } else if let up_message::Msg::Envelope(env) = &msg {
                    tracing::debug!(node = %self.id, child = %id, conn, stream = env.stream_id, round = env.round,
                        phase = env.phase, "packet of an earlier connection dropped");
                }
            }
            ChildEvent::Gone { conn, id, reason } => {
                match self.children.gone(&id, conn, reason.clone(), &self.id) {
                    Some(Gone::Lost(ev, below)) => {
                        tracing::warn!(node = %self.id, child = %id, "child lost: {reason}");
                        let since = SourceState::Unreachable {
                            since: Instant::now(),
                        };
                        let closed = self.engine.set_source_state(&id, since);
                        self.on_closed_all(closed).await;
                        let (moved, own) = self.children.take_moved(&id);
                        if moved > 0 {
                            tracing::info!(node = %self.id, child = %id, ranks = moved,
                                "nodes below the lost child were adopted already: their ranks are expected where they are");
                            self.engine.ranks_moved_away(&id, moved);
                        }
                        self.node_event(ev).await;
                        for ev in below {
                            self.node_event(ev).await;
                        }
                        for adopted in own {
                            self.ask_resend(&adopted, &id).await;
                        }
                    }
                    Some(Gone::Finished) | None => {}
                }
            }
        }
    }

    pub(super) async fn on_child_attached(&mut self, conn: u64, hello: Hello, peer: String, tx: ChildSender) {
        let id = hello.node_id.clone();
        let table = down_message::Msg::LiveStreams(LiveStreams {
            live: self.streams.live_specs().map(|s| s.stream_id).collect(),
        });
        let opens = self.streams.live_specs().map(|spec| {
            down_message::Msg::OpenStream(OpenStream {
                spec: Some(for_children(spec)),
            })
        });
        let controls = self.control.replay().into_iter().map(down_message::Msg::Control);
        // `taken` is the transport's to say, as the credit goes down the child's stream.
        let credit = down_message::Msg::Credit(Credit {
            below: self.window.limit(),
            closed_below: self.closed_below(),
            taken: 0,
        });
        for msg in [table]
            .into_iter()
            .chain(opens.collect::<Vec<_>>())
            .chain(controls)
            .chain([credit])
        {
            let _ = tx.send(Ok(DownMessage { msg: Some(msg) })).await;
        }
        self.children.attach(&id, conn, tx.clone(), hello.ranks_announced);
        let from = self.engine.next_unseen_round();
        let moved = self.engine.rejoin_source(&id, hello.ranks_below, from);
        let adopted = self.children.take_adopted_away(&id);
        if moved > 0 {
            tracing::info!(node = %self.id, child = %id, ranks = moved, from, nodes = ?adopted,
                "a lost child came back after nodes below it were adopted elsewhere: it answers for them no more, \
                 and takes part from round {from} on");
            let msg = down_message::Msg::Adopted(canopy_proto::v1::Adopted { nodes: adopted });
            let _ = tx.send(Ok(DownMessage { msg: Some(msg) })).await;
        }
        let address = if hello.listen_addr.is_empty() {
            peer
        } else {
            hello.listen_addr.clone()
        };
        let ev = NodeEvent {
            node_id: id,
            parent_id: self.id.clone(),
            kind: hello.kind,
            state: NodeState::Attached as i32,
            ranks_below: hello.ranks_below,
            address,
            detail: String::new(),
            ranks_announced: hello.ranks_announced,
        };
        self.node_event(ev).await;
        self.ranks_changed().await;
        if hello.returning_from == self.id {
            // Back on the same parent (a link that broke, or this node restarted on its address): what the child
            // sent in its earlier sessions and this node does not hold is sent again.
            let child = hello.node_id.clone();
            self.ask_resend(&child, &child).await;
        }
    }

    pub(super) async fn on_child_message(&mut self, id: String, msg: up_message::Msg) {
        match msg {
            up_message::Msg::Envelope(env) => {
                self.counters.bytes_in += env.payload.len() as u64;
                self.on_envelope(id, env).await;
            }
            up_message::Msg::Names(dict) => self.on_names(dict.names).await,
            up_message::Msg::NodeEvent(ev) => {
                if ev.ranks_below > MAX_RANKS || ev.ranks_announced > MAX_RANKS {
                    tracing::warn!(node = %self.id, child = %id, ranks_below = ev.ranks_below,
                        ranks_announced = ev.ranks_announced, "node event refused: more than {MAX_RANKS} ranks");
                    self.counters.malformed += 1;
                    return;
                }
                if ev.node_id != id && self.is_stale_view(&id, &ev) {
                    tracing::debug!(node = %self.id, child = %id, about = %ev.node_id,
                        "ignored a child's stale view of a node adopted elsewhere");
                    return;
                }
                if ev.node_id == id {
                    // A relay's count of ranks below changed as its own children came and went; a lower count
                    // than it reported last says ranks below it left before their first dump.
                    if self.engine.set_ranks_below(&id, ev.ranks_below) {
                        tracing::info!(node = %self.id, child = %id, ranks_below = ev.ranks_below,
                            "ranks below a child left before their first dump: rounds from now on expect fewer");
                    }
                    self.children.set_announced(&id, ev.ranks_announced);
                    self.ranks_changed().await;
                }
                self.node_event(ev).await;
            }
            up_message::Msg::Status(st) => self.up.send(up_message::Msg::Status(st)).await,
            // The transport takes a child's Want itself; one that reaches the node counts the same.
            up_message::Msg::Want(w) => self.window.want(w.round),
            up_message::Msg::Fin(fin) => {
                let ev = self.children.finish(&id, &self.id);
                let closed = self
                    .engine
                    .set_source_state(&id, SourceState::Finished { end: fin.rounds_end });
                self.on_closed_all(closed).await;
                let recounts = self.engine.finished_before(&id, fin.rounds_end);
                P::recount(self, recounts).await;
                self.node_event(ev).await;
            }
            up_message::Msg::StreamError(e) => P::stream_failed(self, e, FailedAt::Below).await,
            up_message::Msg::StreamReady(ready) => self.on_stream_ready(ready).await,
            up_message::Msg::Hello(_) => {
                tracing::warn!(node = %self.id, child = %id, "ignored a second hello from a child");
                self.counters.malformed += 1;
            }
        }
    }

    /// Ends every child's stream. After a Fin-Ack went down, waits until the children hang up (or a bound), so
    /// it is not cut off.
    pub(super) async fn close_children(&mut self) {
        let mut waiting = self.children.close_all();
        if !self.fin_acked {
            return;
        }
        let deadline = Instant::now() + CHILDREN_HANG_UP;
        while !waiting.is_empty() {
            let next = tokio::select! {
                input = self.inputs.recv() => input,
                _ = tokio::time::sleep_until(deadline) => None,
            };
            match next {
                Some(Input::Child(ChildEvent::Gone { conn, id, .. })) => {
                    waiting.remove(&(id, conn));
                }
                Some(_) => {}
                None => break,
            }
        }
    }

    /// A node attached below this one that was last known under another child (it was adopted elsewhere below
    /// here, its parent lost or given up): that child answers for its ranks no more, so they are expected once,
    /// where they are now. Returns the lost child when the adopted node is this node's own child: it is asked for
    /// what the lost one did not deliver.
    pub(super) async fn adoption(&mut self, ev: &NodeEvent) -> Option<String> {
        if ev.state != NodeState::Attached as i32 || ev.parent_id.is_empty() {
            return None;
        }
        let known = self.children.recorded(&ev.node_id)?;
        // (Shown lost with its parent, or still attached as far as this node heard.)
        let was_below = [NodeState::Attached as i32, NodeState::Lost as i32].contains(&known.state);
        if known.parent_id == ev.parent_id || !was_below {
            return None;
        }
        let ranks = known.ranks_below;
        let old = self.children.way_from(&self.id, &ev.node_id)?;
        let own_child = ev.parent_id == self.id;
        let new = if own_child {
            Some(ev.node_id.clone())
        } else {
            self.children.way_from(&self.id, &ev.parent_id)
        };
        if new.as_deref() == Some(old.as_str()) {
            return None;
        }
        tracing::info!(node = %self.id, adopted = %ev.node_id, from = %old, ranks,
            "a node below another child was adopted: its ranks are expected where it is now");
        self.engine.ranks_moved_away(&old, ranks);
        self.children.adopted_away(&old, &ev.node_id);
        if self.engine.source_state(&old).is_some_and(SourceState::is_gone) {
            return own_child.then_some(old);
        }
        // `old` is not given up here yet (a stopped relay: its children give it up at their keep-alive time-out,
        // this node a moment later). It hears that the node left it; the adopted node is asked for what `old`
        // held once `old` is lost, when what it delivered is known.
        self.children.moved_from(&ev.node_id, &old, 0, own_child);
        if let Some(tx) = self.children.sender(&old) {
            let adopted = canopy_proto::v1::Adopted {
                nodes: vec![ev.node_id.clone()],
            };
            let msg = Some(down_message::Msg::Adopted(adopted));
            let _ = tx.send(Ok(DownMessage { msg })).await;
        }
        None
    }

    /// Whether `child`'s event about a node below it is out of date: the node is attached here by another way
    /// (it was adopted elsewhere while `child` was away, and `child` still reports it lost).
    pub(super) fn is_stale_view(&self, child: &str, ev: &NodeEvent) -> bool {
        ev.state != NodeState::Attached as i32
            && self
                .children
                .recorded(&ev.node_id)
                .is_some_and(|known| known.state == NodeState::Attached as i32)
            && self.children.way_from(&self.id, &ev.node_id).as_deref() != Some(child)
    }

    /// Tells `child`, adopted after `lost` (its way up before) was lost, which rounds `lost` delivered here, so it
    /// sends again what it had sent up for every other round.
    pub(super) async fn ask_resend(&mut self, child: &str, lost: &str) {
        let Some(tx) = self.children.sender(child) else {
            return;
        };
        let streams = self
            .streams
            .ids()
            .into_iter()
            .filter(|id| self.engine.groups_rounds(*id))
            .map(|stream_id| canopy_proto::v1::StreamRounds {
                stream_id,
                delivered: self
                    .engine
                    .delivered_by(lost, stream_id)
                    .into_iter()
                    .map(|(from, end)| canopy_proto::v1::RoundSpan { from, end })
                    .collect(),
            })
            .collect();
        tracing::info!(node = %self.id, %child, %lost, "asking the adopted child for what the lost node did not deliver");
        tracing::debug!(node = %self.id, %child, %lost, delivered = ?streams, "rounds the lost node delivered");
        let resend = canopy_proto::v1::Resend {
            lost: lost.to_string(),
            streams,
        };
        let _ = tx
            .send(Ok(DownMessage {
                msg: Some(down_message::Msg::Resend(resend)),
            }))
            .await;
    }
}
