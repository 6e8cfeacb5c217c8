//! What a node remembers to route a round's later packets: the coverage of each round it sent up (a packet a
//! downstream call emits upward, such as the histogram's last phase, carries it), and the multi-phase rounds under
//! way here, which stay in the window until this node sends up their last phase.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use canopy_proto::v1::Coverage;
use tokio::time::Instant;

use crate::filter::Output;

/// Round coverage remembered for packets a downstream call emits upward.
const COVERAGE_MEMORY: usize = 4096;

#[derive(Default)]
pub(crate) struct Router {
    memory: HashMap<(u32, u64), (Coverage, u64)>,
    order: VecDeque<(u32, u64)>,
    /// Multi-phase rounds whose first phase went through here and whose last phase has not gone up yet, with the
    /// time after which they are given up.
    awaiting: HashMap<(u32, u64), Instant>,
}

impl Router {
    /// Remembers a round's coverage and first dump time (the oldest are forgotten past a bound).
    pub(crate) fn remember(&mut self, stream: u32, round: u64, cov: &Coverage, first_dump: u64) {
        if self
            .memory
            .insert((stream, round), (cov.clone(), first_dump))
            .is_none()
        {
            self.order.push_back((stream, round));
            while self.order.len() > COVERAGE_MEMORY {
                if let Some(k) = self.order.pop_front() {
                    self.memory.remove(&k);
                }
            }
        }
    }

    /// The coverage and first dump time remembered for a round (none: nothing covered).
    pub(crate) fn recall(&self, stream: u32, round: u64) -> (Coverage, u64) {
        self.memory.get(&(stream, round)).cloned().unwrap_or_default()
    }

    /// Follows a multi-phase round through what a filter emitted: it is under way from its first packet until
    /// this node sends up its last phase, or until twice its time-out and a second have passed.
    pub(crate) fn track(
        &mut self,
        stream: u32,
        round: u64,
        phases: u32,
        timeout_ms: u32,
        out: &Output,
        now: Instant,
    ) {
        if phases <= 1 {
            return;
        }
        let last = phases - 1;
        if out.up.iter().any(|p| p.phase == last) {
            self.awaiting.remove(&(stream, round));
        } else if out.up.iter().chain(out.down.iter()).any(|p| p.phase < last) {
            let deadline = now + Duration::from_millis(2 * u64::from(timeout_ms) + 1000);
            self.awaiting.entry((stream, round)).or_insert(deadline);
        }
    }

    /// A multi-phase round whose first phase closed here is under way from now on (before its filter answers),
    /// until it ends as [`Router::track`] says or twice its time-out and a second have passed.
    pub(crate) fn begin(&mut self, stream: u32, round: u64, phases: u32, timeout_ms: u32, now: Instant) {
        if phases <= 1 {
            return;
        }
        let deadline = now + Duration::from_millis(2 * u64::from(timeout_ms) + 1000);
        self.awaiting.entry((stream, round)).or_insert(deadline);
    }

    /// The coverage remembered for a multi-phase round still under way here, to change before the round ends; none
    /// for a round that ended or was never under way.
    pub(crate) fn under_way_mut(&mut self, stream: u32, round: u64) -> Option<&mut Coverage> {
        if !self.awaiting.contains_key(&(stream, round)) {
            return None;
        }
        self.memory.get_mut(&(stream, round)).map(|(cov, _)| cov)
    }

    /// A round that ends here before its last phase (its first phase emitted nothing).
    pub(crate) fn end(&mut self, stream: u32, round: u64) {
        self.awaiting.remove(&(stream, round));
    }

    /// The rounds given up by `now`, no longer awaited.
    pub(crate) fn expired(&mut self, now: Instant) -> Vec<(u32, u64)> {
        let mut gone: Vec<(u32, u64)> = self
            .awaiting
            .iter()
            .filter(|(_, deadline)| **deadline <= now)
            .map(|(k, _)| *k)
            .collect();
        gone.sort_unstable();
        for k in &gone {
            self.awaiting.remove(k);
        }
        gone
    }

