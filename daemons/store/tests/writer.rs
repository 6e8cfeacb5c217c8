//! The writer thread: what it takes is stored in order, a round is handed back only once committed, and a
//! flush reports what was stored.

mod common;

use std::sync::{Arc, Mutex};

use canopy_proto::v1::{MissingReason, NodeEvent, NodeKind, NodeState};
use canopy_store::{
    PROFILE_BATCH_TYPE, Round, RoundRecord, RunSummary, Select, Store, StoreReader, StreamState, Writer,
};
use common::*;

fn round(
    stream_id: u32,
    n: u64,
    covered: u32,
    late: bool,
    result_type: &str,
    payload: Vec<u8>,
) -> Round<Vec<u8>> {
    Round {
        record: RoundRecord {
            closed_unix_ns: 0,
            ..record(stream_id, n, covered, 4, &[(MissingReason::Lost, 4 - covered)])
        },
        phase: 0,
        late,
        result_type: result_type.into(),
        payload,
    }
}

#[tokio::test]
async fn rounds_are_handed_back_once_committed_and_a_flush_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path()).unwrap();
    let path = store.path().to_path_buf();
    // Each payload handed back must already be readable from the store.
    let seen: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let (writer, thread) = Writer::spawn(store, 8, {
        let (seen, path) = (seen.clone(), path.clone());
        move |payload: Vec<u8>| {
            let stored = StoreReader::open(&path)
                .unwrap()
                .count(canopy_store::Table::Rounds)
                .unwrap();
            seen.lock().unwrap().push((payload.len(), stored));
        }
    })
    .unwrap();
    let batch = profiles("app", 0..4, 2, 0);
    writer
        .stream(spec(1), StreamState::Open, None, Some(PROFILE_BATCH_TYPE.into()))
        .await;
    writer.names(vec![(1, "a".into())]).await;
    writer
        .node(NodeEvent {
            node_id: "agent:0".into(),
            kind: NodeKind::Agent as i32,
            state: NodeState::Attached as i32,
            ..NodeEvent::default()
        })
        .await;
    writer.meta("rounds_end", "2").await;
    writer
        .round(round(1, 0, 4, false, PROFILE_BATCH_TYPE, batch.clone()))
        .await;
    writer
        .round(round(1, 1, 3, false, PROFILE_BATCH_TYPE, batch.clone()))
        .await;
    writer
        .round(round(1, 1, 1, true, PROFILE_BATCH_TYPE, batch.clone()))
        .await;
    // A batch that does not decode is an error: counted, not stored, not handed back.
    writer
        .round(round(1, 2, 4, false, PROFILE_BATCH_TYPE, vec![0x0a, 0x7f]))
        .await;
    writer
        .round(round(
            2,
            0,
            4,
            false,
            "canopy.filters.v1.RankCount",
            b"blob".to_vec(),
        ))
        .await;
    let summary = writer.flush().await.unwrap();
    assert_eq!(
        summary,
        RunSummary {
            rounds: 3,
            full_rounds: 2,
            late_packets: 1,
            result_bytes: 2 * batch.len() as u64 + 4,
            store_errors: 1,
            store_failed_rounds: 0,
            backlog: 0,
        }
    );
    assert_eq!(
        *seen.lock().unwrap(),
        [(batch.len(), 1), (batch.len(), 2), (batch.len(), 2), (4, 3)]
    );
    drop(writer);
    thread.join();

    let r = StoreReader::open(&path).unwrap();
    let rounds = r.rounds(Select::all()).unwrap();
    assert_eq!(rounds.len(), 3);
    assert!(
        rounds.iter().all(|r| r.closed_unix_ns.is_some_and(|t| t > 2_000)),
        "stamped by the writer"
    );
    assert_eq!((rounds[1].covered, rounds[1].late_ranks), (3, 1));
    assert_eq!(
        r.stored_rounds(&r.stream(1).unwrap().unwrap(), 0).unwrap()[0].payload,
        batch
    );
    assert_eq!(r.results(Select::all()).unwrap()[0].payload, b"blob");
    assert_eq!(r.meta("rounds_end").unwrap().as_deref(), Some("2"));
    assert_eq!(r.names().unwrap(), [(1, "a".to_string())]);
    assert_eq!(r.node("agent:0").unwrap().unwrap().kind, NodeKind::Agent);
}
