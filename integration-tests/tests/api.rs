//! The front-end's `canopy.v1.Frontend` API on a running tree: streams, subscriptions, control, topology.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use canopy_integration_tests::{
    Select, SimAgent, Table, TreeBuilder, TreeSandbox, assert_eventually, reader, start_frontend,
};
use canopy_proto::filters::v1::Metric;
use canopy_proto::v1::MissingReason;
use canopy_proto::v1::frontend_client::FrontendClient;
use canopy_proto::v1::{
    CloseStreamRequest, ControlRequest, CreateStreamRequest, EventNamesRequest, ListStreamsRequest, NodeKind,
    NodeState, SubscribeRequest, SyncMode, TopologyRequest, control_request, subscribe_request,
};
use prost::Message;
use tonic::transport::Channel;

/// How many rounds the store holds.
fn rounds_stored(store: &Path) -> u64 {
    reader(store).count(Table::Rounds).unwrap()
}

/// The rounds of every stream after `mark`.
fn rounds_after(store: &Path, mark: u64) -> Vec<canopy_integration_tests::RoundRow> {
    reader(store).rounds(Select::all().from_round(mark + 1)).unwrap()
}

async fn client(tree: &TreeSandbox) -> FrontendClient<Channel> {
    FrontendClient::connect(format!("http://{}", tree.frontend_addr))
        .await
        .expect("connect")
}

