//! The schema, as an ordered list of migrations keyed on `PRAGMA user_version`: a new store runs them all, an
//! older one runs those it lacks, so both end with the same tables. docs/architecture.md §6 describes them.

use rusqlite::{Connection, OptionalExtension};
use rusqlite_migration::{M, Migrations};

/// The version of the schema this crate writes: `PRAGMA user_version` of every store it has opened for writing,
/// also written to `meta.schema_version` for readers of the file (sqlite3, pandas), who check it before
/// trusting column meanings.
///
/// - 1: the first schema (rounds, samples, counters, results, names, nodes, streams, meta, late arrivals and the
///   standard filters' tables).
/// - 2: `rounds.missing_dropped` (ranks that dropped a round in the application).
/// - 3: `profile_batches`, every passthrough result as the encoded `ProfileBatch` it arrived as, so a replay
///   sends exactly the bytes that were stored.
/// - 4: `rounds.missing_absent` (announced ranks that had not attached when the start time-out passed).
/// - 5: `node_history`, every change of a node's parent or state.
/// - 6: `trace`, the event traces ranks ship with their profiles (the trace module).
/// - 7: `utilization`, the utilization filter's average share of each activity in each bin of a time round.
/// - 8: `node_samples` and `node_ranks`, the node stream: each node's sample of each round (CPU, memory, network,
///   disk, load) and the ranges of the ranks it served, so a rank's row joins its node's sample in SQL.
/// - 9: `event_metrics`, the per-event metrics (perf counters, heap, depth) of passthrough profiles, a row per
///   rank, event and metric.
pub const SCHEMA_VERSION: u32 = 9;

