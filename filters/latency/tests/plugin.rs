//! The plugin as the daemons load it: `libcanopy_filter_latency.so` through the C ABI, describing its result
//! and packet, refusing bad parameters with the reason, and carrying a step from a leaf of one application
//! through a relay to the root, which completes it a round later when another leaf's application stops it.

use canopy_filter_host::filter::{FilterFactory, FilterInstance, Level};
use canopy_filter_host::plugin::PluginFilters;
use canopy_filter_proto::v1::LatencyResult;
use canopy_filter_test::encode_one;
use canopy_filter_test::plugin::{filter_messages, search_path};
use canopy_wire::v1::{EventSample, RankProfile, StepMark};
use prost::Message;

fn create(filters: &PluginFilters, params: &str, level: Level) -> Box<dyn FilterInstance> {
    filters.create("latency", params, level).unwrap()
}

/// A rank of `app` with `MPI_Send` and `solve` exclusive times (µs) and these marks of "exchange".
fn profile(app: &str, rank: u32, send: f64, solve: f64, marks: &[(u64, bool, u64)]) -> Vec<u8> {
    let event = |name: &str, excl_us: f64| EventSample {
        event_id: canopy_wire::event_id(name),
        calls: 1,
        incl_us: excl_us,
        excl_us,
        ..Default::default()
    };
    encode_one(&RankProfile {
        app: app.into(),
        rank,
        events: vec![event("MPI_Send", send), event("solve", solve)],
        marks: marks
            .iter()
            .map(|&(step, stop, unix_ns)| StepMark {
                key_id: canopy_wire::event_id("exchange"),
                step,
                stop,
                unix_ns,
            })
            .collect(),
        ..Default::default()
    })
}

#[test]
fn the_shared_object_loads_and_describes_its_result() {
    let filters = PluginFilters::new(search_path());
    let info = filters.info("latency").unwrap();
    assert!(
        info.path.ends_with("libcanopy_filter_latency.so"),
        "{}",
        info.path.display()
    );
    assert_eq!(info.result_type, "canopy.filters.v1.LatencyResult");
    let messages = filter_messages(&info.descriptors);
    for name in [
        "LatencyResult",
        "StepLatency",
        "StepApp",
        "LatencyPacket",
        "LatencyStep",
        "LatencyApp",
    ] {
        assert!(messages.iter().any(|m| m == name), "{name} not in {messages:?}");
    }
    let bad = filters
        .create("latency", r#"{"transfer": "(MPI"}"#, Level::Leaf)
        .err()
        .unwrap()
        .to_string();
    assert!(bad.contains("transfer is not a regular expression"), "{bad}");
}

#[test]
fn a_step_crosses_a_relay_and_completes_a_round_later() {
    let filters = PluginFilters::new(search_path());
    let names: Vec<(u64, String)> = ["MPI_Send", "solve", "exchange"]
        .iter()
        .map(|n| (canopy_wire::event_id(n), n.to_string()))
        .collect();
    let mut leaves = [
        create(&filters, "{}", Level::Leaf),
        create(&filters, "{}", Level::Leaf),
    ];
    let mut relay = create(&filters, "{}", Level::Relay);
    let mut root = create(&filters, "{}", Level::Root);
    for f in leaves.iter_mut().chain([&mut relay, &mut root]) {
        f.names(&names);
    }
    // Round 0: the simulation (leaf 0) starts step 5 on two ranks; the analysis (leaf 1) has not seen it.
    // Round 1: the analysis stops it on rank 2, 40 µs after the earliest start.
    let rounds = [
        [
            vec![
                profile("sim", 0, 10.0, 100.0, &[(5, false, 1_000_000)]),
                profile("sim", 1, 30.0, 300.0, &[(5, false, 990_000)]),
            ],
            vec![profile("ana", 2, 0.0, 50.0, &[])],
        ],
        [
            vec![profile("sim", 0, 10.0, 100.0, &[])],
            vec![profile("ana", 2, 4.0, 40.0, &[(5, true, 1_030_000)])],
        ],
    ];
    let mut results = Vec::new();
    for (round, inputs) in rounds.iter().enumerate() {
        let round = round as u64;
        let ups: Vec<Vec<u8>> = leaves
            .iter_mut()
            .zip(inputs)
            .map(|(leaf, input)| {
                let slices: Vec<&[u8]> = input.iter().map(Vec::as_slice).collect();
                let out = leaf.upstream(round, 0, &slices).unwrap();
                assert!(out.rejected.is_empty(), "{:?}", out.rejected);
                out.up[0].payload.clone()
            })
            .collect();
        let slices: Vec<&[u8]> = ups.iter().map(Vec::as_slice).collect();
        let merged = relay.upstream(round, 0, &slices).unwrap();
        let top = root.upstream(round, 0, &[&merged.up[0].payload]).unwrap();
        let result = root.finalize(round, 0, &top.up[0].payload).unwrap();
        results.push(LatencyResult::decode(result.as_slice()).unwrap());
    }
    assert_eq!((results[0].steps.len(), results[0].open), (0, 1));
    assert_eq!(results[1].open, 0);
    let s = &results[1].steps[0];
    assert_eq!((s.step, s.latency_ns, s.starts, s.stops), (5, 40_000, 2, 1));
    assert_eq!(
        (
            s.start_app.as_str(),
            s.start_rank,
            s.stop_app.as_str(),
            s.stop_rank
        ),
        ("sim", 1, "ana", 2)
    );
    let apps: Vec<(&str, u32, f64, f64)> = s
        .apps
        .iter()
        .map(|a| (a.app.as_str(), a.ranks, a.transfer_us, a.compute_us))
        .collect();
    // The simulation's two ranks average (10 + 30) / 2 µs in MPI_Send and (100 + 300) / 2 in solve.
    assert_eq!(apps, [("ana", 1, 4.0, 40.0), ("sim", 2, 20.0, 200.0)]);
}
