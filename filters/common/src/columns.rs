//! Summaries as columns (`StatsColumns`): the packet the stats filter sends between levels. A relay merges its
//! children's packets in one pass over their sorted keys into reused buffers, with no message per summary and
//! no string per extreme; the root turns the merged columns into the `StatsResult` it stores.
//!
//! Rows may be broken down by application (the stats filter's `by_app`): then the `app` column names each
//! row's application, an index into the sorted `apps` table, and rows sort by (application name, id, metric).
//! Because each table is sorted, a child's indices map into the merged table monotonically, so the one pass
//! over sorted keys still merges them.
//!
//! The arithmetic is [`crate::summary::merge`]'s ([`crate::summary::merge_moments`]), applied per key in the
//! order the inputs are given (a relay gives them in their canonical order, by their bytes), so a relay's
//! output is bit for bit what merging the same summaries as `Summary` messages in the same order gives.

use canopy_filter_proto::v1::{EventStats, RankRef, StatsColumns, Summary};
use prost::Message;

use crate::metrics::Key;
use crate::sketch::{Spec, View};
use crate::sketch_columns;
use crate::summary::{StatsMap, finish, merge_moments};

/// Why a packet is not usable columns; a relay rejects such an input and merges the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnsError {
    Length {
        column: &'static str,
        got: usize,
        rows: usize,
    },
    Order {
        row: usize,
        /// The row's application index, when the rows are broken down by application.
        app: Option<u32>,
        id: u64,
        metric: i32,
    },
    /// The application table is not sorted with each name once.
    Apps {
        index: usize,
        name: String,
        previous: String,
    },
    /// The rows are (`by_app`) or are not broken down by application, against what the stream asks.
    Breakdown {
        by_app: bool,
    },
    App {
        row: usize,
        index: u32,
        apps: usize,
    },
    Empty {
        row: usize,
    },
}

impl std::fmt::Display for ColumnsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ColumnsError::Length { column, got, rows } => {
                write!(f, "column {column} has {got} entries for {rows} rows")
            }
            ColumnsError::Order {
                row,
                app: None,
                id,
                metric,
            } => write!(
                f,
                "row {row}: key ({id:#x}, {metric}) does not follow the previous row's (rows must be sorted, each \
                 key once)"
            ),
            ColumnsError::Order {
                row,
                app: Some(app),
                id,
                metric,
            } => write!(
                f,
                "row {row}: key (application {app}, {id:#x}, {metric}) does not follow the previous row's (rows \
                 must be sorted by application, id and metric, each key once)"
            ),
            ColumnsError::Apps {
                index,
                name,
                previous,
            } => write!(
                f,
                "apps: entry {index} {name:?} does not follow {previous:?} (the application table must be \
                 sorted, each name once)"
            ),
            ColumnsError::Breakdown { by_app: true } => write!(
                f,
                "the stream breaks rows down by application (by_app), but the packet has rows and no app column"
            ),
            ColumnsError::Breakdown { by_app: false } => write!(
                f,
                "the stream does not break rows down by application (by_app: false), but the packet has an app \
                 column"
            ),
            ColumnsError::App { row, index, apps } => {
                write!(
                    f,
                    "row {row}: application index {index} is outside the table of {apps}"
                )
            }
            ColumnsError::Empty { row } => {
                write!(f, "row {row}: count is 0 (a row stands for at least one value)")
            }
        }
    }
}

impl std::error::Error for ColumnsError {}

/// Checks that a decoded packet is usable: every column as long as the keys (`app`: as long, or empty), keys
/// strictly increasing, every application index inside the table, no empty row; with an `app` column, the
/// table sorted with each name once, so that index order is name order.
pub fn check(c: &StatsColumns) -> Result<(), ColumnsError> {
    let rows = c.id.len();
    if !c.app.is_empty() {
        if c.app.len() != rows {
            return Err(ColumnsError::Length {
                column: "app",
                got: c.app.len(),
                rows,
            });
        }
        if let Some(i) = (1..c.apps.len()).find(|&i| c.apps[i] <= c.apps[i - 1]) {
            return Err(ColumnsError::Apps {
                index: i,
                name: c.apps[i].clone(),
                previous: c.apps[i - 1].clone(),
            });
        }
    }
    let lengths = [
        ("metric", c.metric.len()),
        ("count", c.count.len()),
        ("mean", c.mean.len()),
        ("m2", c.m2.len()),
        ("min", c.min.len()),
        ("max", c.max.len()),
        ("min_rank", c.min_rank.len()),
        ("max_rank", c.max_rank.len()),
        ("min_app", c.min_app.len()),
        ("max_app", c.max_app.len()),
    ];
    for (column, got) in lengths {
        if got != rows {
            return Err(ColumnsError::Length { column, got, rows });
        }
    }
    for row in 0..rows {
        if let Some(&index) = c.app.get(row)
            && index as usize >= c.apps.len()
        {
            return Err(ColumnsError::App {
                row,
                index,
                apps: c.apps.len(),
            });
        }
        if row > 0 && key(c, row) <= key(c, row - 1) {
            return Err(ColumnsError::Order {
                row,
                app: c.app.get(row).copied(),
                id: c.id[row],
                metric: c.metric[row],
            });
        }
        for index in [c.min_app[row], c.max_app[row]] {
            if index as usize >= c.apps.len() {
                return Err(ColumnsError::App {
                    row,
                    index,
                    apps: c.apps.len(),
                });
            }
        }
        if c.count[row] == 0 {
            return Err(ColumnsError::Empty { row });
        }
    }
    Ok(())
}

