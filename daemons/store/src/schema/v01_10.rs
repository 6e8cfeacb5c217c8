//! The migrations to versions 1 to 10, frozen as they shipped: their SQL, and the hook of version 10 with the
//! reader of the text it converts. Never edit one; add the next version in the newest file.

use rusqlite::{Transaction, params};
use rusqlite_migration::HookResult;

/// Version 1, as stores before the migrations were created (less `missing_dropped`, which version 2 adds).
pub(super) const V1: &str = "
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
pub(super) const V2: &str = "
ALTER TABLE rounds ADD COLUMN missing_dropped INTEGER NOT NULL DEFAULT 0;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '2');
";

/// Version 3: passthrough results kept whole, beside the rows `samples` and `counters` take apart. A round
/// stored before version 3 has its rows but no batch.
pub(super) const V3: &str = "
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
pub(super) const V4: &str = "
ALTER TABLE rounds ADD COLUMN missing_absent INTEGER NOT NULL DEFAULT 0;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '4');
";

/// Version 5: every node's history, a row each time its parent or its state changes (an adoption, a loss, a
/// return), kept by the store itself from `nodes`.
pub(super) const V5: &str = "
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
pub(super) const V6: &str = "
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
pub(super) const V7: &str = "
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
pub(super) const V8: &str = "
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
pub(super) const V9: &str = "
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

/// Version 10: the store for analysts.
///
/// - `units`: the unit of each `metric` word's values (`us`, `calls`, `faults`, `bytes`...) and what they
///   measure, kept current by every writer that opens the store.
/// - `class_ranks`: a row per range of a class's ranks (`rank BETWEEN first_rank AND last_rank`), filled from the
///   `classes.ranks` text for rounds stored before; `class_members` expands it to a row per rank.
/// - Views with the stream's and the events' names and the metric's unit resolved.
/// - Per-event series indexes on `stats` and `histograms` (their rows per round are few, so the writer keeps them
///   as it goes; the per-rank tables get theirs when the run ends, [`SERIES_INDEXES`]).
pub(super) const V10: &str = "
CREATE TABLE units (
    metric TEXT PRIMARY KEY,
    unit TEXT NOT NULL,
    meaning TEXT NOT NULL
);
CREATE TABLE class_ranks (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    class_id INTEGER NOT NULL,
    app TEXT NOT NULL,
    first_rank INTEGER NOT NULL,
    last_rank INTEGER NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX class_ranks_by_round ON class_ranks (stream_id, round);
CREATE INDEX class_ranks_by_rank ON class_ranks (stream_id, app, first_rank);
CREATE INDEX stats_by_event ON stats (stream_id, id, metric, round);
CREATE INDEX histograms_by_event ON histograms (stream_id, id, metric, round);
CREATE VIEW class_members AS
    WITH RECURSIVE member (stream_id, round, class_id, app, rank, last_rank, late) AS (
        SELECT stream_id, round, class_id, app, first_rank, last_rank, late FROM class_ranks
        UNION ALL
        SELECT stream_id, round, class_id, app, rank + 1, last_rank, late FROM member WHERE rank < last_rank
    )
    SELECT stream_id, round, class_id, app, rank, late FROM member;
CREATE VIEW stats_named AS
    SELECT s.stream_id, st.name AS stream, s.round, s.class_id, s.id AS event_id,
           coalesce(n.name, printf('%016x', s.id)) AS event, s.metric, u.unit, s.count AS ranks,
           s.mean, s.std, s.min, s.max, s.min_app, s.min_rank, s.max_app, s.max_rank, s.late
    FROM stats AS s
    LEFT JOIN streams AS st ON st.stream_id = s.stream_id
    LEFT JOIN names AS n ON n.id = s.id
    LEFT JOIN units AS u ON u.metric = s.metric;
CREATE VIEW histograms_named AS
    SELECT h.stream_id, st.name AS stream, h.round, h.class_id, h.id AS event_id,
           coalesce(n.name, printf('%016x', h.id)) AS event, h.metric, u.unit, h.bin, h.lo, h.hi,
           h.count AS ranks, h.late
    FROM histograms AS h
    LEFT JOIN streams AS st ON st.stream_id = h.stream_id
    LEFT JOIN names AS n ON n.id = h.id
    LEFT JOIN units AS u ON u.metric = h.metric;
CREATE VIEW classes_named AS
    SELECT c.stream_id, st.name AS stream, c.round, c.class_id, printf('%016x', c.class_id) AS class_hex,
           c.size AS ranks, c.ranks AS rank_ranges, c.example_event, c.late
    FROM classes AS c
    LEFT JOIN streams AS st ON st.stream_id = c.stream_id;
CREATE VIEW samples_named AS
    SELECT s.stream_id, st.name AS stream, s.round, s.app, s.rank, s.event_id,
           coalesce(n.name, printf('%016x', s.event_id)) AS event, s.calls, s.subrs, s.incl_us, s.excl_us,
           s.calls_total, s.subrs_total, s.incl_total_us, s.excl_total_us, s.dump_unix_ns, s.late
    FROM samples AS s
    LEFT JOIN streams AS st ON st.stream_id = s.stream_id
    LEFT JOIN names AS n ON n.id = s.event_id;
CREATE VIEW counters_named AS
    SELECT c.stream_id, st.name AS stream, c.round, c.app, c.rank, c.counter_id,
           coalesce(n.name, printf('%016x', c.counter_id)) AS counter, c.value, c.total, c.dump_unix_ns, c.late
    FROM counters AS c
    LEFT JOIN streams AS st ON st.stream_id = c.stream_id
    LEFT JOIN names AS n ON n.id = c.counter_id;
CREATE VIEW event_metrics_named AS
    SELECT m.stream_id, st.name AS stream, m.round, m.app, m.rank, m.event_id,
           coalesce(n.name, printf('%016x', m.event_id)) AS event, m.metric, u.unit, m.value, m.total, m.late
    FROM event_metrics AS m
    LEFT JOIN streams AS st ON st.stream_id = m.stream_id
    LEFT JOIN names AS n ON n.id = m.event_id
    LEFT JOIN units AS u ON u.metric = m.metric;
CREATE VIEW utilization_named AS
    SELECT t.stream_id, st.name AS stream, t.round, t.bin, t.start_unix_ns, t.activity_id,
           CASE WHEN t.activity_id = 0 THEN 'other'
                ELSE coalesce(n.name, printf('%016x', t.activity_id)) END AS activity,
           100.0 * t.share / 250 AS share_pct, t.ranks, t.late
    FROM utilization AS t
    LEFT JOIN streams AS st ON st.stream_id = t.stream_id
    LEFT JOIN names AS n ON n.id = t.activity_id;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '10');
