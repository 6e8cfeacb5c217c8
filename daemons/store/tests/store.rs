//! The store as the front-end writes it: every column of every table read back with plain SQL, as a user of
//! the file would (this crate is the one place that may).

mod common;

use std::fs;
use std::path::Path;
use std::thread;
use std::time::Duration;

use canopy_proto::v1::{MissingReason, NodeEvent, NodeKind, NodeState, SyncMode};
use canopy_store::{AppRecord, Collision, LATEST, Payload, Store, StoreError, StreamState};
use common::*;
use rusqlite::Connection;

fn tempdir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("canopy-store-{name}-"))
        .tempdir()
        .unwrap()
}

#[test]
fn every_column_reads_back_from_a_fresh_connection() {
    let dir = tempdir("readback");
    let before = now_unix_ns();
    let mut store = Store::create(dir.path()).unwrap();
    store.set_meta("tree", "kary:2^2").unwrap();
    store.put_stream(&spec(1), StreamState::Open, None, None).unwrap();
    let batch = profiles("lulesh", 0..2, 2, 1);
    let rec = record(1, 7, 2, 4, &[(MissingReason::Lost, 2)]);
    store.write_round(&rec, Payload::Profiles(&batch)).unwrap();
    let blob = Payload::Blob {
        phase: 1,
        payload: b"hist",
    };
    store.write_round(&record(2, 7, 4, 4, &[]), blob).unwrap();
    let late = profiles("lulesh", 2..3, 1, 0);
    store
        .write_late(1, 7, 1, late.len() as u64, Payload::Profiles(&late), None)
        .unwrap();
    store.put_names(&[(u64::MAX, "MPI_Allreduce".into())]).unwrap();
    let node = NodeEvent {
        node_id: "n1:0".into(),
        parent_id: "fe:0".into(),
        kind: NodeKind::Agent as i32,
        state: NodeState::Attached as i32,
        ranks_below: 4,
        address: "10.0.0.1:7401".into(),
        detail: String::new(),
        ranks_announced: 0,
    };
    store.put_node(&node).unwrap();
    let path = store.path().to_path_buf();
    // Written through a WAL; a clean close leaves a rollback journal for the readers that come after.
    let open = Connection::open(&path).unwrap();
    assert_eq!(table(&open, "PRAGMA journal_mode"), ["wal"]);
    drop(open);
    drop(store);
    let after = now_unix_ns();
    let recent = |t: i64| assert!(before <= t && t <= after, "{t} not in [{before}, {after}]");

    let conn = Connection::open(&path).unwrap();
    let pid = std::process::id();
    assert_eq!(
        table(
            &conn,
            "SELECT key, value FROM meta WHERE key != 'started_unix_ns' ORDER BY key"
        ),
        [
            format!("pid|{pid}"),
            format!("schema_version|{}", canopy_store::SCHEMA_VERSION),
            "tree|kary:2^2".into()
        ]
    );
    let started: String = conn
        .query_row("SELECT value FROM meta WHERE key = 'started_unix_ns'", [], |r| {
            r.get(0)
        })
        .unwrap();
    recent(started.parse().unwrap());
    assert_eq!(table(&conn, "PRAGMA journal_mode"), ["delete"]);

    assert_eq!(
        table(
            &conn,
            "SELECT stream_id, name, filter, params, sync_mode, timeout_ms, state, failure, closed_unix_ns
             FROM streams"
        ),
        ["1|profiles|passthrough|{}|wait_for_all|500|open|NULL|NULL"]
    );
    recent(one_i64(&conn, "SELECT opened_unix_ns FROM streams"));

    // Columns: ids, coverage, the seven reasons, the summary, late ranks, bytes, pieces, times.
    assert_eq!(
        table(
            &conn,
            "SELECT stream_id, stream_name, round, covered, expected,
                    missing_late, missing_lost, missing_stopped, missing_sampled_out, missing_malformed,
                    missing_not_waited, missing_unspecified, missing_reason,
                    late_ranks, result_bytes, pieces, first_dump_unix_ns, closed_unix_ns
             FROM rounds ORDER BY stream_id"
        ),
        [
            format!("1|s1|7|2|4|0|2|0|0|0|0|0|lost: 2|1|{}|1|1000|2000", batch.len()),
            "2|s2|7|4|4|0|0|0|0|0|0|0|NULL|0|4|1|1000|2000".into(),
        ]
    );

    // event_id -1 and -2 are u64::MAX and u64::MAX - 1: the id's bits, not a clamped value.
    assert_eq!(
        table(
            &conn,
            "SELECT stream_id, round, app, rank, event_id, calls, subrs, incl_us, excl_us, calls_total,
                    subrs_total, incl_total_us, excl_total_us, dump_unix_ns, late
             FROM samples ORDER BY late, rank, event_id DESC"
        ),
        [
            "1|7|lulesh|0|-1|0|1|0.5|0.25|100|101|100.5|100.25|1000|0",
            "1|7|lulesh|0|-2|1|2|1.5|1.25|101|102|101.5|101.25|1000|0",
            "1|7|lulesh|1|-1|10|11|10.5|10.25|110|111|110.5|110.25|1001|0",
            "1|7|lulesh|1|-2|11|12|11.5|11.25|111|112|111.5|111.25|1001|0",
            "1|7|lulesh|2|-1|20|21|20.5|20.25|120|121|120.5|120.25|1002|1",
        ]
    );
    assert_eq!(
        table(
            &conn,
            "SELECT stream_id, round, app, rank, counter_id, value, total, dump_unix_ns, late
             FROM counters ORDER BY rank"
        ),
        ["1|7|lulesh|0|42|0.5|9.0|1000|0", "1|7|lulesh|1|42|1.5|9.0|1001|0"]
    );
    // Each rank's trace, one row per event (the late rank's marked), and the events rank 1 lost.
    assert_eq!(
        table(
            &conn,
            "SELECT stream_id, round, app, rank, thread, unix_ns, kind, event_id, peer, bytes, late
             FROM trace ORDER BY rank, unix_ns"
        ),
        [
            "1|7|lulesh|0|0|10|begin|-1|NULL|NULL|0",
            "1|7|lulesh|0|0|11|send|NULL|1|4096|0",
            "1|7|lulesh|0|0|12|end|-1|NULL|NULL|0",
            "1|7|lulesh|1|0|10|begin|-1|NULL|NULL|0",
            "1|7|lulesh|1|0|11|send|NULL|2|4096|0",
            "1|7|lulesh|1|0|12|end|-1|NULL|NULL|0",
            "1|7|lulesh|2|0|10|begin|-1|NULL|NULL|1",
            "1|7|lulesh|2|0|11|send|NULL|3|4096|1",
            "1|7|lulesh|2|0|12|end|-1|NULL|NULL|1",
        ]
    );
    assert_eq!(
        table(&conn, "SELECT stream_id, round, app, rank, lost FROM trace_lost"),
        ["1|7|lulesh|1|3"]
    );
    assert_eq!(
        table(
            &conn,
            "SELECT stream_id, round, phase, payload, late FROM results"
        ),
        ["2|7|1|x'68697374'|0"]
    );
    assert_eq!(
        table(&conn, "SELECT stream_id, round, ranks, bytes FROM late_arrivals"),
        [format!("1|7|1|{}", late.len())]
    );
    recent(one_i64(&conn, "SELECT arrived_unix_ns FROM late_arrivals"));
    assert_eq!(table(&conn, "SELECT id, name FROM names"), ["-1|MPI_Allreduce"]);
    assert_eq!(
        table(
            &conn,
            "SELECT node_id, kind, parent, state, ranks_below, address, detail FROM nodes"
        ),
        ["n1:0|agent|fe:0|attached|4|10.0.0.1:7401|NULL"]
    );
    recent(one_i64(&conn, "SELECT first_seen_unix_ns FROM nodes"));
    recent(one_i64(&conn, "SELECT updated_unix_ns FROM nodes"));
}

