//! The plugin as the daemons load it: `libcanopy_filter_nodes.so` through the C ABI, its descriptors defining its
//! result, and one round through a leaf, a relay and the root.

use canopy_filter_host::filter::{FilterFactory, Level};
use canopy_filter_host::plugin::PluginFilters;
use canopy_filter_proto::v1::{NodeSample, NodeSamples};
use canopy_filter_test::plugin::{filter_messages, search_path};
use prost::Message;

#[test]
fn the_shared_object_loads_and_describes_its_result() {
    let filters = PluginFilters::new(search_path());
    let info = filters.info("nodes").unwrap();
    assert!(
        info.path.ends_with("libcanopy_filter_nodes.so"),
        "{}",
        info.path.display()
    );
    assert_eq!(info.result_type, "canopy.filters.v1.NodeSamples");
    assert_eq!(info.phases, 1);
    let messages = filter_messages(&info.descriptors);
    for name in ["NodeSamples", "NodeSample", "CpuSample", "MemorySample"] {
        assert!(messages.iter().any(|m| m == name), "{name} not in {messages:?}");
    }
    assert!(filters.names().contains(&"nodes".to_string()));
}

#[test]
fn a_round_runs_through_the_shared_object() {
    let filters = PluginFilters::new(search_path());
    let bad = filters
        .create("nodes", r#"{"samplers": ["cpu"]}"#, Level::Leaf)
        .err()
        .unwrap()
        .to_string();
    assert!(
        bad.contains("unknown parameter \"samplers\" (known: none)"),
        "{bad}"
    );
    let node = |id: &str| {
        NodeSamples {
            nodes: vec![NodeSample {
                node_id: id.into(),
                ..Default::default()
            }],
        }
        .encode_to_vec()
    };
    let mut leaf_b = filters.create("nodes", "", Level::Leaf).unwrap();
    let mut leaf_a = filters.create("nodes", "", Level::Leaf).unwrap();
    let mut root = filters.create("nodes", "", Level::Root).unwrap();
    let b = leaf_b.upstream(0, 0, &[&node("b")]).unwrap();
    let a = leaf_a.upstream(0, 0, &[&node("a"), &[0xff]]).unwrap();
    assert_eq!(a.rejected.len(), 1);
    assert_eq!(a.rejected[0].0, 1);
    let merged = root
        .upstream(0, 0, &[&b.up[0].payload, &a.up[0].payload])
        .unwrap();
    let result = root.finalize(0, 0, &merged.up[0].payload).unwrap();
    let r = NodeSamples::decode(result.as_slice()).unwrap();
    let ids: Vec<&str> = r.nodes.iter().map(|n| n.node_id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
}
