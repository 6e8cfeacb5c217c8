//! Metric selection for workflows (seed 004's MCoordinator): the metrics of a `stats` stream ranked by how well
//! they explain the end-to-end latency a `latency` stream measures, a subset chosen by correlation-based feature
//! selection (CFS with a best-first search), its predictive power checked beside the full set's, and, when asked,
//! collection narrowed to it through each application's options.
//!
//! A selection runs on request (`SelectMetrics`, `canopy ctl select`), every `select_every_rounds` rounds of the
//! latency stream, or when the latency's moving average moves by `select_on_change` (a fraction) from what it was
//! at the previous selection; `select_apply` applies what a triggered selection chooses.

use std::collections::BTreeMap;
use std::sync::Arc;

use canopy_core::node::RootHandle;
use canopy_proto::filters::v1::LatencyResult;
use canopy_proto::v1::{AppOptions, CandidateMetric, SelectMetricsRequest, SelectMetricsResponse};
use canopy_select::{Dataset, SearchOptions};
use canopy_store::{Candidate, StoreError, StoreReader, Training, TrainingQuery, Word};
use prost::Message;
use tokio::sync::broadcast;

use crate::error::ApiError;
use crate::state::State;

/// The rounds learned from when the request does not say.
pub const DEFAULT_ROUNDS: u32 = canopy_store::DEFAULT_TRAINING_ROUNDS;
/// The check runs once per fifth of the observations, each fifth validating a model trained on the rest (the
/// paper's 80% and 20%).
const FOLDS: usize = 5;
/// Rounds in the latency's moving average that the change trigger follows.
const MOVING_AVERAGE_ROUNDS: usize = 10;
/// The most rounds a selection learns from: what it reads from the store grows with them.
pub const MAX_ROUNDS: u32 = 1000;
/// The fewest: the check validates on the last fifth of them, which needs at least two.
pub const MIN_ROUNDS: u32 = 10;
/// The most candidates the search and the check take, the most correlated with the latency first: the search
/// keeps a square matrix of their correlations and the check solves a system as large.
pub const MAX_CANDIDATES: usize = 500;

/// The training data a request asks for, read from the store.
pub fn training(reader: &StoreReader, req: &SelectMetricsRequest) -> Result<Training, ApiError> {
    if req.rounds != 0 && !(MIN_ROUNDS..=MAX_ROUNDS).contains(&req.rounds) {
        return Err(ApiError::Selection(format!(
            "rounds {} is not between {MIN_ROUNDS} and {MAX_ROUNDS}",
            req.rounds
        )));
    }
    let query = TrainingQuery {
        latency_stream: req.latency_stream.clone(),
        stats_stream: req.stats_stream.clone(),
        key: req.key.clone(),
        rounds: req.rounds,
    };
    reader.training_of(&query).map_err(|e| match e {
        StoreError::Training(m) => ApiError::Selection(m),
        e => ApiError::Store(e),
    })
}

/// The training data as the selection's data set: the latency is the target, each candidate a column.
pub fn dataset(t: &Training) -> Result<Dataset, ApiError> {
    Dataset::new(
        t.candidates.iter().map(Candidate::label).collect(),
        t.latency_ms.clone(),
        t.columns.clone(),
    )
    .map_err(|e| ApiError::Selection(e.to_string()))
}