#[test]
fn latest_link_points_at_the_newest_run() {
    let dir = tempdir("latest");
    let first = Store::create(dir.path()).unwrap();
    let mut second = Store::create(dir.path()).unwrap();
    assert_ne!(first.path(), second.path());
    assert!(first.path().exists() && second.path().exists());
    let name = second.path().file_name().unwrap().to_str().unwrap().to_string();
    let first_name = first.path().file_name().unwrap().to_str().unwrap();
    // Two runs of one process in the same second are told apart by a suffix; a second later, by the time.
    let same_second = first_name
        .strip_suffix(".sqlite")
        .map(|stem| format!("{stem}-2.sqlite"));
    assert!(
        name.starts_with("run-") && name.contains(&format!("-{}", std::process::id())),
        "{name}"
    );
    assert!(
        Some(&name) == same_second.as_ref() || !name.ends_with("-2.sqlite"),
        "{first_name} then {name}"
    );
    let link = dir.path().join(LATEST);
    assert_eq!(fs::read_link(&link).unwrap(), Path::new(&name));
    // Two runs and the link: the temporary link was renamed, not left behind.
    let entries = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with("-wal") && !n.ends_with("-shm"))
        .count();
    assert_eq!(entries, 3);

    // A reader that opens the link must find the writer's WAL, which only works if SQLite resolves it.
    second
        .write_round(&record(1, 1, 1, 1, &[]), Payload::None)
        .unwrap();
    let conn = Connection::open(&link).unwrap();
    assert_eq!(count(&conn, "rounds"), 1);
}

