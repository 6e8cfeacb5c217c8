//! The typed reader over what the store wrote, replays byte for byte, and stores written by older versions.

mod common;

use canopy_proto::filters::v1::{
    BinRanges, Class, ClassResult, CpuSample, DiskSample, EventStats, Histogram, HistogramResult, LoadSample,
    MemorySample, Metric, NetworkSample, NodeSample, NodeSamples, RankRange, RankRef, StatsResult, Summary,
    UtilizationResult,
};
use canopy_proto::v1::{
    EventSample, MissingReason, NodeEvent, NodeKind, NodeState, ProfileBatch, RankProfile, SyncMode,
};
use canopy_store::{
    Collision, PROFILE_BATCH_TYPE, Payload, RANK_NODE_QUERY, RoundCursor, Rows, SCHEMA_VERSION, Select,
    Store, StoreError, StoreReader, StreamState, Table,
};
use common::*;
use prost::Message;
use rusqlite::Connection;

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("canopy-store-read-")
        .tempdir()
        .unwrap()
}

fn summary(count: u64, mean: f64) -> Option<Summary> {
    Some(Summary {
        count,
        mean,
        m2: 5.0,
        std: 1.118,
        min: 1.0,
        max: 4.0,
        min_rank: Some(RankRef {
            app: "a".into(),
            rank: 0,
        }),
        max_rank: Some(RankRef {
            app: "a".into(),
            rank: 3,
        }),
    })
}

/// A batch the old rebuild from rows could not reproduce: dump times, metric bits, a NaN, ranks out of order.
fn odd_batch(ranks: &[u32]) -> Vec<u8> {
    ProfileBatch {
        profiles: ranks
            .iter()
            .map(|&rank| RankProfile {
                app: "lulesh".into(),
                rank,
                round: 3,
                dump_unix_ns: 5_000 + u64::from(rank),
                metrics: 4,
                events: vec![EventSample {
                    event_id: 17,
                    excl_us: if rank == 0 { f64::NAN } else { 1.5 },
                    ..EventSample::default()
                }],
                counters: Vec::new(),
                ..RankProfile::default()
            })
            .collect(),
    }
    .encode_to_vec()
}

#[test]
fn a_replayed_passthrough_round_is_the_stored_batch_byte_for_byte() {
    let dir = tempdir();
    let mut store = Store::create(dir.path()).unwrap();
    let mut s = spec(1);
    store
        .put_stream(&s, StreamState::Open, None, Some(PROFILE_BATCH_TYPE))
        .unwrap();
    let whole = odd_batch(&[5, 0, 3]);
    store
        .write_round(&record(1, 3, 3, 3, &[]), Payload::Profiles(&whole))
        .unwrap();
    // Late data of the round is not part of what it closed with.
    let late = odd_batch(&[9]);
    store
        .write_late(1, 3, 1, 9, Payload::Profiles(&late), None)
        .unwrap();
    // A don't-wait stream: two pieces of one round.
    s.stream_id = 2;
    s.sync_mode = SyncMode::DontWait as i32;
    store
        .put_stream(&s, StreamState::Open, None, Some(PROFILE_BATCH_TYPE))
        .unwrap();
    let (a, b) = (odd_batch(&[1]), odd_batch(&[2, 4]));
    let piece = |covered| record(2, 3, covered, 3, &[(MissingReason::NotWaited, 3 - covered)]);
    store.write_round(&piece(1), Payload::Profiles(&a)).unwrap();
    store.write_round(&piece(2), Payload::Profiles(&b)).unwrap();

    let reader = StoreReader::open(store.path()).unwrap();
    let streams = reader.streams().unwrap();
    let replayed = reader.stored_rounds(&streams[0], 0).unwrap();
    assert_eq!(replayed.len(), 1);
    assert_eq!(
        replayed[0].payload, whole,
        "the replay is the stored batch, byte for byte"
    );
    assert_eq!(
        (replayed[0].round, replayed[0].covered, replayed[0].expected),
        (3, 3, 3)
    );
    let pieces = reader.stored_rounds(&streams[1], 0).unwrap();
    assert_eq!(pieces[0].payload, [a.clone(), b.clone()].concat());
    let merged = ProfileBatch::decode(pieces[0].payload.as_slice()).unwrap();
    let ranks: Vec<u32> = merged.profiles.iter().map(|p| p.rank).collect();
    assert_eq!(ranks, [1, 2, 4]);
    assert!(reader.stored_rounds(&streams[0], 4).unwrap().is_empty());
}

