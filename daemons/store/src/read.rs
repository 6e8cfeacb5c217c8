//! [`StoreReader`]: typed queries over a run's store, for the API, the `canopy` command, the tests and the
//! benchmarks. It opens the file read-only, so it is safe while the front-end writes: every query sees the
//! rounds committed before it started, each whole.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use canopy_proto::filters::v1::{Metric, RankRange};
use canopy_proto::v1::{NodeKind, NodeState, SyncMode};
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, params_from_iter};

use crate::StoreError;
use crate::profiles::{self, PROFILE_BATCH_TYPE};
use crate::rounds::{MissingCounts, missing_columns_at};
use crate::rows::*;
use crate::schema;

/// The schema version that added `app` to `stats` and `stats_quantiles`: an older store reads `None` there.
const STATS_APP_SINCE: u32 = 15;
/// The schema version that added `kafka_rounds` and `kafka_topics`.
pub(crate) const KAFKA_SINCE: u32 = 21;
/// The schema version that added `app` to `histograms`.
const HISTOGRAMS_APP_SINCE: u32 = 17;
use crate::sql::{id_of, sat, unsigned};
use crate::store::Collision;
use crate::words::{StreamState, Word};

/// The oldest schema the reader understands (version 2 added `rounds.missing_dropped`).
const OLDEST_READABLE: u32 = 2;

/// Which rows of a table a query returns: all, or those of one stream, from one round on, late or not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Select {
    stream_id: Option<u32>,
    from_round: Option<u64>,
    to_round: Option<u64>,
    late: Option<bool>,
}

impl Select {
    /// Every row.
    pub fn all() -> Select {
        Select::default()
    }

    /// Only the rows of this stream.
    pub fn stream(mut self, stream_id: u32) -> Select {
        self.stream_id = Some(stream_id);
        self
    }

    /// Only the rows of this round and later ones.
    pub fn from_round(mut self, round: u64) -> Select {
        self.from_round = Some(round);
        self
    }

    /// Only the rows of this round and earlier ones.
    pub fn to_round(mut self, round: u64) -> Select {
        self.to_round = Some(round);
        self
    }

    /// Only the rows whose data arrived after its round was stored (`true`), or with it (`false`). Tables
    /// without a `late` column (`rounds`, `late_arrivals`) ignore it.
    pub fn late(mut self, late: bool) -> Select {
        self.late = Some(late);
        self
    }

    /// ` WHERE ...` (or nothing) and its parameters.
    fn clause(&self, has_late: bool) -> (String, Vec<i64>) {
        let mut terms = Vec::new();
        let mut values = Vec::new();
        if let Some(id) = self.stream_id {
            values.push(i64::from(id));
            terms.push(format!("stream_id = ?{}", values.len()));
        }
        if let Some(round) = self.from_round {
            values.push(sat(round));
            terms.push(format!("round >= ?{}", values.len()));
        }
        if let Some(round) = self.to_round {
            values.push(sat(round));
            terms.push(format!("round <= ?{}", values.len()));
        }
        if let (true, Some(late)) = (has_late, self.late) {
            values.push(i64::from(late));
            terms.push(format!("late = ?{}", values.len()));
        }
        if terms.is_empty() {
            (String::new(), values)
        } else {
            (format!(" WHERE {}", terms.join(" AND ")), values)
        }
    }
}

/// A table of the store, for counting its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Rounds,
    RoundApps,
    Samples,
    Counters,
    EventMetrics,
    Trace,
    Utilization,
    Outliers,
    OutlierEvents,
    NodeSamples,
    NodeRanks,
    Results,
    ProfileBatches,
    Stats,
    StatsQuantiles,
    Histograms,
    Classes,
    Clusters,
    Latency,
    LatencyApps,
    Reductions,
    LateArrivals,
    Names,
    NameCollisions,
    Nodes,
    Streams,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::Rounds => "rounds",
            Table::RoundApps => "round_apps",
            Table::Samples => "samples",
            Table::Counters => "counters",
            Table::EventMetrics => "event_metrics",
            Table::Trace => "trace",
            Table::Utilization => "utilization",
            Table::Outliers => "outliers",
            Table::OutlierEvents => "outlier_events",
            Table::NodeSamples => "node_samples",
            Table::NodeRanks => "node_ranks",
            Table::Results => "results",
            Table::ProfileBatches => "profile_batches",
            Table::Stats => "stats",
            Table::StatsQuantiles => "stats_quantiles",
            Table::Histograms => "histograms",
            Table::Classes => "classes",
            Table::Clusters => "clusters",
            Table::Latency => "latency",
            Table::LatencyApps => "latency_apps",
            Table::Reductions => "reductions",
            Table::LateArrivals => "late_arrivals",
            Table::Names => "names",
            Table::NameCollisions => "name_collisions",
            Table::Nodes => "nodes",
            Table::Streams => "streams",
        }
    }

    fn has_late(self) -> bool {
        matches!(
            self,
            Table::Samples
                | Table::Counters
                | Table::EventMetrics
                | Table::Trace
                | Table::Utilization
                | Table::Outliers
                | Table::OutlierEvents
                | Table::NodeSamples
                | Table::NodeRanks
                | Table::Results
                | Table::ProfileBatches
                | Table::Stats
                | Table::StatsQuantiles
                | Table::Histograms
                | Table::Classes
                | Table::Clusters
                | Table::Latency
                | Table::LatencyApps
                | Table::Reductions
        )
    }

    /// The schema version that added the table: an older store has no rows of it (see also
    /// [`STATS_APP_SINCE`] for a column added later).
    fn since(self) -> u32 {
        match self {
            Table::StatsQuantiles => 13,
            Table::Outliers | Table::OutlierEvents => 12,
            Table::Clusters => 14,
            Table::Latency | Table::LatencyApps => 16,
            Table::RoundApps => 17,
            _ => 1,
        }
    }

    fn has_rounds(self) -> bool {
        !matches!(
            self,
            Table::Names | Table::NameCollisions | Table::Nodes | Table::Streams
        )
    }
}

