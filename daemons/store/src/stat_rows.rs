//! The rows of a `StatsResult`, read in place from its bytes.
//!
//! Decoding the message builds an `EventStats`, a `Summary`, two `RankRef`s and up to three strings per row.
//! Each row is written to the `stats` table and then dropped. The front-end stores every round of every stats
//! stream, so [`read`] borrows the numbers and names straight from the payload instead.
//!
//! It takes the form prost writes: fields in tag order, each at most once, defaults left out, no quantiles.
//! Any other form (fields in another order or repeated, unknown fields, quantiles, damaged bytes) is decoded
//! by prost, which gives the same rows or the error. So what is accepted, and the rows it gives, are always
//! prost's.

use canopy_proto::filters::v1::{EventStats, StatsResult, Summary};
use prost::Message;
use prost::encoding::decode_varint;

/// One `stats` row: an `EventStats` with its summary and the ranks holding its extremes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct StatRow<'a> {
    pub id: u64,
    pub metric: i32,
    pub count: u64,
    pub mean: f64,
    pub std: f64,
    pub min: f64,
    pub max: f64,
    pub min_app: &'a str,
    pub min_rank: u32,
    pub max_app: &'a str,
    pub max_rank: u32,
    /// The application the row stands for; "" for every application.
    pub app: &'a str,
}

impl<'a> From<&'a EventStats> for StatRow<'a> {
    fn from(s: &'a EventStats) -> Self {
        static NONE: Summary = Summary {
            count: 0,
            mean: 0.0,
            m2: 0.0,
            std: 0.0,
            min: 0.0,
            max: 0.0,
            min_rank: None,
            max_rank: None,
        };
        let sum = s.summary.as_ref().unwrap_or(&NONE);
        let (min_app, min_rank) = sum
            .min_rank
            .as_ref()
            .map_or(("", 0), |r| (r.app.as_str(), r.rank));
        let (max_app, max_rank) = sum
            .max_rank
            .as_ref()
            .map_or(("", 0), |r| (r.app.as_str(), r.rank));
        StatRow {
            id: s.id,
            metric: s.metric,
            count: sum.count,
            mean: sum.mean,
            std: sum.std,
            min: sum.min,
            max: sum.max,
            min_app,
            min_rank,
            max_app,
            max_rank,
            app: &s.app,
        }
    }
}

/// A `StatsResult`'s rows, borrowed from its bytes, or the message prost decoded when they were in another form
/// (which alone can hold quantiles).
pub(crate) enum StatsRows<'a> {
    InPlace { rows: Vec<StatRow<'a>>, raw_bytes: u64 },
    Decoded(Box<StatsResult>),
}

/// Reads `payload` as a `StatsResult`: accepts what prost accepts, and gives its rows.
pub(crate) fn read(payload: &[u8]) -> Result<StatsRows<'_>, prost::DecodeError> {
    match in_place(payload) {
        Some((rows, raw_bytes)) => Ok(StatsRows::InPlace { rows, raw_bytes }),
        None => StatsResult::decode(payload).map(|r| StatsRows::Decoded(Box::new(r))),
    }
}

/// The rows of a payload in prost's own form; `None` for any other form, which prost then reads.
fn in_place(payload: &[u8]) -> Option<(Vec<StatRow<'_>>, u64)> {
    let mut buf = payload;
    let mut rows = Vec::with_capacity(payload.len() / 80);
    while let Some(entry) = field_bytes(&mut buf, 0x0a) {
        rows.push(event_stats(entry)?);
    }
    let raw_bytes = varint_field(&mut buf, 0x10)?.unwrap_or(0);
    buf.is_empty().then_some((rows, raw_bytes))
}

/// EventStats: id = 1 (fixed64), metric = 2, summary = 3, quantiles = 4 (not read here), app = 5.
fn event_stats(mut b: &[u8]) -> Option<StatRow<'_>> {
    let mut row = StatRow {
        id: fixed_field(&mut b, 0x09).unwrap_or(0),
        // As prost reads an enum: the varint's low 32 bits.
        metric: varint_field(&mut b, 0x10)?.unwrap_or(0) as i32,
        ..StatRow::default()
    };
    if let Some(summary) = field_bytes(&mut b, 0x1a) {
        summary_into(summary, &mut row)?;
    }
    row.app = string_field(&mut b, 0x2a)?;
    b.is_empty().then_some(row)
}