#[test]
fn a_round_s_coverage_reads_back_as_the_tree_sent_it_in_all_and_per_application() {
    use canopy_proto::v1::{AppCoverage, Coverage, Missing, RoundUpdate, Unreachable};
    let missing = |pairs: &[(MissingReason, u32)]| -> Vec<Missing> {
        pairs
            .iter()
            .map(|&(r, ranks)| Missing {
                reason: r as i32,
                ranks,
            })
            .collect()
    };
    let sent = Coverage {
        covered: 9,
        expected: 16,
        missing: missing(&[(MissingReason::Late, 3), (MissingReason::Unreachable, 4)]),
        apps: vec![
            AppCoverage {
                app: "analysis".into(),
                covered: 2,
                expected: 5,
                missing: missing(&[(MissingReason::Late, 3)]),
            },
            AppCoverage {
                app: "sim".into(),
                covered: 7,
                expected: 7,
                missing: vec![],
            },
        ],
        unreachable: vec![Unreachable {
            node: "relay-0".into(),
            ranks: 4,
        }],
    };
    let dir = tempdir();
    let mut store = Store::create(dir.path()).unwrap();
    store
        .put_stream(&spec(1), StreamState::Open, None, Some("acme.v1.Opaque"))
        .unwrap();
    let record = canopy_store::RoundRecord::of(1, "profiles", 6, &sent, 42);
    store
        .write_round(
            &record,
            Payload::Blob {
                phase: 0,
                payload: b"result",
            },
        )
        .unwrap();

    let reader = StoreReader::open(store.path()).unwrap();
    let stream = &reader.streams().unwrap()[0];
    let stored = reader.stored_rounds(stream, 0).unwrap().remove(0);
    // The nodes named unreachable are kept as text in the row, not in the coverage read back.
    let expected = Coverage {
        unreachable: vec![],
        ..sent.clone()
    };
    assert_eq!(stored.coverage(), expected);
    let coverage = stored.coverage();
    let update = stored.update(stream, true);
    assert_eq!(update.coverage, Some(expected));
    assert_eq!(
        update.result.as_ref().unwrap().type_url,
        "type.googleapis.com/acme.v1.Opaque"
    );
    assert_eq!(update.result.unwrap().value, b"result");
    assert!(update.replayed && !update.late && update.missed == 0);
    assert_eq!((update.stream_id, update.round, update.phase), (1, 6, 0));
    // The live update of the same round is built by the same constructor.
    let live = RoundUpdate::of(
        canopy_proto::StreamOf {
            id: 1,
            name: &stream.name,
            filter: &stream.filter,
            result_type: "acme.v1.Opaque",
        },
        canopy_proto::RoundOf {
            round: 6,
            phase: 0,
            coverage,
            payload: b"result".to_vec(),
            late: false,
        },
        true,
    );
    assert_eq!(
        live,
        reader
            .stored_rounds(stream, 0)
            .unwrap()
            .remove(0)
            .update(stream, true)
    );
}

