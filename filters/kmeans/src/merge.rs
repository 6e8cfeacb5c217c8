//! Checking and merging the packets that go up, one function per kind: the bounding box (phase 0), an
//! iteration's sums and counts, and the last phase's clusters. A relay and the root merge the same way, and a
//! packet that cannot be merged is refused with what is wrong in it.

use canopy_filter_common::ranks;
use canopy_filter_proto::v1::{KmeansPacket, KmeansPart, KmeansRun, RankRef};

/// Where a list of ids first fails to increase.
pub fn check_dims(dims: &[u64]) -> Result<(), String> {
    match dims.windows(2).position(|w| w[1] <= w[0]) {
        Some(i) => Err(format!(
            "dimension {:#018x} at {} does not follow the previous one (sorted, each once)",
            dims[i + 1],
            i + 1
        )),
        None => Ok(()),
    }
}

/// The runs of a packet are the stream's ks, in order.
pub fn check_ks(p: &KmeansPacket, ks: &[u32]) -> Result<(), String> {
    let got: Vec<u32> = p.runs.iter().map(|r| r.k).collect();
    if got != ks {
        return Err(format!("runs for k {got:?}, this stream runs k {ks:?}"));
    }
    Ok(())
}

/// A phase 0 packet: dims sorted, one finite lo <= hi per dim, and no dims without ranks.
pub fn check_box(p: &KmeansPacket) -> Result<(), String> {
    check_dims(&p.dims)?;
    for (column, len) in [("lo", p.lo.len()), ("hi", p.hi.len())] {
        if len != p.dims.len() {
            return Err(format!(
                "column {column} has {len} entries for {} dimensions",
                p.dims.len()
            ));
        }
    }
    for (i, &id) in p.dims.iter().enumerate() {
        let (lo, hi) = (p.lo[i], p.hi[i]);
        if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
            return Err(format!(
                "dimension {id:#018x} has the range [{lo}, {hi}] (finite, lo <= hi)"
            ));
        }
    }
    if p.ranks == 0 && !p.dims.is_empty() {
        return Err(format!("{} dimensions without ranks", p.dims.len()));
    }
    Ok(())
}

fn min_total(a: f64, b: f64) -> f64 {
    if b.total_cmp(&a).is_lt() { b } else { a }
}

fn max_total(a: f64, b: f64) -> f64 {
    if b.total_cmp(&a).is_gt() { b } else { a }
}

/// Phase 0 packets as one: the union of their dims, each dim's box over every rank. A packet that lacks a dim
/// has ranks at 0 there, so 0 joins that dim's box.
pub fn merge_box(packets: &[KmeansPacket]) -> KmeansPacket {
    let mut dims: Vec<u64> = packets.iter().flat_map(|p| p.dims.iter().copied()).collect();
    dims.sort_unstable();
    dims.dedup();
    let mut out = KmeansPacket {
        ranks: packets.iter().fold(0u64, |n, p| n.saturating_add(p.ranks)),
        ..Default::default()
    };
    for &id in &dims {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for p in packets {
            let (l, h) = match p.dims.binary_search(&id) {
                Ok(i) => (p.lo[i], p.hi[i]),
                Err(_) if p.ranks > 0 => (0.0, 0.0),
                Err(_) => continue,
            };
            lo = min_total(lo, l);
            hi = max_total(hi, h);
        }
        out.dims.push(id);
        out.lo.push(lo);
        out.hi.push(hi);
    }
    out
}

/// An iteration's packet: the stream's runs, each with k sums of `dims` values, k counts adding up to the
/// packet's ranks, and no more changed ranks than ranks.
pub fn check_sums(p: &KmeansPacket, ks: &[u32], dims: usize) -> Result<(), String> {
    check_ks(p, ks)?;
    for r in &p.runs {
        let k = r.k as usize;
        if r.sums.len() != k * dims || r.counts.len() != k {
            return Err(format!(
                "k {}: {} sums and {} counts for {k} clusters of {dims} dimensions",
                r.k,
                r.sums.len(),
                r.counts.len()
            ));
        }
        if let Some(bad) = r.sums.iter().find(|s| !s.is_finite()) {
            return Err(format!("k {}: the sum {bad} is not finite", r.k));
        }
        let n = r.counts.iter().fold(0u64, |n, c| n.saturating_add(*c));
        if n != p.ranks || r.changed > p.ranks {
            return Err(format!(
                "k {}: counts add up to {n} and {} changed, of {} ranks",
                r.k, r.changed, p.ranks
            ));
        }
    }
    Ok(())
}

