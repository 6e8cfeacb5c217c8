//! The leaf's part: each rank's marks folded into the packet's steps. A rank with no marks costs one check.

use std::collections::BTreeMap;

use canopy_filter_common::stream::{Buffers, EventView, ProfileView};
use canopy_filter_proto::v1::{LatencyApp, LatencyPacket, LatencyStep};

use crate::packet::{StepKey, merge_step};
use crate::settings::Transfer;

/// A rank's exclusive time of the round in nanoseconds, split into (transfer, compute). Each part is summed
/// over the rank's events in their order and rounded to the nanosecond once, so what the tree adds up are
/// integers.
pub fn split(events: &[EventView], transfer: &Transfer) -> (u64, u64) {
    let (mut t, mut c) = (0.0f64, 0.0f64);
    for e in events {
        let us = if e.excl_us.is_finite() {
            e.excl_us.max(0.0)
        } else {
            0.0
        };
        if transfer.is_transfer(e.id) {
            t += us;
        } else {
            c += us;
        }
    }
    // `as` saturates: a huge sum stays u64::MAX, not a wrapped value.
    ((t * 1000.0).round() as u64, (c * 1000.0).round() as u64)
}

/// Folds the marks of `profiles` (views into `buffers`) into `out`, rows sorted by (key, step).
pub fn fold(
    profiles: &[ProfileView<'_>],
    buffers: &Buffers,
    transfer: &Transfer,
    raw_bytes: u64,
    out: &mut LatencyPacket,
) {
    let mut steps: BTreeMap<StepKey, LatencyStep> = BTreeMap::new();
    let mut lost = 0u64;
    for p in profiles {
        lost = lost.saturating_add(p.marks_lost);
        if p.marks.is_empty() {
            continue;
        }
        let marks = &buffers.marks[p.marks.clone()];
        let (transfer_ns, compute_ns) = split(&buffers.events[p.events.clone()], transfer);
        // This rank's part of each step it marked: its marks as a step of its own, then merged.
        let mut mine: BTreeMap<StepKey, LatencyStep> = BTreeMap::new();
        for m in marks {
            let s = mine.entry((m.key_id, m.step)).or_insert_with(|| LatencyStep {
                key_id: m.key_id,
                step: m.step,
                apps: vec![LatencyApp {
                    app: p.app.to_string(),
                    ranks: 1,
                    transfer_ns,
                    compute_ns,
                }],
                ..Default::default()
            });
            let one = if m.stop {
                LatencyStep {
                    stops: 1,
                    stop_unix_ns: m.unix_ns,
                    stop_app: p.app.to_string(),
                    stop_rank: p.rank,
                    ..Default::default()
                }
            } else {
                LatencyStep {
                    starts: 1,
                    start_unix_ns: m.unix_ns,
                    start_app: p.app.to_string(),
                    start_rank: p.rank,
                    ..Default::default()
                }
            };
            merge_step(s, &one);
        }
        for (k, s) in mine {
            match steps.get_mut(&k) {
                Some(into) => merge_step(into, &s),
                None => {
                    steps.insert(k, s);
                }
            }
        }
    }
    out.steps.clear();
    out.steps.extend(steps.into_values());
    out.lost = lost;
    out.raw_bytes = raw_bytes;
}
