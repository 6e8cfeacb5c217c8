//! The utilization filter over random trees equals the same averages computed directly over all ranks at
//! once, exactly: ranks with different (aligned) windows, ranks without a utilization profile, any threshold.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use canopy_filter_proto::v1::UtilizationResult;
use canopy_filter_test::{Case, DataSpec, Rng};
use canopy_filter_utilization::UtilizationFilter;
use canopy_wire::utilization::{FULL, OTHER};
use canopy_wire::v1::{RankProfile, Utilization};
use proptest::prelude::*;
use prost::Message;

/// Aligned on every bin width drawn below.
const T0: u64 = 1_700_000_000_000_000_000;
/// An activity no name is given for.
const NAMELESS: u64 = 0xdead_beef;

/// A random profile over bins `bin_us` wide from `T0` + 0 to 30 bins: 0 to 40 bins, each with a random subset of
/// `ids` (0, "other", among them) at random shares. `None` one time in six.
fn utilization(rng: &mut Rng, ids: &[u64], bin_us: u32) -> Option<Utilization> {
    if rng.chance(1.0 / 6.0) {
        return None;
    }
    let bins = rng.between(0, 40);
    let mut u = Utilization {
        start_unix_ns: T0 + rng.between(0, 30) as u64 * u64::from(bin_us) * 1000,
        bin_us,
        lost: rng.between(0, 3) as u64,
        threads: 1,
        ..Default::default()
    };
    let mut records = Vec::new();
    for bin in 0..bins {
        for &id in ids {
            if rng.chance(0.4) {
                let share = match rng.below(4) {
                    0 => 0,
                    1 => FULL,
                    _ => rng.between(0, FULL as usize) as u32,
                };
                records.push((bin, id, share));
            }
        }
    }
    // Each bin's records in increasing activity order, as a rank writes them.
    records.sort_unstable();
    u.activities = records.iter().map(|r| r.1).collect();
    u.activities.sort_unstable();
    u.activities.dedup();
    u.counts = vec![0; bins];
    for &(bin, id, share) in &records {
        u.counts[bin] += 1;
        u.activity.push(u.activities.binary_search(&id).unwrap() as u32);
        u.share.push(share);
    }
    Some(u)
}

/// The result computed from all ranks' profiles at once: (bin, activity id) -> average share, and per bin the
/// ranks covering it, over the window from the earliest start to the latest end.
fn direct(profiles: &[RankProfile], threshold: u32) -> (u64, Vec<BTreeMap<u64, u32>>, Vec<u32>) {
    let with: Vec<&Utilization> = profiles
        .iter()
        .filter_map(|p| p.utilization.as_ref())
        .filter(|u| !u.counts.is_empty())
        .collect();
    let Some(bin_ns) = with.first().map(|u| u64::from(u.bin_us) * 1000) else {
        return (0, Vec::new(), Vec::new());
    };
    let start = with.iter().map(|u| u.start_unix_ns).min().unwrap();
    let end = with
        .iter()
        .map(|u| u.start_unix_ns + u.counts.len() as u64 * bin_ns)
        .max()
        .unwrap();
    let bins = ((end - start) / bin_ns) as usize;
    let mut sums: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); bins];
    let mut ranks = vec![0u32; bins];
    for u in &with {
        let first = ((u.start_unix_ns - start) / bin_ns) as usize;
        for r in &mut ranks[first..first + u.counts.len()] {
            *r += 1;
        }
        for (bin, id, share) in canopy_wire::utilization::records(u) {
            *sums[first + bin].entry(id).or_default() += u64::from(share);
        }
    }
    let round = |sum: u64, r: u32| {
        let r = u64::from(r);
        let (q, rem) = (sum / r, sum % r);
        (q + u64::from(2 * rem >= r)).min(u64::from(FULL)) as u32
    };
    let averages = sums
        .iter()
        .zip(&ranks)
        .map(|(cells, &r)| {
            let mut out = BTreeMap::new();
            let mut other = 0;
            for (&id, &sum) in cells {
                if id == OTHER || round(sum, r) < threshold {
                    other += sum;
                } else {
                    out.insert(id, round(sum, r));
                }
            }
            if other > 0 {
                out.insert(OTHER, round(other, r));
            }
            out.retain(|_, avg| *avg > 0);
            out
        })
        .collect();
    (start, averages, ranks)
}

