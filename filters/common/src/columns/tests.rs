use super::*;
use proptest::prelude::*;

fn r(app: &str, rank: u32) -> RankRef {
    RankRef {
        app: app.into(),
        rank,
    }
}

/// A leaf's map of `values`: (id, metric, value, app, rank).
fn map_of(values: &[(u64, i32, f64, &str, u32)]) -> StatsMap {
    let mut m = StatsMap::new();
    for &(id, metric, v, app, rank) in values {
        m.add((id, metric), v, &r(app, rank));
    }
    m
}

fn columns_of(m: &StatsMap, raw: u64) -> StatsColumns {
    let mut c = StatsColumns::default();
    from_map(m, raw, &mut c);
    c
}

#[test]
fn a_leaf_map_round_trips_through_columns() {
    let m = map_of(&[
        (9, 1, 3.0, "b", 4),
        (2, 3, 1.0, "a", 0),
        (2, 3, 5.0, "b", 1),
        (2, 1, 2.0, "a", 7),
    ]);
    let c = columns_of(&m, 77);
    check(&c).unwrap();
    assert_eq!(c.apps, vec!["a".to_string(), "b".to_string()]);
    assert_eq!(c.raw_bytes, 77);
    assert_eq!(to_stats(&c), m.to_final_stats());
}

#[test]
fn ties_go_to_the_smallest_app_then_rank_across_inputs() {
    let a = columns_of(&map_of(&[(1, 1, 2.0, "b", 0), (1, 1, 9.0, "b", 3)]), 0);
    let b = columns_of(&map_of(&[(1, 1, 2.0, "a", 5), (1, 1, 9.0, "a", 8)]), 0);
    let mut out = StatsColumns::default();
    for order in [[&a, &b], [&b, &a]] {
        merge(&order, &mut out);
        let s = to_stats(&out)[0].summary.clone().unwrap();
        assert_eq!((s.min_rank.unwrap(), s.max_rank.unwrap()), (r("a", 5), r("a", 8)));
    }
}

#[test]
fn counts_saturate_and_tables_keep_only_the_applications_still_named() {
    let mut a = columns_of(&map_of(&[(1, 1, 2.0, "a", 0)]), 0);
    a.count[0] = u64::MAX;
    let b = columns_of(
        &map_of(&[(1, 1, 1.0, "b", 0), (1, 1, 3.0, "b", 1), (2, 1, 1.0, "c", 0)]),
        0,
    );
    let mut out = StatsColumns::default();
    merge(&[&a, &b], &mut out);
    check(&out).unwrap();
    assert_eq!(out.count, vec![u64::MAX, 1]);
    // "a" lost both extremes of key 1 to "b"; only "b" and "c" are named.
    assert_eq!(out.apps, vec!["b".to_string(), "c".to_string()]);
    assert_eq!(
        (out.min_app.clone(), out.max_app.clone()),
        (vec![0, 1], vec![0, 1])
    );
}

#[test]
fn bad_packets_are_named() {
    let good = columns_of(&map_of(&[(1, 1, 2.0, "a", 0), (2, 1, 2.0, "a", 0)]), 0);
    let mut short = good.clone();
    short.mean.pop();
    assert_eq!(
        check(&short).unwrap_err().to_string(),
        "column mean has 1 entries for 2 rows"
    );
    let mut unsorted = good.clone();
    unsorted.id.swap(0, 1);
    assert_eq!(
        check(&unsorted).unwrap_err().to_string(),
        "row 1: key (0x1, 1) does not follow the previous row's (rows must be sorted, each key once)"
    );
    let mut app = good.clone();
    app.max_app[1] = 3;
    assert_eq!(
        check(&app).unwrap_err().to_string(),
        "row 1: application index 3 is outside the table of 1"
    );
    let mut empty = good;
    empty.count[0] = 0;
    assert_eq!(
        check(&empty).unwrap_err().to_string(),
        "row 0: count is 0 (a row stands for at least one value)"
    );
}

/// A leaf's columns broken down by application, of `values`: (id, metric, value, app, rank).
fn by_app_of(values: &[(u64, i32, f64, &str, u32)]) -> StatsColumns {
    let mut fold = crate::fold::Fold::default().by_app(true);
    for &(id, metric, v, app, rank) in values {
        let mut at = fold.rank(app, rank);
        fold.add(&mut at, (id, metric), v);
    }
    let mut c = StatsColumns::default();
    fold.to_columns(0, &mut c);
    c
}

