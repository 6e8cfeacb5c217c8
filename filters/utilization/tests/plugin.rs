//! The plugin as the daemons load it: `libcanopy_filter_utilization.so` through the C ABI, its descriptors
//! defining its result and its packet, and one round through a leaf and the root.

use canopy_filter_host::filter::{FilterFactory, Level};
use canopy_filter_host::plugin::PluginFilters;
use canopy_filter_proto::v1::UtilizationResult;
use canopy_filter_test::plugin::{filter_messages, search_path};
use canopy_wire::v1::{RankProfile, Utilization};
use prost::Message;

#[test]
fn the_shared_object_loads_and_describes_its_result() {
    let filters = PluginFilters::new(search_path());
    let info = filters.info("utilization").unwrap();
    assert!(
        info.path.ends_with("libcanopy_filter_utilization.so"),
        "{}",
        info.path.display()
    );
    assert_eq!(info.result_type, "canopy.filters.v1.UtilizationResult");
    assert_eq!(info.phases, 1);
    let messages = filter_messages(&info.descriptors);
    for name in ["UtilizationResult", "UtilizationPacket"] {
        assert!(messages.iter().any(|m| m == name), "{name} not in {messages:?}");
    }
    assert!(filters.names().contains(&"utilization".to_string()));
}

#[test]
fn a_round_runs_through_the_shared_object() {
    let filters = PluginFilters::new(search_path());
    let bad = filters
        .create("utilization", r#"{"threshold": 200}"#, Level::Leaf)
        .err()
        .unwrap()
        .to_string();
    assert!(
        bad.contains("threshold must be between 0 and 100, got 200"),
        "{bad}"
    );
    let mut leaf = filters.create("utilization", "", Level::Leaf).unwrap();
    let mut root = filters.create("utilization", "", Level::Root).unwrap();
    root.names(&[(7, "solve".to_string())]);
    let profile = |rank: u32, share: u32| {
        canopy_filter_test::encode_one(&RankProfile {
            app: "a".into(),
            rank,
            utilization: Some(Utilization {
                start_unix_ns: 1_000_000_000,
                bin_us: 1000,
                activities: vec![7],
                counts: vec![1],
                activity: vec![0],
                share: vec![share],
                threads: 1,
                ..Default::default()
            }),
            ..Default::default()
        })
    };
    let (a, b) = (profile(0, 200), profile(1, 101));
    let up = leaf.upstream(0, 0, &[&a, &b, &[0xff]]).unwrap();
    assert_eq!(up.rejected.len(), 1);
    assert_eq!(up.rejected[0].0, 2);
    let merged = root.upstream(0, 0, &[&up.up[0].payload]).unwrap();
    let result = root.finalize(0, 0, &merged.up[0].payload).unwrap();
    let r = UtilizationResult::decode(result.as_slice()).unwrap();
    assert_eq!((r.activities, r.names), (vec![7], vec!["solve".to_string()]));
    // (200 + 101) / 2 = 150.5, rounded half up.
    assert_eq!((r.share, r.ranks, r.profiles), (vec![151], vec![2], 2));
}