    /// A closed stream's rounds are awaited no more: packets still on their way are expected, not malformed.
    pub(crate) fn forget_stream(&mut self, stream: u32) {
        self.awaiting.retain(|(s, _), _| *s != stream);
    }

    /// A failed stream's rounds under way here, no longer awaited (in order): none of them will finish.
    pub(crate) fn take_stream(&mut self, stream: u32) -> Vec<u64> {
        let mut rounds: Vec<u64> = self
            .awaiting
            .keys()
            .filter(|(s, _)| *s == stream)
            .map(|(_, round)| *round)
            .collect();
        rounds.sort_unstable();
        self.forget_stream(stream);
        rounds
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.awaiting.values().min().copied()
    }

    pub(crate) fn lowest_awaited(&self) -> Option<u64> {
        self.awaiting.keys().map(|(_, round)| *round).min()
    }

    pub(crate) fn is_awaiting(&self) -> bool {
        !self.awaiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::Packet;

    fn out(up: &[u32], down: &[u32]) -> Output {
        let p = |phase: &u32| Packet {
            phase: *phase,
            payload: vec![],
        };
        Output {
            up: up.iter().map(p).collect(),
            down: down.iter().map(p).collect(),
            rejected: vec![],
        }
    }

    #[test]
    fn a_multi_phase_round_is_awaited_from_its_first_phase_to_its_last() {
        let mut r = Router::default();
        let t0 = Instant::now();
        r.track(1, 7, 3, 1000, &out(&[0], &[]), t0);
        assert_eq!(r.lowest_awaited(), Some(7));
        r.track(1, 7, 3, 1000, &out(&[], &[1]), t0);
        r.track(1, 7, 3, 1000, &out(&[2], &[]), t0);
        assert!(!r.is_awaiting());
        // Single-phase rounds are never awaited.
        r.track(2, 8, 1, 1000, &out(&[0], &[]), t0);
        assert!(!r.is_awaiting());
    }

    #[test]
    fn a_multi_phase_round_is_under_way_from_its_first_close_until_it_ends_or_fails() {
        let mut r = Router::default();
        let t0 = Instant::now();
        r.begin(1, 7, 3, 1000, t0);
        r.begin(2, 8, 1, 1000, t0);
        assert_eq!(
            r.lowest_awaited(),
            Some(7),
            "single-phase rounds are never awaited"
        );
        // Its filter's answer sends the first phase up: still under way, with the deadline it began with.
        r.track(1, 7, 3, 1000, &out(&[0], &[]), t0 + Duration::from_secs(5));
        assert_eq!(r.next_deadline(), Some(t0 + Duration::from_millis(3000)));
        // A first phase that emitted nothing ends the round.
        r.begin(1, 9, 3, 1000, t0);
        r.end(1, 9);
        // A failed stream's rounds are handed back, in order, and awaited no more.
        r.begin(1, 5, 3, 1000, t0);
        r.begin(3, 6, 2, 1000, t0);
        assert_eq!(r.take_stream(1), vec![5, 7]);
        assert_eq!(r.lowest_awaited(), Some(6));
    }

    #[test]
    fn an_awaited_round_expires_after_twice_its_time_out_and_a_second() {
        let mut r = Router::default();
        let t0 = Instant::now();
        r.track(1, 3, 2, 500, &out(&[0], &[]), t0);
        assert!(r.expired(t0 + Duration::from_millis(1999)).is_empty());
        assert_eq!(r.expired(t0 + Duration::from_millis(2000)), vec![(1, 3)]);
        assert!(!r.is_awaiting());
    }

    #[test]
    fn coverage_memory_is_bounded() {
        let mut r = Router::default();
        let cov = Coverage {
            covered: 1,
            expected: 1,
            missing: vec![],
            apps: vec![],
            unreachable: vec![],
        };
        for round in 0..(COVERAGE_MEMORY as u64 + 10) {
            r.remember(1, round, &cov, round);
        }
        assert_eq!(r.recall(1, 0), (Coverage::default(), 0));
        assert_eq!(
            r.recall(1, COVERAGE_MEMORY as u64 + 9),
            (cov, COVERAGE_MEMORY as u64 + 9)
        );
    }
}
