//! Deterministic random numbers keyed by what they are for (rank, round, event), so a rank's values never
//! depend on the order they are drawn in.

use super::*;

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

pub(super) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// splitmix64 seeded from a hashed key, so a value depends on its key alone and not on what was drawn
/// before it.
#[derive(Debug)]
/// The simulator's generator: rand_xoshiro's SplitMix64, its state a hash of the draw's key (seed, scenario, rank,
/// round, event), so every value is reproducible on its own, whatever else was drawn.
pub(super) struct Keyed(SplitMix64);

impl Keyed {
    pub(super) fn of(key: &[u64]) -> Keyed {
        Keyed::from_state(Keyed::prefix(key))
    }

    /// The hashed state of a key's first parts: `Keyed::with(Keyed::prefix(&[a, b]), c)` is
    /// `Keyed::of(&[a, b, c])`, with the prefix hashed once for many draws.
    pub(super) fn prefix(key: &[u64]) -> u64 {
        key.iter().fold(GOLDEN, |s, &k| mix64(s ^ k).wrapping_add(GOLDEN))
    }

    pub(super) fn with(prefix: u64, last: u64) -> Keyed {
        Keyed::from_state(mix64(prefix ^ last).wrapping_add(GOLDEN))
    }

    pub(super) fn from_state(state: u64) -> Keyed {
        // from_seed takes the bytes as the state as they are; seed_from_u64 would scramble them first.
        Keyed(SplitMix64::from_seed(state.to_le_bytes()))
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    pub(super) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub(super) fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}
