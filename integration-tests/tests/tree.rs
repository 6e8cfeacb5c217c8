//! End-to-end tests of in-process trees: delivery, coverage, loss, and bad peers.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use canopy_filter_histogram::HistogramFilter;
use canopy_filter_sdk::{Filter, Level};
use canopy_filter_test::{Collect, one_event_profile};
use canopy_integration_tests::{Select, StreamState, Table, TreeBuilder, assert_eventually, reader};
use canopy_proto::PROTOCOL_VERSION;
use canopy_proto::v1::tree_client::TreeClient;
use canopy_proto::v1::{
    Coverage, DownMessage, Envelope, EventSample, Hello, MissingReason, NodeKind, NodeState, ProfileBatch,
    RankProfile, UpMessage, down_message, up_message,
};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// How many rounds the store holds.
fn rounds_stored(store: &Path) -> u64 {
    reader(store).count(Table::Rounds).unwrap()
}

/// How many nodes of a kind the store knows in a state (any state: `None`).
fn nodes_of(store: &Path, kind: Option<NodeKind>, state: Option<NodeState>) -> usize {
    let nodes = reader(store).nodes().unwrap();
    nodes
        .iter()
        .filter(|n| kind.is_none_or(|k| n.kind == k) && state.is_none_or(|s| n.state == s))
        .count()
}

fn node_state(store: &Path, id: &str) -> Option<NodeState> {
    reader(store).node(id).unwrap().map(|n| n.state)
}