/// Whether a checked packet's rows are broken down by application as the stream asks (`by_app`). A packet
/// without rows is either.
pub fn check_breakdown(c: &StatsColumns, by_app: bool) -> Result<(), ColumnsError> {
    match (by_app, c.app.is_empty()) {
        (true, true) if !c.id.is_empty() => Err(ColumnsError::Breakdown { by_app }),
        (false, false) => Err(ColumnsError::Breakdown { by_app }),
        _ => Ok(()),
    }
}

/// A row's key in the packet's own terms: (application index, or 0 without an `app` column; id; metric).
fn key(c: &StatsColumns, row: usize) -> (u32, u64, i32) {
    (c.app.get(row).copied().unwrap_or(0), c.id[row], c.metric[row])
}

/// One key's summary as a row: count, mean, m2, and each extreme with the (application index, rank) holding
/// it. In merged columns the application table is sorted, so comparing (app, rank) as numbers orders them as
/// the strings do; a leaf's fold, whose table is in the order met, compares the names.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Row {
    pub(crate) count: u64,
    pub(crate) mean: f64,
    pub(crate) m2: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) min_at: (u32, u32),
    pub(crate) max_at: (u32, u32),
}

impl Row {
    /// One value held by `at`.
    pub(crate) fn single(v: f64, at: (u32, u32)) -> Row {
        Row {
            count: 1,
            mean: v,
            m2: 0.0,
            min: v,
            max: v,
            min_at: at,
            max_at: at,
        }
    }

    pub(crate) fn empty() -> Row {
        Row {
            count: 0,
            ..Row::single(0.0, (0, 0))
        }
    }

    /// `merge(&Row::single(v, at), before)` bit for bit, with the constants of a single value folded in:
    /// the leaf's one operation per value.
    #[inline(always)]
    pub(crate) fn add_one(
        &mut self,
        v: f64,
        at: (u32, u32),
        before: impl Fn((u32, u32), (u32, u32)) -> bool,
    ) {
        if self.count == 0 {
            *self = Row::single(v, at);
            return;
        }
        // merge_moments with nb = 1 and m2b = 0: `delta * 1.0` and `m2 + 0.0` change no bit (m2 is never
        // -0.0: it starts at +0.0 and grows by squares).
        // Through i64, one instruction rather than the several of an unsigned conversion, and the same value:
        // a leaf's count, one per value, is far below 2^63.
        let na = self.count as i64 as f64;
        let n = na + 1.0;
        let delta = v - self.mean;
        self.count = self.count.saturating_add(1);
        self.mean += delta / n;
        self.m2 += delta * delta * na / n;
        if v < self.min || (v == self.min && before(at, self.min_at)) {
            self.min = v;
            self.min_at = at;
        }
        if v > self.max || (v == self.max && before(at, self.max_at)) {
            self.max = v;
            self.max_at = at;
        }
    }

    /// [`crate::summary::merge`] on rows: `before(a, b)` says whether holder `a` wins a tie against `b`.
    pub(crate) fn merge(&mut self, b: &Row, before: impl Fn((u32, u32), (u32, u32)) -> bool) {
        if b.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *b;
            return;
        }
        (self.count, self.mean, self.m2) =
            merge_moments((self.count, self.mean, self.m2), (b.count, b.mean, b.m2));
        if b.min < self.min || (b.min == self.min && before(b.min_at, self.min_at)) {
            self.min = b.min;
            self.min_at = b.min_at;
        }
        if b.max > self.max || (b.max == self.max && before(b.max_at, self.max_at)) {
            self.max = b.max;
            self.max_at = b.max_at;
        }
    }
}

