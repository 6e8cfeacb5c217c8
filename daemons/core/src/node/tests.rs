//! The node on paused time, with a fake parent, fake children and an in-process filter: wait-for-all, the
//! time-out, a lost child, the window's back pressure, the leaf's hold, and the root's drain and finish.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use canopy_proto::v1::{
    Control, Coverage, Credit, DownMessage, Envelope, Fin, Hello, LiveStreams, MissingReason, NodeEvent,
    NodeKind, NodeState, OpenStream, StreamReady, StreamSpec, SyncMode, control, down_message, up_message,
};
use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::*;
use crate::filter::{FilterError, FilterFactory, FilterInstance, Level, Output, Packet};

/// The downstream and finalize of a test filter that sends nothing down and stores what reaches the root.
macro_rules! quiet_down_and_final {
    () => {
        fn downstream(&mut self, _round: u64, _phase: u32, _packet: &[u8]) -> Result<Output, FilterError> {
            Ok(Output::default())
        }

        fn finalize(&mut self, _round: u64, _phase: u32, payload: &[u8]) -> Result<Vec<u8>, FilterError> {
            Ok(payload.to_vec())
        }
    };
}

/// A filter that sends up the concatenation of its inputs: the merged payload says which packets were merged.
struct Concat;

impl FilterInstance for Concat {
    fn upstream(&mut self, _round: u64, phase: u32, inputs: &[&[u8]]) -> Result<Output, FilterError> {
        let mut payload: Vec<u8> = inputs.iter().flat_map(|i| i.iter().copied()).collect();
        payload.sort_unstable();
        Ok(Output {
            up: vec![Packet { phase, payload }],
            ..Default::default()
        })
    }

    quiet_down_and_final!();
}

/// A filter that sends up its inputs as they came, one after the other (the node stream's tests decode them).
struct Append;

impl FilterInstance for Append {
    fn upstream(&mut self, _round: u64, phase: u32, inputs: &[&[u8]]) -> Result<Output, FilterError> {
        let payload = inputs.iter().flat_map(|i| i.iter().copied()).collect();
        Ok(Output {
            up: vec![Packet { phase, payload }],
            ..Default::default()
        })
    }

    quiet_down_and_final!();
}

/// A filter that sends up the name of the thread it runs on.
struct Where;

impl FilterInstance for Where {
    fn upstream(&mut self, _round: u64, phase: u32, _inputs: &[&[u8]]) -> Result<Output, FilterError> {
        let payload = std::thread::current().name().unwrap_or("").as_bytes().to_vec();
        Ok(Output {
            up: vec![Packet { phase, payload }],
            ..Default::default()
        })
    }

    quiet_down_and_final!();
}

/// A filter whose every upstream call panics, counting its calls (across the tests of this binary).
struct Panics;

static PANICS_CALLED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl FilterInstance for Panics {
    fn upstream(&mut self, _round: u64, _phase: u32, _inputs: &[&[u8]]) -> Result<Output, FilterError> {
        PANICS_CALLED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        panic!("the merge lost its way");
    }

    quiet_down_and_final!();
}

/// Released once a test is done with its stuck calls.
static RELEASE_STUCK: (Mutex<bool>, std::sync::Condvar) = (Mutex::new(false), std::sync::Condvar::new());

/// A filter whose upstream does not return until the test releases it.
struct Stuck;

impl FilterInstance for Stuck {
    fn upstream(&mut self, _round: u64, _phase: u32, _inputs: &[&[u8]]) -> Result<Output, FilterError> {
        let mut released = RELEASE_STUCK.0.lock().unwrap();
        while !*released {
            released = RELEASE_STUCK.1.wait(released).unwrap();
        }
        Ok(Output::default())
    }

    quiet_down_and_final!();
}

/// Released when a test lets the two-phase filter's first phase answer.
static RELEASE_PHASED: (Mutex<bool>, std::sync::Condvar) = (Mutex::new(false), std::sync::Condvar::new());

/// A two-phase filter whose first phase answers only once the test releases it: its inputs go up, and the packet
/// the parent sends down comes back up as the last phase.
struct Phased;

impl FilterInstance for Phased {
    fn upstream(&mut self, _round: u64, phase: u32, inputs: &[&[u8]]) -> Result<Output, FilterError> {
        if phase == 0 {
            let mut released = RELEASE_PHASED.0.lock().unwrap();
            while !*released {
                released = RELEASE_PHASED.1.wait(released).unwrap();
            }
        }
        let payload = inputs.iter().flat_map(|i| i.iter().copied()).collect();
        Ok(Output {
            up: vec![Packet { phase, payload }],
            ..Default::default()
        })
    }

    fn downstream(&mut self, _round: u64, phase: u32, packet: &[u8]) -> Result<Output, FilterError> {
        Ok(Output {
            up: vec![Packet {
                phase,
                payload: packet.to_vec(),
            }],
            ..Default::default()
        })
    }

    fn finalize(&mut self, _round: u64, _phase: u32, payload: &[u8]) -> Result<Vec<u8>, FilterError> {
        Ok(payload.to_vec())
    }

    fn phases(&self) -> u32 {
        2
    }
}

/// A two-phase filter whose first phase goes up and whose second fails: the parent's answer fails the stream.
struct FailsLate;

impl FilterInstance for FailsLate {
    fn upstream(&mut self, _round: u64, phase: u32, inputs: &[&[u8]]) -> Result<Output, FilterError> {
        let payload = inputs.iter().flat_map(|i| i.iter().copied()).collect();
        Ok(Output {
            up: vec![Packet { phase, payload }],
            ..Default::default()
        })
    }

    fn downstream(&mut self, _round: u64, _phase: u32, _packet: &[u8]) -> Result<Output, FilterError> {
        Err(FilterError::Failed {
            filter: "fails-late".into(),
            reason: "cannot read the ranges".into(),
        })
    }

    fn finalize(&mut self, _round: u64, _phase: u32, payload: &[u8]) -> Result<Vec<u8>, FilterError> {
        Ok(payload.to_vec())
    }

    fn phases(&self) -> u32 {
        2
    }
}

/// A two-phase filter as the standard ones are: the root answers the first phase with a packet down, and the
/// nodes below send the second phase up, which the root finalizes.
struct TwoWay {
    level: Level,
}

impl FilterInstance for TwoWay {
    fn upstream(&mut self, _round: u64, phase: u32, inputs: &[&[u8]]) -> Result<Output, FilterError> {
        let payload: Vec<u8> = inputs.iter().flat_map(|i| i.iter().copied()).collect();
        Ok(match (self.level, phase) {
            (Level::Root, 0) => Output {
                down: vec![Packet { phase: 1, payload }],
                ..Default::default()
            },
            _ => Output {
                up: vec![Packet { phase, payload }],
                ..Default::default()
            },
        })
    }

    fn downstream(&mut self, _round: u64, phase: u32, packet: &[u8]) -> Result<Output, FilterError> {
        Ok(Output {
            up: vec![Packet {
                phase,
                payload: packet.to_vec(),
            }],
            ..Default::default()
        })
    }

    fn finalize(&mut self, _round: u64, _phase: u32, payload: &[u8]) -> Result<Vec<u8>, FilterError> {
        Ok(payload.to_vec())
    }

    fn phases(&self) -> u32 {
        2
    }
}

/// Never released: the call of a stream closed while it hangs.
static NEVER: (Mutex<bool>, std::sync::Condvar) = (Mutex::new(false), std::sync::Condvar::new());

/// A filter whose upstream never returns.
struct Hangs;

impl FilterInstance for Hangs {
    fn upstream(&mut self, _round: u64, _phase: u32, _inputs: &[&[u8]]) -> Result<Output, FilterError> {
        let mut released = NEVER.0.lock().unwrap();
        while !*released {
            released = NEVER.1.wait(released).unwrap();
        }
        Ok(Output::default())
    }

    quiet_down_and_final!();
}

struct Filters;

impl FilterFactory for Filters {
    fn create(
        &self,
        name: &str,
        _params: &str,
        level: Level,
    ) -> Result<Box<dyn FilterInstance>, FilterError> {
        match name {
            "concat" => Ok(Box::new(Concat)),
            super::NODES_FILTER => Ok(Box::new(Append)),
            "stuck" => Ok(Box::new(Stuck)),
            "phased" => Ok(Box::new(Phased)),
            "hangs" => Ok(Box::new(Hangs)),
            "fails-late" => Ok(Box::new(FailsLate)),
            "two-way" => Ok(Box::new(TwoWay { level })),
            "where" | "where-contained" => Ok(Box::new(Where)),
            "panics" => Ok(Box::new(Panics)),
            _ => Err(FilterError::Unknown {
                name: name.into(),
                available: "concat".into(),
                suggestion: None,
            }),
        }
    }

    fn names(&self) -> Vec<String> {
        vec!["concat".into()]
    }
}

/// The parent, as the node sees it: every message sent up.
struct TestUp(mpsc::UnboundedSender<up_message::Msg>);

impl Up for TestUp {
    async fn send(&mut self, msg: up_message::Msg) {
        let _ = self.0.send(msg);
    }
}

/// The root's store: results, stream states and recounts.
#[derive(Clone, Default)]
struct TestSink(
    Arc<Mutex<Vec<RoundResult>>>,
    Arc<Mutex<Vec<(u32, StreamState)>>>,
    Arc<Mutex<Vec<Recount>>>,
);

