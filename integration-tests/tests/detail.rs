//! `canopy ctl detail --auto` on a real tree: a detail stream fed only by the ranks that matter (seed 002), the
//! planted slow ranks and one representative per group of the Uintah scenario, moved at round boundaries, against
//! a full passthrough stream of the same run.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use canopy_core::ranks::RankSet;
use canopy_integration_tests::{Select, TreeBuilder, assert_eventually, reader};
use canopy_proto::v1::frontend_client::FrontendClient;
use canopy_proto::v1::{ControlRequest, DetailRequest, control_request};

/// The ranks a stream's stages say feed `round`.
fn fed_by(stages: &[(u64, String)], round: u64) -> Option<RankSet> {
    stages
        .iter()
        .rev()
        .find(|(from, _)| *from <= round)
        .map(|(_, ranks)| RankSet::parse_or_none(ranks).unwrap())
}

/// A cluster's ranks from their stored ranges (`app:0-7,9`: the application named where it changes).
fn members(ranges: &str) -> RankSet {
    let plain: Vec<&str> = ranges
        .split(',')
        .map(|part| part.rsplit_once(':').map_or(part, |(_, r)| r))
        .collect();
    RankSet::parse(&plain.join(",")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_automatic_detail_stream_carries_the_planted_outliers_and_a_representative_per_group() {
    // 10% of the ranks planted three times slower, across every agent.
    let planted: BTreeSet<u32> = (0..256).filter(|r| r % 10 == 3).collect();
    let plant = planted.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let tree = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 256,
        rounds: 0,
        period_ms: 50,
        scenario: "uintah".into(),
        events: 8,
        plant: vec![format!("{plant}:3")],
        streams: vec!["passthrough".into()],
        timeout_ms: 5000,
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let mut api = FrontendClient::connect(format!("http://{}", tree.frontend_addr))
        .await
        .unwrap();
    let r = api
        .control(ControlRequest {
            action: Some(control_request::Action::Detail(DetailRequest {
                auto: true,
                ..DetailRequest::default()
            })),
        })
        .await
        .unwrap()
        .into_inner();
    // Stream 1 is the full passthrough; the outliers and kmeans streams it opened come next, then the detail.
    assert_eq!(
        (r.applied.as_str(), r.stream_id),
        (
            "detail (automatic: outliers from stream 2, representatives from stream 3)",
            4
        )
    );
    let store = tree.store.clone();
    // The store may not have the stream's row yet when the answer comes: no row is no stages yet.
    let stages = || {
        reader(&store)
            .stream(4)
            .unwrap()
            .map(|s| s.stages)
            .unwrap_or_default()
    };
    assert_eventually!(
        stages().iter().any(|(_, ranks)| !ranks.is_empty()),
        Duration::from_secs(60),
        "the detail stream never moved to chosen ranks"
    );
    let first = stages()
        .iter()
        .find(|(_, ranks)| !ranks.is_empty())
        .map(|(from, _)| *from)
        .unwrap();
    assert_eventually!(
        reader(&store)
            .rounds(Select::all().stream(4).from_round(first))
            .unwrap()
            .len()
            >= 10,
        Duration::from_secs(60),
        "too few detail rounds"
    );
    // The full passthrough writes far more rows per round, so on a loaded machine its rounds may be stored a
    // while after the detail's: the volume below compares the rounds both have.
    assert_eventually!(
        reader(&store)
            .rounds(Select::all().stream(1).from_round(first))
            .unwrap()
            .len()
            >= 10,
        Duration::from_secs(60),
        "too few full rounds since the detail's first"
    );

    let stored = reader(&store);
    let stages = stored.stream(4).unwrap().unwrap().stages;
    // Each round is fed by exactly the ranks its stage names: the rest count as sampled out. On a loaded machine
    // an agent's packet may miss its round: its ranks count as late, their rows kept and marked late.
    // Rounds first: the samples read after them hold at least those rounds' rows (a round and its rows are
    // written in one transaction; a late packet's rows with the late count it adds).
    let rounds = stored.rounds(Select::all().stream(4)).unwrap();
    let samples = stored.samples(Select::all().stream(4)).unwrap();
    let mut fed: BTreeMap<u64, BTreeSet<u32>> = BTreeMap::new();
    let mut fed_late: BTreeMap<u64, BTreeSet<u32>> = BTreeMap::new();
    for s in &samples {
        let by_round = if s.late { &mut fed_late } else { &mut fed };
        by_round.entry(s.round).or_default().insert(s.rank);
    }
    for r in &rounds {
        let chosen = fed_by(&stages, r.round).expect("a stage from round 0");
        let ranks = fed.get(&r.round).cloned().unwrap_or_default();
        let late = fed_late.get(&r.round).cloned().unwrap_or_default();
        assert!(
            ranks.iter().chain(&late).all(|rank| chosen.contains(*rank)),
            "round {}: {ranks:?}, late {late:?}",
            r.round
        );
        assert_eq!(
            r.covered as usize,
            ranks.len(),
            "round {}: fed by {ranks:?}, stages {stages:?}, {r:?}",
            r.round
        );
        assert!(
            late.len() >= r.late_ranks as usize,
            "round {}: {} late ranks counted, rows of {late:?}",
            r.round,
            r.late_ranks
        );
        assert_eq!(r.expected, 256);
    }
    // Before the sources answered, no rank fed it.
    assert!(fed.keys().chain(fed_late.keys()).all(|round| *round >= first));

    // The latest ranks: every planted outlier, and one representative of each of the three groups. A stage is
    // recorded before its first round arrives, so the latest is the newest stage with a stored round.
    let last: BTreeSet<u32> = stages
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, (from, _))| {
            let to = stages.get(i + 1).map_or(u64::MAX, |(next, _)| *next);
            fed.range(*from..to).next().map(|(round, ranks)| {
                let late = fed_late.get(round).into_iter().flatten();
                ranks.iter().chain(late).copied().collect::<BTreeSet<u32>>()
            })
        })
        .unwrap_or_default();
    assert!(
        planted.is_subset(&last),
        "planted {planted:?} not all in {last:?}"
    );
    let clusters = stored.clusters(Select::all().stream(3)).unwrap();
    let newest = clusters.iter().map(|c| c.round).max().unwrap();
    let groups: Vec<RankSet> = clusters
        .iter()
        .filter(|c| c.round == newest)
        .map(|c| members(&c.ranks))
        .collect();
    assert_eq!(groups.len(), 3, "{clusters:?}");
    for g in &groups {
        assert!(
            last.iter().any(|r| g.contains(*r)),
            "no rank of a group in {last:?}"
        );
    }
    let extra: Vec<&u32> = last.difference(&planted).collect();
    assert!(extra.len() <= 3, "beyond the planted ranks: {extra:?}");

    // The volume, round for round over the same rounds: at most 15% of the full passthrough (seed 002: 11%).
    let full: BTreeMap<u64, u64> = stored
        .rounds(Select::all().stream(1).from_round(first))
        .unwrap()
        .iter()
        .map(|r| (r.round, r.result_bytes))
        .collect();
    let (mut detail_bytes, mut full_bytes) = (0u64, 0u64);
    for r in rounds.iter().filter(|r| r.round >= first) {
        if let Some(f) = full.get(&r.round) {
            detail_bytes += r.result_bytes;
            full_bytes += f;
        }
    }
    assert!(
        full_bytes > 0,
        "no round stored by both streams since round {first}"
    );
    let share = detail_bytes as f64 / full_bytes as f64;
    eprintln!(
        "automatic detail: {detail_bytes} of {full_bytes} bytes ({:.1}%)",
        100.0 * share
    );
    assert!(
        share <= 0.15,
        "the detail is {:.1}% of the full passthrough",
        100.0 * share
    );
}
