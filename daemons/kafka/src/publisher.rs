//! [`Publisher`]: sends a run's stored rounds that have no record in the store's `kafka_rounds` yet, in round
//! order per stream, and records each with the offset the broker acknowledged.
//!
//! Exactly once rests on the store and on reading back, not on the producer's session: after anything that
//! leaves a send in doubt (a time-out, a broken connection, a restart of the front-end), the publisher reads the
//! topic from this run's last acknowledged offset to its end before it sends again, and records the rounds it
//! finds there as published. A round is therefore sent again only if the broker does not hold it, whichever
//! producer sent it, and the answer outlives a producer id (which an idempotent producer's deduplication is
//! bound to, so it would not cover a restarted front-end).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use canopy_store::{KafkaLog, Published, StoreError, StoreReader, StreamRow};
use prost::Message;
use rskafka::client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;

use crate::settings::{KafkaSettings, key, parse_key};
use crate::{ExportError, retry};

/// The longest a request to a broker may take before the publisher gives it up (and reads back before sending
/// again): a broker that stopped answering is noticed in this time.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The most rounds sent in one request.
const BATCH_ROUNDS: u32 = 256;

/// How many times a topic's leader is asked for, 200 ms apart, before the pass fails.
const LEADER_TRIES: u32 = 10;

/// Rounds read from the store at a time while a request is filled.
const READ_ROUNDS: usize = 16;

/// The most value bytes sent in one request (a broker's default `message.max.bytes` is 1 MiB per batch).
const BATCH_BYTES: usize = 768 << 10;

/// The partition every round goes to: one per topic keeps a stream's rounds in order.
const PARTITION: i32 = 0;

/// Header names on every record.
pub const HEADER_VALUE_TYPE: &str = "canopy-value-type";
pub const HEADER_RESULT_TYPE: &str = "canopy-result-type";
pub const HEADER_SCHEMA: &str = "canopy-schema-version";

/// The value's protobuf type.
pub const VALUE_TYPE: &str = "canopy.v1.RoundUpdate";

/// Where a topic is read back from when the store does not say where this run's records begin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanStart {
    /// The topic's end: nothing of this run can be there yet (a front-end publishing its own run).
    End,
    /// The topic's beginning: the run may have been published before, from another copy of its store.
    Earliest,
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    /// Rounds the broker acknowledged in this pass.
    pub published: u64,
    /// Rounds found in the topic on reading back, published before (by an earlier pass or process).
    pub found: u64,
    /// Rounds given up on (the broker refused them), with the reason.
    pub failed: Vec<(u64, String)>,
}

/// The store's two connections: the reader for rounds, the log for what was published.
struct Db {
    reader: StoreReader,
    log: KafkaLog,
}

/// Publishes one run's rounds from its store.
pub struct Publisher {
    settings: KafkaSettings,
    store: PathBuf,
    run: String,
    db: Arc<Mutex<Db>>,
    client: Option<Arc<Client>>,
    partitions: HashMap<String, Arc<PartitionClient>>,
    /// Topics read back in this session: what the broker holds of this run is in the store.
    checked: HashSet<String>,
    /// Topics the broker refused, with its reason: their rounds are given up on.
    refused: HashMap<String, String>,
    /// Per stream, a row of `rounds` (its rowid) before which every round has its record. Rows are only added,
    /// so a round stored out of order (one that waited for its time-out) is after it, whatever its number.
    cursor: HashMap<u32, i64>,
    /// Per topic, the event names already sent with a record in this session.
    names_sent: HashMap<String, HashSet<u64>>,
    scan_start: ScanStart,
    /// What this publisher did since it opened, pass or failure alike.
    totals: Totals,
    /// The run's streams, as the last pass read them.
    streams: Vec<StreamRow>,
}

/// What a publisher did since it opened.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Rounds the broker acknowledged.
    pub published: u64,
    /// Rounds found in a topic on reading it back.
    pub found: u64,
    /// Rounds given up on.
    pub failed: u64,
}

impl Publisher {
    /// A publisher of the run in the store at `store` (which must have its run id in `meta`).
    pub fn open(
        settings: KafkaSettings,
        store: &Path,
        scan_start: ScanStart,
    ) -> Result<Publisher, ExportError> {
        let reader = StoreReader::open(store)?;
        let run = reader.meta(RUN_ID)?.ok_or_else(|| {
            ExportError::Settings(format!(
                "{} has no run id (meta.{RUN_ID}): not a run store",
                store.display()
            ))
        })?;
        let log = KafkaLog::open(store)?;
        Ok(Publisher {
            settings,
            store: store.to_path_buf(),
            run,
            db: Arc::new(Mutex::new(Db { reader, log })),
            client: None,
            partitions: HashMap::new(),
            checked: HashSet::new(),
            refused: HashMap::new(),
            cursor: HashMap::new(),
            names_sent: HashMap::new(),
            scan_start,
            totals: Totals::default(),
            streams: Vec::new(),
        })
    }

