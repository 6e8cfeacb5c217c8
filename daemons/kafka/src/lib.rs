//! Canopy's rounds in a center's Kafka. The front-end publishes every round its store holds, each exactly once,
//! to the topic of its stream, and counts a round delivered only when the broker has acknowledged it; `canopy
//! export --kafka-brokers` publishes a finished run the same way. docs/kafka.md has the topic layout, the
//! records, and a consumer.
//!
//! The store is the queue: the [`Exporter`] reads what is committed and not yet published, so a broker that is
//! down or slow costs no memory and holds nothing up, and a restarted front-end goes on from the store.

#![forbid(unsafe_code)]

mod exporter;
mod publisher;
mod settings;

pub use exporter::{ExportStats, Exporter, META_STATE};
pub use publisher::{
    HEADER_RESULT_TYPE, HEADER_SCHEMA, HEADER_VALUE_TYPE, Pass, Publisher, REQUEST_TIMEOUT, RUN_ID,
    ScanStart, VALUE_TYPE,
};
pub use settings::{DEFAULT_TOPIC_PREFIX, KafkaSettings, SASL_MECHANISMS, Sasl, key, parse_key};

use canopy_store::StoreError;
use rskafka::client::error::{Error as ClientError, ProtocolError};

/// Why publishing failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The settings cannot work (a file that cannot be read, a bad CA).
    #[error("{0}")]
    Settings(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The brokers could not be reached, or did not answer in time: the rounds wait, and what was sent is read
    /// back before anything is sent again.
    #[error("{0}")]
    Broker(String),
    /// The broker answered with a refusal that sending again will not change (a topic it does not allow, a
    /// record too large).
    #[error("{0}")]
    Refused(String),
    /// The topic to create exists already.
    #[error("the topic exists")]
    Exists,
    #[error("store task: {0}")]
    Task(String),
}

impl ExportError {
    fn from_client(what: &str, e: ClientError) -> ExportError {
        // An error the client would have retried comes wrapped (it makes no retry of its own): the broker's
        // answer inside decides.
        let e = match e {
            ClientError::RetryFailed(rskafka::BackoffError::DeadlineExceded { source, .. }) => {
                match source.downcast::<ClientError>() {
                    Ok(inner) => *inner,
                    Err(other) => return ExportError::Broker(format!("{what}: {other}")),
                }
            }
            e => e,
        };
        let ClientError::ServerError {
            protocol_error,
            error_message,
            ..
        } = &e
        else {
            return ExportError::Broker(format!("{what}: {e}"));
        };
        let said = error_message
            .as_deref()
            .map(|m| format!(" ({m})"))
            .unwrap_or_default();
        match protocol_error {
            ProtocolError::TopicAlreadyExists => ExportError::Exists,
            ProtocolError::MessageTooLarge
            | ProtocolError::RecordListTooLarge
            | ProtocolError::InvalidRecord
            | ProtocolError::InvalidTopicException
            | ProtocolError::InvalidReplicationFactor
            | ProtocolError::InvalidPartitions
            | ProtocolError::PolicyViolation
            | ProtocolError::TopicAuthorizationFailed
            | ProtocolError::ClusterAuthorizationFailed => {
                ExportError::Refused(format!("{what}: {protocol_error:?}{said}"))
            }
            _ => ExportError::Broker(format!("{what}: {protocol_error:?}{said}")),
        }
    }
}

/// Retries inside the client: none, so that every failure reaches the publisher, which waits and reads back
/// before it sends again.
mod retry {
    use std::time::Duration;

    pub(crate) fn backoff() -> rskafka::BackoffConfig {
        rskafka::BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
            // No retry inside a request: a request the client sent again itself (after a broken connection) could
            // append a batch twice, unseen. Every failure comes back to the publisher, which reads back first.
            deadline: Some(Duration::ZERO),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rskafka::client::error::RequestContext;

    fn server(protocol_error: ProtocolError) -> ClientError {
        ClientError::ServerError {
            protocol_error,
            error_message: Some("said by the broker".into()),
            request: RequestContext::Topic("canopy.stats".into()),
            response: None,
            is_virtual: false,
        }
    }

    #[test]
    fn a_broker_s_answers_are_told_apart_by_whether_sending_again_can_help() {
        let refused = ExportError::from_client("send", server(ProtocolError::InvalidRecord));
        assert!(
            matches!(&refused, ExportError::Refused(m) if m.contains("InvalidRecord") && m.contains("said by the broker")),
            "{refused:?}"
        );
        for e in [
            ProtocolError::PolicyViolation,
            ProtocolError::TopicAuthorizationFailed,
            ProtocolError::MessageTooLarge,
        ] {
            assert!(matches!(
                ExportError::from_client("x", server(e)),
                ExportError::Refused(_)
            ));
        }
        assert!(matches!(
            ExportError::from_client("create", server(ProtocolError::TopicAlreadyExists)),
            ExportError::Exists
        ));
        // A leader that moved, a broker not ready: the next pass tries again.
        for e in [
            ProtocolError::NotLeaderOrFollower,
            ProtocolError::UnknownTopicOrPartition,
        ] {
            assert!(matches!(
                ExportError::from_client("x", server(e)),
                ExportError::Broker(_)
            ));
        }
        // What the client would have retried comes wrapped; the broker's answer inside decides.
        let wrapped = ClientError::RetryFailed(rskafka::BackoffError::DeadlineExceded {
            deadline: std::time::Duration::ZERO,
            source: Box::new(server(ProtocolError::InvalidReplicationFactor)),
        });
        assert!(matches!(
            ExportError::from_client("create", wrapped),
            ExportError::Refused(_)
        ));
        let timeout = ExportError::from_client("send", ClientError::Timeout);
        assert!(matches!(timeout, ExportError::Broker(_)));
    }
}
