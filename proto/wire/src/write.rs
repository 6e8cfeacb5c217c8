//! Writing a `RankProfile` straight from its parts, without building an `EventSample` message per event: the
//! bytes are exactly those prost writes for the same message (fields in tag order, default values left out),
//! into buffers kept from one dump to the next.

use prost::encoding::encode_varint;

use crate::v1::{CounterSample, EventSample};

/// A length-delimited field's key: the field number and wire type 2.
const fn len_key(field: u8) -> u8 {
    field << 3 | 2
}

/// Builds one encoded `RankProfile` at a time. Call [`ProfileWriter::begin`], then [`ProfileWriter::event`]
/// and [`ProfileWriter::counter`] in the order the message lists them, then one of the `finish` methods.
#[derive(Debug, Default)]
pub struct ProfileWriter {
    body: Vec<u8>,
}

/// The header fields of a `RankProfile` (tags 1 to 4).
#[derive(Debug, Clone, Copy)]
pub struct ProfileHeader<'a> {
    pub app: &'a str,
    pub rank: u32,
    pub round: u64,
    pub dump_unix_ns: u64,
}

impl ProfileWriter {
    /// Starts a profile, dropping whatever an unfinished one wrote.
    pub fn begin(&mut self, h: &ProfileHeader<'_>) {
        let b = &mut self.body;
        b.clear();
        if !h.app.is_empty() {
            b.push(len_key(1));
            encode_varint(h.app.len() as u64, b);
            b.extend_from_slice(h.app.as_bytes());
        }
        varint_field(b, 2, u64::from(h.rank));
        varint_field(b, 3, h.round);
        varint_field(b, 4, h.dump_unix_ns);
    }

    /// Appends one event (field 5); its per-event metrics (fields 10 and 11) are left out: profiles written
    /// here list none (`RankProfile.event_metrics` stays empty).
    pub fn event(&mut self, e: &EventSample) {
        // Key and length, then at most 9 bytes for the id and each double and 11 for each varint field: an
        // event is at most 89 bytes long, so its length takes one byte and is filled in once the fields are
        // written. Written in place, through a window of the buffer: bytes pushed one by one would each
        // reload and store the vector's length (a byte written may be any byte, its length's too, for all the
        // compiler knows), and bytes stored on the side and copied in after are read back wider, which stalls.
        let b = &mut self.body;
        let start = b.len();
        b.resize(start + EVENT_MAX, 0);
        let window: &mut [u8; EVENT_MAX] = (&mut b[start..]).try_into().expect("EVENT_MAX bytes");
        let mut w = Window { bytes: window, at: 2 };
        w.bytes[0] = len_key(5);
        w.fixed64(1, e.event_id);
        w.varint(2, e.calls);
        w.varint(3, e.subrs);
        w.double(4, e.incl_us);
        w.double(5, e.excl_us);
        w.varint(6, e.calls_total);
        w.varint(7, e.subrs_total);
        w.double(8, e.incl_total_us);
        w.double(9, e.excl_total_us);
        let len = w.at;
        w.bytes[1] = (len - 2) as u8;
        b.truncate(start + len);
    }

    /// Appends one counter (field 6), after every event.
    pub fn counter(&mut self, c: &CounterSample) {
        let b = &mut self.body;
        let len = fixed64_len(c.counter_id) + double_len(c.value) + double_len(c.total);
        b.push(len_key(6));
        encode_varint(len as u64, b);
        fixed64_field(b, 1, c.counter_id);
        double_field(b, 2, c.value);
        double_field(b, 3, c.total);
    }

    /// Ends the profile with its `metrics` (field 7) and appends it to `out` as an encoded `RankProfile`.
    pub fn finish(&mut self, metrics: u32, out: &mut Vec<u8>) {
        varint_field(&mut self.body, 7, u64::from(metrics));
        out.extend_from_slice(&self.body);
    }