    /// What it did since it opened, including the part of a pass that failed.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// The run's id, the first part of every key.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// Connects to the brokers (if not connected), reading the brokers' metadata: a wrong address or a broker
    /// that does not answer fails here.
    pub async fn connect(&mut self) -> Result<(), ExportError> {
        if self.client.is_some() {
            return Ok(());
        }
        let mut builder = ClientBuilder::new(self.settings.brokers.clone())
            .client_id("canopy")
            .backoff_config(retry::backoff());
        if let Some(tls) = self.settings.tls()? {
            builder = builder.tls_config(tls);
        }
        if let Some(sasl) = self.settings.sasl()? {
            builder = builder.sasl_config(sasl);
        }
        let client = timed("connect", builder.build()).await?;
        timed("read the cluster's metadata", client.list_topics()).await?;
        self.client = Some(Arc::new(client));
        Ok(())
    }

    /// Forgets the connection after a failure: the next pass connects again and reads back every topic before
    /// it sends.
    pub fn disconnect(&mut self) {
        self.client = None;
        self.partitions.clear();
        self.checked.clear();
        // What was in doubt may not have reached the broker: its names go again with the next record.
        self.names_sent.clear();
    }

    /// Sends what the store holds that is not published yet, up to `max_rounds` rounds. On an error the
    /// connection is dropped, and what was in doubt is read back before the next send.
    pub async fn pass(&mut self, max_rounds: u64) -> Result<Pass, ExportError> {
        let result = self.pass_inner(max_rounds).await;
        if result.is_err() {
            self.disconnect();
        }
        result
    }

    /// Rounds stored and not published yet (nor given up on).
    pub async fn pending(&self) -> Result<u64, ExportError> {
        let cursor = self.cursor.clone();
        self.db(move |db| {
            let mut n = 0;
            for s in db.reader.streams()? {
                let from = cursor.get(&s.stream_id).copied().unwrap_or(0);
                n += db.reader.count_unpublished(s.stream_id, from)?;
            }
            Ok(n)
        })
        .await
    }

    /// Takes the streams in turn, a batch each, so that one stream's backlog does not hold the others back.
    async fn pass_inner(&mut self, max_rounds: u64) -> Result<Pass, ExportError> {
        self.connect().await?;
        let mut pass = Pass::default();
        let streams = self.db(|db| db.reader.streams()).await?;
        self.streams = streams.clone();
        loop {
            let mut busy = false;
            for stream in &streams {
                let done = pass.published + pass.failed.len() as u64;
                if done >= max_rounds {
                    return Ok(pass);
                }
                let limit = BATCH_ROUNDS.min(u32::try_from(max_rounds - done).unwrap_or(u32::MAX));
                busy |= self.batch(stream, &streams, limit, &mut pass).await?;
            }
            if !busy {
                return Ok(pass);
            }
        }
    }

    /// One batch of a stream's unpublished rounds (or, first in a session, the topic read back); `false` if the
    /// stream had none.
    async fn batch(
        &mut self,
        stream: &StreamRow,
        streams: &[StreamRow],
        limit: u32,
        pass: &mut Pass,
    ) -> Result<bool, ExportError> {
        let from = self.cursor.get(&stream.stream_id).copied().unwrap_or(0);
        let id = stream.stream_id;
        let rows = self
            .db(move |db| db.reader.unpublished_rounds(id, from, limit))
            .await?;
        let Some(&(first, _)) = rows.first() else {
            return Ok(false);
        };
        self.cursor.insert(id, first);
        let rounds: Vec<u64> = rows.iter().map(|(_, round)| *round).collect();
        let topic = self.settings.topic(&stream.name);
        if let Some(reason) = self.refused.get(&topic).cloned() {
            self.give_up(&topic, stream, &rounds, &reason, pass).await?;
            return Ok(true);
        }
        let partition = match self.partition(&topic).await {
            Ok(p) => p,
            Err(ExportError::Refused(reason)) => {
                tracing::error!(%topic, stream = %stream.name, "the broker refuses the topic: {reason}; \
                    the stream's rounds are not published, each recorded with the reason");
                self.refused.insert(topic.clone(), reason.clone());
                self.give_up(&topic, stream, &rounds, &reason, pass).await?;
                return Ok(true);
            }
            Err(e) => return Err(e),
        };
        if self.checked.insert(topic.clone()) {
            // Read back before the first send of this session: a send in doubt is found here.
            pass.found += self.read_back(&topic, &partition, streams).await?;
            return Ok(true);
        }
        self.send(&topic, &partition, stream, &rounds, pass).await?;
        Ok(true)
    }

