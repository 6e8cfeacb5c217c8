//! The latency filter's results as tables: each completed step with its latency and ends, each application's
//! part in it, and the named views resolving the key.

use canopy_proto::filters::v1::{LatencyResult, StepApp, StepLatency};
use canopy_store::{LatencyAppRow, LatencyRow, Select, Store, StoreReader, Table};
use prost::Message;
use rusqlite::Connection;

/// A key whose id's top bit is set: ids are stored as their bits and read back unsigned.
const KEY: u64 = 0x8000_0000_0000_0007;

fn result() -> LatencyResult {
    let step = |step: u64, start: u64, stop: u64| StepLatency {
        key_id: KEY,
        step,
        latency_ns: stop - start,
        start_unix_ns: start,
        start_app: "simulation".into(),
        start_rank: 0,
        stop_unix_ns: stop,
        stop_app: "analysis".into(),
        stop_rank: 3,
        starts: 1,
        stops: 2,
        apps: vec![
            StepApp {
                app: "analysis".into(),
                ranks: 2,
                transfer_us: 1.5,
                compute_us: 30.0,
            },
            StepApp {
                app: "simulation".into(),
                ranks: 1,
                transfer_us: 4.0,
                compute_us: 0.25,
            },
        ],
    };
    LatencyResult {
        steps: vec![step(1, 1_000, 31_000), step(2, 2_000, 40_000)],
        open: 1,
        raw_bytes: 100,
        ..Default::default()
    }
}

#[test]
fn a_latency_result_becomes_steps_and_their_applications() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::create(dir.path()).unwrap();
    store.put_names(&[(KEY, "exchange".to_string())]).unwrap();
    store
        .write_filter_tables(
            4,
            9,
            "canopy.filters.v1.LatencyResult",
            &result().encode_to_vec(),
            false,
        )
        .unwrap();
    let reader = StoreReader::open(store.path()).unwrap();
    let rows = reader.latency(Select::all().stream(4)).unwrap();
    assert_eq!(
        rows[0],
        LatencyRow {
            stream_id: 4,
            round: 9,
            key_id: KEY,
            step: 1,
            latency_ns: 30_000,
            start_unix_ns: 1_000,
            start_app: "simulation".into(),
            start_rank: 0,
            stop_unix_ns: 31_000,
            stop_app: "analysis".into(),
            stop_rank: 3,
            late: false,
        }
    );
    assert_eq!(rows.iter().map(|r| r.step).collect::<Vec<_>>(), [1, 2]);
    let apps = reader.latency_apps(Select::all()).unwrap();
    assert_eq!(apps.len(), 4);
    assert_eq!(
        apps[1],
        LatencyAppRow {
            stream_id: 4,
            round: 9,
            key_id: KEY,
            step: 1,
            app: "simulation".into(),
            ranks: 1,
            transfer_us: 4.0,
            compute_us: 0.25,
            late: false,
        }
    );
    assert_eq!(reader.count(Table::Latency).unwrap(), 2);
    assert_eq!(reader.count(Table::LatencyApps).unwrap(), 4);
    let conn = Connection::open(store.path()).unwrap();
    let strings = |sql: &str| -> Vec<String> {
        let mut st = conn.prepare(sql).unwrap();
        st.query_map([], |r| r.get::<_, String>(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert_eq!(
        strings("SELECT key || ' ' || step || ' ' || latency_ns FROM latency_named ORDER BY step"),
        ["exchange 1 30000", "exchange 2 38000"]
    );
    assert_eq!(
        strings(
            "SELECT key || ' ' || app || ' ' || compute_us FROM latency_apps_named WHERE step = 2 ORDER BY app"
        ),
        ["exchange analysis 30.0", "exchange simulation 0.25"]
    );
}