/// Iteration packets as one: sums, counts and changed ranks added.
pub fn merge_sums(packets: &[KmeansPacket], ks: &[u32], dims: usize) -> KmeansPacket {
    let mut out = KmeansPacket {
        ranks: packets.iter().fold(0u64, |n, p| n.saturating_add(p.ranks)),
        runs: ks
            .iter()
            .map(|&k| KmeansRun {
                k,
                sums: vec![0.0; k as usize * dims],
                counts: vec![0; k as usize],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    for p in packets {
        for (sum, add) in out.runs.iter_mut().zip(&p.runs) {
            for (s, a) in sum.sums.iter_mut().zip(&add.sums) {
                *s += a;
            }
            for (c, a) in sum.counts.iter_mut().zip(&add.counts) {
                *c = c.saturating_add(*a);
            }
            sum.changed = sum.changed.saturating_add(add.changed);
        }
    }
    out
}

/// The last phase's packet: the stream's runs, each with k clusters whose size is their ranks' count, with a
/// representative exactly when not empty, and distances that are finite and not negative.
pub fn check_parts(p: &KmeansPacket, ks: &[u32]) -> Result<(), String> {
    check_ks(p, ks)?;
    for r in &p.runs {
        if r.clusters.len() != r.k as usize {
            return Err(format!("k {}: {} clusters", r.k, r.clusters.len()));
        }
        for (c, part) in r.clusters.iter().enumerate() {
            let at = format!("k {} cluster {c}", r.k);
            if ranks::normalize(part.ranks.clone()) != part.ranks || ranks::count(&part.ranks) != part.size {
                return Err(format!(
                    "{at}: ranks not sorted and coalesced, or not {} of them",
                    part.size
                ));
            }
            if part.representative.is_some() != (part.size > 0) {
                return Err(format!(
                    "{at}: a representative only when not empty, size {}",
                    part.size
                ));
            }
            for (what, v) in [
                ("representative_d2", part.representative_d2),
                ("sum_d2", part.sum_d2),
                ("max_d2", part.max_d2),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(format!("{at}: {what} is {v} (finite, not negative)"));
                }
            }
        }
    }
    Ok(())
}

/// Whether representative `a` (at squared distance `da`) is preferred to `b`: nearer, then lower app, then
/// lower rank.
fn prefer(a: &RankRef, da: f64, b: &RankRef, db: f64) -> bool {
    da.total_cmp(&db)
        .then_with(|| (a.app.as_str(), a.rank).cmp(&(b.app.as_str(), b.rank)))
        .is_lt()
}

/// Several parts of one cluster as one.
pub fn merge_part(into: &mut KmeansPart, part: &KmeansPart) {
    if let Some(rep) = &part.representative {
        let better = match &into.representative {
            None => true,
            Some(cur) => prefer(rep, part.representative_d2, cur, into.representative_d2),
        };
        if better {
            into.representative = Some(rep.clone());
            into.representative_d2 = part.representative_d2;
        }
    }
    into.ranks = ranks::merge(&into.ranks, &part.ranks);
    into.size = into.size.saturating_add(part.size);
    into.sum_d2 += part.sum_d2;
    into.max_d2 = into.max_d2.max(part.max_d2);
}

/// Last-phase packets as one: each run's clusters merged.
pub fn merge_parts(packets: &[KmeansPacket], ks: &[u32]) -> KmeansPacket {
    let mut out = KmeansPacket {
        ranks: packets.iter().fold(0u64, |n, p| n.saturating_add(p.ranks)),
        runs: ks
            .iter()
            .map(|&k| KmeansRun {
                k,
                clusters: vec![KmeansPart::default(); k as usize],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    for p in packets {
        for (into, add) in out.runs.iter_mut().zip(&p.runs) {
            for (c, part) in into.clusters.iter_mut().zip(&add.clusters) {
                merge_part(c, part);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boxed(dims: &[u64], lo: &[f64], hi: &[f64], ranks: u64) -> KmeansPacket {
        KmeansPacket {
            dims: dims.to_vec(),
            lo: lo.to_vec(),
            hi: hi.to_vec(),
            ranks,
            ..Default::default()
        }
    }

    #[test]
    fn a_missing_dimension_counts_as_zero_unless_the_packet_has_no_ranks() {
        let a = boxed(&[1, 2], &[3.0, -1.0], &[4.0, 2.0], 2);
        let b = boxed(&[2, 5], &[5.0, 6.0], &[7.0, 8.0], 1);
        let none = boxed(&[], &[], &[], 0);
        let m = merge_box(&[a, b, none]);
        assert_eq!(m.dims, [1, 2, 5]);
        assert_eq!(m.lo, [0.0, -1.0, 0.0]);
        assert_eq!(m.hi, [4.0, 7.0, 8.0]);
        assert_eq!(m.ranks, 3);
    }

    #[test]
    fn malformed_packets_are_named() {
        assert!(
            check_box(&boxed(&[2, 1], &[0.0; 2], &[0.0; 2], 1))
                .unwrap_err()
                .contains("sorted")
        );
        assert_eq!(
            check_box(&boxed(&[1], &[2.0], &[1.0], 1)).unwrap_err(),
            "dimension 0x0000000000000001 has the range [2, 1] (finite, lo <= hi)"
        );
        let p = KmeansPacket {
            ranks: 2,
            runs: vec![KmeansRun {
                k: 2,
                sums: vec![0.0; 2],
                counts: vec![1, 0],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            check_sums(&p, &[3], 1).unwrap_err(),
            "runs for k [2], this stream runs k [3]"
        );
        assert_eq!(
            check_sums(&p, &[2], 1).unwrap_err(),
            "k 2: counts add up to 1 and 0 changed, of 2 ranks"
        );
        assert_eq!(
            check_sums(&p, &[2], 2).unwrap_err(),
            "k 2: 2 sums and 2 counts for 2 clusters of 2 dimensions"
        );
    }

    #[test]
    fn the_representative_is_the_nearest_then_the_lowest_rank() {
        let part = |rank: u32, d2: f64| KmeansPart {
            ranks: ranks::compress([("a", rank)]),
            size: 1,
            representative: Some(RankRef {
                app: "a".into(),
                rank,
            }),
            representative_d2: d2,
            sum_d2: d2,
            max_d2: d2,
        };
        let mut m = KmeansPart::default();
        for p in [part(5, 1.0), part(3, 1.0), part(9, 2.0), part(4, 1.0)] {
            merge_part(&mut m, &p);
        }
        assert_eq!(m.representative.unwrap().rank, 3);
        assert_eq!((m.size, m.sum_d2, m.max_d2), (4, 5.0, 2.0));
        assert_eq!(m.ranks.len(), 2);
    }
}
