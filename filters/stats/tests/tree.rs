//! The stats filter over random trees equals the same statistics computed directly over all ranks at once:
//! per application by default, over every application with `by_app: false`.

use std::collections::BTreeMap;

use canopy_filter_proto::v1::StatsResult;
use canopy_filter_stats::StatsFilter;
use canopy_filter_test::reference::{self, AppKey};
use canopy_filter_test::{Case, DataSpec};
use proptest::prelude::*;
use prost::Message;

fn run(c: &Case, params: &str, seed: u64) -> BTreeMap<(u64, u32), Vec<u8>> {
    let out = c.run::<StatsFilter>(params, seed).unwrap();
    assert!(out.rejects.is_empty());
    out.results
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn tree_equals_direct(
        seed in any::<u64>(),
        ranks in 0usize..120,
        rounds in 1usize..4,
        cumulative in any::<bool>(),
        apps in 1usize..4,
        by_app in any::<bool>(),
    ) {
        let c = Case::with_apps(seed, ranks, rounds, apps);
        let values = if cumulative { "cumulative" } else { "round" };
        let params = format!(r#"{{"values": "{values}", "by_app": {by_app}}}"#);
        let results = run(&c, &params, seed ^ 0x5eed);
        prop_assert_eq!(results.len(), rounds, "one result per round");
        for r in 0..rounds {
            let result = StatsResult::decode(results[&(r as u64, 0)].as_slice()).unwrap();
            let want = reference::samples_by_app(&c.profiles[r], cumulative, by_app);
            prop_assert_eq!(result.raw_bytes, c.raw_bytes(r));
            let keys: Vec<AppKey> = result.stats.iter().map(|s| (s.app.clone(), s.id, s.metric)).collect();
            prop_assert_eq!(&keys, &want.keys().cloned().collect::<Vec<_>>(), "keys, sorted ({})", c.tree.describe());
            for es in &result.stats {
                let what = format!("round {r} {}/{:016x}/{}", es.app, es.id, es.metric);
                let values = &want[&(es.app.clone(), es.id, es.metric)];
                reference::check_summary(&what, es.summary.as_ref().unwrap(), values)
                    .map_err(TestCaseError::fail)?;
            }
        }
    }

    #[test]
    fn arrival_order_does_not_change_a_byte(seed in any::<u64>(), ranks in 0usize..80) {
        let c = Case::random(seed, ranks, 3, &DataSpec::default());
        let a = run(&c, "{}", seed);
        let b = run(&c, "{}", seed.wrapping_add(1));
        prop_assert_eq!(a, b);
    }
}
