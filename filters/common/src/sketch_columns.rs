//! Quantile sketches as columns of `StatsColumns`: per row a zero count and, per store, an offset and a bin
//! count, with every row's bins in one packed array. A packet's bins are checked against the stream's bound
//! before anything is merged, so a hostile peer cannot make a relay allocate more than `max_bins` per store.

use canopy_filter_proto::v1::{Quantile, StatsColumns};

use crate::sketch::{Spec, View};

/// Why a packet's sketch columns are not usable; a relay rejects such an input and merges the others.
#[derive(Debug, Clone, PartialEq)]
pub enum SketchError {
    /// The stream asks for no quantiles, the packet carries sketches.
    Unasked,
    /// The packet's sketches are of another relative accuracy than the stream's.
    Accuracy { got: f64, want: f64 },
    Length {
        column: &'static str,
        got: usize,
        rows: usize,
    },
    /// A store spans more bins than the stream's bound.
    Span { row: usize, bins: u32, max: u32 },
    /// A store's last bin is past the highest index.
    Offset { row: usize, offset: i32, bins: u32 },
    /// The rows' bins do not add up to sketch_counts' length.
    Counts { got: usize, want: u64 },
    /// A row's sketch counts another number of values than its count.
    Total { row: usize, got: Option<u64>, want: u64 },
}

impl std::fmt::Display for SketchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SketchError::Unasked => {
                write!(
                    f,
                    "the packet carries quantile sketches but the stream asks for no quantiles"
                )
            }
            SketchError::Accuracy { got, want } => write!(
                f,
                "sketch relative accuracy {got} differs from the stream's {want}"
            ),
            SketchError::Length { column, got, rows } => {
                write!(f, "column {column} has {got} entries for {rows} rows")
            }
            SketchError::Span { row, bins, max } => write!(
                f,
                "row {row}: a sketch store of {bins} bins exceeds the bound of {max}"
            ),
            SketchError::Offset { row, offset, bins } => write!(
                f,
                "row {row}: a sketch store of {bins} bins from index {offset} passes the highest index"
            ),
            SketchError::Counts { got, want } => write!(
                f,
                "sketch_counts has {got} entries, the rows' stores have {want} bins"
            ),
            SketchError::Total { row, got, want } => match got {
                Some(got) => write!(f, "row {row}: the sketch counts {got} values, the row {want}"),
                None => write!(f, "row {row}: the sketch counts more than 2^64 values"),
            },
        }
    }
}

impl std::error::Error for SketchError {}

/// Whether the packet carries sketches: its accuracy is set or any sketch column has entries.
pub fn present(c: &StatsColumns) -> bool {
    c.sketch_accuracy != 0.0
        || !c.sketch_zero.is_empty()
        || !c.sketch_pos_offset.is_empty()
        || !c.sketch_pos_bins.is_empty()
        || !c.sketch_neg_offset.is_empty()
        || !c.sketch_neg_bins.is_empty()
        || !c.sketch_counts.is_empty()
}