#[test]
fn every_table_reads_back_typed() {
    let dir = tempdir();
    let mut store = Store::create(dir.path()).unwrap();
    store.set_meta("tree", "kary:2^2").unwrap();
    store
        .put_stream(&spec(1), StreamState::Open, None, Some(PROFILE_BATCH_TYPE))
        .unwrap();
    let mut stats_spec = spec(2);
    stats_spec.filter = "stats".into();
    stats_spec.name = "stats".into();
    stats_spec.sync_mode = SyncMode::DontWait as i32;
    store
        .put_stream(&stats_spec, StreamState::Open, None, None)
        .unwrap();
    store
        .put_stream(
            &stats_spec,
            StreamState::Failed,
            Some("filter panicked"),
            Some("canopy.filters.v1.StatsResult"),
        )
        .unwrap();
    let batch = profiles("lulesh", 0..2, 2, 1);
    store
        .write_round(
            &record(1, 7, 2, 4, &[(MissingReason::Lost, 2)]),
            Payload::Profiles(&batch),
        )
        .unwrap();
    store
        .write_round(&record(1, 8, 4, 4, &[]), Payload::Profiles(&batch))
        .unwrap();
    let late = profiles("lulesh", 2..3, 1, 0);
    store
        .write_late(1, 7, 1, late.len() as u64, Payload::Profiles(&late), None)
        .unwrap();
    let stats = StatsResult {
        stats: vec![EventStats {
            id: u64::MAX,
            metric: Metric::Exclusive as i32,
            summary: summary(4, 2.5),
            quantiles: Vec::new(),
            app: "lulesh".into(),
        }],
        raw_bytes: 1000,
    }
    .encode_to_vec();
    let blob = Payload::Blob {
        phase: 1,
        payload: &stats,
    };
    store.write_round(&record(2, 7, 4, 4, &[]), blob).unwrap();
    store
        .write_filter_tables(2, 7, "canopy.filters.v1.StatsResult", &stats, false)
        .unwrap();
    store
        .put_names(&[(u64::MAX, "MPI_Allreduce".into()), (5, "A".into())])
        .unwrap();
    store.put_names(&[(5, "B".into())]).unwrap();
    store
        .put_node(&NodeEvent {
            node_id: "n1:0".into(),
            parent_id: "fe:0".into(),
            kind: NodeKind::Agent as i32,
            state: NodeState::Lost as i32,
            ranks_below: 4,
            address: "10.0.0.1:7401".into(),
            detail: "reset".into(),
            ranks_announced: 0,
        })
        .unwrap();

    let r = StoreReader::open(store.path()).unwrap();
    assert_eq!(r.schema_version(), SCHEMA_VERSION);
    assert_eq!(r.meta("tree").unwrap().as_deref(), Some("kary:2^2"));
    assert_eq!(r.meta("nope").unwrap(), None);

    let streams = r.streams().unwrap();
    assert_eq!(streams.len(), 2);
    let (one, two) = (&streams[0], &streams[1]);
    assert_eq!(
        (
            one.stream_id,
            one.name.as_str(),
            one.filter.as_str(),
            one.params.as_str(),
            one.sync_mode
        ),
        (1, "profiles", "passthrough", "{}", SyncMode::WaitForAll)
    );
    assert_eq!(
        (one.state, one.rounds, one.full_rounds, one.late_packets),
        (Some(StreamState::Open), 2, 1, 1)
    );
    assert_eq!(one.result_type.as_deref(), Some(PROFILE_BATCH_TYPE));
    assert!(one.opened_unix_ns.is_some() && one.closed_unix_ns.is_none());
    assert_eq!(
        (
            two.state,
            two.failure.as_deref(),
            two.sync_mode,
            two.result_type.as_deref()
        ),
        (
            Some(StreamState::Failed),
            Some("filter panicked"),
            SyncMode::DontWait,
            Some("canopy.filters.v1.StatsResult")
        )
    );
    assert!(two.closed_unix_ns.is_some());
    assert_eq!(r.stream_named("stats").unwrap().unwrap().stream_id, 2);
    assert_eq!(r.stream(3).unwrap(), None);

    let rounds = r.rounds(Select::all()).unwrap();
    assert_eq!(rounds.len(), 3);
    let first = &rounds[0];
    assert_eq!(
        (
            first.stream_id,
            first.stream.as_str(),
            first.round,
            first.covered,
            first.expected
        ),
        (1, "s1", 7, 2, 4)
    );
    assert_eq!(first.missing.get(MissingReason::Lost), 2);
    assert_eq!(
        first.missing.iter().collect::<Vec<_>>(),
        [(MissingReason::Lost, 2)]
    );
    assert_eq!(first.missing.total(), 2);
    assert_eq!(first.missing_reason.as_deref(), Some("lost: 2"));
    assert_eq!(
        (first.late_ranks, first.result_bytes, first.pieces),
        (1, batch.len() as u64, 1)
    );
    assert_eq!(
        (first.first_dump_unix_ns, first.closed_unix_ns),
        (Some(1_000), Some(2_000))
    );
    assert!(!first.is_full() && rounds[1].is_full());
    assert_eq!(
        r.rounds(Select::all().stream(1).from_round(8)).unwrap(),
        [rounds[1].clone()]
    );
    assert_eq!(r.max_round().unwrap(), Some(8));

    let samples = r.samples(Select::all()).unwrap();
    assert_eq!(samples.len(), 2 * 2 * 2 + 1);
    let s = &samples[0];
    assert_eq!(
        (
            s.stream_id,
            s.round,
            s.app.as_str(),
            s.rank,
            s.event_id,
            s.calls,
            s.subrs
        ),
        (1, 7, "lulesh", 0, u64::MAX, Some(0), Some(1))
    );
    assert_eq!(
        (
            s.incl_us,
            s.excl_us,
            s.calls_total,
            s.subrs_total,
            s.incl_total_us,
            s.excl_total_us
        ),
        (
            Some(0.5),
            Some(0.25),
            Some(100),
            Some(101),
            Some(100.5),
            Some(100.25)
        )
    );
    assert_eq!((s.dump_unix_ns, s.late), (Some(1_000), false));
    let late_rows = r.samples(Select::all().late(true)).unwrap();
    assert_eq!(late_rows.len(), 1);
    assert_eq!((late_rows[0].rank, late_rows[0].round), (2, 7));
    assert_eq!(r.samples(Select::all().from_round(8)).unwrap().len(), 4);
    let counters = r.counters(Select::all().stream(1)).unwrap();
    assert_eq!(counters.len(), 4);
    assert_eq!(
        (
            counters[1].rank,
            counters[1].counter_id,
            counters[1].value,
            counters[1].total
        ),
        (1, 42, Some(1.5), Some(9.0))
    );
    // Per-event metrics: two a row each (the unknown one is left out), with the event and the rank.
    let em = r.event_metrics(Select::all().stream(1)).unwrap();
    let samples = r.samples(Select::all().stream(1)).unwrap();
    assert_eq!(em.len(), 2 * samples.len());
    assert_eq!(
        (em[0].rank, em[0].event_id, em[0].metric, em[0].value, em[0].total),
        (0, u64::MAX, Metric::PageFaultsExclusive, Some(0.75), Some(200.0))
    );
    assert_eq!((em[1].metric, em[1].value), (Metric::HeapAtEntry, Some(0.0)));
    let last = samples.last().unwrap();
    let last_em = em.last().unwrap();
    assert_eq!((last_em.rank, last_em.event_id), (last.rank, last.event_id));

    let results = r.results(Select::all()).unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(
        (
            results[0].stream_id,
            results[0].round,
            results[0].phase,
            results[0].late
        ),
        (2, 7, 1, false)
    );
    assert_eq!(results[0].payload, stats);
    assert_eq!(r.final_result(2, 7).unwrap(), Some(stats.clone()));
    let stat_rows = r.stats(Select::all()).unwrap();
    assert_eq!(stat_rows.len(), 1);
    let st = &stat_rows[0];
    assert_eq!(
        (
            st.id,
            st.metric,
            st.count,
            st.mean,
            st.class_id,
            st.max_rank,
            st.max_app.as_deref()
        ),
        (
            u64::MAX,
            Metric::Exclusive,
            4,
            Some(2.5),
            None,
            Some(3),
            Some("a")
        )
    );
    assert_eq!(st.app.as_deref(), Some("lulesh"), "the row's application");
    let reductions = r.reductions(Select::all()).unwrap();
    assert_eq!(reductions.len(), 1);
    assert_eq!(
        (
            reductions[0].raw_bytes,
            reductions[0].result_bytes,
            reductions[0].classes
        ),
        (1000, stats.len() as u64, None)
    );
    assert!(reductions[0].reduction_factor.unwrap() > 1.0);

    let arrivals = r.late_arrivals(Select::all()).unwrap();
    assert_eq!(arrivals.len(), 1);
    assert_eq!(
        (
            arrivals[0].stream_id,
            arrivals[0].round,
            arrivals[0].ranks,
            arrivals[0].bytes
        ),
        (1, 7, 1, late.len() as u64)
    );
    assert!(arrivals[0].arrived_unix_ns.is_some());

    assert_eq!(
        r.names().unwrap(),
        [(5, "A".to_string()), (u64::MAX, "MPI_Allreduce".to_string())]
    );
    assert_eq!(
        r.name_collisions().unwrap(),
        [Collision {
            id: 5,
            existing: "A".into(),
            new: "B".into()
        }]
    );
    let node = r.node("n1:0").unwrap().unwrap();
    assert_eq!(
        (node.kind, node.state, node.parent.as_deref(), node.ranks_below),
        (NodeKind::Agent, NodeState::Lost, Some("fe:0"), 4)
    );
    assert_eq!(
        (node.address.as_deref(), node.detail.as_deref()),
        (Some("10.0.0.1:7401"), Some("reset"))
    );
    assert_eq!(r.nodes().unwrap().len(), 1);

    let sum = r.summary().unwrap();
    assert_eq!(
        (
            sum.rounds,
            sum.streams,
            sum.full_rounds,
            sum.covered,
            sum.expected,
            sum.late_packets
        ),
        (3, 2, 2, 10, 12, 1)
    );
    assert_eq!(sum.result_bytes, 2 * batch.len() as u64 + stats.len() as u64);
    assert!((sum.coverage_pct() - 100.0 * 10.0 / 12.0).abs() < 1e-9);
    assert_eq!(r.count(Table::Samples).unwrap(), 9);
    assert_eq!(r.count(Table::ProfileBatches).unwrap(), 3);
    assert_eq!(
        r.count_where(Table::Samples, Select::all().late(false).from_round(8))
            .unwrap(),
        4
    );
    assert_eq!(r.count_where(Table::Names, Select::all().stream(9)).unwrap(), 2);
}