/// Appends a row to `out`.
pub(crate) fn push(out: &mut StatsColumns, key: Key, r: &Row) {
    out.id.push(key.0);
    out.metric.push(key.1);
    out.count.push(r.count);
    out.mean.push(r.mean);
    out.m2.push(r.m2);
    out.min.push(r.min);
    out.max.push(r.max);
    out.min_app.push(r.min_at.0);
    out.min_rank.push(r.min_at.1);
    out.max_app.push(r.max_at.0);
    out.max_rank.push(r.max_at.1);
}

/// Sorts and dedups `apps` in place and returns, for each table in `tables`, where its entries went.
fn union_apps<'a>(
    apps: &mut Vec<String>,
    tables: impl Iterator<Item = &'a [String]> + Clone,
) -> Vec<Vec<u32>> {
    apps.clear();
    for t in tables.clone() {
        apps.extend(t.iter().cloned());
    }
    apps.sort_unstable();
    apps.dedup();
    tables
        .map(|t| {
            t.iter()
                .map(|a| apps.binary_search(a).expect("every app was added") as u32)
                .collect()
        })
        .collect()
}

/// Merges checked packets, taken in the order given, into `out` (cleared first): one pass over the sorted keys.
/// Their quantile sketches, if any, are not carried over (see [`merge_with`]).
pub fn merge(inputs: &[&StatsColumns], out: &mut StatsColumns) {
    merge_with(inputs, None, out);
}

/// [`merge`], with each row's quantile sketches merged in the same pass when `sketches` is given: every input
/// must then have passed [`crate::sketch_columns::check`] against it. The output is broken down by application
/// when an input is (the inputs should agree: see [`check_breakdown`]); each input's application indices are
/// mapped into the merged table, in the same order, so its rows stay sorted.
pub fn merge_with(inputs: &[&StatsColumns], sketches: Option<&Spec>, out: &mut StatsColumns) {
    merge_rows(inputs, sketches, out, true);
}

/// [`merge_with`]; with `aligned_pass`, inputs whose rows have the same keys in the same order (every child of a
/// relay reporting the same events, the usual case) are merged row by row, without looking for the smallest
/// key among them: the same merges in the same order, so the same bits.
fn merge_rows(inputs: &[&StatsColumns], sketches: Option<&Spec>, out: &mut StatsColumns, aligned_pass: bool) {
    // prost's clear empties each column and keeps its buffer.
    out.clear();
    // Where each input's next row's sketch bins start in its sketch_counts, and the sketches of one row.
    let mut bins_at = vec![0usize; inputs.len()];
    let mut views: Vec<View<'_>> = Vec::with_capacity(inputs.len());
    let sketches = sketches.filter(|_| inputs.iter().any(|c| sketch_columns::present(c)));
    if let Some(spec) = sketches {
        out.sketch_accuracy = spec.accuracy();
    }
    let to_out = union_apps(&mut out.apps, inputs.iter().map(|c| c.apps.as_slice()));
    let by_app = inputs.iter().any(|c| !c.app.is_empty());
    // A row's key in the merged table's terms.
    let merged_key = |i: usize, row: usize| {
        let (app, id, metric) = key(inputs[i], row);
        let app = if inputs[i].app.is_empty() {
            0
        } else {
            to_out[i][app as usize]
        };
        (app, id, metric)
    };
    let mut at = vec![0usize; inputs.len()];
    let mut raw_bytes = 0u64;
    for c in inputs {
        raw_bytes = raw_bytes.saturating_add(c.raw_bytes);
    }
    let aligned = aligned_pass
        && inputs.split_first().is_some_and(|(first, rest)| {
            rest.iter().all(|c| {
                c.id == first.id && c.metric == first.metric && c.app.is_empty() == first.app.is_empty()
            }) && (first.app.is_empty()
                // The same application column through the same mapping (children of one application)
                // says it for every row at once.
                || (1..inputs.len()).all(|i| inputs[i].app == first.app && to_out[i] == to_out[0])
                || (0..first.id.len())
                    .all(|row| (1..inputs.len()).all(|i| merged_key(i, row) == merged_key(0, row))))
        });
    if aligned && sketches.is_none() {
        merge_aligned(inputs, &to_out, by_app, out);
        prune_apps(out);
        out.raw_bytes = raw_bytes;
        return;
    }
    loop {
        let next = if aligned {
            (at[0] < inputs[0].id.len()).then(|| merged_key(0, at[0]))
        } else {
            (0..inputs.len())
                .filter(|&i| at[i] < inputs[i].id.len())
                .map(|i| merged_key(i, at[i]))
                .min()
        };
        let Some(next) = next else { break };
        let mut merged = Row::empty();
        views.clear();
        for (i, c) in inputs.iter().enumerate() {
            let row = at[i];
            if row < c.id.len() && (aligned || merged_key(i, row) == next) {
                if sketches.is_some() && sketch_columns::present(c) {
                    views.push(sketch_columns::view(c, row, &mut bins_at[i]));
                }
                let apps = &to_out[i];
                let incoming = Row {
                    count: c.count[row],
                    mean: c.mean[row],
                    m2: c.m2[row],
                    min: c.min[row],
                    max: c.max[row],
                    min_at: (apps[c.min_app[row] as usize], c.min_rank[row]),
                    max_at: (apps[c.max_app[row] as usize], c.max_rank[row]),
                };
                merged.merge(&incoming, |a, b| a < b);
                at[i] += 1;
            }
        }
        push(out, (next.1, next.2), &merged);
        if by_app {
            out.app.push(next.0);
        }
        if let Some(spec) = sketches {
            sketch_columns::push_merged(out, &views, spec);
        }
    }
    prune_apps(out);
    out.raw_bytes = raw_bytes;
}

