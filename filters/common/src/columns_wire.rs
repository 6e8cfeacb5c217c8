//! `StatsColumns` to and from bytes, for the relays and the root that decode and encode one per child and round.
//! The message is columns of numbers, so its packed fields are copied as runs of bytes where prost goes value by
//! value: the doubles and fixed64 ids as 8-byte chunks, the varint columns in one tight loop each.
//!
//! The bytes and the messages are exactly prost's: [`encode`] writes what `Message::encode` writes, and
//! [`merge`] accepts what `Message::merge` accepts and builds the same message. Whatever is not a well-formed
//! packed column of the hot fields (an unpacked value, a field this reader does not take apart, anything it
//! would have to refuse) is handed to prost's own field decoder, which then decides.

use canopy_filter_proto::v1::StatsColumns;
use prost::Message;
use prost::encoding::{
    DecodeContext, WireType, decode_key, decode_varint, double, encode_key, encode_varint,
    encoded_len_varint, sint32, string, uint32, uint64,
};

/// Merges the encoded `bytes` into `into`, as `into.merge(bytes)` does.
pub fn merge(into: &mut StatsColumns, bytes: &[u8]) -> Result<(), prost::DecodeError> {
    let mut buf = bytes;
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf)?;
        if wt == WireType::LengthDelimited && packed_column(into, tag, &mut buf) {
            continue;
        }
        into.merge_field(tag, wt, &mut buf, DecodeContext::default())?;
    }
    Ok(())
}

/// Decodes `bytes` into `into`, cleared first and its buffers kept, as `into.clear(); into.merge(bytes)` does.
pub fn decode_into(into: &mut StatsColumns, bytes: &[u8]) -> Result<(), prost::DecodeError> {
    into.clear();
    merge(into, bytes)
}

/// Decodes `bytes` into `into`, cleared first, as `into.clear(); into.merge(bytes)` does, with its
/// `StatsColumns` field numbered `field` (reached through `columns`, which creates it if absent) read by
/// [`merge`]: for the packets that carry summaries beside other fields. A field that is not a well-formed
/// length-delimited `field` is left to prost, which then decides.
pub fn decode_with_columns<M: Message>(
    into: &mut M,
    bytes: &[u8],
    field: u32,
    columns: impl Fn(&mut M) -> &mut StatsColumns,
) -> Result<(), prost::DecodeError> {
    into.clear();
    let mut buf = bytes;
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf)?;
        if tag == field && wt == WireType::LengthDelimited {
            let mut rest = buf;
            if let Ok(len) = decode_varint(&mut rest)
                && let Some(body) = usize::try_from(len).ok().and_then(|len| rest.get(..len))
            {
                merge(columns(into), body)?;
                buf = &rest[body.len()..];
                continue;
            }
        }
        into.merge_field(tag, wt, &mut buf, DecodeContext::default())?;
    }
    Ok(())
}

/// One packed column of field `tag` at the front of `buf` (after its key), appended and passed. `false`, with
/// `buf` and `into` as they were, if the field is not one taken apart here or its bytes are not a well-formed
/// packed column: prost reads it then.
fn packed_column(into: &mut StatsColumns, tag: u32, buf: &mut &[u8]) -> bool {
    let mut rest = *buf;
    let Ok(len) = decode_varint(&mut rest) else {
        return false;
    };
    let Some(body) = usize::try_from(len).ok().and_then(|len| rest.get(..len)) else {
        return false;
    };
    let taken = match tag {
        1 => fixed(body, &mut into.id, u64::from_le_bytes),
        2 => varints(body, &mut into.metric, |v| v as i32),
        3 => varints(body, &mut into.count, |v| v),
        4 => fixed(body, &mut into.mean, f64::from_le_bytes),
        5 => fixed(body, &mut into.m2, f64::from_le_bytes),
        6 => fixed(body, &mut into.min, f64::from_le_bytes),
        7 => fixed(body, &mut into.max, f64::from_le_bytes),
        8 => varints(body, &mut into.min_rank, |v| v as u32),
        9 => varints(body, &mut into.max_rank, |v| v as u32),
        10 => varints(body, &mut into.min_app, |v| v as u32),
        11 => varints(body, &mut into.max_app, |v| v as u32),
        21 => varints(body, &mut into.app, |v| v as u32),
        _ => false,
    };
    if taken {
        *buf = &rest[body.len()..];
    }
    taken
}