/// `got` is what [`direct`] computes from the round's `profiles`, record for record.
fn same(
    got: &UtilizationResult,
    profiles: &[RankProfile],
    names: &HashMap<u64, String>,
    threshold: u32,
    bin_us: u32,
    what: &str,
) -> Result<(), TestCaseError> {
    let (start, averages, covered) = direct(profiles, threshold);
    prop_assert_eq!(got.start_unix_ns, start, "{}", what);
    prop_assert_eq!(
        got.bin_us,
        if covered.is_empty() { 0 } else { bin_us },
        "{}",
        what
    );
    prop_assert_eq!(&got.ranks, &covered, "{}", what);
    prop_assert_eq!(got.counts.len(), covered.len());
    let mut at = 0;
    for (bin, &count) in got.counts.iter().enumerate() {
        let ids: Vec<u64> = (at..at + count as usize)
            .map(|k| got.activities[got.activity[k] as usize])
            .collect();
        // Sorted by activity within the bin, each once.
        prop_assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "{} bin {}: {:?}",
            what,
            bin,
            ids
        );
        let records: BTreeMap<u64, u32> = ids
            .into_iter()
            .zip(&got.share[at..])
            .map(|(id, &s)| (id, s))
            .collect();
        prop_assert_eq!(&records, &averages[bin], "{} bin {}", what, bin);
        at += count as usize;
    }
    let used: BTreeSet<u64> = averages.iter().flat_map(|b| b.keys().copied()).collect();
    prop_assert_eq!(&got.activities, &used.into_iter().collect::<Vec<_>>(), "{}", what);
    let want_names: Vec<String> = got
        .activities
        .iter()
        .map(|id| match *id {
            OTHER => "other".to_string(),
            id => names.get(&id).cloned().unwrap_or_default(),
        })
        .collect();
    prop_assert_eq!(&got.names, &want_names);
    let with = profiles.iter().filter(|p| p.utilization.is_some()).count() as u32;
    prop_assert_eq!(got.profiles, with);
    prop_assert_eq!(got.without, profiles.len() as u32 - with);
    let lost: u64 = profiles
        .iter()
        .filter_map(|p| p.utilization.as_ref())
        .map(|u| u.lost)
        .sum();
    prop_assert_eq!(got.lost, lost);
    prop_assert_eq!(got.threshold, threshold);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn tree_equals_direct(
        seed in any::<u64>(), ranks in 0usize..100, rounds in 1usize..3, percent in 0u32..=100,
    ) {
        let spec = DataSpec::default();
        let base = Case::random(seed, ranks, rounds, &spec);
        let mut rng = Rng::new(seed ^ 0xb175);
        let bin_us = [1000, 500, 2000][rng.below(3)];
        let mut ids: Vec<u64> = spec.events.iter().map(|n| canopy_wire::event_id(n)).collect();
        ids.extend([OTHER, NAMELESS]);
        let mut profiles = base.profiles.clone();
        for p in profiles.iter_mut().flatten() {
            p.utilization = utilization(&mut rng, &ids, bin_us);
        }
        let c = Case::new(base.tree.clone(), base.placement.clone(), profiles, base.names.clone());
        let params = format!(r#"{{"threshold": {percent}}}"#);
        let out = c.run::<UtilizationFilter>(&params, seed ^ 0x5eed).unwrap();
        prop_assert!(out.rejects.is_empty(), "{:?}", out.rejects);
        prop_assert_eq!(out.results.len(), rounds);
        let names: HashMap<u64, String> = c.names.iter().cloned().collect();
        // 2.5 × percent, rounded half up: the halves are the only fractions.
        let threshold = (percent * 5).div_ceil(2);
        for r in 0..rounds {
            let got = UtilizationResult::decode(out.results[&(r as u64, 0)].as_slice()).unwrap();
            let what = format!("round {r} ({})", c.tree.describe());
            same(&got, &c.profiles[r], &names, threshold, bin_us, &what)?;
            prop_assert_eq!(got.raw_bytes, c.raw_bytes(r), "{}", what);
        }
    }

    #[test]
    fn arrival_order_and_tree_shape_do_not_change_a_byte(seed in any::<u64>(), ranks in 1usize..60) {
        let spec = DataSpec::default();
        let base = Case::random(seed, ranks, 1, &spec);
        let other_shape = Case::random(seed.wrapping_add(17), ranks, 1, &spec);
        let mut rng = Rng::new(seed);
        let ids = [OTHER, 7, 9, NAMELESS];
        let mut profiles = base.profiles.clone();
        for p in profiles.iter_mut().flatten() {
            p.utilization = utilization(&mut rng, &ids, 1000);
        }
        let a = Case::new(base.tree.clone(), base.placement.clone(), profiles.clone(), base.names.clone());
        let (tree, placement) = (other_shape.tree.clone(), other_shape.placement.clone());
        let b = Case::new(tree, placement, profiles, base.names.clone());
        let one = a.run::<UtilizationFilter>("", seed).unwrap().results;
        prop_assert_eq!(&one, &a.run::<UtilizationFilter>("", seed.wrapping_add(1)).unwrap().results);
        prop_assert_eq!(&one, &b.run::<UtilizationFilter>("", seed).unwrap().results);
    }
}
