//! The child's side of the tree transport: one Attach stream to the parent, re-attached with back-off after a
//! failure, with the copies of what it sent kept until the parent has them.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::time::Duration;

use canopy_proto::v1::tree_client::TreeClient;
use canopy_proto::v1::{DownMessage, Hello, UpMessage, down_message, up_message};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::node::{Input, ParentEvent, Refused};
use crate::run::RunId;

use super::kept::Kept;
use super::{
    CLOSE_TIMEOUT, FLOW_WINDOW, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, MAX_BACKOFF, MAX_MESSAGE_BYTES,
    is_refusal,
};

/// The child's side: keeps one Attach stream to the parent, re-attaching with back-off after failures.
pub struct ParentLink {
    /// The parents this node may attach to, in order of preference: the first, then (when it is lost or cannot
    /// be reached) the next, around the list. An adopted node goes back to the first once it answers again for
    /// `return_after` (if set).
    pub parents: Vec<String>,
    /// The Hello to send; the node keeps it current (its ranks below change as children attach).
    pub hello: watch::Receiver<Hello>,
    pub outbound: mpsc::Receiver<UpMessage>,
    pub inputs: mpsc::Sender<Input>,
    /// The node's certificate and the CA its parent's must chain to; `None`: plaintext (loopback only).
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    /// The node's run, learnt from the first Welcome and said in every Hello.
    pub run: RunId,
    /// Attached to another parent than the first of `parents` (adopted), go back to the first once it has
    /// answered for this long without a break; `None`: stay with the adopter.
    pub return_after: Option<Duration>,
    /// The most bytes of copies kept for resending (a share of the daemon's memory budget); past it the oldest
    /// go, and are counted.
    pub kept_bytes: usize,
}

/// A link's state across its sessions (attachments to a parent): what it sent up and may have to send again.
#[derive(Default)]
struct Sessions {
    /// The current session (counted from 1 as sessions begin).
    current: u64,
    kept: Kept,
    /// Packets an adopter asked for again, sent before anything new.
    again: std::collections::VecDeque<UpMessage>,
    /// The node id of the parent of the last session: the next Hello says it, so the same parent (or one restarted
    /// on its address) asks for what it lacks.
    last_parent: String,
}

impl ParentLink {
    /// Runs until the node stops or the parent refuses this node (then `Input::Refused` is sent).
    pub async fn run(mut self) {
        let mut backoff = Self::backoff();
        let mut failures = 0u32;
        // The last reason logged for each parent: a new one is logged at once.
        let mut last_reason: HashMap<String, String> = HashMap::new();
        let mut pending: Option<UpMessage> = None;
        let mut sessions = Sessions {
            kept: Kept::with_bound(self.kept_bytes),
            ..Sessions::default()
        };
        let mut at = 0usize;
        loop {
            let parent = self.parents.get(at).cloned().unwrap_or_default();
            // Adopted: the preferred parent is watched, to go back to it once it is healthy again.
            let preferred = (at != 0).then(|| self.parents[0].clone());
            match self
                .session(&parent, preferred, &mut pending, &mut sessions)
                .await
            {
                Ok(()) => return,
                Err(SessionEnd::Refused(message)) => {
                    let refused = Refused {
                        parent: parent.clone(),
                        message,
                    };
                    tracing::error!("{refused}");
                    let _ = self
                        .inputs
                        .send(Input::Parent(ParentEvent::Refused(refused)))
                        .await;
                    return;
                }
                Err(SessionEnd::Return) => {
                    sessions
                        .kept
                        .session_ended(sessions.current, tokio::time::Instant::now());
                    let _ = self
                        .inputs
                        .send(Input::Parent(ParentEvent::Lost(
                            "back to the preferred parent".into(),
                        )))
                        .await;
                    at = 0;
                    backoff = Self::backoff();
                    failures = 0;
                    continue;
                }
                Err(SessionEnd::Lost { attached, reason }) => {
                    if attached {
                        sessions
                            .kept
                            .session_ended(sessions.current, tokio::time::Instant::now());
                        backoff = Self::backoff();
                        failures = 0;
                        let _ = self
                            .inputs
                            .send(Input::Parent(ParentEvent::Lost(reason.clone())))
                            .await;
                    }
                    failures += 1;
                    if attached {
                        // Also the normal end of a finished tree, which stops this link right after.
                        tracing::info!(parent = %parent, "parent stream ended: {reason}");
                    } else if failures == 1
                        || failures.is_multiple_of(20)
                        || last_reason.get(&parent) != Some(&reason)
                    {
                        // A TLS fault (another tree's CA, plaintext against TLS) is named at once, and again
                        // whenever the reason changes.
                        let said = canopy_runtime::tls_hint::with_hint(&reason);
                        tracing::warn!(parent = %parent, attempts = failures, "cannot reach parent: {said}");
                    }
                    last_reason.insert(parent.clone(), reason);
                    // The next parent of the list at once; the back-off only once every one of them was tried.
                    if self.parents.len() > 1 {
                        at = (at + 1) % self.parents.len();
                        if !attached && at != 0 {
                            if self.outbound.is_closed() && self.outbound.is_empty() {
                                return;
                            }
                            tracing::info!(parent = %self.parents[at], "trying the next parent");
                            continue;
                        }
                    }
                }
            }
            if self.outbound.is_closed() && self.outbound.is_empty() {
                // The node ended while the parent was away: nothing is left to deliver.
                return;
            }
            tokio::time::sleep(backoff.next().unwrap_or(MAX_BACKOFF)).await;
        }
    }