#[test]
fn new_rounds_follow_the_store_as_rounds_land() {
    let dir = tempdir();
    let mut store = Store::create(dir.path()).unwrap();
    let r = StoreReader::open(store.path()).unwrap();
    let mut cursor = RoundCursor::default();
    assert!(r.new_rounds(&mut cursor).unwrap().is_empty());
    store
        .write_round(&record(1, 0, 1, 1, &[]), Payload::None)
        .unwrap();
    store
        .write_round(&record(2, 0, 1, 1, &[]), Payload::None)
        .unwrap();
    let seen: Vec<_> = r
        .new_rounds(&mut cursor)
        .unwrap()
        .iter()
        .map(|r| r.stream_id)
        .collect();
    assert_eq!(seen, [1, 2]);
    assert!(r.new_rounds(&mut cursor).unwrap().is_empty());
    store
        .write_round(&record(1, 1, 1, 1, &[]), Payload::None)
        .unwrap();
    let seen: Vec<_> = r
        .new_rounds(&mut cursor)
        .unwrap()
        .iter()
        .map(|r| (r.stream_id, r.round))
        .collect();
    assert_eq!(seen, [(1, 1)]);
}

#[test]
fn histogram_and_class_results_become_rows_and_a_bad_one_is_refused() {
    let dir = tempdir();
    let mut store = Store::create(dir.path()).unwrap();
    let histogram = HistogramResult {
        stats: Vec::new(),
        histograms: vec![Histogram {
            id: 3,
            metric: Metric::Inclusive as i32,
            lo: 0.0,
            hi: 10.0,
            counts: vec![1, 0, 3, 4],
            app: String::new(),
        }],
        raw_bytes: 100,
        ..HistogramResult::default()
    }
    .encode_to_vec();
    store
        .write_filter_tables(1, 2, "canopy.filters.v1.HistogramResult", &histogram, true)
        .unwrap();
    let class_result = ClassResult {
        classes: vec![Class {
            class_id: 7,
            size: 9,
            ranks: vec![RankRange {
                app: "sim".into(),
                first: 1,
                last: 9,
            }],
            example_event: "Patch 1 -> x".into(),
            events: vec![5],
            counts: vec![2, 7],
            ..Class::default()
        }],
        raw_bytes: 900,
        result_bytes: 90,
        bins: 2,
        metric: Metric::Exclusive as i32,
        ranges: Some(BinRanges {
            id: vec![2, 5],
            lo: vec![0.0, 4.0],
            hi: vec![1.0, 8.0],
        }),
        ..ClassResult::default()
    };
    store
        .write_filter_tables(
            3,
            4,
            "canopy.filters.v1.ClassResult",
            &class_result.encode_to_vec(),
            false,
        )
        .unwrap();
    // A class whose counts do not fit its events is refused whole, naming what is wrong.
    let mut torn = class_result.clone();
    torn.classes[0].counts.pop();
    let err = store
        .write_filter_tables(
            3,
            5,
            "canopy.filters.v1.ClassResult",
            &torn.encode_to_vec(),
            false,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Invalid {
                what: "ClassResult",
                stream_id: 3,
                round: 5,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the ClassResult of stream 3 round 5 does not hold together: class 0x0000000000000007 has 1 counts \
         for 1 events of 2 bins"
    );
    let err = store
        .write_filter_tables(1, 8, "canopy.filters.v1.StatsResult", &[0xff, 0xff], false)
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Decode {
                what: "StatsResult",
                stream_id: 1,
                round: 8,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("cannot decode the StatsResult of stream 1 round 8: "),
        "{err}"
    );

    let r = StoreReader::open(store.path()).unwrap();
    let bins = r.histograms(Select::all()).unwrap();
    let (plain, classed): (Vec<_>, Vec<_>) = bins.iter().partition(|b| b.class_id.is_none());
    let shape: Vec<_> = plain
        .iter()
        .map(|b| (b.bin, b.lo, b.hi, b.count, b.late))
        .collect();
    assert_eq!(
        shape,
        [
            (0, Some(0.0), Some(2.5), 1, true),
            (1, Some(2.5), Some(5.0), 0, true),
            (2, Some(5.0), Some(7.5), 3, true),
            (3, Some(7.5), Some(10.0), 4, true),
        ]
    );
    assert!(plain.iter().all(|b| b.metric == Metric::Inclusive && b.id == 3));
    // The class's histogram of event 5, between the result's range for it.
    let class_bins: Vec<_> = classed
        .iter()
        .map(|b| (b.class_id, b.id, b.metric, b.bin, b.lo, b.hi, b.count, b.round))
        .collect();
    assert_eq!(
        class_bins,
        [
            (Some(7), 5, Metric::Exclusive, 0, Some(4.0), Some(6.0), 2, 4),
            (Some(7), 5, Metric::Exclusive, 1, Some(6.0), Some(8.0), 7, 4),
        ]
    );
    let rows = r.classes(Select::all()).unwrap();
    // The refused round 5 left no class behind.
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (
            rows[0].class_id,
            rows[0].size,
            rows[0].ranks.as_str(),
            rows[0].example_event.as_deref()
        ),
        (7, 9, "sim:1-9", Some("Patch 1 -> x"))
    );
    let reductions = r.reductions(Select::all().stream(3)).unwrap();
    assert_eq!(
        (reductions[0].classes, reductions[0].reduction_factor),
        (Some(1), Some(10.0))
    );
    // The bad result left nothing behind.
    assert_eq!(r.count(Table::Stats).unwrap(), 0);
    assert_eq!(
        r.count_where(Table::Reductions, Select::all().stream(1)).unwrap(),
        1
    );
}

