//! One run's store open for writing: the file's name and the `latest.sqlite` link, the connection's settings,
//! and one method per kind of fact the root records.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use canopy_proto::filters::v1::Metric;
use canopy_proto::v1::{MissingReason, NodeEvent, StreamSpec};
use canopy_wire::v1::ProfileBatch;
use prost::Message;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::checkpoint::Checkpointer;
use crate::rounds::{self, RoundRecord};
use crate::rows::{NodeRow, ResultRow, StreamRow};
use crate::schema::{self, SCHEMA_VERSION};
use crate::sql::{id_bits, non_empty, now_unix_ns, sat};
use crate::table_row::TableRow;
use crate::words::{StreamState, Word, metric_unit};
use crate::{StoreError, profiles, tables};

/// The name of the symlink that follows the newest run in the output directory.
pub const LATEST: &str = "latest.sqlite";

/// The `meta` key of when the run was ended ([`Store::end_run`]); absent while it runs, or if it never ended.
pub const ENDED: &str = "ended_unix_ns";

/// The writer's own checkpoint threshold (pages), a backstop for when the background thread cannot keep up or
/// did not start; SQLite's default of 1000 would stall a round every few seconds at 64 ranks.
const WRITER_AUTOCHECKPOINT_PAGES: u32 = 16_384;

/// What a commit adds to the WAL besides a round's payload and rows: the pages of its `rounds` row and indexes,
/// as the background checkpoints count it.
const COMMIT_BYTES: u64 = 4096;

/// The payload of a round, as the stream's filter left it.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    /// An encoded `ProfileBatch` (the passthrough filter).
    Profiles(&'a [u8]),
    /// Any other filter's final result, kept opaque.
    Blob {
        phase: u32,
        payload: &'a [u8],
    },
    None,
}

/// A result to write into its filter's tables (see [`crate::is_tabulated`]): its type, as its stream declared it,
/// and its bytes.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    pub result_type: &'a str,
    pub payload: &'a [u8],
}

impl Payload<'_> {
    fn len(&self) -> usize {
        match self {
            Payload::Profiles(b) => b.len(),
            Payload::Blob { payload, .. } => payload.len(),
            Payload::None => 0,
        }
    }
}

/// Two names that hash to the same id; the first one stored keeps the id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collision {
    pub id: u64,
    pub existing: String,
    pub new: String,
}

/// One run's SQLite file, open for writing.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
    checkpointer: Option<Checkpointer>,
    /// Rounds a late packet reached before their row was written (the root's filter was still finalizing the
    /// round, or an earlier run closed it): their row's `late_ranks` counts those packets once it is written.
    late_before_row: std::collections::BTreeSet<(u32, u64)>,
}

/// The most rounds remembered for late packets that came before their row; the oldest are forgotten beyond.
const LATE_BEFORE_ROW: usize = 4096;

impl Drop for Store {
    fn drop(&mut self) {
        let Some(checkpointer) = self.checkpointer.take() else {
            return;
        };
        // Stopped first, so the writer's connection closes last and removes the WAL on a clean exit.
        checkpointer.stop();
        // Back to a rollback journal: a reader that opens the finished run read-only then leaves no -wal and
        // -shm beside it (in WAL mode every reader creates them and, read-only, cannot remove them). It needs
        // the file to itself; with a reader still open it is skipped at once rather than waited for.
        let closed = self.conn.busy_timeout(Duration::ZERO).and_then(|()| {
            self.conn
                .pragma_update_and_check(None, "journal_mode", "DELETE", |r| r.get::<_, String>(0))
        });
        if let Err(error) = closed {
            tracing::debug!(path = %self.path.display(), %error, "the store stays in WAL mode");
        }
    }
}