/// Ranks the candidates of `t`, chooses a subset, and checks how well it predicts the latency. Every candidate is
/// ranked; the search and the check take the [`MAX_CANDIDATES`] most correlated, one of each set of an event's
/// metrics that are equal in every round.
pub fn select(t: &Training) -> Result<SelectMetricsResponse, ApiError> {
    let all = dataset(t)?;
    let correlations: Vec<f64> = all
        .columns
        .iter()
        .map(|c| canopy_select::correlation(c, &all.target).abs())
        .collect();
    let mut order: Vec<usize> = (0..all.features()).collect();
    order.sort_by(|&a, &b| correlations[b].total_cmp(&correlations[a]).then(a.cmp(&b)));
    // Two metrics of one event equal in every round (a leaf region's inclusive and exclusive time) are one
    // candidate to the search: a copy would only weigh its twin twice.
    let mut searched: Vec<usize> = Vec::new();
    for &i in &order {
        let c = &t.candidates[i];
        let twin = searched.iter().any(|&j| {
            let d = &t.candidates[j];
            d.app == c.app && d.id == c.id && all.columns[j] == all.columns[i]
        });
        if !twin {
            searched.push(i);
        }
        if searched.len() == MAX_CANDIDATES {
            break;
        }
    }
    searched.sort_unstable();
    let ds = Dataset::new(
        searched.iter().map(|&i| all.names[i].clone()).collect(),
        all.target.clone(),
        searched.iter().map(|&i| all.columns[i].clone()).collect(),
    )
    .map_err(|e| ApiError::Selection(e.to_string()))?;
    let chosen = canopy_select::select(&ds, &SearchOptions::default());
    let subset: Vec<usize> = chosen.subset.iter().map(|&k| searched[k]).collect();
    let fit = |subset: &[usize]| cross_validated_error(&ds, subset);
    let ranking = order
        .iter()
        .map(|&i| {
            let c = &t.candidates[i];
            CandidateMetric {
                app: c.app.clone(),
                event_id: c.id,
                event: c.name.clone(),
                metric: c.metric.word().to_string(),
                correlation: correlations[i],
                selected: subset.contains(&i),
            }
        })
        .collect();
    Ok(SelectMetricsResponse {
        ranking,
        merit: chosen.merit,
        from_round: t.rounds.first().copied().unwrap_or_default(),
        to_round: t.rounds.last().copied().unwrap_or_default(),
        observations: t.rounds.len() as u32,
        subsets_evaluated: chosen.evaluated as u32,
        error_selected: fit(&chosen.subset)?,
        error_all: fit(&(0..ds.features()).collect::<Vec<_>>())?,
        applied: Vec::new(),
        latency_mean_ms: t.latency_ms.iter().sum::<f64>() / t.latency_ms.len().max(1) as f64,
        incomplete: t.incomplete as u32,
    })
}

/// The relative absolute error of a linear model of the latency over `subset`, averaged over [`FOLDS`] folds: each
/// fifth of the rounds in turn validates a model trained on the other four (the paper's 80% and 20%, every round
/// validated once), so the comparison of two subsets does not hang on which rounds one split left out.
fn cross_validated_error(ds: &Dataset, subset: &[usize]) -> Result<f64, ApiError> {
    let n = ds.len();
    let mut total = 0.0;
    for fold in 0..FOLDS {
        let (lo, hi) = (fold * n / FOLDS, (fold + 1) * n / FOLDS);
        // The fold's rounds last, where the check validates.
        let order: Vec<usize> = (0..lo).chain(hi..n).chain(lo..hi).collect();
        let rotated = Dataset::new(
            subset.iter().map(|&j| ds.names[j].clone()).collect(),
            order.iter().map(|&i| ds.target[i]).collect(),
            subset
                .iter()
                .map(|&j| order.iter().map(|&i| ds.columns[j][i]).collect())
                .collect(),
        )
        .map_err(|e| ApiError::Selection(e.to_string()))?;
        let all: Vec<usize> = (0..subset.len()).collect();
        let fit = canopy_select::prediction_error(&rotated, &all, (n - (hi - lo)) as f64 / n as f64)
            .map_err(|e| ApiError::Selection(e.to_string()))?;
        total += fit.relative_absolute_error;
    }
    Ok(total / FOLDS as f64)
}

/// Each application's options that narrow its collection to its chosen metrics: its events to those named, its
/// metrics to those chosen (a per-event metric keeps every metric: it is measured by the counters' option).
/// Every application with a candidate gets an entry, so one with none chosen reports no event at all; its ranks
/// still dump, and their step marks still reach the latency stream.
pub fn narrowed(ranking: &[CandidateMetric]) -> Vec<AppOptions> {
    let mut by_app: BTreeMap<&str, (Vec<&str>, Vec<&str>, bool)> = BTreeMap::new();
    // An event the store has no name for cannot be included by name: its application is left as it is.
    let unnamed: Vec<&str> = ranking
        .iter()
        .filter(|c| c.selected && c.event == format!("{:016x}", c.event_id))
        .map(|c| c.app.as_str())
        .collect();
    for c in ranking {
        if unnamed.contains(&c.app.as_str()) {
            continue;
        }
        let entry = by_app.entry(c.app.as_str()).or_default();
        if !c.selected {
            continue;
        }
        if !entry.0.contains(&c.event.as_str()) {
            entry.0.push(&c.event);
        }
        match c.metric.as_str() {
            "calls" | "inclusive" | "exclusive" => entry.1.push(&c.metric),
            "counter" => entry.1.push("counters"),
            _ => entry.2 = true,
        }
    }
    by_app
        .into_iter()
        .filter(|(app, _)| !app.is_empty())
        .map(|(app, (mut events, mut metrics, every_metric))| {
            events.sort_unstable();
            metrics.sort_unstable();
            metrics.dedup();
            let include = if events.is_empty() {
                // Event names are never empty: this matches none.
                "^$".to_string()
            } else {
                let names: Vec<String> = events.iter().map(|e| regex_lite::escape(e)).collect();
                format!("^(?:{})$", names.join("|"))
            };
            AppOptions {
                app: app.to_string(),
                include: vec![include],
                exclude: Vec::new(),
                metrics: if every_metric || events.is_empty() {
                    Vec::new()
                } else {
                    metrics.into_iter().map(str::to_string).collect()
                },
                sample_below: None,
            }
        })
        .collect()
}

