use canopy_proto::v1::MissingReason;

use super::*;
use crate::words::{Word, missing_column};

#[test]
fn the_migrations_are_valid_and_reach_the_documented_version() {
    migrations().validate().unwrap();
    assert_eq!(
        migrations()
            .pending_migrations(&Connection::open_in_memory().unwrap())
            .unwrap(),
        SCHEMA_VERSION as i32
    );
    let mut conn = Connection::open_in_memory().unwrap();
    migrate(&mut conn).unwrap();
    assert_eq!(version(&conn).unwrap(), SCHEMA_VERSION);
    assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
    assert_eq!(meta_version(&conn).unwrap(), Some(SCHEMA_VERSION));
    // Running them again changes nothing.
    migrate(&mut conn).unwrap();
    assert_eq!(version(&conn).unwrap(), SCHEMA_VERSION);
}

/// docs/architecture.md names the version this crate writes, and has a row for each migration.
#[test]
fn the_architecture_document_describes_this_version() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/architecture.md")).unwrap();
    assert!(
        doc.contains(&format!(
            "The schema described here is **version {SCHEMA_VERSION}**."
        )),
        "docs/architecture.md does not say the schema is version {SCHEMA_VERSION}"
    );
    for v in 1..=SCHEMA_VERSION {
        assert!(
            doc.contains(&format!("\n| {v} | ")),
            "docs/architecture.md's table of versions has no row for version {v}"
        );
    }
    assert!(
        !doc.contains(&format!("\n| {} | ", SCHEMA_VERSION + 1)),
        "docs/architecture.md's table of versions has a row past version {SCHEMA_VERSION}"
    );
}

#[test]
fn rounds_has_a_column_for_every_missing_reason() {
    let mut conn = Connection::open_in_memory().unwrap();
    migrate(&mut conn).unwrap();
    let mut st = conn
        .prepare("SELECT name FROM pragma_table_info('rounds')")
        .unwrap();
    let columns: Vec<String> = st
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (reason, _) in MissingReason::WORDS {
        assert!(columns.contains(&missing_column(*reason)), "{reason:?}");
    }
}

/// A store of version 6 with rows in it gains `utilization` and its index, and keeps its rows.
#[test]
fn a_version_6_store_migrates_to_7_keeping_its_rows() {
    let mut conn = Connection::open_in_memory().unwrap();
    migrations().to_version(&mut conn, 6).unwrap();
    assert_eq!(version(&conn).unwrap(), 6);
    assert!(!has(&conn, "table", "utilization"));
    conn.execute(
        "INSERT INTO trace (stream_id, round, app, rank, kind) VALUES (1, 2, 'a', 3, 'begin')",
        [],
    )
    .unwrap();
    migrations().to_version(&mut conn, 7).unwrap();
    assert_eq!(version(&conn).unwrap(), 7);
    assert_eq!(meta_version(&conn).unwrap(), Some(7));
    assert!(has(&conn, "table", "utilization"));
    assert!(has(&conn, "index", "utilization_by_round"));
    let kept: i64 = conn
        .query_row("SELECT count(*) FROM trace", [], |r| r.get(0))
        .unwrap();
    assert_eq!(kept, 1);
    let mut st = conn
        .prepare("SELECT name FROM pragma_table_info('utilization')")
        .unwrap();
    let columns: Vec<String> = st
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        columns,
        [
            "stream_id",
            "round",
            "bin",
            "start_unix_ns",
            "activity_id",
            "share",
            "ranks",
            "late"
        ]
    );
}

