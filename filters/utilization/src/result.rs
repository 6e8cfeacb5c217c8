//! The root's packet made into the stored result: per bin and activity the average share over the ranks
//! covering the bin, with small records folded into "other" from their sums, so no rounding is done twice.

use std::collections::HashMap;

use canopy_filter_proto::v1::{UtilizationPacket, UtilizationResult};
use canopy_wire::utilization::{FULL, OTHER};

/// The threshold on the share scale (0 to [`FULL`]) for a percentage, rounded half up: 10% is 25.
pub fn threshold_share(percent: u32) -> u32 {
    (percent * FULL * 2 + 100) / 200
}

/// `sum / ranks` rounded half up, at most [`FULL`]; 0 over no ranks.
pub fn average(sum: u64, ranks: u32) -> u32 {
    if ranks == 0 {
        return 0;
    }
    let r = u128::from(ranks);
    ((u128::from(sum) * 2 + r) / (2 * r)).min(u128::from(FULL)) as u32
}

/// Scratch kept between rounds.
#[derive(Debug, Default)]
pub struct Averager {
    /// The result's records: (bin, activity id, average share).
    records: Vec<(u32, u64, u32)>,
}

impl Averager {
    /// The result of a checked packet. A record whose average is below `threshold` goes into its bin's
    /// [`OTHER`] record, whose average is that of the summed sums (its own included); records averaging 0 are
    /// left out. `names` gives the activities' names ("other" for [`OTHER`], empty when unknown).
    pub fn result(
        &mut self,
        p: &UtilizationPacket,
        threshold: u32,
        names: &HashMap<u64, String>,
    ) -> UtilizationResult {
        self.records.clear();
        let mut at = 0;
        for (bin, (&count, &ranks)) in p.counts.iter().zip(&p.ranks).enumerate() {
            let bin = bin as u32;
            let mut other = 0u64;
            // OTHER sorts first: its record goes in before the bin's others, once they are all seen.
            let first = self.records.len();
            for k in at..at + count as usize {
                let (id, sum) = (p.activities[p.activity[k] as usize], p.sums[k]);
                let avg = average(sum, ranks);
                if id == OTHER || avg < threshold {
                    other = other.saturating_add(sum);
                } else if avg > 0 {
                    self.records.push((bin, id, avg));
                }
            }
            at += count as usize;
            let avg = average(other, ranks);
            if avg > 0 {
                self.records.insert(first, (bin, OTHER, avg));
            }
        }
        let mut activities: Vec<u64> = self.records.iter().map(|r| r.1).collect();
        activities.sort_unstable();
        activities.dedup();
        let mut counts = vec![0u32; p.counts.len()];
        let mut activity = Vec::with_capacity(self.records.len());
        let mut share = Vec::with_capacity(self.records.len());
        for &(bin, id, avg) in &self.records {
            counts[bin as usize] += 1;
            activity.push(activities.partition_point(|a| *a < id) as u32);
            share.push(avg);
        }
        let names = activities
            .iter()
            .map(|id| match *id {
                OTHER => "other".to_string(),
                id => names.get(&id).cloned().unwrap_or_default(),
            })
            .collect();
        UtilizationResult {
            start_unix_ns: p.start_unix_ns,
            bin_us: p.bin_us,
            activities,
            names,
            counts,
            activity,
            share,
            ranks: p.ranks.clone(),
            profiles: p.profiles,
            threshold,
            lost: p.lost,
            raw_bytes: p.raw_bytes,
            without: p.without,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_and_averages_round_half_up() {
        assert_eq!(threshold_share(10), 25);
        assert_eq!(threshold_share(1), 3); // 2.5
        assert_eq!(threshold_share(0), 0);
        assert_eq!(threshold_share(100), FULL);
        assert_eq!(average(5, 2), 3); // 2.5
        assert_eq!(average(4, 3), 1); // 1.33
        assert_eq!(average(5, 3), 2); // 1.67
        assert_eq!(average(749, 3), 250); // 249.67
        assert_eq!(average(u64::MAX, 1), FULL);
        assert_eq!(average(7, 0), 0);
    }

    /// A packet of one bin over `ranks` ranks with the given (activity id, sum) records, ids sorted.
    fn one_bin(ranks: u32, records: &[(u64, u64)]) -> UtilizationPacket {
        UtilizationPacket {
            start_unix_ns: 1_000_000,
            bin_us: 1000,
            activities: records.iter().map(|r| r.0).collect(),
            counts: vec![records.len() as u32],
            activity: (0..records.len() as u32).collect(),
            sums: records.iter().map(|r| r.1).collect(),
            ranks: vec![ranks],
            profiles: ranks,
            ..Default::default()
        }
    }

    fn shares(r: &UtilizationResult) -> Vec<(u64, u32)> {
        r.activity
            .iter()
            .zip(&r.share)
            .map(|(&a, &s)| (r.activities[a as usize], s))
            .collect()
    }

    #[test]
    fn small_records_fold_into_other_from_their_sums() {
        let names = HashMap::from([(7, "solve".to_string())]);
        let mut a = Averager::default();
        // Over 4 ranks, threshold 25: 7 averages 150 and stays; 8 (sum 98, 24.5 -> 25) stays; 9 (sum 97, 24.25
        // -> 24), 10 (sum 9, 2.25 -> 2) and 11 (sum 1, 0.25 -> 0) fold. Other: (1 + 97 + 9 + 1) / 4 = 27, not
        // 0 + 24 + 2 + 0 = 26 from the rounded averages.
        let p = one_bin(4, &[(0, 1), (7, 600), (8, 98), (9, 97), (10, 9), (11, 1)]);
        let r = a.result(&p, 25, &names);
        assert_eq!(shares(&r), vec![(0, 27), (7, 150), (8, 25)]);
        assert_eq!(r.activities, vec![0, 7, 8]);
        assert_eq!(r.names, vec!["other", "solve", ""]);
        assert_eq!(
            (r.counts.clone(), r.ranks.clone(), r.threshold),
            (vec![3], vec![4], 25)
        );
        // Folded records with no OTHER record of their own make one, sorted first.
        let p = one_bin(3, &[(4, 1), (7, 300), (9, 2)]);
        assert_eq!(shares(&a.result(&p, 25, &names)), vec![(0, 1), (7, 100)]);
        // What rounds to 0 is dropped, "other" included: 1 / 3 is 0.
        let p = one_bin(3, &[(4, 1), (7, 300)]);
        assert_eq!(shares(&a.result(&p, 25, &names)), vec![(7, 100)]);
        // Threshold 0 folds nothing and still drops zero averages.
        let p = one_bin(3, &[(4, 1), (7, 2)]);
        assert_eq!(shares(&a.result(&p, 0, &names)), vec![(7, 1)]);
        // Threshold 100%: everything but a full bin folds.
        let p = one_bin(2, &[(4, 500), (7, 498)]);
        assert_eq!(shares(&a.result(&p, 250, &names)), vec![(0, 249), (4, 250)]);
    }

    #[test]
    fn bins_keep_their_ranks_and_empty_bins_stay() {
        let p = UtilizationPacket {
            start_unix_ns: 5_000_000,
            bin_us: 1000,
            activities: vec![3, 6],
            counts: vec![1, 0, 2],
            activity: vec![1, 0, 1],
            sums: vec![250, 200, 100],
            ranks: vec![1, 0, 2],
            profiles: 2,
            without: 1,
            lost: 4,
            raw_bytes: 99,
        };
        let r = Averager::default().result(&p, 25, &HashMap::new());
        assert_eq!(r.counts, vec![1, 0, 2]);
        assert_eq!(r.ranks, vec![1, 0, 2]);
        assert_eq!(r.activities, vec![3, 6]);
        assert_eq!(r.activity, vec![1, 0, 1]);
        assert_eq!(r.share, vec![250, 100, 50]);
        assert_eq!(
            (
                r.start_unix_ns,
                r.bin_us,
                r.profiles,
                r.without,
                r.lost,
                r.raw_bytes
            ),
            (5_000_000, 1000, 2, 1, 4, 99)
        );
    }
}
