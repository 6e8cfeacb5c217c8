//! Reading a leaf's inputs (encoded `canopy.v1.ProfileBatch`es) without building the messages: the events and
//! counters land in flat buffers a filter keeps from round to round, so a round of a thousand 100-event
//! profiles costs no allocation per event. An input is checked whole before anything of it is used: the
//! same inputs prost refuses are refused here (bad keys, wire types, lengths, UTF-8), and a refused input
//! leaves the buffers as they were.

use std::ops::Range;

use prost::bytes::Buf;
use prost::encoding::{DecodeContext, WireType, check_wire_type, decode_key, decode_varint, skip_field};

use canopy_filter_proto::v1::RankRef;

/// One event of one rank, as `canopy.v1.EventSample` carries it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EventView {
    pub id: u64,
    pub calls: u64,
    pub subrs: u64,
    pub incl_us: f64,
    pub excl_us: f64,
    pub calls_total: u64,
    pub subrs_total: u64,
    pub incl_total_us: f64,
    pub excl_total_us: f64,
    /// Where its per-event metrics are in `Buffers::values` (this round's), and their totals.
    pub metrics: (u32, u32),
    pub metrics_total: (u32, u32),
}

impl EventView {
    /// This round's per-event metric values (`Values::Round`) or their totals, from the buffers.
    #[inline]
    pub fn metric_values<'b>(&self, buffers: &'b Buffers, cumulative: bool) -> &'b [f64] {
        let (at, len) = if cumulative {
            self.metrics_total
        } else {
            self.metrics
        };
        &buffers.values[at as usize..(at + len) as usize]
    }
}

/// One counter of one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CounterView {
    pub id: u64,
    pub value: f64,
    pub total: f64,
}

/// One step mark of one rank, as `canopy.v1.StepMark` carries it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MarkView {
    pub key_id: u64,
    pub step: u64,
    pub stop: bool,
    pub unix_ns: u64,
}

/// One rank's profile: its header, and where its events and counters are in the buffers.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileView<'a> {
    pub app: &'a str,
    pub rank: u32,
    pub metrics: u32,
    pub events: Range<usize>,
    pub counters: Range<usize>,
    /// Its per-event metrics (`Metric` numbers) in `Buffers::event_metrics`.
    pub event_metrics: Range<usize>,
    /// Its step marks in `Buffers::marks`, and how many its rank could not record.
    pub marks: Range<usize>,
    pub marks_lost: u64,
}

impl ProfileView<'_> {
    pub fn rank_ref(&self) -> RankRef {
        RankRef {
            app: self.app.to_string(),
            rank: self.rank,
        }
    }
}

/// The buffers of a round's events and counters, kept by a filter between calls.
#[derive(Debug, Default)]
pub struct Buffers {
    pub events: Vec<EventView>,
    pub counters: Vec<CounterView>,
    /// The profiles' per-event metrics, as `RankProfile.event_metrics` lists them.
    pub event_metrics: Vec<u32>,
    /// The events' per-event metric values.
    pub values: Vec<f64>,
    /// The profiles' step marks.
    pub marks: Vec<MarkView>,
    /// An event's totals while its fields are read.
    scratch: Vec<f64>,
}

impl Buffers {
    pub fn clear(&mut self) {
        self.events.clear();
        self.counters.clear();
        self.event_metrics.clear();
        self.values.clear();
        self.marks.clear();
    }

    fn lengths(&self) -> [usize; 5] {
        [
            self.events.len(),
            self.counters.len(),
            self.event_metrics.len(),
            self.values.len(),
            self.marks.len(),
        ]
    }

    fn truncate(&mut self, to: [usize; 5]) {
        self.events.truncate(to[0]);
        self.counters.truncate(to[1]);
        self.event_metrics.truncate(to[2]);
        self.values.truncate(to[3]);
        self.marks.truncate(to[4]);
    }
}

/// Appends a repeated double field's values (packed, or one unpacked value) to `into`; gives (start, count).
fn take_doubles(buf: &mut &[u8], wt: WireType, into: &mut Vec<f64>) -> Result<(), String> {
    if wt == WireType::SixtyFourBit {
        into.push(take_double(buf, wt)?);
        return Ok(());
    }
    let mut packed = take_len(buf, wt)?;
    if packed.len() % 8 != 0 {
        return Err("invalid packed length".into());
    }
    while !packed.is_empty() {
        into.push(packed.get_f64_le());
    }
    Ok(())
}

