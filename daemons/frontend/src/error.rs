//! What the API refuses or fails at, and its one mapping to gRPC status codes.

use canopy_store::StoreError;
use tonic::{Code, Status};

/// The longest round time-out a stream may ask for.
pub const MAX_TIMEOUT_MS: u32 = 600_000;

/// Why a `canopy.v1.Frontend` call failed. Messages are lowercase, without a trailing period.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("give params or params_json, not both")]
    ParamsTwice,
    /// The filter is not on the filter path (the message lists those that are).
    #[error("{0}")]
    UnknownFilter(String),
    #[error("timeout_ms {0} is over the limit of {MAX_TIMEOUT_MS} (10 minutes)")]
    TimeoutTooLong(u32),
    #[error("filter {filter} has {phases} phases and runs only in wait_for_all streams")]
    MultiPhaseDontWait { filter: String, phases: u32 },
    #[error("unknown sync_mode {0}")]
    UnknownSyncMode(i32),
    /// The filter refused its parameters.
    #[error("{0}")]
    BadParams(String),
    #[error(transparent)]
    BadRanks(#[from] canopy_core::ranks::RankSetError),
    #[error("a detail request names the ranks (\"0,17,40-43\")")]
    DetailWithoutRanks,
    #[error(transparent)]
    BadOptions(#[from] canopy_core::options::OptionsError),
    #[error("give an action: start, stop, options, detail or window")]
    NoAction,
    #[error("an automatic detail stream chooses its own ranks: give --auto or ranks, not both")]
    AutoDetailWithRanks,
    #[error("no open {filter} stream named {name:?} to choose the detail ranks")]
    NoSourceStream { name: String, filter: String },
    /// A window of rounds the tree cannot honour exactly (it starts in the past, or ends before it starts).
    #[error("window refused: {0}")]
    Window(String),
    #[error("no stream {0}")]
    NoStream(u32),
    #[error("stream {id} is already {state}")]
    StreamEnded { id: u32, state: String },
    #[error("the front-end is shutting down")]
    ShuttingDown,
    /// A metric selection that cannot run on what the store holds (no such stream, too few rounds).
    #[error("metric selection: {0}")]
    Selection(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("a store read did not finish: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl ApiError {
    /// The gRPC code a client sees.
    pub fn code(&self) -> Code {
        match self {
            ApiError::ParamsTwice
            | ApiError::TimeoutTooLong(_)
            | ApiError::MultiPhaseDontWait { .. }
            | ApiError::UnknownSyncMode(_)
            | ApiError::BadParams(_)
            | ApiError::BadRanks(_)
            | ApiError::DetailWithoutRanks
            | ApiError::AutoDetailWithRanks
            | ApiError::BadOptions(_)
            | ApiError::NoAction => Code::InvalidArgument,
            ApiError::UnknownFilter(_) | ApiError::NoStream(_) | ApiError::NoSourceStream { .. } => {
                Code::NotFound
            }
            ApiError::StreamEnded { .. } | ApiError::Window(_) | ApiError::Selection(_) => {
                Code::FailedPrecondition
            }
            ApiError::ShuttingDown => Code::Unavailable,
            ApiError::Store(_) | ApiError::Task(_) => Code::Internal,
        }
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        if e.code() == Code::Internal {
            tracing::error!("api call failed: {e}");
        }
        Status::new(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_has_its_code_and_a_plain_message() {
        let cases = [
            (ApiError::NoStream(99), Code::NotFound, "no stream 99"),
            (
                ApiError::TimeoutTooLong(3_600_000),
                Code::InvalidArgument,
                "timeout_ms 3600000 is over the limit of 600000 (10 minutes)",
            ),
            (
                ApiError::StreamEnded {
                    id: 2,
                    state: "closed".into(),
                },
                Code::FailedPrecondition,
                "stream 2 is already closed",
            ),
            (
                ApiError::ShuttingDown,
                Code::Unavailable,
                "the front-end is shutting down",
            ),
        ];
        for (e, code, message) in cases {
            let status = Status::from(e);
            assert_eq!((status.code(), status.message()), (code, message));
        }
        let all = [
            ApiError::ParamsTwice.to_string(),
            ApiError::DetailWithoutRanks.to_string(),
            ApiError::NoAction.to_string(),
            ApiError::UnknownSyncMode(9).to_string(),
            ApiError::MultiPhaseDontWait {
                filter: "classify".into(),
                phases: 3,
            }
            .to_string(),
        ];
        for m in all {
            assert!(
                !m.ends_with('.') && m.starts_with(|c: char| !c.is_uppercase()),
                "{m}"
            );
        }
    }
}
