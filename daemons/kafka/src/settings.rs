//! Where and how a run's rounds are published: the brokers, the topics' names, TLS and SASL, and the record's
//! key, which names a round across runs.

use std::path::PathBuf;
use std::sync::Arc;

use crate::ExportError;

/// The topic prefix when none is given.
pub const DEFAULT_TOPIC_PREFIX: &str = "canopy";

/// The longest topic name a Kafka broker takes.
const MAX_TOPIC_LEN: usize = 249;

/// How to reach the brokers and name the topics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaSettings {
    /// Bootstrap brokers, `host:port` each.
    pub brokers: Vec<String>,
    /// Topics are `<prefix>.<stream name>`.
    pub topic_prefix: String,
    /// Replicas of a topic Canopy creates (a topic that exists is used as it is).
    pub replication_factor: i16,
    /// PEM file of the CA the brokers' certificates chain to: TLS to the brokers. `None`: plaintext.
    pub tls_ca: Option<PathBuf>,
    /// SASL: `plain`, `scram-sha-256` or `scram-sha-512`, with the user and a file holding the password.
    pub sasl: Option<Sasl>,
}

/// SASL credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sasl {
    pub mechanism: String,
    pub username: String,
    pub password_file: PathBuf,
}

/// The SASL mechanisms the client speaks.
pub const SASL_MECHANISMS: &[&str] = &["plain", "scram-sha-256", "scram-sha-512"];

