//! The plugin as the daemons load it: `libcanopy_filter_outliers.so` through the C ABI, its descriptors
//! defining its result and its packet; one round through two leaves, a relay and the root, where the slow
//! rank comes out on top; malformed packets rejected with their reason; bad parameters refused by name.

use canopy_filter_host::filter::{FilterFactory, FilterInstance, Level};
use canopy_filter_host::plugin::PluginFilters;
use canopy_filter_proto::v1::{Metric, Outlier, OutlierGroup, OutliersPacket, OutliersResult};
use canopy_filter_test::plugin::{filter_messages, search_path};
use canopy_wire::v1::{EventSample, RankProfile};
use prost::Message;

fn profile(rank: u32, times: &[(&str, f64)]) -> Vec<u8> {
    canopy_filter_test::encode_one(&RankProfile {
        app: "a".into(),
        rank,
        events: times
            .iter()
            .map(|(name, t)| EventSample {
                event_id: canopy_wire::event_id(name),
                calls: 1,
                incl_us: *t,
                excl_us: *t,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    })
}

fn create(filters: &PluginFilters, params: &str, level: Level) -> Box<dyn FilterInstance> {
    let mut f = filters.create("outliers", params, level).unwrap();
    f.names(&[
        (canopy_wire::event_id("solve"), "solve".into()),
        (canopy_wire::event_id("MPI_Wait"), "MPI_Wait".into()),
    ]);
    f
}

#[test]
fn the_shared_object_loads_and_describes_its_result() {
    let filters = PluginFilters::new(search_path());
    let info = filters.info("outliers").unwrap();
    assert!(
        info.path.ends_with("libcanopy_filter_outliers.so"),
        "{}",
        info.path.display()
    );
    assert_eq!(info.result_type, "canopy.filters.v1.OutliersResult");
    assert_eq!(info.phases, 3);
    let messages = filter_messages(&info.descriptors);
    for name in [
        "OutliersResult",
        "OutliersPacket",
        "OutlierGroup",
        "Outlier",
        "OutlierEvent",
    ] {
        assert!(messages.iter().any(|m| m == name), "{name} not in {messages:?}");
    }
}

#[test]
fn bad_params_are_refused_by_name() {
    let filters = PluginFilters::new(search_path());
    for (params, why) in [
        (r#"{"k": 0}"#, "k must be between 1 and 10000, got 0"),
        (
            r#"{"fraction": 2}"#,
            "fraction must be above 0 and at most 1, got 2",
        ),
        (
            r#"{"k": 2, "fraction": 0.5}"#,
            "k and fraction exclude each other: give one",
        ),
        (
            r#"{"within": "rack"}"#,
            "within must be one of \"all\", \"class\", got \"rack\"",
        ),
    ] {
        let err = filters
            .create("outliers", params, Level::Leaf)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains(why), "{params}: {err}");
    }
}

/// Two leaves under a relay under the root: ranks 0 to 3 on the first leaf, 4 to 7 on the second; rank 6 is
/// three times slower in `solve` than the others, and every rank waits as long in `MPI_Wait`.
#[test]
fn a_round_through_leaves_a_relay_and_the_root_finds_the_slow_rank() {
    let filters = PluginFilters::new(search_path());
    let params = r#"{"k": 2}"#;
    let mut leaves = [
        create(&filters, params, Level::Leaf),
        create(&filters, params, Level::Leaf),
    ];
    let mut relay = create(&filters, params, Level::Relay);
    let mut root = create(&filters, params, Level::Root);
    let inputs: Vec<Vec<Vec<u8>>> = [0..4u32, 4..8]
        .into_iter()
        .map(|ranks| {
            ranks
                .map(|r| {
                    let solve = if r == 6 { 300.0 } else { 100.0 + f64::from(r) };
                    profile(r, &[("solve", solve), ("MPI_Wait", 10.0)])
                })
                .collect()
        })
        .collect();
    let mut up0 = Vec::new();
    for (leaf, input) in leaves.iter_mut().zip(&inputs) {
        let slices: Vec<&[u8]> = input.iter().map(Vec::as_slice).collect();
        let out = leaf.upstream(0, 0, &slices).unwrap();
        up0.push(out.up[0].payload.clone());
    }
    let slices: Vec<&[u8]> = up0.iter().map(Vec::as_slice).collect();
    let merged = relay.upstream(0, 0, &slices).unwrap();
    let down = root.upstream(0, 0, &[&merged.up[0].payload]).unwrap();
    assert_eq!(down.down[0].phase, 1);
    let passed = relay.downstream(0, 1, &down.down[0].payload).unwrap();
    let mut up2 = Vec::new();
    for leaf in &mut leaves {
        let out = leaf.downstream(0, 1, &passed.down[0].payload).unwrap();
        assert_eq!(out.up[0].phase, 2);
        // Each leaf sends at most k ranks up.
        let p = OutliersPacket::decode(out.up[0].payload.as_slice()).unwrap();
        assert_eq!(p.groups[0].top.len(), 2);
        up2.push(out.up[0].payload.clone());
    }
    let slices: Vec<&[u8]> = up2.iter().map(Vec::as_slice).collect();
    let merged = relay.upstream(0, 2, &slices).unwrap();
    let last = root.upstream(0, 2, &[&merged.up[0].payload]).unwrap();
    let bytes = root.finalize(0, 2, &last.up[0].payload).unwrap();
    let r = OutliersResult::decode(bytes.as_slice()).unwrap();
    assert_eq!((r.within.as_str(), r.events.as_str()), ("all", "all"));
    let g = &r.groups[0];
    // Each application's ranks are scored apart: the group is application a's.
    assert_eq!(
        (g.class_id, g.app.as_str(), g.ranks, g.keep),
        (canopy_filter_common::classes::app_group("a"), "a", 8, 2)
    );
    // Next to rank 6, rank 0 (100 us) lies farthest from the mean of solve (127.75 us).
    let top: Vec<u32> = g.top.iter().map(|o| o.rank).collect();
    assert_eq!(top, [6, 0]);
    // MPI_Wait deviates nowhere, and no rank's calls do: they add nothing and are not listed.
    let events = &g.top[0].events;
    assert_eq!(events.len(), 1);
    let solve = &events[0];
    assert_eq!(solve.id, canopy_wire::event_id("solve"));
    assert_eq!(
        solve.metric,
        Metric::Exclusive as i32,
        "the defaults score every metric"
    );
    assert_eq!((solve.value, solve.mean), (300.0, 127.75));
    // Weighted by default, by solve's share of the mean time (127.75 of 137.75 us), and beyond the default margin
    // of one deviation.
    let weight = 127.75 / (127.75 + 10.0);
    assert!((solve.contribution - ((300.0 - 127.75) / solve.std - 1.0) * weight).abs() < 1e-12);
    assert_eq!(g.top[0].score, solve.contribution);
}

#[test]
fn malformed_packets_are_rejected_with_their_reason_and_the_rest_merges() {
    let filters = PluginFilters::new(search_path());
    let mut leaf = create(&filters, "", Level::Leaf);
    let mut relay = create(&filters, "", Level::Relay);
    let a = profile(0, &[("solve", 1.0)]);
    let good = leaf.upstream(3, 0, &[&a]).unwrap().up[0].payload.clone();
    let class = OutliersPacket {
        groups: vec![OutlierGroup {
            class_id: 9,
            ranks: 1,
            ..Default::default()
        }],
        raw_bytes: 0,
    }
    .encode_to_vec();
    let out = relay.upstream(3, 0, &[&good, &[0xff, 0xff], &class]).unwrap();
    let mut why = out.rejected.clone();
    why.sort();
    assert_eq!(why.len(), 2);
    assert_eq!(why[0].0, 1);
    assert!(
        why[0]
            .1
            .starts_with("input is not a canopy.filters.v1.OutliersPacket: "),
        "{}",
        why[0].1
    );
    assert_eq!(
        why[1],
        (
            2,
            "input is not a canopy.filters.v1.OutliersPacket: group 0x0000000000000009: this stream scores each \
             application's ranks together, and this is not the group of application \"\""
                .to_string()
        )
    );
    let merged = OutliersPacket::decode(out.up[0].payload.as_slice()).unwrap();
    assert_eq!(merged.groups[0].ranks, 1);

    // Phase 2: a top list out of order, and one longer than its keep (of application a's group).
    let group = canopy_filter_common::classes::app_group("a");
    let o = |rank: u32, score: f64| Outlier {
        app: "a".into(),
        rank,
        score,
        events: Vec::new(),
    };
    let tops = |keep: u32, top: Vec<Outlier>| {
        OutliersPacket {
            groups: vec![OutlierGroup {
                class_id: group,
                keep,
                top,
                app: "a".into(),
                ..Default::default()
            }],
            raw_bytes: 0,
        }
        .encode_to_vec()
    };
    let fine = tops(10, vec![o(4, 2.0), o(2, 1.0)]);
    let unsorted = tops(10, vec![o(1, 1.0), o(0, 2.0)]);
    let long = tops(1, vec![o(1, 2.0), o(0, 1.0)]);
    let out = relay.upstream(3, 2, &[&unsorted, &fine, &long]).unwrap();
    let mut why = out.rejected.clone();
    why.sort();
    assert_eq!(
        why,
        [
            (
                0,
                format!(
                    "input is not a canopy.filters.v1.OutliersPacket: group {group:#018x}: rank a:0 at 1 does not \
                     follow the previous one (score descending, then app, then rank; each rank once)"
                )
            ),
            (
                2,
                format!(
                    "input is not a canopy.filters.v1.OutliersPacket: group {group:#018x}: 2 ranks in a top of 1"
                )
            ),
        ]
    );
    let merged = OutliersPacket::decode(out.up[0].payload.as_slice()).unwrap();
    assert_eq!(merged.groups[0].top, vec![o(4, 2.0), o(2, 1.0)]);

    // Means that cannot be used fail the leaf's round, naming why.
    let err = leaf.downstream(3, 1, &class).unwrap_err().to_string();
    assert!(
        err.contains("round 3: the phase 1 packet is unusable: group 0x0000000000000009"),
        "{err}"
    );
}

/// What the root receives in phase 2 is O(k): a leaf's top list does not grow with its ranks, while its phase-0
/// summaries grow with the events only.
#[test]
fn a_leaf_sends_k_ranks_up_whatever_its_ranks() {
    let filters = PluginFilters::new(search_path());
    let events: Vec<String> = (0..100).map(|e| format!("event {e}")).collect();
    let sizes = |ranks: u32| {
        let mut leaf = filters.create("outliers", r#"{"k": 10}"#, Level::Leaf).unwrap();
        let mut root = filters.create("outliers", r#"{"k": 10}"#, Level::Root).unwrap();
        let inputs: Vec<Vec<u8>> = (0..ranks)
            .map(|r| {
                let times: Vec<(&str, f64)> = events
                    .iter()
                    .enumerate()
                    .map(|(e, name)| (name.as_str(), 100.0 + f64::from((r * 7 + e as u32 * 13) % 97)))
                    .collect();
                profile(r, &times)
            })
            .collect();
        let slices: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let raw: usize = inputs.iter().map(Vec::len).sum();
        let up0 = leaf.upstream(0, 0, &slices).unwrap().up[0].payload.clone();
        let down = root.upstream(0, 0, &[&up0]).unwrap().down[0].payload.clone();
        let up2 = leaf.downstream(0, 1, &down).unwrap().up[0].payload.clone();
        (raw, up0.len(), down.len(), up2.len())
    };
    let (small, large) = (sizes(64), sizes(1024));
    eprintln!("64 ranks: {small:?}; 1024 ranks: {large:?} (raw, phase 0 up, phase 1 down, phase 2 up bytes)");
    assert!(large.0 > 15 * small.0);
    // The top of 10 with its events, whatever the ranks: within a few bytes (rank numbers grow).
    assert!(large.3 <= small.3 + 40, "{small:?} {large:?}");
    // The summaries are per event, not per rank.
    assert!(large.1 <= small.1 + 400, "{small:?} {large:?}");
}