#[test]
fn a_malformed_batch_is_refused_and_writes_nothing() {
    let dir = tempdir("malformed");
    let mut store = Store::create(dir.path()).unwrap();
    // Field 1, length-delimited, claims 127 bytes that are not there.
    let bad = [0x0a, 0x7f, 0x01];
    let err = store
        .write_round(&record(3, 9, 1, 1, &[]), Payload::Profiles(&bad))
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Decode {
                stream_id: 3,
                round: 9,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("cannot decode the profiles of stream 3 round 9: "),
        "{err}"
    );
    let err = store
        .write_late(3, 9, 1, 3, Payload::Profiles(&bad), None)
        .unwrap_err();
    assert!(matches!(err, StoreError::Decode { .. }), "{err:?}");
    let conn = Connection::open(store.path()).unwrap();
    for table in [
        "rounds",
        "samples",
        "counters",
        "profile_batches",
        "results",
        "late_arrivals",
    ] {
        assert_eq!(count(&conn, table), 0, "{table}");
    }
}

#[test]
fn dont_wait_pieces_add_up_in_one_round() {
    let dir = tempdir("dontwait");
    let mut store = Store::create(dir.path()).unwrap();
    let a = profiles("app", 0..3, 1, 0);
    let b = profiles("app", 3..5, 1, 0);
    let mut first = record(4, 2, 3, 8, &[(MissingReason::NotWaited, 5)]);
    (first.first_dump_unix_ns, first.closed_unix_ns) = (500, 600);
    store.write_round(&first, Payload::Profiles(&a)).unwrap();
    let mut second = record(
        4,
        2,
        2,
        8,
        &[(MissingReason::Lost, 1), (MissingReason::NotWaited, 5)],
    );
    (second.first_dump_unix_ns, second.closed_unix_ns) = (400, 900);
    store.write_round(&second, Payload::Profiles(&b)).unwrap();

    let conn = Connection::open(store.path()).unwrap();
    // 8 expected - 5 covered - 1 lost leaves 2 not waited for, not 5 + 5 counting delivered ranks as absent.
    assert_eq!(
        table(
            &conn,
            "SELECT covered, expected, missing_lost, missing_not_waited, missing_reason, result_bytes, pieces,
                    first_dump_unix_ns, closed_unix_ns
             FROM rounds"
        ),
        [format!("5|8|1|2|not_waited: 2, lost: 1|{}|2|400|900", a.len() + b.len())]
    );
    assert_eq!(count(&conn, "samples"), 5);
}

