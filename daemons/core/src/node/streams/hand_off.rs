//! What a call costs through the table, inline and contained on a stream's thread, against the same call made
//! directly. Prints, never fails on a time: `cargo test -p canopy-core hand_off -- --ignored --nocapture`.

#![allow(
    clippy::disallowed_types,
    reason = "a wall-clock measurement of threads outside tokio's clock"
)]

use super::*;
use crate::filter::{FilterError, FilterInstance, Output, Packet};

/// Sends its first input up: the least a filter does.
struct Echo;

impl FilterInstance for Echo {
    fn upstream(&mut self, _round: u64, phase: u32, inputs: &[&[u8]]) -> Result<Output, FilterError> {
        Ok(Output {
            up: vec![Packet {
                phase,
                payload: inputs[0].to_vec(),
            }],
            ..Default::default()
        })
    }

    fn downstream(&mut self, _round: u64, _phase: u32, _packet: &[u8]) -> Result<Output, FilterError> {
        Ok(Output::default())
    }

    fn finalize(&mut self, _round: u64, _phase: u32, payload: &[u8]) -> Result<Vec<u8>, FilterError> {
        Ok(payload.to_vec())
    }
}

struct EchoFilters;

impl FilterFactory for EchoFilters {
    fn create(&self, _: &str, _: &str, _: Level) -> Result<Box<dyn FilterInstance>, FilterError> {
        Ok(Box::new(Echo))
    }

    fn names(&self) -> Vec<String> {
        vec!["echo".into()]
    }
}

/// Opens stream 1 with `filter` and submits one upstream call to it.
fn open_and_call(table: &mut StreamTable, filter: &str) {
    let spec = StreamSpec {
        stream_id: 1,
        filter: filter.into(),
        timeout_ms: 1000,
        ..Default::default()
    };
    table.open(spec, &HashMap::new()).unwrap();
    let call = Call::Upstream {
        round: 0,
        phase: 0,
        inputs: vec![bytes::Bytes::from_static(b"x")],
    };
    assert!(matches!(table.submit(1, call, Then::Nothing), Queued::Yes));
}

/// A contained call whose answer is back, waiting for the node (held by its own work, an inline call say),
/// is not stuck however late the watchdog looks.
#[tokio::test]
async fn an_answer_waiting_for_the_node_is_not_a_stuck_call() {
    let (mut table, mut done) = StreamTable::new(Arc::new(EchoFilters), Level::Relay);
    open_and_call(&mut table, "echo");
    let answer = done.recv().await.unwrap();
    let late = Instant::now() + DEFAULT_FILTER_CALL_TIMEOUT * 2;
    assert!(table.stuck(late).is_empty());
    assert!(table.done(answer).is_some());
    assert_eq!(table.known(1), Known::Live);
}

/// Holds its upstream call until the gate opens: a call the watchdog finds under way.
struct Gate(Arc<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>);

impl FilterInstance for Gate {
    fn upstream(&mut self, _round: u64, _phase: u32, _inputs: &[&[u8]]) -> Result<Output, FilterError> {
        let _ = self.0.lock().unwrap().recv();
        Ok(Output::default())
    }

    fn downstream(&mut self, _round: u64, _phase: u32, _packet: &[u8]) -> Result<Output, FilterError> {
        Ok(Output::default())
    }

    fn finalize(&mut self, _round: u64, _phase: u32, payload: &[u8]) -> Result<Vec<u8>, FilterError> {
        Ok(payload.to_vec())
    }
}

struct GateFilters(Arc<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>);

impl FilterFactory for GateFilters {
    fn create(&self, _: &str, _: &str, _: Level) -> Result<Box<dyn FilterInstance>, FilterError> {
        Ok(Box::new(Gate(self.0.clone())))
    }

    fn names(&self) -> Vec<String> {
        vec!["gate".into()]
    }
}