    /// The delays between rounds of attempts: from 50 ms, doubling to 2 s, each with a random part (up to as
    /// much again) so the children of a lost node do not all retry at the same moments.
    fn backoff() -> backon::ExponentialBackoff {
        use backon::BackoffBuilder;
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(MAX_BACKOFF)
            .with_jitter()
            .without_max_times()
            .build()
    }

    async fn session(
        &mut self,
        parent: &str,
        preferred: Option<String>,
        pending: &mut Option<UpMessage>,
        sessions: &mut Sessions,
    ) -> Result<(), SessionEnd> {
        let client = self.connect(parent).await?;
        let Some(mut up) = self.attach(client, parent, pending, sessions).await? else {
            return Ok(());
        };
        let (back_tx, mut back) = tokio::sync::oneshot::channel::<()>();
        let watch = match (preferred, self.return_after) {
            (Some(addr), Some(hold)) => Some(tokio::spawn(watch_preferred(
                addr,
                self.tls.is_some(),
                hold,
                back_tx,
            ))),
            _ => None,
        };
        let _watch = AbortOnDrop(watch);
        loop {
            if up.send_next(pending, sessions).await? {
                continue;
            }
            tokio::select! {
                out = self.outbound.recv() => match out {
                    Some(msg) => {
                        if up.superseded > 0 {
                            up.superseded -= 1;
                            if is_own_count(&msg, &up.own_id) {
                                continue;
                            }
                        }
                        if let Some(up_message::Msg::Envelope(e)) = &msg.msg {
                            tracing::debug!(target: crate::LATENCY, node = %up.own_id, round = e.round,
                                phase = e.phase, first_dump_ns = e.first_dump_unix_ns, at_ns = crate::node::unix_ns(),
                                "packet out");
                        }
                        *pending = Some(msg)
                    }
                    None => {
                        // The node ended. Ending the up stream lets the parent read everything sent before; it then
                        // ends the down stream, and only then is it certain that nothing was cut off.
                        if !up.close().await {
                            tracing::warn!(parent = %parent, "parent did not end the stream after this node's last message");
                        }
                        return Ok(());
                    }
                },
                Ok(()) = &mut back, if pending.is_none() => {
                    // Between two messages: what was sent is read by this parent before the stream ends.
                    tracing::info!(parent = %parent, preferred = %self.parents[0],
                        "going back to the preferred parent, healthy again");
                    up.close().await;
                    return Err(SessionEnd::Return);
                }
                down = up.inbound.message() => {
                    if let ControlFlow::Break(end) = self.on_down(parent, down, &up.own_id, sessions).await {
                        return end;
                    }
                }
            }
        }
    }

