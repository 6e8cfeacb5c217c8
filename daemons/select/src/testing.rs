//! The tests' random numbers: SplitMix64 from rand_xoshiro, reproducible from a seed, so a failing set can be built
//! again.

use rand_xoshiro::rand_core::{Rng as _, SeedableRng as _};

/// rand_xoshiro's SplitMix64 with the draws the tests need.
pub struct SplitMix64(rand_xoshiro::SplitMix64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(rand_xoshiro::SplitMix64::seed_from_u64(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [-1, 1).
    pub fn symmetric(&mut self) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        2.0 * unit - 1.0
    }

    /// `n` draws uniform in [-1, 1).
    pub fn column(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.symmetric()).collect()
    }
}

/// A workflow's training set where the latency is driven by two independent metrics `a` and `b` (latency =
/// a + b + noise of 0.05), `c` is `a` again with noise of 0.001 (redundant), and `noise` columns are
/// independent of everything. Returns the set and the positions of a, b and c among the columns.
pub fn drivers_and_noise(seed: u64, observations: usize, noise: usize) -> (crate::Dataset, [usize; 3]) {
    let mut rng = SplitMix64::new(seed);
    let a = rng.column(observations);
    let b = rng.column(observations);
    let c: Vec<f64> = a.iter().map(|v| v + 0.001 * rng.symmetric()).collect();
    let latency: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| x + y + 0.05 * rng.symmetric())
        .collect();
    // The drivers sit among the noise, not at its start, so no test passes by taking the first columns.
    let positions = [noise / 4, noise / 2 + 1, 3 * noise / 4 + 2];
    let mut noise_columns = (0..noise).map(|_| rng.column(observations));
    let mut names = Vec::new();
    let mut columns = Vec::new();
    for at in 0..noise + 3 {
        let (name, column) = match positions.iter().position(|&p| p == at) {
            Some(0) => ("a".to_string(), a.clone()),
            Some(1) => ("b".to_string(), b.clone()),
            Some(_) => ("c".to_string(), c.clone()),
            None => (format!("noise {at}"), noise_columns.next().unwrap()),
        };
        names.push(name);
        columns.push(column);
    }
    (crate::Dataset::new(names, latency, columns).unwrap(), positions)
}
