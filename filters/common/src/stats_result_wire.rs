//! The root's `StatsResult`, written straight from its merged columns.
//!
//! [`encode`] writes the bytes prost writes for `StatsResult { stats: columns::to_stats(c), raw_bytes }`, with
//! each row's quantiles when asked. It builds no `EventStats`, `Summary` or `RankRef`, and copies no
//! application name. The front-end finalizes every round of every stats stream. Building the messages cost an
//! allocation per extreme (its application's name) and three per row, then an encoding pass over them, and
//! that was most of the root's own work.
//!
//! Proto3 as prost writes it: fields in tag order; a scalar equal to its default (0, 0.0 and -0.0, "") left
//! out; a message field that is set written even when empty; an enum written as a sign-extended varint.

use canopy_filter_proto::v1::{Quantile, StatsColumns};
use prost::encoding::{encode_varint, encoded_len_varint};

/// Appends to `out` the encoding of the `StatsResult` of checked columns `c` (see [`crate::columns::check`]):
/// one `EventStats` per row, in row order, its `std` filled, and `quantiles[row]` if `quantiles` is not empty
/// (it then has one entry per row).
pub fn encode(c: &StatsColumns, quantiles: &[Vec<Quantile>], out: &mut Vec<u8>) {
    let rows = c.id.len();
    debug_assert!(quantiles.is_empty() || quantiles.len() == rows);
    out.reserve(rows * 96 + 12);
    let name = |app: u32| c.apps.get(app as usize).map_or("", String::as_str);
    for row in 0..rows {
        let min_at = (name(c.min_app[row]), c.min_rank[row]);
        let max_at = (name(c.max_app[row]), c.max_rank[row]);
        let std = std_of(c.count[row], c.m2[row]);
        let summary_len = varint_field_len(c.count[row])
            + double_len(c.mean[row])
            + double_len(c.m2[row])
            + double_len(std)
            + double_len(c.min[row])
            + double_len(c.max[row])
            + message_field_len(rank_ref_len(min_at))
            + message_field_len(rank_ref_len(max_at));
        let row_quantiles = quantiles.get(row).map_or(&[][..], Vec::as_slice);
        let app = crate::columns::app_of(c, row);
        let metric = c.metric[row] as i64 as u64;
        let len = if c.id[row] != 0 { 9 } else { 0 }
            + varint_field_len(metric)
            + message_field_len(summary_len)
            + row_quantiles
                .iter()
                .map(|q| message_field_len(double_len(q.q) + double_len(q.value)))
                .sum::<usize>()
            + string_field_len(app);
        // StatsResult.stats = 1.
        out.push(0x0a);
        encode_varint(len as u64, out);
        // EventStats: id = 1 (fixed64), metric = 2, summary = 3, quantiles = 4, app = 5.
        if c.id[row] != 0 {
            out.push(0x09);
            out.extend_from_slice(&c.id[row].to_le_bytes());
        }
        put_varint_field(0x10, metric, out);
        out.push(0x1a);
        encode_varint(summary_len as u64, out);
        // Summary: count = 1, mean = 2, m2 = 3, std = 4, min = 5, max = 6, min_rank = 7, max_rank = 8.
        put_varint_field(0x08, c.count[row], out);
        put_double(0x11, c.mean[row], out);
        put_double(0x19, c.m2[row], out);
        put_double(0x21, std, out);
        put_double(0x29, c.min[row], out);
        put_double(0x31, c.max[row], out);
        put_rank_ref(0x3a, min_at, out);
        put_rank_ref(0x42, max_at, out);
        for q in row_quantiles {
            out.push(0x22);
            encode_varint((double_len(q.q) + double_len(q.value)) as u64, out);
            put_double(0x09, q.q, out);
            put_double(0x11, q.value, out);
        }
        put_string(0x2a, app, out);
    }
    // StatsResult.raw_bytes = 2.
    put_varint_field(0x10, c.raw_bytes, out);
}

/// [`crate::summary::finish`]'s population standard deviation.
fn std_of(count: u64, m2: f64) -> f64 {
    if count == 0 {
        0.0
    } else {
        (m2.max(0.0) / count as f64).sqrt()
    }
}

fn double_len(v: f64) -> usize {
    if v != 0.0 { 9 } else { 0 }
}

fn varint_field_len(v: u64) -> usize {
    if v != 0 { 1 + encoded_len_varint(v) } else { 0 }
}

fn string_field_len(s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        1 + encoded_len_varint(s.len() as u64) + s.len()
    }
}

