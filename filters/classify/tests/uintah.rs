//! ToM's Uintah example (Fig. 7): classes by AMR level-1 patch events, and the reduction factor.

use canopy_filter_classify::ClassifyFilter;
use canopy_filter_proto::v1::{ClassResult, RankRange};
use canopy_filter_test::{Case, Rng, Tree};
use canopy_wire::v1::{EventSample, RankProfile};
use prost::Message;

/// A class's members as (first, last) pairs.
type Spans = Vec<(u32, u32)>;

fn event(name: &str, v: f64) -> EventSample {
    EventSample {
        event_id: canopy_wire::event_id(name),
        calls: 1,
        incl_us: v,
        excl_us: v / 2.0,
        calls_total: 10,
        incl_total_us: v * 10.0,
        excl_total_us: v * 5.0,
        ..Default::default()
    }
}

/// Rank 0 works on level-1 patches 0..15, ranks 1..8 on patches 0..7, the rest on none; every rank has
/// level-0 patches of its own and MPI events.
fn uintah(ranks: u32) -> (Vec<RankProfile>, Vec<(u64, String)>) {
    let mut names = Vec::new();
    let profiles = (0..ranks)
        .map(|rank| {
            let mut events = Vec::new();
            let level1 = match rank {
                0 => 16,
                1..=8 => 8,
                _ => 0,
            };
            let mut add = |name: String, v: f64| {
                names.push((canopy_wire::event_id(&name), name.clone()));
                events.push(event(&name, v));
            };
            for p in 0..level1 {
                add(format!("Patch 1 -> {p}"), 100.0 + f64::from(rank + p));
            }
            for p in 0..2 {
                add(format!("Patch 0 -> {}", rank * 2 + p), 50.0 + f64::from(rank));
            }
            add("MPI_Allreduce()".to_string(), 10.0 + f64::from(rank % 7));
            add("MPI_Send()".to_string(), 3.0);
            RankProfile {
                app: "uintah".into(),
                rank,
                events,
                ..Default::default()
            }
        })
        .collect();
    names.sort();
    names.dedup();
    (profiles, names)
}

/// A tree of fanout 8 over `ranks` ranks (ToM's setup), ranks spread over the leaves in order.
fn run(profiles: Vec<RankProfile>, names: Vec<(u64, String)>, params: &str) -> ClassResult {
    let n = profiles.len();
    let leaves = n.div_ceil(8);
    // Root -> relays (up to 8 leaves each) -> leaves, each leaf with up to 8 ranks.
    let relays = leaves.div_ceil(8);
    let mut parents = vec![usize::MAX];
    parents.extend(std::iter::repeat_n(0, relays));
    parents.extend((0..leaves).map(|l| 1 + l / 8));
    let tree = Tree::from_parents(&parents);
    let placement: Vec<usize> = (0..n).map(|r| r / 8).collect();
    let case = Case::new(tree, placement, vec![profiles], names);
    let out = case.run::<ClassifyFilter>(params, 11).unwrap();
    ClassResult::decode(out.results[&(0, 2)].as_slice()).unwrap()
}

#[test]
fn level_1_patch_scheme_gives_three_classes() {
    let (profiles, names) = uintah(64);
    let result = run(
        profiles,
        names,
        r#"{"scheme": "pattern", "pattern": "^Patch 1 ->"}"#,
    );
    // (member ranges, size, example) per class.
    let mut got: Vec<(Spans, u32, String)> = result
        .classes
        .iter()
        .map(|c| {
            (
                c.ranks.iter().map(|r| (r.first, r.last)).collect(),
                c.size,
                c.example_event.clone(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (vec![(0, 0)], 1, "Patch 1 -> 0".to_string()),
            (vec![(1, 8)], 8, "Patch 1 -> 0".to_string()),
            (vec![(9, 63)], 55, String::new()),
        ]
    );
    assert!(
        result
            .classes
            .iter()
            .all(|c| c.ranks.iter().all(|r| r.app == "uintah"))
    );
    // The class ids are the hashes of the application's name, a NUL and the sorted, "\n"-joined selected names.
    let mut rank0: Vec<String> = (0..16).map(|p| format!("Patch 1 -> {p}")).collect();
    rank0.sort();
    let id0 = canopy_wire::event_id(&format!("uintah\0{}", rank0.join("\n")));
    let c0 = result.classes.iter().find(|c| c.class_id == id0).unwrap();
    assert_eq!(
        c0.ranks,
        vec![RankRange {
            app: "uintah".into(),
            first: 0,
            last: 0
        }]
    );
    assert_eq!(
        result.classes.iter().find(|c| c.size == 55).unwrap().class_id,
        canopy_wire::event_id("uintah\0")
    );
    assert_eq!(result.scheme, "pattern:^Patch 1 ->");
}

#[test]
fn default_scheme_separates_every_rank_here() {
    // Every rank has level-0 patches of its own: with all events, every rank is its own class.
    let (profiles, names) = uintah(64);
    let result = run(profiles, names, "{}");
    assert_eq!(result.classes.len(), 64);
    assert!(result.classes.iter().all(|c| c.size == 1));
}

#[test]
fn reduction_factor_grows_with_the_ranks() {
    let rf = |ranks: u32| {
        // The same event set on every rank: one class.
        let mut rng = Rng::new(u64::from(ranks));
        let names: Vec<(u64, String)> = ["MPI_Allreduce()", "MPI_Send()", "solve"]
            .iter()
            .map(|n| (canopy_wire::event_id(n), n.to_string()))
            .collect();
        let profiles: Vec<RankProfile> = (0..ranks)
            .map(|rank| RankProfile {
                app: "app".into(),
                rank,
                events: names
                    .iter()
                    .map(|(_, n)| event(n, 1.0 + rng.unit() * 100.0))
                    .collect(),
                ..Default::default()
            })
            .collect();
        let result = run(profiles, names, "{}");
        assert_eq!(result.classes.len(), 1);
        assert_eq!(result.classes[0].size, ranks);
        result.reduction_factor
    };
    let (small, large) = (rf(64), rf(256));
    assert!(small > 1.0, "{small}");
    assert!(large > 3.0 * small, "64 ranks: {small}, 256 ranks: {large}");
}
