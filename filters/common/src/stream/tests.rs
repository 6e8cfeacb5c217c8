use super::*;
use canopy_wire::v1::{CounterSample, EventSample, ProfileBatch, RankProfile, StepMark};
use prost::Message;

fn batch() -> ProfileBatch {
    let profile = |rank: u32| RankProfile {
        app: format!("app{rank}"),
        rank,
        round: 7,
        dump_unix_ns: 99,
        events: (0..5u64)
            .map(|i| EventSample {
                event_id: u64::MAX - i,
                calls: i,
                subrs: i + 1,
                incl_us: 1.5 * i as f64,
                excl_us: 0.5 * i as f64,
                calls_total: 10 * i,
                subrs_total: 11 * i,
                incl_total_us: 1e15,
                excl_total_us: 1e-12,
                metrics: vec![i as f64, 2.5, 1e9],
                metrics_total: vec![10.0 * i as f64, 25.0, 1e10],
            })
            .collect(),
        event_metrics: vec![18, 19, 40],
        counters: vec![CounterSample {
            counter_id: 3,
            value: 2.0,
            total: 4.0,
        }],
        metrics: 6,
        marks: (0..3u64)
            .map(|i| StepMark {
                key_id: u64::MAX - i,
                step: i << 40,
                stop: i % 2 == 1,
                unix_ns: 1_700_000_000_000_000_000 + i,
            })
            .collect(),
        marks_lost: u64::from(rank) * 7,
        ..RankProfile::default()
    };
    ProfileBatch {
        profiles: vec![profile(1), profile(2)],
    }
}

#[test]
fn reads_what_prost_reads() {
    let b = batch();
    let bytes = b.encode_to_vec();
    let mut buffers = Buffers::default();
    let views = read_batch(&bytes, &mut buffers).unwrap();
    assert_eq!(views.len(), 2);
    for (v, p) in views.iter().zip(&b.profiles) {
        assert_eq!((v.app, v.rank, v.metrics), (p.app.as_str(), p.rank, p.metrics));
        let events: Vec<EventSample> = buffers.events[v.events.clone()]
            .iter()
            .map(|e| sample_of(e, &buffers))
            .collect();
        assert_eq!(events, p.events);
        assert_eq!(buffers.event_metrics[v.event_metrics.clone()], p.event_metrics);
        assert_eq!(buffers.counters[v.counters.clone()][0].total, 4.0);
        let marks: Vec<StepMark> = buffers.marks[v.marks.clone()]
            .iter()
            .map(|m| StepMark {
                key_id: m.key_id,
                step: m.step,
                stop: m.stop,
                unix_ns: m.unix_ns,
            })
            .collect();
        assert_eq!((marks, v.marks_lost), (p.marks.clone(), p.marks_lost));
    }
}

/// Fields in another order than the writers', and fields seen twice (the last wins), read as prost reads
/// them.
#[test]
fn reads_fields_in_any_order_as_prost_does() {
    let part = |e: EventSample| e.encode_to_vec();
    let mut event = part(EventSample {
        excl_total_us: 4.5,
        subrs: 300,
        metrics_total: vec![8.0],
        ..Default::default()
    });
    event.extend(part(EventSample {
        event_id: 7,
        calls: 2,
        incl_us: 1.0,
        ..Default::default()
    }));
    event.extend(part(EventSample {
        calls: 1 << 40,
        excl_total_us: 9.0,
        metrics: vec![1.0, 2.0],
        metrics_total: vec![9.0],
        ..Default::default()
    }));
    // One more value, unpacked.
    prost::encoding::double::encode(10, &3.0, &mut event);
    let mut profile = Vec::new();
    prost::encoding::uint32::encode(2, &3, &mut profile);
    prost::encoding::bytes::encode(5, &event, &mut profile);
    let mut batch = Vec::new();
    prost::encoding::bytes::encode(1, &profile, &mut batch);
    let expected = ProfileBatch::decode(batch.as_slice()).unwrap().profiles[0].events[0].clone();
    assert_eq!(
        (expected.calls, expected.excl_total_us, expected.subrs),
        (1 << 40, 9.0, 300)
    );
    let mut buffers = Buffers::default();
    let views = read_batch(&batch, &mut buffers).unwrap();
    assert_eq!(views[0].rank, 3);
    let e = buffers.events[0];
    let got = sample_of(&e, &buffers);
    assert_eq!(got, expected);
    assert_eq!(
        (got.metrics, got.metrics_total),
        (vec![1.0, 2.0, 3.0], vec![8.0, 9.0])
    );
}

