//! The schema, as an ordered list of migrations keyed on `PRAGMA user_version`: a new store runs them all, an
//! older one runs those it lacks, so both end with the same tables. docs/architecture.md §6 describes them.

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use rusqlite_migration::{HookResult, M, Migrations};

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
/// - 10: for analysts: `units` (each metric word's unit), `class_ranks` (a class's ranks as ranges) and the
///   `class_members` view (a row per rank), views with names and units resolved (`stats_named`,
///   `histograms_named`, `classes_named`, `samples_named`, `counters_named`, `event_metrics_named`,
///   `utilization_named`), and indexes for per-event series of `stats` and `histograms`.
/// - 11: `stream_ranks`, the ranks that feed a stream from a round on.
/// - 12: `outliers` and `outlier_events`, the outliers filter's top ranks of each group and the events that weigh
///   most in each one's score, and the `outliers_named` and `outlier_events_named` views.
/// - 13: `stats_quantiles`, the stats filter's quantiles of each `stats` row, and `stats_quantiles_named`.
/// - 14: the kmeans filter's equivalence classes: `clusters`, `cluster_ranks`, `cluster_centroids` and
///   `kmeans_fits`, with the `cluster_members`, `clusters_named` and `cluster_centroids_named` views.
/// - 15: `stats.app` and `stats_quantiles.app`, the application a row stands for (the stats filter's `by_app`;
///   NULL for every application), also in `stats_named` and `stats_quantiles_named`.
/// - 16: the latency filter's steps: `latency` (each step completed in a round: its end-to-end latency and
///   ends) and `latency_apps` (each application's part in it), with `latency_named` and `latency_apps_named`.
/// - 17: `round_apps`, each round's coverage per application, and `histograms.app`, the application a histogram
///   stands for (the histogram filter's `by_app`), also in `histograms_named`.
/// - 18: the per-event series indexes are built when the run ends.
/// - 19: `rounds.missing_store_failed` and `round_apps.missing_store_failed` (ranks of a round the store could
///   not write in time: a full or failing disk).
/// - 20: `rounds.missing_unreachable` and `round_apps.missing_unreachable` (ranks behind a node whose link ended
///   without a finish, which keeps their data to send again), and `rounds.unreachable_nodes` naming the nodes.
pub const SCHEMA_VERSION: u32 = 21;

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

/// Version 10: the store for analysts.
///
/// - `units`: the unit of each `metric` word's values (`us`, `calls`, `faults`, `bytes`...) and what they
///   measure, kept current by every writer that opens the store.
/// - `class_ranks`: a row per range of a class's ranks (`rank BETWEEN first_rank AND last_rank`), filled from the
///   `classes.ranks` text for rounds stored before; `class_members` expands it to a row per rank.
/// - Views with the stream's and the events' names and the metric's unit resolved.
/// - Per-event series indexes on `stats` and `histograms` (their rows per round are few, so the writer keeps them
///   as it goes; the per-rank tables get theirs when the run ends, [`SERIES_INDEXES`]).
const V10: &str = "
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

/// Version 11: the ranks that feed a stream from a round on (a detail stream moved to other ranks), so the store
/// says which ranks fed which rounds.
const V11: &str = "
CREATE TABLE stream_ranks (
    stream_id INTEGER NOT NULL,
    from_round INTEGER NOT NULL,
    ranks TEXT NOT NULL,
    set_unix_ns INTEGER NOT NULL,
    PRIMARY KEY (stream_id, from_round)
);
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '11');
";