/// The join docs/architecture.md shows: every rank's event of a passthrough round (`samples`, stream `?1`) beside
/// its node's sample of the same round from the node stream (`?2`), matched through the node's rank ranges.
pub const RANK_NODE_QUERY: &str = "SELECT s.round, s.app, s.rank, s.event_id, s.excl_us,
       ns.node_id, ns.hostname, ns.cpu_user_share, ns.mem_used_bytes, ns.load_1m
FROM samples AS s
JOIN node_ranks AS nr
  ON nr.stream_id = ?2 AND nr.round = s.round AND nr.app = s.app
 AND s.rank BETWEEN nr.first_rank AND nr.last_rank AND nr.late = 0
JOIN node_samples AS ns
  ON ns.stream_id = nr.stream_id AND ns.round = nr.round AND ns.node_id = nr.node_id AND ns.late = 0
WHERE s.stream_id = ?1 AND s.late = 0
ORDER BY s.round, s.app, s.rank";

/// A query that reads the shapes every user of the store shares, for people to try (`canopy up` prints it).
pub const EXAMPLE_QUERY: &str = "SELECT stream_name, round, covered, expected FROM rounds";

/// A run's store, open read-only.
#[derive(Debug)]
pub struct StoreReader {
    conn: Connection,
    path: PathBuf,
    version: u32,
}

impl Drop for StoreReader {
    /// The last reader of an ended run that is still in WAL mode (a reader was open when the front-end closed
    /// it) folds the log into the file and leaves a rollback journal, so no `-wal` or `-shm` stays beside the
    /// file. It is skipped while anyone else has the file open, and for a run not ended (its writer may come
    /// back); a file this process may not write is left as it is.
    fn drop(&mut self) {
        let wal = self
            .conn
            .pragma_query_value(None, "journal_mode", |r| r.get::<_, String>(0))
            .is_ok_and(|mode| mode.eq_ignore_ascii_case("wal"));
        if !wal || !matches!(self.meta(crate::ENDED), Ok(Some(_))) {
            return;
        }
        // Our own connection must be closed first: leaving WAL mode needs the file to itself.
        let Ok(placeholder) = Connection::open_in_memory() else {
            return;
        };
        drop(std::mem::replace(&mut self.conn, placeholder));
        let folded =
            Connection::open_with_flags(&self.path, OpenFlags::SQLITE_OPEN_READ_WRITE).and_then(|conn| {
                conn.busy_timeout(Duration::ZERO)?;
                conn.pragma_update_and_check(None, "journal_mode", "DELETE", |r| r.get::<_, String>(0))
            });
        if let Err(error) = folded {
            tracing::debug!(path = %self.path.display(), %error, "the ended run stays in WAL mode");
        }
    }
}