/// A call the watchdog first sees far past its time-out was not watched that long (the node's process was
/// stopped): it gets its whole time-out again, and is stuck only if it is still running then.
#[tokio::test]
async fn a_call_found_far_past_its_time_out_gets_its_time_again_and_only_then_is_stuck() {
    let (open, gate) = std::sync::mpsc::channel();
    let filters = GateFilters(Arc::new(std::sync::Mutex::new(gate)));
    let (mut table, _done) = StreamTable::new(Arc::new(filters), Level::Relay);
    open_and_call(&mut table, "gate");
    let submitted = Instant::now();
    // The node wakes 60 s late, as after a SIGSTOP: not the call's fault.
    let resumed = submitted + DEFAULT_FILTER_CALL_TIMEOUT + Duration::from_secs(60);
    assert!(table.stuck(resumed).is_empty());
    assert_eq!(table.known(1), Known::Live);
    // Within its time-out again, still not stuck; past it, on time, it is.
    assert!(table.stuck(resumed + DEFAULT_FILTER_CALL_TIMEOUT / 2).is_empty());
    let failed = table.stuck(resumed + DEFAULT_FILTER_CALL_TIMEOUT);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].1.contains("upstream call stuck"), "{}", failed[0].1);
    let _ = open.send(());
}

/// A stream closed with a call under way and opened again under the same id (a parent that reopens it with
/// another spec): the old call's answer still reaches the closed stream's worker, and nothing is left waiting.
#[tokio::test]
async fn an_answer_reaches_the_closed_streams_worker_after_its_id_is_reopened() {
    for inline in [false, true] {
        let (mut table, mut done) = StreamTable::new(Arc::new(EchoFilters), Level::Relay);
        if inline {
            table.set_inline(["echo".to_string()]);
        }
        let spec = StreamSpec {
            stream_id: 1,
            filter: "echo".into(),
            timeout_ms: 1000,
            ..Default::default()
        };
        table.open(spec.clone(), &HashMap::new()).unwrap();
        let call = Call::Upstream {
            round: 0,
            phase: 0,
            inputs: vec![bytes::Bytes::from_static(b"x")],
        };
        assert!(matches!(table.submit(1, call, Then::Nothing), Queued::Yes));
        assert!(table.close(1).is_some());
        table.open(spec, &HashMap::new()).unwrap();
        assert!(table.busy(), "inline: {inline}");
        let answer = done.recv().await.unwrap();
        assert!(table.done(answer).is_some(), "inline: {inline}");
        assert!(
            !table.busy(),
            "inline: {inline}: a closed stream's call left waiting"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it by name with --ignored --nocapture"]
async fn hand_off_cost_per_call() {
    let (mut table, mut done) = StreamTable::new(Arc::new(EchoFilters), Level::Relay);
    table.set_inline(["inline".to_string()]);
    for (id, filter) in [(1, "inline"), (2, "contained")] {
        let spec = StreamSpec {
            stream_id: id,
            filter: filter.into(),
            timeout_ms: 1000,
            ..Default::default()
        };
        table.open(spec, &HashMap::new()).unwrap();
    }
    let calls = 20_000u64;
    let payload = bytes::Bytes::from(vec![7u8; 64]);
    let mut direct = Echo;
    let started = std::time::Instant::now();
    for round in 0..calls {
        let _ = std::hint::black_box(direct.upstream(round, 0, &[payload.as_ref()]));
    }
    let direct = started.elapsed();
    let mut through = Vec::new();
    for stream in [1, 2] {
        let started = std::time::Instant::now();
        for round in 0..calls {
            let call = Call::Upstream {
                round,
                phase: 0,
                inputs: vec![payload.clone()],
            };
            assert!(matches!(table.submit(stream, call, Then::Nothing), Queued::Yes));
            let answer = done.recv().await.unwrap();
            let _ = std::hint::black_box(table.done(answer));
        }
        through.push(started.elapsed());
    }
    let per_call = |d: Duration| d.as_secs_f64() * 1e6 / calls as f64;
    println!(
        "{calls} calls: direct {:.2} us per call; through the table inline {:.2} us, contained on the stream's \
         thread and back {:.1} us",
        per_call(direct),
        per_call(through[0]),
        per_call(through[1])
    );
}