impl RootSink for TestSink {
    fn result(&mut self, result: RoundResult) -> BoxFuture<'_, ()> {
        self.0.lock().unwrap().push(result);
        Box::pin(async {})
    }

    fn stream_state<'a>(
        &'a mut self,
        spec: &'a StreamSpec,
        state: StreamState,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, ()> {
        self.1.lock().unwrap().push((spec.stream_id, state));
        Box::pin(async {})
    }

    fn recount(&mut self, recount: Recount) -> BoxFuture<'_, ()> {
        self.2.lock().unwrap().push(recount);
        Box::pin(async {})
    }

    fn flush(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

const TIMEOUT_MS: u32 = 400;

fn spec(id: u32) -> StreamSpec {
    StreamSpec {
        stream_id: id,
        name: "c".into(),
        filter: "concat".into(),
        sync_mode: SyncMode::WaitForAll as i32,
        timeout_ms: TIMEOUT_MS,
        // As a root sends it when no rank dumps yet; a leaf told none waits for it (see `first_round`).
        first_round: Some(0),
        ..Default::default()
    }
}

struct Harness {
    inputs: mpsc::Sender<Input>,
    window: crate::window::WindowGate,
    up: mpsc::UnboundedReceiver<up_message::Msg>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), NodeError>>,
}

fn start<R: RoleConfig>(role: R, max_in_flight: u64) -> Harness {
    start_with(role, max_in_flight, DEFAULT_FILTER_CALL_TIMEOUT)
}

fn start_with<R: RoleConfig>(role: R, max_in_flight: u64, call_timeout: Duration) -> Harness {
    start_full(role, max_in_flight, call_timeout, &[])
}

fn start_full<R: RoleConfig>(
    role: R,
    max_in_flight: u64,
    call_timeout: Duration,
    inline: &[&str],
) -> Harness {
    let (up_tx, up) = mpsc::unbounded_channel();
    let config = NodeConfig {
        node_id: "n".into(),
        kind: NodeKind::Relay,
        filters: Arc::new(Filters),
        max_rounds_in_flight: max_in_flight,
        status_interval: Duration::from_secs(3600),
    };
    let (mut node, handles) = Node::new(config, role, TestUp(up_tx));
    node.set_filter_call_timeout(call_timeout);
    node.set_inline_filters(&inline.iter().map(|f| f.to_string()).collect::<Vec<_>>());
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(node.run(async {
        let _ = stop_rx.await;
    }));
    Harness {
        inputs: handles.inputs,
        window: handles.window,
        up,
        stop: Some(stop_tx),
        task,
    }
}

impl Harness {
    async fn input(&self, input: Input) {
        self.inputs.send(input).await.unwrap();
    }

    /// Attaches a child with `ranks` below; returns what it receives.
    async fn child(
        &self,
        id: &str,
        conn: u64,
        ranks: u32,
    ) -> mpsc::Receiver<Result<DownMessage, tonic::Status>> {
        let (tx, rx) = mpsc::channel(64);
        let hello = Hello {
            node_id: id.into(),
            ranks_below: ranks,
            ..Default::default()
        };
        self.input(Input::Child(ChildEvent::Attached {
            conn,
            hello,
            peer: String::new(),
            tx,
        }))
        .await;
        rx
    }

    async fn child_sends(&self, id: &str, conn: u64, msg: up_message::Msg) {
        let id = id.into();
        self.input(Input::Child(ChildEvent::Message { conn, id, msg }))
            .await;
    }

    /// Ranks 0..n of `app` attach at round 0, their application announcing n ranks.
    async fn attach_ranks(&self, n: u32) {
        for rank in 0..n {
            let attached = RankEvent::Attached {
                source: rank_source("app", rank),
                from: 0,
                announced: n,
            };
            self.input(Input::Ranks(vec![attached])).await;
        }
    }

    /// The root's Start reaches the node: collection starts at round 0.
    async fn start_collection(&self) {
        let start = Control {
            action: Some(control::Action::Start(root::start(0))),
        };
        let start = down_message::Msg::Control(start);
        self.input(Input::Parent(ParentEvent::Message(start))).await;
    }

    async fn open(&self, id: u32) {
        let open = down_message::Msg::OpenStream(OpenStream { spec: Some(spec(id)) });
        self.input(Input::Parent(ParentEvent::Message(open))).await;
    }

    /// The parent opens stream `id` with `filter` (one of the test filters above).
    async fn open_with(&self, id: u32, filter: &str) {
        let spec = StreamSpec {
            filter: filter.into(),
            ..spec(id)
        };
        let open = down_message::Msg::OpenStream(OpenStream { spec: Some(spec) });
        self.input(Input::Parent(ParentEvent::Message(open))).await;
    }

    /// The next envelope sent up (other messages are skipped).
    async fn envelope(&mut self) -> Envelope {
        loop {
            match self.up.recv().await.expect("node ended") {
                up_message::Msg::Envelope(env) => return env,
                _ => continue,
            }
        }
    }

    async fn fin(&mut self) -> Fin {
        loop {
            match self.up.recv().await.expect("node ended") {
                up_message::Msg::Fin(f) => return f,
                _ => continue,
            }
        }
    }
}

fn packet(stream: u32, round: u64, covered: u32, payload: u8) -> up_message::Msg {
    up_message::Msg::Envelope(Envelope {
        stream_id: stream,
        round,
        coverage: Some(Coverage {
            covered,
            expected: covered,
            missing: vec![],
            apps: vec![],
            unreachable: vec![],
        }),
        payload: vec![payload].into(),
        ..Default::default()
    })
}

#[tokio::test(start_paused = true)]
async fn a_round_closes_when_every_child_delivered() {
    let mut h = start(Relay, 8);
    let t0 = Instant::now();
    let _a = h.child("a", 1, 2).await;
    let _b = h.child("b", 2, 3).await;
    h.open(1).await;
    h.child_sends("a", 1, packet(1, 0, 2, 7)).await;
    h.child_sends("b", 2, packet(1, 0, 3, 9)).await;
    let env = h.envelope().await;
    assert_eq!((env.stream_id, env.round), (1, 0));
    assert_eq!(env.payload, vec![7, 9]);
    let cov = env.coverage.unwrap();
    assert_eq!((cov.covered, cov.expected), (5, 5));
    // Wait-for-all closed it on the last arrival, not on a timer.
    assert!(t0.elapsed() < Duration::from_millis(u64::from(TIMEOUT_MS)));
}

#[tokio::test(start_paused = true)]
async fn a_round_missing_a_child_closes_at_its_time_out_with_the_child_counted_late() {
    let mut h = start(Relay, 8);
    let _a = h.child("a", 1, 2).await;
    let _b = h.child("b", 2, 3).await;
    h.open(1).await;
    let t0 = Instant::now();
    h.child_sends("a", 1, packet(1, 0, 2, 7)).await;
    let env = h.envelope().await;
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(u64::from(TIMEOUT_MS)),
        "closed after {waited:?}"
    );
    let cov = env.coverage.unwrap();
    assert_eq!((cov.covered, cov.expected), (2, 5));
    assert_eq!(cov.missing_for(MissingReason::Late), 3);
    // The child's packet after the close goes up as late, on its own.
    h.child_sends("b", 2, packet(1, 0, 3, 9)).await;
    let late = h.envelope().await;
    assert!(late.late);
    assert_eq!(late.payload, vec![9]);
}

#[tokio::test(start_paused = true)]
async fn a_late_packet_a_relay_sends_up_keeps_none_of_the_buffer_it_was_read_into() {
    // A relay keeps what it sends up until the root has closed its round: a late child's payload, a slice of
    // the buffer its stream was read into, must go up (and be kept) in an allocation of its own, or 16 bytes
    // counted against the bound on kept bytes would keep 1 MiB allocated.
    let mut h = start(Relay, 8);
    let _a = h.child("a", 1, 2).await;
    let _b = h.child("b", 2, 3).await;
    h.open(1).await;
    h.child_sends("a", 1, packet(1, 0, 2, 7)).await;
    let closed = h.envelope().await;
    assert!(!closed.late);
    let buffer = bytes::Bytes::from(vec![9u8; 1 << 20]);
    let up_message::Msg::Envelope(mut env) = packet(1, 0, 3, 0) else {
        unreachable!()
    };
    env.payload = buffer.slice(4096..4112);
    h.child_sends("b", 2, up_message::Msg::Envelope(env)).await;
    let late = h.envelope().await;
    assert!(late.late);
    assert_eq!(late.payload.as_ref(), &[9u8; 16]);
    assert!(
        !buffer.as_ptr_range().contains(&late.payload.as_ptr()),
        "the late packet sent up still points into the buffer its payload was read into"
    );
}

#[tokio::test(start_paused = true)]
async fn a_child_whose_link_ended_closes_its_open_rounds_at_once_as_unreachable_then_lost_past_the_hold() {
    let mut h = start(Relay, 8);
    let _a = h.child("a", 1, 2).await;
    let _b = h.child("b", 2, 3).await;
    h.open(1).await;
    let t0 = Instant::now();
    h.child_sends("a", 1, packet(1, 0, 2, 7)).await;
    let gone = ChildEvent::Gone {
        conn: 2,
        id: "b".into(),
        reason: "reset".into(),
    };
    h.input(Input::Child(gone)).await;
    let env = h.envelope().await;
    assert!(t0.elapsed() < Duration::from_millis(u64::from(TIMEOUT_MS)));
    let cov = env.coverage.unwrap();
    assert_eq!(cov.missing_for(MissingReason::Unreachable), 3);
    assert_eq!(cov.unreachable.len(), 1);
    assert_eq!(
        (cov.unreachable[0].node.as_str(), cov.unreachable[0].ranks),
        ("b", 3)
    );
    // The next round closes with the remaining child alone.
    h.child_sends("a", 1, packet(1, 1, 2, 8)).await;
    let env = h.envelope().await;
    assert_eq!(env.round, 1);
    assert_eq!(env.coverage.unwrap().missing_for(MissingReason::Unreachable), 3);
    // Past the time a child keeps what it sent, its ranks count as lost.
    tokio::time::sleep(crate::transport::kept::OLD_SESSION_HOLD + Duration::from_secs(2)).await;
    h.child_sends("a", 1, packet(1, 2, 2, 9)).await;
    let env = h.envelope().await;
    assert_eq!(env.round, 2);
    let cov = env.coverage.unwrap();
    assert_eq!(cov.missing_for(MissingReason::Lost), 3);
    assert!(cov.unreachable.is_empty());
    // A stale connection's hang-up does nothing.
    let stale = ChildEvent::Gone {
        conn: 99,
        id: "a".into(),
        reason: "old".into(),
    };
    h.input(Input::Child(stale)).await;
    h.child_sends("a", 1, packet(1, 3, 2, 9)).await;
    assert_eq!(h.envelope().await.round, 3);
}

