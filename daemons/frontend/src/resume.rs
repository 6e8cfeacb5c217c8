//! A front-end started again on the same `out` after its predecessor died (a crash, a kill) continues that run:
//! the same store, the same stream ids, and no round stored twice. A run its front-end ended (at the
//! application's end, or drained on a signal) is never continued: the next front-end starts a new one.
//!
//! The stream table is planned from what the store holds and what the front-end is configured with:
//! - a configured stream the earlier run also opened from its configuration, with the same filter, name and
//!   parameters, keeps its id;
//! - one opened through the API (`CreateStream`) and still open is opened again under its id;
//! - a configured stream that is new gets an id above every id the run ever used;
//! - one the earlier configuration opened and this one no longer names is closed.
//!
//! Ids are never reused within a run, so no child ever feeds an old stream's packets to another filter under
//! the same id. The store's `meta` keeps what changed at each restart (`restart_1`, `restart_2`, ...).

use std::path::{Path, PathBuf};

use canopy_proto::v1::StreamSpec;
use canopy_store::{LATEST, Store, StoreError, StoreReader, StreamRow, StreamState};

/// `meta` key: the ids of the streams the run opened from its configuration, comma-separated.
pub const CONFIG_STREAMS: &str = "config_streams";
/// `meta` key: how many times the run was continued.
pub const RESTARTS: &str = "restarts";
/// `meta` key: the run's id, which every node of its tree carries.
pub const RUN_ID: &str = "run_id";

/// What an earlier front-end left of a run it did not end.
#[derive(Debug, Clone)]
pub struct Unfinished {
    pub path: PathBuf,
    pub streams: Vec<StreamRow>,
    /// Per stream, the highest round stored.
    pub last_rounds: Vec<(u32, u64)>,
    /// The streams it opened from its configuration.
    pub config_streams: Vec<u32>,
    pub restarts: u32,
    /// The ranks its last stored round expected: the restarted root waits for them to come back.
    pub expected_ranks: u32,
    /// The run's id (none in a store of a Canopy before run ids).
    pub run_id: Option<String>,
}

/// The run's store and id: the unfinished run's (`prior`) continued, or a new run's created under `out`.
pub fn open_store(out: &Path, prior: Option<&Unfinished>) -> Result<(Store, String), StoreError> {
    let mut store = match prior {
        Some(run) => {
            tracing::info!(store = %run.path.display(), "continuing the run an earlier front-end did not end");
            Store::open(&run.path)?
        }
        None => Store::create(out)?,
    };
    let run_id = match prior.and_then(|p| p.run_id.clone()) {
        Some(id) => id,
        None => {
            let id = canopy_core::run::new_run_id();
            store.set_meta(RUN_ID, &id)?;
            id
        }
    };
    Ok((store, run_id))
}

/// Writes the stream plan into the store: the streams opened from the configuration and, continuing a run,
/// the ones it closes and what changed at this restart.
pub fn record(store: &mut Store, plan: &StreamPlan, prior: Option<&Unfinished>) -> Result<(), StoreError> {
    let ids: Vec<String> = plan.config_ids.iter().map(u32::to_string).collect();
    store.set_meta(CONFIG_STREAMS, &ids.join(","))?;
    if let Some(prior) = prior {
        for spec in &plan.close {
            store.put_stream(spec, StreamState::Closed, None, None)?;
        }
        let n = prior.restarts + 1;
        store.set_meta(RESTARTS, &n.to_string())?;
        store.set_meta(&format!("restart_{n}"), &plan.changes.join("; "))?;
        tracing::info!(restart = n, "streams: {}", plan.changes.join("; "));
    }
    Ok(())
}

