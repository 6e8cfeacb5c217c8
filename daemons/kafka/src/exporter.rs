//! [`Exporter`]: the front-end's task that publishes its run while it goes on. Woken as rounds are committed,
//! it sends what the store holds and the broker has not acknowledged. A broker that is down or slow holds
//! nothing up: the rounds wait in the store, the failure is logged when it begins, when its reason changes and
//! once a minute after, and the rounds go out in order once a broker answers.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::ExportError;
use crate::publisher::{Publisher, ScanStart};
use crate::settings::KafkaSettings;

/// The `meta` key of the export's state: `publishing`, `failing since UNIX_NS: REASON`, `done`, or
/// `incomplete: N rounds not published: REASON`.
pub const META_STATE: &str = "kafka_export";

/// The most rounds one pass sends before it looks at the time again.
const ROUNDS_PER_PASS: u64 = 512;

/// How often the exporter looks at the store when nothing wakes it.
const IDLE_POLL: Duration = Duration::from_secs(1);

/// The longest wait between two tries of a broker that failed.
const MAX_RETRY: Duration = Duration::from_secs(10);

/// How often a failure that goes on is logged again.
const LOG_AGAIN: Duration = Duration::from_secs(60);

/// The export's figures, for the front-end's metrics endpoint.
#[derive(Debug, Default)]
pub struct ExportStats {
    /// Rounds the broker acknowledged.
    pub published: AtomicU64,
    /// Rounds found in a topic on reading back after a send in doubt (acknowledged, but not recorded).
    pub found: AtomicU64,
    /// Rounds given up on (the broker refused them), each recorded in the store with the reason.
    pub failed: AtomicU64,
    /// Rounds stored and not published yet.
    pub pending: AtomicU64,
    /// Passes that failed (a broker away, a time-out).
    pub errors: AtomicU64,
    /// Whether the last pass reached the brokers.
    pub up: AtomicBool,
}

/// The front-end's exporter of its run.
pub struct Exporter {
    publisher: Publisher,
    stats: Arc<ExportStats>,
    wake: Arc<Notify>,
}

/// A failure that goes on, for its log lines.
struct Failing {
    reason: String,
    since: Instant,
    since_unix_ns: u128,
    attempts: u64,
    logged: Instant,
}

impl Exporter {
    /// An exporter of the run in `store`. `wake` is notified as rounds are committed.
    pub fn new(
        settings: KafkaSettings,
        store: &Path,
        stats: Arc<ExportStats>,
        wake: Arc<Notify>,
    ) -> Result<Exporter, ExportError> {
        Ok(Exporter {
            publisher: Publisher::open(settings, store, ScanStart::End)?,
            stats,
            wake,
        })
    }

    /// Connects once, to say at start whether the brokers answer. The run goes on either way.
    pub async fn check(&mut self, brokers: &str) {
        match self.publisher.connect().await {
            Ok(()) => {
                tracing::info!(%brokers, run = %self.publisher.run(), "publishing each round to Kafka once stored")
            }
            Err(e) => tracing::error!(%brokers,
                "cannot reach the Kafka brokers: {e}. The run goes on: its rounds wait in the store and are \
                 published in order once a broker answers (or afterwards with `canopy export {} --kafka-brokers \
                 {brokers}`)", self.publisher.store().display()),
        }
    }

    /// Publishes until `ended` turns true, then for at most `drain` more, until every stored round is published.
    pub async fn run(mut self, mut ended: watch::Receiver<bool>, drain: Duration) {
        let _ = self.publisher.set_meta(META_STATE, "publishing".into()).await;
        let mut failing: Option<Failing> = None;
        let mut retry = Duration::from_millis(500);
        let mut more = true;
        loop {
            if *ended.borrow() {
                break;
            }
            if !more {
                tokio::select! {
                    () = self.wake.notified() => {}
                    _ = ended.changed() => {}
                    () = tokio::time::sleep(IDLE_POLL) => {}
                }
            }
            match self.pass().await {
                Ok(full) => {
                    more = full;
                    retry = Duration::from_millis(500);
                    if let Some(f) = failing.take() {
                        tracing::info!(
                            attempts = f.attempts,
                            away_s = f.since.elapsed().as_secs(),
                            "the Kafka brokers answer again: publishing what waited in the store"
                        );
                        let _ = self.publisher.set_meta(META_STATE, "publishing".into()).await;
                    }
                }
                Err(e) => {
                    more = true;
                    self.failed(&mut failing, &e).await;
                    tokio::select! {
                        () = tokio::time::sleep(retry) => {}
                        _ = ended.changed() => {}
                    }
                    retry = (retry * 2).min(MAX_RETRY);
                }
            }
        }
        self.finish(drain, failing).await;
    }