impl StoreReader {
    /// Opens `path` read-only. A store older than version 2 must first be opened for writing
    /// ([`crate::Store::open`]), which migrates it; one from a newer Canopy is refused.
    pub fn open(path: &Path) -> Result<StoreReader, StoreError> {
        // The writer holds the lock only for a round's commit; wait for it rather than fail.
        let (conn, version) = schema::open_beside_writer(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY,
            Duration::from_secs(5),
            OLDEST_READABLE,
        )?;
        conn.set_prepared_statement_cache_capacity(32);
        Ok(StoreReader {
            conn,
            path: path.to_path_buf(),
            version,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version of the file.
    pub fn schema_version(&self) -> u32 {
        self.version
    }

    /// Per stream, the highest round stored.
    pub fn last_rounds(&self) -> Result<Vec<(u32, u64)>, StoreError> {
        self.rows(
            "SELECT stream_id, MAX(round) FROM rounds GROUP BY stream_id ORDER BY stream_id",
            &[],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    }

    /// A `meta` fact (`node_id`, `rounds_end`, `started_unix_ns`...).
    pub fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .prepare_cached("SELECT value FROM meta WHERE key = ?1")
            .and_then(|mut st| st.query_row([key], |r| r.get(0)).optional())
            .map(Option::flatten)
            .map_err(self.sqlite())
    }

    /// Every stream, by id, with its counts.
    pub fn streams(&self) -> Result<Vec<StreamRow>, StoreError> {
        let mut streams = self.rows(
            "SELECT s.stream_id, COALESCE(s.name, ''), COALESCE(s.filter, ''), COALESCE(s.params, ''),
                    COALESCE(s.sync_mode, ''), COALESCE(s.timeout_ms, 0), COALESCE(s.state, ''), s.failure,
                    s.result_type, COALESCE(s.ranks, ''), s.opened_unix_ns, s.closed_unix_ns,
                    (SELECT COUNT(*) FROM rounds r WHERE r.stream_id = s.stream_id),
                    (SELECT COUNT(*) FROM rounds r WHERE r.stream_id = s.stream_id AND r.covered = r.expected),
                    (SELECT COUNT(*) FROM late_arrivals l WHERE l.stream_id = s.stream_id),
                    (SELECT MAX(round) FROM rounds r WHERE r.stream_id = s.stream_id)
             FROM streams s ORDER BY s.stream_id",
            &[],
            |r| {
                Ok(StreamRow {
                    stream_id: r.get(0)?,
                    name: r.get(1)?,
                    filter: r.get(2)?,
                    params: r.get(3)?,
                    sync_mode: SyncMode::from_word(&r.get::<_, String>(4)?).unwrap_or(SyncMode::WaitForAll),
                    timeout_ms: r.get(5)?,
                    state: StreamState::from_word(&r.get::<_, String>(6)?),
                    failure: r.get(7)?,
                    result_type: r.get(8)?,
                    ranks: r.get(9)?,
                    stages: Vec::new(),
                    opened_unix_ns: opt_u64(r, 10)?,
                    closed_unix_ns: opt_u64(r, 11)?,
                    rounds: u64_at(r, 12)?,
                    full_rounds: u64_at(r, 13)?,
                    late_packets: u64_at(r, 14)?,
                    last_round: opt_u64(r, 15)?,
                })
            },
        )?;
        if self.version >= 11 {
            let stages: Vec<(u32, u64, String)> = self.rows(
                "SELECT stream_id, from_round, ranks FROM stream_ranks ORDER BY stream_id, from_round",
                &[],
                |r| Ok((r.get(0)?, u64_at(r, 1)?, r.get(2)?)),
            )?;
            for (id, from, ranks) in stages {
                if let Some(s) = streams.iter_mut().find(|s| s.stream_id == id) {
                    s.stages.push((from, ranks));
                }
            }
        }
        Ok(streams)
    }
    /// One stream, by id.
    pub fn stream(&self, stream_id: u32) -> Result<Option<StreamRow>, StoreError> {
        Ok(self.streams()?.into_iter().find(|s| s.stream_id == stream_id))
    }

    /// One stream, by name (the first opened, if several share it).
    pub fn stream_named(&self, name: &str) -> Result<Option<StreamRow>, StoreError> {
        Ok(self.streams()?.into_iter().find(|s| s.name == name))
    }

    /// Rounds, by stream then round.
    pub fn rounds(&self, select: Select) -> Result<Vec<RoundRow>, StoreError> {
        let (clause, values) = select.clause(false);
        let sql = format!(
            "SELECT {ROUND_COLUMNS}, {} FROM rounds{clause} ORDER BY stream_id, round",
            missing_columns_at(self.version)
        );
        self.rows(&sql, &values, round_row)
    }

    /// Each round's coverage per application (`round_apps`), by stream, round and application; none in a store
    /// older than version 17.
    pub fn round_apps(&self, select: Select) -> Result<Vec<RoundAppRow>, StoreError> {
        if self.version < Table::RoundApps.since() {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(false);
        let sql = format!(
            "SELECT stream_id, round, app, covered, expected, missing_reason, {} FROM round_apps{clause}
             ORDER BY stream_id, round, app",
            missing_columns_at(self.version)
        );
        self.rows(&sql, &values, |r| {
            let mut missing = MissingCounts::default();
            for (i, (reason, _)) in <canopy_proto::v1::MissingReason as Word>::WORDS
                .iter()
                .enumerate()
            {
                missing.set(*reason, r.get(6 + i)?);
            }
            Ok(RoundAppRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                app: r.get(2)?,
                covered: r.get(3)?,
                expected: r.get(4)?,
                missing_reason: r.get(5)?,
                missing,
            })
        })
    }

    /// Each application's rank-rounds covered, expected and missing per reason over the rounds `select` picks,
    /// summed in SQL (a long run's `round_apps` is not read row by row), by application name.
    pub fn app_coverage(&self, select: Select) -> Result<Vec<AppCoverageTotal>, StoreError> {
        if self.version < Table::RoundApps.since() {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(false);
        let reasons = <canopy_proto::v1::MissingReason as Word>::WORDS;
        let sums: Vec<String> = missing_columns_at(self.version)
            .split(", ")
            .map(|c| match c.starts_with("0 AS ") {
                // A column the store's version lacks.
                true => "0".to_string(),
                false => format!("sum({c})"),
            })
            .collect();
        let sql = format!(
            "SELECT app, sum(covered), sum(expected), {} FROM round_apps{clause} GROUP BY app ORDER BY app",
            sums.join(", ")
        );
        self.rows(&sql, &values, |r| {
            let mut missing = Vec::new();
            for (i, (reason, _)) in reasons.iter().enumerate() {
                let n = u64_at(r, 3 + i)?;
                if n > 0 {
                    missing.push((*reason, n));
                }
            }
            Ok(AppCoverageTotal {
                app: r.get(0)?,
                covered: u64_at(r, 1)?,
                expected: u64_at(r, 2)?,
                missing,
            })
        })
    }

    /// The rounds stored since `cursor` (in the order they were first stored), moving it past them. A round
    /// stored in pieces is returned once, with what its first piece brought.
    pub fn new_rounds(&self, cursor: &mut RoundCursor) -> Result<Vec<RoundRow>, StoreError> {
        let sql = format!(
            "SELECT {ROUND_COLUMNS}, {}, rowid FROM rounds WHERE rowid > ?1 ORDER BY rowid",
            missing_columns_at(self.version)
        );
        let rows = self.rows(&sql, &[cursor.0], |r| {
            let rowid: i64 = r.get(ROUND_FIELDS + REASON_COUNT)?;
            Ok((rowid, round_row(r)?))
        })?;
        if let Some((rowid, _)) = rows.last() {
            cursor.0 = *rowid;
        }
        Ok(rows.into_iter().map(|(_, row)| row).collect())
    }

    /// How many rows a table holds.
    pub fn count(&self, table: Table) -> Result<u64, StoreError> {
        self.count_where(table, Select::all())
    }

    /// How many rows of a table `select` picks (tables without rounds or streams ignore those).
    pub fn count_where(&self, table: Table, select: Select) -> Result<u64, StoreError> {
        if self.version < table.since() {
            return Ok(0);
        }
        let select = if table.has_rounds() { select } else { Select::all() };
        let (clause, values) = select.clause(table.has_late());
        let sql = format!("SELECT COUNT(*) FROM {}{clause}", table.name());
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut st| st.query_row(params_from_iter(&values), |r| r.get::<_, i64>(0)))
            .map(unsigned)
            .map_err(self.sqlite())
    }

    /// The last round stored, of any stream.
    pub fn max_round(&self) -> Result<Option<u64>, StoreError> {
        self.conn
            .prepare_cached("SELECT MAX(round) FROM rounds")
            .and_then(|mut st| st.query_row([], |r| r.get::<_, Option<i64>>(0)))
            .map(|v| v.map(unsigned))
            .map_err(self.sqlite())
    }

    /// The run at a glance.
    pub fn summary(&self) -> Result<StoreSummary, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT COUNT(*), COUNT(DISTINCT stream_id), COALESCE(SUM(covered = expected), 0),
                        COALESCE(SUM(covered), 0), COALESCE(SUM(expected), 0), COALESCE(SUM(result_bytes), 0),
                        (SELECT COUNT(*) FROM late_arrivals)
                 FROM rounds",
            )
            .and_then(|mut st| {
                st.query_row([], |r| {
                    Ok(StoreSummary {
                        rounds: u64_at(r, 0)?,
                        streams: u64_at(r, 1)?,
                        full_rounds: u64_at(r, 2)?,
                        covered: u64_at(r, 3)?,
                        expected: u64_at(r, 4)?,
                        result_bytes: u64_at(r, 5)?,
                        late_packets: u64_at(r, 6)?,
                    })
                })
            })
            .map_err(self.sqlite())
    }

    /// A stream's rounds from `from_round` on, as a replay sends them: the coverage of each, and its result as
    /// stored (a passthrough round's batch byte for byte; else the last phase's result). Late data is left out.
    pub fn stored_rounds(&self, stream: &StreamRow, from_round: u64) -> Result<Vec<StoredRound>, StoreError> {
        self.stored_rounds_in(stream, Select::all().from_round(from_round))
    }

    /// A stream's rounds `first..=last`, as [`StoreReader::stored_rounds`] gives them.
    pub fn stored_rounds_between(
        &self,
        stream: &StreamRow,
        first: u64,
        last: u64,
    ) -> Result<Vec<StoredRound>, StoreError> {
        self.stored_rounds_in(stream, Select::all().from_round(first).to_round(last))
    }

    fn stored_rounds_in(&self, stream: &StreamRow, select: Select) -> Result<Vec<StoredRound>, StoreError> {
        let select = select.stream(stream.stream_id);
        let mut apps: BTreeMap<u64, Vec<RoundAppRow>> = BTreeMap::new();
        for a in self.round_apps(select)? {
            apps.entry(a.round).or_default().push(a);
        }
        self.rounds(select)?
            .into_iter()
            .map(|r| {
                let apps = apps.remove(&r.round).unwrap_or_default();
                self.stored_round_of(stream, r, apps)
            })
            .collect()
    }

    /// How many rounds of a stream, from the row `from_row` on, have no `kafka_rounds` row.
    pub fn count_unpublished(&self, stream_id: u32, from_row: i64) -> Result<u64, StoreError> {
        let sql = match self.version < KAFKA_SINCE {
            true => "SELECT count(*) FROM rounds WHERE stream_id = ?1 AND rowid >= ?2",
            false => {
                "SELECT count(*) FROM rounds r WHERE r.stream_id = ?1 AND r.rowid >= ?2
                 AND NOT EXISTS (SELECT 1 FROM kafka_rounds k WHERE k.stream_id = r.stream_id AND k.round = r.round)"
            }
        };
        let n = self.rows(sql, &[i64::from(stream_id), from_row], |r| r.get::<_, i64>(0))?;
        Ok(n.first().copied().map_or(0, unsigned))
    }

    fn stored_round_of(
        &self,
        stream: &StreamRow,
        r: RoundRow,
        apps: Vec<RoundAppRow>,
    ) -> Result<StoredRound, StoreError> {
        let payload = match stream.result_type.as_deref() == Some(PROFILE_BATCH_TYPE) {
            true => self.profile_batch(stream.stream_id, r.round)?,
            false => self.final_result(stream.stream_id, r.round)?,
        };
        Ok(StoredRound {
            round: r.round,
            covered: r.covered,
            expected: r.expected,
            missing: r.missing,
            apps,
            payload: payload.unwrap_or_default(),
        })
    }

    /// Up to `limit` rounds of a stream that have no `kafka_rounds` row (neither published nor given up on), in
    /// the order they were stored, from the row `from_row` on (a row's `rowid`: rows are only ever added, so a
    /// round stored later, such as one that waited for its time-out, or one the end of the run adds, is never
    /// behind the cursor): each round's rowid and number. Before schema version 21 (no such table) every round.
    pub fn unpublished_rounds(
        &self,
        stream_id: u32,
        from_row: i64,
        limit: u32,
    ) -> Result<Vec<(i64, u64)>, StoreError> {
        let sql = match self.version < KAFKA_SINCE {
            true => "SELECT rowid, round FROM rounds WHERE stream_id = ?1 AND rowid >= ?2 ORDER BY rowid LIMIT ?3",
            false => {
                "SELECT r.rowid, r.round FROM rounds r
                 WHERE r.stream_id = ?1 AND r.rowid >= ?2
                   AND NOT EXISTS (SELECT 1 FROM kafka_rounds k WHERE k.stream_id = r.stream_id AND k.round = r.round)
                 ORDER BY r.rowid LIMIT ?3"
            }
        };
        self.rows(sql, &[i64::from(stream_id), from_row, i64::from(limit)], |r| {
            Ok((r.get::<_, i64>(0)?, unsigned(r.get(1)?)))
        })
    }

    /// A passthrough round's profiles as stored (its pieces, for a don't-wait stream, one after the other, which
    /// decodes as one batch); `None` if it has none (stored before schema version 3).
    pub fn profile_batch(&self, stream_id: u32, round: u64) -> Result<Option<Vec<u8>>, StoreError> {
        if self.version < 3 {
            return Ok(None);
        }
        profiles::read(&self.conn, stream_id, round).map_err(self.sqlite())
    }

    /// The result a round closed with (its last phase), if it has one.
    pub fn final_result(&self, stream_id: u32, round: u64) -> Result<Option<Vec<u8>>, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT payload FROM results WHERE stream_id = ?1 AND round = ?2 AND late = 0
                 ORDER BY phase DESC LIMIT 1",
            )
            .and_then(|mut st| {
                st.query_row(rusqlite::params![stream_id, sat(round)], |r| {
                    r.get::<_, Option<Vec<u8>>>(0)
                })
                .optional()
            })
            .map(Option::flatten)
            .map_err(self.sqlite())
    }

    /// Each rank's events summed over a passthrough stream's rounds (late rows aside), in SQL: a long run's
    /// `samples` is not read row by row. By app, rank and event.
    pub fn rank_totals(&self, stream_id: u32) -> Result<Vec<RankTotal>, StoreError> {
        let sql = "SELECT app, rank, event_id, sum(coalesce(calls, 0)), sum(coalesce(incl_us, 0)),
                          sum(coalesce(excl_us, 0))
                   FROM samples WHERE stream_id = ?1 AND late = 0
                   GROUP BY app, rank, event_id ORDER BY app, rank, event_id";
        self.rows(sql, &[i64::from(stream_id)], |r| {
            Ok(RankTotal {
                app: r.get(0)?,
                rank: r.get(1)?,
                event_id: id_of(r.get(2)?),
                calls: u64_at(r, 3)?,
                incl_us: r.get(4)?,
                excl_us: r.get(5)?,
            })
        })
    }

    /// Rows of `samples`, by stream, round, app, rank, then as stored.
    pub fn samples(&self, select: Select) -> Result<Vec<SampleRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, app, rank, event_id, calls, subrs, incl_us, excl_us, calls_total,
                    subrs_total, incl_total_us, excl_total_us, dump_unix_ns, late
             FROM samples{clause} ORDER BY stream_id, round, app, rank, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(SampleRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                app: r.get(2)?,
                rank: r.get(3)?,
                event_id: id_of(r.get(4)?),
                calls: opt_u64(r, 5)?,
                subrs: opt_u64(r, 6)?,
                incl_us: r.get(7)?,
                excl_us: r.get(8)?,
                calls_total: opt_u64(r, 9)?,
                subrs_total: opt_u64(r, 10)?,
                incl_total_us: r.get(11)?,
                excl_total_us: r.get(12)?,
                dump_unix_ns: opt_u64(r, 13)?,
                late: r.get(14)?,
            })
        })
    }

    /// Rows of `counters`, by stream, round, app, rank, then as stored.
    pub fn counters(&self, select: Select) -> Result<Vec<CounterRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, app, rank, counter_id, value, total, dump_unix_ns, late
             FROM counters{clause} ORDER BY stream_id, round, app, rank, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(CounterRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                app: r.get(2)?,
                rank: r.get(3)?,
                counter_id: id_of(r.get(4)?),
                value: r.get(5)?,
                total: r.get(6)?,
                dump_unix_ns: opt_u64(r, 7)?,
                late: r.get(8)?,
            })
        })
    }

    /// Rows of `event_metrics`, by stream, round, app and rank, then as stored (event by event, each event's
    /// metrics in the profile's order).
    pub fn event_metrics(&self, select: Select) -> Result<Vec<EventMetricRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, app, rank, event_id, metric, value, total, late
             FROM event_metrics{clause} ORDER BY stream_id, round, app, rank, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(EventMetricRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                app: r.get(2)?,
                rank: r.get(3)?,
                event_id: id_of(r.get(4)?),
                metric: metric(r, 5)?,
                value: r.get(6)?,
                total: r.get(7)?,
                late: r.get(8)?,
            })
        })
    }

    /// Rows of `trace`, by stream, round, app, rank, thread, then in time order.
    pub fn trace(&self, select: Select) -> Result<Vec<TraceRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, app, rank, thread, unix_ns, kind, event_id, peer, bytes, late
             FROM trace{clause} ORDER BY stream_id, round, app, rank, thread, unix_ns, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(TraceRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                app: r.get(2)?,
                rank: r.get(3)?,
                thread: r.get(4)?,
                unix_ns: u64_at(r, 5)?,
                kind: r.get(6)?,
                event_id: r.get::<_, Option<i64>>(7)?.map(id_of),
                peer: r.get(8)?,
                bytes: opt_u64(r, 9)?,
                late: r.get(10)?,
            })
        })
    }

    /// Rows of `utilization`, by stream, round and bin, then in activity order as stored (0, "other", first).
    /// A store older than version 7 has none.
    pub fn utilization(&self, select: Select) -> Result<Vec<UtilizationRow>, StoreError> {
        if self.version < 7 {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, bin, start_unix_ns, activity_id, share, ranks, late
             FROM utilization{clause} ORDER BY stream_id, round, bin, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(UtilizationRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                bin: r.get(2)?,
                start_unix_ns: u64_at(r, 3)?,
                activity_id: id_of(r.get(4)?),
                share: r.get(5)?,
                ranks: r.get(6)?,
                late: r.get(7)?,
            })
        })
    }

    /// Rows of `outliers`, by stream and round, then as stored: group by group in the result's order (class ids
    /// as unsigned numbers), each by place in the group's top (0: the highest score). A store older than
    /// version 12 has none.
    pub fn outliers(&self, select: Select) -> Result<Vec<OutlierRow>, StoreError> {
        if self.version < 12 {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, class_id, position, app, rank, score, group_ranks, late
             FROM outliers{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(OutlierRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                class_id: id_of(r.get(2)?),
                position: r.get(3)?,
                app: r.get(4)?,
                rank: r.get(5)?,
                score: r.get(6)?,
                group_ranks: u64_at(r, 7)?,
                late: r.get(8)?,
            })
        })
    }

    /// Rows of `outlier_events`, by stream and round, then as stored: by group, the rank's place and the event's.
    /// A store older than version 12 has none.
    pub fn outlier_events(&self, select: Select) -> Result<Vec<OutlierEventRow>, StoreError> {
        if self.version < 12 {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, class_id, position, event_position, event_id, metric, value, mean, std,
                    contribution, late
             FROM outlier_events{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(OutlierEventRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                class_id: id_of(r.get(2)?),
                position: r.get(3)?,
                event_position: r.get(4)?,
                event_id: id_of(r.get(5)?),
                metric: metric(r, 6)?,
                value: r.get(7)?,
                mean: r.get(8)?,
                std: r.get(9)?,
                contribution: r.get(10)?,
                late: r.get(11)?,
            })
        })
    }

    /// Rows of `latency`, by stream and round, then by key and step. A store older than version 16 has none.
    pub fn latency(&self, select: Select) -> Result<Vec<LatencyRow>, StoreError> {
        if self.version < 16 {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, key_id, step, latency_ns, start_unix_ns, start_app, start_rank,
                    stop_unix_ns, stop_app, stop_rank, late
             FROM latency{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(LatencyRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                key_id: id_of(r.get(2)?),
                step: u64_at(r, 3)?,
                latency_ns: u64_at(r, 4)?,
                start_unix_ns: u64_at(r, 5)?,
                start_app: r.get(6)?,
                start_rank: r.get(7)?,
                stop_unix_ns: u64_at(r, 8)?,
                stop_app: r.get(9)?,
                stop_rank: r.get(10)?,
                late: r.get(11)?,
            })
        })
    }

    /// Rows of `latency_apps`, by stream and round, then by key, step and application. A store older than
    /// version 16 has none.
    pub fn latency_apps(&self, select: Select) -> Result<Vec<LatencyAppRow>, StoreError> {
        if self.version < 16 {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, key_id, step, app, ranks, transfer_us, compute_us, late
             FROM latency_apps{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(LatencyAppRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                key_id: id_of(r.get(2)?),
                step: u64_at(r, 3)?,
                app: r.get(4)?,
                ranks: r.get(5)?,
                transfer_us: r.get(6)?,
                compute_us: r.get(7)?,
                late: r.get(8)?,
            })
        })
    }

    /// Rows of `node_samples`, by stream, round and node. A store older than version 8 has none.
    pub fn node_samples(&self, select: Select) -> Result<Vec<NodeSampleRow>, StoreError> {
        if self.version < 8 {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT {NODE_SAMPLE_COLUMNS} FROM node_samples{clause} ORDER BY stream_id, round, node_id, rowid"
        );
        self.rows(&sql, &values, node_sample_row)
    }

    /// Rows of `node_ranks`, by stream, round, node, then rank. A store older than version 8 has none.
    pub fn node_ranks(&self, select: Select) -> Result<Vec<NodeRanksRow>, StoreError> {
        if self.version < 8 {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, node_id, app, first_rank, last_rank, late
             FROM node_ranks{clause} ORDER BY stream_id, round, node_id, app, first_rank"
        );
        self.rows(&sql, &values, |r| {
            Ok(NodeRanksRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                node_id: r.get(2)?,
                app: r.get(3)?,
                first_rank: r.get(4)?,
                last_rank: r.get(5)?,
                late: r.get(6)?,
            })
        })
    }

    /// The sample of the node that served `(app, rank)` in `round` of the node stream `nodes_stream`, found as a
    /// user's SQL finds it (`node_ranks` joined to `node_samples`, see [`RANK_NODE_QUERY`]); `None` if no sample
    /// of that round names the rank. Late samples are left out.
    pub fn rank_node_sample(
        &self,
        nodes_stream: u32,
        round: u64,
        app: &str,
        rank: u32,
    ) -> Result<Option<NodeSampleRow>, StoreError> {
        if self.version < 8 {
            return Ok(None);
        }
        let sql = format!(
            "SELECT {NODE_SAMPLE_COLUMNS} FROM node_samples WHERE rowid = (
                 SELECT ns.rowid FROM node_ranks nr
                 JOIN node_samples ns ON ns.stream_id = nr.stream_id AND ns.round = nr.round
                                      AND ns.node_id = nr.node_id AND ns.late = 0
                 WHERE nr.stream_id = ?1 AND nr.round = ?2 AND nr.app = ?3
                   AND ?4 BETWEEN nr.first_rank AND nr.last_rank AND nr.late = 0
                 ORDER BY ns.rowid LIMIT 1)"
        );
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut st| {
                st.query_row(
                    rusqlite::params![nodes_stream, sat(round), app, rank],
                    node_sample_row,
                )
                .optional()
            })
            .map_err(self.sqlite())
    }

    /// Rows of `results`, by stream, round, then as stored.
    pub fn results(&self, select: Select) -> Result<Vec<ResultRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, phase, payload, late FROM results{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(ResultRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                phase: r.get(2)?,
                payload: r.get::<_, Option<Vec<u8>>>(3)?.unwrap_or_default(),
                late: r.get(4)?,
            })
        })
    }

    /// The `app` column of `stats` and `stats_quantiles`, or NULL in a store older than the column.
    fn stats_app(&self) -> &'static str {
        if self.version >= STATS_APP_SINCE {
            "app"
        } else {
            "NULL"
        }
    }

    /// Rows of `stats`, by stream, round, then as stored.
    pub fn stats(&self, select: Select) -> Result<Vec<StatRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let app = self.stats_app();
        let sql = format!(
            "SELECT stream_id, round, class_id, id, metric, count, mean, std, min, max, min_app, min_rank,
                    max_app, max_rank, late, {app}
             FROM stats{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(StatRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                class_id: r.get::<_, Option<i64>>(2)?.map(id_of),
                id: id_of(r.get(3)?),
                metric: metric(r, 4)?,
                count: u64_at(r, 5)?,
                mean: r.get(6)?,
                std: r.get(7)?,
                min: r.get(8)?,
                max: r.get(9)?,
                min_app: r.get(10)?,
                min_rank: r.get(11)?,
                max_app: r.get(12)?,
                max_rank: r.get(13)?,
                late: r.get(14)?,
                app: r.get(15)?,
            })
        })
    }

    /// Rows of `stats_quantiles` (none in a store older than the table), by stream, round, then as stored.
    pub fn stats_quantiles(&self, select: Select) -> Result<Vec<QuantileRow>, StoreError> {
        if self.version < Table::StatsQuantiles.since() {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let app = self.stats_app();
        let sql = format!(
            "SELECT stream_id, round, class_id, id, metric, q, value, late, {app}
             FROM stats_quantiles{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(QuantileRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                class_id: r.get::<_, Option<i64>>(2)?.map(id_of),
                id: id_of(r.get(3)?),
                metric: metric(r, 4)?,
                q: r.get(5)?,
                value: r.get(6)?,
                late: r.get(7)?,
                app: r.get(8)?,
            })
        })
    }

    /// Bins of `histograms`, by stream, round, then as stored.
    pub fn histograms(&self, select: Select) -> Result<Vec<HistogramRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let app = if self.version >= HISTOGRAMS_APP_SINCE {
            "app"
        } else {
            "NULL"
        };
        let sql = format!(
            "SELECT stream_id, round, class_id, id, metric, bin, lo, hi, count, late, {app}
             FROM histograms{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(HistogramRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                class_id: r.get::<_, Option<i64>>(2)?.map(id_of),
                id: id_of(r.get(3)?),
                metric: metric(r, 4)?,
                bin: r.get(5)?,
                lo: r.get(6)?,
                hi: r.get(7)?,
                count: u64_at(r, 8)?,
                late: r.get(9)?,
                app: r.get(10)?,
            })
        })
    }

    /// Rows of `classes`, by stream, round, then as stored.
    pub fn classes(&self, select: Select) -> Result<Vec<ClassRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, class_id, size, ranks, example_event, late
             FROM classes{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(ClassRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                class_id: id_of(r.get(2)?),
                size: u64_at(r, 3)?,
                ranks: r.get(4)?,
                example_event: r.get(5)?,
                late: r.get(6)?,
            })
        })
    }

    /// Rows of `clusters`, by stream, round and cluster, each with its ranks as compact ranges.
    pub fn clusters(&self, select: Select) -> Result<Vec<ClusterRow>, StoreError> {
        if self.version < Table::Clusters.since() {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, cluster, size, representative_app, representative_rank, rms, max_distance,
                    sum_squares, late
             FROM clusters{clause} ORDER BY stream_id, round, cluster, rowid"
        );
        let mut rows = self.rows(&sql, &values, |r| {
            let app: Option<String> = r.get(4)?;
            let rank: Option<u32> = r.get(5)?;
            Ok(ClusterRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                cluster: r.get(2)?,
                size: u64_at(r, 3)?,
                ranks: String::new(),
                representative: app.zip(rank),
                rms: r.get(6)?,
                max_distance: r.get(7)?,
                sum_squares: r.get(8)?,
                late: r.get(9)?,
            })
        })?;
        let sql = format!(
            "SELECT stream_id, round, cluster, app, first_rank, last_rank, late
             FROM cluster_ranks{clause} ORDER BY stream_id, round, cluster, app, first_rank"
        );
        let ranges = self.rows(&sql, &values, |r| {
            Ok((
                (
                    r.get::<_, u32>(0)?,
                    u64_at(r, 1)?,
                    r.get::<_, u32>(2)?,
                    r.get::<_, bool>(6)?,
                ),
                RankRange {
                    app: r.get(3)?,
                    first: r.get(4)?,
                    last: r.get(5)?,
                },
            ))
        })?;
        let mut by_cluster: std::collections::HashMap<(u32, u64, u32, bool), Vec<RankRange>> =
            std::collections::HashMap::new();
        for (key, range) in ranges {
            by_cluster.entry(key).or_default().push(range);
        }
        for row in &mut rows {
            let key = (row.stream_id, row.round, row.cluster, row.late);
            if let Some(mine) = by_cluster.get(&key) {
                row.ranks = crate::tables::ranges_text(mine);
            }
        }
        Ok(rows)
    }

    /// Rows of `reductions`, by stream, round, then as stored.
    pub fn reductions(&self, select: Select) -> Result<Vec<ReductionRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, raw_bytes, result_bytes, reduction_factor, classes, late
             FROM reductions{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(ReductionRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                raw_bytes: u64_at(r, 2)?,
                result_bytes: u64_at(r, 3)?,
                reduction_factor: r.get(4)?,
                classes: opt_u64(r, 5)?,
                late: r.get(6)?,
            })
        })
    }

    /// Rows of `late_arrivals`, in the order they arrived.
    pub fn late_arrivals(&self, select: Select) -> Result<Vec<LateArrival>, StoreError> {
        let (clause, values) = select.clause(false);
        let sql = format!(
            "SELECT stream_id, round, ranks, bytes, arrived_unix_ns FROM late_arrivals{clause} ORDER BY rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(LateArrival {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                ranks: r.get(2)?,
                bytes: u64_at(r, 3)?,
                arrived_unix_ns: opt_u64(r, 4)?,
            })
        })
    }

    /// Event and counter names (id, name), by name.
    pub fn names(&self) -> Result<Vec<(u64, String)>, StoreError> {
        self.rows("SELECT id, name FROM names ORDER BY name", &[], |r| {
            Ok((id_of(r.get(0)?), r.get(1)?))
        })
    }

    /// Names that share an id with an earlier one.
    pub fn name_collisions(&self) -> Result<Vec<Collision>, StoreError> {
        self.rows(
            "SELECT id, existing, new FROM name_collisions ORDER BY rowid",
            &[],
            |r| {
                Ok(Collision {
                    id: id_of(r.get(0)?),
                    existing: r.get(1)?,
                    new: r.get(2)?,
                })
            },
        )
    }

    /// The tree's nodes, by id.
    pub fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        self.rows(
            "SELECT node_id, COALESCE(kind, ''), parent, COALESCE(state, ''), COALESCE(ranks_below, 0), address,
                    detail, first_seen_unix_ns, updated_unix_ns
             FROM nodes ORDER BY node_id",
            &[],
            |r| {
                Ok(NodeRow {
                    node_id: r.get(0)?,
                    kind: NodeKind::from_word(&r.get::<_, String>(1)?).unwrap_or(NodeKind::Unspecified),
                    parent: r.get(2)?,
                    state: NodeState::from_word(&r.get::<_, String>(3)?).unwrap_or(NodeState::Unspecified),
                    ranks_below: r.get(4)?,
                    address: r.get(5)?,
                    detail: r.get(6)?,
                    first_seen_unix_ns: opt_u64(r, 7)?,
                    updated_unix_ns: opt_u64(r, 8)?,
                })
            },
        )
    }

    /// A node's history, oldest first: its parent and state each time either changed (an adoption, a loss, a
    /// return), with the ranks below it and the detail then.
    pub fn node_history(&self, node_id: &str) -> Result<Vec<NodeChange>, StoreError> {
        let change = |r: &Row<'_>| {
            Ok(NodeChange {
                parent: r.get(0)?,
                state: NodeState::from_word(&r.get::<_, String>(1)?).unwrap_or(NodeState::Unspecified),
                ranks_below: r.get(2)?,
                detail: r.get(3)?,
                at_unix_ns: opt_u64(r, 4)?,
            })
        };
        self.conn
            .prepare_cached(
                "SELECT parent, COALESCE(state, ''), COALESCE(ranks_below, 0), detail, at_unix_ns
                 FROM node_history WHERE node_id = ?1 ORDER BY at_unix_ns, rowid",
            )
            .and_then(|mut st| st.query_map([node_id], change)?.collect())
            .map_err(self.sqlite())
    }

    /// One node, by id.
    pub fn node(&self, node_id: &str) -> Result<Option<NodeRow>, StoreError> {
        Ok(self.nodes()?.into_iter().find(|n| n.node_id == node_id))
    }

    fn rows<T>(
        &self,
        sql: &str,
        values: &[i64],
        f: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>, StoreError> {
        self.conn
            .prepare_cached(sql)
            .and_then(|mut st| st.query_map(params_from_iter(values), f)?.collect())
            .map_err(self.sqlite())
    }

    fn sqlite(&self) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
        |source| StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }
}