/// Whether the store has a table (or index...) of this name.
/// A store of version `from` holding a `stats` row, migrated one version up: it reaches `from + 1` (in
/// `user_version` and `meta`), has each of `gains` (kind, name), and keeps its row.
fn migrated_one_up_keeping_a_stats_row(from: u32, gains: &[(&str, &str)]) -> Connection {
    let mut conn = Connection::open_in_memory().unwrap();
    migrations().to_version(&mut conn, from as usize).unwrap();
    for (kind, name) in gains {
        assert!(
            !has(&conn, kind, name),
            "{kind} {name} before version {}",
            from + 1
        );
    }
    conn.execute_batch("INSERT INTO stats (stream_id, round, id, metric, count, mean) VALUES (3, 0, 7, 'exclusive', 4, 2.5);")
        .unwrap();
    migrations().to_version(&mut conn, from as usize + 1).unwrap();
    assert_eq!(
        (version(&conn).unwrap(), meta_version(&conn).unwrap()),
        (from + 1, Some(from + 1))
    );
    for (kind, name) in gains {
        assert!(has(&conn, kind, name), "{kind} {name}");
    }
    let kept: i64 = conn
        .query_row("SELECT count(*) FROM stats", [], |r| r.get(0))
        .unwrap();
    assert_eq!(kept, 1);
    conn
}

fn has(conn: &Connection, kind: &str, name: &str) -> bool {
    conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = ?1 AND name = ?2",
        [kind, name],
        |r| r.get::<_, i64>(0),
    )
    .unwrap()
        == 1
}

fn columns(conn: &Connection, table: &str) -> Vec<String> {
    let mut st = conn
        .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
        .unwrap();
    st.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// A store of version 8 with passthrough rows gains `event_metrics` and its index, and keeps its rows.
#[test]
fn a_version_8_store_migrates_to_9_keeping_its_rows() {
    let mut conn = Connection::open_in_memory().unwrap();
    migrations().to_version(&mut conn, 8).unwrap();
    conn.execute(
        "INSERT INTO samples (stream_id, round, app, rank, event_id) VALUES (1, 2, 'a', 3, 7)",
        [],
    )
    .unwrap();
    migrations().to_version(&mut conn, 9).unwrap();
    assert_eq!(
        (version(&conn).unwrap(), meta_version(&conn).unwrap()),
        (9, Some(9))
    );
    let kept: i64 = conn
        .query_row("SELECT count(*) FROM samples", [], |r| r.get(0))
        .unwrap();
    assert_eq!(kept, 1);
    assert_eq!(
        columns(&conn, "event_metrics"),
        [
            "stream_id",
            "round",
            "app",
            "rank",
            "event_id",
            "metric",
            "value",
            "total",
            "late"
        ]
    );
    assert!(has(&conn, "index", "event_metrics_by_round"));
}

/// A store of version 15 gains the latency tables and their views, and keeps its rows.
#[test]
fn a_version_15_store_migrates_to_16_with_the_latency_tables() {
    migrated_one_up_keeping_a_stats_row(
        15,
        &[
            ("table", "latency"),
            ("table", "latency_apps"),
            ("index", "latency_by_round"),
            ("index", "latency_by_step"),
            ("index", "latency_apps_by_round"),
            ("view", "latency_named"),
            ("view", "latency_apps_named"),
        ],
    );
}

/// A store of version 17 loses its per-event indexes while its run is still written (they are built when it
/// ends); an ended run keeps them.
#[test]
fn a_version_17_store_migrates_to_18_keeping_the_event_indexes_of_an_ended_run_only() {
    for (ended, kept) in [(false, false), (true, true)] {
        let mut conn = Connection::open_in_memory().unwrap();
        migrations().to_version(&mut conn, 17).unwrap();
        if ended {
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?1, '1700000000000000000')",
                [crate::store::ENDED],
            )
            .unwrap();
        }
        migrations().to_version(&mut conn, 18).unwrap();
        assert_eq!(version(&conn).unwrap(), 18);
        for index in [
            "stats_by_event",
            "stats_quantiles_by_event",
            "histograms_by_event",
        ] {
            assert_eq!(has(&conn, "index", index), kept, "{index}, ended: {ended}");
        }
    }
}

/// A store of version 11 gains the outliers tables and their views, and keeps its rows.
#[test]
fn a_version_11_store_migrates_to_12_with_the_outliers_tables() {
    migrated_one_up_keeping_a_stats_row(
        11,
        &[
            ("table", "outliers"),
            ("table", "outlier_events"),
            ("index", "outliers_by_round"),
            ("index", "outliers_by_rank"),
            ("view", "outliers_named"),
            ("view", "outlier_events_named"),
        ],
    );
}