/// Version 1, as stores before the migrations were created (less `missing_dropped`, which version 2 adds).
const V1: &str = "
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT
);
CREATE TABLE IF NOT EXISTS streams (
    stream_id INTEGER PRIMARY KEY,
    name TEXT,
    filter TEXT,
    params TEXT,
    sync_mode TEXT,
    timeout_ms INTEGER,
    state TEXT,
    failure TEXT,
    opened_unix_ns INTEGER,
    closed_unix_ns INTEGER,
    result_type TEXT,
    ranks TEXT
);
CREATE TABLE IF NOT EXISTS rounds (
    stream_id INTEGER NOT NULL,
    stream_name TEXT,
    round INTEGER NOT NULL,
    covered INTEGER NOT NULL,
    expected INTEGER NOT NULL,
    missing_late INTEGER NOT NULL DEFAULT 0,
    missing_lost INTEGER NOT NULL DEFAULT 0,
    missing_stopped INTEGER NOT NULL DEFAULT 0,
    missing_sampled_out INTEGER NOT NULL DEFAULT 0,
    missing_malformed INTEGER NOT NULL DEFAULT 0,
    missing_not_waited INTEGER NOT NULL DEFAULT 0,
    missing_unspecified INTEGER NOT NULL DEFAULT 0,
    missing_reason TEXT,
    late_ranks INTEGER NOT NULL DEFAULT 0,
    result_bytes INTEGER NOT NULL DEFAULT 0,
    pieces INTEGER NOT NULL DEFAULT 1,
    first_dump_unix_ns INTEGER,
    closed_unix_ns INTEGER,
    PRIMARY KEY (stream_id, round)
);
CREATE TABLE IF NOT EXISTS samples (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    app TEXT NOT NULL,
    rank INTEGER NOT NULL,
    event_id INTEGER NOT NULL,
    calls INTEGER,
    subrs INTEGER,
    incl_us REAL,
    excl_us REAL,
    calls_total INTEGER,
    subrs_total INTEGER,
    incl_total_us REAL,
    excl_total_us REAL,
    dump_unix_ns INTEGER,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS samples_by_round ON samples (stream_id, round);
CREATE TABLE IF NOT EXISTS counters (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    app TEXT NOT NULL,
    rank INTEGER NOT NULL,
    counter_id INTEGER NOT NULL,
    value REAL,
    total REAL,
    dump_unix_ns INTEGER,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS counters_by_round ON counters (stream_id, round);
CREATE TABLE IF NOT EXISTS results (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    phase INTEGER NOT NULL,
    payload BLOB,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS results_by_round ON results (stream_id, round);
CREATE TABLE IF NOT EXISTS names (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS name_collisions (
    id INTEGER NOT NULL,
    existing TEXT NOT NULL,
    new TEXT NOT NULL,
    seen_unix_ns INTEGER,
    UNIQUE (id, existing, new)
);
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY,
    kind TEXT,
    parent TEXT,
    state TEXT,
    ranks_below INTEGER,
    address TEXT,
    detail TEXT,
    first_seen_unix_ns INTEGER,
    updated_unix_ns INTEGER
);
CREATE TABLE IF NOT EXISTS late_arrivals (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    ranks INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    arrived_unix_ns INTEGER
);
CREATE INDEX IF NOT EXISTS late_arrivals_by_round ON late_arrivals (stream_id, round);
CREATE TABLE IF NOT EXISTS stats (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    class_id INTEGER,
    id INTEGER NOT NULL,
    metric TEXT NOT NULL,
    count INTEGER NOT NULL,
    mean REAL,
    std REAL,
    min REAL,
    max REAL,
    min_app TEXT,
    min_rank INTEGER,
    max_app TEXT,
    max_rank INTEGER,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS stats_by_round ON stats (stream_id, round);
CREATE TABLE IF NOT EXISTS histograms (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    class_id INTEGER,
    id INTEGER NOT NULL,
    metric TEXT NOT NULL,
    bin INTEGER NOT NULL,
    lo REAL,
    hi REAL,
    count INTEGER NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS histograms_by_round ON histograms (stream_id, round);
CREATE TABLE IF NOT EXISTS classes (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    class_id INTEGER NOT NULL,
    size INTEGER NOT NULL,
    ranks TEXT NOT NULL,
    example_event TEXT,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS classes_by_round ON classes (stream_id, round);
CREATE TABLE IF NOT EXISTS reductions (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    raw_bytes INTEGER NOT NULL,
    result_bytes INTEGER NOT NULL,
    reduction_factor REAL,
    classes INTEGER,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS reductions_by_round ON reductions (stream_id, round);
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '1');
";

/// Version 2: ranks that dropped their dump of a round in the application.
const V2: &str = "
ALTER TABLE rounds ADD COLUMN missing_dropped INTEGER NOT NULL DEFAULT 0;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '2');
";

/// Version 3: passthrough results kept whole, beside the rows `samples` and `counters` take apart. A round
/// stored before version 3 has its rows but no batch.
const V3: &str = "
CREATE TABLE profile_batches (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    batch BLOB NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX profile_batches_by_round ON profile_batches (stream_id, round);
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '3');
";

/// Version 4: announced ranks that never attached before collection started without them.
const V4: &str = "
ALTER TABLE rounds ADD COLUMN missing_absent INTEGER NOT NULL DEFAULT 0;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '4');
";

/// Version 5: every node's history, a row each time its parent or its state changes (an adoption, a loss, a
/// return), kept by the store itself from `nodes`.
const V5: &str = "
CREATE TABLE node_history (
    node_id TEXT NOT NULL,
    parent TEXT,
    state TEXT,
    ranks_below INTEGER,
    detail TEXT,
    at_unix_ns INTEGER
);
CREATE INDEX node_history_by_node ON node_history (node_id, at_unix_ns);
CREATE TRIGGER node_history_on_insert AFTER INSERT ON nodes BEGIN
    INSERT INTO node_history VALUES (NEW.node_id, NEW.parent, NEW.state, NEW.ranks_below, NEW.detail,
                                     NEW.updated_unix_ns);
END;
CREATE TRIGGER node_history_on_change AFTER UPDATE ON nodes
    WHEN OLD.parent IS NOT NEW.parent OR OLD.state IS NOT NEW.state BEGIN
    INSERT INTO node_history VALUES (NEW.node_id, NEW.parent, NEW.state, NEW.ranks_below, NEW.detail,
                                     NEW.updated_unix_ns);
END;
INSERT INTO node_history SELECT node_id, parent, state, ranks_below, detail, updated_unix_ns FROM nodes;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '5');
";

/// Version 6: the event traces of the ranks options name in `trace_ranks`, one row per event, from passthrough
/// results (kind: begin, end, send, idle_begin, idle_end; event_id for begin and end; peer and bytes for a send),
/// and per rank and round the events a full trace buffer overwrote (`trace_lost`, only where some were).
const V6: &str = "
CREATE TABLE trace (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    app TEXT,
    rank INTEGER,
    thread INTEGER,
    unix_ns INTEGER,
    kind TEXT,
    event_id INTEGER,
    peer INTEGER,
    bytes INTEGER,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX trace_by_round ON trace (stream_id, round);
CREATE TABLE trace_lost (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    app TEXT,
    rank INTEGER,
    lost INTEGER
);
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '6');
";

/// Version 7: results of type `canopy.filters.v1.UtilizationResult`, one row per (round, bin, activity): the bin's
/// index in the round's period and when it begins, the activity (event id, 0 for the activities folded into
/// "other"), its average share of the bin (0 to 250, the whole bin) over the `ranks` that cover the bin.
const V7: &str = "
CREATE TABLE utilization (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    bin INTEGER NOT NULL,
    start_unix_ns INTEGER,
    activity_id INTEGER NOT NULL,
    share INTEGER NOT NULL,
    ranks INTEGER NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX utilization_by_round ON utilization (stream_id, round);
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '7');
";

/// Version 8: results of type `canopy.filters.v1.NodeSamples` (the `nodes` filter), a `node_samples` row per node
/// and round with the units in the column names (NULL where the node's agent ran no such sampler), and a
/// `node_ranks` row per contiguous range of the ranks the node served in that round, so that a rank's row joins
/// its node's sample (`rank BETWEEN first_rank AND last_rank`) without parsing the `ranks` text.
const V8: &str = "
CREATE TABLE node_samples (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    node_id TEXT NOT NULL,
    hostname TEXT,
    ranks TEXT,
    sample_unix_ns INTEGER,
    interval_ns INTEGER,
    cpus INTEGER,
    cpu_user_share REAL,
    cpu_nice_share REAL,
    cpu_system_share REAL,
    cpu_idle_share REAL,
    cpu_iowait_share REAL,
    cpu_irq_share REAL,
    cpu_steal_share REAL,
    mem_total_bytes INTEGER,
    mem_available_bytes INTEGER,
    mem_used_bytes INTEGER,
    mem_page_faults INTEGER,
    mem_major_faults INTEGER,
    net_rx_bytes INTEGER,
    net_tx_bytes INTEGER,
    net_interfaces INTEGER,
    disk_read_bytes INTEGER,
    disk_write_bytes INTEGER,
    disks INTEGER,
    load_1m REAL,
    load_5m REAL,
    load_15m REAL,
    load_runnable INTEGER,
    load_threads INTEGER,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX node_samples_by_round ON node_samples (stream_id, round);
CREATE TABLE node_ranks (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    node_id TEXT NOT NULL,
    app TEXT NOT NULL,
    first_rank INTEGER NOT NULL,
    last_rank INTEGER NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX node_ranks_by_round ON node_ranks (stream_id, round);
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '8');
";

/// Version 9: passthrough profiles' per-event metrics (`RankProfile.event_metrics`), one row per rank, event and
/// metric: the metric as the `stats` table names it (`page_faults_exclusive`, `heap_at_entry`), this round's
/// value and the total since the rank started.
const V9: &str = "
CREATE TABLE event_metrics (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    app TEXT NOT NULL,
    rank INTEGER NOT NULL,
    event_id INTEGER NOT NULL,
    metric TEXT NOT NULL,
    value REAL,
    total REAL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX event_metrics_by_round ON event_metrics (stream_id, round);
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '9');
";

/// Version n is reached by the first n migrations; never edit one that has shipped, add the next.
const MIGRATIONS: &[M<'static>] = &[
    M::up(V1),
    M::up(V2),
    M::up(V3),
    M::up(V4),
    M::up(V5),
    M::up(V6),
    M::up(V7),
    M::up(V8),
    M::up(V9),
];

fn migrations() -> Migrations<'static> {
    Migrations::from_slice(MIGRATIONS)
}

/// Brings a store to [`SCHEMA_VERSION`]: all migrations for a new file, the missing ones for an older store.
/// A file from a newer Canopy is refused.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), rusqlite_migration::Error> {
    adopt_legacy(conn)?;
    migrations().to_latest(conn)
}

/// Stores written before the migrations kept their version only in `meta.schema_version`, with
/// `user_version` still 0: take it over, so the migrations start from there instead of from an empty file.
fn adopt_legacy(conn: &Connection) -> rusqlite::Result<()> {
    if user_version(conn)? != 0 {
        return Ok(());
    }
    if let Some(v) = meta_version(conn)? {
        conn.pragma_update(None, "user_version", v)?;
    }
    Ok(())
}

/// The schema version of a store: `user_version`, or `meta.schema_version` for a store written before the
/// migrations; 0 for an empty file.
pub(crate) fn version(conn: &Connection) -> rusqlite::Result<u32> {
    match user_version(conn)? {
        0 => Ok(meta_version(conn)?.unwrap_or(0)),
        v => Ok(v),
    }
}

fn user_version(conn: &Connection) -> rusqlite::Result<u32> {
    conn.pragma_query_value(None, "user_version", |r| r.get(0))
}

fn meta_version(conn: &Connection) -> rusqlite::Result<Option<u32>> {
    let has_meta = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
            [],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    if !has_meta {
        return Ok(None);
    }
    let v: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(v.and_then(|v| v.parse().ok()))
}

#[cfg(test)]
mod tests {
    use canopy_proto::v1::MissingReason;

    use super::*;
    use crate::words::{Word, missing_column};

    #[test]
    fn the_migrations_are_valid_and_reach_the_documented_version() {
        migrations().validate().unwrap();
        assert_eq!(MIGRATIONS.len(), SCHEMA_VERSION as usize);
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        assert_eq!(version(&conn).unwrap(), SCHEMA_VERSION);
        assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
        assert_eq!(meta_version(&conn).unwrap(), Some(SCHEMA_VERSION));
        // Running them again changes nothing.
        migrate(&mut conn).unwrap();
        assert_eq!(version(&conn).unwrap(), SCHEMA_VERSION);
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
        migrate(&mut conn).unwrap();
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
}