/// The columns of `node_samples`, in [`NodeSampleRow`]'s order.
const NODE_SAMPLE_COLUMNS: &str = "stream_id, round, node_id, COALESCE(hostname, ''), COALESCE(ranks, ''), \
    sample_unix_ns, interval_ns, cpus, cpu_user_share, cpu_nice_share, cpu_system_share, cpu_idle_share, \
    cpu_iowait_share, cpu_irq_share, cpu_steal_share, mem_total_bytes, mem_available_bytes, mem_used_bytes, \
    mem_page_faults, mem_major_faults, net_rx_bytes, net_tx_bytes, net_interfaces, disk_read_bytes, \
    disk_write_bytes, disks, load_1m, load_5m, load_15m, load_runnable, load_threads, late";

fn node_sample_row(r: &Row<'_>) -> rusqlite::Result<NodeSampleRow> {
    Ok(NodeSampleRow {
        stream_id: r.get(0)?,
        round: u64_at(r, 1)?,
        node_id: r.get(2)?,
        hostname: r.get(3)?,
        ranks: r.get(4)?,
        sample_unix_ns: opt_u64(r, 5)?,
        interval_ns: opt_u64(r, 6)?,
        cpus: r.get(7)?,
        cpu_user_share: r.get(8)?,
        cpu_nice_share: r.get(9)?,
        cpu_system_share: r.get(10)?,
        cpu_idle_share: r.get(11)?,
        cpu_iowait_share: r.get(12)?,
        cpu_irq_share: r.get(13)?,
        cpu_steal_share: r.get(14)?,
        mem_total_bytes: opt_u64(r, 15)?,
        mem_available_bytes: opt_u64(r, 16)?,
        mem_used_bytes: opt_u64(r, 17)?,
        mem_page_faults: opt_u64(r, 18)?,
        mem_major_faults: opt_u64(r, 19)?,
        net_rx_bytes: opt_u64(r, 20)?,
        net_tx_bytes: opt_u64(r, 21)?,
        net_interfaces: r.get(22)?,
        disk_read_bytes: opt_u64(r, 23)?,
        disk_write_bytes: opt_u64(r, 24)?,
        disks: r.get(25)?,
        load_1m: r.get(26)?,
        load_5m: r.get(27)?,
        load_15m: r.get(28)?,
        load_runnable: r.get(29)?,
        load_threads: r.get(30)?,
        late: r.get(31)?,
    })
}