/// A packed column of 8-byte values appended to `into`; `false` (nothing appended) unless `body` is whole values.
fn fixed<T: Copy + Default>(body: &[u8], into: &mut Vec<T>, from: impl Fn([u8; 8]) -> T) -> bool {
    let values = body.chunks_exact(8);
    if !values.remainder().is_empty() {
        return false;
    }
    // An iterator of known length: the column grows once and is written once, with no zeros first.
    into.extend(values.map(|b| from(b.try_into().expect("chunks of 8"))));
    true
}

/// A packed column of varints appended to `into`, each made a `T` by `cast` as prost does; `false` (nothing
/// appended) unless `body` is whole varints of at most 10 bytes, the last of which fits 64 bits.
fn varints<T>(body: &[u8], into: &mut Vec<T>, cast: impl Fn(u64) -> T) -> bool {
    // Values under 128 (metrics, applications, and counts and ranks of small trees) are one byte each: a
    // column of them alone is read in one widening pass.
    if body.iter().all(|&b| b < 0x80) {
        into.extend(body.iter().map(|&b| cast(u64::from(b))));
        return true;
    }
    let before = into.len();
    into.reserve(body.len());
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        if b < 0x80 {
            into.push(cast(u64::from(b)));
            i += 1;
            continue;
        }
        // Two bytes (ranks and counts under 16,384): without the general loop.
        if let Some(&c) = body.get(i + 1)
            && c < 0x80
        {
            into.push(cast(u64::from(b & 0x7f) | u64::from(c) << 7));
            i += 2;
            continue;
        }
        let mut value = u64::from(b & 0x7f);
        let mut shift = 7;
        loop {
            i += 1;
            // Ten bytes at most, the tenth holding bit 63 alone: prost refuses anything longer or wider.
            let Some(&b) = body.get(i).filter(|_| shift < 70) else {
                into.truncate(before);
                return false;
            };
            if shift == 63 && b > 1 {
                into.truncate(before);
                return false;
            }
            value |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b < 0x80 {
                break;
            }
        }
        into.push(cast(value));
        i += 1;
    }
    true
}

/// `c` encoded, appended to `out`: the bytes `c.encode(out)` appends. A buffer kept from round to round has
/// the room already.
pub fn encode(c: &StatsColumns, out: &mut Vec<u8>) {
    packed_fixed(1, &c.id, |v| v.to_le_bytes(), out);
    packed_varints(2, &c.metric, |&v| v as i64 as u64, out);
    packed_varints(3, &c.count, |&v| v, out);
    packed_fixed(4, &c.mean, |v| v.to_le_bytes(), out);
    packed_fixed(5, &c.m2, |v| v.to_le_bytes(), out);
    packed_fixed(6, &c.min, |v| v.to_le_bytes(), out);
    packed_fixed(7, &c.max, |v| v.to_le_bytes(), out);
    packed_varints(8, &c.min_rank, |&v| u64::from(v), out);
    packed_varints(9, &c.max_rank, |&v| u64::from(v), out);
    packed_varints(10, &c.min_app, |&v| u64::from(v), out);
    packed_varints(11, &c.max_app, |&v| u64::from(v), out);
    // Fields 12 to 20 (the table of applications, the raw bytes, the sketches) are short or absent: written
    // by prost's own field encoders, as the derived code writes them.
    string::encode_repeated(12, &c.apps, out);
    if c.raw_bytes != 0 {
        uint64::encode(13, &c.raw_bytes, out);
    }
    if c.sketch_accuracy != 0.0 {
        double::encode(14, &c.sketch_accuracy, out);
    }
    uint64::encode_packed(15, &c.sketch_zero, out);
    sint32::encode_packed(16, &c.sketch_pos_offset, out);
    uint32::encode_packed(17, &c.sketch_pos_bins, out);
    sint32::encode_packed(18, &c.sketch_neg_offset, out);
    uint32::encode_packed(19, &c.sketch_neg_bins, out);
    uint64::encode_packed(20, &c.sketch_counts, out);
    packed_varints(21, &c.app, |&v| u64::from(v), out);
}

/// `c` as the message field `tag` of an enclosing message, appended to `out`: the bytes prost writes for a
/// message field that is set.
pub fn encode_field(tag: u32, c: &StatsColumns, out: &mut Vec<u8>) {
    let mut body = Vec::new();
    encode(c, &mut body);
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(body.len() as u64, out);
    out.extend_from_slice(&body);
}