/// Applies `apps` as the applications' options, from their ranks' next dump on; what the options are now.
pub async fn apply(shared: &State, root: &RootHandle, apps: &[AppOptions]) -> Result<(), ApiError> {
    let mut options = shared.effective_options();
    for a in apps {
        options = shared.set_app_options(a.clone());
    }
    if apps.is_empty() || root.options(options).await {
        Ok(())
    } else {
        Err(ApiError::ShuttingDown)
    }
}

/// When a selection runs by itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Triggers {
    /// Every this many rounds of the latency stream (0: never).
    pub every_rounds: u64,
    /// When the moving average of the latency moves by this fraction from its value at the previous selection
    /// (0: never).
    pub on_change: f64,
    /// Apply what a triggered selection chooses.
    pub apply: bool,
    /// Rounds each selection learns from.
    pub rounds: u32,
}

impl Triggers {
    /// The triggers the configuration sets, if any.
    pub fn of(config: &crate::FrontendConfig) -> Option<Self> {
        let triggers = Self {
            every_rounds: config.select_every_rounds,
            on_change: config.select_on_change,
            apply: config.select_apply,
            rounds: config.select_rounds,
        };
        triggers.any().then_some(triggers)
    }

    pub fn any(&self) -> bool {
        self.every_rounds > 0 || self.on_change > 0.0
    }
}

/// Why a selection ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Timer,
    Change,
    /// The rounds after a widening: collection was narrowed by an earlier selection, so the one a timer or a
    /// change asked for first returned every application to its options and learned from what came after.
    Relearn,
}

/// Follows the latency streams' results and says when a selection is due.
#[derive(Debug)]
pub struct Watch {
    triggers: Triggers,
    rounds_since: u64,
    recent: std::collections::VecDeque<f64>,
    /// The moving average when the previous selection ran.
    reference: Option<f64>,
}

impl Watch {
    pub fn new(triggers: Triggers) -> Watch {
        Watch {
            triggers,
            rounds_since: 0,
            recent: std::collections::VecDeque::new(),
            reference: None,
        }
    }

    /// Takes in one round of the latency stream (the latencies of the steps it completed, ms); a selection is
    /// due if it says so.
    pub fn round(&mut self, latencies_ms: &[f64]) -> Option<Trigger> {
        self.rounds_since += 1;
        if !latencies_ms.is_empty() {
            if self.recent.len() == MOVING_AVERAGE_ROUNDS {
                self.recent.pop_front();
            }
            self.recent
                .push_back(latencies_ms.iter().sum::<f64>() / latencies_ms.len() as f64);
        }
        let average = (self.recent.len() == MOVING_AVERAGE_ROUNDS)
            .then(|| self.recent.iter().sum::<f64>() / self.recent.len() as f64);
        if self.reference.is_none() {
            self.reference = average;
        }
        let trigger = if self.triggers.every_rounds > 0 && self.rounds_since >= self.triggers.every_rounds {
            Some(Trigger::Timer)
        } else if let (Some(now), Some(then)) = (average, self.reference)
            && self.triggers.on_change > 0.0
            && then > 0.0
            && ((now - then) / then).abs() >= self.triggers.on_change
        {
            Some(Trigger::Change)
        } else {
            None
        };
        if trigger.is_some() {
            self.rounds_since = 0;
            self.reference = average;
        }
        trigger
    }
}