";

/// Fills `class_ranks` for the classes a store held before version 10, from their `ranks` text.
pub(super) fn class_ranks_from_text(tx: &Transaction<'_>) -> HookResult {
    let mut read = tx.prepare("SELECT stream_id, round, class_id, ranks, late FROM classes")?;
    let mut write = tx.prepare(
        "INSERT INTO class_ranks (stream_id, round, class_id, app, first_rank, last_rank, late)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    let mut rows = read.query([])?;
    while let Some(row) = rows.next()? {
        let (stream, round, class, ranks, late): (i64, i64, i64, String, i64) =
            (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?);
        for (app, first, last) in ranges_from_text_v10(&ranks) {
            write.execute(params![stream, round, class, app, first, last, late])?;
        }
    }
    Ok(())
}

/// The `ranks` text stores before version 10 hold, back as (app, first, last): a range without an app belongs to
/// the app named last before it (none: ""); tokens that are not ranks are skipped. Frozen with the migration that
/// reads it: it reads the text as it was written then, whatever the writer does today.
pub(crate) fn ranges_from_text_v10(text: &str) -> Vec<(String, u32, u32)> {
    let mut app = "";
    let mut out = Vec::new();
    for token in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let ranks = match token.rsplit_once(':') {
            Some((a, ranks)) => {
                app = a;
                ranks
            }
            None => token,
        };
        let (first, last) = ranks.split_once('-').unwrap_or((ranks, ranks));
        if let (Ok(first), Ok(last)) = (first.parse::<u32>(), last.parse::<u32>()) {
            out.push((app.to_string(), first.min(last), first.max(last)));
        }
    }
    out
}