/// The columns of a round before its missing counts.
const ROUND_COLUMNS: &str = "stream_id, COALESCE(stream_name, ''), round, covered, expected, missing_reason, \
                             late_ranks, result_bytes, pieces, first_dump_unix_ns, closed_unix_ns";
const ROUND_FIELDS: usize = 11;
const REASON_COUNT: usize = crate::words::REASONS;

fn round_row(r: &Row<'_>) -> rusqlite::Result<RoundRow> {
    let mut missing = MissingCounts::default();
    for (i, (reason, _)) in <canopy_proto::v1::MissingReason as Word>::WORDS
        .iter()
        .enumerate()
    {
        missing.set(*reason, r.get(ROUND_FIELDS + i)?);
    }
    Ok(RoundRow {
        stream_id: r.get(0)?,
        stream: r.get(1)?,
        round: u64_at(r, 2)?,
        covered: r.get(3)?,
        expected: r.get(4)?,
        missing_reason: r.get(5)?,
        late_ranks: r.get(6)?,
        result_bytes: u64_at(r, 7)?,
        pieces: r.get(8)?,
        first_dump_unix_ns: opt_u64(r, 9)?,
        closed_unix_ns: opt_u64(r, 10)?,
        missing,
    })
}

fn u64_at(r: &Row<'_>, i: usize) -> rusqlite::Result<u64> {
    r.get::<_, i64>(i).map(unsigned)
}

fn opt_u64(r: &Row<'_>, i: usize) -> rusqlite::Result<Option<u64>> {
    Ok(r.get::<_, Option<i64>>(i)?.map(unsigned))
}

fn metric(r: &Row<'_>, i: usize) -> rusqlite::Result<Metric> {
    Ok(Metric::from_word(&r.get::<_, String>(i)?).unwrap_or(Metric::Unspecified))
}