/// The latest run under `out`, if its front-end did not end it and wrote it less than `within` ago: a run
/// silent for longer has no tree left to continue it (its nodes keep what they sent for 5 minutes), and a tree
/// started now is a new one.
pub fn unfinished_run(out: &Path, within: std::time::Duration) -> Result<Option<Unfinished>, StoreError> {
    let latest = out.join(LATEST);
    let Ok(path) = std::fs::canonicalize(&latest) else {
        return Ok(None);
    };
    let reader = StoreReader::open(&path)?;
    // Ended (`Store::end_run`): a front-end started later begins a new run.
    if reader.meta(canopy_store::ENDED)?.is_some() {
        return Ok(None);
    }
    if let Some(silent) = silent_for(&path)
        && silent > within
    {
        tracing::warn!(
            store = %path.display(),
            silent_s = silent.as_secs(),
            within_s = within.as_secs(),
            "the unfinished run here was last written longer ago than resume_within_s: starting a new run (the \
             old one's nodes, if any are left, are refused)"
        );
        return Ok(None);
    }
    let config_streams = reader
        .meta(CONFIG_STREAMS)?
        .unwrap_or_default()
        .split(',')
        .filter_map(|id| id.trim().parse().ok())
        .collect();
    let restarts = reader.meta(RESTARTS)?.and_then(|n| n.parse().ok()).unwrap_or(0);
    let last_rounds = reader.last_rounds()?;
    let mut expected_ranks = 0;
    for (stream, round) in &last_rounds {
        let select = canopy_store::Select::all().stream(*stream).from_round(*round);
        for r in reader.rounds(select)? {
            expected_ranks = expected_ranks.max(r.expected);
        }
    }
    Ok(Some(Unfinished {
        run_id: reader.meta(RUN_ID)?,
        streams: reader.streams()?,
        expected_ranks,
        last_rounds,
        config_streams,
        restarts,
        path,
    }))
}

/// How long ago the store at `path` was last written (its file or its write-ahead log), if it can be told.
fn silent_for(path: &Path) -> Option<std::time::Duration> {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let written = [path.to_path_buf(), PathBuf::from(wal)]
        .iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max()?;
    std::time::SystemTime::now().duration_since(written).ok()
}

/// The streams a front-end opens at start, and what a continued run's store must be told.
#[derive(Debug, Default, PartialEq)]
pub struct StreamPlan {
    /// Opened at start, each with its id.
    pub open: Vec<StreamSpec>,
    /// Streams of the earlier run that end now.
    pub close: Vec<StreamSpec>,
    /// Per continued stream, the round below which the store holds its rounds already.
    pub closed_below: Vec<(u32, u64)>,
    /// The ids of the streams opened from the configuration.
    pub config_ids: Vec<u32>,
    /// What changed, one phrase per stream (empty for a new run).
    pub changes: Vec<String>,
}

/// Plans the stream table: `configured` are the configuration's streams (ids unset), `prior` the run being
/// continued, if any.
pub fn plan(configured: Vec<StreamSpec>, prior: Option<&Unfinished>) -> StreamPlan {
    let Some(prior) = prior else {
        let open: Vec<StreamSpec> = configured
            .into_iter()
            .zip(1..)
            .map(|(spec, id)| StreamSpec {
                stream_id: id,
                ..spec
            })
            .collect();
        return StreamPlan {
            config_ids: open.iter().map(|s| s.stream_id).collect(),
            open,
            ..Default::default()
        };
    };
    let mut next_id = prior.streams.iter().map(|s| s.stream_id).max().unwrap_or(0) + 1;
    let was_open: Vec<StreamSpec> = prior
        .streams
        .iter()
        .filter(|s| s.state == Some(StreamState::Open))
        .map(spec_of)
        .collect();
    let mut plan = StreamPlan::default();
    let mut kept: Vec<u32> = Vec::new();
    for spec in configured {
        let same = was_open.iter().find(|old| {
            prior.config_streams.contains(&old.stream_id)
                && !kept.contains(&old.stream_id)
                && old.filter == spec.filter
                && old.name == spec.name
                && old.params == spec.params
                && old.sync_mode == spec.sync_mode
                && old.timeout_ms == spec.timeout_ms
                && old.ranks == spec.ranks
        });
        let spec = match same {
            Some(old) => {
                kept.push(old.stream_id);
                plan.changes
                    .push(format!("kept {} ({})", old.name, old.stream_id));
                old.clone()
            }
            None => {
                let id = next_id;
                next_id += 1;
                plan.changes.push(format!("opened {} ({id})", spec.name));
                StreamSpec {
                    stream_id: id,
                    ..spec
                }
            }
        };
        plan.config_ids.push(spec.stream_id);
        plan.open.push(spec);
    }
    for old in was_open {
        if kept.contains(&old.stream_id) {
            continue;
        }
        if prior.config_streams.contains(&old.stream_id) {
            plan.changes
                .push(format!("closed {} ({})", old.name, old.stream_id));
            plan.close.push(old);
        } else {
            plan.changes.push(format!(
                "reopened {} ({}), opened through the API",
                old.name, old.stream_id
            ));
            plan.open.push(old);
        }
    }
    plan.closed_below = prior
        .last_rounds
        .iter()
        .filter(|(id, _)| plan.open.iter().any(|s| s.stream_id == *id))
        .map(|(id, round)| (*id, round + 1))
        .collect();
    plan
}