/// The distinct ranks in `samples` that `select` picks.
fn sampled_ranks(store: &Path, select: Select) -> HashSet<u32> {
    let samples = reader(store).samples(select).unwrap();
    samples.iter().map(|s| s.rank).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_level_tree_delivers_every_rank_of_every_round() {
    let builder = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 64,
        rounds: 20,
        ..TreeBuilder::default()
    };
    let events = u64::from(builder.events);
    let mut tree = builder.start().await;
    assert_eq!(tree.relay_addrs.len(), 2, "4 agents at fanout 2 need 2 relays");
    tree.wait_frontend(Duration::from_secs(30))
        .await
        .expect("front-end finishes cleanly");
    let rounds = tree.rounds();
    assert_eq!(rounds.len(), 20, "{rounds:#?}");
    for (i, r) in rounds.iter().enumerate() {
        assert_eq!(r.round, i as u64);
        assert_eq!(
            (r.covered, r.expected),
            (64, 64),
            "round {}: {:?}",
            r.round,
            r.missing_reason
        );
        assert_eq!(r.missing_reason, None);
    }
    let stored = reader(&tree.store);
    assert_eq!(stored.count(Table::Samples).unwrap(), 64 * events * 20);
    assert_eq!(sampled_ranks(&tree.store, Select::all()).len(), 64);
    // Every event's name reached the root's dictionary.
    let names: HashSet<u64> = stored.names().unwrap().into_iter().map(|(id, _)| id).collect();
    let unnamed: HashSet<u64> = stored
        .samples(Select::all())
        .unwrap()
        .iter()
        .map(|s| s.event_id)
        .filter(|id| !names.contains(id))
        .collect();
    assert_eq!(unnamed.len(), 0, "{unnamed:?}");
    // The root sees the whole tree: 2 relays and 4 agents, all finished.
    assert_eq!(nodes_of(&tree.store, Some(NodeKind::Relay), None), 2);
    assert_eq!(
        nodes_of(&tree.store, Some(NodeKind::Agent), Some(NodeState::Finished)),
        4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_agent_leaves_its_ranks_unreachable_and_the_rest_goes_on() {
    let builder = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 64,
        rounds: 60,
        period_ms: 20,
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    let store = tree.store.clone();
    assert_eventually!(
        rounds_stored(&store) >= 10,
        Duration::from_secs(20),
        "rounds never reached the store"
    );
    tree.kill("agent:1");
    tree.wait_frontend(Duration::from_secs(30))
        .await
        .expect("front-end finishes");
    let rounds = tree.rounds();
    assert_eq!(rounds.len(), 60, "every round is stored, partial ones too");
    let lost: Vec<_> = rounds.iter().filter(|r| r.covered == 48).collect();
    assert!(lost.len() >= 20, "later rounds cover 48 of 64: {rounds:#?}");
    for r in &rounds {
        assert_eq!(r.expected, 64);
        assert!(
            r.covered == 64 || r.covered == 48 && r.missing.get(MissingReason::Unreachable) == 16,
            "round {}: {r:?}",
            r.round
        );
    }
    let first_lost = lost[0].round;
    assert!(
        rounds
            .iter()
            .filter(|r| r.round > first_lost)
            .all(|r| r.covered == 48),
        "no round after the loss is whole"
    );
    assert_eq!(node_state(&store, "agent:1"), Some(NodeState::Lost));
    assert_eq!(
        nodes_of(&store, Some(NodeKind::Agent), Some(NodeState::Finished)),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_stores_every_round_already_dumped() {
    let builder = TreeBuilder {
        agents: 2,
        fanout: 2,
        ranks: 16,
        rounds: 0,
        period_ms: 10,
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    let store = tree.store.clone();
    assert_eventually!(rounds_stored(&store) >= 5, Duration::from_secs(20), "no rounds");
    let root = "frontend:0".to_string();
    tree.shutdown(&root);
    tree.wait_frontend(Duration::from_secs(5))
        .await
        .expect("drain ends cleanly");
    let rounds = tree.rounds();
    for (i, r) in rounds.iter().enumerate() {
        assert_eq!(r.round, i as u64, "rounds are contiguous");
        if i + 1 < rounds.len() {
            assert_eq!(
                (r.covered, r.expected),
                (16, 16),
                "round {} lost ranks in the drain",
                r.round
            );
        } else {
            // One agent may have dumped a last round after the other had stopped: its ranks count as stopped.
            assert!(
                r.covered == 16 || r.missing_reason.as_deref() == Some("stopped: 8"),
                "{r:?}"
            );
        }
    }
    // The agents finished on the drain (their Fin reached the root), so the last rounds were waited for.
    assert_eq!(
        nodes_of(&store, Some(NodeKind::Agent), Some(NodeState::Finished)),
        2
    );
}

/// A shutdown waits out a filter call that is slow but within its time-out: the relays' call for round 5 takes 4.5
/// s more, past the 3 s the drain once waited (it then closed round 5 and those after it with every rank `late`).
/// With the front-end's default drain every round the ranks dumped arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_waits_out_a_slow_filter_call_within_its_time_out() {
    let builder = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 16,
        rounds: 0,
        period_ms: 50,
        // The rounds wait for the slow relays (a stream's own time-out is the stream's to choose).
        timeout_ms: 20_000,
        streams: vec!["faulty".into()],
        stream_params: vec![(
            "faulty".into(),
            r#"{"fault": "slow_relay", "round": 5, "delay_ms": 4500}"#.into(),
        )],
        ..TreeBuilder::default()
    };
    assert!(
        builder.drain_timeout_ms > 4500 && builder.drain_timeout_ms < builder.filter_call_timeout_ms + 5000
    );
    let mut tree = builder.start().await;
    let store = tree.store.clone();
    // Round 4 stored, and a few more dumped since: round 5 is in the relays' slow call, the rest wait behind it.
    assert_eventually!(rounds_stored(&store) >= 5, Duration::from_secs(20), "no rounds");
    tokio::time::sleep(Duration::from_millis(400)).await;
    tree.shutdown("frontend:0");
    tree.wait_frontend(Duration::from_secs(20))
        .await
        .expect("the drain ends");
    let rounds = tree.rounds();
    assert!(rounds.len() >= 6, "{rounds:?}");
    for r in &rounds {
        assert_eq!(
            r.missing.get(MissingReason::Late),
            0,
            "the drain cut a round short: {r:?}"
        );
    }
    assert_eq!(
        (rounds[5].covered, rounds[5].expected),
        (16, 16),
        "{:?}",
        rounds[5]
    );
}

/// Attaches by hand, as a misbehaving child would; returns the first answer or the error.
async fn raw_attach(
    addr: &str,
    hello: Hello,
) -> (
    mpsc::Sender<UpMessage>,
    Result<tonic::Streaming<DownMessage>, tonic::Status>,
) {
    let mut client = TreeClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let (tx, rx) = mpsc::channel(16);
    tx.send(UpMessage {
        msg: Some(up_message::Msg::Hello(hello)),
    })
    .await
    .unwrap();
    let resp = client
        .attach(ReceiverStream::new(rx))
        .await
        .map(|r| r.into_inner());
    (tx, resp)
}

fn hello(id: &str, version: u32, ranks: u32) -> Hello {
    Hello {
        node_id: id.into(),
        kind: NodeKind::Agent as i32,
        ranks_below: ranks,
        protocol_version: version,
        ..Hello::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_speaking_another_protocol_version_is_refused_by_name() {
    let builder = TreeBuilder {
        agents: 2,
        fanout: 2,
        ranks: 8,
        rounds: 10,
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    let (_tx, resp) = raw_attach(&tree.frontend_addr, hello("stranger", PROTOCOL_VERSION + 1, 4)).await;
    let status = resp.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        status.message(),
        format!(
            "protocol version mismatch: child stranger speaks version {}, parent frontend:0 speaks version {}",
            PROTOCOL_VERSION + 1,
            PROTOCOL_VERSION
        )
    );
    tree.assert_finished_full(10, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_with_a_duplicate_node_id_is_refused_and_the_first_keeps_going() {
    let builder = TreeBuilder {
        agents: 2,
        fanout: 2,
        ranks: 8,
        rounds: 30,
        period_ms: 20,
        ..TreeBuilder::default()
    };
    let mut tree = builder.clone().start().await;
    let store = tree.store.clone();
    assert_eventually!(rounds_stored(&store) >= 2, Duration::from_secs(20), "no rounds");
    let parent = tree.agent_parents["agent:0"].clone();
    tree.add_agent("impostor", builder.agent_config("agent:0", &parent, 4, 100));
    let err = tree
        .wait_node("impostor", Duration::from_secs(10))
        .await
        .expect_err("refused");
    assert!(
        err.contains("node id agent:0 is already attached to frontend:0"),
        "{err}"
    );
    tree.assert_finished_full(30, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_that_does_not_decode_counts_its_ranks_malformed() {
    // One real agent with 8 ranks, and a hand-made child that claims 4 ranks and sends garbage.
    let builder = TreeBuilder {
        agents: 1,
        ranks: 8,
        expect_ranks: 12,
        rounds: 15,
        period_ms: 20,
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    let (tx, resp) = raw_attach(&tree.frontend_addr, hello("garbler", PROTOCOL_VERSION, 4)).await;
    let mut down = resp.expect("admitted");
    // Wait for Start, then send every round: garbage for even rounds, a valid batch for odd ones.
    let mut started = false;
    while let Ok(Some(m)) = down.message().await {
        if let Some(down_message::Msg::Control(c)) = m.msg
            && matches!(c.action, Some(canopy_proto::v1::control::Action::Start(_)))
        {
            started = true;
            break;
        }
    }
    assert!(started, "the root starts once 12 ranks are attached");
    for round in 0..15u64 {
        let payload = if round % 2 == 0 {
            vec![0xff; 7]
        } else {
            ProfileBatch {
                profiles: (100..104)
                    .map(|rank| RankProfile {
                        rank,
                        round,
                        events: vec![EventSample {
                            event_id: 42,
                            calls: 1,
                            incl_us: 2.0,
                            excl_us: 1.0,
                            ..Default::default()
                        }],
                        ..Default::default()
                    })
                    .collect(),
            }
            .encode_to_vec()
        };
        let env = Envelope {
            stream_id: 1,
            round,
            phase: 0,
            coverage: Some(Coverage {
                covered: 4,
                expected: 4,
                missing: vec![],
                apps: vec![],
                unreachable: vec![],
            }),
            payload: payload.into(),
            ..Envelope::default()
        };
        tx.send(UpMessage {
            msg: Some(up_message::Msg::Envelope(env)),
        })
        .await
        .unwrap();
    }
    tx.send(UpMessage {
        msg: Some(up_message::Msg::Fin(canopy_proto::v1::Fin {
            node_id: "garbler".into(),
            rounds_end: 15,
        })),
    })
    .await
    .unwrap();
    tree.wait_frontend(Duration::from_secs(30))
        .await
        .expect("the tree goes on");
    let rounds = tree.rounds();
    assert_eq!(rounds.len(), 15);
    for r in &rounds {
        assert_eq!(r.expected, 12);
        if r.round % 2 == 0 {
            assert_eq!(
                (r.covered, r.missing.get(MissingReason::Malformed)),
                (8, 4),
                "round {}: {r:?}",
                r.round
            );
        } else {
            assert_eq!(r.covered, 12, "round {}: {r:?}", r.round);
        }
    }
    let high = sampled_ranks(&tree.store, Select::all());
    assert_eq!(high.iter().filter(|r| **r >= 100).count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_past_what_a_child_has_are_refused_and_the_run_goes_on() {
    let builder = TreeBuilder {
        agents: 1,
        ranks: 8,
        expect_ranks: 12,
        rounds: 5,
        period_ms: 20,
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    // A hello that counts more ranks than any node may answer for: refused by name.
    let (_tx, resp) = raw_attach(&tree.frontend_addr, hello("huge", PROTOCOL_VERSION, u32::MAX)).await;
    let status = resp.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "child huge counts 4294967295 ranks, more than any node may answer for (16777216)"
    );
    // A child of 4 ranks whose packets count more than it has, or do not add up: refused, so no round's counts
    // are inflated or wrapped; its ranks count as late in those rounds.
    let (tx, resp) = raw_attach(&tree.frontend_addr, hello("inflater", PROTOCOL_VERSION, 4)).await;
    let mut down = resp.expect("admitted");
    wait_start(&mut down).await;
    let with_coverage = |round: u64, coverage: Coverage| {
        let mut msg = batch_envelope(round, 100..104);
        if let Some(up_message::Msg::Envelope(env)) = &mut msg.msg {
            env.coverage = Some(coverage);
        }
        msg
    };
    let inflated = Coverage {
        covered: u32::MAX,
        expected: u32::MAX,
        missing: vec![],
        apps: vec![],
        unreachable: vec![],
    };
    let inexact = Coverage {
        covered: 4,
        expected: 4,
        missing: vec![canopy_proto::v1::Missing {
            reason: MissingReason::Late as i32,
            ranks: 7,
        }],
        apps: vec![],
        unreachable: vec![],
    };
    // Exact in all, but its applications claim more ranks than the whole: refused too.
    let claims_more = Coverage {
        covered: 4,
        expected: 4,
        missing: vec![],
        apps: vec![canopy_proto::v1::AppCoverage {
            app: "forged".into(),
            covered: 9,
            expected: 9,
            missing: vec![],
        }],
        unreachable: vec![],
    };
    for msg in [
        with_coverage(0, inflated),
        with_coverage(1, inexact),
        with_coverage(2, claims_more),
        batch_envelope(3, 100..104),
        batch_envelope(4, 100..104),
    ] {
        tx.send(msg).await.unwrap();
    }
    tx.send(UpMessage {
        msg: Some(up_message::Msg::Fin(canopy_proto::v1::Fin {
            node_id: "inflater".into(),
            rounds_end: 5,
        })),
    })
    .await
    .unwrap();
    tree.wait_frontend(Duration::from_secs(30))
        .await
        .expect("the tree goes on");
    let rounds = tree.rounds();
    assert_eq!(rounds.len(), 5);
    for r in &rounds {
        assert_eq!(r.expected, 12, "round {}: {r:?}", r.round);
        if r.round < 3 {
            assert_eq!(
                (r.covered, r.missing.get(MissingReason::Late)),
                (8, 4),
                "round {}: {r:?}",
                r.round
            );
        } else {
            assert_eq!(r.covered, 12, "round {}: {r:?}", r.round);
        }
    }
    // The refused breakdown reached no round: only the simulated agent's application is named, whole.
    let per_app = canopy_integration_tests::reader(&tree.store)
        .round_apps(canopy_store::Select::all())
        .unwrap();
    assert_eq!(per_app.len(), 5, "{per_app:?}");
    assert!(
        per_app
            .iter()
            .all(|a| a.app != "forged" && (a.covered, a.expected) == (8, 8)),
        "{per_app:?}"
    );
}

/// Waits on a hand-made child's down stream until the root's Start.
async fn wait_start(down: &mut tonic::Streaming<DownMessage>) {
    while let Ok(Some(m)) = down.message().await {
        if let Some(down_message::Msg::Control(c)) = m.msg
            && matches!(c.action, Some(canopy_proto::v1::control::Action::Start(_)))
        {
            return;
        }
    }
    panic!("no start");
}

fn batch_envelope(round: u64, ranks: std::ops::Range<u32>) -> UpMessage {
    let n = ranks.len() as u32;
    let payload = ProfileBatch {
        profiles: ranks
            .map(|rank| RankProfile {
                rank,
                round,
                events: vec![EventSample {
                    event_id: 7,
                    calls: 1,
                    incl_us: 1.0,
                    excl_us: 1.0,
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect(),
    }
    .encode_to_vec();
    let env = Envelope {
        stream_id: 1,
        round,
        coverage: Some(Coverage {
            covered: n,
            expected: n,
            missing: vec![],
            apps: vec![],
            unreachable: vec![],
        }),
        payload: payload.into(),
        ..Envelope::default()
    };
    UpMessage {
        msg: Some(up_message::Msg::Envelope(env)),
    }
}

fn fin(id: &str) -> UpMessage {
    UpMessage {
        msg: Some(up_message::Msg::Fin(canopy_proto::v1::Fin {
            node_id: id.into(),
            rounds_end: 0,
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_child_makes_rounds_close_by_time_out_and_its_packets_are_recorded_late() {
    // Only hand-made children: "prompt" delivers at once, "slow" after the 200 ms time-out.
    let builder = TreeBuilder {
        agents: 0,
        expect_ranks: 8,
        timeout_ms: 200,
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    let (fast, resp) = raw_attach(&tree.frontend_addr, hello("prompt", PROTOCOL_VERSION, 4)).await;
    let mut fast_down = resp.expect("admitted");
    let (slow, resp) = raw_attach(&tree.frontend_addr, hello("slow", PROTOCOL_VERSION, 4)).await;
    let _slow_down = resp.expect("admitted");
    wait_start(&mut fast_down).await;
    for round in 0..3 {
        fast.send(batch_envelope(round, 0..4)).await.unwrap();
    }
    let store = tree.store.clone();
    assert_eventually!(
        rounds_stored(&store) == 3,
        Duration::from_secs(10),
        "rounds never closed"
    );
    for round in 0..3 {
        slow.send(batch_envelope(round, 4..8)).await.unwrap();
    }
    assert_eventually!(
        reader(&store).count(Table::LateArrivals).unwrap() == 3,
        Duration::from_secs(10),
        "late packets were not recorded"
    );
    fast.send(fin("prompt")).await.unwrap();
    slow.send(fin("slow")).await.unwrap();
    tree.wait_frontend(Duration::from_secs(10))
        .await
        .expect("front-end finishes");
    let rounds = tree.rounds();
    assert_eq!(rounds.len(), 3);
    for r in &rounds {
        assert_eq!(
            (r.covered, r.missing.get(MissingReason::Late), r.expected),
            (4, 4, 8),
            "{r:?}"
        );
    }
    assert_eq!(rounds.iter().map(|r| r.late_ranks).sum::<u32>(), 12);
    // Late data is kept, flagged, not dropped.
    assert_eq!(sampled_ranks(&store, Select::all().late(true)).len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_beyond_the_in_flight_limit_wait_for_earlier_ones() {
    // At most 4 rounds open at the root; a silent child holds each window until the 300 ms time-out.
    let builder = TreeBuilder {
        agents: 0,
        expect_ranks: 8,
        timeout_ms: 300,
        max_rounds_in_flight: 4,
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    let (fast, resp) = raw_attach(&tree.frontend_addr, hello("eager", PROTOCOL_VERSION, 4)).await;
    let mut fast_down = resp.expect("admitted");
    let (silent, resp) = raw_attach(&tree.frontend_addr, hello("silent", PROTOCOL_VERSION, 4)).await;
    let _silent_down = resp.expect("admitted");
    wait_start(&mut fast_down).await;
    let sender = tokio::spawn(async move {
        for round in 0..12 {
            fast.send(batch_envelope(round, 0..4)).await.unwrap();
        }
        fast
    });
    let store = tree.store.clone();
    assert_eventually!(
        rounds_stored(&store) == 12,
        Duration::from_secs(20),
        "rounds missing"
    );
    let fast = sender.await.unwrap();
    let closed: Vec<u64> = reader(&store)
        .rounds(Select::all())
        .unwrap()
        .iter()
        .filter_map(|r| r.closed_unix_ns)
        .collect();
    let span_ms = (closed.iter().max().unwrap() - closed.iter().min().unwrap()) / 1_000_000;
    // Three windows of 4 rounds, each closed by its own time-out: the last closes two time-outs after the first.
    assert!(
        span_ms >= 500,
        "rounds were not held back: all 12 closed within {span_ms} ms"
    );
    fast.send(fin("eager")).await.unwrap();
    silent.send(fin("silent")).await.unwrap();
    tree.wait_frontend(Duration::from_secs(10))
        .await
        .expect("front-end finishes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_with_a_larger_window_than_the_root_keep_their_agents_going() {
    // The root lets 2 rounds be in flight, the relays 64 (their default): the relays' limit follows the root's
    // credit a round at a time, and their agents must hear it move, not wait for it to move 16 rounds.
    for max_rounds_in_flight in [2, 4] {
        let builder = TreeBuilder {
            agents: 4,
            fanout: 2,
            ranks: 16,
            rounds: 40,
            period_ms: 20,
            max_rounds_in_flight,
            ..TreeBuilder::default()
        };
        let mut tree = builder.start().await;
        assert_eq!(tree.relay_addrs.len(), 2);
        tree.wait_frontend(Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("window {max_rounds_in_flight}: the tree stalled: {e}"));
        let rounds = tree.rounds();
        assert_eq!(rounds.len(), 40, "window {max_rounds_in_flight}");
        assert!(
            rounds.iter().all(|r| (r.covered, r.expected) == (16, 16)),
            "window {max_rounds_in_flight}: {rounds:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_ranks_attached_before_its_parent_answered_never_reports_fewer() {
    use canopy_core::node::{ChildEvent, Input};
    // A port nobody serves yet: the agent's simulated ranks attach one by one while its link retries.
    let addr = canopy_integration_tests::unused_addr();
    let config = TreeBuilder::default().agent_config("agent:0", &addr, 4, 0);
    let agent = tokio::spawn(canopy_agent::run(config, std::future::pending()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A hand-made parent: what the node behind it would hear.
    let (inputs, mut heard) = mpsc::channel(64);
    let (_window, gate) = canopy_core::window::Window::new(64);
    let service = canopy_core::transport::TreeService::new("parent".into(), inputs, gate);
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service.into_server())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut counts = Vec::new();
    let mut down = Vec::new();
    // The link retries within a second; what it sends after its Hello follows at once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while let Ok(Some(input)) = tokio::time::timeout_at(deadline, heard.recv()).await {
        match input {
            Input::Child(ChildEvent::Attached { hello, tx, .. }) => {
                counts.push(hello.ranks_below);
                down.push(tx);
            }
            Input::Child(ChildEvent::Message {
                msg: up_message::Msg::NodeEvent(ev),
                ..
            }) if ev.node_id == "agent:0" => counts.push(ev.ranks_below),
            _ => {}
        }
    }
    assert_eq!(
        counts.first(),
        Some(&4),
        "the ranks attached before the parent answered"
    );
    assert!(
        counts.iter().all(|&c| c == 4),
        "the parent heard older counts after the Hello: {counts:?}"
    );
    agent.abort();
    server.abort();
}

/// A hand-made child's histogram packet of one rank: phase 0 from its profile, or phase 2 from the ranges the
/// root sent down, made by the histogram filter itself as a leaf.
fn histogram_packet(leaf: &mut HistogramFilter, round: u64, ranges: Option<&[u8]>) -> UpMessage {
    let mut out = Collect::default();
    match ranges {
        None => leaf
            .upstream(round, 0, &[&one_event_profile(0, round as f64)], &mut out)
            .unwrap(),
        Some(ranges) => leaf.downstream(round, 1, ranges, &mut out).unwrap(),
    }
    let (phase, payload) = out.up.remove(0);
    let env = Envelope {
        stream_id: 1,
        round,
        phase,
        coverage: Some(Coverage {
            covered: 1,
            expected: 1,
            missing: vec![],
            apps: vec![],
            unreachable: vec![],
        }),
        payload: payload.into(),
        ..Envelope::default()
    };
    UpMessage {
        msg: Some(up_message::Msg::Envelope(env)),
    }
}

/// Waits on a hand-made child's down stream for the packet the root sends down for `round`.
async fn wait_down_packet(down: &mut tonic::Streaming<DownMessage>, round: u64) -> Vec<u8> {
    while let Ok(Some(m)) = down.message().await {
        if let Some(down_message::Msg::Envelope(env)) = m.msg
            && env.round == round
        {
            return env.payload.to_vec();
        }
    }
    panic!("round {round} never came down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rounds_answer_gets_through_after_the_window_moved_below_it() {
    // A child first runs round 10 (the idle root moves its window there), then round 2: the window moves back
    // down to [2, 6), below round 10, whose answer must still reach the root. Time-outs are a minute, so only
    // the answers can finish the rounds.
    let builder = TreeBuilder {
        agents: 0,
        expect_ranks: 1,
        timeout_ms: 60_000,
        max_rounds_in_flight: 4,
        streams: vec!["histogram".into()],
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    let (child, resp) = raw_attach(&tree.frontend_addr, hello("ahead", PROTOCOL_VERSION, 1)).await;
    let mut down = resp.expect("admitted");
    wait_start(&mut down).await;
    let mut leaf = HistogramFilter::create("", Level::Leaf).unwrap();
    child.send(histogram_packet(&mut leaf, 10, None)).await.unwrap();
    let ranges_10 = wait_down_packet(&mut down, 10).await;
    child.send(histogram_packet(&mut leaf, 2, None)).await.unwrap();
    let ranges_2 = wait_down_packet(&mut down, 2).await;
    child
        .send(histogram_packet(&mut leaf, 10, Some(&ranges_10)))
        .await
        .unwrap();
    let store = tree.store.clone();
    let stored = |round: u64| {
        reader(&store)
            .rounds(Select::all())
            .unwrap()
            .iter()
            .any(|r| r.round == round && r.covered == 1)
    };
    assert_eventually!(
        stored(10),
        Duration::from_secs(10),
        "round 10 was answered but never finished"
    );
    child
        .send(histogram_packet(&mut leaf, 2, Some(&ranges_2)))
        .await
        .unwrap();
    assert_eventually!(stored(2), Duration::from_secs(10), "round 2 never finished");
    child.send(fin("ahead")).await.unwrap();
    tree.wait_frontend(Duration::from_secs(10))
        .await
        .expect("front-end finishes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dont_wait_stream_stores_every_piece_and_its_coverage_adds_up() {
    let builder = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 32,
        rounds: 10,
        sync_mode: "dont_wait".into(),
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    tree.wait_frontend(Duration::from_secs(30))
        .await
        .expect("front-end finishes");
    let rounds = tree.rounds();
    assert_eq!(rounds.len(), 10);
    for r in &rounds {
        // Every rank's piece arrived on its own; together they cover the round, nothing is left not-waited.
        assert_eq!((r.covered, r.expected), (32, 32), "{r:?}");
    }
    assert_eq!(
        rounds.iter().map(|r| r.pieces).min(),
        Some(32),
        "one piece per rank, merged at the root"
    );
    assert_eq!(reader(&tree.store).count(Table::Samples).unwrap(), 32 * 20 * 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_children_are_all_lost_does_not_claim_they_finished() {
    let builder = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 32,
        rounds: 0,
        period_ms: 20,
        drain_timeout_ms: 500,
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    let store = tree.store.clone();
    assert_eventually!(rounds_stored(&store) >= 5, Duration::from_secs(20), "no rounds");
    tree.kill("agent:0");
    tree.kill("agent:1");
    assert_eventually!(
        nodes_of(&store, None, Some(NodeState::Lost)) == 2,
        Duration::from_secs(10),
        "the agents were not marked lost"
    );
    tree.shutdown("frontend:0");
    tree.wait_frontend(Duration::from_secs(5))
        .await
        .expect("drain ends by its time-out");
    // relay:0 held agent:0 and agent:1: both lost, so it never said Fin; relay:1's agents finished on the drain.
    assert_eq!(node_state(&store, "relay:0"), Some(NodeState::Attached));
    assert_eq!(node_state(&store, "relay:1"), Some(NodeState::Finished));
    // relay:0's 16 ranks are never counted stopped: a Fin from it would have turned them from lost into stopped.
    // On the drain one of relay:1's agents may dump a round more than the other, so a round may count the 8
    // ranks of the agent that finished first as stopped, never more.
    let rounds = reader(&store).rounds(Select::all()).unwrap();
    for r in &rounds {
        assert!(r.missing.get(MissingReason::Stopped) <= 8, "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_reattaches_under_its_id_and_its_ranks_report_again() {
    let builder = TreeBuilder {
        agents: 2,
        fanout: 2,
        ranks: 16,
        rounds: 150,
        period_ms: 20,
        ..TreeBuilder::default()
    };
    let mut tree = builder.clone().start().await;
    let store = tree.store.clone();
    assert_eventually!(rounds_stored(&store) >= 40, Duration::from_secs(20), "no rounds");
    let parent = tree.agent_parents["agent:1"].clone();
    tree.kill("agent:1");
    assert_eventually!(
        node_state(&store, "agent:1") == Some(NodeState::Lost),
        Duration::from_secs(10),
        "agent:1 never marked lost"
    );
    let lost_at = reader(&store).max_round().unwrap().expect("rounds") as i64;
    tokio::time::sleep(Duration::from_millis(300)).await;
    tree.add_agent("agent:1 again", builder.agent_config("agent:1", &parent, 8, 8));
    tree.wait_frontend(Duration::from_secs(30))
        .await
        .expect("front-end finishes");
    let rounds = tree.rounds();
    assert_eq!(rounds.len(), 150);
    // Rounds closed during the 300 ms outage lack agent:1's ranks, counted as unreachable.
    let partial: Vec<_> = rounds.iter().filter(|r| r.covered == 8).collect();
    assert!(
        partial.len() >= 5,
        "too few rounds missed the lost agent: {}",
        partial.len()
    );
    assert!(
        partial
            .iter()
            .all(|r| r.missing.get(MissingReason::Unreachable) == 8),
        "{partial:?}"
    );
    assert!(
        partial.iter().all(|r| r.round as i64 >= lost_at - 2),
        "rounds partial before the crash at {lost_at}"
    );
    let healed: Vec<_> = rounds.iter().rev().take_while(|r| r.covered == 16).collect();
    assert!(
        healed.len() >= 20,
        "the restarted agent's ranks did not report again: {rounds:#?}"
    );
    assert_eq!(node_state(&store, "agent:1"), Some(NodeState::Finished));
}

fn count(store: &Path, stream: u32) -> u64 {
    reader(store)
        .count_where(Table::Rounds, Select::all().stream(stream))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_from_the_root_stops_and_starts_collection_and_closes_a_stream() {
    use canopy_core::node::Collection;
    let builder = TreeBuilder {
        agents: 2,
        ranks: 8,
        rounds: 0,
        period_ms: 20,
        streams: vec!["passthrough".into(), "passthrough".into()],
        ..TreeBuilder::default()
    };
    let mut tree = builder.start().await;
    let store = tree.store.clone();
    assert_eventually!(
        count(&store, 2) >= 5,
        Duration::from_secs(20),
        "stream 2 never delivered"
    );

    // Closing stream 2 stops its rounds everywhere; stream 1 goes on over the same ranks.
    assert!(tree.root.close_stream(2).await);
    assert_eventually!(
        reader(&store).stream(2).unwrap().and_then(|s| s.state) == Some(StreamState::Closed),
        Duration::from_secs(5),
        "stream 2 not marked closed"
    );
    let closed_at = count(&store, 2);
    let one = count(&store, 1);
    assert_eventually!(
        count(&store, 1) >= one + 10,
        Duration::from_secs(20),
        "stream 1 stopped too"
    );
    assert!(
        count(&store, 2) <= closed_at + 1,
        "stream 2 kept delivering after its close"
    );

    // Stop: no new rounds. Start: they come back, numbered on without a gap.
    assert!(tree.root.collection(Collection::Stop).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopped = count(&store, 1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        count(&store, 1),
        stopped,
        "rounds went on while collection was stopped"
    );
    assert!(tree.root.collection(Collection::Start).await);
    assert_eventually!(
        count(&store, 1) >= stopped + 10,
        Duration::from_secs(20),
        "collection did not resume"
    );
    tree.shutdown("frontend:0");
    tree.wait_frontend(Duration::from_secs(5)).await.expect("drain");
    let one = reader(&store).rounds(Select::all().stream(1)).unwrap();
    let (first, last) = (one.first().unwrap().round, one.last().unwrap().round);
    assert_eq!(last - first + 1, one.len() as u64, "stream 1's rounds have a gap");
    // Every round whole; on the drain one agent may dump a last round after the other stopped, whose 4 ranks then
    // count as stopped, nothing else.
    let (last, rest) = one.split_last().unwrap();
    assert_eq!(rest.iter().filter(|r| r.covered != 8).count(), 0, "{rest:?}");
    assert!(
        last.covered == 8 || (last.covered == 4 && last.missing.get(MissingReason::Stopped) == 4),
        "{last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_end_port_serves_health_and_reflection_and_relays_serve_health() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let builder = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 8,
        rounds: 0,
        ..TreeBuilder::default()
    };
    let tree = builder.start().await;
    // Every relay answers gRPC health too.
    assert_eq!(tree.relay_addrs.len(), 2);
    for addr in tree.relay_addrs.values() {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let status = tonic_health::pb::health_client::HealthClient::new(channel)
            .check(tonic_health::pb::HealthCheckRequest {
                service: "canopy.v1.Tree".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "relay at {addr}");
    }
    let url = format!("http://{}", tree.frontend_addr);
    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "canopy.v1.Tree".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::Serving as i32);

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("not a service list");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "canopy.v1.Tree",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_before_the_ranks_attach_is_not_undone_by_them() {
    use canopy_core::node::Collection;
    let tree = TreeBuilder {
        agents: 0,
        expect_ranks: 4,
        ..TreeBuilder::default()
    }
    .start()
    .await;
    assert!(tree.root.collection(Collection::Stop).await);
    let (_tx, resp) = raw_attach(&tree.frontend_addr, hello("late", PROTOCOL_VERSION, 4)).await;
    let mut down = resp.expect("admitted");
    let starts = |m: &DownMessage| matches!(&m.msg, Some(down_message::Msg::Control(c)) if matches!(c.action, Some(canopy_proto::v1::control::Action::Start(_))));
    // Everything the child hears in the first moments: no Start, though its 4 ranks are all that was expected.
    let mut heard = Vec::new();
    while let Ok(Ok(Some(m))) = tokio::time::timeout(Duration::from_millis(300), down.message()).await {
        heard.push(m);
    }
    assert!(
        !heard.iter().any(starts),
        "collection started though it was stopped: {heard:?}"
    );
    assert!(tree.root.collection(Collection::Start).await);
    let m = tokio::time::timeout(Duration::from_secs(5), down.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(starts(&m), "{m:?}");
}

/// Streams opened while the ranks dump start at a round every leaf feeds whole: however an opening falls between
/// the leaves' dumps, a stream's first stored round and every one after it cover every rank, with no round
/// missing in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_opened_while_the_ranks_dump_are_whole_from_their_first_round() {
    use canopy_proto::v1::{StreamSpec, SyncMode};
    let mut tree = TreeBuilder {
        agents: 4,
        ranks: 16,
        rounds: 150,
        period_ms: 10,
        timeout_ms: 5000,
        streams: vec!["stats".into()],
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let store = tree.store.clone();
    assert_eventually!(
        rounds_stored(&store) >= 5,
        Duration::from_secs(30),
        "the run's rounds flow"
    );
    let mut opened = Vec::new();
    for i in 0..12 {
        let spec = StreamSpec {
            name: format!("s{i}"),
            filter: "stats".into(),
            sync_mode: SyncMode::WaitForAll as i32,
            timeout_ms: 5000,
            ..StreamSpec::default()
        };
        opened.push(tree.root.open_stream_id(spec).await);
        // Openings that fall at every point of a round: 10 ms rounds, one every 23 ms.
        tokio::time::sleep(Duration::from_millis(23)).await;
    }
    tree.wait_frontend(Duration::from_secs(60))
        .await
        .expect("the tree goes on and finishes");
    let stored = tree.rounds();
    for id in opened {
        let rounds: Vec<_> = stored.iter().filter(|r| r.stream_id == id).collect();
        assert!(rounds.len() >= 10, "stream {id}: {rounds:#?}");
        let not_whole: Vec<_> = rounds.iter().filter(|r| !r.is_full()).collect();
        assert!(not_whole.is_empty(), "stream {id}: {not_whole:#?}");
        let first = rounds.iter().map(|r| r.round).min().unwrap();
        let last = rounds.iter().map(|r| r.round).max().unwrap();
        assert_eq!(
            rounds.len() as u64,
            last - first + 1,
            "stream {id}: a round between is missing"
        );
    }
}