#[test]
fn each_applications_coverage_has_its_own_row_and_pieces_add_up_in_it() {
    let dir = tempdir("apps");
    let mut store = Store::create(dir.path()).unwrap();
    let app = |app: &str, covered, expected, missing: &[(MissingReason, u32)]| AppRecord {
        app: app.into(),
        covered,
        expected,
        missing: missing.to_vec(),
    };
    // A don't-wait round in two pieces, as the tree sends them: each names only its own ranks' applications
    // (the ranks it did not wait for count in the whole alone). The simulation's four ranks come in both, the
    // analysis, sampled out, in the second.
    let mut first = record(4, 2, 2, 8, &[(MissingReason::NotWaited, 6)]);
    first.apps = vec![app("sim", 2, 2, &[])];
    store.write_round(&first, Payload::None).unwrap();
    let mut second = record(
        4,
        2,
        2,
        8,
        &[(MissingReason::SampledOut, 4), (MissingReason::NotWaited, 2)],
    );
    second.apps = vec![
        app("analysis", 0, 4, &[(MissingReason::SampledOut, 4)]),
        app("sim", 2, 2, &[]),
    ];
    store.write_round(&second, Payload::None).unwrap();
    let reader = canopy_store::StoreReader::open(store.path()).unwrap();
    let rows: Vec<_> = reader
        .round_apps(canopy_store::Select::all())
        .unwrap()
        .into_iter()
        .map(|r| {
            (
                r.app,
                r.covered,
                r.expected,
                r.missing.get(MissingReason::SampledOut),
                r.missing.get(MissingReason::NotWaited),
                r.missing_reason,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("analysis".into(), 0, 4, 4, 0, Some("sampled_out: 4".into())),
            // Both pieces' ranks covered, none left not waited for.
            ("sim".into(), 4, 4, 0, 0, None),
        ]
    );
    let whole = reader.rounds(canopy_store::Select::all()).unwrap();
    assert_eq!((whole[0].covered, whole[0].expected), (4, 8));
    // Summed over the rounds, in SQL.
    let mut later = record(4, 3, 4, 8, &[(MissingReason::SampledOut, 4)]);
    later.apps = vec![
        app("analysis", 0, 4, &[(MissingReason::SampledOut, 4)]),
        app("sim", 4, 4, &[]),
    ];
    store.write_round(&later, Payload::None).unwrap();
    let totals: Vec<_> = reader
        .app_coverage(canopy_store::Select::all())
        .unwrap()
        .into_iter()
        .map(|t| (t.app, t.covered, t.expected, t.missing))
        .collect();
    assert_eq!(
        totals,
        [
            ("analysis".into(), 0, 8, vec![(MissingReason::SampledOut, 8)]),
            ("sim".into(), 8, 8, vec![]),
        ]
    );
}

#[test]
fn missing_reason_names_the_largest_gap_first() {
    let dir = tempdir("reason");
    let mut store = Store::create(dir.path()).unwrap();
    let gaps = [
        (MissingReason::Late, 2),
        (MissingReason::Lost, 10),
        (MissingReason::Lost, 6),
    ];
    store
        .write_round(&record(1, 1, 46, 64, &gaps), Payload::None)
        .unwrap();
    store
        .write_round(&record(1, 2, 64, 64, &[]), Payload::None)
        .unwrap();
    let odd = [
        (MissingReason::SampledOut, 3),
        (MissingReason::Unspecified, 3),
        (MissingReason::Malformed, 1),
    ];
    store
        .write_round(&record(1, 3, 1, 8, &odd), Payload::None)
        .unwrap();
    let conn = Connection::open(store.path()).unwrap();
    assert_eq!(
        table(
            &conn,
            "SELECT missing_reason, missing_lost, missing_late, result_bytes FROM rounds ORDER BY round"
        ),
        [
            "lost: 16, late: 2|16|2|0",
            "NULL|0|0|0",
            "unspecified: 3, sampled_out: 3, malformed: 1|0|0|0",
        ]
    );
}

#[test]
fn a_name_collision_is_returned_and_recorded_once() {
    let dir = tempdir("names");
    let mut store = Store::create(dir.path()).unwrap();
    let big = u64::MAX - 1;
    assert!(
        store
            .put_names(&[(1, "a".into()), (big, "b".into())])
            .unwrap()
            .is_empty()
    );
    assert!(store.put_names(&[(1, "a".into())]).unwrap().is_empty());
    let clash = Collision {
        id: big,
        existing: "b".into(),
        new: "c".into(),
    };
    let found = store.put_names(&[(big, "c".into()), (1, "a".into())]).unwrap();
    assert_eq!(found, std::slice::from_ref(&clash));
    assert_eq!(store.put_names(&[(big, "c".into())]).unwrap(), [clash]);
    let conn = Connection::open(store.path()).unwrap();
    assert_eq!(
        table(&conn, "SELECT id, name FROM names ORDER BY id"),
        ["-2|b", "1|a"]
    );
    assert_eq!(
        table(&conn, "SELECT id, existing, new FROM name_collisions"),
        ["-2|b|c"]
    );
}

#[test]
fn put_node_replaces_the_state_and_keeps_the_address() {
    let dir = tempdir("nodes");
    let mut store = Store::create(dir.path()).unwrap();
    let attached = NodeEvent {
        node_id: "r:1".into(),
        parent_id: "fe:0".into(),
        kind: NodeKind::Relay as i32,
        state: NodeState::Attached as i32,
        ranks_below: 32,
        address: "10.0.0.2:7402".into(),
        detail: String::new(),
        ranks_announced: 0,
    };
    store.put_node(&attached).unwrap();
    let lost = NodeEvent {
        node_id: "r:1".into(),
        state: NodeState::Lost as i32,
        ranks_below: 32,
        detail: "connection reset".into(),
        ..NodeEvent::default()
    };
    store.put_node(&lost).unwrap();
    let conn = Connection::open(store.path()).unwrap();
    assert_eq!(
        table(
            &conn,
            "SELECT node_id, kind, parent, state, ranks_below, address, detail FROM nodes"
        ),
        ["r:1|relay|fe:0|lost|32|10.0.0.2:7402|connection reset"]
    );
    assert_eq!(
        table(&conn, "SELECT first_seen_unix_ns <= updated_unix_ns FROM nodes"),
        ["1"]
    );
}

#[test]
fn put_stream_keeps_the_first_open_and_close_times() {
    let dir = tempdir("streams");
    let mut store = Store::create(dir.path()).unwrap();
    let mut s = spec(5);
    store.put_stream(&s, StreamState::Open, None, None).unwrap();
    let conn = Connection::open(store.path()).unwrap();
    let opened = one_i64(&conn, "SELECT opened_unix_ns FROM streams");
    s.sync_mode = SyncMode::DontWait as i32;
    store
        .put_stream(&s, StreamState::Failed, Some("filter panicked"), None)
        .unwrap();
    let closed = one_i64(&conn, "SELECT closed_unix_ns FROM streams");
    assert!(opened <= closed);
    assert_eq!(
        table(
            &conn,
            "SELECT sync_mode, state, failure, opened_unix_ns FROM streams"
        ),
        [format!("dont_wait|failed|filter panicked|{opened}")]
    );
    store.put_stream(&s, StreamState::Closed, None, None).unwrap();
    assert_eq!(
        table(
            &conn,
            "SELECT state, failure, opened_unix_ns, closed_unix_ns FROM streams"
        ),
        [format!("closed|NULL|{opened}|{closed}")]
    );
}

#[test]
fn a_late_packet_adds_to_its_round_or_stands_alone() {
    let dir = tempdir("late");
    let mut store = Store::create(dir.path()).unwrap();
    store
        .write_round(&record(1, 1, 3, 4, &[(MissingReason::Late, 1)]), Payload::None)
        .unwrap();
    store
        .write_late(
            1,
            1,
            1,
            10,
            Payload::Blob {
                phase: 0,
                payload: b"x",
            },
            None,
        )
        .unwrap();
    store.write_late(1, 1, 2, 20, Payload::None, None).unwrap();
    store.write_late(1, 99, 5, 30, Payload::None, None).unwrap();
    let conn = Connection::open(store.path()).unwrap();
    assert_eq!(
        table(&conn, "SELECT round, late_ranks, missing_late FROM rounds"),
        ["1|3|1"]
    );
    assert_eq!(
        table(
            &conn,
            "SELECT round, ranks, bytes FROM late_arrivals ORDER BY rowid"
        ),
        ["1|1|10", "1|2|20", "99|5|30"]
    );
    assert_eq!(
        table(&conn, "SELECT round, phase, payload, late FROM results"),
        ["1|0|x'78'|1"]
    );
}

#[test]
fn a_committed_round_survives_a_crash() {
    let dir = tempdir("crash");
    let mut store = Store::create(dir.path()).unwrap();
    let batch = profiles("app", 0..4, 3, 0);
    store
        .write_round(&record(1, 1, 4, 4, &[]), Payload::Profiles(&batch))
        .unwrap();
    let path = store.path().to_path_buf();
    // Forgetting skips sqlite3_close and its checkpoint, as a killed process would: the round lives only in
    // the WAL file.
    std::mem::forget(store);
    assert!(fs::metadata(format!("{}-wal", path.display())).unwrap().len() > 0);

    let mut reopened = Store::open(&path).unwrap();
    reopened
        .write_round(&record(1, 2, 4, 4, &[]), Payload::Profiles(&batch))
        .unwrap();
    drop(reopened);
    let conn = Connection::open(&path).unwrap();
    assert_eq!(
        table(&conn, "SELECT round, covered FROM rounds ORDER BY round"),
        ["1|4", "2|4"]
    );
    assert_eq!(count(&conn, "samples"), 24);
}

#[test]
#[allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a synchronous test polling a file that a background thread writes; no tokio runtime here"
)]
fn the_wal_reaches_the_file_without_the_writer() {
    let dir = tempdir("checkpoint");
    let mut store = Store::create(dir.path()).unwrap();
    let empty = fs::metadata(store.path()).unwrap().len();
    let batch = profiles("app", 0..64, 20, 0);
    store
        .write_round(&record(1, 1, 64, 64, &[]), Payload::Profiles(&batch))
        .unwrap();
    // Far below the writer's own threshold, so only the background thread can have copied the pages.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fs::metadata(store.path()).unwrap().len() <= empty {
        assert!(std::time::Instant::now() < deadline, "no checkpoint within 10 s");
        thread::sleep(Duration::from_millis(20));
    }
    let path = store.path().to_path_buf();
    drop(store);
    // A clean close folds what is left and removes the WAL and its index: the writer's connection closed last.
    let beside = |path: &Path| {
        let mut names: Vec<String> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with("-wal") || n.ends_with("-shm"))
            .collect();
        names.sort();
        names
    };
    assert_eq!(beside(&path), Vec::<String>::new());
    // Nor does a reader of the finished run leave any behind.
    let reader = canopy_store::StoreReader::open(&path).unwrap();
    assert_eq!(reader.count(canopy_store::Table::Rounds).unwrap(), 1);
    drop(reader);
    assert_eq!(beside(&path), Vec::<String>::new());
    // Opened again for writing, the store is a WAL again.
    let store = Store::open(&path).unwrap();
    let conn = Connection::open(&path).unwrap();
    assert_eq!(table(&conn, "PRAGMA journal_mode"), ["wal"]);
    drop((conn, store));

    // A reader open while the writer ends the run keeps the writer from leaving WAL mode; the reader, last out,
    // folds it. Until the run is ended, a reader leaves the log to its writer.
    let mut store = Store::open(&path).unwrap();
    let reader = canopy_store::StoreReader::open(&path).unwrap();
    drop(store);
    assert_eq!(beside(&path).len(), 2, "{:?}", beside(&path));
    drop(reader);
    assert_eq!(
        beside(&path).len(),
        2,
        "a run not ended keeps its log: {:?}",
        beside(&path)
    );
    store = Store::open(&path).unwrap();
    store.end_run(1).unwrap();
    let reader = canopy_store::StoreReader::open(&path).unwrap();
    drop(store);
    assert_eq!(beside(&path).len(), 2, "{:?}", beside(&path));
    assert_eq!(reader.count(canopy_store::Table::Rounds).unwrap(), 1);
    drop(reader);
    assert_eq!(beside(&path), Vec::<String>::new());
    let conn = Connection::open(&path).unwrap();
    assert_eq!(table(&conn, "PRAGMA journal_mode"), ["delete"]);
}

