//! Writes the seed corpora in `fuzz/seeds/<target>/`: a few small inputs per target, built from real messages
//! and packets so that a fuzzer starts past the first bytes of every format. Run it after a format changes:
//! `cargo test -p canopy-fuzz-targets --test seeds -- --ignored`.

use std::path::Path;

use canopy_filter_sdk::{Filter, Level};
use canopy_filter_test::{Collect, DataSpec, Rng, encode_one, random_profiles};
use canopy_fuzz_targets::input::Builder;
use canopy_fuzz_targets::tree::grpc_body;
use canopy_proto::v1::{
    CloseStream, Control, Coverage, Credit, DownMessage, Envelope, EventName, Fin, Hello, Missing,
    NameDictionary, NodeEvent, NodeKind, NodeStatus, OpenStream, Start, Stop, StreamError, StreamSpec,
    SyncMode, UpMessage, Want, control, down_message, up_message,
};
use canopy_wire::v1::{
    AgentMessage, AppOptions, Options, RankControl, RankDump, RankFin, RankHello, RankMessage, RankRefused,
    agent_message, rank_message,
};
use prost::Message;

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target);
    std::fs::create_dir_all(&dir).unwrap();
    assert!(bytes.len() <= 4096, "{target}/{name}: {} bytes", bytes.len());
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn frames(msgs: &[impl Message]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in msgs {
        canopy_wire::encode_frame(m, &mut out);
    }
    out
}

/// Leaf inputs: `n` ranks' profiles of a round, each a one-profile batch.
fn profiles(seed: u64, n: usize, round: u64) -> Vec<Vec<u8>> {
    let spec = DataSpec::default();
    random_profiles(&mut Rng::new(seed), &spec, n, round)
        .iter()
        .map(encode_one)
        .collect()
}

fn names() -> Vec<EventName> {
    DataSpec::default()
        .names()
        .into_iter()
        .map(|(id, name)| EventName { id, name })
        .collect()
}

fn rank_frames() {
    let hello = |rank: u32| RankMessage {
        msg: Some(rank_message::Msg::Hello(RankHello {
            protocol_version: 1,
            app: "stencil".into(),
            rank,
            nranks: 4,
            pid: 100 + rank,
            next_round: 0,
        })),
    };
    let profile = canopy_filter_test::one_event_profile(1, 12.5);
    // A dump carries a RankProfile; the agent wraps it as a batch.
    let profile = canopy_wire::v1::ProfileBatch::decode(profile.as_slice())
        .unwrap()
        .profiles[0]
        .encode_to_vec();
    let dump = |round: u64, absence: i32| RankMessage {
        msg: Some(rank_message::Msg::Dump(RankDump {
            round,
            dump_unix_ns: 1_700_000_000_000_000_000,
            names: if round == 0 { names() } else { vec![] },
            profile: if absence == 0 { profile.clone() } else { vec![] },
            absence,
            dropped: round / 2,
            notices: if round == 0 {
                vec!["counter \"cycles\" is unavailable (no PMU)".into()]
            } else {
                vec![]
            },
        })),
    };
    let fin = RankMessage {
        msg: Some(rank_message::Msg::Fin(RankFin {
            rounds_end: 3,
            dropped: 1,
        })),
    };
    let session = frames(&[hello(1), dump(0, 0), dump(1, 0), dump(2, 1), dump(3, 2), fin]);
    write(
        "rank_frames",
        "session",
        &Builder::default().byte(0).rest(&session).finish(),
    );
    write(
        "rank_frames",
        "hello",
        &Builder::default().byte(3).rest(&frames(&[hello(0)])).finish(),
    );
    let mut long = frames(&[hello(2)]);
    long.extend_from_slice(&(2u32 << 20).to_le_bytes());
    long.extend_from_slice(&[0x12; 16]);
    write(
        "rank_frames",
        "over-limit",
        &Builder::default().byte(0).rest(&long).finish(),
    );
    let agent = frames(&[
        AgentMessage {
            msg: Some(agent_message::Msg::Control(RankControl {
                collecting: true,
                options: Some(Options {
                    include: vec!["^MPI_".into()],
                    metrics: vec!["exclusive".into()],
                    ..Default::default()
                }),
                ..Default::default()
            })),
        },
        AgentMessage {
            msg: Some(agent_message::Msg::Refused(RankRefused {
                reason: "rank 9 of stencil (pid 1) is not below the application's announced size 4".into(),
            })),
        },
        AgentMessage {
            msg: Some(agent_message::Msg::FinAck(Default::default())),
        },
    ]);
    write(
        "rank_frames",
        "agent-side",
        &Builder::default().byte(1).rest(&agent).finish(),
    );
}