fn spec_of(row: &StreamRow) -> StreamSpec {
    StreamSpec {
        stream_id: row.stream_id,
        name: row.name.clone(),
        filter: row.filter.clone(),
        params: row.params.clone(),
        ranks: row.ranks.clone(),
        sync_mode: row.sync_mode as i32,
        timeout_ms: row.timeout_ms,
        // The latest stages only, as the root keeps them.
        stages: row
            .stages
            .iter()
            .skip(row.stages.len().saturating_sub(canopy_core::node::MAX_STAGES))
            .map(|(from_round, ranks)| canopy_proto::v1::RankStage {
                from_round: *from_round,
                ranks: ranks.clone(),
            })
            .collect(),
        // The root sets it again.
        first_round: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::v1::SyncMode;

    fn spec(name: &str) -> StreamSpec {
        StreamSpec {
            name: name.into(),
            filter: name.into(),
            sync_mode: SyncMode::WaitForAll as i32,
            timeout_ms: 1000,
            ..Default::default()
        }
    }

    fn row(id: u32, name: &str, state: StreamState) -> StreamRow {
        let s = spec(name);
        StreamRow {
            stream_id: id,
            name: s.name,
            filter: s.filter,
            params: s.params,
            sync_mode: SyncMode::WaitForAll,
            timeout_ms: s.timeout_ms,
            state: Some(state),
            failure: None,
            result_type: None,
            ranks: String::new(),
            stages: Vec::new(),
            opened_unix_ns: None,
            closed_unix_ns: None,
            rounds: 0,
            full_rounds: 0,
            late_packets: 0,
            last_round: None,
        }
    }

    #[test]
    fn a_new_run_numbers_its_streams_from_one() {
        let plan = plan(vec![spec("stats"), spec("histogram")], None);
        let ids: Vec<u32> = plan.open.iter().map(|s| s.stream_id).collect();
        assert_eq!(ids, [1, 2]);
        assert_eq!(plan.config_ids, [1, 2]);
        assert!(plan.close.is_empty() && plan.closed_below.is_empty());
    }

    #[test]
    fn a_continued_run_keeps_ids_never_reuses_one_and_says_what_changed() {
        let prior = Unfinished {
            path: PathBuf::new(),
            streams: vec![
                row(1, "stats", StreamState::Open),
                row(2, "histogram", StreamState::Open),
                row(3, "passthrough", StreamState::Closed),
                row(4, "classify", StreamState::Open),
            ],
            last_rounds: vec![(1, 41), (2, 40), (4, 39)],
            // Stream 4 was opened through the API.
            config_streams: vec![1, 2],
            restarts: 0,
            expected_ranks: 0,
            run_id: None,
        };
        // Restarted with stats and passthrough: stats keeps 1, histogram closes, passthrough is new (5, not 3),
        // classify comes back under 4.
        let plan = plan(vec![spec("stats"), spec("passthrough")], Some(&prior));
        let open: Vec<(u32, &str)> = plan.open.iter().map(|s| (s.stream_id, s.name.as_str())).collect();
        assert_eq!(open, [(1, "stats"), (5, "passthrough"), (4, "classify")]);
        assert_eq!(plan.close.iter().map(|s| s.stream_id).collect::<Vec<_>>(), [2]);
        assert_eq!(plan.config_ids, [1, 5]);
        assert_eq!(plan.closed_below, [(1, 42), (4, 40)]);
        assert_eq!(
            plan.changes,
            [
                "kept stats (1)",
                "opened passthrough (5)",
                "closed histogram (2)",
                "reopened classify (4), opened through the API"
            ]
        );
    }

    #[test]
    fn other_parameters_make_another_stream() {
        let prior = Unfinished {
            path: PathBuf::new(),
            streams: vec![row(1, "stats", StreamState::Open)],
            last_rounds: vec![(1, 9)],
            config_streams: vec![1],
            restarts: 0,
            expected_ranks: 0,
            run_id: None,
        };
        let changed = StreamSpec {
            params: r#"{"top": 3}"#.into(),
            ..spec("stats")
        };
        let plan = plan(vec![changed], Some(&prior));
        assert_eq!(plan.open[0].stream_id, 2);
        assert_eq!(plan.close[0].stream_id, 1);
        assert!(plan.closed_below.is_empty());
    }
}