    /// A channel to `parent`, with the tree's TLS, keep-alive and flow-control settings.
    async fn connect(&self, parent: &str) -> Result<TreeClient<tonic::transport::Channel>, SessionEnd> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{}", parent))
            .map_err(|e| SessionEnd::Refused(format!("bad parent address {}: {e}", parent)))?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| SessionEnd::Refused(format!("bad TLS settings: {}", error_chain(&e))))?;
        }
        let endpoint = endpoint
            .connect_timeout(Duration::from_secs(2))
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .initial_stream_window_size(Some(FLOW_WINDOW))
            .initial_connection_window_size(Some(FLOW_WINDOW))
            .tcp_nodelay(true);
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| SessionEnd::lost(false, error_chain(&e)))?;
        Ok(TreeClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// Opens the up stream with this node's Hello and waits for the parent's Welcome; the node hears it is
    /// attached. `None`: the node ended meanwhile.
    async fn attach(
        &mut self,
        mut client: TreeClient<tonic::transport::Channel>,
        parent: &str,
        pending: &mut Option<UpMessage>,
        sessions: &mut Sessions,
    ) -> Result<Option<UpStream>, SessionEnd> {
        // One slot: what the transport has not taken yet is lost if the stream breaks, so keep it small.
        let (tx, rx) = mpsc::channel::<UpMessage>(1);
        // The node queues an event about itself each time its count of ranks changes, after it updates the Hello:
        // those queued before the Hello is read are older than it. Sent after it, they would take the parent back
        // to older counts (ranks that attach one by one while the parent is away: 4, then 1, 2, 3, 4), which it
        // reads as ranks that left before their first dump.
        let superseded = self.outbound.len();
        let hello = Hello {
            returning_from: sessions.last_parent.clone(),
            run_id: self.run.get(),
            ..self.hello.borrow().clone()
        };
        let own_id = hello.node_id.clone();
        if pending.as_ref().is_some_and(|msg| is_own_count(msg, &own_id)) {
            *pending = None;
        }
        let _ = tx
            .send(UpMessage {
                msg: Some(up_message::Msg::Hello(hello)),
            })
            .await;
        let returning = !sessions.last_parent.is_empty();
        let refused_or_lost = |s: tonic::Status, what: String| SessionEnd::of_error(&s, what, returning);
        let response = client.attach(ReceiverStream::new(rx)).await.map_err(|s| {
            let what = format!("{}: {}", s.code(), s.message());
            refused_or_lost(s, what)
        })?;
        let mut inbound = response.into_inner();
        match inbound.message().await {
            Ok(Some(DownMessage {
                msg: Some(down_message::Msg::Welcome(w)),
            })) => {
                if let Err(own) = self.run.learn(&w.run_id) {
                    return Err(SessionEnd::Refused(format!(
                        "parent {} ({parent}) belongs to run {}, this node to run {own}: a parent of another run is \
                         refused (restart this node to join that run)",
                        w.parent_id, w.run_id
                    )));
                }
                tracing::info!(parent = %parent, parent_id = %w.parent_id, run = %w.run_id, "attached to parent");
                sessions.last_parent = w.parent_id;
            }
            Ok(_) => return Err(SessionEnd::lost(false, "parent did not answer with a welcome")),
            Err(s) => {
                let what = s.message().to_string();
                return Err(refused_or_lost(s, what));
            }
        }
        sessions.current += 1;
        let attached = self.inputs.send(Input::Parent(ParentEvent::Attached)).await;
        Ok(attached.is_ok().then_some(UpStream {
            tx,
            inbound,
            superseded,
            own_id,
        }))
    }

    /// A message from the parent: a request to send packets again is answered from what is kept; the rest goes to
    /// the node. `Break` ends the session (with `Ok` when the node ended).
    async fn on_down(
        &mut self,
        parent: &str,
        down: Result<Option<DownMessage>, tonic::Status>,
        own_id: &str,
        sessions: &mut Sessions,
    ) -> ControlFlow<Result<(), SessionEnd>> {
        match down {
            Ok(Some(DownMessage {
                msg: Some(down_message::Msg::Resend(resend)),
            })) => {
                let again = sessions.kept.resend(sessions.current, &resend);
                tracing::debug!(parent = %parent, session = sessions.current,
                    again = ?again.iter().map(|e| (e.stream_id, e.round, e.phase)).collect::<Vec<_>>(),
                    "packets sent again");
                // The span of rounds sent again, for the operator reading how a link came back.
                let lowest = again.iter().map(|e| e.round).min();
                let rounds =
                    lowest.map(|low| format!("{low}-{}", again.iter().map(|e| e.round).max().unwrap_or(low)));
                let rounds = rounds.unwrap_or_default();
                match resend.lost == own_id {
                    true => tracing::info!(parent = %parent, packets = again.len(), rounds = %rounds,
                        "back with the same parent: sending again what it does not hold"),
                    false => {
                        tracing::info!(parent = %parent, lost = %resend.lost, packets = again.len(), rounds = %rounds,
                        "adopted: sending again what the lost node had not passed on")
                    }
                }
                sessions.again.extend(again.into_iter().map(|env| UpMessage {
                    msg: Some(up_message::Msg::Envelope(env)),
                }));
            }
            Ok(Some(DownMessage { msg: Some(msg) })) => {
                if let down_message::Msg::Credit(c) = &msg
                    && c.closed_below > 0
                {
                    sessions.kept.release(sessions.current, c.closed_below, c.taken);
                }
                let input = Input::Parent(ParentEvent::Message(msg));
                if self.inputs.send(input).await.is_err() {
                    return ControlFlow::Break(Ok(()));
                }
            }
            Ok(Some(_)) => {}
            Ok(None) => return ControlFlow::Break(Err(SessionEnd::lost(true, "parent closed the stream"))),
            Err(s) => {
                let reason = format!("{}: {}", s.code(), s.message());
                return ControlFlow::Break(Err(SessionEnd::lost(true, reason)));
            }
        }
        ControlFlow::Continue(())
    }
}