/// A store of version 9 gains the units, the class ranges (filled from the classes it holds), the views and
/// the per-event indexes, and keeps its rows.
#[test]
fn a_version_9_store_migrates_to_10_with_its_classes_as_ranges() {
    let mut conn = Connection::open_in_memory().unwrap();
    migrations().to_version(&mut conn, 9).unwrap();
    conn.execute_batch(
        "INSERT INTO classes (stream_id, round, class_id, size, ranks, example_event, late)
         VALUES (3, 0, 11, 6, 'sim:0-3,8,post:1', 'x', 0), (3, 1, -5, 2, '4-5', 'y', 1);
         INSERT INTO stats (stream_id, round, id, metric, count, mean) VALUES (3, 0, 7, 'exclusive', 4, 2.5);",
    )
    .unwrap();
    migrations().to_version(&mut conn, 10).unwrap();
    assert_eq!(
        (version(&conn).unwrap(), meta_version(&conn).unwrap()),
        (10, Some(10))
    );
    let rows = |sql: &str| -> Vec<String> {
        let mut st = conn.prepare(sql).unwrap();
        st.query_map([], |r| r.get::<_, String>(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert_eq!(
        rows(
            "SELECT class_id || ' ' || app || ':' || first_rank || '-' || last_rank || ' ' || late
             FROM class_ranks ORDER BY round, app, first_rank"
        ),
        ["11 post:1-1 0", "11 sim:0-3 0", "11 sim:8-8 0", "-5 :4-5 1"]
    );
    assert_eq!(
        rows(
            "SELECT group_concat(rank) FROM (SELECT rank FROM class_members WHERE round = 0 AND app = 'sim' ORDER BY rank)"
        ),
        ["0,1,2,3,8"]
    );
    assert_eq!(
        rows("SELECT event || ' ' || metric FROM stats_named"),
        ["0000000000000007 exclusive"]
    );
    for (kind, name) in [
        ("table", "units"),
        ("index", "stats_by_event"),
        ("index", "histograms_by_event"),
        ("index", "class_ranks_by_rank"),
        ("view", "stats_named"),
        ("view", "histograms_named"),
        ("view", "classes_named"),
        ("view", "class_members"),
        ("view", "samples_named"),
        ("view", "counters_named"),
        ("view", "event_metrics_named"),
        ("view", "utilization_named"),
    ] {
        assert!(has(&conn, kind, name), "{kind} {name}");
    }
}

/// A store of version 12 gains `stats_quantiles` and its named view, and keeps its rows.
#[test]
fn a_version_12_store_migrates_to_13_with_the_quantiles_table() {
    let conn = migrated_one_up_keeping_a_stats_row(
        12,
        &[
            ("table", "stats_quantiles"),
            ("index", "stats_quantiles_by_round"),
            ("index", "stats_quantiles_by_event"),
            ("view", "stats_quantiles_named"),
        ],
    );
    conn.execute_batch(
        "INSERT INTO stats_quantiles (stream_id, round, id, metric, q, value) VALUES (3, 0, 7, 'exclusive', 0.5, 2.0);",
    )
    .unwrap();
    let row: String = conn
        .query_row(
            "SELECT event || ' ' || metric || ' ' || q || ' ' || value FROM stats_quantiles_named",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(row, "0000000000000007 exclusive 0.5 2.0");
}

/// A store of version 14 gains the `app` column of `stats` and `stats_quantiles` and in their named views;
/// its rows, over every application, read NULL there.
#[test]
fn a_version_14_store_migrates_to_15_with_the_application_of_each_stats_row() {
    let mut conn = Connection::open_in_memory().unwrap();
    migrations().to_version(&mut conn, 14).unwrap();
    assert!(!columns(&conn, "stats").contains(&"app".to_string()));
    conn.execute_batch(
        "INSERT INTO stats (stream_id, round, id, metric, count, mean) VALUES (3, 0, 7, 'exclusive', 4, 2.5);
         INSERT INTO stats_quantiles (stream_id, round, id, metric, q, value) VALUES (3, 0, 7, 'exclusive', 0.5, 2.0);",
    )
    .unwrap();
    migrations().to_version(&mut conn, 15).unwrap();
    assert_eq!(
        (version(&conn).unwrap(), meta_version(&conn).unwrap()),
        (15, Some(15))
    );
    for table in ["stats", "stats_quantiles", "stats_named", "stats_quantiles_named"] {
        assert!(columns(&conn, table).contains(&"app".to_string()), "{table}");
    }
    conn.execute_batch(
        "INSERT INTO stats (stream_id, round, id, metric, count, mean, app) VALUES (3, 1, 7, 'exclusive', 2, 1.5, 'sim');
         INSERT INTO stats_quantiles (stream_id, round, id, metric, q, value, app) VALUES (3, 1, 7, 'exclusive', 0.5, 1.0, 'sim');",
    )
    .unwrap();
    let rows = |sql: &str| -> Vec<String> {
        let mut st = conn.prepare(sql).unwrap();
        st.query_map([], |r| r.get::<_, String>(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert_eq!(
        rows(
            "SELECT round || ' ' || coalesce(app, 'all') || ' ' || event || ' ' || ranks FROM stats_named ORDER BY round"
        ),
        ["0 all 0000000000000007 4", "1 sim 0000000000000007 2"]
    );
    assert_eq!(
        rows(
            "SELECT round || ' ' || coalesce(app, 'all') || ' ' || value FROM stats_quantiles_named ORDER BY round"
        ),
        ["0 all 2.0", "1 sim 1.0"]
    );
}

/// A store of version 7 with rows in it gains `node_samples`, `node_ranks` and their indexes, and keeps its
/// rows.
#[test]
fn a_version_7_store_migrates_to_8_keeping_its_rows() {
    let mut conn = Connection::open_in_memory().unwrap();
    migrations().to_version(&mut conn, 7).unwrap();
    assert_eq!(version(&conn).unwrap(), 7);
    assert!(!has(&conn, "table", "node_samples"));
    conn.execute(
        "INSERT INTO utilization (stream_id, round, bin, activity_id, share, ranks) VALUES (1, 2, 0, 7, 250, 4)",
        [],
    )
    .unwrap();
    migrations().to_version(&mut conn, 8).unwrap();
    assert_eq!(version(&conn).unwrap(), 8);
    assert_eq!(meta_version(&conn).unwrap(), Some(8));
    for (kind, name) in [
        ("table", "node_samples"),
        ("index", "node_samples_by_round"),
        ("table", "node_ranks"),
        ("index", "node_ranks_by_round"),
    ] {
        assert!(has(&conn, kind, name), "{kind} {name}");
    }
    let kept: i64 = conn
        .query_row("SELECT count(*) FROM utilization", [], |r| r.get(0))
        .unwrap();
    assert_eq!(kept, 1);
    assert_eq!(
        columns(&conn, "node_ranks"),
        [
            "stream_id",
            "round",
            "node_id",
            "app",
            "first_rank",
            "last_rank",
            "late"
        ]
    );
    let samples = columns(&conn, "node_samples");
    assert_eq!(
        samples[..5],
        ["stream_id", "round", "node_id", "hostname", "ranks"]
    );
    // Every measured column says its unit or is a count: a share, bytes, a count of CPUs, disks, faults...
    for c in &samples[5..] {
        assert!(
            [
                "_share",
                "_bytes",
                "_ns",
                "_faults",
                "_1m",
                "_5m",
                "_15m",
                "cpus",
                "disks",
                "_interfaces",
                "_runnable",
                "_threads",
                "late"
            ]
            .iter()
            .any(|unit| c.ends_with(unit)),
            "{c}"
        );
    }
}

#[test]
fn a_newer_store_is_refused() {
    let mut conn = Connection::open_in_memory().unwrap();
    migrate(&mut conn).unwrap();
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    assert!(migrate(&mut conn).is_err());
}

/// Frozen migrations read meta keys as they were spelled when written (`ended_unix_ns` in v11_21's
/// `live_event_indexes_dropped`): renaming the key today needs a migration of its own, which this test asks for.
#[test]
fn the_meta_keys_frozen_migrations_read_are_spelled_as_today() {
    assert_eq!(crate::store::ENDED, "ended_unix_ns");
}