#[test]
fn utilization_results_become_a_row_per_bin_and_activity_and_a_bad_one_is_refused() {
    let dir = tempdir();
    let mut store = Store::create(dir.path()).unwrap();
    let start = 1_700_000_000_000_000_000u64;
    // Two bins of 1 ms; the second has no records. An id above 2^63 reads back unsigned.
    let big = 0x9000_0000_0000_0001u64;
    let result = UtilizationResult {
        start_unix_ns: start,
        bin_us: 1000,
        activities: vec![0, 42, big],
        names: vec!["other".into(), "solve".into(), String::new()],
        counts: vec![3, 0, 1],
        activity: vec![0, 1, 2, 1],
        share: vec![30, 150, 70, 250],
        ranks: vec![4, 0, 1],
        profiles: 4,
        threshold: 25,
        raw_bytes: 4000,
        ..UtilizationResult::default()
    };
    let bytes = result.encode_to_vec();
    store
        .write_filter_tables(2, 9, "canopy.filters.v1.UtilizationResult", &bytes, false)
        .unwrap();
    store
        .write_filter_tables(2, 10, "canopy.filters.v1.UtilizationResult", &bytes, true)
        .unwrap();
    // A record naming an activity the result does not have is refused whole.
    let mut torn = result.clone();
    torn.activity[3] = 3;
    let err = store
        .write_filter_tables(
            2,
            11,
            "canopy.filters.v1.UtilizationResult",
            &torn.encode_to_vec(),
            false,
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the UtilizationResult of stream 2 round 11 does not hold together: record 3 names activity 3 of 3"
    );
    let mut short = result.clone();
    short.ranks.pop();
    let err = store
        .write_filter_tables(
            2,
            12,
            "canopy.filters.v1.UtilizationResult",
            &short.encode_to_vec(),
            false,
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the UtilizationResult of stream 2 round 12 does not hold together: 3 bins but 2 rank counts"
    );

    let r = StoreReader::open(store.path()).unwrap();
    let rows = r.utilization(Select::all().late(false)).unwrap();
    let got: Vec<_> = rows
        .iter()
        .map(|u| {
            (
                u.round,
                u.bin,
                u.start_unix_ns,
                u.activity_id,
                u.share,
                u.ranks,
                u.late,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (9, 0, start, 0, 30, 4, false),
            (9, 0, start, 42, 150, 4, false),
            (9, 0, start, big, 70, 4, false),
            (9, 2, start + 2_000_000, 42, 250, 1, false),
        ]
    );
    assert!(rows.iter().all(|u| u.stream_id == 2));
    assert_eq!(r.utilization(Select::all()).unwrap().len(), 8);
    assert_eq!(
        r.count_where(Table::Utilization, Select::all().from_round(10))
            .unwrap(),
        4
    );
    // The refused rounds left nothing behind; the stored ones have their reduction.
    assert_eq!(r.count(Table::Utilization).unwrap(), 8);
    let reductions = r.reductions(Select::all().stream(2)).unwrap();
    assert_eq!(reductions.len(), 2);
    assert_eq!(reductions[0].raw_bytes, 4000);
}

const NODE_SAMPLES: &str = "canopy.filters.v1.NodeSamples";

/// A node's sample of round `round`: ranks `first..=last` of app "a", every sampler's figures derived from `k`.
fn node_sample(node: &str, first: u32, last: u32, k: u64) -> NodeSample {
    NodeSample {
        node_id: node.into(),
        hostname: format!("{node}.example"),
        ranks: vec![RankRange {
            app: "a".into(),
            first,
            last,
        }],
        sample_unix_ns: 1_700_000_000_000_000_000 + k,
        interval_ns: 100_000_000,
        cpu: Some(CpuSample {
            cpus: 64,
            user_share: 0.5,
            nice_share: 0.0,
            system_share: 0.125,
            idle_share: 0.25,
            iowait_share: 0.0625,
            irq_share: 0.03125,
            steal_share: 0.03125,
        }),
        memory: Some(MemorySample {
            total_bytes: 1 << 40,
            available_bytes: 1 << 39,
            used_bytes: 1 << 39,
            page_faults: 100 + k,
            major_faults: k,
        }),
        network: Some(NetworkSample {
            rx_bytes: 1000 * k,
            tx_bytes: 10 * k,
            interfaces: 2,
        }),
        disk: Some(DiskSample {
            read_bytes: 512 * k,
            write_bytes: 4096 * k,
            disks: 1,
        }),
        load: Some(LoadSample {
            load_1m: 63.5,
            load_5m: 60.0,
            load_15m: 12.25,
            runnable: 65,
            threads: 1200,
        }),
    }
}

/// The node stream's results become a row per node with the units in its columns (NULL for what a node did not
/// sample) and a row per range of its ranks; a rank's row of another stream joins its node's sample in SQL,
/// through the reader and through the query the docs show; a sample without a node is refused.
#[test]
fn node_samples_become_rows_that_a_ranks_round_joins() {
    let dir = tempdir();
    let mut store = Store::create(dir.path()).unwrap();
    store
        .put_stream(&spec(1), StreamState::Open, None, Some(PROFILE_BATCH_TYPE))
        .unwrap();
    // Stream 1 keeps the profiles of ranks 0-3 (one event each) in rounds 7 and 8.
    for round in [7, 8] {
        let batch = profiles("a", 0..4, 1, 0);
        store
            .write_round(&record(1, round, 4, 4, &[]), Payload::Profiles(&batch))
            .unwrap();
    }
    // Stream 2 is the node stream: two nodes of two ranks each (one serving a rank of a second application too),
    // and a node whose agent runs no sampler, which serves no rank of the profiles.
    let mut split = node_sample("agent:1", 2, 3, 8);
    split.ranks.push(RankRange {
        app: "c".into(),
        first: 0,
        last: 0,
    });
    let bare = NodeSample {
        node_id: "agent:2".into(),
        ranks: vec![RankRange {
            app: "b".into(),
            first: 0,
            last: 0,
        }],
        ..Default::default()
    };
    let round7 = NodeSamples {
        nodes: vec![node_sample("agent:0", 0, 1, 7), split, bare],
    };
    store
        .write_filter_tables(2, 7, NODE_SAMPLES, &round7.encode_to_vec(), false)
        .unwrap();
    // Round 8 arrived late at the front-end (after its round was stored): kept, marked late.
    let round8 = NodeSamples {
        nodes: vec![node_sample("agent:0", 0, 3, 80)],
    };
    store
        .write_filter_tables(2, 8, NODE_SAMPLES, &round8.encode_to_vec(), true)
        .unwrap();
    let nameless = NodeSamples {
        nodes: vec![NodeSample::default()],
    };
    let err = store
        .write_filter_tables(2, 9, NODE_SAMPLES, &nameless.encode_to_vec(), false)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the NodeSamples of stream 2 round 9 does not hold together: a sample names no node"
    );

    let conn = Connection::open(store.path()).unwrap();
    assert_eq!(
        table(
            &conn,
            "SELECT round, node_id, hostname, ranks, interval_ns, cpus, cpu_user_share, cpu_idle_share, \
             mem_used_bytes, mem_page_faults, net_rx_bytes, disk_write_bytes, load_1m, load_threads, late \
             FROM node_samples ORDER BY round, node_id"
        ),
        [
            "7|agent:0|agent:0.example|a:0-1|100000000|64|0.5|0.25|549755813888|107|7000|28672|63.5|1200|0",
            "7|agent:1|agent:1.example|a:2-3,c:0|100000000|64|0.5|0.25|549755813888|108|8000|32768|63.5|1200|0",
            "7|agent:2||b:0|NULL|NULL|NULL|NULL|NULL|NULL|NULL|NULL|NULL|NULL|0",
            "8|agent:0|agent:0.example|a:0-3|100000000|64|0.5|0.25|549755813888|180|80000|327680|63.5|1200|1",
        ]
    );
    assert_eq!(
        table(
            &conn,
            "SELECT * FROM node_ranks ORDER BY round, node_id, app, first_rank"
        ),
        [
            "2|7|agent:0|a|0|1|0",
            "2|7|agent:1|a|2|3|0",
            "2|7|agent:1|c|0|0|0",
            "2|7|agent:2|b|0|0|0",
            "2|8|agent:0|a|0|3|1",
        ]
    );

    let r = StoreReader::open(store.path()).unwrap();
    let rows = r.node_samples(Select::all().stream(2).late(false)).unwrap();
    assert_eq!(rows.len(), 3);
    let first = &rows[0];
    assert_eq!(
        (first.node_id.as_str(), first.ranks.as_str(), first.round),
        ("agent:0", "a:0-1", 7)
    );
    assert_eq!(first.sample_unix_ns, Some(1_700_000_000_000_000_007));
    assert_eq!(
        (
            first.cpu_system_share,
            first.cpu_iowait_share,
            first.cpu_steal_share
        ),
        (Some(0.125), Some(0.0625), Some(0.03125))
    );
    assert_eq!(
        (
            first.mem_total_bytes,
            first.mem_available_bytes,
            first.mem_major_faults
        ),
        (Some(1 << 40), Some(1 << 39), Some(7))
    );
    assert_eq!(
        (
            first.net_tx_bytes,
            first.net_interfaces,
            first.disk_read_bytes,
            first.disks
        ),
        (Some(70), Some(2), Some(3584), Some(1))
    );
    assert_eq!(
        (first.load_5m, first.load_15m, first.load_runnable),
        (Some(60.0), Some(12.25), Some(65))
    );
    let bare = &rows[2];
    assert_eq!(
        (bare.hostname.as_str(), bare.sample_unix_ns, bare.cpu_user_share),
        ("", None, None)
    );
    assert_eq!(r.count(Table::NodeSamples).unwrap(), 4);
    assert_eq!(
        r.count_where(Table::NodeRanks, Select::all().late(true)).unwrap(),
        1
    );
    let ranges = r.node_ranks(Select::all().stream(2).from_round(7)).unwrap();
    assert_eq!(ranges.len(), 5);
    let r2 = &ranges[2];
    assert_eq!(
        (r2.node_id.as_str(), r2.app.as_str(), r2.first_rank, r2.last_rank),
        ("agent:1", "c", 0, 0)
    );

    // A rank's round finds its node's sample; a rank no node names finds none; a late sample is not taken.
    let of = |round, app: &str, rank| {
        r.rank_node_sample(2, round, app, rank)
            .unwrap()
            .map(|n| n.node_id)
    };
    assert_eq!(of(7, "a", 0).as_deref(), Some("agent:0"));
    assert_eq!(of(7, "a", 3).as_deref(), Some("agent:1"));
    assert_eq!(of(7, "b", 0).as_deref(), Some("agent:2"));
    assert_eq!(of(7, "c", 0).as_deref(), Some("agent:1"));
    assert_eq!(of(7, "a", 4), None);
    assert_eq!(of(8, "a", 0), None);

    // The documented join: each rank's event of stream 1 beside its node's sample of the same round.
    let mut st = conn.prepare(RANK_NODE_QUERY).unwrap();
    let joined: Vec<(i64, String, i64, String, f64, i64)> = st
        .query_map([1, 2], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(5)?,
                row.get(7)?,
                row.get(8)?,
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let half = 1i64 << 39;
    assert_eq!(
        joined,
        [
            (7, "a".to_string(), 0, "agent:0".to_string(), 0.5, half),
            (7, "a".to_string(), 1, "agent:0".to_string(), 0.5, half),
            (7, "a".to_string(), 2, "agent:1".to_string(), 0.5, half),
            (7, "a".to_string(), 3, "agent:1".to_string(), 0.5, half),
        ],
        "round 8's sample is late, so its ranks join nothing"
    );
}

/// A store as the front-end wrote it before the migrations: `user_version` 0, version 2 in `meta`.
fn legacy_v2(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("run-legacy.sqlite");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(include_str!("legacy_v2.sql")).unwrap();
    conn.execute_batch(
        "INSERT INTO streams (stream_id, name, filter, params, sync_mode, timeout_ms, state, result_type, ranks)
         VALUES (1, 'passthrough', 'passthrough', '', 'wait_for_all', 1000, 'open', 'canopy.v1.ProfileBatch', '');
         INSERT INTO rounds (stream_id, stream_name, round, covered, expected, missing_dropped, missing_reason)
         VALUES (1, 'passthrough', 0, 3, 4, 1, 'dropped: 1');
         INSERT INTO samples (stream_id, round, app, rank, event_id, calls) VALUES (1, 0, 'app', 0, 17, 5);
         INSERT INTO stats (stream_id, round, id, metric, count, mean) VALUES (1, 0, 17, 'exclusive', 3, 2.5);",
    )
    .unwrap();
    path
}

#[test]
fn a_version_2_store_reads_and_migrates_forward() {
    let dir = tempdir();
    let path = legacy_v2(dir.path());
    let old = StoreReader::open(&path).unwrap();
    assert_eq!(old.schema_version(), 2);
    let rounds = old.rounds(Select::all()).unwrap();
    assert_eq!(rounds.len(), 1);
    assert_eq!(
        (rounds[0].covered, rounds[0].missing.get(MissingReason::Dropped)),
        (3, 1)
    );
    assert_eq!(old.samples(Select::all()).unwrap()[0].calls, Some(5));
    // A store before version 15 has no application per stats row: its rows read None there.
    let stats = old.stats(Select::all()).unwrap();
    assert_eq!(
        (stats.len(), stats[0].count, stats[0].app.as_deref()),
        (1, 3, None)
    );
    // Tables of later versions read as empty.
    assert!(old.utilization(Select::all()).unwrap().is_empty());
    assert!(old.node_samples(Select::all()).unwrap().is_empty());
    assert!(old.node_ranks(Select::all()).unwrap().is_empty());
    assert_eq!(old.rank_node_sample(1, 0, "a", 0).unwrap(), None);
    // No batches were kept before version 3: a replay has the coverage and an empty result.
    let stream = old.stream(1).unwrap().unwrap();
    let replayed = old.stored_rounds(&stream, 0).unwrap();
    assert_eq!((replayed[0].covered, replayed[0].payload.len()), (3, 0));
    drop(old);

    let mut store = Store::open(&path).unwrap();
    let batch = profiles("app", 0..2, 1, 0);
    store
        .write_round(&record(1, 1, 2, 2, &[]), Payload::Profiles(&batch))
        .unwrap();
    drop(store);
    let conn = Connection::open(&path).unwrap();
    assert_eq!(one_i64(&conn, "PRAGMA user_version"), i64::from(SCHEMA_VERSION));
    assert_eq!(
        table(&conn, "SELECT key, value FROM meta ORDER BY key"),
        [
            "pid|4242",
            format!("schema_version|{SCHEMA_VERSION}").as_str(),
            "started_unix_ns|1700000000000000000"
        ]
    );
    let reader = StoreReader::open(&path).unwrap();
    assert_eq!(reader.schema_version(), SCHEMA_VERSION);
    let replayed = reader.stored_rounds(&stream, 0).unwrap();
    assert_eq!(replayed.len(), 2);
    assert_eq!((replayed[0].round, replayed[0].payload.len()), (0, 0));
    assert_eq!((replayed[1].round, &replayed[1].payload), (1, &batch));
    assert_eq!(reader.samples(Select::all()).unwrap().len(), 3);
}

#[test]
fn a_store_from_a_newer_canopy_is_refused() {
    let dir = tempdir();
    let store = Store::create(dir.path()).unwrap();
    let path = store.path().to_path_buf();
    drop(store);
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(conn);
    let err = StoreReader::open(&path).unwrap_err();
    assert!(
        matches!(err, StoreError::Version { found, .. } if found == SCHEMA_VERSION + 1),
        "{err:?}"
    );
    assert!(matches!(
        Store::open(&path).unwrap_err(),
        StoreError::Migrate { .. }
    ));
}

#[test]
fn a_round_and_its_rows_land_together_and_rows_that_cannot_be_made_leave_the_round_whole() {
    let dir = tempdir();
    let mut store = Store::create(dir.path()).unwrap();
    let stats = StatsResult {
        stats: vec![EventStats {
            id: 5,
            metric: Metric::Exclusive as i32,
            summary: summary(4, 2.5),
            ..EventStats::default()
        }],
        raw_bytes: 1000,
    }
    .encode_to_vec();
    let rows = |payload| {
        Some(Rows {
            result_type: "canopy.filters.v1.StatsResult",
            payload,
        })
    };
    let blob = |payload| Payload::Blob { phase: 0, payload };
    store
        .write_round_with(&record(1, 0, 4, 4, &[]), blob(&stats), rows(&stats))
        .unwrap();
    // A late packet's rows come with its late_arrivals row, marked late.
    store
        .write_late(1, 0, 1, stats.len() as u64, blob(&stats), rows(&stats))
        .unwrap();
    // Rows that cannot be made are refused, naming why; the round's row and result stay.
    let bad = [0xff, 0xff];
    let err = store
        .write_round_with(&record(1, 1, 4, 4, &[]), blob(&bad), rows(&bad))
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Decode {
                what: "StatsResult",
                stream_id: 1,
                round: 1,
                ..
            }
        ),
        "{err:?}"
    );
    // A class result that fails halfway, its class row written before its counts are found torn, leaves no
    // row of it behind: the rows are rolled back alone.
    let torn = ClassResult {
        classes: vec![Class {
            class_id: 7,
            size: 1,
            ranks: vec![RankRange {
                app: "sim".into(),
                first: 1,
                last: 1,
            }],
            events: vec![5],
            counts: vec![2],
            ..Class::default()
        }],
        bins: 2,
        ranges: Some(BinRanges {
            id: vec![5],
            lo: vec![0.0],
            hi: vec![1.0],
        }),
        ..ClassResult::default()
    }
    .encode_to_vec();
    let err = store
        .write_round_with(
            &record(1, 3, 4, 4, &[]),
            blob(&torn),
            Some(Rows {
                result_type: "canopy.filters.v1.ClassResult",
                payload: &torn,
            }),
        )
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { round: 3, .. }), "{err:?}");
    // A later round still writes whole after the refusals: the transaction and its savepoint are closed.
    store
        .write_round_with(&record(1, 2, 4, 4, &[]), blob(&stats), rows(&stats))
        .unwrap();
    let conn = Connection::open(store.path()).unwrap();
    let all = |sql: &str| -> Vec<(i64, i64)> {
        conn.prepare(sql)
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert_eq!(
        all("SELECT round, covered FROM rounds ORDER BY round"),
        [(0, 4), (1, 4), (2, 4), (3, 4)]
    );
    assert_eq!(
        all("SELECT round, late FROM results ORDER BY round, late"),
        [(0, 0), (0, 1), (1, 0), (2, 0), (3, 0)]
    );
    assert_eq!(all("SELECT round, class_id FROM classes"), []);
    assert_eq!(all("SELECT round, class_id FROM class_ranks"), []);
    assert_eq!(
        all("SELECT round, late FROM stats ORDER BY round, late"),
        [(0, 0), (0, 1), (2, 0)]
    );
    assert_eq!(
        all("SELECT round, late FROM reductions ORDER BY round, late"),
        [(0, 0), (0, 1), (2, 0)]
    );
    assert_eq!(all("SELECT round, ranks FROM late_arrivals"), [(0, 1)]);
}