#[test]
fn refuses_what_prost_refuses_and_keeps_the_buffers() {
    let bytes = batch().encode_to_vec();
    let mut buffers = Buffers::default();
    read_batch(&bytes, &mut buffers).unwrap();
    let kept = buffers.events.len();
    // Every truncation and a few corruptions: the verdict agrees with prost's.
    let mut cases: Vec<Vec<u8>> = (0..bytes.len()).map(|n| bytes[..n].to_vec()).collect();
    for i in (0..bytes.len()).step_by(7) {
        let mut b = bytes.clone();
        b[i] ^= 0xff;
        cases.push(b);
    }
    cases.push(vec![0x0a, 0x03, 0x0a, 0x01, 0xff]); // an app that is not UTF-8
    for case in cases {
        let ours = read_batch(&case, &mut buffers);
        let theirs = ProfileBatch::decode(case.as_slice());
        assert_eq!(ours.is_ok(), theirs.is_ok(), "{case:?}: {ours:?} / {theirs:?}");
        if ours.is_err() {
            assert_eq!(buffers.events.len(), kept);
        } else {
            buffers.clear();
            read_batch(&bytes, &mut buffers).unwrap();
        }
    }
}

/// A batch as the writers write it has its rank found at its front: prost's encoding and the SDK's, with
/// the app or the rank left out as defaults; a batch of two profiles or none has no hint.
#[test]
fn the_writers_put_the_rank_at_the_front() {
    for (app, rank) in [("app", 7), ("", 7), ("app", 0), ("", 0), ("x", u32::MAX)] {
        let mut profile = batch().profiles.remove(0);
        (profile.app, profile.rank) = (app.to_string(), rank);
        let bytes = ProfileBatch {
            profiles: vec![profile],
        }
        .encode_to_vec();
        assert_eq!(rank_hint(&bytes), Some((app, rank)));
        let mut buffers = Buffers::default();
        let views = read_batch(&bytes, &mut buffers).unwrap();
        assert_eq!((views[0].app, views[0].rank), (app, rank));
    }
    let mut writer = canopy_wire::write::ProfileWriter::default();
    writer.begin(&canopy_wire::write::ProfileHeader {
        app: "sdk",
        rank: 3,
        round: 1,
        dump_unix_ns: 2,
    });
    let mut sdk = Vec::new();
    writer.finish_batch_with(0, None, &[], &mut sdk);
    assert_eq!(rank_hint(&sdk), Some(("sdk", 3)));
    assert_eq!(rank_hint(&batch().encode_to_vec()), None, "two profiles");
    assert_eq!(rank_hint(&[]), None, "no profile");
    assert_eq!(rank_hint(&[0x0a, 0x05, 0x01]), None, "cut short");
}

/// A read event as the message it stands for.
fn sample_of(e: &EventView, buffers: &Buffers) -> EventSample {
    EventSample {
        event_id: e.id,
        calls: e.calls,
        subrs: e.subrs,
        incl_us: e.incl_us,
        excl_us: e.excl_us,
        calls_total: e.calls_total,
        subrs_total: e.subrs_total,
        incl_total_us: e.incl_total_us,
        excl_total_us: e.excl_total_us,
        metrics: e.metric_values(buffers, false).to_vec(),
        metrics_total: e.metric_values(buffers, true).to_vec(),
    }
}

proptest::proptest! {
    /// Events as the writers write them, with counts of every width (one-byte, two-byte and longer
    /// varints, zeros left out): read as prost reads them.
    #[test]
    fn events_of_any_width_read_as_prost_reads_them(
        events in proptest::collection::vec(
            (
                proptest::prelude::any::<u64>(),
                proptest::array::uniform4(proptest::prop_oneof![
                    proptest::prelude::Just(0u64),
                    0u64..0x80,
                    0x80u64..0x4000,
                    proptest::prelude::any::<u64>(),
                ]),
                proptest::collection::vec(-1e3..1e3f64, 0..3),
            ),
            0..8,
        )
    ) {
        let profile = RankProfile {
            rank: 3,
            events: events
                .iter()
                .map(|(id, [calls, subrs, calls_total, subrs_total], metrics)| EventSample {
                    event_id: *id,
                    calls: *calls,
                    subrs: *subrs,
                    incl_us: 1.5,
                    excl_us: 0.5,
                    calls_total: *calls_total,
                    subrs_total: *subrs_total,
                    incl_total_us: 3.0,
                    excl_total_us: 1.0,
                    metrics: metrics.clone(),
                    metrics_total: metrics.iter().map(|m| m * 2.0).collect(),
                })
                .collect(),
            ..RankProfile::default()
        };
        let bytes = ProfileBatch { profiles: vec![profile.clone()] }.encode_to_vec();
        let mut buffers = Buffers::default();
        let views = read_batch(&bytes, &mut buffers).unwrap();
        let read: Vec<EventSample> =
            buffers.events[views[0].events.clone()].iter().map(|e| sample_of(e, &buffers)).collect();
        proptest::prop_assert_eq!(read, profile.events);
    }
}
