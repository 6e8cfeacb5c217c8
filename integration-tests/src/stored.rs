//! What tests read back from a run's store beyond its typed rows: utilization profiles, the calls and counters
//! stored for named events.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use crate::*;

/// A rank's utilization profile of one round, as stored.
pub struct UtilizationProfile {
    pub rank: u32,
    /// Its bins (each 250 shares whole).
    pub bins: usize,
    /// (bin, activity name, share).
    pub records: Vec<(usize, String, u32)>,
}

/// Every utilization profile the passthrough stream stored, each checked whole.
pub fn stored_utilization(store: &Path) -> Vec<UtilizationProfile> {
    let stored = reader(store);
    let names: HashMap<u64, String> = stored.names().unwrap().into_iter().collect();
    let passthrough = stored
        .stream_named("passthrough")
        .unwrap()
        .expect("a passthrough stream");
    let mut out = Vec::new();
    for round in stored
        .rounds(Select::all().stream(passthrough.stream_id))
        .unwrap()
    {
        let Some(bytes) = stored.profile_batch(passthrough.stream_id, round.round).unwrap() else {
            continue;
        };
        let batch = <canopy_wire::v1::ProfileBatch as prost::Message>::decode(bytes.as_slice()).unwrap();
        for p in &batch.profiles {
            let Some(u) = &p.utilization else { continue };
            canopy_wire::utilization::check(u).unwrap();
            let records = canopy_wire::utilization::records(u)
                .map(|(bin, id, share)| {
                    let name = names.get(&id).cloned().unwrap_or_else(|| "other".into());
                    (bin, name, share)
                })
                .collect();
            out.push(UtilizationProfile {
                rank: p.rank,
                bins: u.counts.len(),
                records,
            });
        }
    }
    out
}

/// Waits until the agent's Unix socket accepts connections; panics with the agent's log if it exits first.
pub fn wait_socket(path: &Path, agent: &mut Proc) {
    wait_for("the agent's socket", Duration::from_secs(20), || {
        if let Ok(Some(status)) = agent.child.try_wait() {
            panic!("agent exited with {status}:\n{}", agent.log_text());
        }
        // The file appears at bind(), a moment before the agent listens: connect to be sure. (A connection with
        // no hello is closed quietly.)
        path.exists() && std::os::unix::net::UnixStream::connect(path).is_ok()
    });
}

/// The ids the store's dictionary gives a name.
pub fn ids_named(store: &Path, name: &str) -> std::collections::HashSet<u64> {
    reader(store)
        .names()
        .unwrap()
        .into_iter()
        .filter(|(_, n)| n == name)
        .map(|(id, _)| id)
        .collect()
}

/// Per rank, the calls of the event `name` stored over all rounds (the sum of every round's calls, checked
/// against the last running total).
pub fn stored_calls(store: &Path, name: &str) -> std::collections::BTreeMap<u32, u64> {
    let stored = reader(store);
    let ids = ids_named(store, name);
    let mut per_rank: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
    for s in stored.samples(Select::all()).unwrap() {
        if ids.contains(&s.event_id) {
            let row = per_rank.entry(s.rank).or_default();
            row.0 += s.calls.unwrap_or(0);
            row.1 = row.1.max(s.calls_total.unwrap_or(0));
        }
    }
    per_rank
        .into_iter()
        .map(|(rank, (sum, total))| {
            assert_eq!(
                sum, total,
                "{name}, rank {rank}: the rounds' calls add up to the running total"
            );
            (rank, sum)
        })
        .collect()
}

/// Per rank, the last total of the counter `name`.
pub fn stored_counter(store: &Path, name: &str) -> std::collections::BTreeMap<u32, f64> {
    let stored = reader(store);
    let ids: std::collections::HashSet<u64> = stored
        .names()
        .unwrap()
        .into_iter()
        .filter(|(_, n)| n == name)
        .map(|(id, _)| id)
        .collect();
    let mut last: std::collections::BTreeMap<u32, (u64, f64)> = std::collections::BTreeMap::new();
    for c in stored.counters(Select::all()).unwrap() {
        if ids.contains(&c.counter_id) {
            let row = last.entry(c.rank).or_insert((0, 0.0));
            if c.round >= row.0 {
                *row = (c.round, c.total.unwrap_or(0.0));
            }
        }
    }
    last.into_iter().map(|(rank, (_, total))| (rank, total)).collect()
}
