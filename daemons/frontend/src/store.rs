//! The run store: every round's result in one SQLite file per run, written so that it survives a crash.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use canopy_proto::v1::{MissingReason, NodeEvent, ProfileBatch, StreamSpec};
use prost::Message;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction, TransactionBehavior, params};

/// The version of the schema below, stored in `meta`; readers check it before trusting column meanings.
pub const SCHEMA_VERSION: u32 = 2;

/// The name of the symlink that follows the newest run in the output directory.
pub const LATEST: &str = "latest.sqlite";

/// How often the background thread folds the WAL back into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);

/// The writer's own checkpoint threshold (pages), a backstop for when the background thread cannot keep up or
/// did not start; SQLite's default of 1000 would stall a round every few seconds at 64 ranks.
const WRITER_AUTOCHECKPOINT_PAGES: u32 = 16_384;

const SCHEMA: &str = "
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
    missing_dropped INTEGER NOT NULL DEFAULT 0,
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
";

/// Indexed by `MissingReason as usize`, so the proto enum and the columns cannot drift apart silently.
const MISSING_COLUMNS: [&str; 8] = [
    "missing_unspecified",
    "missing_late",
    "missing_lost",
    "missing_stopped",
    "missing_sampled_out",
    "missing_malformed",
    "missing_not_waited",
    "missing_dropped",
];

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the output directory {path}: {source}")]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("sqlite error on {path}: {source}")]
    Sqlite { path: PathBuf, source: rusqlite::Error },
    #[error("cannot store the result of stream {stream_id} round {round}: {reason}")]
    Result {
        stream_id: u32,
        round: u64,
        reason: String,
    },
    #[error("cannot decode the profiles of stream {stream_id} round {round}: {source}")]
    Decode {
        stream_id: u32,
        round: u64,
        source: prost::DecodeError,
    },
}

/// What the root knows about one closed round (or one piece of a don't-wait round).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoundRecord {
    pub stream_id: u32,
    pub stream_name: String,
    pub round: u64,
    pub covered: u32,
    pub expected: u32,
    pub missing: Vec<(MissingReason, u32)>,
    /// 0 when unknown.
    pub first_dump_unix_ns: u64,
    pub closed_unix_ns: u64,
}

/// The payload of a round, as the stream's filter left it.
#[derive(Debug, Clone, Copy)]
pub enum RoundResult<'a> {
    /// An encoded `ProfileBatch` (the passthrough filter).
    Profiles(&'a [u8]),
    /// Any other filter's final result, kept opaque.
    Blob {
        phase: u32,
        payload: &'a [u8],
    },
    None,
}

impl RoundResult<'_> {
    fn len(&self) -> usize {
        match self {
            RoundResult::Profiles(b) => b.len(),
            RoundResult::Blob { payload, .. } => payload.len(),
            RoundResult::None => 0,
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
}

/// Checkpoints the WAL from a second connection, so that copying it into the database file and the fsync that
/// follows never happen inside a round's write (they took 15-20 ms every 30 rounds of 64 ranks x 20 events).
#[derive(Debug)]
struct Checkpointer {
    stop: mpsc::Sender<()>,
    thread: thread::JoinHandle<()>,
}

impl Checkpointer {
    fn spawn(path: &Path) -> Option<Checkpointer> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = match Connection::open_with_flags(path, flags) {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "no background checkpoints; the writer will do them");
                return None;
            }
        };
        let (stop, stopped) = mpsc::channel::<()>();
        let shown = path.display().to_string();
        let thread = thread::Builder::new()
            .name("canopy-store-checkpoint".into())
            .spawn(move || {
                // The Store drops the sender to stop the thread.
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(CHECKPOINT_EVERY) {
                    // PASSIVE never waits for the writer or readers: what it cannot copy now, it copies next time.
                    if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                        tracing::debug!(path = %shown, %error, "background checkpoint failed");
                    }
                }
            });
        match thread {
            Ok(thread) => Some(Checkpointer { stop, thread }),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "no background checkpoints; the writer will do them");
                None
            }
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(Checkpointer { stop, thread }) = self.checkpointer.take() {
            drop(stop);
            // Joined so that the writer's connection closes last and removes the WAL file on a clean exit.
            let _ = thread.join();
        }
    }
}