fn create(filter: &str, params: &str) -> CreateStreamRequest {
    CreateStreamRequest {
        filter: filter.into(),
        params_json: params.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_stream_requests_get_precise_codes_and_messages() {
    let tree = TreeBuilder {
        agents: 1,
        ranks: 4,
        rounds: 0,
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let mut api = client(&tree).await;
    let e = api.create_stream(create("nosuch", "")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(
        e.message().starts_with("unknown filter \"nosuch\" (available: "),
        "{}",
        e.message()
    );
    let e = api
        .create_stream(create("histogram", r#"{"bins": 0}"#))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("bins must be between 1 and 10000, got 0"),
        "{}",
        e.message()
    );
    let e = api.create_stream(create("stats", "not json")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let mut r = create("stats", "");
    r.timeout_ms = 3_600_000;
    let e = api.create_stream(r).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        e.message(),
        "timeout_ms 3600000 is over the limit of 600000 (10 minutes)"
    );
    let mut r = create("classify", "");
    r.sync_mode = SyncMode::DontWait as i32;
    let e = api.create_stream(r).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("filter classify has 3 phases"),
        "{}",
        e.message()
    );
    let e = api
        .close_stream(CloseStreamRequest { stream_id: 99 })
        .await
        .unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::NotFound, "no stream 99"));
    let e = api.control(ControlRequest { action: None }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_created_over_the_api_delivers_typed_results_and_closes() {
    let tree = TreeBuilder {
        agents: 2,
        ranks: 8,
        rounds: 0,
        period_ms: 20,
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let mut api = client(&tree).await;
    let info = api
        .create_stream(create("stats", r#"{"values": "cumulative"}"#))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (info.stream_id, info.state.as_str(), info.result_type.as_str()),
        (2, "open", "canopy.filters.v1.StatsResult")
    );
    let mut updates = api
        .subscribe(SubscribeRequest {
            stream_ids: vec![info.stream_id],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    for _ in 0..3 {
        let u = tokio::time::timeout(Duration::from_secs(10), updates.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(u.stream_id, 2);
        let cov = u.coverage.unwrap();
        assert_eq!((cov.covered, cov.expected), (8, 8));
        let any = u.result.unwrap();
        assert_eq!(any.type_url, "type.googleapis.com/canopy.filters.v1.StatsResult");
        let stats = canopy_proto::filters::v1::StatsResult::decode(any.value.as_slice()).unwrap();
        assert!(stats.stats.iter().all(|s| s.summary.as_ref().unwrap().count == 8));
    }
    let listed = api
        .list_streams(ListStreamsRequest {})
        .await
        .unwrap()
        .into_inner()
        .streams;
    let two = listed.iter().find(|s| s.stream_id == 2).unwrap();
    assert_eq!(
        (two.filter.as_str(), two.params_json.as_str()),
        ("stats", r#"{"values": "cumulative"}"#)
    );
    assert!(two.rounds >= 3 && two.full_rounds == two.rounds, "{two:?}");
    let closed = api
        .close_stream(CloseStreamRequest { stream_id: 2 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(closed.state, "closed");
    let store = tree.store.clone();
    assert_eventually!(
        api.list_streams(ListStreamsRequest {})
            .await
            .unwrap()
            .into_inner()
            .streams
            .iter()
            .any(|s| s.stream_id == 2 && s.state == "closed"),
        Duration::from_secs(5),
        "not closed in the list"
    );
    let e = api
        .close_stream(CloseStreamRequest { stream_id: 2 })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        reader(&store)
            .count_where(Table::Stats, Select::all().stream(2))
            .unwrap()
            > 0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscriber_is_told_what_it_missed_and_never_stalls_the_tree() {
    let builder = TreeBuilder {
        agents: 2,
        ranks: 8,
        rounds: 0,
        period_ms: 10,
        subscriber_buffer: 4,
        ..TreeBuilder::default()
    };
    let tree = builder.start().await;
    let mut api = client(&tree).await;
    let mut slow = api
        .subscribe(SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    let store = tree.store.clone();
    let before = rounds_stored(&store);
    // Read nothing while the tree runs on: 300 more rounds must be stored all the same.
    assert_eventually!(
        rounds_stored(&store) >= before + 300,
        Duration::from_secs(20),
        "the tree stalled behind a slow subscriber"
    );
    // Every update says how many were missed since the one before; read until they add up (a busy machine may
    // first report a small lag, before the subscriber's queue filled).
    let mut missed = 0;
    for _ in 0..400 {
        let u = slow.message().await.unwrap().unwrap();
        missed += u.missed;
        if missed >= 10 {
            break;
        }
    }
    assert!(
        missed >= 10,
        "the subscriber was not told what it missed: {missed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_subscribers_each_receive_every_round() {
    let tree = TreeBuilder {
        agents: 2,
        ranks: 8,
        rounds: 30,
        period_ms: 20,
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let url = format!("http://{}", tree.frontend_addr);
    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let mut api = FrontendClient::new(channel.clone());
        tasks.push(tokio::spawn(async move {
            // Replay first, so a subscriber that connects after the first rounds still gets them all.
            let req = SubscribeRequest {
                start: Some(subscribe_request::Start::Replay(true)),
                ..Default::default()
            };
            let mut s = api.subscribe(req).await.unwrap().into_inner();
            let mut rounds = BTreeSet::new();
            while rounds.len() < 30 {
                let Ok(Ok(Some(u))) = tokio::time::timeout(Duration::from_secs(20), s.message()).await else {
                    break;
                };
                assert_eq!(u.coverage.unwrap().covered, 8);
                rounds.insert(u.round);
            }
            rounds
        }));
    }
    for t in tasks {
        let rounds = t.await.unwrap();
        assert_eq!(rounds, (0..30).collect::<BTreeSet<u64>>());
    }
}

/// A real front-end process (its `extra` flags added) with 100 subscriptions from the start, on one connection,
/// and two simulated agents of 8 ranks each running 30 rounds of `stats` over 100 events: more than the
/// connection's flow-control window holds, so what the subscribers do not read stays queued at the front-end.
struct SubscribedRun {
    _dir: tempfile::TempDir,
    fe: canopy_integration_tests::Proc,
    store: std::path::PathBuf,
    streams: Vec<tonic::Streaming<canopy_proto::v1::RoundUpdate>>,
    _agents: Vec<canopy_integration_tests::Proc>,
}

impl SubscribedRun {
    const ROUNDS: u64 = 30;

    async fn start(extra: &[&str]) -> SubscribedRun {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec!["--insecure", "--expect-ranks", "16", "--exit-on-fin", "true"];
        args.extend_from_slice(extra);
        let (fe, fe_addr, store) = start_frontend(dir.path(), &args);
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{fe_addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut streams = Vec::new();
        for _ in 0..100 {
            let req = SubscribeRequest {
                start: Some(subscribe_request::Start::Replay(true)),
                ..Default::default()
            };
            let mut api = FrontendClient::new(channel.clone());
            streams.push(api.subscribe(req).await.unwrap().into_inner());
        }
        let agents = [("agent-0", 0), ("agent-1", 8)]
            .into_iter()
            .map(|(id, offset)| {
                SimAgent {
                    id,
                    parents: &fe_addr,
                    ranks: 8,
                    offset,
                    total: 16,
                    period_ms: 10,
                    rounds: Self::ROUNDS,
                }
                .start_with(dir.path(), &["--insecure"])
            })
            .collect();
        SubscribedRun {
            _dir: dir,
            fe,
            store,
            streams,
            _agents: agents,
        }
    }
}

/// Subscribers that read more slowly than the run went still receive every round before the front-end exits:
/// the front-end process, its run ended, waits for them to take what is queued instead of exiting with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_behind_at_the_end_of_the_run_still_receive_every_round() {
    let mut run = SubscribedRun::start(&[]).await;
    let store = run.store.clone();
    assert_eventually!(
        rounds_stored(&store) == SubscribedRun::ROUNDS,
        Duration::from_secs(30),
        "rounds stored"
    );
    // The run ends with its last round; nobody reads for longer than a front-end waited for its server to stop.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let readers = std::mem::take(&mut run.streams).into_iter().map(|mut s| {
        tokio::spawn(async move {
            let mut rounds = BTreeSet::new();
            loop {
                match tokio::time::timeout(Duration::from_secs(20), s.message()).await {
                    Ok(Ok(Some(u))) => {
                        rounds.insert(u.round);
                    }
                    Ok(Ok(None)) => return Ok(rounds),
                    Ok(Err(status)) => return Err(format!("after {} rounds: {status}", rounds.len())),
                    Err(_) => return Err(format!("after {} rounds: nothing for 20 s", rounds.len())),
                }
            }
        })
    });
    for r in readers.collect::<Vec<_>>() {
        // Every round, then the stream's end with OK.
        assert_eq!(
            r.await.unwrap().unwrap(),
            (0..SubscribedRun::ROUNDS).collect::<BTreeSet<u64>>()
        );
    }
    let status = run
        .fe
        .wait_timeout(Duration::from_secs(20))
        .expect("the front-end exits");
    assert!(status.success(), "{status}: {}", run.fe.log_text());
}

/// Subscribers that never read cannot keep a front-end whose run ended: it waits for them `subscriber_drain_ms`,
/// then exits with its run stored whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_that_never_read_hold_the_end_of_the_run_no_longer_than_the_drain() {
    // The subscriptions stay held open (in `run`) and are never read.
    let mut run = SubscribedRun::start(&["--subscriber-drain-ms", "1000"]).await;
    // On this worker only: the other keeps the client's connection going.
    let status = tokio::task::block_in_place(|| run.fe.wait_timeout(Duration::from_secs(30)));
    match status {
        Some(status) => assert!(status.success(), "{status}: {}", run.fe.log_text()),
        None => panic!(
            "the front-end still runs 30 s on, its subscribers unread: {}",
            run.fe.log_text()
        ),
    }
    assert_eq!(rounds_stored(&run.store), SubscribedRun::ROUNDS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_names_and_control_describe_and_drive_the_tree() {
    let tree = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 16,
        rounds: 0,
        period_ms: 20,
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let mut api = client(&tree).await;
    let store = tree.store.clone();
    assert_eventually!(rounds_stored(&store) >= 3, Duration::from_secs(20), "no rounds");
    let nodes = api.topology(TopologyRequest {}).await.unwrap().into_inner().nodes;
    let fe = nodes.iter().find(|n| n.node_id == "frontend:0").unwrap();
    assert_eq!(fe.kind, NodeKind::Frontend as i32);
    assert_eq!(fe.children.len(), 2);
    let relays: Vec<_> = nodes
        .iter()
        .filter(|n| n.kind == NodeKind::Relay as i32)
        .collect();
    assert_eq!(relays.len(), 2);
    assert!(
        relays
            .iter()
            .all(|r| r.children.len() == 2 && r.ranks_below == 8 && r.parent_id == "frontend:0")
    );
    assert!(
        nodes
            .iter()
            .filter(|n| n.kind == NodeKind::Agent as i32)
            .all(|a| a.state == NodeState::Attached as i32)
    );
    assert_eventually!(
        api.topology(TopologyRequest {})
            .await
            .unwrap()
            .into_inner()
            .nodes
            .iter()
            .any(|n| n.node_id == "relay:0" && n.rounds_closed > 0),
        Duration::from_secs(5),
        "no status counters from the relays"
    );
    // Each node reports the time its filters take, per stream, and how far behind it is.
    assert_eventually!(
        api.topology(TopologyRequest {})
            .await
            .unwrap()
            .into_inner()
            .nodes
            .iter()
            .any(|n| n.node_id == "relay:0" && n.filter_time.iter().any(|f| f.stream_id == 1 && f.calls > 0)),
        Duration::from_secs(5),
        "no filter time from the relays"
    );
    let relay = api.topology(TopologyRequest {}).await.unwrap().into_inner().nodes;
    let relay = relay.iter().find(|n| n.node_id == "relay:0").unwrap();
    assert!(
        relay.lag_rounds <= 2,
        "a relay of a healthy tree lags {} rounds",
        relay.lag_rounds
    );
    let names = api
        .event_names(EventNamesRequest {})
        .await
        .unwrap()
        .into_inner()
        .names;
    let allreduce = names
        .iter()
        .find(|n| n.name == "MPI_Allreduce")
        .expect("MPI_Allreduce named");
    assert_eq!(allreduce.id, canopy_proto::event_id("MPI_Allreduce"));

    let stop = ControlRequest {
        action: Some(control_request::Action::Stop(true)),
    };
    assert_eq!(api.control(stop).await.unwrap().into_inner().applied, "stop");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopped = rounds_stored(&store);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rounds_stored(&store), stopped);
    let start = ControlRequest {
        action: Some(control_request::Action::Start(true)),
    };
    assert_eq!(api.control(start).await.unwrap().into_inner().applied, "start");
    assert_eventually!(
        rounds_stored(&store) >= stopped + 5,
        Duration::from_secs(10),
        "collection did not resume"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measurement_options_change_the_next_rounds() {
    use canopy_proto::v1::Options;
    let tree = TreeBuilder {
        agents: 2,
        ranks: 8,
        rounds: 0,
        period_ms: 20,
        streams: vec!["stats".into()],
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let mut api = client(&tree).await;
    let store = tree.store.clone();
    assert_eventually!(rounds_stored(&store) >= 2, Duration::from_secs(20), "no rounds");
    let set = |o: Options| ControlRequest {
        action: Some(control_request::Action::Options(o)),
    };
    let mpi_only = Options {
        include: vec!["^MPI_".into()],
        exclude: vec!["^MPI_Barrier$".into()],
        metrics: vec!["exclusive".into()],
        sample_below: 4,
        ..Default::default()
    };
    assert_eq!(
        api.control(set(mpi_only)).await.unwrap().into_inner().applied,
        "options"
    );
    let mark = reader(&store).max_round().unwrap().unwrap() + 2;
    assert_eventually!(
        rounds_after(&store, mark).len() >= 5,
        Duration::from_secs(20),
        "rounds stopped"
    );
    // Only ranks 0..3 report, the others are sampled out; only MPI events but MPI_Barrier; only exclusive time.
    let partial = rounds_after(&store, mark)
        .into_iter()
        .filter(|r| r.covered != 4 || r.missing.get(MissingReason::SampledOut) != 4)
        .count();
    assert_eq!(partial, 0);
    let stored = reader(&store);
    let names: HashMap<u64, String> = stored.names().unwrap().into_iter().collect();
    let later: Vec<(String, Metric)> = stored
        .stats(Select::all().from_round(mark + 1))
        .unwrap()
        .into_iter()
        .filter_map(|s| Some((names.get(&s.id)?.clone(), s.metric)))
        .collect();
    assert!(!later.is_empty(), "no stats after the options");
    assert!(
        later
            .iter()
            .all(|(n, m)| n.starts_with("MPI_") && n != "MPI_Barrier" && *m == Metric::Exclusive),
        "{later:?}"
    );
    assert!(later.iter().all(|(_, m)| *m != Metric::Counter));

    // Bad options are refused with what is wrong; the empty set restores everything, including the period.
    let bad = Options {
        include: vec!["(".into()],
        ..Default::default()
    };
    let e = api.control(set(bad)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().starts_with("bad pattern \"(\""), "{}", e.message());
    let back = Options {
        period_ms: 60,
        ..Default::default()
    };
    api.control(set(back)).await.unwrap();
    let mark = reader(&store).max_round().unwrap().unwrap() + 2;
    assert_eventually!(
        rounds_after(&store, mark).len() >= 4,
        Duration::from_secs(20),
        "rounds stopped after the reset"
    );
    let later = rounds_after(&store, mark);
    assert_eq!(later.iter().map(|r| r.covered).min(), Some(8));
    // The dumps now come 60 ms apart.
    let dumps: Vec<u64> = later.iter().filter_map(|r| r.first_dump_unix_ns).collect();
    let spread = dumps.iter().max().unwrap() - dumps.iter().min().unwrap();
    let gap_ms = spread / (later.len() as u64 - 1) / 1_000_000;
    assert!((50..=80).contains(&gap_ms), "period {gap_ms} ms");
    let metrics: HashSet<Metric> = reader(&store)
        .stats(Select::all().from_round(mark + 1))
        .unwrap()
        .iter()
        .map(|s| s.metric)
        .collect();
    assert_eq!(metrics.len(), 4, "every metric reported again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detail_from_chosen_ranks_arrives_in_a_stream_of_its_own() {
    use canopy_proto::v1::DetailRequest;
    let tree = TreeBuilder {
        agents: 2,
        ranks: 8,
        rounds: 0,
        period_ms: 20,
        streams: vec!["stats".into()],
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let mut api = client(&tree).await;
    let detail = ControlRequest {
        action: Some(control_request::Action::Detail(DetailRequest {
            ranks: "1,5-6".into(),
            name: String::new(),
            ..DetailRequest::default()
        })),
    };
    let r = api.control(detail).await.unwrap().into_inner();
    assert_eq!((r.applied.as_str(), r.stream_id), ("detail", 2));
    let store = tree.store.clone();
    assert_eventually!(
        reader(&store)
            .count_where(Table::Rounds, Select::all().stream(2))
            .unwrap()
            >= 5,
        Duration::from_secs(20),
        "no detail rounds"
    );
    // Raw profiles of ranks 1, 5 and 6 only; the other five count as sampled out, not as missing data.
    let stored = reader(&store);
    let samples = stored.samples(Select::all().stream(2)).unwrap();
    let ranks: BTreeSet<u32> = samples.iter().map(|s| s.rank).collect();
    assert_eq!(ranks.len(), 3);
    let round_ranks: BTreeSet<(u64, u32)> = samples.iter().map(|s| (s.round, s.rank)).collect();
    let rounds: BTreeSet<u64> = samples.iter().map(|s| s.round).collect();
    let rank_sum: u64 = round_ranks.iter().map(|(_, rank)| u64::from(*rank)).sum();
    assert_eq!(rank_sum / rounds.len() as u64, 12);
    let detail = stored.rounds(Select::all().stream(2)).unwrap();
    assert_eq!(
        detail
            .iter()
            .filter(|r| !(r.covered == 3 && r.missing.get(MissingReason::SampledOut) == 5))
            .count(),
        0
    );
    // The stats stream still covers every rank.
    let stats = stored.rounds(Select::all().stream(1)).unwrap();
    assert_eq!(stats.iter().map(|r| r.covered).min(), Some(8));
    let listed = api
        .list_streams(ListStreamsRequest {})
        .await
        .unwrap()
        .into_inner()
        .streams;
    assert_eq!(listed.iter().find(|s| s.stream_id == 2).unwrap().ranks, "1,5-6");
    let e = api
        .control(ControlRequest {
            action: Some(control_request::Action::Detail(DetailRequest {
                ranks: "9-2".into(),
                name: String::new(),
                ..DetailRequest::default()
            })),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(e.message(), "bad rank range \"9-2\": 9 is above 2");
    // A selection that names no rank would be every rank's raw profile: refused.
    let e = api
        .control(ControlRequest {
            action: Some(control_request::Action::Detail(DetailRequest {
                ranks: " , ".into(),
                name: String::new(),
                ..DetailRequest::default()
            })),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_passthrough_round_is_the_live_one_byte_for_byte() {
    let tree = TreeBuilder {
        agents: 2,
        ranks: 8,
        rounds: 0,
        period_ms: 20,
        streams: vec!["passthrough".into()],
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let mut api = client(&tree).await;
    let only = |start| SubscribeRequest {
        stream_ids: vec![1],
        start,
        ..Default::default()
    };
    let mut live = api.subscribe(only(None)).await.unwrap().into_inner();
    let mut seen = BTreeMap::new();
    while seen.len() < 5 {
        let u = tokio::time::timeout(Duration::from_secs(10), live.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(!u.replayed);
        seen.insert(u.round, u);
    }
    let replay = Some(subscribe_request::Start::Replay(true));
    let mut stored = api.subscribe(only(replay)).await.unwrap().into_inner();
    let mut compared = 0;
    while compared < seen.len() {
        let u = tokio::time::timeout(Duration::from_secs(10), stored.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let Some(l) = seen.get(&u.round) else { continue };
        assert!(u.replayed, "round {} came live before its replay", u.round);
        let (replayed, sent) = (u.result.as_ref().unwrap(), l.result.as_ref().unwrap());
        assert_eq!(replayed.type_url, "type.googleapis.com/canopy.v1.ProfileBatch");
        assert_eq!(replayed.type_url, sent.type_url);
        assert!(!sent.value.is_empty());
        assert!(
            replayed.value == sent.value,
            "round {}: the replay differs from the live result",
            u.round
        );
        assert_eq!(u.coverage, l.coverage);
        compared += 1;
    }
}

/// At the normal end of a run every subscription ends with OK after its last round, live or replayed, and
/// one that begins after the end gets the stored rounds and ends too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_ends_with_ok_after_the_last_round_when_the_run_ends() {
    let mut tree = TreeBuilder {
        agents: 2,
        ranks: 8,
        rounds: 20,
        period_ms: 20,
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let mut api = client(&tree).await;
    let req = SubscribeRequest {
        start: Some(subscribe_request::Start::Replay(true)),
        ..Default::default()
    };
    let mut s = api.subscribe(req.clone()).await.unwrap().into_inner();
    let mut rounds = BTreeSet::new();
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(30), s.message()).await {
            Ok(Ok(Some(u))) => {
                rounds.insert(u.round);
            }
            Ok(Ok(None)) => break Ok(()),
            Ok(Err(status)) => break Err(status),
            Err(_) => panic!("the subscription did not end within 30 s of its last update"),
        }
    };
    assert!(end.is_ok(), "the subscription ended with {end:?}, not OK");
    assert_eq!(rounds, (0..20).collect::<BTreeSet<u64>>());
    tree.wait_frontend(Duration::from_secs(10)).await.unwrap();
}

/// A drain of the front-end (its SIGTERM) ends a live subscription with OK too, after the rounds the drain
/// closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_ends_with_ok_when_the_front_end_drains() {
    let mut tree = TreeBuilder {
        agents: 2,
        ranks: 8,
        rounds: 0,
        period_ms: 20,
        exit_on_fin: false,
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let mut api = client(&tree).await;
    let mut s = api
        .subscribe(SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut updates = 0;
    while updates < 5 {
        let u = tokio::time::timeout(Duration::from_secs(30), s.message())
            .await
            .expect("no update within 30 s")
            .expect("the subscription failed");
        assert!(u.is_some(), "the subscription ended before the drain");
        updates += 1;
    }
    tree.drain_frontend();
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(30), s.message()).await {
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) => break Ok(()),
            Ok(Err(status)) => break Err(status),
            Err(_) => panic!("the subscription did not end within 30 s of the drain"),
        }
    };
    assert!(end.is_ok(), "the subscription ended with {end:?}, not OK");
    tree.wait_frontend(Duration::from_secs(20)).await.unwrap();
}

/// `fromRound` is exact: stored rounds from it on, and live rounds too, so a round in the future is where the
/// subscription starts; no round below it comes, and none from it is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_round_starts_exactly_there_for_stored_and_live_rounds() {
    let tree = TreeBuilder {
        agents: 2,
        ranks: 8,
        rounds: 40,
        period_ms: 25,
        streams: vec!["stats".into()],
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let mut api = client(&tree).await;
    let from = |round| SubscribeRequest {
        start: Some(subscribe_request::Start::FromRound(round)),
        ..Default::default()
    };
    // Wait for a few rounds, so that one subscription starts in the past and one in the future.
    let mut live = api
        .subscribe(SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    let now = loop {
        let u = tokio::time::timeout(Duration::from_secs(10), live.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if u.round >= 5 {
            break u.round;
        }
    };
    let starts = [now - 3, now + 15];
    let mut subscriptions = Vec::new();
    for start in starts {
        subscriptions.push((start, api.subscribe(from(start)).await.unwrap().into_inner()));
    }
    for (start, mut s) in subscriptions {
        let mut rounds = BTreeSet::new();
        while let Some(u) = tokio::time::timeout(Duration::from_secs(30), s.message())
            .await
            .expect("the subscription ends when the run does")
            .unwrap()
        {
            assert!(
                u.round >= start,
                "round {} came to a subscription from round {start}",
                u.round
            );
            rounds.insert(u.round);
        }
        assert_eq!(
            rounds,
            (start..40).collect::<BTreeSet<u64>>(),
            "from round {start}"
        );
    }
}

/// With names asked for, every event a stats result names has its name sent with that update or an earlier
/// one, each name once, the run's names; without, no update carries names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_with_names_is_sent_each_name_once_before_its_event_appears() {
    use canopy_proto::filters::v1::StatsResult;

    let tree = TreeBuilder {
        agents: 2,
        ranks: 8,
        rounds: 15,
        period_ms: 20,
        streams: vec!["stats".into()],
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let mut api = client(&tree).await;
    let with = |with_names| SubscribeRequest {
        start: Some(subscribe_request::Start::Replay(true)),
        with_names,
        ..Default::default()
    };
    let mut named = api.subscribe(with(true)).await.unwrap().into_inner();
    let mut plain = api.subscribe(with(false)).await.unwrap().into_inner();
    let mut names: HashMap<u64, String> = HashMap::new();
    let mut updates = 0;
    while let Some(u) = tokio::time::timeout(Duration::from_secs(30), named.message())
        .await
        .unwrap()
        .unwrap()
    {
        for n in u.names {
            assert!(
                names.insert(n.id, n.name.clone()).is_none(),
                "{} sent twice",
                n.name
            );
        }
        let stats = StatsResult::decode(u.result.unwrap().value.as_slice()).unwrap();
        for s in stats.stats {
            assert!(
                names.contains_key(&s.id),
                "round {}: event {:#x} before its name",
                u.round,
                s.id
            );
        }
        updates += 1;
    }
    assert_eq!(updates, 15);
    while let Some(u) = tokio::time::timeout(Duration::from_secs(30), plain.message())
        .await
        .unwrap()
        .unwrap()
    {
        assert!(u.names.is_empty());
    }
    // The names sent are the run's names (as the store has them; the front-end has ended with the run).
    let tree_names: HashMap<u64, String> = reader(&tree.store).names().unwrap().into_iter().collect();
    assert!(!names.is_empty());
    for (id, name) in &names {
        assert_eq!(tree_names.get(id), Some(name));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_of_rounds_collects_exactly_those_rounds_on_every_rank() {
    use canopy_proto::v1::Window;
    let tree = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 16,
        rounds: 0,
        period_ms: 20,
        streams: vec!["stats".into()],
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let store = tree.store.clone();
    assert_eventually!(rounds_stored(&store) >= 3, Duration::from_secs(20), "no rounds");
    let mut api = client(&tree).await;
    let window = |from_round, to_round| ControlRequest {
        action: Some(control_request::Action::Window(Window { from_round, to_round })),
    };
    // A window that starts where the tree may already be cannot be exact: refused, with the first round it could.
    let e = api.control(window(1, 40)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    let first: u64 = e
        .message()
        .rsplit_once("start the window at round ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no first round in {:?}", e.message()));
    assert!(
        e.message()
            .starts_with("window refused: round 1 is not in the future"),
        "{}",
        e.message()
    );
    let e = api.control(window(first + 9, first + 4)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        e.message(),
        format!(
            "window refused: the window ends (round {}) before it starts (round {})",
            first + 4,
            first + 9
        )
    );

    let (from, to) = (first + 6, first + 10);
    let r = api.control(window(from, to)).await.unwrap().into_inner();
    assert_eq!(r.applied, format!("window: rounds {from} to {to}"));
    assert_eventually!(
        reader(&store)
            .rounds(Select::all().from_round(to))
            .unwrap()
            .iter()
            .any(|r| r.round == to),
        Duration::from_secs(20),
        "round {to} never stored"
    );
    // Well past the window (ten periods): nothing more comes.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let after: Vec<(u64, u32)> = reader(&store)
        .rounds(Select::all().from_round(first))
        .unwrap()
        .iter()
        .map(|r| (r.round, r.covered))
        .collect();
    let expected: Vec<(u64, u32)> = (from..=to).map(|round| (round, 16)).collect();
    assert_eq!(after, expected, "rounds from {first} on");
}
