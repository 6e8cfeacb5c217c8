//! Adding sparse tables of bins into one packet: rank profiles at a leaf, children's packets above it. Each
//! part's records are sorted by bin, then activity, so the sum is one pass over the bins of the union window
//! with a k-way merge of the parts' records in each bin. Sums are integers: the packet does not depend on the
//! order of the parts.

use canopy_filter_proto::v1::UtilizationPacket;

use crate::window::Window;

/// A part's value per record: a rank's shares, or a packet's sums of shares.
#[derive(Debug, Clone, Copy)]
pub enum Values<'a> {
    Shares(&'a [u32]),
    Sums(&'a [u64]),
}

impl Values<'_> {
    fn get(&self, record: usize) -> u64 {
        match self {
            Values::Shares(s) => u64::from(s[record]),
            Values::Sums(s) => s[record],
        }
    }
}

/// How many ranks a part covers in each of its bins: one rank, or a packet's per-bin counts.
#[derive(Debug, Clone, Copy)]
pub enum Covers<'a> {
    One,
    PerBin(&'a [u32]),
}

/// One checked table of bins inside the window being merged into.
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    pub window: Window,
    pub activities: &'a [u64],
    pub counts: &'a [u32],
    pub activity: &'a [u32],
    pub values: Values<'a>,
    pub covers: Covers<'a>,
}

/// What a merge keeps between rounds, so that a round in steady state allocates nothing per record.
#[derive(Debug, Default)]
pub struct Merger {
    /// The union of the parts' activities, sorted.
    union: Vec<u64>,
    /// Per part, its activity indices as indices into `union`.
    remap: Vec<Vec<u32>>,
    /// Per part: its first bin in the window, and its next record.
    offset: Vec<usize>,
    next: Vec<usize>,
    /// The parts holding records in the bin being merged: (part, end of its records in the bin).
    heads: Vec<(usize, usize)>,
    /// `union` index to output index, for the activities some record names.
    used: Vec<u32>,
}

const UNUSED: u32 = u32::MAX;

impl Merger {
    /// Writes the sum of `parts` over `window` (their union) into `out`'s table: `start_unix_ns`, `bin_us`,
    /// `activities`, `counts`, `activity`, `sums` and `ranks`, every bin of the window present. Records summing
    /// to 0 are left out. `None`: no bins at all. The other fields are the caller's.
    pub fn merge(&mut self, window: Option<Window>, parts: &[Part<'_>], out: &mut UtilizationPacket) {
        out.activities.clear();
        out.counts.clear();
        out.activity.clear();
        out.sums.clear();
        out.ranks.clear();
        let Some(window) = window else {
            out.start_unix_ns = 0;
            out.bin_us = 0;
            return;
        };
        out.start_unix_ns = window.start_unix_ns;
        out.bin_us = window.bin_us;

        self.union.clear();
        for p in parts {
            self.union.extend_from_slice(p.activities);
        }
        self.union.sort_unstable();
        self.union.dedup();
        if self.remap.len() < parts.len() {
            self.remap.resize_with(parts.len(), Vec::new);
        }
        self.offset.clear();
        self.next.clear();
        for (k, p) in parts.iter().enumerate() {
            let remap = &mut self.remap[k];
            remap.clear();
            remap.extend(
                p.activities
                    .iter()
                    .map(|id| self.union.partition_point(|u| u < id) as u32),
            );
            self.offset.push(window.offset_of(&p.window));
            self.next.push(0);
        }

        self.used.clear();
        self.used.resize(self.union.len(), UNUSED);
        for bin in 0..window.bins {
            let mut ranks = 0u32;
            self.heads.clear();
            for (k, p) in parts.iter().enumerate() {
                let Some(local) = bin.checked_sub(self.offset[k]).filter(|&l| l < p.window.bins) else {
                    continue;
                };
                ranks = ranks.saturating_add(match p.covers {
                    Covers::One => 1,
                    Covers::PerBin(r) => r[local],
                });
                let n = p.counts[local] as usize;
                if n > 0 {
                    self.heads.push((k, self.next[k] + n));
                }
            }
            let mut records = 0u32;
            loop {
                // The least activity (as a `union` index) at the head of any part in this bin.
                let mut least = UNUSED;
                for &(k, end) in &self.heads {
                    let at = self.next[k];
                    if at < end {
                        least = least.min(self.remap[k][parts[k].activity[at] as usize]);
                    }
                }
                if least == UNUSED {
                    break;
                }
                let mut sum = 0u64;
                for &(k, end) in &self.heads {
                    let at = self.next[k];
                    if at < end && self.remap[k][parts[k].activity[at] as usize] == least {
                        sum = sum.saturating_add(parts[k].values.get(at));
                        self.next[k] = at + 1;
                    }
                }
                if sum > 0 {
                    self.used[least as usize] = 0;
                    out.activity.push(least);
                    out.sums.push(sum);
                    records += 1;
                }
            }
            out.counts.push(records);
            out.ranks.push(ranks);
        }

        // Only the activities some record names, renumbered in the same (sorted) order.
        for (u, id) in self.used.iter_mut().zip(&self.union) {
            if *u != UNUSED {
                *u = out.activities.len() as u32;
                out.activities.push(*id);
            }
        }
        for a in &mut out.activity {
            *a = self.used[*a as usize];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part<'a>(
        start_bin: u64,
        activities: &'a [u64],
        counts: &'a [u32],
        activity: &'a [u32],
        values: Values<'a>,
        covers: Covers<'a>,
    ) -> Part<'a> {
        Part {
            window: Window::of(start_bin * 1_000_000, 1000, counts.len()).unwrap(),
            activities,
            counts,
            activity,
            values,
            covers,
        }
    }

    #[test]
    fn parts_add_per_bin_and_activity_over_the_union() {
        // A rank over bins 2..4 and a packet of two ranks over bins 0..2; bin 3 is covered by the rank alone.
        let rank = part(
            2,
            &[5, 9],
            &[2, 1],
            &[0, 1, 1],
            Values::Shares(&[100, 150, 250]),
            Covers::One,
        );
        let packet = part(
            0,
            &[0, 5, 7],
            &[1, 0, 3],
            &[1, 0, 1, 2],
            Values::Sums(&[400, 30, 60, 0]),
            Covers::PerBin(&[2, 2, 2]),
        );
        let window = Window::join(Some(rank.window), Some(packet.window)).unwrap();
        let mut out = UtilizationPacket::default();
        let mut m = Merger::default();
        for parts in [[rank, packet], [packet, rank]] {
            m.merge(window, &parts, &mut out);
            assert_eq!((out.start_unix_ns, out.bin_us), (0, 1000));
            // Activity 7's zero sum is left out, and 7 with it.
            assert_eq!(out.activities, vec![0, 5, 9]);
            assert_eq!(out.counts, vec![1, 0, 3, 1]);
            assert_eq!(out.ranks, vec![2, 2, 3, 1]);
            assert_eq!(out.activity, vec![1, 0, 1, 2, 2]);
            assert_eq!(out.sums, vec![400, 30, 160, 150, 250]);
        }
        m.merge(None, &[], &mut out);
        assert_eq!(out, UtilizationPacket::default());
    }
}