/// Checks a packet that passed [`crate::columns::check`] against the stream's sketch spec (`None`: the
/// stream asks for no quantiles). A packet with no rows may carry no sketches.
pub fn check(c: &StatsColumns, spec: Option<&Spec>) -> Result<(), SketchError> {
    let Some(spec) = spec else {
        return if present(c) {
            Err(SketchError::Unasked)
        } else {
            Ok(())
        };
    };
    let rows = c.id.len();
    if rows == 0 && !present(c) {
        return Ok(());
    }
    if c.sketch_accuracy != spec.accuracy() {
        return Err(SketchError::Accuracy {
            got: c.sketch_accuracy,
            want: spec.accuracy(),
        });
    }
    let lengths = [
        ("sketch_zero", c.sketch_zero.len()),
        ("sketch_pos_offset", c.sketch_pos_offset.len()),
        ("sketch_pos_bins", c.sketch_pos_bins.len()),
        ("sketch_neg_offset", c.sketch_neg_offset.len()),
        ("sketch_neg_bins", c.sketch_neg_bins.len()),
    ];
    for (column, got) in lengths {
        if got != rows {
            return Err(SketchError::Length { column, got, rows });
        }
    }
    let mut total = 0u64;
    for row in 0..rows {
        for (offset, bins) in [
            (c.sketch_pos_offset[row], c.sketch_pos_bins[row]),
            (c.sketch_neg_offset[row], c.sketch_neg_bins[row]),
        ] {
            if bins > spec.max_bins() {
                return Err(SketchError::Span {
                    row,
                    bins,
                    max: spec.max_bins(),
                });
            }
            if bins > 0 && i64::from(offset) + i64::from(bins) - 1 > i64::from(i32::MAX) {
                return Err(SketchError::Offset { row, offset, bins });
            }
            total += u64::from(bins);
        }
    }
    if total != c.sketch_counts.len() as u64 {
        return Err(SketchError::Counts {
            got: c.sketch_counts.len(),
            want: total,
        });
    }
    let mut at = 0;
    for row in 0..rows {
        let got = view(c, row, &mut at).count();
        if got != Some(c.count[row]) {
            return Err(SketchError::Total {
                row,
                got,
                want: c.count[row],
            });
        }
    }
    Ok(())
}

/// Row `row`'s sketch of a checked packet, its bins from `*at` in sketch_counts; moves `*at` past them.
/// Rows are read in order, each once.
pub fn view<'a>(c: &'a StatsColumns, row: usize, at: &mut usize) -> View<'a> {
    let pos = c.sketch_pos_bins[row] as usize;
    let neg = c.sketch_neg_bins[row] as usize;
    let start = *at;
    *at += pos + neg;
    View {
        zero: c.sketch_zero[row],
        pos_offset: c.sketch_pos_offset[row],
        pos: &c.sketch_counts[start..start + pos],
        neg_offset: c.sketch_neg_offset[row],
        neg: &c.sketch_counts[start + pos..start + pos + neg],
    }
}

/// Appends a row's sketch to `out`.
pub fn push(out: &mut StatsColumns, v: &View<'_>) {
    out.sketch_zero.push(v.zero);
    out.sketch_pos_offset.push(v.pos_offset);
    out.sketch_pos_bins.push(v.pos.len() as u32);
    out.sketch_neg_offset.push(v.neg_offset);
    out.sketch_neg_bins.push(v.neg.len() as u32);
    out.sketch_counts.extend_from_slice(v.pos);
    out.sketch_counts.extend_from_slice(v.neg);
}

