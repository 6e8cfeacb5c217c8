use super::*;
use canopy_filter_test::{Collect, encode_one};
use canopy_wire::v1::{CounterSample, EventSample, RankProfile};

/// A rank of application "a" whose events have `v` as inclusive time and `v / 2` as exclusive time.
fn profile(rank: u32, events: &[(&str, f64)]) -> Vec<u8> {
    encode_one(&RankProfile {
        app: "a".into(),
        rank,
        events: events
            .iter()
            .map(|(n, v)| EventSample {
                event_id: canopy_wire::event_id(n),
                calls: 1,
                incl_us: *v,
                excl_us: *v / 2.0,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    })
}

fn named(params: &str, level: Level, names: &[&str]) -> ClassifyFilter {
    let mut f = ClassifyFilter::create(params, level).unwrap();
    let pairs: Vec<(u64, &str)> = names.iter().map(|n| (canopy_wire::event_id(n), *n)).collect();
    f.names(&pairs);
    f
}

/// Leaf and root of a one-leaf tree: phase 0 of every round, then phases 1 and 2 in `order`.
fn run_rounds(params: &str, names: &[&str], rounds: &[Vec<Vec<u8>>], order: &[usize]) -> Vec<ClassResult> {
    let mut leaf = named(params, Level::Leaf, names);
    let mut root = ClassifyFilter::create(params, Level::Root).unwrap();
    let mut downs = vec![Vec::new(); rounds.len()];
    for &r in order {
        let inputs: Vec<&[u8]> = rounds[r].iter().map(Vec::as_slice).collect();
        let mut out = Collect::default();
        leaf.upstream(r as u64, 0, &inputs, &mut out).unwrap();
        let mut down = Collect::default();
        root.upstream(r as u64, 0, &[&out.up[0].1], &mut down).unwrap();
        downs[r] = down.down.remove(0).1;
    }
    let mut results = vec![ClassResult::default(); rounds.len()];
    for &r in order.iter().rev() {
        let mut out = Collect::default();
        leaf.downstream(r as u64, 1, &downs[r], &mut out).unwrap();
        let mut up = Collect::default();
        root.upstream(r as u64, 2, &[&out.up[0].1], &mut up).unwrap();
        results[r] =
            ClassResult::decode(root.finalize(r as u64, 2, &up.up[0].1).unwrap().as_slice()).unwrap();
    }
    assert!(
        leaf.buffers.is_empty() && root.classes.is_empty(),
        "state dropped"
    );
    results
}

fn members(r: &ClassResult) -> Vec<Vec<(u32, u32)>> {
    r.classes
        .iter()
        .map(|c| c.ranks.iter().map(|rr| (rr.first, rr.last)).collect())
        .collect()
}

fn id(name: &str) -> u64 {
    canopy_wire::event_id(name)
}

/// The class of application a's ranks that select `names` (joined by "\n"), classes being per application
/// by default.
fn class(names: &str) -> u64 {
    canopy_wire::event_id(&format!("a\0{names}"))
}

#[test]
fn params_errors() {
    let err = |p: &str| ClassifyFilter::create(p, Level::Leaf).unwrap_err();
    assert_eq!(
        err(r#"{"scheme": "pattern"}"#),
        "scheme \"pattern\" needs a pattern"
    );
    assert_eq!(err(r#"{"pattern": "^MPI_"}"#), "pattern needs scheme \"pattern\"");
    assert!(
        err(r#"{"scheme": "pattern", "pattern": "(MPI"}"#)
            .starts_with("pattern \"(MPI\" is not a valid regex: ")
    );
    assert_eq!(
        err(r#"{"scheme": "mpi"}"#),
        "scheme must be one of \"all\", \"pattern\", got \"mpi\""
    );
    assert_eq!(err(r#"{"bins": 0}"#), "bins must be between 1 and 10000, got 0");
    assert_eq!(
        err(r#"{"schema": "all"}"#),
        "unknown parameter \"schema\" (known: scheme, pattern, bins, metric, summaries, values, by_app)"
    );
    assert_eq!(
        err(r#"{"metric": "time"}"#),
        format!(
            "metric must be one of \"exclusive\", \"inclusive\", \"calls\", \"counter\" or a per-event metric \
             (\"page-faults\", \"page-faults-inclusive\", \"heap\", ...: {}), got \"time\"",
            canopy_wire::event_metrics::metric_words().join(", ")
        )
    );
    assert_eq!(
        err(r#"{"summaries": "yes"}"#),
        "summaries must be true or false, got \"yes\""
    );
    let f = ClassifyFilter::create("", Level::Root).unwrap();
    assert_eq!(
        (f.bins, f.selection.scheme().describe(), f.metric, f.summaries),
        (5, "all".to_string(), Metric::Exclusive, false)
    );
    let f = ClassifyFilter::create(
        r#"{"scheme": "pattern", "pattern": "^MPI_", "metric": "counter", "summaries": true}"#,
        Level::Root,
    )
    .unwrap();
    assert_eq!(
        (f.selection.scheme().describe(), f.metric, f.summaries),
        ("pattern:^MPI_".to_string(), Metric::Counter, true)
    );
}

#[test]
fn pipelined_rounds_keep_their_own_classes() {
    // Round 0: ranks 0-1 run "a", rank 2 runs "a" and "b". Round 1: everyone runs "a" only.
    let r0 = vec![
        profile(0, &[("a", 1.0)]),
        profile(1, &[("a", 2.0)]),
        profile(2, &[("a", 3.0), ("b", 1.0)]),
    ];
    let r1 = vec![
        profile(0, &[("a", 2.0)]),
        profile(1, &[("a", 10.0)]),
        profile(2, &[("a", 18.0)]),
    ];
    // Both rounds' phase 0 before either's phase 1 and 2, completed in either order.
    for order in [[0, 1], [1, 0]] {
        let res = run_rounds(r#"{"bins": 2}"#, &["a", "b"], &[r0.clone(), r1.clone()], &order);
        let mut ids0: Vec<u64> = vec![class("a"), class("a\nb")];
        ids0.sort();
        assert_eq!(
            res[0].classes.iter().map(|c| c.class_id).collect::<Vec<_>>(),
            ids0
        );
        let c0 = res[0].classes.iter().find(|c| c.class_id == class("a")).unwrap();
        assert_eq!((c0.size, c0.example_event.as_str()), (2, "a"));
        assert_eq!(res[1].classes.len(), 1);
        assert_eq!(members(&res[1]), vec![vec![(0, 2)]]);
        // Exclusive times 1, 5 and 9 in two bins of [1, 9].
        let c = &res[1].classes[0];
        assert_eq!((c.events.clone(), c.counts.clone()), (vec![id("a")], vec![1, 2]));
        let ranges = res[1].ranges.clone().unwrap();
        assert_eq!(
            (ranges.id, ranges.lo, ranges.hi),
            (vec![id("a")], vec![1.0], vec![9.0])
        );
    }
}

#[test]
fn one_range_per_event_serves_every_class() {
    // Class {a}: ranks 0 and 1; class {a, b}: rank 2. Exclusive times of "a": 0, 4 and 8.
    let round = vec![
        profile(0, &[("a", 0.0)]),
        profile(1, &[("a", 8.0)]),
        profile(2, &[("a", 16.0), ("b", 6.0)]),
    ];
    let r = &run_rounds(r#"{"bins": 4}"#, &["a", "b"], &[round], &[0])[0];
    assert_eq!(r.metric, Metric::Exclusive as i32);
    let ranges = r.ranges.clone().unwrap();
    let mut want = [(id("a"), 0.0, 8.0), (id("b"), 3.0, 3.0)];
    want.sort_by_key(|w| w.0);
    assert_eq!(
        (ranges.id, ranges.lo, ranges.hi),
        (
            want.iter().map(|w| w.0).collect(),
            want.iter().map(|w| w.1).collect(),
            want.iter().map(|w| w.2).collect()
        )
    );
    let a_only = r.classes.iter().find(|c| c.class_id == class("a")).unwrap();
    assert_eq!(a_only.events, vec![id("a")]);
    assert_eq!(a_only.counts, vec![1, 0, 1, 0]);
    let a_b = r.classes.iter().find(|c| c.class_id == class("a\nb")).unwrap();
    let counts_of = |event: u64| {
        let i = a_b.events.iter().position(|e| *e == event).unwrap();
        a_b.counts[i * 4..(i + 1) * 4].to_vec()
    };
    // "a" at 8, the top of its range: the last bin. "b" alone: bin 0 of a one-point range.
    assert_eq!(
        (counts_of(id("a")), counts_of(id("b"))),
        (vec![0, 0, 0, 1], vec![1, 0, 0, 0])
    );
    // No summaries unless asked for.
    assert!(r.classes.iter().all(|c| c.stats.is_empty()));
}

#[test]
fn the_metric_parameter_picks_the_values_and_summaries_come_on_request() {
    let p = |rank: u32, calls: u64, counter: f64| {
        encode_one(&RankProfile {
            app: "a".into(),
            rank,
            events: vec![EventSample {
                event_id: id("a"),
                calls,
                incl_us: 100.0,
                excl_us: f64::NAN,
                ..Default::default()
            }],
            counters: vec![CounterSample {
                counter_id: id("bytes"),
                value: counter,
                total: counter,
            }],
            ..Default::default()
        })
    };
    let round = vec![p(0, 1, 10.0), p(1, 3, 30.0), p(2, 5, 20.0)];
    let run = |params: &str| run_rounds(params, &["a"], std::slice::from_ref(&round), &[0]).remove(0);

    let calls = run(r#"{"metric": "calls", "bins": 2, "summaries": true}"#);
    assert_eq!(calls.metric, Metric::Calls as i32);
    let c = &calls.classes[0];
    assert_eq!((c.events.clone(), c.counts.clone()), (vec![id("a")], vec![1, 2]));
    assert_eq!(c.stats.len(), 1);
    let s = c.stats[0].summary.clone().unwrap();
    assert_eq!(c.stats[0].metric, Metric::Calls as i32);
    assert_eq!((s.count, s.mean, s.min, s.max), (3, 3.0, 1.0, 5.0));
    assert_eq!((s.min_rank.unwrap().rank, s.max_rank.unwrap().rank), (0, 2));
    assert!((s.std - (8.0f64 / 3.0).sqrt()).abs() < 1e-12, "{}", s.std);

    // Counters are binned by the counter's id; the class is still made of event names.
    let counter = run(r#"{"metric": "counter", "bins": 2}"#);
    let c = &counter.classes[0];
    assert_eq!(c.class_id, class("a"));
    assert_eq!(
        (c.events.clone(), c.counts.clone()),
        (vec![id("bytes")], vec![1, 2])
    );
    assert_eq!(counter.ranges.clone().unwrap().lo, vec![10.0]);

    // Exclusive time is NaN on every rank: left out, so the class has members but no histogram.
    let exclusive = run("{}");
    assert_eq!(exclusive.classes[0].size, 3);
    assert!(exclusive.classes[0].events.is_empty() && exclusive.classes[0].counts.is_empty());
    assert!(exclusive.ranges.clone().unwrap_or_default().id.is_empty());
}

/// A leaf's phase-0 packet over `ranks`, and the leaf.
fn phase0(params: &str, ranks: &[Vec<u8>]) -> (ClassifyFilter, Vec<u8>) {
    let mut leaf = named(params, Level::Leaf, &["a", "b"]);
    let inputs: Vec<&[u8]> = ranks.iter().map(Vec::as_slice).collect();
    let mut out = Collect::default();
    leaf.upstream(0, 0, &inputs, &mut out).unwrap();
    (leaf, out.up.remove(0).1)
}

#[test]
fn a_rejected_input_is_reported_and_the_rest_merges() {
    let mut leaf = named("{}", Level::Leaf, &["a"]);
    let bad = vec![0x0a, 0x05, 0x01];
    let (p0, p1) = (profile(0, &[("a", 1.0)]), profile(1, &[("a", 2.0)]));
    let mut out = Collect::default();
    leaf.upstream(1, 0, &[&p0, &bad, &p1], &mut out).unwrap();
    assert_eq!(out.rejects.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1]);
    let mut relay = ClassifyFilter::create("{}", Level::Relay).unwrap();
    let mut out2 = Collect::default();
    relay.upstream(1, 0, &[&bad, &out.up[0].1], &mut out2).unwrap();
    assert_eq!(out2.rejects.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0]);
    let packet = ClassPacket::decode(out2.up[0].1.as_slice()).unwrap();
    assert_eq!(packet.classes.len(), 1);
    assert_eq!(ranks::count(&packet.classes[0].ranks), 2);

    // Every input rejected: the leaf still answers both of its phases.
    let mut out = Collect::default();
    leaf.upstream(2, 0, &[&bad], &mut out).unwrap();
    assert_eq!(out.up.len(), 1);
    let mut out = Collect::default();
    leaf.downstream(2, 1, &[], &mut out).unwrap();
    assert_eq!(out.up.len(), 1);
}

/// The rejection a relay gives `bad` next to a good packet, which it still merges.
fn rejection(params: &str, phase: u32, good: &[u8], bad: &ClassPacket) -> String {
    let mut relay = ClassifyFilter::create(params, Level::Relay).unwrap();
    let mut out = Collect::default();
    relay
        .upstream(0, phase, &[good, &bad.encode_to_vec()], &mut out)
        .unwrap();
    assert_eq!(out.rejects.len(), 1, "{:?}", out.rejects);
    assert_eq!(out.rejects[0].0, 1);
    let merged = ClassPacket::decode(out.up[0].1.as_slice()).unwrap();
    assert_eq!(
        merged,
        ClassPacket::decode(good).unwrap(),
        "the good input merged alone"
    );
    out.rejects[0].1.clone()
}

#[test]
fn malformed_summaries_are_rejected_by_name() {
    let ranks = [profile(0, &[("a", 1.0)]), profile(1, &[("a", 4.0), ("b", 2.0)])];
    let (_, good) = phase0("{}", &ranks);
    let packet = ClassPacket::decode(good.as_slice()).unwrap();
    let prefix = "input is not a canopy.filters.v1.ClassPacket: ";
    let reject = |bad: &ClassPacket| rejection("{}", 0, &good, bad).replace(prefix, "");

    let mut swapped = packet.clone();
    swapped.classes.swap(0, 1);
    let second = swapped.classes[1].class_id;
    assert_eq!(
        reject(&swapped),
        format!("class {second:#018x} at 1 does not follow the previous one (sorted, each once)")
    );
    let mut no_ranks = packet.clone();
    no_ranks.classes[0].ranks.clear();
    assert_eq!(
        reject(&no_ranks),
        format!("class {:#018x} has no ranks", packet.classes[0].class_id)
    );
    let mut short = packet.clone();
    short.ranges.as_mut().unwrap().hi.pop();
    assert_eq!(reject(&short), "ranges: column hi has 1 entries for 2 ids");
    let mut upside_down = packet.clone();
    let r = upside_down.ranges.as_mut().unwrap();
    r.lo[0] = 9.0;
    let (first, hi) = (r.id[0], r.hi[0]);
    assert_eq!(
        reject(&upside_down),
        format!("ranges: event {first:#018x} has the range [9, {hi}] (finite, lo <= hi)")
    );
    let mut summarized = packet.clone();
    summarized.classes[0].summaries = Some(StatsColumns::default());
    assert_eq!(
        reject(&summarized),
        format!(
            "class {:#018x} carries summaries, but this stream's summaries are off",
            packet.classes[0].class_id
        )
    );

    // With summaries on, their columns are checked too.
    let on = r#"{"summaries": true}"#;
    let (_, good) = phase0(on, &ranks);
    let mut bad = ClassPacket::decode(good.as_slice()).unwrap();
    let s = bad.classes[0].summaries.as_mut().unwrap();
    s.mean.clear();
    let rows = s.id.len();
    assert_eq!(
        rejection(on, 0, &good, &bad).replace(prefix, ""),
        format!(
            "class {:#018x}: summaries: column mean has 0 entries for {rows} rows",
            bad.classes[0].class_id
        )
    );
    // A class's summaries are over all its members, never broken down by application.
    let mut by_app = ClassPacket::decode(good.as_slice()).unwrap();
    let s = by_app.classes[0].summaries.as_mut().unwrap();
    s.app = vec![0; s.id.len()];
    assert!(
        rejection(on, 0, &good, &by_app).contains("does not break rows down by application"),
        "{}",
        rejection(on, 0, &good, &by_app)
    );
}

#[test]
fn malformed_counts_are_rejected_by_name_and_bad_ranges_fail_the_leaf() {
    let (mut leaf, up) = phase0(
        r#"{"bins": 3}"#,
        &[profile(0, &[("a", 1.0)]), profile(1, &[("a", 4.0), ("b", 2.0)])],
    );
    let mut root = ClassifyFilter::create(r#"{"bins": 3}"#, Level::Root).unwrap();
    let mut down = Collect::default();
    root.upstream(0, 0, &[&up], &mut down).unwrap();
    let ranges = down.down.remove(0).1;
    let mut out = Collect::default();
    leaf.downstream(0, 1, &ranges, &mut out).unwrap();
    let good = out.up.remove(0).1;
    let packet = ClassPacket::decode(good.as_slice()).unwrap();
    let prefix = "input is not a canopy.filters.v1.ClassPacket: ";
    let reject = |bad: &ClassPacket| rejection(r#"{"bins": 3}"#, 2, &good, bad).replace(prefix, "");

    let two = packet
        .classes
        .iter()
        .find(|c| c.events.len() == 2)
        .unwrap()
        .class_id;
    let mut short = packet.clone();
    short.classes.iter_mut().for_each(|c| {
        if c.class_id == two {
            c.counts.pop();
        }
    });
    assert_eq!(
        reject(&short),
        format!("class {two:#018x} has 5 counts for 2 events of 3 bins")
    );
    let mut unsorted = packet.clone();
    let c = unsorted.classes.iter_mut().find(|c| c.class_id == two).unwrap();
    c.events.swap(0, 1);
    let second = c.events[1];
    assert_eq!(
        reject(&unsorted),
        format!(
            "class {two:#018x}: event {second:#018x} at 1 does not follow the previous one (sorted, each once)"
        )
    );

    // Ranges a leaf cannot bin against fail its call, naming the round.
    let (mut leaf, _) = phase0("{}", &[profile(0, &[("a", 1.0)])]);
    let bad = ClassPacket {
        ranges: Some(BinRanges {
            id: vec![id("a")],
            lo: vec![f64::NAN],
            hi: vec![1.0],
        }),
        ..Default::default()
    };
    let err = leaf
        .downstream(0, 1, &bad.encode_to_vec(), &mut Collect::default())
        .unwrap_err();
    assert_eq!(
        err,
        format!(
            "round 0: the phase 1 packet is unusable: ranges: event {:#018x} has the range [NaN, 1] (finite, lo <= hi)",
            id("a")
        )
    );
}

#[test]
fn unknown_names_fall_back_to_hex_ids() {
    let id = canopy_wire::event_id("MPI_Send()");
    let mut leaf = ClassifyFilter::create(r#"{"by_app": false}"#, Level::Leaf).unwrap();
    let p = RankProfile {
        events: vec![EventSample {
            event_id: id,
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(
        leaf.selection.class_of(&p),
        (canopy_wire::event_id(&format!("{id:016x}")), format!("{id:016x}"))
    );
    // Once the name is known, it is used.
    leaf.names(&[(id, "MPI_Send()")]);
    assert_eq!(
        leaf.selection.class_of(&p),
        (canopy_wire::event_id("MPI_Send()"), "MPI_Send()".to_string())
    );
}

#[test]
fn class_id_hashes_sorted_selected_names_of_events_only() {
    let mut leaf = named(
        r#"{"scheme": "pattern", "pattern": "^MPI_", "by_app": false}"#,
        Level::Leaf,
        &["main", "MPI_Send", "MPI_Recv"],
    );
    let ev = |n: &str| EventSample {
        event_id: canopy_wire::event_id(n),
        ..Default::default()
    };
    let p = RankProfile {
        events: vec![ev("main"), ev("MPI_Send"), ev("MPI_Recv"), ev("MPI_Send")],
        counters: vec![CounterSample {
            counter_id: canopy_wire::event_id("MPI_x"),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(
        leaf.selection.class_of(&p),
        (
            canopy_wire::event_id("MPI_Recv\nMPI_Send"),
            "MPI_Recv".to_string()
        )
    );
    let none = RankProfile {
        events: vec![ev("main")],
        ..Default::default()
    };
    assert_eq!(
        leaf.selection.class_of(&none),
        (canopy_wire::event_id(""), String::new())
    );
}

#[test]
fn result_bytes_and_reduction_factor() {
    let res = run_rounds(
        "{}",
        &["a"],
        &[vec![profile(0, &[("a", 1.0)]), profile(1, &[("a", 2.0)])]],
        &[0],
    );
    let r = &res[0];
    let mut bare = r.clone();
    bare.result_bytes = 0;
    bare.reduction_factor = 0.0;
    assert_eq!(r.result_bytes, bare.encoded_len() as u64);
    assert_eq!(r.reduction_factor, r.raw_bytes as f64 / r.result_bytes as f64);
    assert_eq!((r.scheme.as_str(), r.bins), ("all", 5));
    assert!(r.raw_bytes > 0);
}

#[test]
fn descriptors_define_the_result_type() {
    let fds = prost_types::FileDescriptorSet::decode(ClassifyFilter::descriptors()).unwrap();
    let (pkg, name) = ClassifyFilter::RESULT_TYPE.rsplit_once('.').unwrap();
    assert!(
        fds.file
            .iter()
            .any(|f| f.package() == pkg && f.message_type.iter().any(|m| m.name() == name))
    );
}