impl Store {
    /// Creates `dir` if needed and a new file `dir/run-<unix seconds>-<pid>.sqlite` (if that exists add -2,
    /// -3...), WAL journal, synchronous=NORMAL, the schema, a `meta` row for `schema_version` = 1 and
    /// `started_unix_ns`; then points the symlink `dir/latest.sqlite` at it.
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
        store.init(started.as_nanos()).map_err(store.sqlite())?;
        link_latest(dir, &path);
        tracing::info!(path = %path.display(), "run store created");
        Ok(store)
    }

    /// Opens an existing file read-write (for tests and tools); it neither creates the file nor the schema.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::connect(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        self.conn
            .prepare_cached("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)")
            .and_then(|mut st| st.execute(params![key, value]))
            .map(drop)
            .map_err(self.sqlite())
    }

    /// Upserts by stream_id; `opened_unix_ns` is set on the first insert, `closed_unix_ns` the first time the
    /// state is "closed" or "failed".
    pub fn put_stream(
        &mut self,
        spec: &StreamSpec,
        state: &str,
        failure: Option<&str>,
    ) -> Result<(), StoreError> {
        let now = now_unix_ns();
        let closed = matches!(state, "closed" | "failed").then_some(now);
        self.conn
            .prepare_cached(
                "INSERT INTO streams (stream_id, name, filter, params, sync_mode, timeout_ms, state, failure,
                                      opened_unix_ns, closed_unix_ns, ranks)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT (stream_id) DO UPDATE SET
                     name = excluded.name, filter = excluded.filter, params = excluded.params,
                     ranks = excluded.ranks,
                     sync_mode = excluded.sync_mode, timeout_ms = excluded.timeout_ms, state = excluded.state,
                     failure = excluded.failure,
                     closed_unix_ns = CASE WHEN excluded.closed_unix_ns IS NULL THEN NULL
                                      ELSE coalesce(streams.closed_unix_ns, excluded.closed_unix_ns) END",
            )
            .and_then(|mut st| {
                st.execute(params![
                    spec.stream_id,
                    spec.name,
                    spec.filter,
                    spec.params,
                    short_name(spec.sync_mode().as_str_name(), "SYNC_MODE_"),
                    spec.timeout_ms,
                    state,
                    failure,
                    now,
                    closed,
                    spec.ranks,
                ])
            })
            .map(drop)
            .map_err(self.sqlite())
    }

    /// One transaction: upsert the `rounds` row (stream_id, round) and write the result.
    ///
    /// If the row exists (a don't-wait stream delivers a round in pieces) the covered and missing counts add up,
    /// expected is the largest seen and `missing_not_waited` becomes whatever no piece has accounted for yet.
    /// Profiles become one `samples` row per (rank, event) and one `counters` row per (rank, counter). On a
    /// decode error nothing is written.
    pub fn write_round(&mut self, rec: &RoundRecord, result: RoundResult<'_>) -> Result<(), StoreError> {
        let batch = decode(rec.stream_id, rec.round, result)?;
        let excess = self.in_transaction(|tx| {
            let ranks_over = upsert_round(tx, rec, result.len())?;
            write_result(tx, rec.stream_id, rec.round, result, batch.as_ref(), false)?;
            Ok(ranks_over)
        })?;
        if excess > 0 {
            tracing::warn!(
                stream_id = rec.stream_id,
                round = rec.round,
                excess,
                "the pieces of a round cover more ranks than expected"
            );
        }
        Ok(())
    }

    /// A packet that reached the root after its round had closed: one `late_arrivals` row, and the round row's
    /// `late_ranks` grows by `ranks`.
    pub fn write_late(
        &mut self,
        stream_id: u32,
        round: u64,
        ranks: u32,
        bytes: u64,
        result: RoundResult<'_>,
    ) -> Result<(), StoreError> {
        let batch = decode(stream_id, round, result)?;
        let now = now_unix_ns();
        let updated = self.in_transaction(|tx| {
            tx.prepare_cached(
                "INSERT INTO late_arrivals (stream_id, round, ranks, bytes, arrived_unix_ns)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![stream_id, sat(round), ranks, sat(bytes), now])?;
            let updated = tx
                .prepare_cached(
                    "UPDATE rounds SET late_ranks = late_ranks + ?3 WHERE stream_id = ?1 AND round = ?2",
                )?
                .execute(params![stream_id, sat(round), ranks])?;
            write_result(tx, stream_id, round, result, batch.as_ref(), true)?;
            Ok(updated)
        })?;
        if updated == 0 {
            // The root never stored this round (it closed before a restart, say); late_arrivals still has it.
            tracing::warn!(
                stream_id,
                round,
                ranks,
                "late packet for a round the store has no row for"
            );
        }
        Ok(())
    }

    /// Records the protobuf type of a stream's results (how to read its `results` blobs).
    pub fn set_result_type(&mut self, stream_id: u32, result_type: &str) -> Result<(), StoreError> {
        self.in_transaction(|tx| {
            tx.prepare_cached("UPDATE streams SET result_type = ?2 WHERE stream_id = ?1")?
                .execute(params![stream_id, result_type])?;
            Ok(())
        })
    }

    /// Writes a standard filter's result into its tables (`stats`, `histograms`, `classes`, `reductions`).
    pub fn write_filter_tables(
        &mut self,
        stream_id: u32,
        round: u64,
        result_type: &str,
        payload: &[u8],
        late: bool,
    ) -> Result<(), StoreError> {
        let mut failure = None;
        let written = self.in_transaction(|tx| {
            crate::results::write(tx, stream_id, round, result_type, payload, late).map_err(|e| {
                failure = Some(e);
                // Any error rolls the transaction back: a result is stored whole or not at all.
                rusqlite::Error::InvalidQuery
            })
        });
        match (written, failure) {
            (_, Some(reason)) => Err(StoreError::Result {
                stream_id,
                round,
                reason,
            }),
            (written, None) => written,
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
            .prepare_cached(
                "INSERT INTO nodes (node_id, kind, parent, state, ranks_below, address, detail,
                                    first_seen_unix_ns, updated_unix_ns)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)
                 ON CONFLICT (node_id) DO UPDATE SET
                     kind = CASE WHEN excluded.kind = 'unspecified' THEN nodes.kind ELSE excluded.kind END,
                     parent = coalesce(excluded.parent, nodes.parent),
                     state = excluded.state,
                     ranks_below = excluded.ranks_below,
                     address = coalesce(excluded.address, nodes.address),
                     detail = excluded.detail,
                     updated_unix_ns = excluded.updated_unix_ns",
            )
            .and_then(|mut st| {
                st.execute(params![
                    ev.node_id,
                    short_name(ev.kind().as_str_name(), "NODE_KIND_"),
                    non_empty(&ev.parent_id),
                    short_name(ev.state().as_str_name(), "NODE_STATE_"),
                    ev.ranks_below,
                    non_empty(&ev.address),
                    non_empty(&ev.detail),
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
        };
        if store.configure().map_err(store.sqlite())? {
            store.checkpointer = Checkpointer::spawn(path);
        }
        Ok(store)
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
        // A pandas user reading the file during the run must not make a round write fail.
        self.conn.busy_timeout(Duration::from_secs(5))?;
        self.conn.set_prepared_statement_cache_capacity(32);
        Ok(wal)
    }

    fn init(&mut self, started_unix_ns: u128) -> rusqlite::Result<()> {
        let started = i64::try_from(started_unix_ns).unwrap_or(i64::MAX).to_string();
        let pid = std::process::id().to_string();
        let tx = self.conn.transaction()?;
        tx.execute_batch(SCHEMA)?;
        tx.execute_batch(crate::results::SCHEMA)?;
        let mut st = tx.prepare("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)")?;
        st.execute(params!["schema_version", SCHEMA_VERSION.to_string()])?;
        st.execute(params!["started_unix_ns", started])?;
        st.execute(params!["pid", pid])?;
        drop(st);
        tx.commit()
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
        run(&mut self.conn).map_err(self.sqlite())
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

fn decode(stream_id: u32, round: u64, result: RoundResult<'_>) -> Result<Option<ProfileBatch>, StoreError> {
    match result {
        RoundResult::Profiles(bytes) => {
            ProfileBatch::decode(bytes)
                .map(Some)
                .map_err(|source| StoreError::Decode {
                    stream_id,
                    round,
                    source,
                })
        }
        _ => Ok(None),
    }
}

/// Counts of one round row, kept in u64 so that summing pieces cannot overflow before saturation.
#[derive(Debug, Default)]
struct Tally {
    covered: u64,
    expected: u64,
    missing: [u64; MISSING_COLUMNS.len()],
    result_bytes: u64,
    pieces: u64,
    first_dump_unix_ns: Option<i64>,
    closed_unix_ns: Option<i64>,
}

impl Tally {
    fn of(rec: &RoundRecord, result_bytes: usize) -> Tally {
        let mut t = Tally {
            covered: rec.covered.into(),
            expected: rec.expected.into(),
            result_bytes: result_bytes as u64,
            pieces: 1,
            first_dump_unix_ns: (rec.first_dump_unix_ns > 0).then(|| sat(rec.first_dump_unix_ns)),
            closed_unix_ns: (rec.closed_unix_ns > 0).then(|| sat(rec.closed_unix_ns)),
            ..Tally::default()
        };
        for (reason, ranks) in &rec.missing {
            t.missing[*reason as usize] += u64::from(*ranks);
        }
        t
    }

    /// Adds a later piece of the same round. Ranks not waited for are whatever no piece has accounted for yet:
    /// summing each piece's own "not waited" count would count a rank again after it arrived. Returns how many
    /// ranks the pieces account for beyond `expected`, which only inconsistent callers produce.
    fn merge(&mut self, piece: Tally) -> u64 {
        let not_waited = MissingReason::NotWaited as usize;
        self.covered += piece.covered;
        self.expected = self.expected.max(piece.expected);
        for (i, ranks) in piece.missing.iter().enumerate() {
            self.missing[i] += ranks;
        }
        let accounted = self.covered
            + self
                .missing
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != not_waited)
                .map(|(_, r)| r)
                .sum::<u64>();
        self.missing[not_waited] = self.expected.saturating_sub(accounted);
        self.result_bytes += piece.result_bytes;
        self.pieces += piece.pieces;
        self.first_dump_unix_ns = match (self.first_dump_unix_ns, piece.first_dump_unix_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.closed_unix_ns = self.closed_unix_ns.max(piece.closed_unix_ns);
        accounted.saturating_sub(self.expected)
    }

    /// "lost: 16, late: 2": the largest counts first, since they explain most of the gap.
    fn reason_text(&self) -> Option<String> {
        let mut parts: Vec<(u64, usize)> = self
            .missing
            .iter()
            .enumerate()
            .filter(|(_, r)| **r > 0)
            .map(|(i, r)| (*r, i))
            .collect();
        if parts.is_empty() {
            return None;
        }
        parts.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let text = parts
            .iter()
            .map(|(ranks, i)| {
                let name = i32::try_from(*i)
                    .ok()
                    .and_then(|i| MissingReason::try_from(i).ok())
                    .unwrap_or(MissingReason::Unspecified)
                    .as_str_name();
                format!("{}: {ranks}", short_name(name, "MISSING_REASON_"))
            })
            .collect::<Vec<_>>()
            .join(", ");
        Some(text)
    }
}

/// Returns how many ranks the merged pieces account for beyond `expected` (0 when consistent).
fn upsert_round(tx: &Transaction<'_>, rec: &RoundRecord, result_bytes: usize) -> rusqlite::Result<u64> {
    let round = sat(rec.round);
    let mut tally = Tally::of(rec, result_bytes);
    let mut excess = 0;
    let existing = tx
        .prepare_cached(
            "SELECT covered, expected, missing_unspecified, missing_late, missing_lost, missing_stopped,
                    missing_sampled_out, missing_malformed, missing_not_waited, missing_dropped, result_bytes,
                    pieces, first_dump_unix_ns, closed_unix_ns
             FROM rounds WHERE stream_id = ?1 AND round = ?2",
        )?
        .query_row(params![rec.stream_id, round], |row| {
            let mut t = Tally {
                covered: row.get(0)?,
                expected: row.get(1)?,
                result_bytes: row.get(10)?,
                pieces: row.get(11)?,
                first_dump_unix_ns: row.get(12)?,
                closed_unix_ns: row.get(13)?,
                ..Tally::default()
            };
            for (i, slot) in t.missing.iter_mut().enumerate() {
                *slot = row.get(2 + i)?;
            }
            Ok(t)
        })
        .optional()?;
    if let Some(mut old) = existing {
        excess = old.merge(tally);
        tally = old;
    }
    let m = &tally.missing;
    tx.prepare_cached(
        "INSERT INTO rounds (stream_id, stream_name, round, covered, expected,
                             missing_unspecified, missing_late, missing_lost, missing_stopped,
                             missing_sampled_out, missing_malformed, missing_not_waited, missing_dropped,
                             missing_reason, result_bytes, pieces, first_dump_unix_ns, closed_unix_ns)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)
         ON CONFLICT (stream_id, round) DO UPDATE SET
             stream_name = excluded.stream_name, covered = excluded.covered, expected = excluded.expected,
             missing_unspecified = excluded.missing_unspecified, missing_late = excluded.missing_late,
             missing_lost = excluded.missing_lost, missing_stopped = excluded.missing_stopped,
             missing_sampled_out = excluded.missing_sampled_out, missing_malformed = excluded.missing_malformed,
             missing_not_waited = excluded.missing_not_waited, missing_dropped = excluded.missing_dropped,
             missing_reason = excluded.missing_reason,
             result_bytes = excluded.result_bytes, pieces = excluded.pieces,
             first_dump_unix_ns = excluded.first_dump_unix_ns, closed_unix_ns = excluded.closed_unix_ns",
    )?
    .execute(params![
        rec.stream_id,
        rec.stream_name,
        round,
        sat(tally.covered),
        sat(tally.expected),
        sat(m[0]),
        sat(m[1]),
        sat(m[2]),
        sat(m[3]),
        sat(m[4]),
        sat(m[5]),
        sat(m[6]),
        sat(m[7]),
        tally.reason_text(),
        sat(tally.result_bytes),
        sat(tally.pieces),
        tally.first_dump_unix_ns,
        tally.closed_unix_ns,
    ])?;
    Ok(excess)
}

fn write_result(
    tx: &Transaction<'_>,
    stream_id: u32,
    round: u64,
    result: RoundResult<'_>,
    batch: Option<&ProfileBatch>,
    late: bool,
) -> rusqlite::Result<()> {
    let round = sat(round);
    if let Some(batch) = batch {
        let mut sample = tx.prepare_cached(
            "INSERT INTO samples (stream_id, round, app, rank, event_id, calls, subrs, incl_us, excl_us,
                                  calls_total, subrs_total, incl_total_us, excl_total_us, dump_unix_ns, late)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
        )?;
        let mut counter = tx.prepare_cached(
            "INSERT INTO counters (stream_id, round, app, rank, counter_id, value, total, dump_unix_ns, late)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?;
        for p in &batch.profiles {
            let dump = (p.dump_unix_ns > 0).then(|| sat(p.dump_unix_ns));
            // A metric the rank's options left out is stored as NULL, not as a zero it never measured.
            let has = |bit: u32| p.metrics == 0 || p.metrics & bit != 0;
            let (calls, incl, excl) = (has(1), has(2), has(4));
            for e in &p.events {
                sample.execute(params![
                    stream_id,
                    round,
                    p.app,
                    p.rank,
                    id_bits(e.event_id),
                    calls.then(|| sat(e.calls)),
                    calls.then(|| sat(e.subrs)),
                    incl.then_some(e.incl_us),
                    excl.then_some(e.excl_us),
                    calls.then(|| sat(e.calls_total)),
                    calls.then(|| sat(e.subrs_total)),
                    incl.then_some(e.incl_total_us),
                    excl.then_some(e.excl_total_us),
                    dump,
                    late,
                ])?;
            }
            for c in &p.counters {
                counter.execute(params![
                    stream_id,
                    round,
                    p.app,
                    p.rank,
                    id_bits(c.counter_id),
                    c.value,
                    c.total,
                    dump,
                    late
                ])?;
            }
        }
    } else if let RoundResult::Blob { phase, payload } = result {
        tx.prepare_cached(
            "INSERT INTO results (stream_id, round, phase, payload, late) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![stream_id, round, phase, payload, late])?;
    }
    Ok(())
}

/// SQLite integers are i64; ids keep their bits (readers cast back with `& 0xFFFF_FFFF_FFFF_FFFF`).
fn id_bits(id: u64) -> i64 {
    id as i64
}

/// Counts and timestamps never reach 2^63 in practice; saturating keeps a corrupt value visible as a maximum
/// instead of a negative number.
fn sat(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn now_unix_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// "NODE_KIND_AGENT" -> "agent": the short words users type in SQL.
fn short_name(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_ascii_lowercase()
}

fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;
    use std::sync::atomic::{AtomicU32, Ordering};

    use canopy_proto::v1::{CounterSample, EventSample, NodeKind, NodeState, RankProfile, SyncMode};
    use rusqlite::types::Value;

    use super::*;

    /// A directory under the system temp dir, removed on drop (tempfile is not a dependency).
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("canopy-store-{}-{n}-{name}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// Rows as the sqlite3 shell prints them (`a|b|c`), with reals always showing a decimal point and NULL
    /// spelled out, so one string checks both the values and their storage class.
    fn table(conn: &Connection, sql: &str) -> Vec<String> {
        let mut st = conn.prepare(sql).unwrap();
        let n = st.column_count();
        let rows = st.query_map([], |row| {
            (0..n)
                .map(|i| row.get::<_, Value>(i))
                .collect::<Result<Vec<_>, _>>()
        });
        rows.unwrap()
            .map(|row| {
                let cells: Vec<String> = row
                    .unwrap()
                    .into_iter()
                    .map(|v| match v {
                        Value::Null => "NULL".to_string(),
                        Value::Integer(i) => i.to_string(),
                        Value::Real(r) => format!("{r:?}"),
                        Value::Text(t) => t,
                        Value::Blob(b) => {
                            b.iter().fold("x'".to_string(), |mut s, x| {
                                let _ = write!(s, "{x:02x}");
                                s
                            }) + "'"
                        }
                    })
                    .collect();
                cells.join("|")
            })
            .collect()
    }

    fn count(conn: &Connection, table: &str) -> i64 {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    fn one_i64(conn: &Connection, sql: &str) -> i64 {
        conn.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    /// Rank r, event e: calls = 10r + e and every other cell derived from it, so each cell is checkable.
    fn profiles(app: &str, ranks: std::ops::Range<u32>, events: u64, counters: u64) -> Vec<u8> {
        let profiles = ranks
            .map(|rank| RankProfile {
                app: app.to_string(),
                rank,
                round: 7,
                dump_unix_ns: 1_000 + u64::from(rank),
                events: (0..events)
                    .map(|e| {
                        let c = 10 * u64::from(rank) + e;
                        EventSample {
                            event_id: u64::MAX - e,
                            calls: c,
                            subrs: c + 1,
                            incl_us: c as f64 + 0.5,
                            excl_us: c as f64 + 0.25,
                            calls_total: c + 100,
                            subrs_total: c + 101,
                            incl_total_us: c as f64 + 100.5,
                            excl_total_us: c as f64 + 100.25,
                        }
                    })
                    .collect(),
                counters: (0..counters)
                    .map(|k| CounterSample {
                        counter_id: 42 + k,
                        value: f64::from(rank) + 0.5,
                        total: 9.0,
                    })
                    .collect(),
                metrics: 0,
            })
            .collect();
        ProfileBatch { profiles }.encode_to_vec()
    }

    fn record(
        stream_id: u32,
        round: u64,
        covered: u32,
        expected: u32,
        missing: &[(MissingReason, u32)],
    ) -> RoundRecord {
        RoundRecord {
            stream_id,
            stream_name: format!("s{stream_id}"),
            round,
            covered,
            expected,
            missing: missing.to_vec(),
            first_dump_unix_ns: 1_000,
            closed_unix_ns: 2_000,
        }
    }

    fn spec(stream_id: u32) -> StreamSpec {
        StreamSpec {
            stream_id,
            name: "profiles".into(),
            filter: "passthrough".into(),
            params: "{}".into(),
            sync_mode: SyncMode::WaitForAll as i32,
            timeout_ms: 500,
            ranks: String::new(),
        }
    }

    #[test]
    fn every_column_reads_back_from_a_fresh_connection() {
        let dir = TempDir::new("readback");
        let before = now_unix_ns();
        let mut store = Store::create(&dir.0).unwrap();
        store.set_meta("tree", "kary:2^2").unwrap();
        store.put_stream(&spec(1), "open", None).unwrap();
        let batch = profiles("lulesh", 0..2, 2, 1);
        let rec = record(1, 7, 2, 4, &[(MissingReason::Lost, 2)]);
        store.write_round(&rec, RoundResult::Profiles(&batch)).unwrap();
        let blob = RoundResult::Blob {
            phase: 1,
            payload: b"hist",
        };
        store.write_round(&record(2, 7, 4, 4, &[]), blob).unwrap();
        let late = profiles("lulesh", 2..3, 1, 0);
        store
            .write_late(1, 7, 1, late.len() as u64, RoundResult::Profiles(&late))
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
                "schema_version|2".into(),
                "tree|kary:2^2".into()
            ]
        );
        let started: String = conn
            .query_row("SELECT value FROM meta WHERE key = 'started_unix_ns'", [], |r| {
                r.get(0)
            })
            .unwrap();
        recent(started.parse().unwrap());
        assert_eq!(table(&conn, "PRAGMA journal_mode"), ["wal"]);

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
        let dir = TempDir::new("latest");
        let first = Store::create(&dir.0).unwrap();
        let mut second = Store::create(&dir.0).unwrap();
        assert_ne!(first.path(), second.path());
        assert!(first.path().exists() && second.path().exists());
        let name = second.path().file_name().unwrap().to_str().unwrap().to_string();
        let stem = format!("-{}-2.sqlite", std::process::id());
        assert!(name.starts_with("run-") && name.ends_with(&stem), "{name}");
        let link = dir.0.join(LATEST);
        assert_eq!(fs::read_link(&link).unwrap(), Path::new(&name));
        // Two runs and the link: the temporary link was renamed, not left behind.
        let entries = fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.ends_with("-wal") && !n.ends_with("-shm"))
            .count();
        assert_eq!(entries, 3);

        // A reader that opens the link must find the writer's WAL, which only works if SQLite resolves it.
        second
            .write_round(&record(1, 1, 1, 1, &[]), RoundResult::None)
            .unwrap();
        let conn = Connection::open(&link).unwrap();
        assert_eq!(count(&conn, "rounds"), 1);
    }

    #[test]
    fn a_malformed_batch_is_refused_and_writes_nothing() {
        let dir = TempDir::new("malformed");
        let mut store = Store::create(&dir.0).unwrap();
        // Field 1, length-delimited, claims 127 bytes that are not there.
        let bad = [0x0a, 0x7f, 0x01];
        let err = store
            .write_round(&record(3, 9, 1, 1, &[]), RoundResult::Profiles(&bad))
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
            .write_late(3, 9, 1, 3, RoundResult::Profiles(&bad))
            .unwrap_err();
        assert!(matches!(err, StoreError::Decode { .. }), "{err:?}");
        let conn = Connection::open(store.path()).unwrap();
        for table in ["rounds", "samples", "counters", "results", "late_arrivals"] {
            assert_eq!(count(&conn, table), 0, "{table}");
        }
    }

    #[test]
    fn dont_wait_pieces_add_up_in_one_round() {
        let dir = TempDir::new("dontwait");
        let mut store = Store::create(&dir.0).unwrap();
        let a = profiles("app", 0..3, 1, 0);
        let b = profiles("app", 3..5, 1, 0);
        let mut first = record(4, 2, 3, 8, &[(MissingReason::NotWaited, 5)]);
        (first.first_dump_unix_ns, first.closed_unix_ns) = (500, 600);
        store.write_round(&first, RoundResult::Profiles(&a)).unwrap();
        let mut second = record(
            4,
            2,
            2,
            8,
            &[(MissingReason::Lost, 1), (MissingReason::NotWaited, 5)],
        );
        (second.first_dump_unix_ns, second.closed_unix_ns) = (400, 900);
        store.write_round(&second, RoundResult::Profiles(&b)).unwrap();

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
    fn missing_reason_names_the_largest_gap_first() {
        let dir = TempDir::new("reason");
        let mut store = Store::create(&dir.0).unwrap();
        let gaps = [
            (MissingReason::Late, 2),
            (MissingReason::Lost, 10),
            (MissingReason::Lost, 6),
        ];
        store
            .write_round(&record(1, 1, 46, 64, &gaps), RoundResult::None)
            .unwrap();
        store
            .write_round(&record(1, 2, 64, 64, &[]), RoundResult::None)
            .unwrap();
        let odd = [
            (MissingReason::SampledOut, 3),
            (MissingReason::Unspecified, 3),
            (MissingReason::Malformed, 1),
        ];
        store
            .write_round(&record(1, 3, 1, 8, &odd), RoundResult::None)
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
        let dir = TempDir::new("names");
        let mut store = Store::create(&dir.0).unwrap();
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
        let dir = TempDir::new("nodes");
        let mut store = Store::create(&dir.0).unwrap();
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
        let dir = TempDir::new("streams");
        let mut store = Store::create(&dir.0).unwrap();
        let mut s = spec(5);
        store.put_stream(&s, "open", None).unwrap();
        let conn = Connection::open(store.path()).unwrap();
        let opened = one_i64(&conn, "SELECT opened_unix_ns FROM streams");
        s.sync_mode = SyncMode::DontWait as i32;
        store.put_stream(&s, "failed", Some("filter panicked")).unwrap();
        let closed = one_i64(&conn, "SELECT closed_unix_ns FROM streams");
        assert!(opened <= closed);
        assert_eq!(
            table(
                &conn,
                "SELECT sync_mode, state, failure, opened_unix_ns FROM streams"
            ),
            [format!("dont_wait|failed|filter panicked|{opened}")]
        );
        store.put_stream(&s, "closed", None).unwrap();
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
        let dir = TempDir::new("late");
        let mut store = Store::create(&dir.0).unwrap();
        store
            .write_round(
                &record(1, 1, 3, 4, &[(MissingReason::Late, 1)]),
                RoundResult::None,
            )
            .unwrap();
        store
            .write_late(
                1,
                1,
                1,
                10,
                RoundResult::Blob {
                    phase: 0,
                    payload: b"x",
                },
            )
            .unwrap();
        store.write_late(1, 1, 2, 20, RoundResult::None).unwrap();
        store.write_late(1, 99, 5, 30, RoundResult::None).unwrap();
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
        let dir = TempDir::new("crash");
        let mut store = Store::create(&dir.0).unwrap();
        let batch = profiles("app", 0..4, 3, 0);
        store
            .write_round(&record(1, 1, 4, 4, &[]), RoundResult::Profiles(&batch))
            .unwrap();
        let path = store.path().to_path_buf();
        // Forgetting skips sqlite3_close and its checkpoint, as a killed process would: the round lives only in
        // the WAL file.
        std::mem::forget(store);
        assert!(fs::metadata(format!("{}-wal", path.display())).unwrap().len() > 0);

        let mut reopened = Store::open(&path).unwrap();
        reopened
            .write_round(&record(1, 2, 4, 4, &[]), RoundResult::Profiles(&batch))
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
    fn the_wal_reaches_the_file_without_the_writer() {
        let dir = TempDir::new("checkpoint");
        let mut store = Store::create(&dir.0).unwrap();
        let empty = fs::metadata(store.path()).unwrap().len();
        let batch = profiles("app", 0..64, 20, 0);
        store
            .write_round(&record(1, 1, 64, 64, &[]), RoundResult::Profiles(&batch))
            .unwrap();
        // Far below the writer's own threshold, so only the background thread can have copied the pages.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while fs::metadata(store.path()).unwrap().len() <= empty {
            assert!(std::time::Instant::now() < deadline, "no checkpoint within 10 s");
            thread::sleep(Duration::from_millis(20));
        }
        let path = store.path().to_path_buf();
        drop(store);
        // A clean close folds what is left and removes the WAL: the writer's connection closed last.
        assert!(!Path::new(&format!("{}-wal", path.display())).exists());
    }

    #[test]
    fn the_store_can_move_to_a_writer_thread() {
        // The front-end writes from a blocking thread, off the async runtime.
        fn send<T: Send + 'static>() {}
        send::<Store>();
    }

    #[test]
    fn open_refuses_a_missing_file() {
        let dir = TempDir::new("missing");
        let err = Store::open(&dir.0.join("nope.sqlite")).unwrap_err();
        assert!(matches!(err, StoreError::Sqlite { .. }), "{err:?}");
        assert!(!dir.0.exists());
    }

    #[test]
    fn create_reports_a_directory_it_cannot_make() {
        let dir = TempDir::new("notadir");
        fs::write(&dir.0, b"a file").unwrap();
        let err = Store::create(&dir.0.join("runs")).unwrap_err();
        assert!(matches!(err, StoreError::CreateDir { .. }), "{err:?}");
        assert!(
            err.to_string().starts_with("cannot create the output directory "),
            "{err}"
        );
        fs::remove_file(&dir.0).unwrap();
    }
}