#[test]
fn the_store_can_move_to_a_writer_thread() {
    // The front-end writes from a blocking thread, off the async runtime.
    fn send<T: Send + 'static>() {}
    send::<Store>();
}

#[test]
fn open_refuses_a_missing_file() {
    let dir = tempdir("missing");
    let absent = dir.path().join("absent");
    let err = Store::open(&absent.join("nope.sqlite")).unwrap_err();
    assert!(matches!(err, StoreError::Sqlite { .. }), "{err:?}");
    assert!(!absent.exists());
}

#[test]
fn create_reports_a_directory_it_cannot_make() {
    let dir = tempdir("notadir");
    let file = dir.path().join("notadir");
    fs::write(&file, b"a file").unwrap();
    let err = Store::create(&file.join("runs")).unwrap_err();
    assert!(matches!(err, StoreError::CreateDir { .. }), "{err:?}");
    assert!(
        err.to_string().starts_with("cannot create the output directory "),
        "{err}"
    );
}

#[test]
fn a_late_packet_stored_before_its_rounds_row_is_counted_when_the_row_comes() {
    let dir = tempdir("late-first");
    let mut store = Store::create(dir.path()).unwrap();
    store.put_stream(&spec(1), StreamState::Open, None, None).unwrap();
    // The root's filter is still finalizing round 5 when the late piece of it is stored.
    store.write_late(1, 5, 4, 0, Payload::None, None).unwrap();
    store.write_late(1, 5, 2, 0, Payload::None, None).unwrap();
    store
        .write_round(&record(1, 5, 10, 16, &[(MissingReason::Late, 6)]), Payload::None)
        .unwrap();
    // And a late packet after the row, as usual.
    store
        .write_round(&record(1, 6, 12, 16, &[(MissingReason::Late, 4)]), Payload::None)
        .unwrap();
    store.write_late(1, 6, 4, 0, Payload::None, None).unwrap();
    let path = store.path().to_path_buf();
    drop(store);
    let open = Connection::open(&path).unwrap();
    assert_eq!(
        table(
            &open,
            "SELECT round || ':' || late_ranks FROM rounds ORDER BY round"
        ),
        ["5:6", "6:4"]
    );
}