    /// Sends `rounds` of `stream` in requests of at most [`BATCH_BYTES`], recording each acknowledged one.
    async fn send(
        &mut self,
        topic: &str,
        partition: &PartitionClient,
        stream: &StreamRow,
        rounds: &[u64],
        pass: &mut Pass,
    ) -> Result<(), ExportError> {
        let sent = self.names_sent.get(topic).cloned().unwrap_or_default();
        let names: Vec<(u64, String)> = self
            .db(move |db| db.reader.names())
            .await?
            .into_iter()
            .filter(|(id, _)| !sent.contains(id))
            .collect();
        let mut names = Some(names);
        let mut batch: Vec<(u64, Record)> = Vec::new();
        let mut bytes = 0;
        let result_type = stream.result_type.clone().unwrap_or_default();
        let key_stream = self.key_stream(stream);
        // Read a few rounds at a time, so a batch of large rounds (a passthrough stream's profiles) is in memory
        // only up to what one request carries.
        for chunk in rounds.chunks(READ_ROUNDS) {
            for s in self.read_rounds(stream, chunk).await? {
                let round = s.round;
                let mut update = s.update(stream, false);
                if let Some(names) = names.take() {
                    // The names the topic's readers do not have from this session: with its first record.
                    update.names = names
                        .into_iter()
                        .map(|(id, name)| canopy_proto::v1::EventName { id, name })
                        .collect();
                }
                let record = self.record(&key_stream, &result_type, round, &update);
                let size = record.approximate_size();
                if !batch.is_empty() && bytes + size > BATCH_BYTES {
                    self.produce(topic, partition, stream, std::mem::take(&mut batch), pass)
                        .await?;
                    bytes = 0;
                }
                bytes += size;
                batch.push((round, record));
                if let Some(sent) = names_of(&update) {
                    self.names_sent.entry(topic.to_string()).or_default().extend(sent);
                }
            }
        }
        if !batch.is_empty() {
            self.produce(topic, partition, stream, batch, pass).await?;
        }
        Ok(())
    }

    /// The stored rounds `rounds` of `stream` (in the order given): a range read when they are close together,
    /// else one by one, so rounds already published in between are not read.
    async fn read_rounds(
        &self,
        stream: &StreamRow,
        rounds: &[u64],
    ) -> Result<Vec<canopy_store::StoredRound>, ExportError> {
        let (first, last) = (
            rounds.iter().copied().min().unwrap_or(0),
            rounds.iter().copied().max().unwrap_or(0),
        );
        let (row, wanted) = (stream.clone(), rounds.to_vec());
        self.db(move |db| {
            let mut stored: HashMap<u64, canopy_store::StoredRound> =
                match last - first < 2 * wanted.len() as u64 {
                    true => db.reader.stored_rounds_between(&row, first, last)?,
                    false => {
                        let mut out = Vec::new();
                        for r in &wanted {
                            out.extend(db.reader.stored_rounds_between(&row, *r, *r)?);
                        }
                        out
                    }
                }
                .into_iter()
                .map(|s| (s.round, s))
                .collect();
            Ok(wanted.iter().filter_map(|r| stored.remove(r)).collect())
        })
        .await
    }

    /// The stream as keys name it: its name, or for a stream whose name an earlier stream of the run has,
    /// `name~id`, so that two streams of one name never share a key.
    fn key_stream(&self, stream: &StreamRow) -> String {
        key_stream(stream, &self.streams)
    }