/// Version 12: results of type `canopy.filters.v1.OutliersResult` (the `outliers` filter). An `outliers` row per
/// kept rank of each group (class 0: all ranks; otherwise a functional class) in its place in the group's top
/// (position 0 is the highest score), with the group's rank count; an `outlier_events` row per event that
/// weighs in a kept rank's score, by its place among them.
const V12: &str = "
CREATE TABLE outliers (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    class_id INTEGER NOT NULL,
    position INTEGER NOT NULL,
    app TEXT NOT NULL,
    rank INTEGER NOT NULL,
    score REAL NOT NULL,
    group_ranks INTEGER NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX outliers_by_round ON outliers (stream_id, round);
CREATE INDEX outliers_by_rank ON outliers (stream_id, app, rank, round);
CREATE TABLE outlier_events (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    class_id INTEGER NOT NULL,
    position INTEGER NOT NULL,
    event_position INTEGER NOT NULL,
    event_id INTEGER NOT NULL,
    metric TEXT NOT NULL,
    value REAL NOT NULL,
    mean REAL NOT NULL,
    std REAL NOT NULL,
    contribution REAL NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX outlier_events_by_round ON outlier_events (stream_id, round);
CREATE VIEW outliers_named AS
    SELECT o.stream_id, st.name AS stream, o.round, o.class_id, printf('%016x', o.class_id) AS class_hex,
           o.position, o.app, o.rank, o.score, o.group_ranks, o.late
    FROM outliers AS o
    LEFT JOIN streams AS st ON st.stream_id = o.stream_id;
CREATE VIEW outlier_events_named AS
    SELECT e.stream_id, st.name AS stream, e.round, e.class_id, e.position, o.app, o.rank,
           e.event_position, e.event_id, coalesce(n.name, printf('%016x', e.event_id)) AS event, e.metric, u.unit,
           e.value, e.mean, e.std, e.contribution, e.late
    FROM outlier_events AS e
    LEFT JOIN outliers AS o ON o.stream_id = e.stream_id AND o.round = e.round AND o.class_id = e.class_id
                           AND o.position = e.position AND o.late = e.late
    LEFT JOIN streams AS st ON st.stream_id = e.stream_id
    LEFT JOIN names AS n ON n.id = e.event_id
    LEFT JOIN units AS u ON u.metric = e.metric;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '12');
";

/// Version 13: the stats filter's quantiles (parameter `quantiles`), a row per `stats` row and quantile: `q`
/// in [0, 1] and the value, within the stream's relative accuracy of the exact lower quantile over the ranks.
const V13: &str = "
CREATE TABLE stats_quantiles (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    class_id INTEGER,
    id INTEGER NOT NULL,
    metric TEXT NOT NULL,
    q REAL NOT NULL,
    value REAL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX stats_quantiles_by_round ON stats_quantiles (stream_id, round);
CREATE INDEX stats_quantiles_by_event ON stats_quantiles (stream_id, id, metric, round);
CREATE VIEW stats_quantiles_named AS
    SELECT s.stream_id, st.name AS stream, s.round, s.class_id, s.id AS event_id,
           coalesce(n.name, printf('%016x', s.id)) AS event, s.metric, u.unit, s.q, s.value, s.late
    FROM stats_quantiles AS s
    LEFT JOIN streams AS st ON st.stream_id = s.stream_id
    LEFT JOIN names AS n ON n.id = s.id
    LEFT JOIN units AS u ON u.metric = s.metric;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '13');
";

/// Version 14: the kmeans filter's results (a `KmeansResult` per round).
///
/// - `clusters`: a row per cluster of the k chosen: its size, representative (app and rank; NULL for an empty
///   cluster), the RMS and max Euclidean distance of its ranks to the centroid, and their summed squares.
/// - `cluster_ranks`: a row per range of a cluster's ranks, as `class_ranks` for classes.
/// - `cluster_centroids`: a row per cluster and dimension (an event or counter id): the centroid's value.
/// - `kmeans_fits`: a row per k the round ran (one, or 1 to k_max with k "auto"): the fit (total within-cluster
///   sum of squares), the iterations, whether it converged, whether it is the k chosen, and whether the round
///   refit from the seeds.
const V14: &str = "
CREATE TABLE clusters (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    cluster INTEGER NOT NULL,
    size INTEGER NOT NULL,
    representative_app TEXT,
    representative_rank INTEGER,
    rms REAL NOT NULL,
    max_distance REAL NOT NULL,
    sum_squares REAL NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX clusters_by_round ON clusters (stream_id, round);
CREATE TABLE cluster_ranks (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    cluster INTEGER NOT NULL,
    app TEXT NOT NULL,
    first_rank INTEGER NOT NULL,
    last_rank INTEGER NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX cluster_ranks_by_round ON cluster_ranks (stream_id, round);
CREATE INDEX cluster_ranks_by_rank ON cluster_ranks (stream_id, app, first_rank);
CREATE TABLE cluster_centroids (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    cluster INTEGER NOT NULL,
    id INTEGER NOT NULL,
    metric TEXT NOT NULL,
    value REAL NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX cluster_centroids_by_round ON cluster_centroids (stream_id, round);
CREATE TABLE kmeans_fits (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    k INTEGER NOT NULL,
    fit REAL NOT NULL,
    iterations INTEGER NOT NULL,
    converged INTEGER NOT NULL,
    chosen INTEGER NOT NULL,
    refit INTEGER NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX kmeans_fits_by_round ON kmeans_fits (stream_id, round);
CREATE VIEW cluster_members AS
    WITH RECURSIVE member (stream_id, round, cluster, app, rank, last_rank, late) AS (
        SELECT stream_id, round, cluster, app, first_rank, last_rank, late FROM cluster_ranks
        UNION ALL
        SELECT stream_id, round, cluster, app, rank + 1, last_rank, late FROM member WHERE rank < last_rank
    )
    SELECT stream_id, round, cluster, app, rank, late FROM member;
CREATE VIEW clusters_named AS
    SELECT c.stream_id, st.name AS stream, c.round, c.cluster, c.size AS ranks, c.representative_app,
           c.representative_rank, c.rms, c.max_distance, c.sum_squares, c.late
    FROM clusters AS c
    LEFT JOIN streams AS st ON st.stream_id = c.stream_id;
CREATE VIEW cluster_centroids_named AS
    SELECT c.stream_id, st.name AS stream, c.round, c.cluster, c.id AS event_id,
           coalesce(n.name, printf('%016x', c.id)) AS event, c.metric, u.unit, c.value, c.late
    FROM cluster_centroids AS c
    LEFT JOIN streams AS st ON st.stream_id = c.stream_id
    LEFT JOIN names AS n ON n.id = c.id
    LEFT JOIN units AS u ON u.metric = c.metric;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '14');
";

/// Version 15: the application each `stats` row (and its quantiles) stands for, when the stats filter breaks
/// its rows down by application (`by_app`, its default): NULL for a row over every application, as every row
/// of an older store, of the histogram and classify filters and of `by_app: false`. The named views are
/// rebuilt with the column between `class_id` and the event.
const V15: &str = "
ALTER TABLE stats ADD COLUMN app TEXT;
ALTER TABLE stats_quantiles ADD COLUMN app TEXT;
DROP VIEW stats_named;
CREATE VIEW stats_named AS
    SELECT s.stream_id, st.name AS stream, s.round, s.class_id, s.app, s.id AS event_id,
           coalesce(n.name, printf('%016x', s.id)) AS event, s.metric, u.unit, s.count AS ranks,
           s.mean, s.std, s.min, s.max, s.min_app, s.min_rank, s.max_app, s.max_rank, s.late
    FROM stats AS s
    LEFT JOIN streams AS st ON st.stream_id = s.stream_id
    LEFT JOIN names AS n ON n.id = s.id
    LEFT JOIN units AS u ON u.metric = s.metric;
DROP VIEW stats_quantiles_named;
CREATE VIEW stats_quantiles_named AS
    SELECT s.stream_id, st.name AS stream, s.round, s.class_id, s.app, s.id AS event_id,
           coalesce(n.name, printf('%016x', s.id)) AS event, s.metric, u.unit, s.q, s.value, s.late
    FROM stats_quantiles AS s
    LEFT JOIN streams AS st ON st.stream_id = s.stream_id
    LEFT JOIN names AS n ON n.id = s.id
    LEFT JOIN units AS u ON u.metric = s.metric;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '15');
";

/// Version 16: the latency filter's results (a `LatencyResult` per round: the steps completed in it).
///
/// - `latency`: a row per step of a key: its end-to-end latency (latest stop minus earliest start, in ns) and
///   where and when it started and stopped (application and rank).
/// - `latency_apps`: a row per step and application: the rank dumps that marked the step and their mean
///   exclusive time per rank, split into transfer and compute (microseconds).
const V16: &str = "
CREATE TABLE latency (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    key_id INTEGER NOT NULL,
    step INTEGER NOT NULL,
    latency_ns INTEGER NOT NULL,
    start_unix_ns INTEGER NOT NULL,
    start_app TEXT NOT NULL,
    start_rank INTEGER NOT NULL,
    stop_unix_ns INTEGER NOT NULL,
    stop_app TEXT NOT NULL,
    stop_rank INTEGER NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX latency_by_round ON latency (stream_id, round);
CREATE INDEX latency_by_step ON latency (stream_id, key_id, step);
CREATE TABLE latency_apps (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    key_id INTEGER NOT NULL,
    step INTEGER NOT NULL,
    app TEXT NOT NULL,
    ranks INTEGER NOT NULL,
    transfer_us REAL NOT NULL,
    compute_us REAL NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX latency_apps_by_round ON latency_apps (stream_id, round);
CREATE VIEW latency_named AS
    SELECT l.stream_id, st.name AS stream, l.round, l.key_id, coalesce(n.name, printf('%016x', l.key_id)) AS key,
           l.step, l.latency_ns, l.start_unix_ns, l.start_app, l.start_rank, l.stop_unix_ns, l.stop_app,
           l.stop_rank, l.late
    FROM latency AS l
    LEFT JOIN streams AS st ON st.stream_id = l.stream_id
    LEFT JOIN names AS n ON n.id = l.key_id;
CREATE VIEW latency_apps_named AS
    SELECT a.stream_id, st.name AS stream, a.round, a.key_id, coalesce(n.name, printf('%016x', a.key_id)) AS key,
           a.step, a.app, a.ranks, a.transfer_us, a.compute_us, a.late
    FROM latency_apps AS a
    LEFT JOIN streams AS st ON st.stream_id = a.stream_id
    LEFT JOIN names AS n ON n.id = a.key_id;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '16');
";

/// Version 17: applications as first-class.
///
/// - `round_apps`: a row per (stream, round, application) with the application's part of the round's coverage,
///   in the columns of `rounds`. Ranks whose application no node could tell (a child lost before it ever
///   delivered, ranks not waited for) count in `rounds` only, so a round's rows here add up to at most its row
///   there.
/// - `histograms.app`: the application a histogram stands for when the histogram filter breaks its rows down by
///   application (`by_app`, its default); NULL for every application, as every row of an older store, of the
///   classify filter and of `by_app: false`. `histograms_named` is rebuilt with the column.
const V17: &str = "
CREATE TABLE round_apps (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    app TEXT NOT NULL,
    covered INTEGER NOT NULL,
    expected INTEGER NOT NULL,
    missing_late INTEGER NOT NULL DEFAULT 0,
    missing_lost INTEGER NOT NULL DEFAULT 0,
    missing_stopped INTEGER NOT NULL DEFAULT 0,
    missing_sampled_out INTEGER NOT NULL DEFAULT 0,
    missing_malformed INTEGER NOT NULL DEFAULT 0,
    missing_not_waited INTEGER NOT NULL DEFAULT 0,
    missing_unspecified INTEGER NOT NULL DEFAULT 0,
    missing_dropped INTEGER NOT NULL DEFAULT 0,
    missing_absent INTEGER NOT NULL DEFAULT 0,
    missing_reason TEXT,
    PRIMARY KEY (stream_id, round, app)
);
ALTER TABLE histograms ADD COLUMN app TEXT;
DROP VIEW histograms_named;
CREATE VIEW histograms_named AS
    SELECT h.stream_id, st.name AS stream, h.round, h.class_id, h.app, h.id AS event_id,
           coalesce(n.name, printf('%016x', h.id)) AS event, h.metric, u.unit, h.bin, h.lo, h.hi,
           h.count AS ranks, h.late
    FROM histograms AS h
    LEFT JOIN streams AS st ON st.stream_id = h.stream_id
    LEFT JOIN names AS n ON n.id = h.id
    LEFT JOIN units AS u ON u.metric = h.metric;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '17');
";

/// Version 18: the per-event series indexes of `stats`, `stats_quantiles` and `histograms` are built when the run
/// ends, with the per-rank ones ([`SERIES_INDEXES`]). Kept up as rounds were written, each round's rows (301 for
/// 100 events) went to as many places in each index, since event ids are hashes: a page of the index written per
/// row, and the store's writer took two thirds of the front-end's CPU at 1024 ranks. A run that had ended keeps
/// its indexes ([`live_event_indexes_dropped`]).
const V18: &str = "
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '18');
";

/// Version 19: ranks of a round the store could not write before the front-end's bound on rounds kept for retry
/// was reached (a full or failing disk); the round's row is written once the store writes again.
const V19: &str = "
ALTER TABLE rounds ADD COLUMN missing_store_failed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE round_apps ADD COLUMN missing_store_failed INTEGER NOT NULL DEFAULT 0;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '19');
";

/// Version 20: ranks behind a node that was unreachable when the round closed, and the nodes, with their ranks
/// (`relay0=16, agent:3=8`).
const V20: &str = "
ALTER TABLE rounds ADD COLUMN missing_unreachable INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rounds ADD COLUMN unreachable_nodes TEXT;
ALTER TABLE round_apps ADD COLUMN missing_unreachable INTEGER NOT NULL DEFAULT 0;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '20');
";

