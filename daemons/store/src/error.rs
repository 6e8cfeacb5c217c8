//! What can go wrong with a store: every fallible call of this crate returns a [`StoreError`].

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// What a workflow's training data asks for is not in the store (no such stream, no round yet).
    #[error("{0}")]
    Training(String),
    #[error("cannot create the output directory {path}: {source}")]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("sqlite error on {path}: {source}")]
    Sqlite { path: PathBuf, source: rusqlite::Error },
    #[error("cannot bring {path} to schema version {version}: {source}")]
    Migrate {
        path: PathBuf,
        version: u32,
        source: rusqlite_migration::Error,
    },
    #[error("{path} has schema version {found}; this version of Canopy reads {oldest} to {newest}")]
    Version {
        path: PathBuf,
        found: u32,
        oldest: u32,
        newest: u32,
    },
    #[error("cannot decode the {what} of stream {stream_id} round {round}: {source}")]
    Decode {
        /// `profiles`, or the result message (`StatsResult`, ...).
        what: &'static str,
        stream_id: u32,
        round: u64,
        source: prost::DecodeError,
    },
    #[error("the {what} of stream {stream_id} round {round} does not hold together: {reason}")]
    Invalid {
        /// The result message (`ClassResult`).
        what: &'static str,
        stream_id: u32,
        round: u64,
        reason: String,
    },
    #[error("cannot start the store's {what} thread: {source}")]
    Thread { what: &'static str, source: io::Error },
}

impl StoreError {
    /// Whether the same write may succeed later: the disk was full or failing, the file read-only or locked. A
    /// result that cannot be decoded, or a schema the store does not know, fails the same way every time.
    pub fn is_retryable(&self) -> bool {
        use rusqlite::ErrorCode::*;
        match self {
            StoreError::Sqlite {
                source: rusqlite::Error::SqliteFailure(e, _),
                ..
            } => matches!(
                e.code,
                DiskFull
                    | SystemIoFailure
                    | ReadOnly
                    | DatabaseBusy
                    | DatabaseLocked
                    | CannotOpen
                    | PermissionDenied
                    | FileLockingProtocolFailed
            ),
            _ => false,
        }
    }
}
