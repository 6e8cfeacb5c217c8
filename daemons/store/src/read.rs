//! [`StoreReader`]: typed queries over a run's store, for the API, the `canopy` command, the tests and the
//! benchmarks. It opens the file read-only, so it is safe while the front-end writes: every query sees the
//! rounds committed before it started, each whole.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use canopy_proto::filters::v1::RankRange;
use canopy_proto::v1::NodeState;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, params_from_iter};

use crate::StoreError;
use crate::profiles::{self, PROFILE_BATCH_TYPE};
use crate::rows::*;
use crate::schema;
use crate::table_row::{self, TableRow};

mod filters;
mod ranks;
mod select;

pub use select::{Select, Table};

/// The schema version that added `kafka_rounds` and `kafka_topics`.
pub(crate) const KAFKA_SINCE: u32 = 21;
use crate::sql::{id_of, sat, unsigned};
use crate::store::Collision;
use crate::words::Word;

/// The oldest schema the reader understands (version 2 added `rounds.missing_dropped`).
const OLDEST_READABLE: u32 = 2;

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
        let mut streams: Vec<StreamRow> = self.table_rows(Select::all())?;
        let rounds: Vec<(u32, u64, u64, Option<u64>)> = self.rows(
            "SELECT stream_id, COUNT(*), COALESCE(SUM(covered = expected), 0), MAX(round) FROM rounds
             GROUP BY stream_id",
            &[],
            |r| Ok((r.get(0)?, u64_at(r, 1)?, u64_at(r, 2)?, opt_u64(r, 3)?)),
        )?;
        for (id, count, full, last) in rounds {
            if let Some(s) = streams.iter_mut().find(|s| s.stream_id == id) {
                (s.rounds, s.full_rounds, s.last_round) = (count, full, last);
            }
        }
        let late: Vec<(u32, u64)> = self.rows(
            "SELECT stream_id, COUNT(*) FROM late_arrivals GROUP BY stream_id",
            &[],
            |r| Ok((r.get(0)?, u64_at(r, 1)?)),
        )?;
        for (id, count) in late {
            if let Some(s) = streams.iter_mut().find(|s| s.stream_id == id) {
                s.late_packets = count;
            }
        }
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
        self.table_rows(select)
    }

    /// Each round's coverage per application (`round_apps`), by stream, round and application; none in a store
    /// older than version 17.
    pub fn round_apps(&self, select: Select) -> Result<Vec<RoundAppRow>, StoreError> {
        self.table_rows(select)
    }

    /// Each application's rank-rounds covered, expected and missing per reason over the rounds `select` picks,
    /// summed in SQL (a long run's `round_apps` is not read row by row), by application name.
    pub fn app_coverage(&self, select: Select) -> Result<Vec<AppCoverageTotal>, StoreError> {
        if self.version < Table::RoundApps.since() {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(false);
        let reasons = <canopy_proto::v1::MissingReason as Word>::WORDS;
        let sums: Vec<String> = reasons
            .iter()
            .map(|(r, _)| match crate::rounds::column_since(*r) <= self.version {
                true => format!("sum({})", crate::words::missing_column(*r)),
                // A column the store's version lacks.
                false => "0".to_string(),
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
        let columns = RoundRow::columns();
        let sql = format!(
            "SELECT {}, rowid FROM rounds WHERE rowid > ?1 ORDER BY rowid",
            table_row::select_list(columns, self.version)
        );
        let rows = self.rows(&sql, &[cursor.0], |r| {
            let rowid: i64 = r.get(columns.len())?;
            Ok((rowid, RoundRow::read(r)?))
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

    /// Rows of `late_arrivals`, in the order they arrived.
    pub fn late_arrivals(&self, select: Select) -> Result<Vec<LateArrival>, StoreError> {
        self.table_rows(select)
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
        self.table_rows(Select::all())
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

    /// Rows of a table as its row type declares them (see [`table_row`](crate::table_row)), in its order: none
    /// from a store older than the table, NULL for a column newer than the store.
    fn table_rows<R: TableRow>(&self, select: Select) -> Result<Vec<R>, StoreError> {
        if self.version < R::TABLE.since() {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(R::TABLE.has_late());
        let sql = format!(
            "SELECT {} FROM {}{clause} ORDER BY {}",
            table_row::select_list(R::columns(), self.version),
            R::TABLE.name(),
            R::ORDER
        );
        self.rows(&sql, &values, R::read)
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

fn u64_at(r: &Row<'_>, i: usize) -> rusqlite::Result<u64> {
    r.get::<_, i64>(i).map(unsigned)
}

fn opt_u64(r: &Row<'_>, i: usize) -> rusqlite::Result<Option<u64>> {
    Ok(r.get::<_, Option<i64>>(i)?.map(unsigned))
}