/// Rounds that counted a source's ranks late or unreachable, the source having finished before them: its ranks
/// move to stopped, the reason says so, and an unreachable node it was no longer is named. The rest of the row
/// (covered, late arrivals, another unreachable node) stays; a round without a row is left alone.
#[test]
fn a_finished_sources_ranks_recounted_stopped_leave_the_rest_of_the_row() {
    let dir = tempdir("recount");
    let mut store = Store::create(dir.path()).unwrap();
    store.put_stream(&spec(1), StreamState::Open, None, None).unwrap();
    // Round 3: 8 covered, 24 late, of two applications; agent-2's 16 late ranks are 12 of lulesh and 4 of amg.
    let mut split = record(1, 3, 8, 32, &[(MissingReason::Late, 24)]);
    let app = |app: &str, covered, expected, late| AppRecord {
        app: app.into(),
        covered,
        expected,
        missing: vec![(MissingReason::Late, late)],
    };
    split.apps = vec![app("amg", 0, 8, 8), app("lulesh", 8, 24, 16)];
    store.write_round(&split, Payload::None).unwrap();
    store.write_late(1, 3, 8, 0, Payload::None, None).unwrap();
    let apps = [("lulesh".to_string(), 12), ("amg".to_string(), 4)];
    let mut unreachable = record(1, 4, 8, 32, &[(MissingReason::Unreachable, 24)]);
    unreachable.unreachable = vec![("relay-1".into(), 16), ("relay-2".into(), 8)];
    store.write_round(&unreachable, Payload::None).unwrap();
    store
        .recount_stopped(1, 3, MissingReason::Late, 16, "agent-2", &apps)
        .unwrap();
    store
        .recount_stopped(1, 4, MissingReason::Unreachable, 16, "relay-1", &[])
        .unwrap();
    store
        .recount_stopped(1, 9, MissingReason::Late, 16, "agent-2", &apps)
        .unwrap();
    let path = store.path().to_path_buf();
    drop(store);
    let open = Connection::open(&path).unwrap();
    assert_eq!(
        table(
            &open,
            "SELECT round || ' ' || covered || ' ' || missing_late || ' ' || missing_unreachable || ' ' ||
                    missing_stopped || ' ' || late_ranks || ' ' || missing_reason || ' ' ||
                    coalesce(unreachable_nodes, '-')
             FROM rounds ORDER BY round"
        ),
        [
            "3 8 8 0 16 8 stopped: 16, late: 8 -",
            "4 8 0 8 16 0 stopped: 16, unreachable: 8 (relay-2=8) relay-2=8"
        ]
    );
    assert_eq!(
        table(
            &open,
            "SELECT app || ' ' || covered || ' ' || missing_late || ' ' || missing_stopped || ' ' || missing_reason
             FROM round_apps WHERE round = 3 ORDER BY app"
        ),
        ["amg 0 4 4 late: 4, stopped: 4", "lulesh 8 4 12 stopped: 12, late: 4"]
    );
}

