//! Rank sets as sorted, coalesced ranges per application: a class of 10 000 ranks costs a few bytes.

use canopy_filter_proto::v1::RankRange;

/// Compresses a set of (app, rank) into sorted ranges (app, first, last inclusive); duplicates are fine.
pub fn compress<'a>(ranks: impl IntoIterator<Item = (&'a str, u32)>) -> Vec<RankRange> {
    let ranges: Vec<RankRange> = ranks
        .into_iter()
        .map(|(app, r)| RankRange {
            app: app.to_string(),
            first: r,
            last: r,
        })
        .collect();
    normalize(ranges)
}

/// The union of two range lists, sorted and coalesced.
pub fn merge(a: &[RankRange], b: &[RankRange]) -> Vec<RankRange> {
    normalize(a.iter().chain(b).cloned().collect())
}

/// Sorts by (app, first) and coalesces overlapping or adjacent ranges; a range given backwards is turned
/// around rather than dropped.
pub fn normalize(mut ranges: Vec<RankRange>) -> Vec<RankRange> {
    for r in &mut ranges {
        if r.first > r.last {
            std::mem::swap(&mut r.first, &mut r.last);
        }
    }
    ranges.sort_by(|x, y| (x.app.as_str(), x.first, x.last).cmp(&(y.app.as_str(), y.first, y.last)));
    let mut out: Vec<RankRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            // `last + 1` would overflow at u32::MAX; `first - 1` is reached only when first > last >= 0.
            Some(cur) if cur.app == r.app && (r.first <= cur.last || r.first - 1 == cur.last) => {
                cur.last = cur.last.max(r.last);
            }
            _ => out.push(r),
        }
    }
    out
}

/// How many ranks the (normalized) ranges hold.
pub fn count(ranges: &[RankRange]) -> u64 {
    ranges
        .iter()
        .map(|r| u64::from(r.last.saturating_sub(r.first)) + 1)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rr(app: &str, first: u32, last: u32) -> RankRange {
        RankRange {
            app: app.into(),
            first,
            last,
        }
    }

    #[test]
    fn compresses_runs_per_app() {
        let got = compress([
            ("b", 0),
            ("a", 3),
            ("a", 1),
            ("a", 2),
            ("a", 7),
            ("a", 2),
            ("b", 1),
        ]);
        assert_eq!(got, vec![rr("a", 1, 3), rr("a", 7, 7), rr("b", 0, 1)]);
        assert_eq!(count(&got), 6);
        assert!(compress(std::iter::empty()).is_empty());
    }

    #[test]
    fn merges_adjacent_and_overlapping() {
        let a = vec![rr("a", 0, 3), rr("a", 10, 12)];
        let b = vec![rr("a", 4, 5), rr("a", 11, 20), rr("c", 0, 0)];
        assert_eq!(merge(&a, &b), vec![rr("a", 0, 5), rr("a", 10, 20), rr("c", 0, 0)]);
        assert_eq!(merge(&b, &a), merge(&a, &b));
    }

    #[test]
    fn extremes_do_not_overflow() {
        let got = merge(
            &[rr("a", u32::MAX, u32::MAX)],
            &[rr("a", 0, 0), rr("a", u32::MAX - 1, u32::MAX - 1)],
        );
        assert_eq!(got, vec![rr("a", 0, 0), rr("a", u32::MAX - 1, u32::MAX)]);
        assert_eq!(count(&[rr("a", 0, u32::MAX)]), 1 << 32);
        assert_eq!(normalize(vec![rr("a", 5, 2)]), vec![rr("a", 2, 5)]);
    }
}