fn measure_options() {
    let seeds = [
        (
            "select",
            Options {
                include: vec!["^MPI_".into(), "main".into()],
                exclude: vec!["Barrier".into()],
                metrics: vec!["exclusive".into(), "calls".into()],
                period_ms: 100,
                sample_below: 0,
                modules: vec!["profile".into(), "trace".into()],
                trace_ranks: "0-3,17".into(),
                counters: vec!["page-faults".into(), "heap".into()],
                apps: Vec::new(),
                time_rounds: None,
            },
        ),
        (
            "sample",
            Options {
                metrics: vec!["counters".into(), "inclusive".into()],
                sample_below: 2,
                ..Default::default()
            },
        ),
        (
            "bad-pattern",
            Options {
                include: vec!["(a|b".into()],
                ..Default::default()
            },
        ),
        (
            "classes",
            Options {
                include: vec![r"^Patch \d+ -> [0-9]{1,3}$".into(), "(?i)mpi".into()],
                exclude: vec![r"\bsolve\b".into()],
                period_ms: 3_600_000,
                ..Default::default()
            },
        ),
        (
            "apps",
            Options {
                include: vec!["^MPI_".into()],
                sample_below: 4,
                apps: vec![
                    AppOptions {
                        app: "analysis".into(),
                        sample_below: Some(0),
                        ..Default::default()
                    },
                    AppOptions {
                        app: "sim".into(),
                        include: vec!["main".into()],
                        exclude: vec!["Barrier".into()],
                        metrics: vec!["calls".into()],
                        sample_below: Some(2),
                    },
                ],
                ..Default::default()
            },
        ),
    ];
    for (name, o) in seeds {
        write("measure_options", name, &o.encode_to_vec());
    }
}

/// What a filter emits at each level, run on a few leaves' inputs: the leaf's packets, the relay's, and what
/// the root sends down.
struct Packets {
    leaf_up: Vec<Vec<u8>>,
    relay_up: Vec<u8>,
    root_down: Option<Vec<u8>>,
}

fn packets<F: Filter>(params: &str) -> Packets {
    let mut leaf_up = Vec::new();
    for leaf in 0..2 {
        let mut f = F::create(params, Level::Leaf).unwrap();
        let inputs = profiles(leaf, 2, 0);
        let inputs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let mut out = Collect::default();
        f.upstream(0, 0, &inputs, &mut out).unwrap();
        leaf_up.push(out.up[0].1.clone());
    }
    let mut relay = F::create(params, Level::Relay).unwrap();
    let inputs: Vec<&[u8]> = leaf_up.iter().map(Vec::as_slice).collect();
    let mut out = Collect::default();
    relay.upstream(0, 0, &inputs, &mut out).unwrap();
    let relay_up = out.up[0].1.clone();
    let mut root = F::create(params, Level::Root).unwrap();
    let mut out = Collect::default();
    root.upstream(0, 0, &[&relay_up], &mut out).unwrap();
    let root_down = out.down.first().map(|(_, p)| p.clone());
    Packets {
        leaf_up,
        relay_up,
        root_down,
    }
}

