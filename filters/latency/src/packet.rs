//! The latency packet: steps keyed by (key, step), merged by minimum (earliest start), maximum (latest stop)
//! and sums, so any grouping of the same marks gives the same packet. Checked before use: a relay refuses a
//! packet that breaks the invariants below, naming the row and what is wrong.

use std::collections::BTreeMap;

use canopy_filter_proto::v1::{LatencyApp, LatencyPacket, LatencyStep};

/// The step a packet row is: (key id, step).
pub type StepKey = (u64, u64);

pub fn key(s: &LatencyStep) -> StepKey {
    (s.key_id, s.step)
}

/// Merges `from` into `into` (the same step): the earlier start and the later stop (ties broken by
/// application, then rank), counts and per-application sums added.
pub fn merge_step(into: &mut LatencyStep, from: &LatencyStep) {
    if from.starts > 0 {
        let theirs = (from.start_unix_ns, from.start_app.as_str(), from.start_rank);
        if into.starts == 0 || theirs < (into.start_unix_ns, into.start_app.as_str(), into.start_rank) {
            into.start_unix_ns = from.start_unix_ns;
            into.start_app.clone_from(&from.start_app);
            into.start_rank = from.start_rank;
        }
        into.starts = into.starts.saturating_add(from.starts);
    }
    if from.stops > 0 {
        let theirs = (from.stop_unix_ns, from.stop_app.as_str(), from.stop_rank);
        if into.stops == 0 || theirs > (into.stop_unix_ns, into.stop_app.as_str(), into.stop_rank) {
            into.stop_unix_ns = from.stop_unix_ns;
            into.stop_app.clone_from(&from.stop_app);
            into.stop_rank = from.stop_rank;
        }
        into.stops = into.stops.saturating_add(from.stops);
    }
    for app in &from.apps {
        match into.apps.binary_search_by(|a| a.app.cmp(&app.app)) {
            Ok(i) => add_app(&mut into.apps[i], app),
            Err(i) => into.apps.insert(i, app.clone()),
        }
    }
}

pub fn add_app(into: &mut LatencyApp, from: &LatencyApp) {
    into.ranks = into.ranks.saturating_add(from.ranks);
    into.transfer_ns = into.transfer_ns.saturating_add(from.transfer_ns);
    into.compute_ns = into.compute_ns.saturating_add(from.compute_ns);
}

/// Merges packets into one, rows sorted by (key, step).
pub fn merge<'a>(packets: impl IntoIterator<Item = &'a LatencyPacket>, out: &mut LatencyPacket) {
    let mut steps: BTreeMap<StepKey, LatencyStep> = BTreeMap::new();
    let (mut lost, mut raw_bytes) = (0u64, 0u64);
    for p in packets {
        lost = lost.saturating_add(p.lost);
        raw_bytes = raw_bytes.saturating_add(p.raw_bytes);
        for s in &p.steps {
            match steps.get_mut(&key(s)) {
                Some(into) => merge_step(into, s),
                None => {
                    steps.insert(key(s), s.clone());
                }
            }
        }
    }
    out.steps.clear();
    out.steps.extend(steps.into_values());
    out.lost = lost;
    out.raw_bytes = raw_bytes;
}

