//! The WAL checkpointer: a thread with its own connection that folds the write-ahead log back into the
//! database file, so the writer never does it inside a round's write.

use std::path::Path;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// How often the background thread folds the WAL back into the database file. Each checkpoint ends with the
/// database file's fsync, and the file system holds the writer's appends to the WAL while it flushes: the more a
/// checkpoint copies, the longer that stall. A 4 x 16 tree at 200 rounds/s, from first dump to the store
/// writer: checkpoints every 500 ms gave a p99 of 4.9 to 22 ms and a worst round of 33 to 50 ms in six runs,
/// every 100 ms a p99 of 3.0 to 5.8 ms and a worst of 8 to 23 ms, for the same CPU. With nothing new in the WAL a
/// checkpoint reads its header and returns.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// Checkpoints the WAL from a second connection, so that copying it into the database file and the fsync that
/// follows never happen inside a round's write (they took 15-20 ms every 30 rounds of 64 ranks x 20 events).
#[derive(Debug)]
pub(crate) struct Checkpointer {
    stop: mpsc::Sender<()>,
    thread: thread::JoinHandle<()>,
}

impl Checkpointer {
    /// Starts the thread; `None` (logged) if it cannot, and the writer's own auto-checkpoint does the work.
    pub(crate) fn spawn(path: &Path) -> Option<Checkpointer> {
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
                // `stop` dropping ends the thread.
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

    /// Stops the thread and closes its connection, so that the writer's connection, closed after it, is the
    /// last one and removes the WAL on a clean exit.
    pub(crate) fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}
