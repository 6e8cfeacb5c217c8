//! The store as analysts read it: views with names and units resolved, class membership by rank, the indexes of
//! per-rank and per-event series, and the queries docs/architecture.md prints, run against a real store.

mod common;

use canopy_proto::filters::v1::{
    BinRanges, Class, ClassResult, EventStats, Metric, Outlier, OutlierEvent, OutlierGroup, OutliersResult,
    Quantile, RankRange, RankRef, StatsResult, Summary,
};
use canopy_proto::v1::MissingReason;
use canopy_store::{ENDED, Payload, Store, StreamState, Word};
use common::*;
use prost::Message;
use rusqlite::Connection;

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("canopy-store-analysts-")
        .tempdir()
        .unwrap()
}

fn stat(id: u64, metric: Metric, count: u64, mean: f64) -> EventStats {
    EventStats {
        id,
        metric: metric as i32,
        summary: Some(Summary {
            count,
            mean,
            m2: 0.0,
            std: 0.5,
            min: mean - 1.0,
            max: mean + 1.0,
            min_rank: Some(RankRef {
                app: "sim".into(),
                rank: 2,
            }),
            max_rank: Some(RankRef {
                app: "sim".into(),
                rank: 5,
            }),
        }),
        // The stats filter's p50 and p99 (what a stream with quantiles sends), below and above the mean.
        quantiles: [(0.5, mean - 0.5), (0.99, mean + 0.75)]
            .map(|(q, value)| Quantile { q, value })
            .to_vec(),
        app: String::new(),
    }
}

fn range(app: &str, first: u32, last: u32) -> RankRange {
    RankRange {
        app: app.into(),
        first,
        last,
    }
}

