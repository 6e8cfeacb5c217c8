//! The SDK's errors, and the C library's return code for each.

use std::time::Duration;

use crate::MAX_NAMES;

/// What went wrong; `code()` gives the C library's return code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A bad argument, named.
    Invalid(String),
    /// A bad value in an environment variable, named with the variable.
    BadEnv {
        var: &'static str,
        value: String,
        reason: String,
    },
    NotInitialized,
    AlreadyInitialized,
    Finalized,
    TooManyNames {
        kind: &'static str,
    },
    /// The dump could not be queued: the queue is full (the agent is absent or slow). It is counted.
    Dropped {
        round: u64,
        queue: usize,
        agent: String,
    },
    /// Finalize could not deliver everything: `dropped` dumps never reached an agent.
    Undelivered {
        dropped: u64,
        agent: String,
    },
    /// Finalize sent its FIN but no FINACK came back in time.
    Timeout(Duration),
    /// The SDK's background thread could not be started.
    Thread(String),
}

impl Error {
    /// The C library's return code for this error (see canopy.h).
    pub fn code(&self) -> i32 {
        match self {
            Error::Invalid(_) | Error::BadEnv { .. } | Error::TooManyNames { .. } => -1,
            Error::NotInitialized | Error::AlreadyInitialized | Error::Finalized | Error::Thread(_) => -2,
            Error::Dropped { .. } => -3,
            Error::Undelivered { .. } => -4,
            Error::Timeout(_) => -5,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Invalid(m) => write!(f, "{m}"),
            Error::BadEnv { var, value, reason } => write!(f, "bad value {value:?} in {var}: {reason}"),
            Error::NotInitialized => write!(f, "canopy is not initialized (call canopy_init first)"),
            Error::AlreadyInitialized => write!(f, "canopy is already initialized"),
            Error::Finalized => write!(f, "canopy was finalized"),
            Error::TooManyNames { kind } => write!(f, "too many {kind}: the limit is {MAX_NAMES}"),
            Error::Dropped { round, queue, agent } => write!(
                f,
                "dump of round {round} dropped: the queue of {queue} dumps is full ({agent})"
            ),
            Error::Undelivered { dropped, agent } => {
                write!(f, "{dropped} dumps were not delivered ({agent})")
            }
            Error::Timeout(t) => write!(f, "no FINACK from the agent within {} ms", t.as_millis()),
            Error::Thread(e) => write!(f, "could not start the SDK's thread: {e}"),
        }
    }
}

impl std::error::Error for Error {}