/// Runs selections by themselves as `triggers` say, until the run ends; each is logged, and applied when
/// `triggers.apply`. A selection learns from what is collected, so once one has narrowed collection, the next a
/// timer or a change asks for first widens it again (each narrowed application back to its options), then learns
/// from the `triggers.rounds` rounds after.
pub fn spawn(shared: Arc<State>, root: RootHandle, store: std::path::PathBuf, triggers: Triggers) {
    let mut results = shared.live.subscribe();
    tokio::spawn(async move {
        let mut watch = Watch::new(triggers);
        // The applications the last applied selection narrowed.
        let mut narrowed_apps: Vec<String> = Vec::new();
        // Rounds of the latency stream until the selection after a widening.
        let mut relearn: Option<u64> = None;
        loop {
            let result = match results.recv().await {
                Ok(r) => r,
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            };
            if result.stream.filter != "latency" || result.late {
                continue;
            }
            let Ok(r) = LatencyResult::decode(result.payload.as_ref()) else {
                continue;
            };
            let latencies: Vec<f64> = r.steps.iter().map(|s| s.latency_ns as f64 / 1e6).collect();
            let asked = watch.round(&latencies);
            let due = match relearn.as_mut() {
                Some(left) => {
                    *left = left.saturating_sub(1);
                    (*left == 0).then_some(Trigger::Relearn)
                }
                None => asked,
            };
            let Some(trigger) = due else {
                continue;
            };
            if trigger == Trigger::Relearn {
                relearn = None;
            } else if !narrowed_apps.is_empty() {
                let widened: Vec<AppOptions> = narrowed_apps
                    .drain(..)
                    .map(|app| AppOptions {
                        app,
                        ..AppOptions::default()
                    })
                    .collect();
                match apply(&shared, &root, &widened).await {
                    Ok(()) => tracing::info!(
                        trigger = ?trigger,
                        rounds = triggers.rounds,
                        "metric selection: collection widened to learn again"
                    ),
                    Err(e) => tracing::warn!("metric selection ({trigger:?}): collection not widened: {e}"),
                }
                relearn = Some(u64::from(triggers.rounds));
                continue;
            }
            let req = SelectMetricsRequest {
                latency_stream: result.stream.name.clone(),
                rounds: triggers.rounds,
                apply: triggers.apply,
                ..SelectMetricsRequest::default()
            };
            let path = store.clone();
            let chosen = tokio::task::spawn_blocking(move || {
                let reader = StoreReader::open(&path)?;
                select(&training(&reader, &req)?)
            })
            .await;
            match chosen {
                Ok(Ok(mut response)) => {
                    if triggers.apply {
                        response.applied = narrowed(&response.ranking);
                        match apply(&shared, &root, &response.applied).await {
                            Ok(()) => {
                                narrowed_apps = response.applied.iter().map(|a| a.app.clone()).collect()
                            }
                            Err(e) => tracing::warn!("metric selection ({trigger:?}) not applied: {e}"),
                        }
                    }
                    tracing::info!(
                        trigger = ?trigger,
                        chosen = %chosen_labels(&response),
                        observations = response.observations,
                        error_selected = response.error_selected,
                        error_all = response.error_all,
                        applied = triggers.apply,
                        "metric selection"
                    );
                }
                Ok(Err(e)) => tracing::warn!("metric selection ({trigger:?}) failed: {e}"),
                Err(e) => tracing::warn!("metric selection ({trigger:?}) did not finish: {e}"),
            }
        }
    });
}