/// The merge of inputs whose rows have the same keys in the same order, column by column: each row starts as
/// input 0's (as `Row::empty()` merged with it) and the other inputs are merged into it in order, which are the
/// merges [`merge_rows`] makes row by row, so the same bits, without a pass over the keys or a push per row
/// and column.
fn merge_aligned(inputs: &[&StatsColumns], to_out: &[Vec<u32>], by_app: bool, out: &mut StatsColumns) {
    let Some((first, rest)) = inputs.split_first() else {
        return;
    };
    let n = first.id.len();
    let apps = &to_out[0];
    out.id.extend_from_slice(&first.id);
    out.metric.extend_from_slice(&first.metric);
    if by_app {
        out.app.extend(first.app.iter().map(|&a| apps[a as usize]));
    }
    out.count.extend_from_slice(&first.count);
    out.mean.extend_from_slice(&first.mean);
    out.m2.extend_from_slice(&first.m2);
    out.min.extend_from_slice(&first.min);
    out.max.extend_from_slice(&first.max);
    out.min_app
        .extend(first.min_app.iter().map(|&a| apps[a as usize]));
    out.min_rank.extend_from_slice(&first.min_rank);
    out.max_app
        .extend(first.max_app.iter().map(|&a| apps[a as usize]));
    out.max_rank.extend_from_slice(&first.max_rank);
    // An empty row merged with input 0's is input 0's, unless that has no values: then it stays empty.
    for row in (0..n).filter(|&row| first.count[row] == 0) {
        set(out, row, &Row::empty());
    }
    // Every column cut to the rows' count, so that indexing them in the loop needs no check.
    let count = &mut out.count[..n];
    let mean = &mut out.mean[..n];
    let m2 = &mut out.m2[..n];
    let min = &mut out.min[..n];
    let max = &mut out.max[..n];
    let min_app = &mut out.min_app[..n];
    let min_rank = &mut out.min_rank[..n];
    let max_app = &mut out.max_app[..n];
    let max_rank = &mut out.max_rank[..n];
    for (i, c) in rest.iter().enumerate() {
        let apps = &to_out[i + 1];
        let (c_count, c_mean, c_m2) = (&c.count[..n], &c.mean[..n], &c.m2[..n]);
        let (c_min, c_min_app, c_min_rank) = (&c.min[..n], &c.min_app[..n], &c.min_rank[..n]);
        let (c_max, c_max_app, c_max_rank) = (&c.max[..n], &c.max_app[..n], &c.max_rank[..n]);
        for row in 0..n {
            if c_count[row] == 0 {
                continue;
            }
            let incoming = Row {
                count: c_count[row],
                mean: c_mean[row],
                m2: c_m2[row],
                min: c_min[row],
                max: c_max[row],
                min_at: (apps[c_min_app[row] as usize], c_min_rank[row]),
                max_at: (apps[c_max_app[row] as usize], c_max_rank[row]),
            };
            let mut merged = Row {
                count: count[row],
                mean: mean[row],
                m2: m2[row],
                min: min[row],
                max: max[row],
                min_at: (min_app[row], min_rank[row]),
                max_at: (max_app[row], max_rank[row]),
            };
            merged.merge(&incoming, |a, b| a < b);
            count[row] = merged.count;
            mean[row] = merged.mean;
            m2[row] = merged.m2;
            min[row] = merged.min;
            max[row] = merged.max;
            (min_app[row], min_rank[row]) = merged.min_at;
            (max_app[row], max_rank[row]) = merged.max_at;
        }
    }
}