fn packed_fixed<T: Copy>(tag: u32, values: &[T], bytes: impl Fn(T) -> [u8; 8], out: &mut Vec<u8>) {
    if values.is_empty() {
        return;
    }
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(8 * values.len() as u64, out);
    out.reserve(8 * values.len());
    out.extend(values.iter().flat_map(|&v| bytes(v)));
}

fn packed_varints<T>(tag: u32, values: &[T], wide: impl Fn(&T) -> u64, out: &mut Vec<u8>) {
    if values.is_empty() {
        return;
    }
    encode_key(tag, WireType::LengthDelimited, out);
    // A column of values under 128 is a byte per value.
    if values.iter().all(|v| wide(v) < 0x80) {
        encode_varint(values.len() as u64, out);
        out.extend(values.iter().map(|v| wide(v) as u8));
        return;
    }
    let len: usize = values.iter().map(|v| encoded_len_varint(wide(v))).sum();
    encode_varint(len as u64, out);
    for v in values {
        let mut v = wide(v);
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn columns() -> impl Strategy<Value = StatsColumns> {
        let rows = 0usize..12;
        rows.prop_flat_map(|n| {
            (
                (
                    prop::collection::vec(any::<u64>(), n),
                    prop::collection::vec(prop_oneof![0i32..8, any::<i32>()], n),
                    prop::collection::vec(prop_oneof![0u64..300, any::<u64>()], n),
                    prop::collection::vec(any::<f64>(), n),
                    prop::collection::vec(any::<f64>(), n),
                    prop::collection::vec(any::<f64>(), n),
                    prop::collection::vec(any::<f64>(), n),
                ),
                (
                    prop::collection::vec(prop_oneof![0u32..200, any::<u32>()], n),
                    prop::collection::vec(any::<u32>(), n),
                    prop::collection::vec(0u32..3, n),
                    prop::collection::vec(0u32..3, n),
                    prop::collection::vec("[a-z]{0,6}", 0..3),
                    any::<u64>(),
                    prop_oneof![Just(0.0), any::<f64>()],
                    prop::collection::vec(any::<u64>(), 0..3),
                    prop::collection::vec(any::<i32>(), 0..3),
                    prop::collection::vec(0u32..3, 0..3),
                ),
                (prop::collection::vec(0u32..3, n), any::<bool>()),
            )
        })
        .prop_map(
            |(
                (id, metric, count, mean, m2, min, max),
                (min_rank, max_rank, min_app, max_app, apps, raw_bytes, acc, zero, offsets, bins),
                (app, by_app),
            )| StatsColumns {
                id,
                metric,
                count,
                mean,
                m2,
                min,
                max,
                min_rank,
                max_rank,
                min_app,
                max_app,
                apps,
                raw_bytes,
                sketch_accuracy: acc,
                sketch_zero: zero,
                sketch_pos_offset: offsets.clone(),
                sketch_pos_bins: bins.clone(),
                sketch_neg_offset: offsets,
                sketch_neg_bins: bins,
                sketch_counts: vec![1, 2],
                app: if by_app { app } else { Vec::new() },
            },
        )
    }

    /// Both readers on the same bytes: the same verdict, and on success the same message.
    fn same_as_prost(bytes: &[u8], start: &StatsColumns) {
        let mut theirs = start.clone();
        let theirs_ok = theirs.merge(bytes).is_ok();
        let mut ours = start.clone();
        let ours_ok = merge(&mut ours, bytes).is_ok();
        assert_eq!(ours_ok, theirs_ok, "{bytes:02x?}");
        if theirs_ok {
            // NaN is never equal to itself: compare the messages' bytes.
            assert_eq!(ours.encode_to_vec(), theirs.encode_to_vec(), "{bytes:02x?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn encodes_prosts_bytes_and_reads_them_back(c in columns()) {
            let mut ours = Vec::new();
            encode(&c, &mut ours);
            prop_assert_eq!(&ours, &c.encode_to_vec());
            let mut back = StatsColumns { id: vec![9], ..StatsColumns::default() };
            decode_into(&mut back, &ours).unwrap();
            prop_assert_eq!(back.encode_to_vec(), ours);
        }

        #[test]
        fn reads_damaged_bytes_as_prost_does(
            c in columns(),
            cuts in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            truncate in any::<prop::sample::Index>(),
            whole in any::<bool>(),
        ) {
            let mut bytes = c.encode_to_vec();
            for (at, b) in cuts {
                if !bytes.is_empty() {
                    let i = at.index(bytes.len());
                    bytes[i] = b;
                }
            }
            if !whole && !bytes.is_empty() {
                bytes.truncate(truncate.index(bytes.len()));
            }
            same_as_prost(&bytes, &StatsColumns::default());
            // Merging appends to what is there, as prost's merge does.
            same_as_prost(&bytes, &c);
        }

        #[test]
        fn reads_arbitrary_bytes_as_prost_does(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            same_as_prost(&bytes, &StatsColumns::default());
        }
    }

    /// A histogram packet (summaries as field 5 beside other fields) read with its columns taken apart: the
    /// same verdict as prost, and on success the same message.
    fn packet_same_as_prost(bytes: &[u8]) {
        use canopy_filter_proto::v1::HistogramPacket;
        let theirs = HistogramPacket::decode(bytes);
        let mut ours = HistogramPacket {
            raw_bytes: 7,
            ..HistogramPacket::default()
        };
        let ours_ok =
            decode_with_columns(&mut ours, bytes, 5, |p| p.summaries.get_or_insert_default()).is_ok();
        assert_eq!(ours_ok, theirs.is_ok(), "{bytes:02x?}");
        if let Ok(theirs) = theirs {
            assert_eq!(ours.encode_to_vec(), theirs.encode_to_vec(), "{bytes:02x?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn reads_packets_with_columns_as_prost_does(
            c in columns(),
            twice in any::<bool>(),
            raw_bytes in any::<u64>(),
            cut in prop::option::of((any::<prop::sample::Index>(), any::<u8>())),
        ) {
            use canopy_filter_proto::v1::{HistogramPacket, Range};
            let packet = HistogramPacket {
                summaries: Some(c.clone()),
                ranges: vec![Range { id: 3, metric: 1, lo: 0.5, hi: 2.0, ..Range::default() }],
                raw_bytes,
                ..HistogramPacket::default()
            };
            let mut bytes = packet.encode_to_vec();
            if twice {
                // The field seen twice: prost merges the second into the first.
                bytes.extend(HistogramPacket { summaries: Some(c), ..HistogramPacket::default() }.encode_to_vec());
            }
            if let Some((at, b)) = cut {
                let i = at.index(bytes.len());
                bytes[i] = b;
            }
            packet_same_as_prost(&bytes);
        }

        #[test]
        fn reads_arbitrary_packets_as_prost_does(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            packet_same_as_prost(&bytes);
        }
    }

    #[test]
    fn reads_unpacked_values_and_fields_seen_twice_as_prost_does() {
        let mut bytes = Vec::new();
        // An unpacked id and count, then a packed column of each, then the id column again.
        encode_key(1, WireType::SixtyFourBit, &mut bytes);
        bytes.extend_from_slice(&7u64.to_le_bytes());
        encode_key(3, WireType::Varint, &mut bytes);
        encode_varint(300, &mut bytes);
        StatsColumns {
            id: vec![1, 2],
            count: vec![u64::MAX, 0],
            ..StatsColumns::default()
        }
        .encode_raw(&mut bytes);
        StatsColumns {
            id: vec![3],
            ..StatsColumns::default()
        }
        .encode_raw(&mut bytes);
        let mut ours = StatsColumns::default();
        merge(&mut ours, &bytes).unwrap();
        assert_eq!(ours.id, [7, 1, 2, 3]);
        assert_eq!(ours.count, [300, u64::MAX, 0]);
        same_as_prost(&bytes, &StatsColumns::default());
        // A varint of eleven bytes, or of ten whose last has more than bit 63, is refused by both.
        for bad in [
            [0xff; 11].as_slice(),
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
        ] {
            let mut bytes = Vec::new();
            encode_key(8, WireType::LengthDelimited, &mut bytes);
            encode_varint(bad.len() as u64, &mut bytes);
            bytes.extend_from_slice(bad);
            same_as_prost(&bytes, &StatsColumns::default());
            assert!(merge(&mut StatsColumns::default(), &bytes).is_err());
        }
    }
}