impl KafkaSettings {
    /// Why these settings cannot work, naming the setting; `None` if they can.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        for b in &self.brokers {
            let Some((host, port)) = b.rsplit_once(':') else {
                return Some(("kafka_brokers", format!("{b:?} is not host:port")));
            };
            if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Some(("kafka_brokers", format!("{b:?} is not host:port")));
            }
        }
        let prefix = &self.topic_prefix;
        if prefix.is_empty() || !prefix.chars().all(legal_in_topic) || prefix.len() > MAX_TOPIC_LEN - 2 {
            return Some((
                "kafka_topic_prefix",
                format!(
                    "{prefix:?} cannot begin a Kafka topic name: 1 to {} of the letters, digits, '.', '_' and '-'",
                    MAX_TOPIC_LEN - 2
                ),
            ));
        }
        if self.replication_factor < 1 {
            return Some(("kafka_replication_factor", "must be 1 or more".into()));
        }
        if let Some(ca) = &self.tls_ca
            && let Err(e) = std::fs::File::open(ca)
        {
            return Some(("kafka_tls_ca", format!("cannot read {}: {e}", ca.display())));
        }
        if let Some(sasl) = &self.sasl
            && let Err(e) = std::fs::File::open(&sasl.password_file)
        {
            return Some((
                "kafka_sasl_password_file",
                format!("cannot read {}: {e}", sasl.password_file.display()),
            ));
        }
        if let Some(sasl) = &self.sasl
            && !SASL_MECHANISMS.contains(&sasl.mechanism.as_str())
        {
            return Some((
                "kafka_sasl_mechanism",
                format!(
                    "{:?} is not one of {}",
                    sasl.mechanism,
                    SASL_MECHANISMS.join(", ")
                ),
            ));
        }
        None
    }

    /// The topic of a stream: `<prefix>.<stream name>`, each character a topic may not hold as `_`, cut to the
    /// length a broker takes.
    pub fn topic(&self, stream: &str) -> String {
        let mut topic = format!("{}.", self.topic_prefix);
        topic.extend(stream.chars().map(|c| if legal_in_topic(c) { c } else { '_' }));
        topic.truncate(MAX_TOPIC_LEN);
        topic
    }

    /// The rustls settings for the brokers, when TLS is asked for.
    pub(crate) fn tls(&self) -> Result<Option<Arc<rustls::ClientConfig>>, ExportError> {
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject;
        let Some(ca) = &self.tls_ca else {
            return Ok(None);
        };
        let bad = |why: String| ExportError::Settings(format!("kafka_tls_ca {}: {why}", ca.display()));
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).map_err(|e| bad(e.to_string()))? {
            roots
                .add(cert.map_err(|e| bad(e.to_string()))?)
                .map_err(|e| bad(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(bad("no certificate in it".into()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Some(Arc::new(config)))
    }

    /// The client's SASL settings, the password read from its file.
    pub(crate) fn sasl(&self) -> Result<Option<rskafka::client::SaslConfig>, ExportError> {
        use rskafka::client::{Credentials, SaslConfig};
        let Some(sasl) = &self.sasl else {
            return Ok(None);
        };
        let password = std::fs::read_to_string(&sasl.password_file).map_err(|e| {
            ExportError::Settings(format!(
                "kafka_sasl_password_file {}: {e}",
                sasl.password_file.display()
            ))
        })?;
        let credentials = Credentials::new(sasl.username.clone(), password.trim_end().to_string());
        Ok(Some(match sasl.mechanism.as_str() {
            "plain" => SaslConfig::Plain(credentials),
            "scram-sha-256" => SaslConfig::ScramSha256(credentials),
            "scram-sha-512" => SaslConfig::ScramSha512(credentials),
            other => {
                return Err(ExportError::Settings(format!(
                    "kafka_sasl_mechanism {other:?} is not one of {}",
                    SASL_MECHANISMS.join(", ")
                )));
            }
        }))
    }
}

fn legal_in_topic(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// A record's key: `RUN/STREAM/ROUND` as UTF-8. The run id has no `/`; the stream name may, so a key is read
/// from both ends.
pub fn key(run: &str, stream: &str, round: u64) -> String {
    format!("{run}/{stream}/{round}")
}

/// A key's run, stream and round, if it is one of Canopy's.
pub fn parse_key(key: &[u8]) -> Option<(&str, &str, u64)> {
    let key = std::str::from_utf8(key).ok()?;
    let (run, rest) = key.split_once('/')?;
    let (stream, round) = rest.rsplit_once('/')?;
    Some((run, stream, round.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> KafkaSettings {
        KafkaSettings {
            brokers: vec!["127.0.0.1:9092".into()],
            topic_prefix: DEFAULT_TOPIC_PREFIX.into(),
            replication_factor: 1,
            ..Default::default()
        }
    }

    #[test]
    fn keys_read_back_whatever_the_stream_name() {
        let k = key("r-1700000000-42", "detail/ranks 0-3", 17);
        assert_eq!(
            parse_key(k.as_bytes()),
            Some(("r-1700000000-42", "detail/ranks 0-3", 17))
        );
        assert_eq!(parse_key(b"someone-else"), None);
        assert_eq!(parse_key(b"a/b/not-a-round"), None);
    }

    #[test]
    fn topics_hold_only_what_a_broker_takes() {
        let s = settings();
        assert_eq!(s.topic("stats"), "canopy.stats");
        assert_eq!(s.topic("detail ranks/0-3"), "canopy.detail_ranks_0-3");
        assert_eq!(s.topic(&"x".repeat(400)).len(), MAX_TOPIC_LEN);
    }

    #[test]
    fn bad_settings_are_named() {
        let mut s = settings();
        assert_eq!(s.problem(), None);
        s.brokers = vec!["localhost".into()];
        assert_eq!(s.problem().unwrap().0, "kafka_brokers");
        s = settings();
        s.topic_prefix = "canopy jobs".into();
        assert_eq!(s.problem().unwrap().0, "kafka_topic_prefix");
        s = settings();
        s.sasl = Some(Sasl {
            mechanism: "scram-sha-256".into(),
            username: "u".into(),
            password_file: "/nope".into(),
        });
        assert_eq!(s.problem().unwrap().0, "kafka_sasl_password_file");
        let file = tempfile::NamedTempFile::new().unwrap();
        s.sasl = Some(Sasl {
            mechanism: "gssapi".into(),
            username: "u".into(),
            password_file: file.path().to_path_buf(),
        });
        assert!(s.problem().unwrap().1.contains("scram-sha-512"));
    }
}
