//! The top of a group: ranks by score descending, then app, then rank, so every tree keeps the same ranks, and
//! lists merged level by level keeping `keep`.

use std::cmp::Ordering;

use canopy_filter_proto::v1::Outlier;

/// The order of a top list: the highest score first; a tie goes to the smaller (app, rank).
pub fn order(a: &Outlier, b: &Outlier) -> Ordering {
    b.score
        .total_cmp(&a.score)
        .then_with(|| a.app.cmp(&b.app))
        .then(a.rank.cmp(&b.rank))
}

/// The first `keep` of `list` in [`order`], sorted.
pub fn select(list: Vec<Outlier>, keep: usize) -> Vec<Outlier> {
    select_by(list, keep, |o| o)
}

/// The first `keep` of `list` in the [`order`] of the outliers `of` gives, sorted.
pub fn select_by<T>(mut list: Vec<T>, keep: usize, of: impl Fn(&T) -> &Outlier) -> Vec<T> {
    if keep == 0 {
        return Vec::new();
    }
    let by = |a: &T, b: &T| order(of(a), of(b));
    if list.len() > keep {
        list.select_nth_unstable_by(keep - 1, by);
        list.truncate(keep);
    }
    list.sort_by(by);
    list
}

/// Refuses a top list this node cannot merge: longer than its `keep`, out of order, a rank twice, a score or
/// contribution that is not a finite non-negative number, more events than the stream reports.
pub fn check(top: &[Outlier], keep: u32, top_events: u32) -> Result<(), String> {
    if top.len() > keep as usize {
        return Err(format!("{} ranks in a top of {keep}", top.len()));
    }
    for (i, o) in top.iter().enumerate() {
        if !(o.score.is_finite() && o.score >= 0.0) {
            return Err(format!("rank {}:{} has the score {}", o.app, o.rank, o.score));
        }
        if o.events.len() > top_events as usize {
            return Err(format!(
                "rank {}:{} has {} events, the stream reports {top_events}",
                o.app,
                o.rank,
                o.events.len()
            ));
        }
        if let Some(e) = o
            .events
            .iter()
            .find(|e| !(e.contribution.is_finite() && e.contribution >= 0.0))
        {
            return Err(format!(
                "rank {}:{}: event {:#018x} has the contribution {}",
                o.app, o.rank, e.id, e.contribution
            ));
        }
        if i > 0 && order(&top[i - 1], o) != Ordering::Less {
            return Err(format!(
                "rank {}:{} at {i} does not follow the previous one (score descending, then app, then rank; \
                 each rank once)",
                o.app, o.rank
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(app: &str, rank: u32, score: f64) -> Outlier {
        Outlier {
            app: app.into(),
            rank,
            score,
            events: Vec::new(),
        }
    }

    #[test]
    fn ties_go_to_the_smaller_app_then_rank() {
        let list = vec![
            o("b", 0, 1.0),
            o("a", 5, 1.0),
            o("a", 2, 1.0),
            o("c", 9, 3.0),
            o("a", 1, 0.5),
        ];
        let kept = select(list.clone(), 3);
        let keys: Vec<(&str, u32)> = kept.iter().map(|o| (o.app.as_str(), o.rank)).collect();
        assert_eq!(keys, [("c", 9), ("a", 2), ("a", 5)]);
        assert_eq!(select(list.clone(), 10).len(), 5);
        assert!(select(list, 0).is_empty());
        assert_eq!(check(&kept, 3, 0), Ok(()));
    }

    #[test]
    fn malformed_lists_are_refused_by_name() {
        assert_eq!(
            check(&[o("a", 1, 2.0), o("a", 0, 1.0)], 1, 3).unwrap_err(),
            "2 ranks in a top of 1"
        );
        assert_eq!(
            check(&[o("a", 1, 1.0), o("a", 0, 2.0)], 5, 3).unwrap_err(),
            "rank a:0 at 1 does not follow the previous one (score descending, then app, then rank; each rank \
             once)"
        );
        assert!(check(&[o("a", 1, 1.0), o("a", 1, 1.0)], 5, 3).is_err());
        assert_eq!(
            check(&[o("a", 1, f64::NAN)], 5, 3).unwrap_err(),
            "rank a:1 has the score NaN"
        );
    }
}