/// Row `row` of `out`'s summaries made `r` (its key stays).
fn set(out: &mut StatsColumns, row: usize, r: &Row) {
    out.count[row] = r.count;
    out.mean[row] = r.mean;
    out.m2[row] = r.m2;
    out.min[row] = r.min;
    out.max[row] = r.max;
    (out.min_app[row], out.min_rank[row]) = r.min_at;
    (out.max_app[row], out.max_rank[row]) = r.max_at;
}

/// Drops the applications no row names any more (the table stays sorted), so a child's long table does not
/// travel further up than the rows that need it.
fn prune_apps(out: &mut StatsColumns) {
    // One application named by a row is named by every row (the indices were checked): nothing to drop.
    if out.apps.len() == 1 && !out.min_app.is_empty() {
        return;
    }
    let mut used = vec![false; out.apps.len()];
    for &a in out.min_app.iter().chain(&out.max_app).chain(&out.app) {
        used[a as usize] = true;
    }
    if used.iter().all(|u| *u) {
        return;
    }
    let mut to_kept = vec![0u32; used.len()];
    let mut kept = 0u32;
    for (i, u) in used.iter().enumerate() {
        to_kept[i] = kept;
        kept += u32::from(*u);
    }
    for a in out
        .min_app
        .iter_mut()
        .chain(out.max_app.iter_mut())
        .chain(out.app.iter_mut())
    {
        *a = to_kept[*a as usize];
    }
    let mut i = 0;
    out.apps.retain(|_| {
        i += 1;
        used[i - 1]
    });
}

/// A `StatsMap`'s summaries as columns, into `out` (cleared first). A summary without a holder (merged from a
/// message that named none) is held by rank 0 of the application "".
pub fn from_map(map: &StatsMap, raw_bytes: u64, out: &mut StatsColumns) {
    // prost's clear empties each column and keeps its buffer.
    out.clear();
    let entries: Vec<(&Key, &Summary)> = map.iter().collect();
    fn app(r: &Option<RankRef>) -> &str {
        r.as_ref().map_or("", |r| r.app.as_str())
    }
    let names: Vec<String> = {
        let mut names: Vec<&str> = entries
            .iter()
            .flat_map(|(_, s)| [app(&s.min_rank), app(&s.max_rank)])
            .collect();
        names.sort_unstable();
        names.dedup();
        names.into_iter().map(str::to_string).collect()
    };
    let index = |r: &Option<RankRef>| names.binary_search_by(|n| n.as_str().cmp(app(r))).unwrap_or(0) as u32;
    let rank = |r: &Option<RankRef>| r.as_ref().map_or(0, |r| r.rank);
    for (key, s) in entries.into_iter().filter(|(_, s)| s.count > 0) {
        push(
            out,
            *key,
            &Row {
                count: s.count,
                mean: s.mean,
                m2: s.m2,
                min: s.min,
                max: s.max,
                min_at: (index(&s.min_rank), rank(&s.min_rank)),
                max_at: (index(&s.max_rank), rank(&s.max_rank)),
            },
        );
    }
    out.apps = names;
    out.raw_bytes = raw_bytes;
}

/// The application row `row` stands for when the rows are broken down by application, else "".
pub fn app_of(c: &StatsColumns, row: usize) -> &str {
    c.app
        .get(row)
        .and_then(|&a| c.apps.get(a as usize))
        .map_or("", String::as_str)
}

/// The stored form: one `EventStats` per row, in key order, with `std` filled and, when the rows are broken
/// down by application, `app` naming the row's. `c` must have passed [`check`].
pub fn to_stats(c: &StatsColumns) -> Vec<EventStats> {
    let rank = |app: u32, rank: u32| RankRef {
        app: c.apps.get(app as usize).cloned().unwrap_or_default(),
        rank,
    };
    (0..c.id.len())
        .map(|row| {
            let mut s = Summary {
                count: c.count[row],
                mean: c.mean[row],
                m2: c.m2[row],
                std: 0.0,
                min: c.min[row],
                max: c.max[row],
                min_rank: Some(rank(c.min_app[row], c.min_rank[row])),
                max_rank: Some(rank(c.max_app[row], c.max_rank[row])),
            };
            finish(&mut s);
            EventStats {
                id: c.id[row],
                metric: c.metric[row],
                summary: Some(s),
                quantiles: Vec::new(),
                app: app_of(c, row).to_string(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