#[tokio::test(start_paused = true)]
async fn the_window_holds_producers_back_until_the_oldest_round_closes() {
    let mut h = start(Relay, 2);
    let _a = h.child("a", 1, 1).await;
    let _b = h.child("b", 2, 1).await;
    h.open(1).await;
    assert!(h.window.admits(1));
    assert!(!h.window.admits(2));
    // Child a runs ahead: rounds 0 and 1 open, and round 2 must wait.
    h.child_sends("a", 1, packet(1, 0, 1, 1)).await;
    h.child_sends("a", 1, packet(1, 1, 1, 1)).await;
    let mut gate = h.window.clone();
    let waiter = tokio::spawn(async move { gate.admit(2).await });
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    // Round 0 closes: the window moves to [1, 3).
    h.child_sends("b", 2, packet(1, 0, 1, 2)).await;
    assert_eq!(h.envelope().await.round, 0);
    assert!(waiter.await.unwrap());
    assert!(!h.window.admits(3));
}

#[tokio::test(start_paused = true)]
async fn with_no_round_open_the_window_moves_to_a_waiting_child() {
    let h = start(Relay, 2);
    let _a = h.child("a", 1, 1).await;
    h.open(1).await;
    let mut gate = h.window.clone();
    // A child rejoining far ahead while nothing is open here is let in, not stalled.
    let admitted = tokio::time::timeout(Duration::from_secs(1), gate.admit(500)).await;
    assert_eq!(admitted, Ok(true));
}

/// The credits a child has heard so far.
fn credits(child: &mut mpsc::Receiver<Result<DownMessage, tonic::Status>>) -> Vec<u64> {
    let mut out = Vec::new();
    while let Ok(Ok(DownMessage { msg: Some(msg) })) = child.try_recv() {
        if let down_message::Msg::Credit(c) = msg {
            out.push(c.below);
        }
    }
    out
}

#[tokio::test(start_paused = true)]
async fn children_hear_the_window_as_credit_when_they_attach_and_as_it_moves() {
    let h = start(Relay, 16);
    let mut a = h.child("a", 1, 1).await;
    h.open(1).await;
    tokio::task::yield_now().await;
    assert_eq!(credits(&mut a), vec![16]);
    // Rounds 0 to 2 close: the limit moves by 3, less than a quarter of the window, and nobody is told.
    for round in 0..3 {
        h.child_sends("a", 1, packet(1, round, 1, 1)).await;
    }
    tokio::task::yield_now().await;
    assert_eq!(credits(&mut a), Vec::<u64>::new());
    assert!(h.window.admits(18), "the window itself did move");
    // Round 3 closes too: the limit has moved a quarter of the window since the credit.
    h.child_sends("a", 1, packet(1, 3, 1, 1)).await;
    tokio::task::yield_now().await;
    assert_eq!(credits(&mut a), vec![20]);
}

#[tokio::test(start_paused = true)]
async fn a_node_caps_its_window_at_its_parents_credit_and_asks_for_more() {
    let mut h = start(Relay, 64);
    let mut a = h.child("a", 1, 1).await;
    h.open(1).await;
    let credit = |below| {
        Input::Parent(ParentEvent::Message(down_message::Msg::Credit(Credit {
            below,
            closed_below: 0,
            taken: 0,
        })))
    };
    h.input(credit(4)).await;
    tokio::task::yield_now().await;
    assert!(h.window.admits(3));
    assert!(!h.window.admits(4), "the parent takes rounds below 4 only");
    // The child hears the capped window, so it sends nothing this node would only hold.
    assert_eq!(credits(&mut a).last(), Some(&4));
    // A producer waiting at round 4 makes the node ask its parent for it, once.
    let mut gate = h.window.clone();
    let waiter = tokio::spawn(async move { gate.admit(4).await });
    let want = loop {
        match h.up.recv().await.expect("node ended") {
            up_message::Msg::Want(w) => break w.round,
            _ => continue,
        }
    };
    assert_eq!(want, 4);
    assert!(!waiter.is_finished());
    // The parent's window moves: the producer goes on.
    h.input(credit(20)).await;
    assert!(waiter.await.unwrap());
    assert!(h.window.admits(19) && !h.window.admits(20));
}

/// A relay with the default window of 64 under a root that lets 4 rounds be in flight: the relay's limit follows
/// the root's credit a round or so at a time and never gets 16 rounds (a quarter of its own window) past what its
/// children heard.
async fn relay_under_a_small_credit() -> (Harness, mpsc::Receiver<Result<DownMessage, tonic::Status>>) {
    let mut h = start(Relay, 64);
    let mut a = h.child("a", 1, 1).await;
    h.open(1).await;
    h.input(parent_credit(4)).await;
    tokio::task::yield_now().await;
    assert_eq!(credits(&mut a).last(), Some(&4));
    for round in 0..4 {
        h.child_sends("a", 1, packet(1, round, 1, 1)).await;
        assert_eq!(h.envelope().await.round, round);
    }
    (h, a)
}

fn parent_credit(below: u64) -> Input {
    Input::Parent(ParentEvent::Message(down_message::Msg::Credit(Credit {
        below,
        closed_below: 0,
        taken: 0,
    })))
}