/// A store with a passthrough stream (1), a stats stream (2), a classify stream (3), an outliers stream (4) and
/// a latency stream (5), names for the events, and two classes over the ranks of two applications.
fn populated(dir: &std::path::Path) -> Store {
    let mut store = Store::create(dir).unwrap();
    store
        .put_stream(
            &spec(1),
            StreamState::Open,
            None,
            Some(canopy_store::PROFILE_BATCH_TYPE),
        )
        .unwrap();
    for (id, name) in [(2, "stats"), (3, "classify"), (4, "outliers"), (5, "latency")] {
        let mut s = spec(id);
        s.name = name.into();
        s.filter = name.into();
        store.put_stream(&s, StreamState::Open, None, None).unwrap();
    }
    store
        .put_names(&[(u64::MAX, "MPI_Allreduce".into()), (7, "compute".into())])
        .unwrap();
    for round in 0..3 {
        let batch = profiles("sim", 0..4, 2, 1);
        store
            .write_round(&record(1, round, 4, 4, &[]), Payload::Profiles(&batch))
            .unwrap();
        let stats = StatsResult {
            stats: vec![
                stat(u64::MAX, Metric::Exclusive, 4, 10.0 + round as f64),
                stat(7, Metric::PageFaultsExclusive, 4, 3.0),
                stat(8, Metric::Calls, 4, 2.0),
            ],
            raw_bytes: 1000,
        }
        .encode_to_vec();
        store
            .write_round(
                &record(2, round, 4, 4, &[]),
                Payload::Blob {
                    phase: 1,
                    payload: &stats,
                },
            )
            .unwrap();
        store
            .write_filter_tables(2, round, "canopy.filters.v1.StatsResult", &stats, false)
            .unwrap();
        let classes = ClassResult {
            classes: vec![
                Class {
                    class_id: 11,
                    size: 6,
                    ranks: vec![range("sim", 0, 3), range("sim", 8, 8), range("post", 1, 1)],
                    example_event: "MPI_Allreduce".into(),
                    events: vec![7],
                    counts: vec![2, 4],
                    ..Class::default()
                },
                Class {
                    class_id: 12,
                    size: 4,
                    ranks: vec![range("sim", 4, 7)],
                    example_event: "compute".into(),
                    events: vec![7],
                    counts: vec![1, 3],
                    ..Class::default()
                },
            ],
            raw_bytes: 900,
            result_bytes: 90,
            bins: 2,
            metric: Metric::Exclusive as i32,
            ranges: Some(BinRanges {
                id: vec![7],
                lo: vec![0.0],
                hi: vec![8.0],
            }),
            ..ClassResult::default()
        }
        .encode_to_vec();
        store
            .write_filter_tables(3, round, "canopy.filters.v1.ClassResult", &classes, false)
            .unwrap();
        let outliers = OutliersResult {
            groups: vec![OutlierGroup {
                ranks: 4,
                keep: 1,
                top: vec![Outlier {
                    app: "sim".into(),
                    rank: 3,
                    score: 2.5,
                    events: vec![OutlierEvent {
                        id: 7,
                        value: 9.0,
                        mean: 4.0,
                        std: 2.0,
                        contribution: 2.5,
                        metric: 0,
                    }],
                }],
                ..OutlierGroup::default()
            }],
            within: "all".into(),
            metric: Metric::Exclusive as i32,
            events: "all".into(),
            ..OutliersResult::default()
        }
        .encode_to_vec();
        store
            .write_filter_tables(4, round, "canopy.filters.v1.OutliersResult", &outliers, false)
            .unwrap();
        // Step `round` of "compute" (id 7), started by the simulation and stopped by the analysis.
        let latency = canopy_proto::filters::v1::LatencyResult {
            steps: vec![canopy_proto::filters::v1::StepLatency {
                key_id: 7,
                step: round,
                latency_ns: 30_000_000,
                start_unix_ns: 1_000,
                start_app: "sim".into(),
                stop_unix_ns: 30_001_000,
                stop_app: "analysis".into(),
                starts: 1,
                stops: 1,
                apps: ["analysis", "sim"]
                    .map(|app| canopy_proto::filters::v1::StepApp {
                        app: app.into(),
                        ranks: 1,
                        transfer_us: 10.0,
                        compute_us: 20.0,
                    })
                    .to_vec(),
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec();
        store
            .write_filter_tables(5, round, "canopy.filters.v1.LatencyResult", &latency, false)
            .unwrap();
    }
    store
        .write_round(
            &record(1, 3, 2, 4, &[(MissingReason::Lost, 2)]),
            Payload::Profiles(&profiles("sim", 0..2, 2, 0)),
        )
        .unwrap();
    store
}

#[test]
fn the_views_resolve_names_and_units() {
    let dir = tempdir();
    let store = populated(dir.path());
    let conn = Connection::open(store.path()).unwrap();
    assert_eq!(
        table(
            &conn,
            "SELECT stream, round, event, metric, unit, ranks, mean FROM stats_named
             WHERE round = 1 ORDER BY event_id"
        ),
        [
            // An id with no name shows as its hex.
            "stats|1|MPI_Allreduce|exclusive|us|4|11.0",
            "stats|1|compute|page_faults_exclusive|faults|4|3.0",
            "stats|1|0000000000000008|calls|calls|4|2.0",
        ]
    );
    assert_eq!(
        table(
            &conn,
            "SELECT stream, event, count(*), min(excl_us), max(excl_us) FROM samples_named
             WHERE round = 0 GROUP BY event ORDER BY event"
        ),
        [
            "profiles|MPI_Allreduce|4|0.25|30.25",
            "profiles|fffffffffffffffe|4|1.25|31.25"
        ]
    );
    assert_eq!(
        table(
            &conn,
            "SELECT event, metric, unit, value FROM event_metrics_named
             WHERE round = 0 AND rank = 1 AND event = 'MPI_Allreduce' ORDER BY metric"
        ),
        [
            "MPI_Allreduce|heap_at_entry|bytes|40960.0",
            "MPI_Allreduce|page_faults_exclusive|faults|10.75"
        ]
    );
    assert_eq!(
        table(
            &conn,
            "SELECT counter, value FROM counters_named WHERE round = 0 AND rank = 3"
        ),
        ["000000000000002a|3.5"]
    );
    assert_eq!(
        table(
            &conn,
            "SELECT stream, class_hex, ranks, rank_ranges, example_event FROM classes_named WHERE round = 2"
        ),
        [
            "classify|000000000000000b|6|sim:0-3,8,post:1|MPI_Allreduce",
            "classify|000000000000000c|4|sim:4-7|compute"
        ]
    );
    // Each stats row's quantiles, a row per quantile, named as the stats rows are.
    assert_eq!(
        table(
            &conn,
            "SELECT stream, round, event, metric, unit, q, value FROM stats_quantiles_named
             WHERE round = 1 AND metric = 'exclusive' ORDER BY q"
        ),
        [
            "stats|1|MPI_Allreduce|exclusive|us|0.5|10.5",
            "stats|1|MPI_Allreduce|exclusive|us|0.99|11.75",
        ]
    );
    assert_eq!(
        one_i64(&conn, "SELECT count(*) FROM stats_quantiles WHERE stream_id = 2"),
        3 * 3 * 2
    );
    // Every metric word has its unit, so no value of the views is without one.
    let units = table(&conn, "SELECT metric, unit FROM units ORDER BY metric");
    assert_eq!(units.len(), <Metric as Word>::WORDS.len());
    for expected in [
        "exclusive|us",
        "heap_at_entry|bytes",
        "task_clock_inclusive|ns",
        "calls|calls",
    ] {
        assert!(units.iter().any(|u| u == expected), "{expected} in {units:?}");
    }
    assert_eq!(
        one_i64(&conn, "SELECT count(*) FROM stats_named WHERE unit IS NULL"),
        0
    );
}

#[test]
fn a_ranks_class_is_a_lookup() {
    let dir = tempdir();
    let store = populated(dir.path());
    let conn = Connection::open(store.path()).unwrap();
    // By range, with the index...
    assert_eq!(
        table(
            &conn,
            "SELECT round, class_id FROM class_ranks
             WHERE stream_id = 3 AND app = 'sim' AND 7 BETWEEN first_rank AND last_rank ORDER BY round"
        ),
        ["0|12", "1|12", "2|12"]
    );
    // ...or a row per member.
    assert_eq!(
        table(
            &conn,
            "SELECT class_id, app, rank FROM class_members WHERE round = 0 ORDER BY class_id, app, rank"
        ),
        [
            "11|post|1",
            "11|sim|0",
            "11|sim|1",
            "11|sim|2",
            "11|sim|3",
            "11|sim|8",
            "12|sim|4",
            "12|sim|5",
            "12|sim|6",
            "12|sim|7"
        ]
    );
    // A class's members are as many as its size says.
    assert_eq!(
        table(
            &conn,
            "SELECT c.class_id, c.size, count(m.rank) FROM classes c
             JOIN class_members m USING (stream_id, round, class_id)
             WHERE c.round = 1 GROUP BY c.class_id ORDER BY c.class_id"
        ),
        ["11|6|6", "12|4|4"]
    );
}

fn plan(conn: &Connection, sql: &str) -> String {
    table(conn, &format!("EXPLAIN QUERY PLAN {sql}")).join("\n")
}

#[test]
fn series_are_indexed_by_event_and_by_rank_when_the_run_ends() {
    let dir = tempdir();
    let mut store = populated(dir.path());
    let conn = Connection::open(store.path()).unwrap();
    let by_event = "SELECT round, mean FROM stats WHERE stream_id = 2 AND id = 7 AND metric = 'exclusive'";
    let histogram =
        "SELECT round, bin, count FROM histograms WHERE stream_id = 2 AND id = 7 AND metric = 'exclusive'";
    // While the run is written, a series query scans its stream's rows (by round): the writer keeps no index
    // whose pages a round's rows would land all over.
    assert!(
        !plan(&conn, by_event).contains("stats_by_event"),
        "{}",
        plan(&conn, by_event)
    );
    assert!(!plan(&conn, histogram).contains("histograms_by_event"));
    let by_rank = "SELECT round, excl_us FROM samples WHERE stream_id = 1 AND app = 'sim' AND rank = 3";
    assert!(!plan(&conn, by_rank).contains("samples_by_rank"));
    assert_eq!(
        one_i64(&conn, "SELECT count(*) FROM meta WHERE key = 'ended_unix_ns'"),
        0
    );
    drop(conn);

    store.end_run(1_700_000_000_000_000_000).unwrap();
    let conn = Connection::open(store.path()).unwrap();
    for (sql, index) in [
        (by_event, "stats_by_event"),
        (histogram, "histograms_by_event"),
        (
            "SELECT q, value FROM stats_quantiles WHERE stream_id = 2 AND id = 7 AND metric = 'exclusive'",
            "stats_quantiles_by_event",
        ),
        (by_rank, "samples_by_rank"),
        (
            "SELECT value FROM counters WHERE stream_id = 1 AND app = 'sim' AND rank = 3",
            "counters_by_rank",
        ),
        (
            "SELECT value FROM event_metrics WHERE stream_id = 1 AND app = 'sim' AND rank = 3",
            "event_metrics_by_rank",
        ),
        (
            "SELECT kind FROM trace WHERE stream_id = 1 AND app = 'sim' AND rank = 3",
            "trace_by_rank",
        ),
        // A per-event series over every rank.
        (
            "SELECT round, excl_us FROM samples WHERE stream_id = 1 AND event_id = 7",
            "samples_by_event",
        ),
        (
            "SELECT round, value FROM counters WHERE stream_id = 1 AND counter_id = 7",
            "counters_by_event",
        ),
        (
            "SELECT round, value FROM event_metrics WHERE stream_id = 1 AND event_id = 7 AND metric = 'heap'",
            "event_metrics_by_event",
        ),
    ] {
        assert!(plan(&conn, sql).contains(index), "{index}: {}", plan(&conn, sql));
    }
    assert_eq!(
        table(&conn, &format!("SELECT value FROM meta WHERE key = '{ENDED}'")),
        ["1700000000000000000"]
    );
    // The streams still open ended with the run.
    assert_eq!(
        one_i64(&conn, "SELECT count(*) FROM streams WHERE state = 'open'"),
        0
    );
    assert!(
        one_i64(
            &conn,
            "SELECT count(*) FROM streams WHERE state = 'closed' AND closed_unix_ns > 0"
        ) > 0
    );
    assert_eq!(
        table(
            &conn,
            "SELECT round, excl_us FROM samples WHERE stream_id = 1 AND app = 'sim' AND rank = 1
             AND event_id = -1 ORDER BY round"
        ),
        ["0|10.25", "1|10.25", "2|10.25", "3|10.25"]
    );
    // Ending twice is harmless.
    drop(conn);
    store.end_run(1_700_000_000_000_000_001).unwrap();
}

/// Every SQL query docs/architecture.md §6 prints, and the one in its pandas snippet, runs unchanged against a
/// store written by this version; those over the views return rows.
#[test]
fn the_documented_queries_run_against_a_real_store() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/architecture.md")).unwrap();
    let start = doc
        .find("## 6. The run store")
        .expect("§6 of docs/architecture.md");
    let end = start + doc[start..].find("\n## 7.").expect("§7 follows §6");
    let section = &doc[start..end];
    let mut queries: Vec<String> = section
        .split("```sql\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap().to_string())
        .flat_map(|block| {
            block
                .split(';')
                .map(|q| {
                    q.lines()
                        .filter(|l| !l.trim_start().starts_with("--"))
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .filter(|q| !q.trim().is_empty())
                .collect::<Vec<_>>()
        })
        .collect();
    let python = section
        .split("```python\n")
        .nth(1)
        .expect("the pandas snippet")
        .split("```")
        .next()
        .unwrap();
    let pandas: Vec<String> = python
        .split("read_sql_query(")
        .skip(1)
        .map(|call| {
            let quoted = call.trim_start();
            let quote = quoted.chars().next().unwrap();
            quoted[1..].split(quote).next().unwrap().to_string()
        })
        .collect();
    assert!(!pandas.is_empty(), "the pandas snippet reads with read_sql_query");
    queries.extend(pandas.iter().cloned());
    assert!(queries.len() >= 6, "{queries:#?}");

    let dir = tempdir();
    let mut store = populated(dir.path());
    store.end_run(1).unwrap();
    let conn = Connection::open(store.path()).unwrap();
    for q in &queries {
        let mut st = conn.prepare(q).unwrap_or_else(|e| panic!("{e}: {q}"));
        let n = st.column_count();
        let rows = st
            .query_map([], |r| {
                (0..n)
                    .map(|i| r.get::<_, rusqlite::types::Value>(i))
                    .collect::<Result<Vec<_>, _>>()
            })
            .unwrap_or_else(|e| panic!("{e}: {q}"))
            .count();
        if q.contains("_named") || q.contains("class_") || pandas.contains(q) {
            assert!(rows > 0, "no rows: {q}");
        }
    }
    drop(conn);

    // The snippet itself, where Python has pandas: its frames must not be empty.
    // CANOPY_PYTHON names the interpreter (CI's has pandas, and sets CANOPY_PYTHON_TEST so that it must).
    let interpreter = std::env::var("CANOPY_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let has_pandas = std::process::Command::new(&interpreter)
        .args(["-c", "import pandas"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_pandas {
        assert!(
            std::env::var_os("CANOPY_PYTHON_TEST").is_none(),
            "CANOPY_PYTHON_TEST is set but {interpreter} cannot import pandas"
        );
        eprintln!("{interpreter} with pandas not found: the pandas snippet ran as SQL only");
        return;
    }
    let script = python.replace("runs/latest.sqlite", &store.path().display().to_string())
        + "\nassert len(samples) > 0 and len(per_round.columns) > 0, 'samples'\n"
        + "assert len(stats) > 0 and 'MPI_Allreduce' in means.columns, 'stats'\n";
    let out = std::process::Command::new(&interpreter)
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
