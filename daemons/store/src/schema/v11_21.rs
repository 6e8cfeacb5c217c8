//! The migrations to versions 11 to 21, frozen as they shipped: their SQL, and the hook of version 18. Never edit
//! one that has shipped; add the next version here.

use rusqlite::Transaction;
use rusqlite_migration::HookResult;

/// Version 11: the ranks that feed a stream from a round on (a detail stream moved to other ranks), so the store
/// says which ranks fed which rounds.
pub(super) const V11: &str = "
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
pub(super) const V12: &str = "
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
pub(super) const V13: &str = "
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
pub(super) const V14: &str = "
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
pub(super) const V15: &str = "
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
pub(super) const V16: &str = "
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
pub(super) const V17: &str = "
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
pub(super) const V18: &str = "
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '18');
";

/// Version 19: ranks of a round the store could not write before the front-end's bound on rounds kept for retry
/// was reached (a full or failing disk); the round's row is written once the store writes again.
pub(super) const V19: &str = "
ALTER TABLE rounds ADD COLUMN missing_store_failed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE round_apps ADD COLUMN missing_store_failed INTEGER NOT NULL DEFAULT 0;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '19');
";

/// Version 20: ranks behind a node that was unreachable when the round closed, and the nodes, with their ranks
/// (`relay0=16, agent:3=8`).
pub(super) const V20: &str = "
ALTER TABLE rounds ADD COLUMN missing_unreachable INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rounds ADD COLUMN unreachable_nodes TEXT;
ALTER TABLE round_apps ADD COLUMN missing_unreachable INTEGER NOT NULL DEFAULT 0;
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', '20');
";

/// Version 21: the rounds published to Kafka, each with the offset the broker acknowledged (or why it was not
/// published), and per topic the offset its end had when this run began publishing there: the records before
/// it are other runs'.
pub(super) const V21: &str = "
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
pub(super) fn live_event_indexes_dropped(tx: &Transaction<'_>) -> HookResult {
    // The key as it was spelled when this migration was written (`store::ENDED` today): a frozen migration
    // reads no live code, so a later rename cannot change what it did.
    let ended: i64 = tx.query_row("SELECT count(*) FROM meta WHERE key = 'ended_unix_ns'", [], |r| {
        r.get(0)
    })?;
    if ended == 0 {
        tx.execute_batch(
            "DROP INDEX IF EXISTS stats_by_event;
             DROP INDEX IF EXISTS stats_quantiles_by_event;
             DROP INDEX IF EXISTS histograms_by_event;",
        )?;
    }
    Ok(())
}
