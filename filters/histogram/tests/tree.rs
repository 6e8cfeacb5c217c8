//! The histogram filter over random trees equals a brute-force count over all ranks at once: per application by
//! default, over every application with `by_app: false`.

use canopy_filter_histogram::HistogramFilter;
use canopy_filter_proto::v1::HistogramResult;
use canopy_filter_test::reference::{self, AppKey};
use canopy_filter_test::{Case, DataSpec};
use proptest::prelude::*;
use prost::Message;

fn check(
    c: &Case,
    params: &str,
    seed: u64,
    bins: usize,
    cumulative: bool,
    by_app: bool,
) -> Result<usize, TestCaseError> {
    let out = c
        .run::<HistogramFilter>(params, seed)
        .map_err(TestCaseError::fail)?;
    prop_assert!(out.rejects.is_empty());
    prop_assert_eq!(
        out.results.len(),
        c.profiles.len(),
        "one result per round, from phase 2"
    );
    for r in 0..c.profiles.len() {
        let bytes = out
            .results
            .get(&(r as u64, 2))
            .ok_or_else(|| TestCaseError::fail("no phase 2 result"))?;
        let result = HistogramResult::decode(bytes.as_slice()).unwrap();
        let want = reference::samples_by_app(&c.profiles[r], cumulative, by_app);
        let keys: Vec<AppKey> = want.keys().cloned().collect();
        prop_assert_eq!(result.bins as usize, bins);
        prop_assert_eq!(result.raw_bytes, c.raw_bytes(r));
        prop_assert_eq!(
            &result
                .stats
                .iter()
                .map(|s| (s.app.clone(), s.id, s.metric))
                .collect::<Vec<_>>(),
            &keys
        );
        prop_assert_eq!(
            &result
                .histograms
                .iter()
                .map(|h| (h.app.clone(), h.id, h.metric))
                .collect::<Vec<_>>(),
            &keys
        );
        for (es, h) in result.stats.iter().zip(&result.histograms) {
            let what = format!(
                "round {r} {}/{:016x}/{} ({})",
                es.app,
                es.id,
                es.metric,
                c.tree.describe()
            );
            let values = &want[&(es.app.clone(), es.id, es.metric)];
            reference::check_summary(&what, es.summary.as_ref().unwrap(), values)
                .map_err(TestCaseError::fail)?;
            reference::check_histogram(&what, h, values, bins).map_err(TestCaseError::fail)?;
        }
    }
    Ok(out.max_open_rounds)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn tree_equals_brute_force(
        seed in any::<u64>(),
        ranks in 0usize..120,
        rounds in 1usize..5,
        bins in 1usize..=20,
        cumulative in any::<bool>(),
        apps in 1usize..4,
        by_app in any::<bool>(),
    ) {
        let c = Case::with_apps(seed, ranks, rounds, apps);
        let values = if cumulative { "cumulative" } else { "round" };
        let params = format!(r#"{{"bins": {bins}, "values": "{values}", "by_app": {by_app}}}"#);
        check(&c, &params, seed ^ 0xa11, bins, cumulative, by_app)?;
    }

    #[test]
    fn arrival_order_does_not_change_a_byte(seed in any::<u64>(), ranks in 0usize..80) {
        let c = Case::random(seed, ranks, 3, &DataSpec::default());
        let a = c.run::<HistogramFilter>("{}", seed).unwrap().results;
        let b = c.run::<HistogramFilter>("{}", seed.wrapping_add(1)).unwrap().results;
        prop_assert_eq!(a, b);
    }
}

/// The simulator really interleaves rounds here (round r + 1 starts before round r's phase 2), and the
/// results are still exact.
#[test]
fn pipelined_rounds_over_a_tree() {
    let mut pipelined = 0;
    for seed in 0..8u64 {
        let c = Case::random(seed, 60, 6, &DataSpec::default());
        let open = check(&c, r#"{"bins": 7}"#, seed, 7, false, true).unwrap();
        if open > 1 {
            pipelined += 1;
        }
    }
    assert!(pipelined >= 4, "only {pipelined} of 8 runs pipelined");
}