impl Store {
    /// Creates `dir` if needed and a new file `dir/run-<unix seconds>-<pid>.sqlite` (if that exists add -2,
    /// -3...), WAL journal, synchronous=NORMAL, the schema at [`SCHEMA_VERSION`], and `meta` rows for
    /// `started_unix_ns` and `pid`; then points the symlink `dir/latest.sqlite` at it.
    pub fn create(dir: &Path) -> Result<Store, StoreError> {
        fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let started = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let stem = format!("run-{}-{}", started.as_secs(), std::process::id());
        let mut path = dir.join(format!("{stem}.sqlite"));
        let mut n = 2;
        // The pid in the name already separates processes; the suffix only separates runs of one process. An
        // unreadable directory ends the loop, and opening the file reports why.
        while path.try_exists().unwrap_or(false) {
            path = dir.join(format!("{stem}-{n}.sqlite"));
            n += 1;
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut store = Store::connect(&path, flags)?;
        let started = i64::try_from(started.as_nanos()).unwrap_or(i64::MAX).to_string();
        store.set_meta("started_unix_ns", &started)?;
        store.set_meta("pid", &std::process::id().to_string())?;
        link_latest(dir, &path);
        tracing::info!(path = %path.display(), "run store created");
        Ok(store)
    }

    /// Opens an existing file read-write (for tests and tools), bringing an older schema up to
    /// [`SCHEMA_VERSION`]; it does not create the file.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::connect(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Ends the run: a row for every round between a stream's first and last that no rank delivered (see
    /// [`rounds::fill_dropped_rounds`]), the streams still open closed, `meta.ended_unix_ns` (so a front-end started later begins a new run
    /// rather than continuing this one) and the indexes of per-rank series, built once over the finished tables.
    pub fn end_run(&mut self, at_unix_ns: i64) -> Result<(), StoreError> {
        let filled = self.in_transaction(rounds::fill_dropped_rounds)?;
        if filled > 0 {
            tracing::warn!(
                rounds = filled,
                "rounds no rank delivered (every rank dropped its dump) stored with their ranks as dropped"
            );
        }
        self.conn
            .execute_batch(schema::SERIES_INDEXES)
            .map_err(self.sqlite())?;
        // A stream still open when the run ends ended with it.
        self.conn
            .execute(
                "UPDATE streams SET state = 'closed', closed_unix_ns = COALESCE(closed_unix_ns, ?1)
                 WHERE state = 'open'",
                params![at_unix_ns],
            )
            .map_err(self.sqlite())?;
        self.set_meta(ENDED, &at_unix_ns.to_string())
    }

    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        crate::sql::set_meta(&self.conn, key, value).map_err(self.sqlite())
    }

    /// Upserts by stream_id; `opened_unix_ns` is set on the first insert, `closed_unix_ns` the first time the
    /// stream has ended. `result_type` (the protobuf type of its results) is kept once known.
    pub fn put_stream(
        &mut self,
        spec: &StreamSpec,
        state: StreamState,
        failure: Option<&str>,
        result_type: Option<&str>,
    ) -> Result<(), StoreError> {
        let now = now_unix_ns();
        let closed = state.is_ended().then_some(now);
        self.conn
            .prepare_cached(StreamRow::upsert())
            .and_then(|mut st| {
                st.execute(params![
                    spec.stream_id,
                    spec.name,
                    spec.filter,
                    spec.params,
                    spec.sync_mode().word(),
                    spec.timeout_ms,
                    state.word(),
                    failure,
                    now,
                    closed,
                    result_type,
                    spec.ranks,
                ])
            })
            .map_err(self.sqlite())?;
        for stage in &spec.stages {
            self.conn
                .prepare_cached(
                    "INSERT OR IGNORE INTO stream_ranks (stream_id, from_round, ranks, set_unix_ns)
                     VALUES (?1, ?2, ?3, ?4)",
                )
                .and_then(|mut st| st.execute(params![spec.stream_id, stage.from_round, stage.ranks, now]))
                .map_err(self.sqlite())?;
        }
        Ok(())
    }

    /// One transaction: upsert the `rounds` row (stream_id, round) and write the result.
    ///
    /// If the row exists (a don't-wait stream delivers a round in pieces) the covered and missing counts add up,
    /// expected is the largest seen and `missing_not_waited` becomes whatever no piece has accounted for yet.
    /// Profiles are kept whole in `profile_batches` and become one `samples` row per (rank, event) and one
    /// `counters` row per (rank, counter). On a decode error nothing is written.
    pub fn write_round(&mut self, rec: &RoundRecord, payload: Payload<'_>) -> Result<(), StoreError> {
        self.write_round_with(rec, payload, None)
    }