/// Appends a repeated uint32 field's values (packed, or one unpacked value) to `into`.
fn take_u32s(buf: &mut &[u8], wt: WireType, into: &mut Vec<u32>) -> Result<(), String> {
    if wt == WireType::Varint {
        into.push(take_varint(buf, wt)? as u32);
        return Ok(());
    }
    let mut packed = take_len(buf, wt)?;
    while !packed.is_empty() {
        into.push(decode_varint(&mut packed).map_err(err)? as u32);
    }
    Ok(())
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A length-delimited field's bytes.
fn take_len<'a>(buf: &mut &'a [u8], wt: WireType) -> Result<&'a [u8], String> {
    check_wire_type(WireType::LengthDelimited, wt).map_err(err)?;
    let len = decode_varint(buf).map_err(err)?;
    if len > buf.len() as u64 {
        return Err("buffer underflow".into());
    }
    let (field, rest) = buf.split_at(len as usize);
    *buf = rest;
    Ok(field)
}

fn take_varint(buf: &mut &[u8], wt: WireType) -> Result<u64, String> {
    check_wire_type(WireType::Varint, wt).map_err(err)?;
    decode_varint(buf).map_err(err)
}

fn take_fixed64(buf: &mut &[u8], wt: WireType) -> Result<u64, String> {
    check_wire_type(WireType::SixtyFourBit, wt).map_err(err)?;
    if buf.len() < 8 {
        return Err("buffer underflow".into());
    }
    Ok(buf.get_u64_le())
}

fn take_double(buf: &mut &[u8], wt: WireType) -> Result<f64, String> {
    take_fixed64(buf, wt).map(f64::from_bits)
}

fn skip(buf: &mut &[u8], wt: WireType, tag: u32) -> Result<(), String> {
    skip_field(wt, tag, buf, DecodeContext::default()).map_err(err)
}

/// A fixed64 field with one-byte key `key` at `buf[*at]`, read and passed; `None` (nothing read) if what is
/// there is anything else. The position is a local index, not the slice itself, so the reader keeps it in a
/// register.
#[inline(always)]
fn fixed_at(buf: &[u8], at: &mut usize, key: u8) -> Option<u64> {
    let i = *at;
    if i + 9 <= buf.len() && buf[i] == key {
        let v = u64::from_le_bytes(buf[i + 1..i + 9].try_into().expect("8 bytes"));
        *at = i + 9;
        Some(v)
    } else {
        None
    }
}

/// A varint field with one-byte key `key` at `buf[*at]`, read and passed (values of one or two bytes without a
/// call); `Ok(None)` (nothing read) if what is there is anything else, or the key with nothing after it (the
/// general loop then reports the truncated field).
#[inline(always)]
fn varint_at(buf: &[u8], at: &mut usize, key: u8) -> Result<Option<u64>, String> {
    let i = *at;
    if i + 2 > buf.len() || buf[i] != key {
        return Ok(None);
    }
    let b0 = buf[i + 1];
    if b0 < 0x80 {
        *at = i + 2;
        return Ok(Some(u64::from(b0)));
    }
    if i + 3 <= buf.len() && buf[i + 2] < 0x80 {
        *at = i + 3;
        return Ok(Some(u64::from(b0 & 0x7f) | (u64::from(buf[i + 2]) << 7)));
    }
    let mut rest = &buf[i + 1..];
    let v = decode_varint(&mut rest).map_err(err)?;
    *at = buf.len() - rest.len();
    Ok(Some(v))
}

/// Reads one `EventSample` and appends it to `into`'s events. It is filled where it lies in the vector: a view
/// built on the stack and returned would be copied in, and reading back the fields just written cost more than
/// the reading of the event.
#[inline]
fn read_event(buf: &[u8], into: &mut Buffers) -> Result<(), String> {
    into.events.push(EventView::default());
    let e = into.events.last_mut().expect("just pushed");
    read_event_into(buf, e, &mut into.values, &mut into.scratch)
}