    /// Ends the profile as [`ProfileWriter::finish`] does and appends it to `out` as an encoded
    /// `ProfileBatch` holding it alone.
    pub fn finish_batch(&mut self, metrics: u32, out: &mut Vec<u8>) {
        self.finish_batch_with(metrics, None, &[], out);
    }

    /// Ends the profile as [`ProfileWriter::finish_batch`] does, with a utilization profile (field 10) and step
    /// marks (field 12).
    pub fn finish_batch_with(
        &mut self,
        metrics: u32,
        utilization: Option<&crate::v1::Utilization>,
        marks: &[crate::v1::StepMark],
        out: &mut impl prost::bytes::BufMut,
    ) {
        varint_field(&mut self.body, 7, u64::from(metrics));
        if let Some(u) = utilization {
            self.body.push(len_key(10));
            encode_varint(prost::Message::encoded_len(u) as u64, &mut self.body);
            prost::Message::encode_raw(u, &mut self.body);
        }
        for m in marks {
            self.body.push(len_key(12));
            encode_varint(prost::Message::encoded_len(m) as u64, &mut self.body);
            prost::Message::encode_raw(m, &mut self.body);
        }
        out.put_u8(len_key(1));
        encode_varint(self.body.len() as u64, out);
        out.put_slice(&self.body);
    }
}

fn fixed64_len(v: u64) -> usize {
    if v == 0 { 0 } else { 9 }
}

fn double_len(v: f64) -> usize {
    // prost leaves out 0.0 and -0.0 alike (it compares with ==).
    if v == 0.0 { 0 } else { 9 }
}

/// The most an event takes: its key and one-byte length, four fixed64 fields of 9 bytes, four varints of 11.
const EVENT_MAX: usize = 2 + 5 * 9 + 4 * 11;

/// A window of a buffer being written, and how far it is written.
struct Window<'a> {
    bytes: &'a mut [u8; EVENT_MAX],
    at: usize,
}

impl Window<'_> {
    /// A varint field, left out when 0 (as prost leaves out a default).
    #[inline(always)]
    fn varint(&mut self, field: u8, mut v: u64) {
        if v != 0 {
            self.bytes[self.at] = field << 3;
            self.at += 1;
            while v >= 0x80 {
                self.bytes[self.at] = v as u8 | 0x80;
                self.at += 1;
                v >>= 7;
            }
            self.bytes[self.at] = v as u8;
            self.at += 1;
        }
    }

    /// A fixed64 field, left out when 0.
    #[inline(always)]
    fn fixed64(&mut self, field: u8, v: u64) {
        if v != 0 {
            self.bits(field, v);
        }
    }

    /// A double field, left out when it equals 0.0 (-0.0 too, as prost leaves it out).
    #[inline(always)]
    fn double(&mut self, field: u8, v: f64) {
        if v != 0.0 {
            self.bits(field, v.to_bits());
        }
    }

    #[inline(always)]
    fn bits(&mut self, field: u8, v: u64) {
        self.bytes[self.at] = field << 3 | 1;
        self.bytes[self.at + 1..self.at + 9].copy_from_slice(&v.to_le_bytes());
        self.at += 9;
    }
}

fn varint_field(b: &mut Vec<u8>, field: u8, mut v: u64) {
    if v != 0 {
        b.push(field << 3);
        while v >= 0x80 {
            b.push(v as u8 | 0x80);
            v >>= 7;
        }
        b.push(v as u8);
    }
}

fn fixed64_field(b: &mut Vec<u8>, field: u8, v: u64) {
    if v != 0 {
        b.push(field << 3 | 1);
        b.extend_from_slice(&v.to_le_bytes());
    }
}