#[test]
fn bad_application_columns_are_named() {
    let good = by_app_of(&[(1, 1, 2.0, "a", 0), (2, 1, 2.0, "a", 0), (1, 1, 5.0, "b", 3)]);
    check(&good).unwrap();
    assert_eq!(good.app, vec![0, 0, 1]);
    let mut short = good.clone();
    short.app.pop();
    assert_eq!(
        check(&short).unwrap_err().to_string(),
        "column app has 2 entries for 3 rows"
    );
    let mut outside = good.clone();
    outside.app[2] = 2;
    assert_eq!(
        check(&outside).unwrap_err().to_string(),
        "row 2: application index 2 is outside the table of 2"
    );
    // Application "b" before "a": the keys go down.
    let mut unsorted = good.clone();
    unsorted.app = vec![1, 0, 0];
    assert_eq!(
        check(&unsorted).unwrap_err().to_string(),
        "row 1: key (application 0, 0x2, 1) does not follow the previous row's (rows must be sorted by \
         application, id and metric, each key once)"
    );
    let mut twice = good.clone();
    twice.app = vec![0, 0, 0];
    twice.id = vec![1, 2, 2];
    assert!(matches!(
        check(&twice).unwrap_err(),
        ColumnsError::Order {
            row: 2,
            app: Some(0),
            id: 2,
            metric: 1
        }
    ));
    let mut table = good.clone();
    table.apps.swap(0, 1);
    assert_eq!(
        check(&table).unwrap_err().to_string(),
        "apps: entry 1 \"a\" does not follow \"b\" (the application table must be sorted, each name once)"
    );
    // Whether rows are broken down is the stream's choice; a packet without rows fits either.
    assert!(check_breakdown(&good, true).is_ok());
    assert_eq!(
        check_breakdown(&good, false).unwrap_err().to_string(),
        "the stream does not break rows down by application (by_app: false), but the packet has an app column"
    );
    let flat = columns_of(&map_of(&[(1, 1, 2.0, "a", 0)]), 0);
    assert_eq!(
        check_breakdown(&flat, true).unwrap_err().to_string(),
        "the stream breaks rows down by application (by_app), but the packet has rows and no app column"
    );
    assert!(check_breakdown(&StatsColumns::default(), true).is_ok());
}

proptest! {
    /// Merging columns broken down by application gives, bit for bit, each application's summaries merged
    /// apart, whatever applications each input holds: each input's indices map into the merged table.
    #[test]
    fn merging_by_application_is_merging_each_application_apart(
        inputs in prop::collection::vec(
            prop::collection::vec((0u64..6, 1i32..4, -5i32..5, 0usize..4, 0u32..9), 0..20),
            1..6,
        )
    ) {
        let apps = ["w", "x", "y", "z"];
        let mut per_app: std::collections::BTreeMap<&str, StatsMap> = Default::default();
        let cols: Vec<StatsColumns> = inputs
            .iter()
            .map(|values| {
                let values: Vec<_> = values
                    .iter()
                    .map(|&(id, metric, v, app, rank)| (id, metric, f64::from(v) * 0.25, apps[app], rank))
                    .collect();
                // The same input's per-application maps, merged in input order.
                let mut mine: std::collections::BTreeMap<&str, StatsMap> = Default::default();
                for &(id, metric, v, app, rank) in &values {
                    mine.entry(app).or_default().add((id, metric), v, &r(app, rank));
                }
                for (app, m) in mine {
                    per_app.entry(app).or_default().merge_stats(&m.to_stats());
                }
                by_app_of(&values)
            })
            .collect();
        let refs: Vec<&StatsColumns> = cols.iter().collect();
        let mut out = StatsColumns::default();
        merge(&refs, &mut out);
        prop_assert!(check(&out).is_ok());
        prop_assert!(check_breakdown(&out, true).is_ok());
        let expected: Vec<EventStats> = per_app
            .iter()
            .flat_map(|(app, m)| {
                m.to_final_stats().into_iter().map(|mut s| {
                    s.app = app.to_string();
                    s
                })
            })
            .collect();
        prop_assert_eq!(to_stats(&out), expected);
    }
}