/// The chosen candidates as `app: event metric`, comma-separated.
pub fn chosen_labels(r: &SelectMetricsResponse) -> String {
    r.ranking
        .iter()
        .filter(|c| c.selected)
        .map(|c| format!("{}: {} {}", c.app, c.event, c.metric))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(app: &str, event: &str, metric: &str, selected: bool) -> CandidateMetric {
        CandidateMetric {
            app: app.into(),
            event: event.into(),
            metric: metric.into(),
            selected,
            ..CandidateMetric::default()
        }
    }

    #[test]
    fn each_application_reports_only_its_chosen_events_and_one_with_none_reports_none() {
        let apps = narrowed(&[
            candidate("csym", "csym_compute_send", "exclusive", true),
            candidate("csym", "csym_read_input", "inclusive", true),
            candidate("csym", "MPI_Bcast", "exclusive", false),
            candidate("bonds", "bonds_read_input", "exclusive", true),
            candidate("bonds", "bytes_sent", "counter", true),
            candidate("lammps", "Pair::compute", "exclusive", false),
            candidate("lammps", "a.b(c)", "calls", false),
        ]);
        let by: BTreeMap<&str, &AppOptions> = apps.iter().map(|a| (a.app.as_str(), a)).collect();
        assert_eq!(by.len(), 3);
        assert_eq!(by["csym"].include, ["^(?:csym_compute_send|csym_read_input)$"]);
        assert_eq!(by["csym"].metrics, ["exclusive", "inclusive"]);
        assert_eq!(by["bonds"].include, ["^(?:bonds_read_input|bytes_sent)$"]);
        assert_eq!(by["bonds"].metrics, ["counters", "exclusive"]);
        assert_eq!(by["lammps"].include, ["^$"]);
        assert!(by["lammps"].metrics.is_empty());
        // The patterns are valid options that select exactly the names.
        let options = canopy_proto::v1::Options {
            apps: apps.clone(),
            ..Default::default()
        };
        let m = canopy_core::options::Measure::from_options(&options).unwrap();
        assert!(m.for_app("csym").reports("csym_read_input"));
        assert!(!m.for_app("csym").reports("MPI_Bcast"));
        assert!(!m.for_app("lammps").reports("Pair::compute"));
        // A name with regex syntax is matched literally.
        let odd = narrowed(&[candidate("x", "a.b(c)", "calls", true)]);
        let m = canopy_core::options::Measure::from_options(&canopy_proto::v1::Options {
            apps: odd,
            ..Default::default()
        })
        .unwrap();
        assert!(m.for_app("x").reports("a.b(c)"));
        assert!(!m.for_app("x").reports("aXb(c)"));
    }

    #[test]
    fn an_events_equal_metrics_are_one_candidate_and_each_driver_is_chosen_once() {
        use canopy_proto::filters::v1::Metric;
        // Two drivers, each reported as inclusive and exclusive time (equal, as for a leaf region), and noise.
        let mut state = 7u64;
        let mut draw = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let rounds = 60;
        let a: Vec<f64> = (0..rounds).map(|_| draw()).collect();
        let b: Vec<f64> = (0..rounds).map(|_| draw()).collect();
        let noise: Vec<f64> = (0..rounds).map(|_| draw()).collect();
        let candidate = |app: &str, name: &str, id: u64, metric: Metric| Candidate {
            app: app.into(),
            name: name.into(),
            id,
            metric,
        };
        let t = Training {
            rounds: (0..rounds as u64).collect(),
            latency_ms: (0..rounds).map(|i| a[i] + b[i] + 0.05 * noise[i]).collect(),
            candidates: vec![
                candidate("x", "a", 1, Metric::Inclusive),
                candidate("x", "a", 1, Metric::Exclusive),
                candidate("y", "b", 2, Metric::Inclusive),
                candidate("y", "b", 2, Metric::Exclusive),
                candidate("y", "other", 3, Metric::Exclusive),
            ],
            columns: vec![a.clone(), a, b.clone(), b, (0..rounds).map(|_| draw()).collect()],
            ..Training::default()
        };
        let r = select(&t).unwrap();
        assert_eq!(r.ranking.len(), 5, "every candidate is ranked");
        let chosen: Vec<(&str, &str)> = r
            .ranking
            .iter()
            .filter(|c| c.selected)
            .map(|c| (c.app.as_str(), c.event.as_str()))
            .collect();
        assert_eq!(chosen.len(), 2, "{chosen:?}");
        assert!(
            chosen.contains(&("x", "a")) && chosen.contains(&("y", "b")),
            "{chosen:?}"
        );
        assert!(r.error_selected < 0.2, "{r:?}");
    }

    #[test]
    fn the_timer_fires_every_n_rounds_and_the_change_trigger_when_the_average_moves_by_the_fraction() {
        let mut w = Watch::new(Triggers {
            every_rounds: 5,
            on_change: 0.0,
            apply: false,
            rounds: 100,
        });
        let fired: Vec<u64> = (1..=12).filter(|_| w.round(&[10.0]).is_some()).collect();
        assert_eq!(fired, [5, 10]);

        let mut w = Watch::new(Triggers {
            every_rounds: 0,
            on_change: 0.5,
            apply: false,
            rounds: 100,
        });
        // Ten rounds at 10 ms set the reference; a rise to 14 ms (+40%) is not enough...
        for _ in 0..10 {
            assert_eq!(w.round(&[10.0]), None);
        }
        for _ in 0..10 {
            assert_eq!(w.round(&[14.0]), None);
        }
        // ...one to 16 ms (+60%) is, once the moving average gets there, and only once.
        let fired: Vec<usize> = (1..=20).filter(|_| w.round(&[16.0]).is_some()).collect();
        assert_eq!(fired.len(), 1, "{fired:?}");
        // Rounds without a completed step leave the average as it was.
        assert_eq!(w.round(&[]), None);
    }
}
