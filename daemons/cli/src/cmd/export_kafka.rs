//! `canopy export RUN --kafka-brokers ADDR`: a run's rounds published to Kafka as the front-end publishes them
//! (the same topics, keys and values), each once: what the store records as published, or what is found in the
//! topic on reading it, is not sent again.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use canopy_kafka::{KafkaSettings, Publisher, Sasl, ScanStart};

use canopy_report::run_store;

#[derive(clap::Args, Debug)]
pub struct KafkaArgs {
    /// Publish the run's rounds to these Kafka brokers (host:port, comma-separated) instead of writing files.
    #[arg(long, value_delimiter = ',', value_name = "HOST:PORT")]
    pub kafka_brokers: Vec<String>,
    /// Topics are `<prefix>.<stream name>`.
    #[arg(long, default_value = canopy_kafka::DEFAULT_TOPIC_PREFIX, requires = "kafka_brokers")]
    kafka_topic_prefix: String,
    /// Replicas of a topic this creates.
    #[arg(long, default_value_t = 1, requires = "kafka_brokers")]
    kafka_replication_factor: i16,
    /// PEM file of the CA the brokers' certificates chain to: TLS to the brokers.
    #[arg(long, requires = "kafka_brokers")]
    kafka_tls_ca: Option<PathBuf>,
    /// SASL: plain, scram-sha-256 or scram-sha-512 (with --kafka-sasl-username and --kafka-sasl-password-file).
    #[arg(long, requires_all = ["kafka_sasl_username", "kafka_sasl_password_file"])]
    kafka_sasl_mechanism: Option<String>,
    #[arg(long, requires = "kafka_sasl_mechanism")]
    kafka_sasl_username: Option<String>,
    #[arg(long, requires = "kafka_sasl_mechanism")]
    kafka_sasl_password_file: Option<PathBuf>,
}

impl KafkaArgs {
    fn settings(&self) -> KafkaSettings {
        KafkaSettings {
            brokers: self.kafka_brokers.clone(),
            topic_prefix: self.kafka_topic_prefix.clone(),
            replication_factor: self.kafka_replication_factor,
            tls_ca: self.kafka_tls_ca.clone(),
            sasl: self.kafka_sasl_mechanism.clone().map(|mechanism| Sasl {
                mechanism,
                username: self.kafka_sasl_username.clone().unwrap_or_default(),
                password_file: self.kafka_sasl_password_file.clone().unwrap_or_default(),
            }),
        }
    }
}

pub fn publish(run: &Path, args: &KafkaArgs) -> anyhow::Result<()> {
    let settings = args.settings();
    if let Some((key, message)) = settings.problem() {
        anyhow::bail!("--{}: {message}", key.replace('_', "-"));
    }
    let store = run_store::resolve(run)?;
    // An older store gains the tables that record what was published.
    drop(canopy_store::Store::open(&store).with_context(|| format!("cannot open {}", store.display()))?);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(publish_store(&store, settings))
}

async fn publish_store(store: &Path, settings: KafkaSettings) -> anyhow::Result<()> {
    let brokers = settings.brokers.join(",");
    let mut publisher = Publisher::open(settings, store, ScanStart::Earliest)?;
    let before = publisher.counts().await?;
    publisher
        .connect()
        .await
        .with_context(|| format!("cannot reach the Kafka brokers {brokers}"))?;
    let (mut published, mut found, mut refused) = (0, 0, Vec::new());
    loop {
        let pass = publisher.pass(u64::MAX).await.context("publishing")?;
        published += pass.published;
        found += pass.found;
        refused.extend(pass.failed);
        if pass.published == 0 && pass.found == 0 {
            break;
        }
    }
    let after = publisher.counts().await?;
    println!(
        "canopy export: {} rounds of run {} in {}: {published} published now; {} already there ({} recorded in the \
         store, {found} found in the topics); {} refused by the brokers",
        after.rounds,
        publisher.run(),
        store.display(),
        before.published + found,
        before.published,
        after.failed,
    );
    for (round, reason) in refused.iter().take(5) {
        println!("  round {round} refused: {reason}");
    }
    let pending = publisher.pending().await?;
    if pending > 0 {
        anyhow::bail!("{pending} rounds were not published");
    }
    Ok(())
}