/// Summary: count = 1, mean = 2, m2 = 3 (not stored), std = 4, min = 5, max = 6, min_rank = 7, max_rank = 8.
fn summary_into<'a>(mut b: &'a [u8], row: &mut StatRow<'a>) -> Option<()> {
    row.count = varint_field(&mut b, 0x08)?.unwrap_or(0);
    let mut double = |key| fixed_field(&mut b, key).map_or(0.0, f64::from_bits);
    row.mean = double(0x11);
    double(0x19);
    row.std = double(0x21);
    row.min = double(0x29);
    row.max = double(0x31);
    if let Some(r) = field_bytes(&mut b, 0x3a) {
        (row.min_app, row.min_rank) = rank_ref(r)?;
    }
    if let Some(r) = field_bytes(&mut b, 0x42) {
        (row.max_app, row.max_rank) = rank_ref(r)?;
    }
    b.is_empty().then_some(())
}

/// RankRef: app = 1, rank = 2 (a uint32: the varint's low 32 bits, as prost reads it).
fn rank_ref(mut b: &[u8]) -> Option<(&str, u32)> {
    let app = string_field(&mut b, 0x0a)?;
    let rank = varint_field(&mut b, 0x10)?.unwrap_or(0) as u32;
    b.is_empty().then_some((app, rank))
}

/// A fixed64 field with one-byte key `key` at the front of `b`, read and passed; `None` (nothing read) if the
/// front is anything else.
fn fixed_field(b: &mut &[u8], key: u8) -> Option<u64> {
    match *b {
        [k, rest @ ..] if *k == key && rest.len() >= 8 => {
            let (v, rest) = rest.split_at(8);
            *b = rest;
            Some(u64::from_le_bytes(v.try_into().expect("8 bytes")))
        }
        _ => None,
    }
}

/// A varint field with key `key` at the front of `b`: `Some(Some(v))` read and passed, `Some(None)` if the
/// front is another field, `None` if the varint is damaged.
fn varint_field(b: &mut &[u8], key: u8) -> Option<Option<u64>> {
    match *b {
        [k, ..] if *k == key => {
            let mut rest = &b[1..];
            let v = decode_varint(&mut rest).ok()?;
            *b = rest;
            Some(Some(v))
        }
        _ => Some(None),
    }
}

/// The bytes of a length-delimited field with key `key` at the front of `b`, passed; `None` (nothing read) if
/// the front is anything else or its length runs past the end.
fn field_bytes<'a>(b: &mut &'a [u8], key: u8) -> Option<&'a [u8]> {
    let [k, rest @ ..] = *b else { return None };
    if *k != key {
        return None;
    }
    let mut rest = rest;
    let len = usize::try_from(decode_varint(&mut rest).ok()?).ok()?;
    let field = rest.get(..len)?;
    *b = &rest[len..];
    Some(field)
}