#[tokio::test(start_paused = true)]
async fn children_hear_a_credit_capped_by_the_parent_as_it_moves_a_quarter_of_what_is_left() {
    let (h, mut a) = relay_under_a_small_credit().await;
    // The root closed rounds 0 to 3: its credit moves on a round at a time, up to 8.
    for below in 5..=8 {
        h.input(parent_credit(below)).await;
    }
    tokio::task::yield_now().await;
    assert!(h.window.admits(7) && !h.window.admits(8));
    // The child waits at round 4: it must hear that the window moved, or the tree stalls.
    let heard = credits(&mut a);
    assert!(
        heard.last().is_some_and(|&c| c > 4),
        "the child still holds a credit of 4 while the window reaches 8: {heard:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_child_waiting_at_a_round_the_window_covers_hears_the_credit() {
    let mut h = start(Relay, 16);
    let mut a = h.child("a", 1, 1).await;
    let _b = h.child("b", 2, 1).await;
    h.open(1).await;
    tokio::task::yield_now().await;
    assert_eq!(credits(&mut a), vec![16]);
    // a delivers up to its credit, b rounds 0 to 2 only: the window moves to [3, 19), less than a quarter on.
    for round in 0..16 {
        h.child_sends("a", 1, packet(1, round, 1, 1)).await;
    }
    for round in 0..3 {
        h.child_sends("b", 2, packet(1, round, 1, 2)).await;
        assert_eq!(h.envelope().await.round, round);
    }
    tokio::task::yield_now().await;
    assert!(h.window.admits(18) && !h.window.admits(19));
    assert_eq!(credits(&mut a), Vec::<u64>::new());
    // a waits at round 16 and says so: the window covers it, so a hears the credit it has not heard yet.
    h.child_sends("a", 1, up_message::Msg::Want(Want { round: 16 }))
        .await;
    tokio::task::yield_now().await;
    assert_eq!(credits(&mut a), vec![19]);
}

#[tokio::test(start_paused = true)]
async fn a_round_under_way_can_finish_whatever_the_credit() {
    let h = start(Relay, 64);
    let _a = h.child("a", 1, 1).await;
    let _b = h.child("b", 2, 1).await;
    h.open(1).await;
    // Round 10 is open here (b has not delivered) when the parent's credit falls to 5, as a parent that
    // restarted would give: b may still deliver round 10.
    h.child_sends("a", 1, packet(1, 10, 1, 1)).await;
    let credit = down_message::Msg::Credit(Credit {
        below: 5,
        closed_below: 0,
        taken: 0,
    });
    h.input(Input::Parent(ParentEvent::Message(credit))).await;
    tokio::task::yield_now().await;
    assert!(h.window.admits(10));
    assert!(!h.window.admits(11));
}

fn root(streams: Vec<StreamSpec>, drain_timeout: Duration, sink: &TestSink) -> RootOptions {
    RootOptions {
        closed_below: Vec::new(),
        resume_ranks: 0,
        resume_wait: std::time::Duration::ZERO,
        first_free_stream_id: 0,
        start_timeout: None,
        expect_ranks: 0,
        streams,
        exit_on_fin: false,
        drain_timeout,
        sink: Box::new(sink.clone()),
    }
}

#[tokio::test(start_paused = true)]
async fn collection_starts_at_the_start_time_out_and_counts_the_ranks_that_never_came_absent() {
    let sink = TestSink::default();
    let role = RootOptions {
        closed_below: Vec::new(),
        resume_ranks: 0,
        resume_wait: std::time::Duration::ZERO,
        first_free_stream_id: 0,
        start_timeout: Some(Duration::from_secs(2)),
        expect_ranks: 8,
        streams: vec![spec(0)],
        exit_on_fin: false,
        drain_timeout: Duration::from_secs(1),
        sink: Box::new(sink.clone()),
    };
    let h = start(role, 8);
    let mut child = h.child("a", 1, 4).await;
    // 4 of the 8 expected ranks: no start yet.
    tokio::time::sleep(Duration::from_millis(1900)).await;
    let started = |child: &mut mpsc::Receiver<Result<DownMessage, tonic::Status>>| {
        let mut seen = false;
        while let Ok(Ok(DownMessage { msg: Some(m) })) = child.try_recv() {
            seen |= matches!(
                m,
                down_message::Msg::Control(Control {
                    action: Some(control::Action::Start(_))
                })
            );
        }
        seen
    };
    assert!(!started(&mut child), "started before the time-out");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(started(&mut child), "not started at the time-out");
    // Its rounds count the 4 ranks that never attached as absent, not as missing data of the ones there.
    h.child_sends("a", 1, packet(1, 0, 4, 3)).await;
    let result = loop {
        if let Some(r) = sink.0.lock().unwrap().first() {
            break r.coverage.clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!((result.covered, result.expected), (4, 8));
    assert_eq!(result.missing_for(MissingReason::Absent), 4);
}

/// Reads what a child is sent until a control message `wanted` accepts.
async fn until_control(
    child: &mut mpsc::Receiver<Result<DownMessage, tonic::Status>>,
    wanted: fn(&control::Action) -> bool,
) {
    loop {
        match child.recv().await {
            Some(Ok(DownMessage {
                msg: Some(down_message::Msg::Control(Control { action: Some(a) })),
            })) if wanted(&a) => return,
            Some(_) => continue,
            None => panic!("the child's stream ended before the control it waits for"),
        }
    }
}

fn leaf() -> (LeafOptions, mpsc::Receiver<control::Action>) {
    let (tx, rx) = mpsc::channel(16);
    let role = LeafOptions {
        control: tx,
        hold_dumps: 8,
        hold_bytes: usize::MAX,
        sampler: None,
    };
    (role, rx)
}

fn rank_round(rank: u32, round: u64) -> Input {
    rank_dump(rank, round, Ok(vec![rank as u8]))
}

/// A rank's dump of `round` saying it stopped.
fn stopped_at(rank: u32, round: u64) -> Input {
    rank_dump(rank, round, Err(MissingReason::Stopped))
}

fn rank_dump(rank: u32, round: u64, profile: Result<Vec<u8>, MissingReason>) -> Input {
    Input::Ranks(vec![RankEvent::Round {
        source: rank_source("app", rank),
        rank,
        round,
        dump_unix_ns: 1,
        profile: profile.map(bytes::Bytes::from),
    }])
}

#[tokio::test(start_paused = true)]
async fn a_leaf_holds_its_ranks_dumps_until_the_start_then_sends_them_round_by_round() {
    let (role, mut ranks_control) = leaf();
    let mut h = start(role, 64);
    h.attach_ranks(2).await;
    // Rank 1 dumps two rounds before the streams are even open; rank 0 one.
    h.input(rank_round(1, 0)).await;
    h.input(rank_round(1, 1)).await;
    h.input(rank_round(0, 0)).await;
    h.open(1).await;
    h.start_collection().await;
    assert!(matches!(
        ranks_control.recv().await,
        Some(control::Action::Start(_))
    ));
    let env = h.envelope().await;
    assert_eq!((env.round, env.payload.to_vec()), (0, vec![0, 1]));
    assert_eq!(env.coverage.unwrap().covered, 2);
    h.input(rank_round(0, 1)).await;
    let env = h.envelope().await;
    assert_eq!((env.round, env.payload.to_vec()), (1, vec![0, 1]));
    // Both ranks finish: the leaf says Fin with the rounds it closed.
    for rank in 0..2 {
        let done = RankEvent::Detached {
            source: rank_source("app", rank),
            finished_end: Some(2),
        };
        h.input(Input::Ranks(vec![done])).await;
    }
    assert_eq!(h.fin().await.rounds_end, 2);
}

/// A leaf that ran rounds 0 to 2 at `gap` apart; its one rank dumps its last round and finishes `then` later.
/// Returns how long after round 2 closed the leaf said Fin, and the rounds it said it closed.
async fn fin_after_last_round(gap: Duration, then: Duration) -> (Duration, u64) {
    let (role, _ranks_control) = leaf();
    let mut h = start(role, 64);
    h.attach_ranks(1).await;
    h.open(1).await;
    h.start_collection().await;
    let mut last_closed = Instant::now();
    for round in 0..3 {
        if round > 0 {
            tokio::time::sleep(gap).await;
        }
        h.input(rank_round(0, round)).await;
        assert_eq!(h.envelope().await.round, round);
        last_closed = Instant::now();
    }
    tokio::time::sleep(then).await;
    let done = RankEvent::Detached {
        source: rank_source("app", 0),
        finished_end: Some(3),
    };
    h.input(Input::Ranks(vec![done])).await;
    let fin = h.fin().await;
    (last_closed.elapsed(), fin.rounds_end)
}

/// Ranks finish together right after their last dump: the leaf's Fin waits until its next round would have
/// closed, so the Fins and what they set off at every level do not share the cores with the last round on its way
/// up (fin_pace.rs). Ranks that finish later finish the leaf at once; the wait is bounded.
#[tokio::test(start_paused = true)]
async fn a_leaf_says_fin_when_its_next_round_would_have_closed() {
    let ms = Duration::from_millis;
    assert_eq!(fin_after_last_round(ms(40), ms(0)).await, (ms(40), 3));
    assert_eq!(fin_after_last_round(ms(40), ms(15)).await, (ms(40), 3));
    assert_eq!(fin_after_last_round(ms(40), ms(100)).await, (ms(100), 3));
    assert_eq!(
        fin_after_last_round(ms(5_000), ms(0)).await,
        (fin_pace::MAX_HOLD, 3)
    );
}

#[tokio::test(start_paused = true)]
async fn a_leaf_past_its_bytes_in_open_rounds_refuses_a_dump_and_counts_it_dropped() {
    let (tx, _ranks_control) = mpsc::channel(16);
    let role = LeafOptions {
        control: tx,
        hold_dumps: 8,
        // Two one-byte dumps fit.
        hold_bytes: 2,
        sampler: None,
    };
    let mut h = start(role, 64);
    h.attach_ranks(3).await;
    h.open(1).await;
    h.start_collection().await;
    for rank in 0..3 {
        h.input(rank_round(rank, 0)).await;
    }
    let env = h.envelope().await;
    assert_eq!((env.round, env.payload.to_vec()), (0, vec![0, 1]));
    let cov = env.coverage.unwrap();
    assert_eq!((cov.covered, cov.missing_for(MissingReason::Dropped)), (2, 1));
    // The round closed, its bytes are free: the next round takes every rank.
    for rank in [2, 0] {
        h.input(rank_round(rank, 1)).await;
    }
    h.input(rank_round(1, 1)).await;
    let env = h.envelope().await;
    assert_eq!(env.round, 1);
    assert_eq!(
        env.coverage.unwrap().covered,
        2,
        "past the bound again, the third is refused"
    );
}

/// The node's sampler in the tests: each sample counts itself in its load.
#[derive(Debug, Default)]
struct CountingSampler(u32);

impl NodeSampler for CountingSampler {
    fn sample(&mut self, sample: &mut canopy_proto::filters::v1::NodeSample) {
        self.0 += 1;
        sample.sample_unix_ns = 1_000 + u64::from(self.0);
        sample.load = Some(canopy_proto::filters::v1::LoadSample {
            runnable: self.0,
            ..Default::default()
        });
    }
}

/// A node stream's leaf input is the node's sample, one per round, named with the node and the ranks the round
/// covers, while its coverage is counted from the ranks as every stream's is: a rank that misses the round counts
/// late, and its late dump adds its coverage alone (the sample went up already). A stream of profiles beside it
/// gets the profiles.
#[tokio::test(start_paused = true)]
async fn a_leaf_feeds_its_node_streams_its_sample_named_with_the_ranks_the_round_covers() {
    use canopy_proto::filters::v1::{NodeSamples, RankRange};
    use prost::Message;
    let (tx, mut ranks_control) = mpsc::channel(16);
    let role = LeafOptions {
        control: tx,
        hold_dumps: 8,
        hold_bytes: usize::MAX,
        sampler: Some(Box::new(CountingSampler::default())),
    };
    let mut h = start(role, 64);
    h.attach_ranks(3).await;
    h.open(1).await;
    let nodes = StreamSpec {
        filter: NODES_FILTER.into(),
        ..spec(2)
    };
    let open = down_message::Msg::OpenStream(OpenStream { spec: Some(nodes) });
    h.input(Input::Parent(ParentEvent::Message(open))).await;
    h.start_collection().await;
    assert!(ranks_control.recv().await.is_some());
    // Ranks 0 and 2 dump round 0; rank 1 is late past the time-out.
    h.input(rank_round(2, 0)).await;
    h.input(rank_round(0, 0)).await;
    let mut by_stream = std::collections::BTreeMap::new();
    while by_stream.len() < 2 {
        let env = h.envelope().await;
        by_stream.insert(env.stream_id, env);
    }
    let profiles = &by_stream[&1];
    assert_eq!((profiles.round, profiles.payload.to_vec()), (0, vec![0, 2]));
    let node = &by_stream[&2];
    let cov = node.coverage.clone().unwrap();
    assert_eq!((cov.covered, cov.expected), (2, 3));
    assert_eq!(cov.missing_for(MissingReason::Late), 1);
    let samples = NodeSamples::decode(node.payload.as_ref()).unwrap();
    assert_eq!(samples.nodes.len(), 1, "one sample per node and round");
    let s = &samples.nodes[0];
    assert_eq!(s.node_id, "n");
    assert_eq!(s.hostname, canopy_runtime::net::hostname());
    let range = |first, last| RankRange {
        app: "app".into(),
        first,
        last,
    };
    assert_eq!(s.ranks, vec![range(0, 0), range(2, 2)]);
    assert_eq!((s.sample_unix_ns, s.load.unwrap().runnable), (1_001, 1));

    // Rank 1's dump of round 0 comes late: the profiles' stream sends its profile up late, the node stream only
    // its coverage.
    h.input(rank_round(1, 0)).await;
    let mut late = std::collections::BTreeMap::new();
    while late.len() < 2 {
        let env = h.envelope().await;
        assert!(env.late, "{env:?}");
        late.insert(env.stream_id, env);
    }
    assert_eq!(late[&1].payload, vec![1]);
    assert!(late[&2].payload.is_empty());
    assert_eq!(late[&2].coverage.clone().unwrap().covered, 1);

    // Round 1: every rank, a new sample.
    for rank in 0..3 {
        h.input(rank_round(rank, 1)).await;
    }
    let node = loop {
        let env = h.envelope().await;
        if env.stream_id == 2 {
            break env;
        }
    };
    let s = NodeSamples::decode(node.payload.as_ref())
        .unwrap()
        .nodes
        .remove(0);
    assert_eq!(
        (node.round, s.ranks, s.sample_unix_ns),
        (1, vec![range(0, 2)], 1_002)
    );
}

#[tokio::test(start_paused = true)]
async fn the_root_drains_on_shutdown_and_finishes_when_its_children_do() {
    let sink = TestSink::default();
    let role = root(vec![spec(0)], Duration::from_secs(30), &sink);
    let mut h = start(role, 8);
    let mut child = h.child("a", 1, 4).await;
    // The child hears the stream (given id 1), then the start: 4 ranks were expected and are there.
    let mut heard = Vec::new();
    while heard.len() < 2 {
        match child.recv().await {
            Some(Ok(DownMessage {
                msg: Some(down_message::Msg::Credit(_)),
            })) => {}
            Some(Ok(DownMessage {
                msg: Some(down_message::Msg::LiveStreams(l)),
            })) => assert_eq!(l.live, [1]),
            Some(Ok(DownMessage { msg: Some(m) })) => heard.push(m),
            _ => {}
        }
    }
    assert!(matches!(&heard[0], down_message::Msg::OpenStream(o) if o.spec.as_ref().unwrap().stream_id == 1));
    assert!(matches!(
        &heard[1],
        down_message::Msg::Control(Control {
            action: Some(control::Action::Start(_))
        })
    ));
    assert_eq!(*sink.1.lock().unwrap(), vec![(1, StreamState::Open)]);
    h.child_sends("a", 1, packet(1, 0, 4, 3)).await;
    h.stop.take().unwrap().send(()).unwrap();
    // The drain goes down; the child delivers one more round and finishes.
    until_control(&mut child, |a| matches!(a, control::Action::Drain(_))).await;
    h.child_sends("a", 1, packet(1, 1, 4, 4)).await;
    h.child_sends(
        "a",
        1,
        up_message::Msg::Fin(Fin {
            node_id: "a".into(),
            rounds_end: 2,
        }),
    )
    .await;
    // Fin-Ack goes down; the root waits for the child to hang up before it ends.
    until_control(&mut child, |a| matches!(a, control::Action::FinAck(_))).await;
    assert!(!h.task.is_finished());
    let gone = ChildEvent::Gone {
        conn: 1,
        id: "a".into(),
        reason: "finished".into(),
    };
    h.input(Input::Child(gone)).await;
    h.task.await.unwrap().unwrap();
    let results = sink.0.lock().unwrap();
    let rounds: Vec<(u64, Vec<u8>, u32)> = results
        .iter()
        .map(|r| (r.round, r.payload.clone(), r.coverage.covered))
        .collect();
    assert_eq!(rounds, vec![(0, vec![3], 4), (1, vec![4], 4)]);
    assert!(results.iter().all(|r| !r.late));
}

/// A child behind the other (its rounds closed without it, its ranks late) finishes before catching up, as a
/// drain ends a subtree that lags: the rounds it never reached are recounted as stopped in the root's store.
#[tokio::test(start_paused = true)]
async fn a_child_that_finishes_behind_the_rounds_that_counted_it_late_is_recounted_stopped() {
    let sink = TestSink::default();
    let role = root(vec![spec(0)], Duration::from_secs(30), &sink);
    let h = start(role, 8);
    let _a = h.child("a", 1, 4).await;
    let _b = h.child("b", 2, 4).await;
    tokio::task::yield_now().await;
    for round in 0..4 {
        h.child_sends("a", 1, packet(1, round, 4, 1)).await;
    }
    h.child_sends("b", 2, packet(1, 0, 4, 2)).await;
    tokio::time::sleep(Duration::from_millis(u64::from(TIMEOUT_MS) * 2)).await;
    let late: Vec<u32> = sink
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|r| !r.late)
        .map(|r| r.coverage.missing_for(MissingReason::Late))
        .collect();
    assert_eq!(late, [0, 4, 4, 4], "rounds 1 to 3 closed without b");
    let fin = up_message::Msg::Fin(Fin {
        node_id: "b".into(),
        rounds_end: 1,
    });
    h.child_sends("b", 2, fin).await;
    tokio::task::yield_now().await;
    let recounts: Vec<(u64, MissingReason, u32)> = sink
        .2
        .lock()
        .unwrap()
        .iter()
        .map(|r| (r.round, r.counted, r.ranks))
        .collect();
    assert_eq!(
        recounts,
        [1, 2, 3].map(|round| (round, MissingReason::Late, 4)),
        "b's rounds ended at 1"
    );
}

/// The same with a two-phase stream whose last phase never comes back: the rounds are stored unfinished, from the
/// coverage the root remembered of their first phase, and the ranks of the child that finished before them count
/// stopped there, not late.
#[tokio::test(start_paused = true)]
async fn a_child_that_finishes_behind_multi_phase_rounds_stored_unfinished_counts_stopped_there() {
    let sink = TestSink::default();
    let two_way = StreamSpec {
        filter: "two-way".into(),
        ..spec(0)
    };
    let role = root(vec![two_way], Duration::from_secs(30), &sink);
    let h = start(role, 8);
    let _a = h.child("a", 1, 4).await;
    let _b = h.child("b", 2, 4).await;
    tokio::task::yield_now().await;
    for round in 0..4 {
        h.child_sends("a", 1, packet(1, round, 4, 1)).await;
    }
    h.child_sends("b", 2, packet(1, 0, 4, 2)).await;
    // Rounds 1 to 3 close without b; no second phase comes back for any round.
    tokio::time::sleep(Duration::from_millis(u64::from(TIMEOUT_MS) * 2)).await;
    let fin = up_message::Msg::Fin(Fin {
        node_id: "b".into(),
        rounds_end: 1,
    });
    h.child_sends("b", 2, fin).await;
    tokio::time::sleep(Duration::from_millis(u64::from(TIMEOUT_MS) * 4 + 2000)).await;
    let mut stored: Vec<(u64, u32, u32)> = sink
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|r| {
            let c = &r.coverage;
            (
                r.round,
                c.missing_for(MissingReason::Late),
                c.missing_for(MissingReason::Stopped),
            )
        })
        .collect();
    stored.sort();
    assert_eq!(
        stored,
        [(0, 8, 0), (1, 4, 4), (2, 4, 4), (3, 4, 4)],
        "a's ranks late in every round; b's late in round 0, which it reached, and stopped after"
    );
    assert!(
        sink.2.lock().unwrap().is_empty(),
        "no row to recount in the store"
    );
}

/// Rounds 1 to 3 closed without b, whose second phase a sends back after b finished before them: their last
/// phase's close counts b's ranks stopped, as b's state then says, with nothing to recount.
#[tokio::test(start_paused = true)]
async fn a_child_that_finishes_behind_multi_phase_rounds_under_way_counts_stopped_when_they_end() {
    let sink = TestSink::default();
    let two_way = StreamSpec {
        filter: "two-way".into(),
        ..spec(0)
    };
    let role = root(vec![two_way], Duration::from_secs(30), &sink);
    let h = start(role, 8);
    let _a = h.child("a", 1, 4).await;
    let _b = h.child("b", 2, 4).await;
    tokio::task::yield_now().await;
    for round in 1..4 {
        h.child_sends("a", 1, packet(1, round, 4, 1)).await;
    }
    tokio::time::sleep(Duration::from_millis(u64::from(TIMEOUT_MS) * 2)).await;
    let fin = up_message::Msg::Fin(Fin {
        node_id: "b".into(),
        rounds_end: 1,
    });
    h.child_sends("b", 2, fin).await;
    for round in 1..4 {
        let up_message::Msg::Envelope(mut env) = packet(1, round, 4, 1) else {
            unreachable!()
        };
        env.phase = 1;
        h.child_sends("a", 1, up_message::Msg::Envelope(env)).await;
    }
    tokio::time::sleep(Duration::from_millis(u64::from(TIMEOUT_MS))).await;
    let mut stored: Vec<(u64, u32, u32, u32)> = sink
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|r| {
            let c = &r.coverage;
            (
                r.round,
                c.covered,
                c.missing_for(MissingReason::Late),
                c.missing_for(MissingReason::Stopped),
            )
        })
        .collect();
    stored.sort();
    assert_eq!(stored, [(1, 4, 0, 4), (2, 4, 0, 4), (3, 4, 0, 4)]);
    assert!(
        sink.2.lock().unwrap().is_empty(),
        "no row to recount in the store"
    );
}

