//! The WAL checkpointer: a thread with its own connection that folds the write-ahead log back into the
//! database file, so the writer never does it inside a round's write.

// The checkpointer is a thread of its own outside any runtime: it keeps time and sleeps by std's clock.
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a plain thread, outside the runtime's clock"
)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

/// How often the background thread looks at what the writer committed since its last checkpoint.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// What the writer may commit before the next look folds it back. Each checkpoint ends with the database file's
/// fsync, and the file system holds the writer's appends to the WAL while it flushes: the more a checkpoint
/// copies, the longer that stall. A 4 x 16 tree at 200 rounds/s (about 1 MB a tenth of a second), from first dump
/// to the store writer: checkpoints every 500 ms gave a p99 of 4.9 to 22 ms and a worst round of 33 to 50 ms in
/// six runs, every 100 ms a p99 of 3.0 to 5.8 ms and a worst of 8 to 23 ms, for the same CPU.
const CHECKPOINT_BYTES: u64 = 1 << 20;

/// The longest a commit waits in the WAL for its checkpoint. A light rate, 25 rounds/s of that tree, fills a
/// megabyte in about a second: checkpoints every 100 ms there cost the front-end 11% more CPU a round (each copies
/// the same index and table pages again, and syncs the file), for the same p50 and p99.
const CHECKPOINT_AT_MOST: Duration = Duration::from_secs(1);

/// When the background thread folds the WAL back.
#[derive(Debug, Clone, Copy)]
struct Policy {
    check_every: Duration,
    bytes: u64,
    at_most: Duration,
}

impl Policy {
    const DEFAULT: Policy = Policy {
        check_every: CHECK_EVERY,
        bytes: CHECKPOINT_BYTES,
        at_most: CHECKPOINT_AT_MOST,
    };

    /// Whether a checkpoint is due, with `new_bytes` committed since the last one, `since` ago.
    fn due(&self, new_bytes: u64, since: Duration) -> bool {
        new_bytes >= self.bytes || (new_bytes > 0 && since >= self.at_most)
    }
}

/// Checkpoints the WAL from a second connection, so that copying it into the database file and the fsync that
/// follows never happen inside a round's write (they took 15-20 ms every 30 rounds of 64 ranks x 20 events).
#[derive(Debug)]
pub(crate) struct Checkpointer {
    stop: mpsc::Sender<()>,
    thread: thread::JoinHandle<()>,
    /// The bytes the writer has committed (its rounds' payloads and rows, as it counts them).
    written: Arc<AtomicU64>,
}

impl Checkpointer {
    /// Starts the thread; `None` (logged) if it cannot, and the writer's own auto-checkpoint does the work.
    pub(crate) fn spawn(path: &Path) -> Option<Checkpointer> {
        Self::spawn_with(path, Policy::DEFAULT)
    }

    fn spawn_with(path: &Path, policy: Policy) -> Option<Checkpointer> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = match Connection::open_with_flags(path, flags) {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "no background checkpoints; the writer will do them");
                return None;
            }
        };
        let (stop, stopped) = mpsc::channel::<()>();
        let written = Arc::new(AtomicU64::new(0));
        let shown = path.display().to_string();
        let committed = written.clone();
        let thread = thread::Builder::new()
            .name("canopy-store-checkpoint".into())
            .spawn(move || {
                let (mut folded, mut last) = (0u64, Instant::now());
                // `stop` dropping ends the thread.
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(policy.check_every) {
                    let now = committed.load(Ordering::Relaxed);
                    if !policy.due(now - folded, last.elapsed()) {
                        continue;
                    }
                    // PASSIVE never waits for the writer or readers: what it cannot copy now, it copies next time.
                    if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                        tracing::debug!(path = %shown, %error, "background checkpoint failed");
                    }
                    (folded, last) = (now, Instant::now());
                }
            });
        match thread {
            Ok(thread) => Some(Checkpointer {
                stop,
                thread,
                written,
            }),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "no background checkpoints; the writer will do them");
                None
            }
        }
    }

    /// Counts `bytes` the writer committed: the next checkpoint comes sooner the more there is.
    pub(crate) fn wrote(&self, bytes: u64) {
        self.written.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Stops the thread and closes its connection, so that the writer's connection, closed after it, is the
    /// last one and removes the WAL on a clean exit.
    pub(crate) fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_due_after_a_megabyte_or_a_second_with_anything_new() {
        let p = Policy::DEFAULT;
        assert!(!p.due(0, Duration::from_secs(60)), "nothing new: nothing to fold");
        assert!(!p.due(CHECKPOINT_BYTES - 1, Duration::from_millis(100)));
        assert!(p.due(CHECKPOINT_BYTES, Duration::from_millis(100)));
        assert!(!p.due(1, CHECKPOINT_AT_MOST - Duration::from_millis(1)));
        assert!(p.due(1, CHECKPOINT_AT_MOST));
    }

    /// The database file's size: it grows when a checkpoint copies the WAL's new pages into it.
    fn folded_size(path: &Path) -> u64 {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    }

    fn write_blob(conn: &Connection, bytes: usize) {
        conn.execute("INSERT INTO t (b) VALUES (?1)", [vec![7u8; bytes]])
            .expect("insert");
    }

    #[test]
    fn the_writers_count_decides_when_the_wal_is_folded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sqlite");
        let conn = Connection::open(&path).unwrap();
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        conn.execute_batch("CREATE TABLE t (b BLOB)").unwrap();
        // Never by time in this test: only the bytes counted bring a checkpoint.
        let policy = Policy {
            check_every: Duration::from_millis(10),
            bytes: 1 << 20,
            at_most: Duration::from_secs(3600),
        };
        let c = Checkpointer::spawn_with(&path, policy).expect("the thread starts");
        let empty = folded_size(&path);
        // Two megabytes committed but not counted: the WAL holds them, the database file does not.
        write_blob(&conn, 2 << 20);
        c.wrote(1000);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(folded_size(&path), empty, "folded before a megabyte was counted");
        // Counted: the next look folds them.
        c.wrote(2 << 20);
        let since = Instant::now();
        while folded_size(&path) < 2 << 20 {
            assert!(since.elapsed() < Duration::from_secs(20), "never folded");
            std::thread::sleep(Duration::from_millis(10));
        }
        c.stop();
    }
}