/// Version 21: the rounds published to Kafka, each with the offset the broker acknowledged (or why it was not
/// published), and per topic the offset its end had when this run began publishing there: the records before
/// it are other runs'.
const V21: &str = "
CREATE TABLE kafka_rounds (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER,
    offset INTEGER,
    failure TEXT,
    acked_unix_ns INTEGER NOT NULL,
    PRIMARY KEY (stream_id, round)
) WITHOUT ROWID;
CREATE TABLE kafka_topics (
    topic TEXT PRIMARY KEY,
    scan_from INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '21');
";

/// Drops the per-event indexes of a run still being written; an ended run keeps them, since nothing would build
/// them again.
fn live_event_indexes_dropped(tx: &Transaction<'_>) -> HookResult {
    let ended: i64 = tx.query_row(
        "SELECT count(*) FROM meta WHERE key = ?1",
        [crate::store::ENDED],
        |r| r.get(0),
    )?;
    if ended == 0 {
        tx.execute_batch(
            "DROP INDEX IF EXISTS stats_by_event;
             DROP INDEX IF EXISTS stats_quantiles_by_event;
             DROP INDEX IF EXISTS histograms_by_event;",
        )?;
    }
    Ok(())
}

/// Fills `class_ranks` for the classes a store held before version 10, from their `ranks` text.
fn class_ranks_from_text(tx: &Transaction<'_>) -> HookResult {
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

/// The indexes of per-rank series (`WHERE app = ? AND rank = ?`) and per-event series (`WHERE event_id = ?`).
/// Kept up while writing they would cost the writer about twice its time per passthrough row, and a page per
/// `stats` row (event ids are hashes, so a round's rows land all over the index), so they are built once, when
/// the run ends ([`crate::Store::end_run`]); until then a series query scans its stream's rows.
pub(crate) const SERIES_INDEXES: &str = "
CREATE INDEX IF NOT EXISTS samples_by_rank ON samples (stream_id, app, rank, round);
CREATE INDEX IF NOT EXISTS counters_by_rank ON counters (stream_id, app, rank, round);
CREATE INDEX IF NOT EXISTS event_metrics_by_rank ON event_metrics (stream_id, app, rank, round);
CREATE INDEX IF NOT EXISTS trace_by_rank ON trace (stream_id, app, rank, round);
CREATE INDEX IF NOT EXISTS samples_by_event ON samples (stream_id, event_id, round);
CREATE INDEX IF NOT EXISTS counters_by_event ON counters (stream_id, counter_id, round);
CREATE INDEX IF NOT EXISTS event_metrics_by_event ON event_metrics (stream_id, event_id, metric, round);
CREATE INDEX IF NOT EXISTS stats_by_event ON stats (stream_id, id, metric, round);
CREATE INDEX IF NOT EXISTS stats_quantiles_by_event ON stats_quantiles (stream_id, id, metric, round);
CREATE INDEX IF NOT EXISTS histograms_by_event ON histograms (stream_id, id, metric, round);
";

/// Version n is reached by the first n migrations; never edit one that has shipped, add the next.
fn migrations() -> Migrations<'static> {
    Migrations::new(vec![
        M::up(V1),
        M::up(V2),
        M::up(V3),
        M::up(V4),
        M::up(V5),
        M::up(V6),
        M::up(V7),
        M::up(V8),
        M::up(V9),
        M::up_with_hook(V10, class_ranks_from_text),
        M::up(V11),
        M::up(V12),
        M::up(V13),
        M::up(V14),
        M::up(V15),
        M::up(V16),
        M::up(V17),
        M::up_with_hook(V18, live_event_indexes_dropped),
        M::up(V19),
        M::up(V20),
        M::up(V21),
    ])
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

/// Opens a store's file beside its writer (a reader, or the Kafka log): a lock the writer holds for a commit is
/// waited for up to `busy`, and a schema outside `oldest..=SCHEMA_VERSION` is refused. Returns the connection
/// and the file's schema version.
pub(crate) fn open_beside_writer(
    path: &std::path::Path,
    flags: rusqlite::OpenFlags,
    busy: std::time::Duration,
    oldest: u32,
) -> Result<(Connection, u32), crate::StoreError> {
    let sqlite = |source| crate::StoreError::Sqlite {
        path: path.to_path_buf(),
        source,
    };
    let conn = Connection::open_with_flags(path, flags | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(sqlite)?;
    conn.busy_timeout(busy).map_err(sqlite)?;
    let version = version(&conn).map_err(sqlite)?;
    if !(oldest..=SCHEMA_VERSION).contains(&version) {
        return Err(crate::StoreError::Version {
            path: path.to_path_buf(),
            found: version,
            oldest,
            newest: SCHEMA_VERSION,
        });
    }
    Ok((conn, version))
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
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/architecture.md"))
            .unwrap();
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
}