/// A filter input: entry level and parameter choice, then calls.
fn filter_seeds<F: Filter>(target: &str, params: usize, three_phase: bool) {
    let p = packets::<F>("");
    for (entry, name) in [(0u8, "leaf"), (1, "relay"), (2, "root")] {
        let mut b = Builder::default();
        b.byte(entry + 3 * params as u8);
        match entry {
            0 => {
                let inputs = profiles(7, 3, 0);
                b.byte(0).byte(0).byte(0).byte(inputs.len() as u8);
                for i in &inputs {
                    b.bytes(i);
                }
                // Names, then the next round.
                b.byte(3).byte(0).byte(0).byte(1).byte(1).bytes(b"MPI_Send()");
                let inputs = profiles(8, 2, 1);
                b.byte(0).byte(1).byte(0).byte(inputs.len() as u8);
                for i in &inputs {
                    b.bytes(i);
                }
            }
            1 => {
                b.byte(0).byte(0).byte(0).byte(p.leaf_up.len() as u8);
                for i in &p.leaf_up {
                    b.bytes(i);
                }
                if let Some(down) = &p.root_down {
                    b.byte(1).byte(0).byte(1).bytes(down);
                }
            }
            _ => {
                b.byte(0).byte(0).byte(0).byte(1).bytes(&p.relay_up);
                b.byte(2).byte(0).byte(0).bytes(&p.relay_up);
            }
        }
        write(target, name, &b.finish());
    }
    if three_phase && let Some(down) = &p.root_down {
        // A leaf gets the ranges of a round it buffered.
        let mut b = Builder::default();
        b.byte(0);
        let inputs = profiles(7, 2, 0);
        b.byte(0).byte(0).byte(0).byte(inputs.len() as u8);
        for i in &inputs {
            b.bytes(i);
        }
        b.byte(1).byte(0).byte(1).bytes(down);
        write(target, "leaf-ranges", &b.finish());
    }
    // Parameters from the input.
    let mut b = Builder::default();
    b.byte(3 * params as u8).bytes(br#"{"values":"round","bins":7}"#);
    b.byte(0).byte(0).byte(0).byte(1).bytes(&profiles(9, 1, 0)[0]);
    write(target, "own-params", &b.finish());
}

fn envelope(round: u64, phase: u32, payload: Vec<u8>, ranks: u32) -> UpMessage {
    UpMessage {
        msg: Some(up_message::Msg::Envelope(Envelope {
            stream_id: 1,
            round,
            phase,
            coverage: Some(Coverage {
                covered: ranks - 1,
                expected: ranks,
                missing: vec![Missing {
                    reason: canopy_proto::v1::MissingReason::Late as i32,
                    ranks: 1,
                }],
                apps: vec![],
                unreachable: vec![],
            }),
            payload: payload.into(),
            late: false,
            first_dump_unix_ns: 5,
        })),
    }
}

fn up(msg: up_message::Msg) -> UpMessage {
    UpMessage { msg: Some(msg) }
}

fn tree_attach() {
    let hello = up(up_message::Msg::Hello(Hello {
        node_id: "agent@node1".into(),
        kind: NodeKind::Agent as i32,
        ranks_below: 4,
        protocol_version: canopy_proto::PROTOCOL_VERSION,
        listen_addr: String::new(),
        hostname: "node1".into(),
        ranks_announced: 4,
        returning_from: String::new(),
        run_id: String::new(),
    }));
    let stats = packets::<canopy_filter_stats::StatsFilter>("");
    let hist = packets::<canopy_filter_histogram::HistogramFilter>("");
    let tail = [
        up(up_message::Msg::NodeEvent(NodeEvent {
            node_id: "agent@node1".into(),
            parent_id: "n".into(),
            kind: NodeKind::Agent as i32,
            state: 1,
            ranks_below: 3,
            address: "10.0.0.1:7401".into(),
            detail: String::new(),
            ranks_announced: 4,
        })),
        up(up_message::Msg::Status(NodeStatus {
            node_id: "agent@node1".into(),
            rounds_closed: 2,
            ..Default::default()
        })),
        up(up_message::Msg::Want(Want { round: 12 })),
        up(up_message::Msg::StreamError(StreamError {
            stream_id: 1,
            node_id: "agent@node1".into(),
            reason: "filter failed".into(),
        })),
        up(up_message::Msg::Fin(Fin {
            node_id: "agent@node1".into(),
            rounds_end: 2,
        })),
    ];
    let names = up(up_message::Msg::Names(NameDictionary { names: names() }));
    // head: bit 0 root, bits 1.. the filter (echo, stats, histogram) and sync mode.
    for (head, name, payloads) in [
        (
            0u8,
            "relay-echo",
            vec![b"abc".to_vec(), vec![0xEE, 1], b"x".to_vec()],
        ),
        (1, "root-echo", vec![b"abc".to_vec(), b"def".to_vec()]),
        (
            2,
            "relay-stats",
            vec![stats.leaf_up[0].clone(), stats.leaf_up[1].clone()],
        ),
        (
            3,
            "root-stats",
            vec![stats.relay_up.clone(), stats.leaf_up[0].clone()],
        ),
        (
            5,
            "root-histogram",
            vec![hist.relay_up.clone(), hist.leaf_up[1].clone()],
        ),
        (
            8 | 1,
            "root-echo-dont-wait",
            vec![b"abc".to_vec(), b"abc".to_vec()],
        ),
    ] {
        let mut msgs = vec![hello.clone(), names.clone()];
        for (round, p) in payloads.into_iter().enumerate() {
            msgs.push(envelope(round as u64, 0, p, 4));
        }
        msgs.extend(tail.iter().cloned());
        write(
            "tree_attach",
            name,
            &Builder::default().byte(head).rest(&grpc_body(&msgs)).finish(),
        );
    }
    let bad_hello = up(up_message::Msg::Hello(Hello {
        node_id: "x".into(),
        ranks_below: u32::MAX,
        protocol_version: canopy_proto::PROTOCOL_VERSION,
        ..Default::default()
    }));
    write(
        "tree_attach",
        "too-many-ranks",
        &Builder::default().byte(0).rest(&grpc_body(&[bad_hello])).finish(),
    );
    let ahead = [
        hello.clone(),
        envelope(40, 0, b"late".to_vec(), 4),
        envelope(0, 0, b"a".to_vec(), 4),
    ];
    write(
        "tree_attach",
        "ahead",
        &Builder::default().byte(0).rest(&grpc_body(&ahead)).finish(),
    );
}

fn down(msg: down_message::Msg) -> Vec<u8> {
    DownMessage { msg: Some(msg) }.encode_length_delimited_to_vec()
}

fn tree_down() {
    let open = |id: u32, filter: &str, sync: SyncMode| {
        down(down_message::Msg::OpenStream(OpenStream {
            spec: Some(StreamSpec {
                stream_id: id,
                name: format!("s{id}"),
                filter: filter.into(),
                params: String::new(),
                sync_mode: sync as i32,
                timeout_ms: 100,
                ranks: String::new(),
                stages: Vec::new(),
                first_round: Some(0),
            }),
        }))
    };
    let control =
        |action: control::Action| down(down_message::Msg::Control(Control { action: Some(action) }));
    let hist = packets::<canopy_filter_histogram::HistogramFilter>("");
    let ranges = hist.root_down.unwrap();
    for (head, name) in [(1u8, "leaf"), (0, "relay")] {
        let mut b = Vec::new();
        b.extend(down(down_message::Msg::Welcome(Default::default())));
        b.extend(open(1, "stats", SyncMode::WaitForAll));
        b.extend(open(2, "histogram", SyncMode::WaitForAll));
        b.extend(control(control::Action::Start(Start {
            start_unix_ns: 1,
            first_round: 0,
            rejoin: false,
        })));
        b.extend(down(down_message::Msg::Credit(Credit {
            below: 16,
            closed_below: 0,
            taken: 0,
        })));
        b.extend(down(down_message::Msg::Envelope(Envelope {
            stream_id: 2,
            round: 0,
            phase: 1,
            payload: ranges.clone().into(),
            ..Default::default()
        })));
        b.extend(control(control::Action::Options(Options {
            include: vec!["^MPI_".into()],
            ..Default::default()
        })));
        b.extend(control(control::Action::Stop(Stop {})));
        b.extend(down(down_message::Msg::CloseStream(CloseStream { stream_id: 1 })));
        b.extend(control(control::Action::Drain(Default::default())));
        b.extend(control(control::Action::FinAck(Default::default())));
        write(
            "tree_down",
            name,
            &Builder::default().byte(head).rest(&b).finish(),
        );
    }
    let mut b = Vec::new();
    b.extend(open(3, "echo", SyncMode::DontWait));
    b.extend(open(4, "nope", SyncMode::WaitForAll));
    b.extend(open(3, "echo", SyncMode::WaitForAll));
    write(
        "tree_down",
        "streams",
        &Builder::default().byte(1).rest(&b).finish(),
    );
}

fn topology() {
    let mrnet = "# a small tree\nfe:0 => r1:0 r2:0 ;\nr1:0 => a:0 a:1 ;\nr2:0 => a:2\n  a:3 ;\n";
    write(
        "topology",
        "mrnet",
        &Builder::default().byte(0).rest(mrnet.as_bytes()).finish(),
    );
    write(
        "topology",
        "mrnet-root",
        &Builder::default().byte(0).rest(b"fe:0 ;").finish(),
    );
    write(
        "topology",
        "mrnet-bad",
        &Builder::default()
            .byte(0)
            .rest(b"fe:0 => a:0 ;\na:0 => fe:0 ;")
            .finish(),
    );
    let hosts = "node1\nnode2 # the second\nnode3\n";
    for (name, spec) in [
        ("spec-b", "b:2^2x3"),
        ("spec-kary", "kary:2"),
        ("spec-bad", "b:0"),
    ] {
        let b = Builder::default()
            .byte(1)
            .bytes(spec.as_bytes())
            .rest(hosts.as_bytes())
            .finish();
        write("topology", name, &b);
    }
    write(
        "topology",
        "leaves",
        &Builder::default().byte(2).uint(100, 2).byte(8).finish(),
    );
}

fn config() {
    let site = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/canopy.toml")).unwrap();
    for (role, name) in [(0u8, "agent-site"), (1, "relay-site"), (2, "frontend-site")] {
        write(
            "config",
            name,
            &Builder::default().byte(role).rest(&site).finish(),
        );
    }
    let agent = "[agent]\nparent = \"relay:7401\"\nsocket = \"none\"\nsimulate_ranks = 64\nsimulate_events = 20\n\
                 simulate_scenario = \"uintah\"\nfilter_path = [\"/usr/lib/canopy/filters\"]\nmax_frame_bytes = 4096\n";
    write(
        "config",
        "agent-sim",
        &Builder::default().byte(0).rest(agent.as_bytes()).finish(),
    );
    let bad = "[agent]\nsimulate_ranks = 4294967295\nsimulate_events = \"many\"\n";
    write(
        "config",
        "agent-bad",
        &Builder::default().byte(0).rest(bad.as_bytes()).finish(),
    );
    let fe = "[frontend]\nlisten = \"127.0.0.1:0\"\nstreams = [\"stats\", \"histogram\"]\n\
              stream_params = { histogram = '{\"bins\": 20}' }\nsync_mode = \"dont_wait\"\nmax_rounds_in_flight = 0\n";
    write(
        "config",
        "frontend-streams",
        &Builder::default().byte(2).rest(fe.as_bytes()).finish(),
    );
    write(
        "config",
        "syntax",
        &Builder::default().byte(1).rest(b"[relay\nparent = ").finish(),
    );
}

#[test]
#[ignore = "writes the seed corpora; run by hand after a format changes"]
fn write_seeds() {
    rank_frames();
    measure_options();
    filter_seeds::<canopy_filter_stats::StatsFilter>("filter_stats", 0, false);
    filter_seeds::<canopy_filter_histogram::HistogramFilter>("filter_histogram", 0, true);
    filter_seeds::<canopy_filter_classify::ClassifyFilter>("filter_classify", 0, true);
    filter_seeds::<canopy_filter_outliers::OutliersFilter>("filter_outliers", 0, true);
    filter_seeds::<canopy_filter_passthrough::Passthrough>("filter_passthrough", 0, false);
    tree_attach();
    tree_down();
    topology();
    config();
}
