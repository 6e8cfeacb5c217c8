//! The agent's socket: the frames a rank sends (and the SDK's side, the frames an agent sends back), the
//! messages in them and what the agent makes of a dump's profile; and the measurement options a Control
//! carries down to every rank.

use std::cell::RefCell;
use std::collections::HashMap;

use canopy_filter_common::stream::{Buffers, read_batch};
use canopy_wire::options::Measure;
use canopy_wire::v1::{
    AgentMessage, EventSample, Options, ProfileBatch, RankAbsence, RankMessage, RankProfile, rank_message,
};
use canopy_wire::{FrameError, FrameLimits, MAX_FRAME, batch_of_one, encode_frame, read_frame};
use prost::Message;

use crate::input::Input;

thread_local! {
    /// One runtime per thread for the async reader: its reads complete at once from a byte slice.
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    RUNTIME.with(|rt| {
        let mut rt = rt.borrow_mut();
        let rt = rt.get_or_insert_with(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a current-thread runtime")
        });
        rt.block_on(f)
    })
}

/// The bytes a rank writes to the agent's socket (after one byte that picks the agent's `max_frame_bytes`),
/// read as the agent reads them (`read_frame_async` within its limits) and as the blocking reader does; the
/// same bytes read as the frames an agent sends to a rank (the SDK's side). Every message read is checked
/// as the agent would use it.
pub fn rank_frames(data: &[u8]) {
    let mut input = Input::new(data);
    let max_bytes = (4096usize << input.below(13)).min(MAX_FRAME);
    let stream = input.rest();

    let limits = FrameLimits {
        max_bytes,
        ..Default::default()
    };
    let agent_read = block_on(async {
        let mut r = stream;
        let mut buf = Vec::new();
        let mut msgs = Vec::new();
        loop {
            match canopy_wire::read_frame_async::<RankMessage>(&mut r, &mut buf, limits).await {
                Ok(msg) => {
                    assert!(buf.len() <= max_bytes, "a frame over the limit was read");
                    msgs.push(msg);
                }
                // The agent ends the connection at the first bad frame; it says why.
                Err(e) => {
                    let _ = e.to_string();
                    break (msgs, e);
                }
            }
        }
    });
    for msg in &agent_read.0 {
        rank_message(msg);
    }

    // The blocking reader (MAX_FRAME): the same frames, as far as the agent's limit let it read.
    let mut r = stream;
    let mut buf = Vec::new();
    let mut read = 0;
    loop {
        match read_frame::<RankMessage>(&mut r, &mut buf) {
            Ok(msg) => {
                if read < agent_read.0.len() {
                    assert_eq!(msg, agent_read.0[read], "the two readers read different messages");
                }
                read += 1;
            }
            Err(FrameError::Decode(_)) if read < agent_read.0.len() => {
                panic!("the blocking reader refused a frame the agent read")
            }
            Err(_) => break,
        }
    }

    // The SDK reads the agent's frames with the blocking reader.
    let mut r = stream;
    while let Ok(msg) = read_frame::<AgentMessage>(&mut r, &mut buf) {
        if let Some(canopy_wire::v1::agent_message::Msg::Control(c)) = &msg.msg
            && let Some(o) = &c.options
        {
            let _ = Measure::from_options(o);
        }
    }
}

/// What the agent does with one message a rank sent, as far as it is a function of the message: a frame that
/// round-trips, the rank's source id, the absence it reports, and a dump's profile wrapped as the leaf's filter
/// input and read as the filters read it.
fn rank_message(msg: &RankMessage) {
    let mut frame = Vec::new();
    encode_frame(msg, &mut frame);
    let again: RankMessage = read_frame(&mut frame.as_slice(), &mut Vec::new()).expect("a frame we wrote");
    assert_eq!(again.encode_to_vec(), msg.encode_to_vec());
    match &msg.msg {
        Some(rank_message::Msg::Hello(h)) => {
            let _ = canopy_core::node::rank_source(&h.app, h.rank);
        }
        Some(rank_message::Msg::Dump(d)) => {
            let _ = RankAbsence::try_from(d.absence);
            profile_batch(&batch_of_one(&d.profile));
        }
        Some(rank_message::Msg::Fin(_)) | None => {}
    }
}