#[test]
fn a_nodes_history_keeps_each_change_of_parent_or_state() {
    let dir = tempdir("history");
    let mut store = Store::create(dir.path()).unwrap();
    let ev = |parent: &str, state: NodeState, ranks: u32, detail: &str| NodeEvent {
        node_id: "agent-0".into(),
        parent_id: parent.into(),
        kind: NodeKind::Agent as i32,
        state: state as i32,
        ranks_below: ranks,
        address: "10.0.0.1:1".into(),
        detail: detail.into(),
        ranks_announced: 0,
    };
    store
        .put_node(&ev("relay-0", NodeState::Attached, 4, ""))
        .unwrap();
    // More ranks under the same parent: no change of parent or state, no history row.
    store
        .put_node(&ev("relay-0", NodeState::Attached, 8, ""))
        .unwrap();
    store
        .put_node(&ev(
            "relay-0",
            NodeState::Lost,
            8,
            "lost with relay-0, its way to the root",
        ))
        .unwrap();
    store
        .put_node(&ev("frontend", NodeState::Attached, 8, ""))
        .unwrap();
    let path = store.path().to_path_buf();
    drop(store);
    let reader = canopy_store::StoreReader::open(&path).unwrap();
    let history: Vec<(Option<String>, NodeState, u32)> = reader
        .node_history("agent-0")
        .unwrap()
        .into_iter()
        .map(|c| (c.parent, c.state, c.ranks_below))
        .collect();
    assert_eq!(
        history,
        [
            (Some("relay-0".into()), NodeState::Attached, 4),
            (Some("relay-0".into()), NodeState::Lost, 8),
            (Some("frontend".into()), NodeState::Attached, 8),
        ]
    );
    assert!(reader.node_history("nobody").unwrap().is_empty());
}