    /// [`Store::write_round`] with the result's rows in its filter's tables in the same transaction, so a round
    /// costs one commit. Rows that cannot be made (a payload that is not its declared type) are rolled back
    /// alone: the round's row and payload are kept, and the error is returned.
    pub fn write_round_with(
        &mut self,
        rec: &RoundRecord,
        payload: Payload<'_>,
        rows: Option<Rows<'_>>,
    ) -> Result<(), StoreError> {
        let batch = decode(rec.stream_id, rec.round, payload)?;
        let rows_given = rows.is_some();
        let late_first = self.late_before_row.remove(&(rec.stream_id, rec.round));
        let (excess, rows) = self.in_transaction(|tx| {
            let ranks_over = rounds::upsert(tx, rec, payload.len())?;
            if late_first {
                rounds::count_late_arrivals(tx, rec.stream_id, rec.round)?;
            }
            write_payload(tx, rec.stream_id, rec.round, payload, batch.as_ref(), false)?;
            Ok((ranks_over, write_rows(tx, rec.stream_id, rec.round, rows, false)?))
        })?;
        // The payload is stored, and again as the rows of a tabulated result.
        self.wrote(payload.len() as u64 * (1 + u64::from(rows_given)));
        if excess > 0 {
            tracing::warn!(
                stream_id = rec.stream_id,
                round = rec.round,
                excess,
                "the pieces of a round cover more ranks than expected"
            );
        }
        rows.map_err(|e| self.table_error(rec.stream_id, rec.round, e))
    }

    #[cfg(feature = "writer")]
    /// The rows of rounds whose results the writer let go (see [`crate::gap`]), in one transaction.
    pub(crate) fn write_gap(&mut self, run: &crate::gap::GapRun) -> Result<(), StoreError> {
        self.in_transaction(|tx| {
            for record in run.records() {
                rounds::upsert(tx, &record, 0)?;
            }
            Ok(())
        })
    }

    /// A packet that reached the root after its round had closed: one `late_arrivals` row, and the round row's
    /// `late_ranks` grows by `ranks`. Its `rows`, if any, go in its filter's tables (marked late) in the same
    /// transaction, as [`Store::write_round_with`] writes a round's.
    pub fn write_late(
        &mut self,
        stream_id: u32,
        round: u64,
        ranks: u32,
        bytes: u64,
        payload: Payload<'_>,
        rows: Option<Rows<'_>>,
    ) -> Result<(), StoreError> {
        let batch = decode(stream_id, round, payload)?;
        let rows_given = rows.is_some();
        let now = now_unix_ns();
        let (has_row, rows) = self.in_transaction(|tx| {
            let has_row = rounds::add_late(tx, stream_id, round, ranks, bytes, now)?;
            write_payload(tx, stream_id, round, payload, batch.as_ref(), true)?;
            Ok((has_row, write_rows(tx, stream_id, round, rows, true)?))
        })?;
        self.wrote(payload.len() as u64 * (1 + u64::from(rows_given)));
        if !has_row {
            // The round's result is still being finalized (its row comes next), or an earlier run of this root
            // closed it: late_arrivals has the packet, and a row written later counts it.
            tracing::debug!(stream_id, round, ranks, "late packet before its round's row");
            self.late_before_row.insert((stream_id, round));
            while self.late_before_row.len() > LATE_BEFORE_ROW {
                self.late_before_row.pop_first();
            }
        }
        rows.map_err(|e| self.table_error(stream_id, round, e))
    }

    /// A round counted a source's ranks late or unreachable though the source finished before it: they count as
    /// stopped ([`rounds::recount_stopped`]), in the round's row and its applications' (`apps`: the source's ranks
    /// by application; empty, not split). A round without a row yet (a multi-phase round still finishing) is left
    /// as it is, and said.
    pub fn recount_stopped(
        &mut self,
        stream_id: u32,
        round: u64,
        counted: MissingReason,
        ranks: u32,
        source: &str,
        apps: &[(String, u32)],
    ) -> Result<(), StoreError> {
        let has_row = self.in_transaction(|tx| {
            rounds::recount_stopped(tx, stream_id, round, counted, ranks, source, apps)
        })?;
        if !has_row {
            tracing::debug!(
                stream_id,
                round,
                source,
                "no row yet to recount a finished source's ranks in"
            );
        }
        Ok(())
    }