/// A leaf filter's input: its two readers (prost's, and the filters' own streaming reader) must agree on
/// whether it is a `ProfileBatch` and on every value in it.
pub fn profile_batch(bytes: &[u8]) {
    let decoded = ProfileBatch::decode(bytes);
    let mut buffers = Buffers::default();
    let views = read_batch(bytes, &mut buffers);
    match (&decoded, &views) {
        (Ok(batch), Ok(views)) => {
            assert_eq!(batch.profiles.len(), views.len(), "profiles in {bytes:?}");
            for (p, v) in batch.profiles.iter().zip(views) {
                assert_eq!((p.app.as_str(), p.rank, p.metrics), (v.app, v.rank, v.metrics));
                let events = &buffers.events[v.events.clone()];
                assert_eq!(p.events.len(), events.len());
                for (e, ev) in p.events.iter().zip(events) {
                    let a = (e.event_id, e.calls, e.subrs, e.calls_total, e.subrs_total);
                    let b = (ev.id, ev.calls, ev.subrs, ev.calls_total, ev.subrs_total);
                    assert_eq!(a, b, "event of {bytes:?}");
                    let a = [e.incl_us, e.excl_us, e.incl_total_us, e.excl_total_us].map(f64::to_bits);
                    let b = [ev.incl_us, ev.excl_us, ev.incl_total_us, ev.excl_total_us].map(f64::to_bits);
                    assert_eq!(a, b, "event times of {bytes:?}");
                }
                let counters = &buffers.counters[v.counters.clone()];
                assert_eq!(p.counters.len(), counters.len());
                for (c, cv) in p.counters.iter().zip(counters) {
                    let a = (c.counter_id, c.value.to_bits(), c.total.to_bits());
                    assert_eq!(a, (cv.id, cv.value.to_bits(), cv.total.to_bits()));
                }
            }
        }
        (Err(_), Err(_)) => {}
        _ => panic!(
            "prost and the filters' reader disagree on {bytes:?}: {:?} / {:?}",
            decoded.as_ref().err(),
            views.as_ref().err()
        ),
    }
}

/// Measurement options as a Control carries them (an encoded `canopy.v1.Options`): checked as the front-end
/// checks them, and applied to a profile as a leaf applies them.
pub fn measure_options(data: &[u8]) {
    let Ok(options) = Options::decode(data) else {
        return;
    };
    let Ok(measure) = Measure::from_options(&options) else {
        return;
    };
    let names: HashMap<u64, String> = ["MPI_Send()", "MPI_Allreduce()", "main", "", "Patch 1 -> 0"]
        .iter()
        .enumerate()
        .map(|(i, n)| (i as u64 + 1, n.to_string()))
        .chain(
            options
                .include
                .iter()
                .map(|p| (canopy_wire::event_id(p), p.clone())),
        )
        .collect();
    let profile = RankProfile {
        app: "a".into(),
        events: (0..=names.len() as u64 + 1)
            .map(|event_id| EventSample {
                event_id,
                calls: 1,
                ..Default::default()
            })
            .collect(),
        counters: vec![canopy_wire::v1::CounterSample {
            counter_id: 1,
            ..Default::default()
        }],
        ..Default::default()
    };
    // The global options, and each application's laid over them.
    let per_app = options.apps.iter().map(|a| measure.for_app(&a.app));
    for measure in std::iter::once(measure.clone()).chain(per_app) {
        let applied = measure.apply(profile.clone(), &names);
        assert!(applied.events.len() <= profile.events.len());
        for e in &applied.events {
            let name = names.get(&e.event_id).map(String::as_str).unwrap_or("");
            assert!(measure.reports(name), "event {name:?} kept against the options");
        }
        let _ = measure.samples_out(options.sample_below.saturating_sub(1));
    }
}