/// Every column of every `stats` row reads back as written, whatever the number of rows (the inserts carry
/// several rows each, and a remainder one by one), for results read in place and results prost decodes (with
/// quantiles).
#[test]
fn stats_rows_read_back_column_for_column_in_any_number() {
    let dir = tempdir();
    let mut store = Store::create(dir.path()).unwrap();
    let sizes = [0usize, 1, 15, 16, 17, 37];
    let row = |n: usize, i: usize| {
        let x = (n * 100 + i) as f64;
        EventStats {
            id: u64::MAX - i as u64,
            metric: [
                Metric::Calls,
                Metric::Inclusive,
                Metric::Exclusive,
                Metric::Counter,
            ][i % 4] as i32,
            summary: Some(Summary {
                count: 1 + i as u64,
                mean: x + 0.25,
                m2: x * 3.0,
                std: x + 0.5,
                min: -x,
                max: x + 0.75,
                min_rank: Some(RankRef {
                    app: format!("min{i}"),
                    rank: i as u32,
                }),
                max_rank: Some(RankRef {
                    app: format!("max{i}"),
                    rank: 1000 + i as u32,
                }),
            }),
            quantiles: Vec::new(),
            app: if i.is_multiple_of(3) {
                String::new()
            } else {
                format!("app{}", i % 3)
            },
        }
    };
    let results: Vec<(usize, Vec<EventStats>)> = sizes
        .iter()
        .map(|&n| (n, (0..n).map(|i| row(n, i)).collect()))
        .collect();
    for (round, (_, stats)) in results.iter().enumerate() {
        let mut stats = stats.clone();
        // One result in another form than the root writes (a quantile): prost decodes it.
        if round == 4 {
            stats[3]
                .quantiles
                .push(canopy_proto::filters::v1::Quantile { q: 0.5, value: 1.0 });
        }
        let payload = StatsResult { stats, raw_bytes: 9 }.encode_to_vec();
        store
            .write_round_with(
                &record(1, round as u64, 4, 4, &[]),
                Payload::Blob {
                    phase: 0,
                    payload: &payload,
                },
                Some(Rows {
                    result_type: "canopy.filters.v1.StatsResult",
                    payload: &payload,
                }),
            )
            .unwrap();
    }
    let r = StoreReader::open(store.path()).unwrap();
    let stored = r.stats(Select::all()).unwrap();
    assert_eq!(stored.len(), sizes.iter().sum::<usize>());
    let mut stored = stored.into_iter();
    for (round, (_, stats)) in results.iter().enumerate() {
        for s in stats {
            let got = stored.next().unwrap();
            let sum = s.summary.as_ref().unwrap();
            let (lo, hi) = (sum.min_rank.as_ref().unwrap(), sum.max_rank.as_ref().unwrap());
            assert_eq!(
                (
                    got.stream_id,
                    got.round,
                    got.class_id,
                    got.id,
                    got.metric as i32,
                    got.count,
                    got.late
                ),
                (1, round as u64, None, s.id, s.metric, sum.count, false)
            );
            assert_eq!(
                (got.mean, got.std, got.min, got.max),
                (Some(sum.mean), Some(sum.std), Some(sum.min), Some(sum.max))
            );
            assert_eq!(
                (
                    got.min_app.as_deref(),
                    got.min_rank,
                    got.max_app.as_deref(),
                    got.max_rank
                ),
                (
                    Some(lo.app.as_str()),
                    Some(lo.rank),
                    Some(hi.app.as_str()),
                    Some(hi.rank)
                )
            );
            assert_eq!(got.app.as_deref(), Some(s.app.as_str()).filter(|a| !a.is_empty()));
        }
    }
    assert_eq!(
        r.stats_quantiles(Select::all()).unwrap().len(),
        1,
        "the decoded result's quantile"
    );
}