    /// Writes a standard filter's result into its tables (`stats`, `histograms`, `classes`, `utilization`,
    /// `reductions`, `node_samples`, `node_ranks`), in one transaction: a result is stored whole or not at all.
    pub fn write_filter_tables(
        &mut self,
        stream_id: u32,
        round: u64,
        result_type: &str,
        payload: &[u8],
        late: bool,
    ) -> Result<(), StoreError> {
        let run = |conn: &mut Connection| -> Result<(), tables::TableError> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tables::write(&tx, stream_id, round, result_type, payload, late)?;
            tx.commit()?;
            Ok(())
        };
        run(&mut self.conn).map_err(|e| self.table_error(stream_id, round, e))
    }

    fn table_error(&self, stream_id: u32, round: u64, e: tables::TableError) -> StoreError {
        match e {
            tables::TableError::Decode { what, source } => StoreError::Decode {
                what,
                stream_id,
                round,
                source,
            },
            tables::TableError::Invalid { what, reason } => StoreError::Invalid {
                what,
                stream_id,
                round,
                reason,
            },
            tables::TableError::Sqlite(source) => StoreError::Sqlite {
                path: self.path.clone(),
                source,
            },
        }
    }

    /// Upserts names; returns the collisions (same id, a different name already stored), which are also
    /// recorded in `name_collisions`. The name stored first keeps the id, so results already written keep
    /// their meaning.
    pub fn put_names(&mut self, names: &[(u64, String)]) -> Result<Vec<Collision>, StoreError> {
        let now = now_unix_ns();
        let collisions = self.in_transaction(|tx| {
            let mut get = tx.prepare_cached("SELECT name FROM names WHERE id = ?1")?;
            let mut put = tx.prepare_cached("INSERT INTO names (id, name) VALUES (?1, ?2)")?;
            let mut clash = tx.prepare_cached(
                "INSERT OR IGNORE INTO name_collisions (id, existing, new, seen_unix_ns) VALUES (?1, ?2, ?3, ?4)",
            )?;
            let mut collisions = Vec::new();
            for (id, name) in names {
                let key = id_bits(*id);
                match get.query_row([key], |row| row.get::<_, String>(0)).optional()? {
                    None => {
                        put.execute(params![key, name])?;
                    }
                    Some(existing) if existing == *name => {}
                    Some(existing) => {
                        clash.execute(params![key, existing, name, now])?;
                        collisions.push(Collision { id: *id, existing, new: name.clone() });
                    }
                }
            }
            Ok(collisions)
        })?;
        for c in &collisions {
            tracing::warn!(id = c.id, existing = %c.existing, new = %c.new, "event name hash collision");
        }
        Ok(collisions)
    }

    /// Upserts the `nodes` row of `ev.node_id`. An event that leaves kind, parent or address unset (a parent
    /// reporting a lost child knows little more than its id) keeps what an earlier event said.
    pub fn put_node(&mut self, ev: &NodeEvent) -> Result<(), StoreError> {
        let now = now_unix_ns();
        self.conn
            .prepare_cached(NodeRow::upsert())
            .and_then(|mut st| {
                st.execute(params![
                    ev.node_id,
                    ev.kind().word(),
                    non_empty(&ev.parent_id),
                    ev.state().word(),
                    ev.ranks_below,
                    non_empty(&ev.address),
                    non_empty(&ev.detail),
                    now,
                    now,
                ])
            })
            .map(drop)
            .map_err(self.sqlite())
    }

    fn connect(path: &Path, flags: OpenFlags) -> Result<Store, StoreError> {
        let conn = Connection::open_with_flags(path, flags).map_err(|source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        })?;
        let mut store = Store {
            conn,
            path: path.to_path_buf(),
            checkpointer: None,
            late_before_row: Default::default(),
        };
        let wal = store.configure().map_err(store.sqlite())?;
        schema::migrate(&mut store.conn).map_err(|source| StoreError::Migrate {
            path: path.to_path_buf(),
            version: SCHEMA_VERSION,
            source,
        })?;
        store.put_units().map_err(store.sqlite())?;
        if wal {
            store.checkpointer = Checkpointer::spawn(path);
        }
        Ok(store)
    }

    /// Every `metric` word's unit, as this version of Canopy knows them.
    fn put_units(&mut self) -> rusqlite::Result<()> {
        let tx = self.conn.transaction()?;
        {
            let mut st =
                tx.prepare("INSERT OR REPLACE INTO units (metric, unit, meaning) VALUES (?1, ?2, ?3)")?;
            for (metric, word) in <Metric as Word>::WORDS {
                let (unit, meaning) = metric_unit(*metric);
                st.execute(params![word, unit, meaning])?;
            }
        }
        tx.commit()
    }

    /// Returns whether the journal is a WAL, which background checkpoints need.
    fn configure(&self) -> rusqlite::Result<bool> {
        let mode: String = self
            .conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        let wal = mode.eq_ignore_ascii_case("wal");
        if !wal {
            // Some network file systems refuse WAL; the store still works, readers just block the writer.
            tracing::warn!(path = %self.path.display(), mode, "sqlite refused the WAL journal");
        }
        self.conn
            .pragma_update(None, "wal_autocheckpoint", WRITER_AUTOCHECKPOINT_PAGES)?;
        // NORMAL with WAL loses nothing when the process dies, only the last commits on a power cut, and saves
        // an fsync per round.
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        // A round's filter rows are written under a savepoint, whose journal of the pages it changes would
        // otherwise be a temporary file, written through the kernel every round: in memory it is a copy.
        self.conn.pragma_update(None, "temp_store", "MEMORY")?;
        // A pandas user reading the file during the run must not make a round write fail.
        self.conn.busy_timeout(Duration::from_secs(5))?;
        self.conn.set_prepared_statement_cache_capacity(32);
        Ok(wal)
    }

    fn in_transaction<T>(
        &mut self,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let run = |conn: &mut Connection| {
            // IMMEDIATE takes the write lock up front (waiting up to the busy timeout), so another writer, a tool
            // say, cannot make a round fail halfway with SQLITE_BUSY.
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let value = f(&tx)?;
            tx.commit()?;
            Ok(value)
        };
        let value = run(&mut self.conn).map_err(self.sqlite())?;
        self.wrote(COMMIT_BYTES);
        Ok(value)
    }

    /// Counts what a commit added to the WAL, for the background checkpoints.
    fn wrote(&self, bytes: u64) {
        if let Some(c) = &self.checkpointer {
            c.wrote(bytes);
        }
    }

    fn sqlite(&self) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
        |source| StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }
}

