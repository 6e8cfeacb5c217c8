//! The front-end's side of the Kafka export: its settings (`kafka_*` in `[frontend]`), the exporter thread that
//! runs beside the tree, and its series on the metrics endpoint. The export itself is `canopy-kafka`'s.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use canopy_runtime::config::ConfigIssue;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use tokio::sync::{Notify, watch};

use crate::FrontendConfig;

pub use canopy_kafka::DEFAULT_TOPIC_PREFIX;

/// Checks the `kafka_*` keys.
pub fn check(config: &FrontendConfig) -> Result<(), ConfigIssue> {
    if config.kafka_brokers.is_empty() {
        return Ok(());
    }
    let sasl = !config.kafka_sasl_mechanism.is_empty();
    if sasl && (config.kafka_sasl_username.is_empty() || config.kafka_sasl_password_file.is_none()) {
        return Err(ConfigIssue::new(
            "kafka_sasl_mechanism",
            "SASL needs kafka_sasl_username and kafka_sasl_password_file",
        ));
    }
    if !sasl && (!config.kafka_sasl_username.is_empty() || config.kafka_sasl_password_file.is_some()) {
        return Err(ConfigIssue::new(
            "kafka_sasl_username",
            "set kafka_sasl_mechanism too (plain, scram-sha-256 or scram-sha-512)",
        ));
    }
    if let Some((key, message)) = settings(config).problem() {
        return Err(ConfigIssue::new(key, message));
    }
    Ok(())
}

fn settings(config: &FrontendConfig) -> canopy_kafka::KafkaSettings {
    canopy_kafka::KafkaSettings {
        brokers: config.kafka_brokers.clone(),
        topic_prefix: config.kafka_topic_prefix.clone(),
        replication_factor: config.kafka_replication_factor,
        tls_ca: config.kafka_tls_ca.clone(),
        sasl: (!config.kafka_sasl_mechanism.is_empty()).then(|| canopy_kafka::Sasl {
            mechanism: config.kafka_sasl_mechanism.clone(),
            username: config.kafka_sasl_username.clone(),
            password_file: config.kafka_sasl_password_file.clone().unwrap_or_default(),
        }),
    }
}

/// The export of a run, from the front-end's start to its end.
pub struct Export {
    stats: Arc<canopy_kafka::ExportStats>,
    ended: watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
}

impl Export {
    /// Starts publishing the run in `store` if `kafka_brokers` is set; `wake` is notified as rounds are
    /// committed. Says at once (from its thread) whether the brokers answer; the run goes on either way.
    pub fn start(
        config: &FrontendConfig,
        store: &Path,
        wake: Arc<Notify>,
    ) -> Result<Option<Export>, crate::FrontendError> {
        if config.kafka_brokers.is_empty() {
            return Ok(None);
        }
        let stats = Arc::new(canopy_kafka::ExportStats::default());
        let mut exporter = canopy_kafka::Exporter::new(settings(config), store, stats.clone(), wake)
            .map_err(|e| crate::FrontendError::Kafka(e.to_string()))?;
        let (ended, ended_rx) = watch::channel(false);
        let drain = Duration::from_millis(config.kafka_drain_ms);
        let brokers = config.kafka_brokers.join(",");
        // A thread and runtime of its own, as the store's writer has: the node's thread never waits on the
        // export's store reads and sends, and the export never waits behind a round's work.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("kafka-export".into())
            .spawn(move || {
                runtime.block_on(async move {
                    exporter.check(&brokers).await;
                    exporter.run(ended_rx, drain).await;
                });
            })?;
        Ok(Some(Export { stats, ended, thread }))
    }

    /// The export's series for the metrics endpoint.
    pub fn collector(&self) -> Box<dyn Collector> {
        Box::new(ExportCollector {
            stats: self.stats.clone(),
        })
    }

    /// The run is over and every round stored: publishes what is left (within `kafka_drain_ms`) and ends.
    pub async fn finish(self) {
        let _ = self.ended.send(true);
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

#[derive(Debug)]
struct ExportCollector {
    stats: Arc<canopy_kafka::ExportStats>,
}

impl Collector for ExportCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> fmt::Result {
        {
            let s = &self.stats;
            let series: [(&str, &str, u64); 5] = [
                (
                    "kafka_rounds_published",
                    "Rounds the Kafka brokers acknowledged",
                    s.published.load(Ordering::Relaxed) + s.found.load(Ordering::Relaxed),
                ),
                (
                    "kafka_rounds_refused",
                    "Rounds the brokers refused (each recorded in the store's kafka_rounds with the reason)",
                    s.failed.load(Ordering::Relaxed),
                ),
                (
                    "kafka_rounds_pending",
                    "Rounds stored and not yet acknowledged by the brokers",
                    s.pending.load(Ordering::Relaxed),
                ),
                (
                    "kafka_errors",
                    "Attempts to publish that failed (brokers away, time-outs)",
                    s.errors.load(Ordering::Relaxed),
                ),
                (
                    "kafka_up",
                    "1 if the last attempt reached the brokers",
                    u64::from(s.up.load(Ordering::Relaxed)),
                ),
            ];
            for (name, help, value) in series {
                let metric = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
                let family = enc.encode_descriptor(name, help, None, metric.metric_type())?;
                metric.encode(family)?;
            }
        }
        Ok(())
    }
}
