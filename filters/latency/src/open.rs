//! The root's steps across rounds: a step known by its start alone (or its stop alone) waits here until the
//! other end comes in a later round; then it is complete and goes into that round's result. At most
//! `max_open` steps wait; beyond it the one opened first is let go and counted.

use std::collections::{BTreeMap, HashMap};

use canopy_filter_proto::v1::{LatencyPacket, LatencyResult, LatencyStep, StepApp, StepLatency};

use crate::packet::{StepKey, key, merge_step};

#[derive(Debug)]
pub struct Open {
    max: usize,
    /// The waiting steps, and when each was opened (a counter).
    steps: HashMap<StepKey, (u64, LatencyStep)>,
    /// The waiting steps by when they were opened: the oldest is evicted first.
    order: BTreeMap<u64, StepKey>,
    next: u64,
    evicted: u64,
}

impl Open {
    pub fn new(max: usize) -> Open {
        Open {
            max: max.max(1),
            steps: HashMap::new(),
            order: BTreeMap::new(),
            next: 0,
            evicted: 0,
        }
    }

    /// Takes in one round's root packet: the steps it completes (with what earlier rounds knew of them) make
    /// the result, sorted by (key, step); the others wait. A completed step is forgotten: marks of it that
    /// come later open it again.
    pub fn round(&mut self, packet: &LatencyPacket) -> LatencyResult {
        let mut done = Vec::new();
        for s in &packet.steps {
            let k = key(s);
            let mut step = match self.steps.remove(&k) {
                Some((opened, mut earlier)) => {
                    self.order.remove(&opened);
                    merge_step(&mut earlier, s);
                    earlier
                }
                None => s.clone(),
            };
            if step.starts > 0 && step.stops > 0 {
                done.push(result_of(&mut step));
            } else {
                let opened = self.next;
                self.next += 1;
                self.order.insert(opened, k);
                self.steps.insert(k, (opened, step));
            }
        }
        while self.steps.len() > self.max {
            let Some((_, k)) = self.order.pop_first() else {
                break;
            };
            self.steps.remove(&k);
            self.evicted += 1;
        }
        LatencyResult {
            steps: done,
            open: self.steps.len() as u32,
            evicted: self.evicted,
            lost: packet.lost,
            raw_bytes: packet.raw_bytes,
        }
    }
}

/// A complete step's row: its latency, its ends, and per application the mean time per rank dump.
fn result_of(s: &mut LatencyStep) -> StepLatency {
    let mean_us = |ns: u64, ranks: u32| ns as f64 / f64::from(ranks.max(1)) / 1000.0;
    StepLatency {
        key_id: s.key_id,
        step: s.step,
        latency_ns: s.stop_unix_ns.saturating_sub(s.start_unix_ns),
        start_unix_ns: s.start_unix_ns,
        start_app: std::mem::take(&mut s.start_app),
        start_rank: s.start_rank,
        stop_unix_ns: s.stop_unix_ns,
        stop_app: std::mem::take(&mut s.stop_app),
        stop_rank: s.stop_rank,
        starts: s.starts,
        stops: s.stops,
        apps: s
            .apps
            .iter()
            .map(|a| StepApp {
                app: a.app.clone(),
                ranks: a.ranks,
                transfer_us: mean_us(a.transfer_ns, a.ranks),
                compute_us: mean_us(a.compute_ns, a.ranks),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(step: u64, at: u64) -> LatencyStep {
        LatencyStep {
            key_id: 7,
            step,
            starts: 1,
            start_unix_ns: at,
            start_app: "sim".into(),
            ..Default::default()
        }
    }

    fn stop(step: u64, at: u64) -> LatencyStep {
        LatencyStep {
            key_id: 7,
            step,
            stops: 1,
            stop_unix_ns: at,
            stop_app: "ana".into(),
            stop_rank: 3,
            ..Default::default()
        }
    }

    fn packet(steps: Vec<LatencyStep>) -> LatencyPacket {
        LatencyPacket {
            steps,
            ..Default::default()
        }
    }

    #[test]
    fn a_step_completes_in_the_round_its_other_end_comes() {
        let mut open = Open::new(8);
        let r0 = open.round(&packet(vec![start(1, 100), start(2, 200)]));
        assert!(r0.steps.is_empty());
        assert_eq!(r0.open, 2);
        let r1 = open.round(&packet(vec![stop(1, 130)]));
        assert_eq!(r1.steps.len(), 1);
        let s = &r1.steps[0];
        assert_eq!(
            (
                s.step,
                s.latency_ns,
                s.start_app.as_str(),
                s.stop_app.as_str(),
                s.stop_rank
            ),
            (1, 30, "sim", "ana", 3)
        );
        assert_eq!(r1.open, 1);
        // Both ends in one round.
        let r2 = open.round(&packet(vec![start(3, 10), {
            let mut s = stop(3, 15);
            merge_step(&mut s, &start(3, 10));
            s
        }]));
        assert_eq!(r2.steps.len(), 1);
        assert_eq!(r2.steps[0].latency_ns, 5);
    }

    #[test]
    fn the_oldest_open_steps_are_evicted_and_counted() {
        let mut open = Open::new(2);
        let r = open.round(&packet(vec![start(1, 1), start(2, 2), start(3, 3)]));
        assert_eq!((r.open, r.evicted), (2, 1));
        // Step 1 was let go: its stop waits as a step of its own.
        let r = open.round(&packet(vec![stop(1, 9), stop(3, 9)]));
        assert_eq!(r.steps.iter().map(|s| s.step).collect::<Vec<_>>(), vec![3]);
        assert_eq!((r.open, r.evicted), (2, 1));
        let r = open.round(&packet(vec![start(4, 1)]));
        assert_eq!((r.open, r.evicted), (2, 2));
    }
}