#[tokio::test(start_paused = true)]
async fn a_drain_that_times_out_closes_what_is_open_and_finishes() {
    let sink = TestSink::default();
    let role = root(vec![spec(1)], Duration::from_secs(5), &sink);
    let mut h = start(role, 8);
    let mut a = h.child("a", 1, 1).await;
    let mut b = h.child("b", 2, 1).await;
    // Both attached before the stop: a root with nothing below would finish on the drain at once.
    assert!(a.recv().await.is_some() && b.recv().await.is_some());
    h.child_sends("a", 1, packet(1, 0, 1, 1)).await;
    let t0 = Instant::now();
    h.stop.take().unwrap().send(()).unwrap();
    // Neither child finishes: the drain's time-out ends the run, with round 0 closed partial on the way.
    let ended = tokio::time::timeout(Duration::from_secs(60), &mut h.task).await;
    assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
    assert!(
        t0.elapsed() >= Duration::from_secs(5),
        "ended after {:?}",
        t0.elapsed()
    );
    let results = sink.0.lock().unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].coverage.covered, 1);
    assert_eq!(results[0].coverage.missing_for(MissingReason::Late), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stream_whose_filter_is_unknown_fails_at_the_root_and_is_reported() {
    let sink = TestSink::default();
    let role = root(
        vec![StreamSpec {
            filter: "nope".into(),
            ..spec(1)
        }],
        Duration::from_secs(1),
        &sink,
    );
    let h = start(role, 8);
    let mut child = h.child("a", 1, 1).await;
    // The failed stream is not opened on a child that attaches (it hears control and credit only).
    let first = loop {
        let msg = child.recv().await.unwrap().unwrap();
        match &msg.msg {
            Some(down_message::Msg::Credit(_)) => {}
            // The table of live streams is empty.
            Some(down_message::Msg::LiveStreams(l)) => assert!(l.live.is_empty()),
            _ => break msg,
        }
    };
    assert!(
        matches!(first.msg, Some(down_message::Msg::Control(_))),
        "{first:?}"
    );
    assert_eq!(*sink.1.lock().unwrap(), vec![(1, StreamState::Failed)]);
}

fn control(action: control::Action) -> Input {
    let c = Control { action: Some(action) };
    Input::Parent(ParentEvent::Message(down_message::Msg::Control(c)))
}

fn attached(rank: u32, from: u64) -> RankEvent {
    RankEvent::Attached {
        source: rank_source("app", rank),
        from,
        announced: 0,
    }
}

fn detached(rank: u32, end: u64) -> RankEvent {
    RankEvent::Detached {
        source: rank_source("app", rank),
        finished_end: Some(end),
    }
}

#[tokio::test(start_paused = true)]
async fn a_leaf_drained_before_the_start_drops_its_held_dumps_counted_and_finishes() {
    let (role, _ranks_control) = leaf();
    let mut h = start(role, 64);
    h.input(Input::Ranks(vec![attached(0, 0), attached(1, 0)])).await;
    h.open(1).await;
    // Rank 0 dumps twice and finishes before collection ever starts; rank 1 dumps once.
    h.input(rank_round(0, 0)).await;
    h.input(rank_round(0, 1)).await;
    h.input(Input::Ranks(vec![detached(0, 2)])).await;
    h.input(rank_round(1, 0)).await;
    h.input(control(control::Action::Drain(canopy_proto::v1::Drain {})))
        .await;
    // The drained rank 1 says it finished, as the socket and the simulator do at a drain.
    h.input(Input::Ranks(vec![detached(1, 1)])).await;
    // The leaf does not wait for a start that will not come: it says Fin, with no round closed.
    assert_eq!(h.fin().await.rounds_end, 0);
    // Its next status counts the three dumps it held and dropped.
    tokio::time::advance(Duration::from_secs(3601)).await;
    loop {
        if let Some(up_message::Msg::Status(st)) = h.up.recv().await
            && st.rank_dumps_dropped > 0
        {
            assert_eq!(st.rank_dumps_dropped, 3);
            break;
        }
    }
}

/// A drain finishes a node with nothing below at once: an agent no rank attached to, a relay no child attached
/// to. (They used to wait for a Fin from below that could not come, and the root's drain ran to its time-out.)
#[tokio::test(start_paused = true)]
async fn a_drain_finishes_a_node_with_nothing_below_at_once() {
    let (role, _ranks_control) = leaf();
    let mut leaf = start(role, 64);
    leaf.open(1).await;
    let mut relay = start(Relay, 8);
    relay.open(1).await;
    for h in [&mut leaf, &mut relay] {
        let fin = tokio::time::timeout(Duration::from_millis(100), h.fin()).await;
        assert!(fin.is_err(), "a Fin before the drain: {fin:?}");
        h.input(control(control::Action::Drain(canopy_proto::v1::Drain {})))
            .await;
        let fin = tokio::time::timeout(Duration::from_millis(100), h.fin()).await;
        assert_eq!(fin.expect("no Fin on the drain").rounds_end, 0);
    }
}

#[tokio::test(start_paused = true)]
async fn held_dumps_far_ahead_of_the_window_go_in_without_any_rank_waiting() {
    let (role, _ranks_control) = leaf();
    let mut h = start(role, 4);
    // A rank that re-attached to a restarted agent: its dumps start at round 200, all before the Start.
    h.input(Input::Ranks(vec![attached(0, 200)])).await;
    h.open(1).await;
    for round in 200..206 {
        h.input(rank_round(0, round)).await;
    }
    h.input(Input::Ranks(vec![detached(0, 206)])).await;
    h.input(control(control::Action::Start(root::start(0)))).await;
    // Nothing waits at the window, yet every held round goes up, in order, and the leaf finishes.
    for round in 200..206 {
        assert_eq!(h.envelope().await.round, round);
    }
    assert_eq!(h.fin().await.rounds_end, 206);
}

/// The next message a child hears that is neither a credit nor the table of live streams.
async fn next_told(child: &mut mpsc::Receiver<Result<DownMessage, tonic::Status>>) -> down_message::Msg {
    loop {
        match child.recv().await.unwrap().unwrap().msg {
            Some(down_message::Msg::Credit(_)) | Some(down_message::Msg::LiveStreams(_)) | None => {}
            Some(m) => return m,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_the_parent_replaces_or_no_longer_runs_ends_here_and_below() {
    let mut h = start(Relay, 64);
    let mut a = h.child("a", 1, 1).await;
    // Stream 1 of a filter this node does not have: it fails here.
    let broken = StreamSpec {
        filter: "nope".into(),
        ..spec(1)
    };
    let open = down_message::Msg::OpenStream(OpenStream { spec: Some(broken) });
    h.input(Input::Parent(ParentEvent::Message(open))).await;
    assert!(matches!(
        next_told(&mut a).await,
        down_message::Msg::OpenStream(_)
    ));
    // The parent (a root restarted with another table) reopens id 1 with another spec: the failed stream ends
    // here and the new one runs, so the child's packet goes up through the new filter.
    h.open(1).await;
    assert!(
        matches!(next_told(&mut a).await, down_message::Msg::OpenStream(o) if o.spec.as_ref().unwrap().filter == "concat")
    );
    h.child_sends("a", 1, packet(1, 0, 1, 7)).await;
    let env = tokio::time::timeout(Duration::from_secs(5), h.envelope())
        .await
        .expect("the packet did not go up: the failed stream was kept");
    assert_eq!(
        (env.stream_id, env.round, env.payload.as_ref()),
        (1, 0, &[7u8][..])
    );
    // A parent whose table has no stream 1 any more: it closes here and below.
    let table = down_message::Msg::LiveStreams(LiveStreams { live: vec![] });
    h.input(Input::Parent(ParentEvent::Message(table))).await;
    assert!(matches!(next_told(&mut a).await, down_message::Msg::CloseStream(c) if c.stream_id == 1));
}

#[tokio::test(start_paused = true)]
async fn the_nodes_below_a_lost_child_are_reported_lost_with_it() {
    let mut h = start(Relay, 64);
    let _r = h.child("r", 1, 4).await;
    let agent = NodeEvent {
        node_id: "a".into(),
        parent_id: "r".into(),
        state: NodeState::Attached as i32,
        ranks_below: 4,
        ..Default::default()
    };
    h.child_sends("r", 1, up_message::Msg::NodeEvent(agent)).await;
    h.input(Input::Child(ChildEvent::Gone {
        conn: 1,
        id: "r".into(),
        reason: "reset".into(),
    }))
    .await;
    let lost = loop {
        match h.up.recv().await.expect("node ended") {
            up_message::Msg::NodeEvent(ev) if ev.node_id == "a" && ev.state == NodeState::Lost as i32 => {
                break ev;
            }
            _ => continue,
        }
    };
    assert_eq!(lost.detail, "lost with r, its way to the root");
}

/// A relay "r" with an agent "a" of 8 ranks below it; then, in the order asked, "a" attaches here directly and
/// "r" is lost. Returns the coverage of the next round "a" delivers.
async fn adopted(lost_first: bool) -> Coverage {
    let mut h = start(Relay, 64);
    let _r = h.child("r", 1, 8).await;
    h.open(1).await;
    let below_r = NodeEvent {
        node_id: "a".into(),
        parent_id: "r".into(),
        state: NodeState::Attached as i32,
        ranks_below: 8,
        ..Default::default()
    };
    h.child_sends("r", 1, up_message::Msg::NodeEvent(below_r)).await;
    let gone = Input::Child(ChildEvent::Gone {
        conn: 1,
        id: "r".into(),
        reason: "reset".into(),
    });
    if lost_first {
        h.input(gone).await;
        let _a = h.child("a", 2, 8).await;
        h.child_sends("a", 2, packet(1, 0, 8, 1)).await;
    } else {
        let _a = h.child("a", 2, 8).await;
        h.input(gone).await;
        h.child_sends("a", 2, packet(1, 0, 8, 1)).await;
    }
    tokio::time::timeout(Duration::from_secs(5), h.envelope())
        .await
        .expect("no round went up")
        .coverage
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_node_adopted_from_below_a_lost_child_is_expected_once_whichever_is_heard_first() {
    for lost_first in [true, false] {
        let c = adopted(lost_first).await;
        assert_eq!((c.covered, c.expected), (8, 8), "lost first: {lost_first}: {c:?}");
    }
}

/// The next stream error sent up, skipping other messages; `None` if none comes within `within`.
async fn stream_error(h: &mut Harness, within: Duration) -> Option<canopy_proto::v1::StreamError> {
    let deadline = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, h.up.recv()).await {
            Ok(Some(up_message::Msg::StreamError(e))) => return Some(e),
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => return None,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn inline_filters_run_on_the_nodes_task_and_a_panic_fails_only_their_stream_for_good() {
    let mut h = start_full(Relay, 64, DEFAULT_FILTER_CALL_TIMEOUT, &["where", "panics", ""]);
    let _child = h.child("a", 1, 1).await;
    let open = |id: u32, filter: &str| {
        let mut spec = spec(id);
        spec.filter = filter.into();
        down_message::Msg::OpenStream(OpenStream { spec: Some(spec) })
    };
    for (id, filter) in [(1, "where"), (2, "where-contained"), (3, "panics")] {
        h.input(Input::Parent(ParentEvent::Message(open(id, filter))))
            .await;
    }
    let calls_before = PANICS_CALLED.load(std::sync::atomic::Ordering::SeqCst);
    for round in 0..3 {
        for stream in 1..=3 {
            h.child_sends("a", 1, packet(stream, round, 1, 0)).await;
        }
    }
    let mut threads = std::collections::BTreeMap::new();
    let mut errors = Vec::new();
    while threads.len() < 6 || errors.is_empty() {
        match tokio::time::timeout(Duration::from_secs(5), h.up.recv()).await {
            Ok(Some(up_message::Msg::Envelope(env))) => {
                let thread = String::from_utf8(env.payload.to_vec()).unwrap();
                threads.insert((env.stream_id, env.round), thread);
            }
            Ok(Some(up_message::Msg::StreamError(e))) => errors.push(e),
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => panic!("got {threads:?} and {errors:?}"),
        }
    }
    let here = std::thread::current().name().unwrap_or("").to_string();
    for round in 0..3 {
        // The inline filter answers on the node's own task (this test's only thread); the other on its thread.
        assert_eq!(threads[&(1, round)], here, "round {round}");
        assert_eq!(threads[&(2, round)], "filter-2", "round {round}");
    }
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].stream_id, 3);
    assert!(
        errors[0]
            .reason
            .contains("filter panics failed: upstream panicked: the merge lost its way"),
        "{}",
        errors[0].reason
    );
    // The instance that panicked is never called again.
    assert_eq!(
        PANICS_CALLED.load(std::sync::atomic::Ordering::SeqCst) - calls_before,
        1
    );
}

/// A relay back after its parent lost it, the root having closed every round below 10 without it: the first
/// phases it sends up for those rounds are late there, and no later phase will come down for them, so they do not
/// hold the window (held until the route gave them up, a subtree that fell behind would catch up one window per
/// route time-out). A round the root has not closed waits for its last phase as before.
#[tokio::test(start_paused = true)]
async fn a_multi_phase_round_the_root_closed_without_this_node_does_not_hold_its_window() {
    let mut h = start(Relay, 4);
    let _a = h.child("a", 1, 1).await;
    h.open_with(1, "fails-late").await;
    let credit = down_message::Msg::Credit(Credit {
        below: 100,
        closed_below: 10,
        taken: 0,
    });
    h.input(Input::Parent(ParentEvent::Message(credit))).await;
    for round in 0..10 {
        h.child_sends("a", 1, packet(1, round, 1, 1)).await;
        let env = h.envelope().await;
        assert_eq!((env.round, env.phase), (round, 0));
    }
    let mut gate = h.window.clone();
    assert_eq!(
        tokio::time::timeout(Duration::from_millis(100), gate.admit(13)).await,
        Ok(true),
        "rounds the root closed without this node hold the window"
    );
    h.child_sends("a", 1, packet(1, 10, 1, 1)).await;
    assert_eq!(h.envelope().await.round, 10);
    tokio::task::yield_now().await;
    assert!(h.window.admits(13));
    assert!(!h.window.admits(14), "round 10 waits for its last phase");
}

/// The rounds-ended notices a child has heard so far, as (stream, round).
fn rounds_ended(child: &mut mpsc::Receiver<Result<DownMessage, tonic::Status>>) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    while let Ok(Ok(DownMessage { msg: Some(msg) })) = child.try_recv() {
        if let down_message::Msg::RoundsEnded(e) = msg {
            out.extend(e.rounds.iter().map(|r| (e.stream_id, *r)));
        }
    }
    out
}

/// A child whose first phase of a multi-phase round comes after the round closed here hears that the round ended
/// without it: its later phases go only to the sources that were in it. A child that was in it hears nothing.
#[tokio::test(start_paused = true)]
async fn a_child_late_with_a_first_phase_hears_that_its_round_ended_without_it() {
    let mut h = start(Relay, 8);
    let mut a = h.child("a", 1, 1).await;
    let mut b = h.child("b", 2, 1).await;
    h.open_with(1, "fails-late").await;
    h.child_sends("a", 1, packet(1, 0, 1, 1)).await;
    // Round 0 closes at its time-out without b.
    assert_eq!(h.envelope().await.round, 0);
    h.child_sends("b", 2, packet(1, 0, 1, 2)).await;
    assert!(h.envelope().await.late);
    assert_eq!(rounds_ended(&mut b), vec![(1, 0)]);
    assert_eq!(rounds_ended(&mut a), vec![]);
}

/// The parent says round 0 ended without this node: it stops holding the window at once (not after twice the
/// time-out and a second), and the children that were in it hear the same, so nothing below waits either.
#[tokio::test(start_paused = true)]
async fn a_round_the_parent_ended_without_this_node_frees_its_window_here_and_below() {
    let mut h = start(Relay, 4);
    let mut a = h.child("a", 1, 1).await;
    h.open_with(1, "fails-late").await;
    h.child_sends("a", 1, packet(1, 0, 1, 1)).await;
    assert_eq!(h.envelope().await.round, 0);
    tokio::task::yield_now().await;
    assert!(!h.window.admits(4), "round 0 waits for its last phase");
    let ended = down_message::Msg::RoundsEnded(canopy_proto::v1::RoundsEnded {
        stream_id: 1,
        rounds: vec![0],
    });
    let t0 = Instant::now();
    h.input(Input::Parent(ParentEvent::Message(ended))).await;
    let mut gate = h.window.clone();
    assert_eq!(
        tokio::time::timeout(Duration::from_millis(100), gate.admit(4)).await,
        Ok(true),
        "a round that ended without this node holds its window"
    );
    assert!(t0.elapsed() < Duration::from_millis(u64::from(TIMEOUT_MS)));
    assert_eq!(rounds_ended(&mut a), vec![(1, 0)]);
}

/// Real time: the watchdog measures how long a thread has been in a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_filter_call_fails_only_its_stream_and_a_node_refuses_its_filter_past_the_bound() {
    let mut h = start_with(Relay, 64, Duration::from_millis(200));
    let _child = h.child("a", 1, 1).await;
    let open = |id: u32, filter: &str| {
        let mut spec = spec(id);
        spec.filter = filter.into();
        down_message::Msg::OpenStream(OpenStream { spec: Some(spec) })
    };
    h.input(Input::Parent(ParentEvent::Message(open(1, "concat"))))
        .await;
    h.input(Input::Parent(ParentEvent::Message(open(2, "stuck"))))
        .await;
    let started = Instant::now();
    h.child_sends("a", 1, packet(2, 0, 1, 9)).await;
    h.child_sends("a", 1, packet(1, 0, 1, 1)).await;
    // The other stream goes on while stream 2's call hangs.
    let env = h.envelope().await;
    assert_eq!((env.stream_id, env.round, env.payload.to_vec()), (1, 0, vec![1]));
    let e = stream_error(&mut h, Duration::from_secs(5))
        .await
        .expect("the watchdog fired");
    assert_eq!(e.stream_id, 2);
    assert!(
        e.reason.contains("filter stuck: upstream call stuck for")
            && e.reason.contains("(1 stuck on this node)"),
        "{}",
        e.reason
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    h.child_sends("a", 1, packet(1, 1, 1, 2)).await;
    let env = h.envelope().await;
    assert_eq!((env.stream_id, env.round), (1, 1));

    // Three more stuck calls of the filter reach the bound; the next stream of it is refused at open.
    for id in 3..=5 {
        h.input(Input::Parent(ParentEvent::Message(open(id, "stuck"))))
            .await;
        h.child_sends("a", 1, packet(id, 2, 1, 9)).await;
        let e = stream_error(&mut h, Duration::from_secs(5))
            .await
            .expect("the watchdog fired");
        assert_eq!(e.stream_id, id);
    }
    h.input(Input::Parent(ParentEvent::Message(open(6, "stuck"))))
        .await;
    let e = stream_error(&mut h, Duration::from_secs(5))
        .await
        .expect("refused");
    assert_eq!(e.stream_id, 6);
    assert!(
        e.reason.contains("4 of its calls are stuck on this node"),
        "{}",
        e.reason
    );
    // Other filters still open.
    h.input(Input::Parent(ParentEvent::Message(open(7, "concat"))))
        .await;
    h.child_sends("a", 1, packet(7, 3, 1, 7)).await;
    let env = h.envelope().await;
    assert_eq!((env.stream_id, env.payload.to_vec()), (7, vec![7]));

    // Calls that return after all take their threads off the count: the filter opens again.
    *RELEASE_STUCK.0.lock().unwrap() = true;
    RELEASE_STUCK.1.notify_all();
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.input(Input::Parent(ParentEvent::Message(open(8, "stuck"))))
        .await;
    h.child_sends("a", 1, packet(8, 4, 1, 8)).await;
    assert!(stream_error(&mut h, Duration::from_millis(500)).await.is_none());
}

/// Real time: the first phase's call runs on its stream's thread while the node's loop goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_phase_round_holds_the_window_while_its_filter_computes_and_a_want_is_not_lost() {
    let mut h = start(Relay, 4);
    let _a = h.child("a", 1, 1).await;
    h.open_with(1, "phased").await;
    // Round 0's first phase closes; its call waits. The child waits far ahead, at round 100.
    h.child_sends("a", 1, packet(1, 0, 1, 7)).await;
    h.child_sends("a", 1, up_message::Msg::Want(Want { round: 100 }))
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Round 0 is under way although nothing is open and nothing was emitted yet: the window stays at it (moving
    // to the Want and back when the answer came would forget the Want, and the child would wait for ever).
    assert!(h.window.admits(3));
    assert!(
        !h.window.admits(4),
        "the window moved past a round whose filter had not answered"
    );
    *RELEASE_PHASED.0.lock().unwrap() = true;
    RELEASE_PHASED.1.notify_all();
    let env = h.envelope().await;
    assert_eq!((env.round, env.phase, env.payload.to_vec()), (0, 0, vec![7]));
    assert!(!h.window.admits(4), "round 0 waits for its last phase");
    // The parent's answer comes down; the last phase goes up, and the window moves to the child's Want.
    let down = Envelope {
        stream_id: 1,
        round: 0,
        phase: 1,
        payload: vec![42].into(),
        ..Default::default()
    };
    h.input(Input::Parent(ParentEvent::Message(down_message::Msg::Envelope(
        down,
    ))))
    .await;
    let env = h.envelope().await;
    assert_eq!((env.round, env.phase, env.payload.to_vec()), (0, 1, vec![42]));
    let mut gate = h.window.clone();
    let admitted = tokio::time::timeout(Duration::from_secs(2), gate.admit(100)).await;
    assert_eq!(admitted, Ok(true), "the child's Want was lost");
}

#[tokio::test(start_paused = true)]
async fn a_failed_multi_phase_stream_stops_holding_the_window_at_once() {
    let mut h = start(Relay, 4);
    let _a = h.child("a", 1, 1).await;
    h.open_with(1, "fails-late").await;
    h.child_sends("a", 1, packet(1, 0, 1, 7)).await;
    assert_eq!(h.envelope().await.phase, 0);
    assert!(!h.window.admits(4), "round 0 waits for its last phase");
    let down = Envelope {
        stream_id: 1,
        round: 0,
        phase: 1,
        payload: vec![1].into(),
        ..Default::default()
    };
    let t0 = Instant::now();
    h.input(Input::Parent(ParentEvent::Message(down_message::Msg::Envelope(
        down,
    ))))
    .await;
    let e = stream_error(&mut h, Duration::from_secs(5))
        .await
        .expect("the stream failed");
    assert!(e.reason.contains("cannot read the ranges"), "{}", e.reason);
    // Round 0 will never finish: the window moves on now, not after twice the time-out and a second.
    let mut gate = h.window.clone();
    assert_eq!(
        tokio::time::timeout(Duration::from_millis(100), gate.admit(4)).await,
        Ok(true)
    );
    assert!(t0.elapsed() < Duration::from_millis(u64::from(TIMEOUT_MS)));
}

/// Real time: the watchdog measures how long a thread has been in a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_closed_while_its_call_hangs_does_not_keep_the_node_from_finishing() {
    let mut h = start_with(Relay, 64, Duration::from_millis(200));
    let _a = h.child("a", 1, 1).await;
    h.open_with(1, "hangs").await;
    h.child_sends("a", 1, packet(1, 0, 1, 7)).await;
    // Closed while its call hangs: the close keeps the call to answer its last round.
    let close = down_message::Msg::CloseStream(canopy_proto::v1::CloseStream { stream_id: 1 });
    h.input(Input::Parent(ParentEvent::Message(close))).await;
    h.child_sends(
        "a",
        1,
        up_message::Msg::Fin(Fin {
            node_id: "a".into(),
            rounds_end: 1,
        }),
    )
    .await;
    // The watchdog abandons the closed stream's stuck call too, and the node finishes.
    let fin = tokio::time::timeout(Duration::from_secs(2), h.fin()).await;
    assert_eq!(
        fin.map(|f| f.rounds_end).ok(),
        Some(1),
        "the node waited for a stuck call"
    );
}

/// `canopy ctl stop`, then `start` and a window of rounds: a rank that heard the start and the window together
/// (a slow one, or any stopped rank when the window itself starts a stopped tree) says nothing before the
/// window's first round, yet it was told to report from there, so that round waits for it rather than counting
/// it stopped.
#[tokio::test(start_paused = true)]
async fn a_rank_stopped_when_a_window_comes_is_expected_from_the_windows_first_round() {
    let (role, _ranks_control) = leaf();
    let mut h = start(role, 64);
    h.input(Input::Ranks(vec![attached(0, 0), attached(1, 0)])).await;
    h.open(1).await;
    h.input(control(control::Action::Start(root::start(0)))).await;
    h.input(rank_round(0, 0)).await;
    h.input(rank_round(1, 0)).await;
    assert_eq!(h.envelope().await.round, 0);
    h.input(control(control::Action::Stop(canopy_proto::v1::Stop {})))
        .await;
    h.input(stopped_at(0, 1)).await;
    h.input(stopped_at(1, 1)).await;
    h.input(control(control::Action::Start(root::start(1)))).await;
    // Rank 0 resumes at once; rank 1 is slow to hear the start.
    h.input(rank_round(0, 1)).await;
    h.input(rank_round(0, 2)).await;
    let window = canopy_proto::v1::Window {
        from_round: 4,
        to_round: 5,
    };
    h.input(control(control::Action::Window(window))).await;
    // Rank 0 reports round 3, outside the window, as stopped; rank 1 heard the start and the window together.
    h.input(stopped_at(0, 3)).await;
    h.input(rank_round(0, 4)).await;
    h.input(rank_round(1, 4)).await;
    let env = loop {
        let env = h.envelope().await;
        if env.round == 4 {
            break env;
        }
    };
    let cov = env.coverage.unwrap();
    assert_eq!((cov.covered, cov.expected), (2, 2), "{cov:?}");
}

/// A stream opened while ranks dump: the root waits for the leaves' rounds, sets the highest as the stream's first
/// round, and sends it down; an answer naming a round no leaf can have admitted is taken as the bound instead, so
/// a false one cannot hold the stream off; and with a leaf silent past the wait, the stream starts at that bound.
#[tokio::test(start_paused = true)]
async fn the_root_sets_a_streams_first_round_from_the_leaves_answers_bounded_by_its_window() {
    let sink = TestSink::default();
    let h = start(root(vec![], Duration::from_secs(1), &sink), 64);
    let mut a = h.child("a", 1, 2).await;
    let mut b = h.child("b", 2, 2).await;
    // Collection starts with the first child's ranks.
    for child in [&mut a, &mut b] {
        loop {
            if let down_message::Msg::Control(_) = next_told(child).await {
                break;
            }
        }
    }
    let first_round_told = |m: down_message::Msg| match m {
        down_message::Msg::OpenStream(OpenStream { spec: Some(s) }) => Some((s.stream_id, s.first_round)),
        _ => None,
    };
    let open = |name: &str| {
        Input::Root(RootCommand::OpenStream(
            StreamSpec {
                name: name.into(),
                first_round: Some(0),
                ..spec(0)
            },
            None,
        ))
    };
    h.input(open("honest")).await;
    assert_eq!(first_round_told(next_told(&mut a).await), Some((1, None)));
    let ready_for = |stream_id, next_round| {
        up_message::Msg::StreamReady(StreamReady {
            stream_id,
            next_round,
            ranks: 2,
        })
    };
    h.child_sends("a", 1, ready_for(1, 7)).await;
    h.child_sends("b", 2, ready_for(1, 9)).await;
    assert_eq!(first_round_told(next_told(&mut a).await), Some((1, Some(9))));

    h.input(open("lied to")).await;
    assert_eq!(first_round_told(next_told(&mut a).await), Some((2, None)));
    let lie = up_message::Msg::StreamReady(StreamReady {
        stream_id: 2,
        next_round: u64::MAX,
        ranks: 4,
    });
    h.child_sends("b", 2, lie).await;
    let (id, first) = first_round_told(next_told(&mut a).await).unwrap();
    assert_eq!(id, 2);
    let bound = first.expect("a first round");
    assert!(bound <= 64 + 1, "{bound}");

    // A leaf silent past the root's wait may have dumped any round its credit admitted: the stream starts at the
    // first round the root has not admitted, not at the highest round the other leaves answered.
    h.input(open("one silent")).await;
    assert_eq!(first_round_told(next_told(&mut a).await), Some((3, None)));
    h.child_sends("a", 1, ready_for(3, 5)).await;
    tokio::time::sleep(first_round::ROOT_WAIT).await;
    assert_eq!(first_round_told(next_told(&mut a).await), Some((3, Some(bound))));
}
