//! Per-round state that survives between phases: rounds pipeline, so several are open at once.

use std::collections::BTreeMap;

/// How many rounds a filter keeps open at most; beyond it the oldest is dropped, so a round whose later
/// phases never come (a lost child) cannot grow memory without bound.
pub const MAX_OPEN_ROUNDS: usize = 1024;

/// State per open round, keyed by round number; the smallest round is the oldest.
#[derive(Debug, Clone)]
pub struct Rounds<T> {
    map: BTreeMap<u64, T>,
    cap: usize,
}

impl<T> Default for Rounds<T> {
    fn default() -> Self {
        Rounds::new()
    }
}

impl<T> Rounds<T> {
    /// Holds at most [`MAX_OPEN_ROUNDS`] rounds.
    pub fn new() -> Rounds<T> {
        Rounds::with_cap(MAX_OPEN_ROUNDS)
    }

    /// Holds at most `cap` rounds (at least one).
    pub fn with_cap(cap: usize) -> Rounds<T> {
        Rounds {
            map: BTreeMap::new(),
            cap: cap.max(1),
        }
    }

    /// Stores the state of `round` (replacing any), then drops the oldest rounds beyond the cap.
    pub fn insert(&mut self, round: u64, state: T) {
        self.map.insert(round, state);
        while self.map.len() > self.cap {
            self.map.pop_first();
        }
    }

    /// Takes the state of `round` out: its last phase is done.
    pub fn remove(&mut self, round: u64) -> Option<T> {
        self.map.remove(&round)
    }

    pub fn get(&self, round: u64) -> Option<&T> {
        self.map.get(&round)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_the_oldest_beyond_the_cap() {
        let mut r = Rounds::with_cap(3);
        for round in [5, 1, 9, 7] {
            r.insert(round, round * 10);
        }
        assert_eq!(r.len(), 3);
        assert_eq!(r.get(1), None);
        assert_eq!(r.remove(5), Some(50));
        assert_eq!(r.remove(5), None);
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn default_cap_is_1024() {
        let mut r = Rounds::new();
        for round in 0..2000u64 {
            r.insert(round, ());
        }
        assert_eq!(r.len(), MAX_OPEN_ROUNDS);
        assert!(r.get(2000 - 1024).is_some());
        assert!(r.get(2000 - 1025).is_none());
    }
}
