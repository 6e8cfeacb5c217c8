//! The schema, as an ordered list of migrations keyed on `PRAGMA user_version`: a new store runs them all, an
//! older one runs those it lacks, so both end with the same tables. docs/architecture.md §6 describes them.

use rusqlite::{Connection, OptionalExtension};
use rusqlite_migration::{M, Migrations};

mod v01_10;
mod v11_21;

#[cfg(test)]
pub(crate) use v01_10::ranges_from_text_v10;
use v01_10::*;
use v11_21::*;

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

/// Brings a new store to schema `version` exactly, as a store of that version was written.
#[cfg(test)]
pub(crate) fn migrate_to(conn: &mut Connection, version: u32) -> Result<(), rusqlite_migration::Error> {
    migrations().to_version(conn, version as usize)
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
mod tests;
