//! A workflow's training data for metric selection (seed 004): per round, the mean end-to-end latency of the
//! steps a `latency` stream completed in it, beside every metric a `stats` stream holds for that round (each
//! application's mean of an event's metric, or of a counter).

use std::collections::{BTreeMap, HashMap};

use canopy_proto::filters::v1::Metric;

use crate::StoreError;
use crate::read::{Select, StoreReader};
use crate::rows::StreamRow;
use crate::words::{StreamState, Word};

/// The rounds a training set takes when the query does not say.
pub const DEFAULT_TRAINING_ROUNDS: u32 = 100;

/// A workflow's training data as people name it: streams by name, a key by name, the latest rounds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrainingQuery {
    /// The latency stream (empty: the one open stream of the latency filter).
    pub latency_stream: String,
    /// The stats stream (empty: the one open stream of the stats filter).
    pub stats_stream: String,
    /// Only this workflow key's steps (empty: every key's).
    pub key: String,
    /// The latest rounds both streams hold (0: [`DEFAULT_TRAINING_ROUNDS`]).
    pub rounds: u32,
}

/// One candidate metric: an application's mean of one metric of one event (or counter) over its ranks.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Candidate {
    /// The application (empty when the stats stream merges every application into one row).
    pub app: String,
    /// The event's (or counter's) name, or its id in hexadecimal when the store has no name for it.
    pub name: String,
    pub id: u64,
    pub metric: Metric,
}

impl Candidate {
    /// `app: name metric`, or `name metric` without an application.
    pub fn label(&self) -> String {
        if self.app.is_empty() {
            format!("{} {}", self.name, self.metric.word())
        } else {
            format!("{}: {} {}", self.app, self.name, self.metric.word())
        }
    }
}

/// The observations, in round order: `latency_ms[i]` and `columns[j][i]` are of `rounds[i]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Training {
    pub rounds: Vec<u64>,
    /// The mean end-to-end latency of the steps completed in each round, in milliseconds.
    pub latency_ms: Vec<f64>,
    /// The candidates, sorted by application, name and metric; each has a value in every observation.
    pub candidates: Vec<Candidate>,
    pub columns: Vec<Vec<f64>>,
    /// Candidates left out because they have no value in more than a tenth of the rounds with a latency.
    pub incomplete: usize,
    /// Rounds with a latency left out because a kept candidate has no value in them (a partial round).
    pub rounds_dropped: usize,
}

/// The share of the rounds a candidate must have a value in to be kept; the rounds it lacks are then dropped.
const PRESENT_IN: f64 = 0.9;

/// Which rounds and steps to learn from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrainingSpec {
    pub latency_stream: u32,
    pub stats_stream: u32,
    /// Only the steps of this workflow key (its id); `None`: every key's.
    pub key_id: Option<u64>,
    /// The first and last round (both included).
    pub from_round: u64,
    pub to_round: u64,
}