/// A set message field of `len` bytes: its key, its length, its bytes.
fn message_field_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// RankRef: app = 1, rank = 2.
fn rank_ref_len((app, rank): (&str, u32)) -> usize {
    string_field_len(app) + varint_field_len(u64::from(rank))
}

fn put_double(key: u8, v: f64, out: &mut Vec<u8>) {
    if v != 0.0 {
        out.push(key);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn put_varint_field(key: u8, v: u64, out: &mut Vec<u8>) {
    if v != 0 {
        out.push(key);
        encode_varint(v, out);
    }
}

fn put_string(key: u8, s: &str, out: &mut Vec<u8>) {
    if !s.is_empty() {
        out.push(key);
        encode_varint(s.len() as u64, out);
        out.extend_from_slice(s.as_bytes());
    }
}

fn put_rank_ref(key: u8, at: (&str, u32), out: &mut Vec<u8>) {
    out.push(key);
    encode_varint(rank_ref_len(at) as u64, out);
    put_string(0x0a, at.0, out);
    put_varint_field(0x10, u64::from(at.1), out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns;
    use canopy_filter_proto::v1::StatsResult;
    use proptest::prelude::*;
    use prost::Message;

    /// What the root wrote before: the messages, then prost.
    fn by_prost(c: &StatsColumns, quantiles: &[Vec<Quantile>]) -> Vec<u8> {
        let mut stats = columns::to_stats(c);
        for (s, q) in stats.iter_mut().zip(quantiles) {
            s.quantiles = q.clone();
        }
        StatsResult {
            stats,
            raw_bytes: c.raw_bytes,
        }
        .encode_to_vec()
    }

    /// Values that prost leaves out or writes in full: zeros of both signs, NaN, infinities, extremes.
    fn double() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(0.0),
            Just(-0.0),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::MIN_POSITIVE),
            any::<f64>(),
            -1e6..1e6f64,
        ]
    }

    /// id, metric, count, (mean, m2, min, max), (min app, min rank, max app, max rank), quantiles.
    type Row = (u64, i32, u64, [f64; 4], (u32, u32, u32, u32), Vec<(f64, f64)>);

    fn row() -> impl Strategy<Value = Row> {
        (
            prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()],
            prop_oneof![Just(0i32), 1i32..8, Just(-1i32), Just(i32::MIN), any::<i32>()],
            prop_oneof![Just(0u64), 1u64..200, any::<u64>()],
            [double(), double(), double(), double()],
            (
                0u32..4,
                prop_oneof![Just(0u32), any::<u32>()],
                0u32..4,
                any::<u32>(),
            ),
            prop::collection::vec((double(), double()), 0..4),
        )
    }

    proptest! {
        /// The bytes are prost's for the same result, whatever the values, names and quantiles.
        #[test]
        fn writes_what_prost_writes(
            rows in prop::collection::vec(row(), 0..20),
            apps in prop::collection::vec(prop_oneof![Just(String::new()), "[a-z]{1,3}", "\\PC{0,140}"], 1..4),
            by_app in any::<bool>(),
            with_quantiles in any::<bool>(),
            raw_bytes in prop_oneof![Just(0u64), any::<u64>()],
        ) {
            let n = apps.len() as u32;
            let mut c = StatsColumns { apps, raw_bytes, ..Default::default() };
            let mut quantiles = Vec::new();
            for (i, (id, metric, count, [mean, m2, min, max], (min_app, min_rank, max_app, max_rank), qs)) in
                rows.into_iter().enumerate()
            {
                c.id.push(id);
                c.metric.push(metric);
                c.count.push(count);
                c.mean.push(mean);
                c.m2.push(m2);
                c.min.push(min);
                c.max.push(max);
                c.min_app.push(min_app % n);
                c.min_rank.push(min_rank);
                c.max_app.push(max_app % n);
                c.max_rank.push(max_rank);
                if by_app {
                    c.app.push(i as u32 % n);
                }
                quantiles.push(qs.into_iter().map(|(q, value)| Quantile { q, value }).collect());
            }
            let quantiles = if with_quantiles { quantiles } else { Vec::new() };
            let mut ours = vec![7u8];
            encode(&c, &quantiles, &mut ours);
            prop_assert_eq!(&ours[..1], &[7u8][..], "appends");
            prop_assert_eq!(&ours[1..], &by_prost(&c, &quantiles)[..]);
        }
    }

    #[test]
    fn an_empty_result_is_empty_bytes() {
        let mut out = Vec::new();
        encode(&StatsColumns::default(), &[], &mut out);
        assert!(out.is_empty());
    }
}