/// Whether a decoded packet holds to the invariants merging relies on: rows strictly increasing by (key,
/// step), each with a start or a stop, an end's fields set only when it has marks, and its applications
/// strictly increasing by name, each with at least one rank.
pub fn check(p: &LatencyPacket) -> Result<(), String> {
    let mut previous: Option<StepKey> = None;
    for (i, s) in p.steps.iter().enumerate() {
        let k = key(s);
        if previous.is_some_and(|prev| prev >= k) {
            return Err(format!(
                "row {i}: step ({:016x}, {}) does not follow the previous row's (rows are sorted by key and step, each once)",
                s.key_id, s.step
            ));
        }
        previous = Some(k);
        if s.starts == 0 && s.stops == 0 {
            return Err(format!("row {i}: a step with neither a start nor a stop mark"));
        }
        if s.starts == 0 && (s.start_unix_ns != 0 || !s.start_app.is_empty() || s.start_rank != 0) {
            return Err(format!(
                "row {i}: a start time, application or rank without start marks"
            ));
        }
        if s.stops == 0 && (s.stop_unix_ns != 0 || !s.stop_app.is_empty() || s.stop_rank != 0) {
            return Err(format!(
                "row {i}: a stop time, application or rank without stop marks"
            ));
        }
        for (j, a) in s.apps.iter().enumerate() {
            if j > 0 && s.apps[j - 1].app >= a.app {
                return Err(format!(
                    "row {i}: application {:?} does not follow {:?} (applications are sorted, each once)",
                    a.app,
                    s.apps[j - 1].app
                ));
            }
            if a.ranks == 0 {
                return Err(format!("row {i}: application {:?} with no ranks", a.app));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(key_id: u64, step: u64) -> LatencyStep {
        LatencyStep {
            key_id,
            step,
            starts: 1,
            start_unix_ns: 10,
            start_app: "sim".into(),
            ..Default::default()
        }
    }

    #[test]
    fn checks_name_the_row_and_the_fault() {
        let good = LatencyPacket {
            steps: vec![step(1, 1), step(1, 2)],
            ..Default::default()
        };
        assert_eq!(check(&good), Ok(()));
        let mut p = good.clone();
        p.steps.swap(0, 1);
        assert!(
            check(&p)
                .unwrap_err()
                .starts_with("row 1: step (0000000000000001, 1) does not follow")
        );
        let mut p = good.clone();
        p.steps[1].step = 1;
        assert!(check(&p).unwrap_err().starts_with("row 1:"));
        let mut p = good.clone();
        p.steps[0].starts = 0;
        assert_eq!(
            check(&p).unwrap_err(),
            "row 0: a step with neither a start nor a stop mark"
        );
        p.steps[0].stops = 1;
        assert_eq!(
            check(&p).unwrap_err(),
            "row 0: a start time, application or rank without start marks"
        );
        let mut p = good.clone();
        p.steps[1].stop_rank = 4;
        assert_eq!(
            check(&p).unwrap_err(),
            "row 1: a stop time, application or rank without stop marks"
        );
        let mut p = good.clone();
        let app = |name: &str, ranks| LatencyApp {
            app: name.into(),
            ranks,
            ..Default::default()
        };
        p.steps[0].apps = vec![app("sim", 1), app("ana", 1)];
        assert_eq!(
            check(&p).unwrap_err(),
            "row 0: application \"ana\" does not follow \"sim\" (applications are sorted, each once)"
        );
        p.steps[0].apps = vec![app("ana", 0)];
        assert_eq!(check(&p).unwrap_err(), "row 0: application \"ana\" with no ranks");
    }

    #[test]
    fn merging_keeps_the_earliest_start_and_the_latest_stop() {
        let mut a = step(1, 1);
        a.start_unix_ns = 50;
        let mut b = step(1, 1);
        b.start_unix_ns = 40;
        b.start_app = "zz".into();
        b.stops = 2;
        b.stop_unix_ns = 90;
        b.stop_app = "ana".into();
        let mut out = LatencyPacket::default();
        let pa = LatencyPacket {
            steps: vec![a],
            lost: 1,
            raw_bytes: 5,
        };
        let pb = LatencyPacket {
            steps: vec![b],
            lost: 2,
            raw_bytes: 7,
        };
        merge([&pa, &pb], &mut out);
        let s = &out.steps[0];
        assert_eq!((s.starts, s.start_unix_ns, s.start_app.as_str()), (2, 40, "zz"));
        assert_eq!((s.stops, s.stop_unix_ns, s.stop_app.as_str()), (2, 90, "ana"));
        assert_eq!((out.lost, out.raw_bytes), (3, 12));
        let mut again = LatencyPacket::default();
        merge([&pb, &pa], &mut again);
        assert_eq!(again, out);
    }
}