#[inline(always)]
fn read_event_into(
    mut buf: &[u8],
    e: &mut EventView,
    values: &mut Vec<f64>,
    total: &mut Vec<f64>,
) -> Result<(), String> {
    // The per-event metrics of this event: this round's values, then the totals, each a run in `values` (the
    // totals wait in `total` until the event is read).
    let at = values.len();
    total.clear();
    // Writers put the fields in tag order with one-byte keys, leaving out the zeros: read them in that order,
    // each behind a test that predicts well, and leave whatever follows (another order, other fields or wire
    // types, longer keys) to the general loop, where a field seen again overrides, as protobuf says.
    let mut pos = 0;
    if let Some(v) = fixed_at(buf, &mut pos, 0x09) {
        e.id = v;
    }
    if let Some(v) = varint_at(buf, &mut pos, 0x10)? {
        e.calls = v;
    }
    if let Some(v) = varint_at(buf, &mut pos, 0x18)? {
        e.subrs = v;
    }
    if let Some(v) = fixed_at(buf, &mut pos, 0x21) {
        e.incl_us = f64::from_bits(v);
    }
    if let Some(v) = fixed_at(buf, &mut pos, 0x29) {
        e.excl_us = f64::from_bits(v);
    }
    if let Some(v) = varint_at(buf, &mut pos, 0x30)? {
        e.calls_total = v;
    }
    if let Some(v) = varint_at(buf, &mut pos, 0x38)? {
        e.subrs_total = v;
    }
    if let Some(v) = fixed_at(buf, &mut pos, 0x41) {
        e.incl_total_us = f64::from_bits(v);
    }
    if let Some(v) = fixed_at(buf, &mut pos, 0x49) {
        e.excl_total_us = f64::from_bits(v);
    }
    buf = &buf[pos..];
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf).map_err(err)?;
        match tag {
            1 => e.id = take_fixed64(&mut buf, wt)?,
            2 => e.calls = take_varint(&mut buf, wt)?,
            3 => e.subrs = take_varint(&mut buf, wt)?,
            4 => e.incl_us = take_double(&mut buf, wt)?,
            5 => e.excl_us = take_double(&mut buf, wt)?,
            6 => e.calls_total = take_varint(&mut buf, wt)?,
            7 => e.subrs_total = take_varint(&mut buf, wt)?,
            8 => e.incl_total_us = take_double(&mut buf, wt)?,
            9 => e.excl_total_us = take_double(&mut buf, wt)?,
            10 => take_doubles(&mut buf, wt, values)?,
            11 => take_doubles(&mut buf, wt, total)?,
            _ => skip(&mut buf, wt, tag)?,
        }
    }
    let round = values.len() - at;
    e.metrics = (at as u32, round as u32);
    e.metrics_total = ((at + round) as u32, total.len() as u32);
    if !total.is_empty() {
        values.extend_from_slice(total);
    }
    Ok(())
}

fn read_counter(mut buf: &[u8]) -> Result<CounterView, String> {
    let mut c = CounterView::default();
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf).map_err(err)?;
        match tag {
            1 => c.id = take_fixed64(&mut buf, wt)?,
            2 => c.value = take_double(&mut buf, wt)?,
            3 => c.total = take_double(&mut buf, wt)?,
            _ => skip(&mut buf, wt, tag)?,
        }
    }
    Ok(c)
}

fn read_mark(mut buf: &[u8]) -> Result<MarkView, String> {
    let mut m = MarkView::default();
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf).map_err(err)?;
        match tag {
            1 => m.key_id = take_fixed64(&mut buf, wt)?,
            2 => m.step = take_varint(&mut buf, wt)?,
            // As prost reads a bool: any non-zero varint is true.
            3 => m.stop = take_varint(&mut buf, wt)? != 0,
            4 => m.unix_ns = take_varint(&mut buf, wt)?,
            _ => skip(&mut buf, wt, tag)?,
        }
    }
    Ok(m)
}

/// Whether `bytes` decode as an `M`, as prost would decode the field that holds them.
fn check_message<M: prost::Message + Default>(bytes: &[u8]) -> Result<(), String> {
    M::decode(bytes).map(drop).map_err(err)
}