/// Points `dir/latest.sqlite` at `path` by renaming a fresh link over the old one, so a reader never finds the
/// link missing. A failure only costs the convenience, not the run, so it is logged rather than returned.
fn link_latest(dir: &Path, path: &Path) {
    #[cfg(unix)]
    {
        let Some(target) = path.file_name() else { return };
        let tmp = dir.join(format!(".{LATEST}.{}.tmp", std::process::id()));
        let _ = fs::remove_file(&tmp);
        // A relative target keeps the link valid when the directory is moved or mounted elsewhere.
        let linked =
            std::os::unix::fs::symlink(target, &tmp).and_then(|()| fs::rename(&tmp, dir.join(LATEST)));
        if let Err(error) = linked {
            let _ = fs::remove_file(&tmp);
            tracing::warn!(dir = %dir.display(), %error, "cannot point {LATEST} at the new run");
        }
    }
    #[cfg(not(unix))]
    let _ = (dir, path);
}

fn decode(stream_id: u32, round: u64, payload: Payload<'_>) -> Result<Option<ProfileBatch>, StoreError> {
    match payload {
        Payload::Profiles(bytes) => {
            ProfileBatch::decode(bytes)
                .map(Some)
                .map_err(|source| StoreError::Decode {
                    what: "profiles",
                    stream_id,
                    round,
                    source,
                })
        }
        _ => Ok(None),
    }
}

/// `rows` written inside the open transaction `tx` under a savepoint: rows that cannot be made are rolled back
/// alone and their error handed back as the `Ok` value, so the rest of the transaction still commits; only an
/// SQLite failure of the savepoint itself fails the transaction.
fn write_rows(
    tx: &Transaction<'_>,
    stream_id: u32,
    round: u64,
    rows: Option<Rows<'_>>,
    late: bool,
) -> rusqlite::Result<Result<(), tables::TableError>> {
    let Some(rows) = rows else {
        return Ok(Ok(()));
    };
    tx.prepare_cached("SAVEPOINT result_rows")?.execute([])?;
    let written = tables::write(tx, stream_id, round, rows.result_type, rows.payload, late);
    if written.is_err() {
        tx.prepare_cached("ROLLBACK TO result_rows")?.execute([])?;
    }
    tx.prepare_cached("RELEASE result_rows")?.execute([])?;
    Ok(written)
}

fn write_payload(
    tx: &Transaction<'_>,
    stream_id: u32,
    round: u64,
    payload: Payload<'_>,
    batch: Option<&ProfileBatch>,
    late: bool,
) -> rusqlite::Result<()> {
    match (payload, batch) {
        (Payload::Profiles(bytes), Some(batch)) => profiles::write(tx, stream_id, round, bytes, batch, late),
        (Payload::Blob { phase, payload }, _) => {
            tx.prepare_cached(ResultRow::insert())?.execute(params![
                stream_id,
                sat(round),
                phase,
                payload,
                late
            ])?;
            Ok(())
        }
        _ => Ok(()),
    }
}