/// An attached session's streams: up, with the node's messages; down, with the parent's.
struct UpStream {
    tx: mpsc::Sender<UpMessage>,
    inbound: tonic::Streaming<DownMessage>,
    /// Messages the node queued before the Hello was read: its own counts among them are older than the Hello.
    superseded: usize,
    own_id: String,
}

impl UpStream {
    /// Sends what is pending, or else the next packet to send again; true while more are to be sent again.
    async fn send_next(
        &self,
        pending: &mut Option<UpMessage>,
        sessions: &mut Sessions,
    ) -> Result<bool, SessionEnd> {
        if pending.is_none() {
            *pending = sessions.again.pop_front();
        }
        let Some(msg) = pending.take() else {
            return Ok(false);
        };
        // A copy of every packet, kept until the root has closed its round: what the parent takes may die with it.
        let copy = match &msg.msg {
            Some(up_message::Msg::Envelope(env)) => Some(env.clone()),
            _ => None,
        };
        if let Err(e) = self.tx.send(msg).await {
            *pending = Some(e.0);
            return Err(SessionEnd::lost(true, "parent stream closed"));
        }
        if let Some(env) = copy {
            sessions.kept.keep(sessions.current, env);
        }
        Ok(!sessions.again.is_empty())
    }

    /// Ends the up stream and reads the down stream to its end, so the parent has read everything sent before;
    /// false if it did not end in time.
    async fn close(self) -> bool {
        let UpStream { tx, mut inbound, .. } = self;
        drop(tx);
        let drained = async { while let Ok(Some(_)) = inbound.message().await {} };
        tokio::time::timeout(CLOSE_TIMEOUT, drained).await.is_ok()
    }
}

/// How often an adopted node checks whether its preferred parent answers.
const PREFERRED_CHECK: Duration = Duration::from_secs(1);

/// Aborts a task when dropped: the preferred parent is watched for as long as the session lasts.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}