    /// One pass; `true` if it stopped at its bound with more to send.
    async fn pass(&mut self) -> Result<bool, ExportError> {
        let result = self.publisher.pass(ROUNDS_PER_PASS).await;
        let (s, totals) = (&self.stats, self.publisher.totals());
        s.published.store(totals.published, Ordering::Relaxed);
        s.found.store(totals.found, Ordering::Relaxed);
        s.failed.store(totals.failed, Ordering::Relaxed);
        s.up.store(result.is_ok(), Ordering::Relaxed);
        if result.is_err() {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Ok(pending) = self.publisher.pending().await {
            s.pending.store(pending, Ordering::Relaxed);
        }
        result.map(|p| p.published + p.failed.len() as u64 >= ROUNDS_PER_PASS)
    }

    async fn failed(&self, failing: &mut Option<Failing>, e: &ExportError) {
        let reason = e.to_string();
        let now = Instant::now();
        match failing {
            Some(f) if f.reason == reason => {
                f.attempts += 1;
                if f.logged.elapsed() >= LOG_AGAIN {
                    f.logged = now;
                    tracing::warn!(
                        attempts = f.attempts,
                        away_s = f.since.elapsed().as_secs(),
                        pending = self.stats.pending.load(Ordering::Relaxed),
                        "still cannot publish to Kafka: {reason}; the rounds wait in the store"
                    );
                }
                return;
            }
            _ => {}
        }
        let first = failing.is_none();
        let since_unix_ns = failing.as_ref().map_or_else(unix_ns, |f| f.since_unix_ns);
        let since = failing.as_ref().map_or(now, |f| f.since);
        let attempts = failing.as_ref().map_or(1, |f| f.attempts + 1);
        match first {
            true => tracing::error!(
                pending = self.stats.pending.load(Ordering::Relaxed),
                "cannot publish to Kafka: {reason}. The run goes on: rounds wait in the store and are published \
                 in order once a broker answers"
            ),
            false => tracing::warn!(attempts, "cannot publish to Kafka, now: {reason}"),
        }
        let _ = self
            .publisher
            .set_meta(META_STATE, format!("failing since {since_unix_ns}: {reason}"))
            .await;
        *failing = Some(Failing {
            reason,
            since,
            since_unix_ns,
            attempts,
            logged: now,
        });
    }

    /// The run is over: what is left is sent within `drain`, and the store says whether all of it went.
    async fn finish(mut self, drain: Duration, mut failing: Option<Failing>) {
        let deadline = Instant::now() + drain;
        loop {
            let attempt = tokio::time::timeout_at(deadline, self.pass()).await;
            match attempt {
                Ok(Ok(true)) => continue,
                Ok(Ok(false)) => {
                    failing = None;
                    break;
                }
                Ok(Err(e)) => {
                    self.failed(&mut failing, &e).await;
                    if tokio::time::timeout_at(deadline, tokio::time::sleep(Duration::from_millis(500)))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        let pending = self.publisher.pending().await.unwrap_or(0);
        self.stats.pending.store(pending, Ordering::Relaxed);
        let counts = self.publisher.counts().await.ok().unwrap_or_default();
        let state = match pending {
            0 => "done".to_string(),
            n => {
                let reason = failing.map_or_else(
                    || format!("not sent within {} ms", drain.as_millis()),
                    |f| f.reason,
                );
                tracing::error!(rounds = n, store = %self.publisher.store().display(),
                    "rounds not published to Kafka ({reason}): publish them with `canopy export {} --kafka-brokers ...`",
                    self.publisher.store().display());
                format!("incomplete: {n} rounds not published: {reason}")
            }
        };
        tracing::info!(
            published = counts.published,
            refused = counts.failed,
            pending,
            "Kafka export {state}"
        );
        let _ = self.publisher.set_meta(META_STATE, state).await;
    }
}

fn unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
