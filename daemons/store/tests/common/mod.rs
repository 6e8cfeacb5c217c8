//! Helpers the store's tests share: a store in a temporary directory, profiles whose every cell is checkable,
//! and rows as the sqlite3 shell prints them.

#![allow(dead_code)]

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use canopy_proto::v1::{
    CounterSample, EventSample, MissingReason, ProfileBatch, RankProfile, StreamSpec, SyncMode, TraceEvent,
    TraceKind,
};
use canopy_store::RoundRecord;
use prost::Message;
use rusqlite::Connection;
use rusqlite::types::Value;

pub fn now_unix_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64
}

/// Rows as the sqlite3 shell prints them (`a|b|c`), with reals always showing a decimal point and NULL
/// spelled out, so one string checks both the values and their storage class.
pub fn table(conn: &Connection, sql: &str) -> Vec<String> {
    let mut st = conn.prepare(sql).unwrap();
    let n = st.column_count();
    let rows = st.query_map([], |row| {
        (0..n)
            .map(|i| row.get::<_, Value>(i))
            .collect::<Result<Vec<_>, _>>()
    });
    rows.unwrap()
        .map(|row| {
            let cells: Vec<String> = row
                .unwrap()
                .into_iter()
                .map(|v| match v {
                    Value::Null => "NULL".to_string(),
                    Value::Integer(i) => i.to_string(),
                    Value::Real(r) => format!("{r:?}"),
                    Value::Text(t) => t,
                    Value::Blob(b) => {
                        b.iter().fold("x'".to_string(), |mut s, x| {
                            let _ = write!(s, "{x:02x}");
                            s
                        }) + "'"
                    }
                })
                .collect();
            cells.join("|")
        })
        .collect()
}

pub fn count(conn: &Connection, table: &str) -> i64 {
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

pub fn one_i64(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// Rank r, event e: calls = 10r + e and every other cell derived from it, so each cell is checkable.
pub fn profiles(app: &str, ranks: std::ops::Range<u32>, events: u64, counters: u64) -> Vec<u8> {
    let profiles = ranks
        .map(|rank| RankProfile {
            app: app.to_string(),
            rank,
            round: 7,
            dump_unix_ns: 1_000 + u64::from(rank),
            events: (0..events)
                .map(|e| {
                    let c = 10 * u64::from(rank) + e;
                    EventSample {
                        event_id: u64::MAX - e,
                        calls: c,
                        subrs: c + 1,
                        incl_us: c as f64 + 0.5,
                        excl_us: c as f64 + 0.25,
                        calls_total: c + 100,
                        subrs_total: c + 101,
                        incl_total_us: c as f64 + 100.5,
                        excl_total_us: c as f64 + 100.25,
                        // Page faults (exclusive), the heap at entry, and a metric no version knows.
                        metrics: vec![c as f64 + 0.75, 4096.0 * c as f64, 1.0],
                        metrics_total: vec![c as f64 + 200.0, 4096.0 * c as f64, 1.0],
                    }
                })
                .collect(),
            counters: (0..counters)
                .map(|k| CounterSample {
                    counter_id: 42 + k,
                    value: f64::from(rank) + 0.5,
                    total: 9.0,
                })
                .collect(),
            metrics: 0,
            event_metrics: vec![19, 40, 999],
            // Step marks are the latency filter's; the store keeps them only inside the profile batch.
            marks: Vec::new(),
            marks_lost: 0,
            // Every rank ships a trace of one activity's begin and end and a send, and rank 1 lost 3 events.
            trace: vec![
                TraceEvent {
                    unix_ns: 10,
                    kind: TraceKind::Begin as i32,
                    id: u64::MAX,
                    ..TraceEvent::default()
                },
                TraceEvent {
                    unix_ns: 11,
                    kind: TraceKind::Send as i32,
                    peer: rank + 1,
                    bytes: 4096,
                    ..TraceEvent::default()
                },
                TraceEvent {
                    unix_ns: 12,
                    kind: TraceKind::End as i32,
                    id: u64::MAX,
                    ..TraceEvent::default()
                },
            ],
            trace_lost: if rank == 1 { 3 } else { 0 },
            utilization: None,
        })
        .collect();
    ProfileBatch { profiles }.encode_to_vec()
}

pub fn record(
    stream_id: u32,
    round: u64,
    covered: u32,
    expected: u32,
    missing: &[(MissingReason, u32)],
) -> RoundRecord {
    RoundRecord {
        stream_id,
        stream_name: format!("s{stream_id}"),
        round,
        covered,
        expected,
        missing: missing.to_vec(),
        first_dump_unix_ns: 1_000,
        closed_unix_ns: 2_000,
        apps: vec![],
        unreachable: vec![],
    }
}

pub fn spec(stream_id: u32) -> StreamSpec {
    StreamSpec {
        stream_id,
        name: "profiles".into(),
        filter: "passthrough".into(),
        params: "{}".into(),
        sync_mode: SyncMode::WaitForAll as i32,
        timeout_ms: 500,
        ranks: String::new(),
        stages: Vec::new(),
        first_round: Some(0),
    }
}