/// The stream of `filter` named `name` (the newest of that name), or else the one open stream of `filter`, or in
/// a run whose streams are all closed, its one stream of `filter`.
fn stream_of<'a>(streams: &'a [StreamRow], filter: &str, name: &str) -> Result<&'a StreamRow, StoreError> {
    if !name.is_empty() {
        let named = streams
            .iter()
            .filter(|s| s.name == name)
            .max_by_key(|s| s.stream_id)
            .ok_or_else(|| StoreError::Training(format!("no stream named {name:?}")))?;
        if named.filter != filter {
            return Err(StoreError::Training(format!(
                "stream {name:?} runs filter {}, not {filter}",
                named.filter
            )));
        }
        return Ok(named);
    }
    let of_filter: Vec<&StreamRow> = streams.iter().filter(|s| s.filter == filter).collect();
    let open: Vec<&StreamRow> = of_filter
        .iter()
        .copied()
        .filter(|s| s.state == Some(StreamState::Open))
        .collect();
    let candidates = if open.is_empty() { of_filter } else { open };
    match candidates.as_slice() {
        [one] => Ok(one),
        [] => Err(StoreError::Training(format!(
            "no {filter} stream: open one (canopy streams open {filter}) or name it"
        ))),
        many => Err(StoreError::Training(format!(
            "{} {filter} streams ({}): name one",
            many.len(),
            many.iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

impl StoreReader {
    /// The training data of `q`: its streams found by name (or as the one open stream of their filter), over
    /// the latest `q.rounds` rounds both hold.
    pub fn training_of(&self, q: &TrainingQuery) -> Result<Training, StoreError> {
        let streams = self.streams()?;
        let latency = stream_of(&streams, "latency", &q.latency_stream)?;
        let stats = stream_of(&streams, "stats", &q.stats_stream)?;
        let last = latency
            .last_round
            .zip(stats.last_round)
            .map(|(a, b)| a.min(b))
            .ok_or_else(|| {
                StoreError::Training(format!(
                    "streams {:?} and {:?} have no round in common yet",
                    latency.name, stats.name
                ))
            })?;
        let rounds = if q.rounds == 0 {
            DEFAULT_TRAINING_ROUNDS
        } else {
            q.rounds
        };
        self.training(&TrainingSpec {
            latency_stream: latency.stream_id,
            stats_stream: stats.stream_id,
            key_id: (!q.key.is_empty()).then(|| canopy_proto::event_id(&q.key)),
            from_round: last.saturating_sub(u64::from(rounds) - 1),
            to_round: last,
        })
    }

    /// The training data of `spec`: every round in its range with at least one completed step and a stats
    /// result, and every candidate with a value in each of those rounds. Rows that came late are left out:
    /// a round's values are those it was stored with.
    pub fn training(&self, spec: &TrainingSpec) -> Result<Training, StoreError> {
        let in_range = |round: u64| (spec.from_round..=spec.to_round).contains(&round);
        let mut latency: BTreeMap<u64, (f64, u32)> = BTreeMap::new();
        for row in self.latency(
            Select::all()
                .stream(spec.latency_stream)
                .from_round(spec.from_round)
                .late(false),
        )? {
            if in_range(row.round) && spec.key_id.is_none_or(|k| k == row.key_id) {
                let e = latency.entry(row.round).or_default();
                e.0 += row.latency_ns as f64 / 1e6;
                e.1 += 1;
            }
        }
        let names: HashMap<u64, String> = self.names()?.into_iter().collect();
        // Per candidate and round, the sum of the rows' means weighted by their ranks, and the ranks: a round of a
        // dont_wait stream is stored in pieces, each a row over some of the ranks.
        let mut values: BTreeMap<Candidate, HashMap<u64, (f64, u64)>> = BTreeMap::new();
        for row in self.stats(
            Select::all()
                .stream(spec.stats_stream)
                .from_round(spec.from_round)
                .late(false),
        )? {
            if !in_range(row.round)
                || row.class_id.is_some()
                || !latency.contains_key(&row.round)
                || row.count == 0
            {
                continue;
            }
            let Some(mean) = row.mean.filter(|m| m.is_finite()) else {
                continue;
            };
            let candidate = Candidate {
                app: row.app.unwrap_or_default(),
                name: names
                    .get(&row.id)
                    .cloned()
                    .unwrap_or_else(|| format!("{:016x}", row.id)),
                id: row.id,
                metric: row.metric,
            };
            let v = values.entry(candidate).or_default().entry(row.round).or_default();
            v.0 += mean * row.count as f64;
            v.1 += row.count;
        }
        // A candidate missing from a few rounds (a partial round, an application that left) drops those rounds;
        // one missing from many is dropped instead.
        let needed = (PRESENT_IN * latency.len() as f64).ceil() as usize;
        let mut training = Training::default();
        let mut kept = Vec::new();
        for (candidate, by_round) in values {
            if by_round.len() >= needed.max(1) {
                kept.push((candidate, by_round));
            } else {
                training.incomplete += 1;
            }
        }
        let rounds: Vec<u64> = latency
            .keys()
            .copied()
            .filter(|r| !kept.is_empty() && kept.iter().all(|(_, by_round)| by_round.contains_key(r)))
            .collect();
        training.rounds_dropped = latency.len() - rounds.len();
        training.latency_ms = rounds
            .iter()
            .map(|r| {
                let (sum, n) = latency[r];
                sum / f64::from(n)
            })
            .collect();
        for (candidate, by_round) in kept {
            training.columns.push(
                rounds
                    .iter()
                    .map(|r| {
                        let (sum, ranks) = by_round[r];
                        sum / ranks as f64
                    })
                    .collect(),
            );
            training.candidates.push(candidate);
        }
        training.rounds = rounds;
        Ok(training)
    }
}