fn double_field(b: &mut Vec<u8>, field: u8, v: f64) {
    if v != 0.0 {
        b.push(field << 3 | 1);
        b.extend_from_slice(&v.to_bits().to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{ProfileBatch, RankProfile};
    use proptest::prelude::*;
    use prost::Message;

    fn value() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(0.0),
            Just(-0.0),
            Just(f64::NAN),
            Just(f64::INFINITY),
            any::<f64>(),
            0.0..1e6
        ]
    }

    fn count() -> impl Strategy<Value = u64> {
        prop_oneof![Just(0u64), 0u64..200, any::<u64>()]
    }

    fn event() -> impl Strategy<Value = EventSample> {
        (
            (count(), count(), count(), count(), count()),
            (value(), value(), value(), value()),
        )
            .prop_map(
                |((event_id, calls, subrs, calls_total, subrs_total), (a, b, c, d))| EventSample {
                    event_id,
                    calls,
                    subrs,
                    incl_us: a,
                    excl_us: b,
                    calls_total,
                    subrs_total,
                    incl_total_us: c,
                    excl_total_us: d,
                    // The writer is for profiles without per-event metrics (simulated ranks measure none).
                    metrics: Vec::new(),
                    metrics_total: Vec::new(),
                },
            )
    }

    fn profile() -> impl Strategy<Value = RankProfile> {
        (
            prop_oneof![Just(String::new()), "[a-zé]{1,12}"],
            any::<u32>(),
            count(),
            count(),
            prop::collection::vec(event(), 0..12),
            prop::collection::vec(
                (count(), value(), value()).prop_map(|(counter_id, value, total)| CounterSample {
                    counter_id,
                    value,
                    total,
                }),
                0..4,
            ),
            prop_oneof![Just(0u32), 0u32..16],
        )
            .prop_map(
                |(app, rank, round, dump_unix_ns, events, counters, metrics)| RankProfile {
                    app,
                    rank,
                    round,
                    dump_unix_ns,
                    events,
                    counters,
                    metrics,
                    // Simulated ranks, the writer's one user, ship no trace.
                    ..RankProfile::default()
                },
            )
    }

    fn write(w: &mut ProfileWriter, p: &RankProfile) {
        w.begin(&ProfileHeader {
            app: &p.app,
            rank: p.rank,
            round: p.round,
            dump_unix_ns: p.dump_unix_ns,
        });
        for e in &p.events {
            w.event(e);
        }
        for c in &p.counters {
            w.counter(c);
        }
    }

    proptest! {
        /// The writer's bytes are prost's, for a profile and for a batch of one, with the writer reused.
        #[test]
        fn writes_what_prost_writes(profiles in prop::collection::vec(profile(), 1..4)) {
            let mut w = ProfileWriter::default();
            for p in &profiles {
                let mut got = Vec::new();
                write(&mut w, p);
                w.finish(p.metrics, &mut got);
                prop_assert_eq!(&got, &p.encode_to_vec());
                let mut batch = vec![7u8];
                write(&mut w, p);
                w.finish_batch(p.metrics, &mut batch);
                let expected = ProfileBatch { profiles: vec![p.clone()] }.encode_to_vec();
                prop_assert_eq!(&batch[1..], expected.as_slice());
                // With a utilization profile and step marks, as simulated ranks write them.
                let u = crate::v1::Utilization {
                    start_unix_ns: p.dump_unix_ns,
                    bin_us: 1000,
                    activities: vec![0, p.round | 1],
                    counts: vec![2, 0, 1],
                    activity: vec![0, 1, 1],
                    share: vec![30, 200, 250],
                    threads: 1,
                    ..Default::default()
                };
                let mut batch = Vec::new();
                write(&mut w, p);
                let marks = [
                    crate::v1::StepMark { key_id: p.round ^ 0xfeed, step: p.round, stop: false, unix_ns: p.dump_unix_ns },
                    crate::v1::StepMark { key_id: 7, step: 0, stop: true, unix_ns: 0 },
                ];
                w.finish_batch_with(p.metrics, Some(&u), &marks, &mut batch);
                let with = RankProfile { utilization: Some(u), marks: marks.to_vec(), ..p.clone() };
                let expected = ProfileBatch { profiles: vec![with] }.encode_to_vec();
                prop_assert_eq!(&batch, &expected);
            }
        }
    }
}