fn read_profile<'a>(mut buf: &'a [u8], into: &mut Buffers) -> Result<ProfileView<'a>, String> {
    let [events, counters, event_metrics, _, marks] = into.lengths();
    let mut p = ProfileView {
        app: "",
        rank: 0,
        metrics: 0,
        events: events..events,
        counters: counters..counters,
        event_metrics: event_metrics..event_metrics,
        marks: marks..marks,
        marks_lost: 0,
    };
    while !buf.is_empty() {
        // Events are most of a profile, each under 128 bytes with the usual fields: their one-byte key and
        // length read without the general path.
        if let [0x2a, len, rest @ ..] = buf
            && *len < 0x80
            && usize::from(*len) <= rest.len()
        {
            let (event, after) = rest.split_at(usize::from(*len));
            read_event(event, into)?;
            buf = after;
            continue;
        }
        let (tag, wt) = decode_key(&mut buf).map_err(err)?;
        match tag {
            1 => {
                let bytes = take_len(&mut buf, wt)?;
                p.app = std::str::from_utf8(bytes)
                    .map_err(|_| "invalid string value: data is not UTF-8 encoded".to_string())?;
            }
            // As prost reads a uint32: the varint's low 32 bits.
            2 => p.rank = take_varint(&mut buf, wt)? as u32,
            3 | 4 => {
                take_varint(&mut buf, wt)?;
            }
            5 => {
                read_event(take_len(&mut buf, wt)?, into)?;
            }
            6 => into.counters.push(read_counter(take_len(&mut buf, wt)?)?),
            7 => p.metrics = take_varint(&mut buf, wt)? as u32,
            // Not read here, but held to prost's rules, so a profile one reader refuses the other does too.
            8 => check_message::<canopy_wire::v1::TraceEvent>(take_len(&mut buf, wt)?)?,
            9 => {
                take_varint(&mut buf, wt)?;
            }
            10 => check_message::<canopy_wire::v1::Utilization>(take_len(&mut buf, wt)?)?,
            11 => take_u32s(&mut buf, wt, &mut into.event_metrics)?,
            12 => into.marks.push(read_mark(take_len(&mut buf, wt)?)?),
            13 => p.marks_lost = take_varint(&mut buf, wt)?,
            _ => skip(&mut buf, wt, tag)?,
        }
    }
    p.events = events..into.events.len();
    p.counters = counters..into.counters.len();
    p.event_metrics = event_metrics..into.event_metrics.len();
    p.marks = marks..into.marks.len();
    Ok(p)
}

/// The application and rank an encoded `ProfileBatch` holding one profile names at its front, where its
/// writers put them (the batch's one field is the profile, whose first fields are its app and its rank; either
/// is left out when it is the default, "" or 0): read from a few bytes, without passing over the rest. A hint
/// to order inputs by, which only [`read_batch`] confirms: a profile may name its app or rank again further
/// on, and the last value is the one that counts. `None` when the batch holds anything else than one
/// profile, or its front is not well formed.
pub fn rank_hint(input: &[u8]) -> Option<(&str, u32)> {
    let mut buf = input;
    let (tag, wt) = decode_key(&mut buf).ok()?;
    if tag != 1 {
        return None;
    }
    let mut profile = take_len(&mut buf, wt).ok()?;
    if !buf.is_empty() {
        return None;
    }
    let (mut app, mut rank) = ("", 0);
    let key = |buf: &mut &[u8]| {
        if buf.is_empty() {
            None
        } else {
            decode_key(buf).ok()
        }
    };
    let mut next = key(&mut profile);
    if let Some((1, wt)) = next {
        app = std::str::from_utf8(take_len(&mut profile, wt).ok()?).ok()?;
        next = key(&mut profile);
    }
    if let Some((2, wt)) = next {
        rank = take_varint(&mut profile, wt).ok()? as u32;
    }
    Some((app, rank))
}

/// Reads one encoded `ProfileBatch` into `into` and returns its profiles; on an error `into` is left as it
/// was and nothing of the input is returned.
pub fn read_batch<'a>(input: &'a [u8], into: &mut Buffers) -> Result<Vec<ProfileView<'a>>, String> {
    let lengths = into.lengths();
    let mut profiles = Vec::new();
    let mut buf = input;
    let read = (|| {
        while !buf.is_empty() {
            let (tag, wt) = decode_key(&mut buf).map_err(err)?;
            if tag == 1 {
                profiles.push(read_profile(take_len(&mut buf, wt)?, into)?);
            } else {
                skip(&mut buf, wt, tag)?;
            }
        }
        Ok::<(), String>(())
    })();
    match read {
        Ok(()) => Ok(profiles),
        Err(e) => {
            into.truncate(lengths);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests;