/// Appends the merge of `views` (one row's sketches from several packets) to `out`, in one pass over their
/// bins, bounded by the spec's `max_bins` whatever the views hold.
pub fn push_merged(out: &mut StatsColumns, views: &[View<'_>], spec: &Spec) {
    let zero = views.iter().fold(0u64, |z, v| z.saturating_add(v.zero));
    let (pos_offset, pos_bins) = crate::sketch::merge_stores(
        views.iter().map(|v| (v.pos_offset, v.pos)),
        spec.max_bins(),
        &mut out.sketch_counts,
    );
    let (neg_offset, neg_bins) = crate::sketch::merge_stores(
        views.iter().map(|v| (v.neg_offset, v.neg)),
        spec.max_bins(),
        &mut out.sketch_counts,
    );
    out.sketch_zero.push(zero);
    out.sketch_pos_offset.push(pos_offset);
    out.sketch_pos_bins.push(pos_bins);
    out.sketch_neg_offset.push(neg_offset);
    out.sketch_neg_bins.push(neg_bins);
}

/// The quantiles `qs` of every row of a packet checked against `spec`, in row order (none when it carries no
/// sketches). Each is held within the row's exact min and max: the exact quantile lies there, so this never
/// moves a value away from it, and a p99 never reads above the max.
pub fn quantiles(c: &StatsColumns, spec: &Spec, qs: &[f64]) -> Vec<Vec<Quantile>> {
    if !present(c) {
        return vec![Vec::new(); c.id.len()];
    }
    let mut at = 0;
    (0..c.id.len())
        .map(|row| {
            let v = view(c, row, &mut at);
            qs.iter()
                .filter_map(|&q| {
                    let value = v.quantile(spec, q)?;
                    Some(Quantile {
                        q,
                        value: value.max(c.min[row]).min(c.max[row]),
                    })
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sketch::Sketch;

    fn packet(values: &[&[f64]], spec: &Spec) -> StatsColumns {
        let mut c = StatsColumns {
            sketch_accuracy: spec.accuracy(),
            ..Default::default()
        };
        for (row, vs) in values.iter().enumerate() {
            let mut k = Sketch::default();
            for &v in *vs {
                k.add(spec, v);
            }
            c.id.push(row as u64);
            c.count.push(vs.len() as u64);
            push(&mut c, &k.view());
        }
        c
    }

    #[test]
    fn hostile_packets_are_refused_by_name() {
        let spec = Spec::new(0.01, 16).unwrap();
        let good = packet(&[&[1.0, 2.0], &[-3.0, 0.0, 5.0]], &spec);
        check(&good, Some(&spec)).unwrap();
        assert_eq!(check(&good, None).unwrap_err(), SketchError::Unasked);
        check(&StatsColumns::default(), Some(&spec)).unwrap();

        let mut wide = good.clone();
        wide.sketch_pos_bins[0] = 1 << 30;
        assert_eq!(
            check(&wide, Some(&spec)).unwrap_err().to_string(),
            "row 0: a sketch store of 1073741824 bins exceeds the bound of 16"
        );
        let mut high = good.clone();
        high.sketch_pos_offset[0] = i32::MAX;
        assert_eq!(
            check(&high, Some(&spec)).unwrap_err().to_string(),
            format!(
                "row 0: a sketch store of {} bins from index 2147483647 passes the highest index",
                high.sketch_pos_bins[0]
            )
        );
        let mut short = good.clone();
        short.sketch_counts.pop();
        assert!(
            check(&short, Some(&spec))
                .unwrap_err()
                .to_string()
                .starts_with("sketch_counts has ")
        );
        let mut other = good.clone();
        other.sketch_accuracy = 0.02;
        assert_eq!(
            check(&other, Some(&spec)).unwrap_err().to_string(),
            "sketch relative accuracy 0.02 differs from the stream's 0.01"
        );
        let mut missing = good.clone();
        missing.sketch_zero.pop();
        assert_eq!(
            check(&missing, Some(&spec)).unwrap_err().to_string(),
            "column sketch_zero has 1 entries for 2 rows"
        );
        let mut miscounted = good.clone();
        miscounted.count[1] = 4;
        assert_eq!(
            check(&miscounted, Some(&spec)).unwrap_err().to_string(),
            "row 1: the sketch counts 3 values, the row 4"
        );
        let mut overflow = good;
        overflow.sketch_zero[1] = u64::MAX;
        assert_eq!(
            check(&overflow, Some(&spec)).unwrap_err().to_string(),
            "row 1: the sketch counts more than 2^64 values"
        );
    }

    #[test]
    fn merged_rows_stay_within_the_bound() {
        let spec = Spec::new(0.01, 16).unwrap();
        let a = packet(&[&[1e-6, 1e6]], &spec);
        let b = packet(&[&[1e-300, 1e300]], &spec);
        let mut out = StatsColumns::default();
        let (mut i, mut j) = (0, 0);
        push_merged(&mut out, &[view(&a, 0, &mut i), view(&b, 0, &mut j)], &spec);
        assert_eq!(out.sketch_pos_bins, vec![16]);
        assert_eq!(out.sketch_counts.len(), 16);
        assert_eq!(out.sketch_counts.iter().sum::<u64>(), 4);
    }
}