    /// One request. A batch the broker finds too large is sent again round by round; a single round it refuses
    /// is given up on with the broker's reason. Any other failure leaves the batch in doubt.
    async fn produce(
        &mut self,
        topic: &str,
        partition: &PartitionClient,
        stream: &StreamRow,
        batch: Vec<(u64, Record)>,
        pass: &mut Pass,
    ) -> Result<(), ExportError> {
        let rounds: Vec<u64> = batch.iter().map(|(r, _)| *r).collect();
        let records: Vec<Record> = batch.iter().map(|(_, rec)| rec.clone()).collect();
        match timed("send", partition.produce(records, Compression::NoCompression)).await {
            Ok(offsets) if offsets.len() == rounds.len() => {
                let published: Vec<Published> = rounds
                    .iter()
                    .zip(offsets)
                    .map(|(&round, offset)| Published {
                        stream_id: stream.stream_id,
                        round,
                        partition: PARTITION,
                        offset,
                    })
                    .collect();
                let t = topic.to_string();
                let new = self.db(move |db| db.log.published(&t, &published)).await?;
                pass.published += new;
                self.totals.published += new;
                Ok(())
            }
            Ok(offsets) => Err(ExportError::Broker(format!(
                "{topic}: {} rounds sent, {} offsets acknowledged",
                rounds.len(),
                offsets.len()
            ))),
            Err(ExportError::Refused(reason)) if batch.len() > 1 => {
                tracing::debug!(%topic, rounds = batch.len(), "batch refused ({reason}): sent round by round");
                for one in batch {
                    Box::pin(self.produce(topic, partition, stream, vec![one], pass)).await?;
                }
                Ok(())
            }
            Err(ExportError::Refused(reason)) => {
                tracing::warn!(%topic, round = rounds[0], "the broker refused a round: {reason}; recorded with the reason");
                self.give_up(topic, stream, &rounds, &reason, pass).await
            }
            Err(e) => Err(e),
        }
    }

    async fn give_up(
        &mut self,
        topic: &str,
        stream: &StreamRow,
        rounds: &[u64],
        reason: &str,
        pass: &mut Pass,
    ) -> Result<(), ExportError> {
        let (t, id, r, why) = (
            topic.to_string(),
            stream.stream_id,
            rounds.to_vec(),
            reason.to_string(),
        );
        self.db(move |db| db.log.failed(&t, id, &r, &why)).await?;
        pass.failed
            .extend(rounds.iter().map(|r| (*r, reason.to_string())));
        Ok(())
    }

    /// Reads `topic` from where this run's records may begin to its end, and records every round of this run
    /// found there. Returns how many were not recorded yet.
    async fn read_back(
        &mut self,
        topic: &str,
        partition: &PartitionClient,
        streams: &[StreamRow],
    ) -> Result<u64, ExportError> {
        let end = timed("read the topic's end", partition.get_offset(OffsetAt::Latest)).await?;
        let t = topic.to_string();
        let (scan_from, last) = self
            .db(move |db| Ok((db.log.scan_from(&t)?, db.log.last_offset(&t)?)))
            .await?;
        let scan_from = match (scan_from, self.scan_start) {
            (Some(from), _) => from,
            (None, ScanStart::End) => end,
            (None, ScanStart::Earliest) => {
                timed(
                    "read the topic's beginning",
                    partition.get_offset(OffsetAt::Earliest),
                )
                .await?
            }
        };
        let t = topic.to_string();
        self.db(move |db| db.log.set_scan_from(&t, scan_from)).await?;
        // Records before the topic's first kept offset are gone (retention): reading starts at it at the earliest.
        let kept_from = timed(
            "read the topic's beginning",
            partition.get_offset(OffsetAt::Earliest),
        )
        .await?;
        let mut offset = scan_from.max(last.map_or(0, |l| l + 1)).max(kept_from);
        let by_name: HashMap<String, u32> = streams
            .iter()
            .map(|s| (key_stream(s, streams), s.stream_id))
            .collect();
        let mut found = Vec::new();
        while offset < end {
            let (records, _) = timed("read back", partition.fetch_records(offset, 1..(4 << 20), 100)).await?;
            let Some(next) = records.last().map(|r| r.offset + 1) else {
                break;
            };
            for r in &records {
                let Some((run, stream, round)) = r.record.key.as_deref().and_then(parse_key) else {
                    continue;
                };
                if run != self.run {
                    continue;
                }
                if let Some(&stream_id) = by_name.get(stream) {
                    found.push(Published {
                        stream_id,
                        round,
                        partition: PARTITION,
                        offset: r.offset,
                    });
                }
            }
            offset = next;
        }
        if found.is_empty() {
            return Ok(0);
        }
        let t = topic.to_string();
        let new = self.db(move |db| db.log.published(&t, &found)).await?;
        self.totals.found += new;
        if new > 0 {
            tracing::info!(%topic, rounds = new, "rounds found in the topic on reading back: recorded, not sent again");
        }
        Ok(new)
    }

