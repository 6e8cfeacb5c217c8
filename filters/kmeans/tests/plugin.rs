//! The plugin as the daemons load it: `libcanopy_filter_kmeans.so` through the C ABI, with its phases, its
//! descriptors defining its result and packet, and a refusal of bad parameters with the reason.

use canopy_filter_host::filter::{FilterFactory, Level};
use canopy_filter_host::plugin::PluginFilters;
use canopy_filter_kmeans::PHASES;
use canopy_filter_test::plugin::{filter_messages, search_path};

#[test]
fn the_shared_object_loads_and_describes_its_result() {
    let filters = PluginFilters::new(search_path());
    let info = filters.info("kmeans").unwrap();
    assert!(
        info.path.ends_with("libcanopy_filter_kmeans.so"),
        "{}",
        info.path.display()
    );
    assert_eq!(info.result_type, "canopy.filters.v1.KmeansResult");
    assert_eq!((info.phases, PHASES), (203, 203));
    let messages = filter_messages(&info.descriptors);
    for name in ["KmeansResult", "KmeansPacket", "KmeansCluster", "KmeansFit"] {
        assert!(messages.iter().any(|m| m == name), "{name} not in {messages:?}");
    }
    let bad = filters
        .create("kmeans", r#"{"k": "many"}"#, Level::Root)
        .err()
        .unwrap()
        .to_string();
    assert!(
        bad.contains(r#"k must be an integer between 1 and 256 or "auto", got "many""#),
        "{bad}"
    );
    assert!(filters.create("kmeans", r#"{"k": 4}"#, Level::Relay).is_ok());
}