/// Says on `back` once the parent at `addr` has answered every check for `hold` without a break.
async fn watch_preferred(addr: String, tls: bool, hold: Duration, back: tokio::sync::oneshot::Sender<()>) {
    let mut since: Option<tokio::time::Instant> = None;
    let mut tick = tokio::time::interval(PREFERRED_CHECK);
    loop {
        tick.tick().await;
        if !answers(&addr, tls).await {
            since = None;
            continue;
        }
        let now = tokio::time::Instant::now();
        if now.duration_since(*since.get_or_insert(now)) >= hold {
            let _ = back.send(());
            return;
        }
    }
}

/// Whether a process serves at `addr`, not just its kernel: a stopped process's port still accepts connections,
/// but nothing answers on them. Over TLS the server's first handshake message, in plaintext its HTTP/2 settings
/// frame, must come within a second.
async fn answers(addr: &str, tls: bool) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let hello: &[u8] = match tls {
            // A TLS 1.2 ClientHello record's header is enough to make a live TLS server answer with an alert.
            true => &[0x16, 0x03, 0x01, 0x00, 0x00],
            false => b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
        };
        s.write_all(hello).await.ok()?;
        let mut buf = [0u8; 9];
        let n = s.read(&mut buf).await.ok()?;
        // An answer, or the connection closed by the server process itself (a TLS server refusing the record).
        Some(n > 0 || tls)
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), probe).await,
        Ok(Some(true))
    )
}

/// Whether `msg` is node `id`'s report of its own count of ranks (an event about a child names the child's parent).
fn is_own_count(msg: &UpMessage, id: &str) -> bool {
    matches!(&msg.msg, Some(up_message::Msg::NodeEvent(ev))
        if ev.node_id == id && ev.parent_id.is_empty() && ev.state == canopy_proto::v1::NodeState::Attached as i32)
}

enum SessionEnd {
    Refused(String),
    Lost {
        attached: bool,
        reason: String,
    },
    /// The session was ended to go back to the preferred parent, which answered for the hold-down time.
    Return,
}

impl SessionEnd {
    fn lost(attached: bool, reason: impl Into<String>) -> Self {
        SessionEnd::Lost {
            attached,
            reason: reason.into(),
        }
    }

    /// How an attach the parent answered with an error ends. A refusal ends the link (another protocol, another
    /// run, a duplicate id), but a node `returning` to the tree whose id the parent still holds is not a duplicate:
    /// its old connection has not been given up there yet (a parent that was stopped, or slow to read, sees the
    /// new attach before the old stream's end), so it tries again, as after any lost attempt.
    fn of_error(s: &tonic::Status, what: String, returning: bool) -> Self {
        match (is_refusal(s.code()), s.code()) {
            (true, tonic::Code::AlreadyExists) if returning => SessionEnd::lost(false, what),
            (true, _) => SessionEnd::Refused(s.message().to_string()),
            (false, _) => SessionEnd::lost(false, what),
        }
    }
}

pub use canopy_runtime::tls_hint::error_chain;

#[cfg(test)]
mod tests {
    use super::*;

    /// A duplicate id ends a first attach, but a returning node tries again: its parent still holds the old
    /// connection it has not seen end. Other refusals end the link either way.
    #[test]
    fn a_returning_node_whose_id_is_still_held_tries_again() {
        let held = tonic::Status::already_exists("node id relay-0 is already attached to frontend");
        let first = SessionEnd::of_error(&held, "held".into(), false);
        assert!(matches!(first, SessionEnd::Refused(ref m) if m.contains("already attached")));
        let back = SessionEnd::of_error(&held, "held".into(), true);
        assert!(matches!(back, SessionEnd::Lost { attached: false, .. }));
        let version = tonic::Status::failed_precondition("protocol version mismatch");
        assert!(matches!(
            SessionEnd::of_error(&version, String::new(), true),
            SessionEnd::Refused(_)
        ));
        let down = tonic::Status::unavailable("connection refused");
        assert!(matches!(
            SessionEnd::of_error(&down, "down".into(), false),
            SessionEnd::Lost { .. }
        ));
    }
}