    /// The partition client of `topic`, creating the topic if the cluster does not have it.
    async fn partition(&mut self, topic: &str) -> Result<Arc<PartitionClient>, ExportError> {
        if let Some(p) = self.partitions.get(topic) {
            return Ok(p.clone());
        }
        let client = self
            .client
            .clone()
            .ok_or_else(|| ExportError::Broker("not connected".into()))?;
        let topics = timed("list topics", client.list_topics()).await?;
        if !topics.iter().any(|t| t.name == topic) {
            let controller = client
                .controller_client()
                .map_err(|e| ExportError::Broker(e.to_string()))?;
            let create = controller.create_topic(topic, 1, self.settings.replication_factor, 5_000);
            match timed("create the topic", create).await {
                Ok(()) => {
                    tracing::info!(%topic, replication_factor = self.settings.replication_factor, "topic created")
                }
                Err(ExportError::Exists) => {}
                Err(e) => return Err(e),
            }
        }
        // A topic just created takes a moment to have a leader everywhere: ask again, briefly (nothing is sent).
        let mut tries = 0;
        let partition = loop {
            let found = timed(
                "find the topic's leader",
                client.partition_client(topic, PARTITION, UnknownTopicHandling::Retry),
            )
            .await;
            match found {
                Err(ExportError::Broker(_)) if tries < LEADER_TRIES => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => break other?,
            }
        };
        let partition = Arc::new(partition);
        self.partitions.insert(topic.to_string(), partition.clone());
        Ok(partition)
    }

    fn record(
        &self,
        key_stream: &str,
        result_type: &str,
        round: u64,
        update: &canopy_proto::v1::RoundUpdate,
    ) -> Record {
        let headers = BTreeMap::from([
            (HEADER_VALUE_TYPE.to_string(), VALUE_TYPE.as_bytes().to_vec()),
            (HEADER_RESULT_TYPE.to_string(), result_type.as_bytes().to_vec()),
            (
                HEADER_SCHEMA.to_string(),
                canopy_store::SCHEMA_VERSION.to_string().into_bytes(),
            ),
        ]);
        Record {
            key: Some(key(&self.run, key_stream, round).into_bytes()),
            value: Some(update.encode_to_vec()),
            headers,
            timestamp: now(),
        }
    }

    /// Runs `f` on the store off the runtime's threads.
    async fn db<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Db) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, ExportError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&mut db.lock().expect("store connections")))
            .await
            .map_err(|e| ExportError::Task(e.to_string()))?
            .map_err(ExportError::Store)
    }

    /// The store this publisher reads.
    pub fn store(&self) -> &Path {
        &self.store
    }

    /// The store's record of what was published and given up on.
    pub async fn counts(&self) -> Result<canopy_store::KafkaCounts, ExportError> {
        self.db(|db| db.log.counts()).await
    }

    /// Sets a `meta` fact of the store (the export's state).
    pub async fn set_meta(&self, key: &'static str, value: String) -> Result<(), ExportError> {
        self.db(move |db| db.log.set_meta(key, &value)).await
    }
}

/// The record's time: now, to the millisecond (chrono's clock is not built in).
fn now() -> rskafka::chrono::DateTime<rskafka::chrono::Utc> {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    rskafka::chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// The `meta` key of the run's id.
pub const RUN_ID: &str = "run_id";

/// The stream as keys name it: its name, or `name~id` when a stream of the run with a lower id has its name.
fn key_stream(stream: &StreamRow, streams: &[StreamRow]) -> String {
    let earlier = streams
        .iter()
        .any(|s| s.name == stream.name && s.stream_id < stream.stream_id);
    match earlier {
        true => format!("{}~{}", stream.name, stream.stream_id),
        false => stream.name.clone(),
    }
}

fn names_of(update: &canopy_proto::v1::RoundUpdate) -> Option<Vec<u64>> {
    (!update.names.is_empty()).then(|| update.names.iter().map(|n| n.id).collect())
}

/// Runs a request with [`REQUEST_TIMEOUT`], naming what it was for in the error.
async fn timed<T>(
    what: &'static str,
    f: impl std::future::Future<Output = Result<T, rskafka::client::error::Error>>,
) -> Result<T, ExportError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(ExportError::from_client(what, e)),
        Err(_) => Err(ExportError::Broker(format!(
            "{what}: no answer in {} s",
            REQUEST_TIMEOUT.as_secs()
        ))),
    }
}
