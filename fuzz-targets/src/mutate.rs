//! A small deterministic mutator for the stable test: what libFuzzer does at length, done a bounded number of
//! times from a seed, so every target runs on stable over inputs near its corpus.

/// SplitMix64: a seed reproduces every mutation.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// Interesting bytes: the edges of varints, lengths and wire types.
const SPECIAL: [u8; 10] = [0, 1, 0x7f, 0x80, 0xff, 0x0a, 0x12, 0x09, 0xEE, b';'];

/// One to four mutations of `seed`, with `other` available for splicing.
pub fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8], max_len: usize) -> Vec<u8> {
    let mut out = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(8) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = SPECIAL[rng.below(SPECIAL.len())];
            }
            2 => {
                let i = rng.below(out.len() + 1);
                out.insert(i, rng.next_u64() as u8);
            }
            3 if !out.is_empty() => {
                let i = rng.below(out.len());
                let n = 1 + rng.below((out.len() - i).min(16));
                out.drain(i..i + n);
            }
            4 => {
                let len = rng.below(out.len() + 1);
                out.truncate(len);
            }
            5 if !other.is_empty() => {
                // Splice: a head of this input, a tail of another.
                let cut = rng.below(out.len() + 1);
                let from = rng.below(other.len());
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            6 if !out.is_empty() => {
                // Repeat a chunk (frames and messages several times over).
                let i = rng.below(out.len());
                let n = 1 + rng.below((out.len() - i).min(64));
                let chunk = out[i..i + n].to_vec();
                let at = rng.below(out.len() + 1);
                out.splice(at..at, chunk);
            }
            _ if !out.is_empty() => {
                let i = rng.below(out.len());
                let v = rng.next_u64().to_le_bytes();
                let n = (1 + rng.below(8)).min(out.len() - i);
                out[i..i + n].copy_from_slice(&v[..n]);
            }
            _ => out.push(rng.next_u64() as u8),
        }
    }
    out.truncate(max_len);
    out
}