#[test]
fn a_streams_later_ranks_are_kept_with_the_round_they_start_at() {
    let dir = tempdir("stages");
    let mut store = Store::create(dir.path()).unwrap();
    let mut spec = spec(4);
    spec.ranks = "1-3".into();
    store.put_stream(&spec, StreamState::Open, None, None).unwrap();
    for (from_round, ranks) in [(12, "5,9"), (30, "")] {
        spec.stages.push(canopy_proto::v1::RankStage {
            from_round,
            ranks: ranks.into(),
        });
        // The root sends the whole spec each time: stages already stored are kept as they were.
        store.put_stream(&spec, StreamState::Open, None, None).unwrap();
    }
    let conn = Connection::open(store.path()).unwrap();
    assert_eq!(
        table(
            &conn,
            "SELECT stream_id, from_round, ranks FROM stream_ranks ORDER BY from_round"
        ),
        ["4|12|5,9", "4|30|"]
    );
    let read = canopy_store::StoreReader::open(store.path()).unwrap();
    let row = read.stream(4).unwrap().unwrap();
    assert_eq!(row.ranks, "1-3");
    assert_eq!(row.stages, vec![(12, "5,9".to_string()), (30, String::new())]);
}

#[test]
fn the_end_of_a_run_gives_every_round_no_rank_delivered_a_row_counted_dropped() {
    let dir = tempdir("gaps");
    let mut store = Store::create(dir.path()).unwrap();
    let path = store.path().to_path_buf();
    // Stream 1: rounds 0-2, then 6 and 7 (3-5 every rank dropped); stream 2: 0 and 1, no gap.
    for round in [0, 1, 2, 6, 7] {
        let missing = if round == 6 {
            vec![(MissingReason::Late, 1)]
        } else {
            vec![]
        };
        let covered = if round == 6 { 3 } else { 4 };
        store
            .write_round_with(&record(1, round, covered, 4, &missing), Payload::None, None)
            .unwrap();
    }
    for round in [0, 1] {
        store
            .write_round_with(&record(2, round, 4, 4, &[]), Payload::None, None)
            .unwrap();
    }
    store.end_run(1).unwrap();
    let reader = canopy_store::StoreReader::open(&path).unwrap();
    let rounds = reader.rounds(canopy_store::Select::all().stream(1)).unwrap();
    let numbers: Vec<u64> = rounds.iter().map(|r| r.round).collect();
    assert_eq!(numbers, (0..8).collect::<Vec<u64>>());
    for r in &rounds[3..6] {
        assert_eq!(
            (r.covered, r.expected, r.missing.get(MissingReason::Dropped)),
            (0, 4, 4),
            "{r:?}"
        );
        assert_eq!(r.missing_reason.as_deref(), Some("dropped: 4"));
    }
    assert_eq!(
        reader
            .rounds(canopy_store::Select::all().stream(2))
            .unwrap()
            .len(),
        2
    );
}