proptest! {
    /// Merging columns gives, bit for bit, what merging the same summaries as messages gives, whatever
    /// keys each input holds.
    #[test]
    fn merging_columns_is_merging_summaries(
        inputs in prop::collection::vec(
            prop::collection::vec((0u64..6, 1i32..4, -5i32..5, 0usize..3, 0u32..9), 0..20),
            1..6,
        )
    ) {
        let apps = ["x", "y", "z"];
        let maps: Vec<StatsMap> = inputs
            .iter()
            .map(|values| {
                let mut m = StatsMap::new();
                for &(id, metric, v, app, rank) in values {
                    m.add((id, metric), f64::from(v) * 0.25, &r(apps[app], rank));
                }
                m
            })
            .collect();
        let cols: Vec<StatsColumns> = maps.iter().map(|m| columns_of(m, 3)).collect();
        for c in &cols {
            prop_assert!(check(c).is_ok());
        }
        let refs: Vec<&StatsColumns> = cols.iter().collect();
        let mut out = StatsColumns::default();
        merge(&refs, &mut out);
        prop_assert!(check(&out).is_ok());
        prop_assert_eq!(out.raw_bytes, 3 * cols.len() as u64);
        // The same packets merged as Summary messages, in the same order.
        let mut expected = StatsMap::new();
        for m in &maps {
            expected.merge_stats(&m.to_stats());
        }
        prop_assert_eq!(to_stats(&out), expected.to_final_stats());
    }
}

proptest! {
    /// Inputs with the same keys in the same rows (every child reporting the same events) merge, bit for
    /// bit, as the general pass over the smallest keys merges them, with rows by application or not.
    #[test]
    fn aligned_inputs_merge_as_the_general_pass_does(
        keys in prop::collection::btree_set((0u64..50, 1i32..4, 0usize..3), 1..30),
        inputs in prop::collection::vec(prop::collection::vec((-5i32..5, 0u32..9, 0usize..3), 1..4), 2..5),
        by_app in any::<bool>(),
    ) {
        let apps = ["x", "y", "z"];
        let cols: Vec<StatsColumns> = inputs
            .iter()
            .map(|values| {
                // Every key, each with the input's values, from ranks of its application (by application)
                // or of any (not).
                let rows: Vec<_> = keys
                    .iter()
                    .flat_map(|&(id, metric, app)| {
                        values.iter().map(move |&(v, rank, other)| {
                            let app = if by_app { app } else { other };
                            (id, metric, f64::from(v) * 0.25, apps[app], rank)
                        })
                    })
                    .collect();
                if by_app { by_app_of(&rows) } else { columns_of(&map_of(&rows), 1) }
            })
            .collect();
        let refs: Vec<&StatsColumns> = cols.iter().collect();
        let (mut fast, mut general) = (StatsColumns::default(), StatsColumns::default());
        merge_rows(&refs, None, &mut fast, true);
        merge_rows(&refs, None, &mut general, false);
        prop_assert!(check(&fast).is_ok());
        prop_assert_eq!(fast, general);
    }
}

/// A row without values (which no leaf makes, but a packet may carry) merges aligned as in the general
/// pass: it adds nothing, first or not.
#[test]
fn aligned_rows_without_values_merge_as_the_general_pass_does() {
    let rows = [(1, 1, 2.0, "x", 0), (1, 2, -1.0, "x", 3), (4, 1, 0.5, "y", 2)];
    let mut a = columns_of(&map_of(&rows), 1);
    let b = columns_of(&map_of(&rows), 1);
    a.count[1] = 0;
    a.min[1] = -7.0;
    for inputs in [[&a, &b], [&b, &a]] {
        let (mut fast, mut general) = (StatsColumns::default(), StatsColumns::default());
        merge_rows(&inputs, None, &mut fast, true);
        merge_rows(&inputs, None, &mut general, false);
        assert_eq!(fast, general);
        assert_eq!(fast.count, [2, 1, 2]);
        assert_eq!(fast.min[1], -1.0);
    }
    // In no input: the row stays as empty as the general pass leaves it.
    let (mut fast, mut general) = (StatsColumns::default(), StatsColumns::default());
    merge_rows(&[&a, &a], None, &mut fast, true);
    merge_rows(&[&a, &a], None, &mut general, false);
    assert_eq!(fast, general);
    assert_eq!(fast.count, [2, 0, 2]);
}