/// A string field with key `key` at the front of `b`: "" when absent; `None` if it is not UTF-8 or its length
/// runs past the end (prost then decides).
fn string_field<'a>(b: &mut &'a [u8], key: u8) -> Option<&'a str> {
    match b.first() {
        Some(k) if *k == key => std::str::from_utf8(field_bytes(b, key)?).ok(),
        _ => Some(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::filters::v1::{Quantile, RankRef};
    use proptest::prelude::*;

    fn double() -> impl Strategy<Value = f64> {
        prop_oneof![Just(0.0), Just(-0.0), Just(f64::NAN), any::<f64>(), -1e3..1e3f64]
    }

    fn rank() -> impl Strategy<Value = Option<RankRef>> {
        prop::option::of(
            (prop_oneof![Just(String::new()), "\\PC{0,4}"], any::<u32>())
                .prop_map(|(app, rank)| RankRef { app, rank }),
        )
    }

    fn event_stats() -> impl Strategy<Value = EventStats> {
        (
            any::<u64>(),
            prop_oneof![0i32..6, any::<i32>()],
            prop::option::of((
                any::<u64>(),
                [double(), double(), double(), double(), double()],
                rank(),
                rank(),
            )),
            prop::collection::vec((double(), double()), 0..2),
            prop_oneof![Just(String::new()), "\\PC{0,150}"],
        )
            .prop_map(|(id, metric, summary, quantiles, app)| EventStats {
                id,
                metric,
                summary: summary.map(|(count, [mean, m2, std, min, max], min_rank, max_rank)| Summary {
                    count,
                    mean,
                    m2,
                    std,
                    min,
                    max,
                    min_rank,
                    max_rank,
                }),
                quantiles: quantiles
                    .into_iter()
                    .map(|(q, value)| Quantile { q, value })
                    .collect(),
                app,
            })
    }

    /// The rows prost's message gives, as the store read them before.
    fn prost_rows(payload: &[u8]) -> Result<(Vec<String>, u64), String> {
        let r = StatsResult::decode(payload).map_err(|e| e.to_string())?;
        Ok((
            r.stats
                .iter()
                .map(|s| format!("{:?}", StatRow::from(s)))
                .collect(),
            r.raw_bytes,
        ))
    }

    fn our_rows(payload: &[u8]) -> Result<(Vec<String>, u64), String> {
        let (rows, raw_bytes): (Vec<StatRow<'_>>, u64) = match read(payload).map_err(|e| e.to_string())? {
            StatsRows::InPlace { rows, raw_bytes } => (rows, raw_bytes),
            StatsRows::Decoded(r) => {
                return Ok((
                    r.stats
                        .iter()
                        .map(|s| format!("{:?}", StatRow::from(s)))
                        .collect(),
                    r.raw_bytes,
                ));
            }
        };
        Ok((rows.iter().map(|r| format!("{r:?}")).collect(), raw_bytes))
    }

    proptest! {
        /// Whatever prost wrote, the rows are prost's, read in place unless a row has quantiles.
        #[test]
        fn reads_the_rows_prost_reads(
            stats in prop::collection::vec(event_stats(), 0..6),
            raw_bytes in prop_oneof![Just(0u64), any::<u64>()],
        ) {
            let payload = StatsResult { stats: stats.clone(), raw_bytes }.encode_to_vec();
            prop_assert_eq!(our_rows(&payload), prost_rows(&payload));
            let in_place = matches!(read(&payload), Ok(StatsRows::InPlace { .. }));
            prop_assert_eq!(in_place, stats.iter().all(|s| s.quantiles.is_empty()));
        }

        /// Damaged, cut, reordered or foreign bytes: the same verdict as prost and, when accepted, the same rows.
        #[test]
        fn other_bytes_read_as_prost_reads_them(
            stats in prop::collection::vec(event_stats(), 1..4),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
            cut in any::<prop::sample::Index>(),
            tail in prop::collection::vec(any::<u8>(), 0..12),
        ) {
            let mut payload = StatsResult { stats, raw_bytes: 7 }.encode_to_vec();
            for (at, byte) in flips {
                let i = at.index(payload.len());
                payload[i] ^= byte;
            }
            payload.truncate(cut.index(payload.len() + 1));
            payload.extend(tail);
            prop_assert_eq!(our_rows(&payload), prost_rows(&payload));
        }
    }

    #[test]
    fn a_field_seen_twice_or_out_of_order_goes_to_prost() {
        let one = EventStats {
            id: 5,
            metric: 2,
            ..Default::default()
        };
        let mut entry = one.encode_to_vec();
        // The id again: prost keeps the last.
        entry.push(0x09);
        entry.extend_from_slice(&9u64.to_le_bytes());
        let mut payload = Vec::new();
        prost::encoding::bytes::encode(1, &entry, &mut payload);
        let StatsRows::Decoded(r) = read(&payload).unwrap() else {
            panic!("read in place")
        };
        assert_eq!(r.stats[0].id, 9);
    }
}
