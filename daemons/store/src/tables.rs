//! The standard filters' results as tables: `stats` (and `stats_quantiles`), `histograms`, `classes`,
//! `utilization`, `reductions`, `outliers` and `outlier_events`, kmeans's `clusters`, `cluster_ranks`,
//! `cluster_centroids` and `kmeans_fits`, `node_samples` and `node_ranks`, decoded from the result message a stream's filter declares (any plugin whose result type is
//! one of the standard messages gets the same tables). Every result also stays whole in `results`.

use std::sync::OnceLock;

use canopy_proto::filters::known::Known;
use canopy_proto::filters::v1::{
    ClassResult, EventStats, Histogram, HistogramResult, KmeansResult, LatencyResult, Metric, NodeSample,
    NodeSamples, OutlierEvent, OutliersResult, RankRange, UtilizationResult,
};
use prost::Message;
use rusqlite::{Transaction, params};

use crate::rows::{
    self, ClassRow, ClusterRow, HistogramRow, LatencyAppRow, LatencyRow, NodeSampleRow, OutlierEventRow,
    OutlierRow, QuantileRow, ReductionRow, UtilizationRow,
};
use crate::sql::{id_bits, sat};
use crate::stat_rows::{self, StatRow, StatsRows};
use crate::table_row::{TableRow, stored_order};
use crate::words::Word;

/// Whether results of this type get tables: every standard result but profiles (which have theirs, `samples`).
pub fn is_tabulated(result_type: &str) -> bool {
    Known::of(result_type).is_some_and(|k| k != Known::Profiles)
}

/// Why a result could not become rows.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TableError {
    #[error("not a {what}: {source}")]
    Decode {
        what: &'static str,
        source: prost::DecodeError,
    },
    #[error("the {what} does not hold together: {reason}")]
    Invalid { what: &'static str, reason: String },
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
}

fn decode<T: Message + Default>(what: &'static str, payload: &[u8]) -> Result<T, TableError> {
    T::decode(payload).map_err(|source| TableError::Decode { what, source })
}

/// Writes the rows of one result; a payload that does not decode as its declared type is an error.
pub(crate) fn write(
    tx: &Transaction<'_>,
    stream_id: u32,
    round: u64,
    result_type: &str,
    payload: &[u8],
    late: bool,
) -> Result<(), TableError> {
    let at = At {
        stream_id,
        round: sat(round),
        late: i64::from(late),
    };
    let Some(known) = Known::of(result_type) else {
        return Ok(());
    };
    match known {
        Known::Stats => {
            let read = stat_rows::read(payload).map_err(|source| TableError::Decode {
                what: "StatsResult",
                source,
            })?;
            let raw_bytes = match read {
                StatsRows::InPlace { rows, raw_bytes } => {
                    at.stat_rows(tx, None, &rows)?;
                    raw_bytes
                }
                StatsRows::Decoded(r) => {
                    at.stats(tx, None, &r.stats)?;
                    r.raw_bytes
                }
            };
            at.reduction(tx, raw_bytes, payload.len() as u64, None)?;
        }
        Known::Histogram => {
            let r: HistogramResult = decode("HistogramResult", payload)?;
            at.stats(tx, None, &r.stats)?;
            at.histograms(tx, None, &r.histograms)?;
            at.reduction(tx, r.raw_bytes, payload.len() as u64, None)?;
        }
        Known::Classes => {
            let r: ClassResult = decode("ClassResult", payload)?;
            for c in &r.classes {
                let class = Some(c.class_id as i64);
                tx.prepare_cached(ClassRow::insert())?.execute(params![
                    at.stream_id,
                    at.round,
                    c.class_id as i64,
                    c.size,
                    ranges_text(&c.ranks),
                    c.example_event,
                    at.late
                ])?;
                at.rank_ranges(tx, "class_ranks", "class_id", &(c.class_id as i64), &c.ranks)?;
                at.stats(tx, class, &c.stats)?;
                // A class's histograms share the result's ranges: each row gets its event's bounds.
                let histograms = r.histograms_of(c).map_err(|reason| TableError::Invalid {
                    what: "ClassResult",
                    reason,
                })?;
                at.histograms(tx, class, &histograms)?;
            }
            let classes = Some(r.classes.len() as i64);
            at.reduction(tx, r.raw_bytes, r.result_bytes, classes)?;
        }
        Known::Utilization => {
            let r: UtilizationResult = decode("UtilizationResult", payload)?;
            at.utilization(tx, &r)?;
            at.reduction(tx, r.raw_bytes, payload.len() as u64, None)?;
        }
        Known::Outliers => {
            let r: OutliersResult = decode("OutliersResult", payload)?;
            at.outliers(tx, &r)?;
            let groups = (r.within == "class").then_some(r.groups.len() as i64);
            at.reduction(tx, r.raw_bytes, payload.len() as u64, groups)?;
        }
        Known::Kmeans => {
            let r: KmeansResult = decode("KmeansResult", payload)?;
            at.kmeans(tx, &r)?;
        }
        Known::Latency => {
            let r: LatencyResult = decode("LatencyResult", payload)?;
            at.latency(tx, &r)?;
            at.reduction(tx, r.raw_bytes, payload.len() as u64, None)?;
        }
        Known::Nodes => {
            let r: NodeSamples = decode("NodeSamples", payload)?;
            for node in &r.nodes {
                at.node_sample(tx, node)?;
            }
        }
        Known::Profiles => {}
    }
    Ok(())
}

/// Rank ranges as text: `app:0-7,9,12-15`, the app named once for each run of its ranges.
pub fn ranges_text(ranges: &[RankRange]) -> String {
    let mut out = String::new();
    let mut app: Option<&str> = None;
    for r in ranges {
        if !out.is_empty() {
            out.push(',');
        }
        if app != Some(r.app.as_str()) && !r.app.is_empty() {
            out.push_str(&r.app);
            out.push(':');
        }
        app = Some(r.app.as_str());
        if r.first == r.last {
            out.push_str(&r.first.to_string());
        } else {
            out.push_str(&format!("{}-{}", r.first, r.last));
        }
    }
    out
}

fn metric_word(m: i32) -> &'static str {
    Metric::try_from(m).unwrap_or(Metric::Unspecified).word()
}

/// The application a stats row stands for: NULL for a row over every application.
fn app_of(s: &EventStats) -> Option<&str> {
    Some(s.app.as_str()).filter(|a| !a.is_empty())
}

/// `stats` rows per insert statement.
const STATS_PER_INSERT: usize = 16;
/// The columns of the key every `stats` row of one result shares, bound once as `?1` to `?4`.
const STATS_KEY: [&str; 4] = ["stream_id", "round", "class_id", "late"];
/// The parameters of one `stats` row after the shared key: its other columns.
fn stats_row_params() -> usize {
    <rows::StatRow as TableRow>::columns().len() - STATS_KEY.len()
}

/// The insert of `rows` `stats` rows (1 or [`STATS_PER_INSERT`]) of [`rows::StatRow`]'s columns: the shared key
/// as `?1` to `?4`, row `k`'s own values numbered from `?(5 + stats_row_params() k)` in the columns' order, which
/// [`bind_stat_rows`] follows.
fn stats_insert(rows: usize) -> &'static str {
    static ONE: OnceLock<String> = OnceLock::new();
    static MANY: OnceLock<String> = OnceLock::new();
    let make = || {
        let columns = <rows::StatRow as TableRow>::columns();
        let order = stored_order(crate::Table::Stats, columns);
        let values: Vec<String> = (0..rows)
            .map(|k| {
                // Each column's parameter, in the columns' order; listed in the table's own order.
                let mut own = 5 + stats_row_params() * k;
                let params: Vec<String> = columns
                    .iter()
                    .map(|c| match STATS_KEY.iter().position(|key| *key == c.name) {
                        Some(key) => format!("?{}", key + 1),
                        None => {
                            own += 1;
                            format!("?{}", own - 1)
                        }
                    })
                    .collect();
                let params: Vec<&str> = order.iter().map(|&i| params[i].as_str()).collect();
                format!("({})", params.join(", "))
            })
            .collect();
        let names: Vec<&str> = order.iter().map(|&i| columns[i].name).collect();
        format!(
            "INSERT INTO stats ({}) VALUES {}",
            names.join(", "),
            values.join(", ")
        )
    };
    match rows {
        1 => ONE.get_or_init(make),
        STATS_PER_INSERT => MANY.get_or_init(make),
        _ => unreachable!("stats inserts carry 1 or {STATS_PER_INSERT} rows"),
    }
}

/// Binds each row's own values to an insert from [`stats_insert`] of as many rows, in [`rows::StatRow`]'s
/// order of columns after the key.
fn bind_stat_rows(st: &mut rusqlite::Statement<'_>, rows: &[StatRow<'_>]) -> rusqlite::Result<()> {
    let params = stats_row_params();
    for (k, r) in rows.iter().enumerate() {
        let at = 5 + params * k;
        st.raw_bind_parameter(at, Some(r.app).filter(|a| !a.is_empty()))?;
        st.raw_bind_parameter(at + 1, id_bits(r.id))?;
        st.raw_bind_parameter(at + 2, metric_word(r.metric))?;
        st.raw_bind_parameter(at + 3, sat(r.count))?;
        st.raw_bind_parameter(at + 4, r.mean)?;
        st.raw_bind_parameter(at + 5, r.std)?;
        st.raw_bind_parameter(at + 6, r.min)?;
        st.raw_bind_parameter(at + 7, r.max)?;
        st.raw_bind_parameter(at + 8, r.min_app)?;
        st.raw_bind_parameter(at + 9, r.min_rank)?;
        st.raw_bind_parameter(at + 10, r.max_app)?;
        st.raw_bind_parameter(at + 11, r.max_rank)?;
    }
    Ok(())
}

/// The key every row of one result shares.
struct At {
    stream_id: u32,
    round: i64,
    late: i64,
}

impl At {
    /// Binds the key every row of a result shares to an insert that numbers it `?1` (stream), `?2` (round),
    /// `?3` (class) and `late_at` (late).
    fn bind_key(
        &self,
        st: &mut rusqlite::Statement<'_>,
        class: Option<i64>,
        late_at: usize,
    ) -> rusqlite::Result<()> {
        st.raw_bind_parameter(1, self.stream_id)?;
        st.raw_bind_parameter(2, self.round)?;
        st.raw_bind_parameter(3, class)?;
        st.raw_bind_parameter(late_at, self.late)
    }

    fn stats(&self, tx: &Transaction<'_>, class: Option<i64>, stats: &[EventStats]) -> rusqlite::Result<()> {
        let rows: Vec<StatRow<'_>> = stats.iter().map(StatRow::from).collect();
        self.stat_rows(tx, class, &rows)?;
        self.quantiles(tx, class, stats)
    }

    /// The `stats` rows, [`STATS_PER_INSERT`] to a statement: SQLite's work per statement run (starting it,
    /// resetting it, reading back its parameters) is shared by the rows it carries.
    fn stat_rows(
        &self,
        tx: &Transaction<'_>,
        class: Option<i64>,
        rows: &[StatRow<'_>],
    ) -> rusqlite::Result<()> {
        let mut chunks = rows.chunks_exact(STATS_PER_INSERT);
        if rows.len() >= STATS_PER_INSERT {
            let mut st = tx.prepare_cached(stats_insert(STATS_PER_INSERT))?;
            // The key every row shares is bound once: a statement keeps its bindings from one run to the next.
            self.bind_key(&mut st, class, 4)?;
            for chunk in &mut chunks {
                bind_stat_rows(&mut st, chunk)?;
                st.raw_execute()?;
            }
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut st = tx.prepare_cached(stats_insert(1))?;
            self.bind_key(&mut st, class, 4)?;
            for row in rest.chunks(1) {
                bind_stat_rows(&mut st, row)?;
                st.raw_execute()?;
            }
        }
        Ok(())
    }

    /// The quantiles of each `stats` row (the stats filter's, when its stream asks for them).
    fn quantiles(
        &self,
        tx: &Transaction<'_>,
        class: Option<i64>,
        stats: &[EventStats],
    ) -> rusqlite::Result<()> {
        if stats.iter().all(|s| s.quantiles.is_empty()) {
            return Ok(());
        }
        let mut st = tx.prepare_cached(QuantileRow::insert())?;
        for s in stats {
            for q in &s.quantiles {
                st.execute(params![
                    self.stream_id,
                    self.round,
                    class,
                    app_of(s),
                    id_bits(s.id),
                    metric_word(s.metric),
                    q.q,
                    q.value,
                    self.late,
                ])?;
            }
        }
        Ok(())
    }

    fn histograms(
        &self,
        tx: &Transaction<'_>,
        class: Option<i64>,
        histograms: &[Histogram],
    ) -> rusqlite::Result<()> {
        let mut st = tx.prepare_cached(HistogramRow::insert())?;
        self.bind_key(&mut st, class, 11)?;
        for h in histograms {
            st.raw_bind_parameter(4, (!h.app.is_empty()).then_some(h.app.as_str()))?;
            st.raw_bind_parameter(5, id_bits(h.id))?;
            st.raw_bind_parameter(6, metric_word(h.metric))?;
            let bins = h.counts.len().max(1) as f64;
            let width = (h.hi - h.lo) / bins;
            for (b, count) in h.counts.iter().enumerate() {
                let lo = h.lo + width * b as f64;
                let hi = if b + 1 == h.counts.len() {
                    h.hi
                } else {
                    h.lo + width * (b + 1) as f64
                };
                st.raw_bind_parameter(7, b as i64)?;
                st.raw_bind_parameter(8, lo)?;
                st.raw_bind_parameter(9, hi)?;
                st.raw_bind_parameter(10, sat(*count))?;
                st.raw_execute()?;
            }
        }
        Ok(())
    }

    /// One row per record: (bin, activity, share), with the bin's start and the ranks it averages over.
    /// A row per kept rank, in its place in its group's top, and a row per event weighing in its score.
    fn outliers(&self, tx: &Transaction<'_>, r: &OutliersResult) -> rusqlite::Result<()> {
        let mut rank_st = tx.prepare_cached(OutlierRow::insert())?;
        let mut event_st = tx.prepare_cached(OutlierEventRow::insert())?;
        // An event names its own metric when the stream scores several.
        let metric = |e: &OutlierEvent| metric_word(if e.metric != 0 { e.metric } else { r.metric });
        for g in &r.groups {
            let class = id_bits(g.class_id);
            for (position, o) in g.top.iter().enumerate() {
                rank_st.execute(params![
                    self.stream_id,
                    self.round,
                    class,
                    position as i64,
                    o.app,
                    o.rank,
                    o.score,
                    sat(g.ranks),
                    self.late
                ])?;
                for (k, e) in o.events.iter().enumerate() {
                    event_st.execute(params![
                        self.stream_id,
                        self.round,
                        class,
                        position as i64,
                        k as i64,
                        id_bits(e.id),
                        metric(e),
                        e.value,
                        e.mean,
                        e.std,
                        e.contribution,
                        self.late
                    ])?;
                }
            }
        }
        Ok(())
    }

    fn utilization(&self, tx: &Transaction<'_>, r: &UtilizationResult) -> Result<(), TableError> {
        let invalid = |reason: String| TableError::Invalid {
            what: "UtilizationResult",
            reason,
        };
        if !r.counts.is_empty() {
            canopy_wire::utilization::check_table(
                r.bin_us,
                &r.activities,
                &r.counts,
                &r.activity,
                r.share.len(),
            )
            .map_err(|e| invalid(e.to_string()))?;
        } else if !r.activity.is_empty() || !r.share.is_empty() {
            return Err(invalid(format!(
                "no bins but {} records and {} shares",
                r.activity.len(),
                r.share.len()
            )));
        }
        if r.ranks.len() != r.counts.len() {
            return Err(invalid(format!(
                "{} bins but {} rank counts",
                r.counts.len(),
                r.ranks.len()
            )));
        }
        let mut st = tx.prepare_cached(UtilizationRow::insert())?;
        let bin_ns = u128::from(r.bin_us) * 1000;
        let mut at = 0;
        for (bin, (&count, &ranks)) in r.counts.iter().zip(&r.ranks).enumerate() {
            let start = u128::from(r.start_unix_ns) + bin as u128 * bin_ns;
            let start = sat(u64::try_from(start).unwrap_or(u64::MAX));
            for k in at..at + count as usize {
                st.execute(params![
                    self.stream_id,
                    self.round,
                    bin as i64,
                    start,
                    id_bits(r.activities[r.activity[k] as usize]),
                    r.share[k],
                    ranks,
                    self.late
                ])?;
            }
            at += count as usize;
        }
        Ok(())
    }

    /// A node's sample, with NULL for what its agent did not sample, and a `node_ranks` row per range.
    fn node_sample(&self, tx: &Transaction<'_>, n: &NodeSample) -> Result<(), TableError> {
        if n.node_id.is_empty() {
            return Err(TableError::Invalid {
                what: "NodeSamples",
                reason: "a sample names no node".into(),
            });
        }
        let (cpu, mem, net, disk, load) = (
            n.cpu.as_ref(),
            n.memory.as_ref(),
            n.network.as_ref(),
            n.disk.as_ref(),
            n.load.as_ref(),
        );
        let time = |ns: u64| (ns != 0).then(|| sat(ns));
        tx.prepare_cached(NodeSampleRow::insert())?.execute(params![
            self.stream_id,
            self.round,
            n.node_id,
            n.hostname,
            ranges_text(&n.ranks),
            time(n.sample_unix_ns),
            time(n.sample_unix_ns).and(Some(sat(n.interval_ns))),
            cpu.map(|c| c.cpus),
            cpu.map(|c| c.user_share),
            cpu.map(|c| c.nice_share),
            cpu.map(|c| c.system_share),
            cpu.map(|c| c.idle_share),
            cpu.map(|c| c.iowait_share),
            cpu.map(|c| c.irq_share),
            cpu.map(|c| c.steal_share),
            mem.map(|m| sat(m.total_bytes)),
            mem.map(|m| sat(m.available_bytes)),
            mem.map(|m| sat(m.used_bytes)),
            mem.map(|m| sat(m.page_faults)),
            mem.map(|m| sat(m.major_faults)),
            net.map(|x| sat(x.rx_bytes)),
            net.map(|x| sat(x.tx_bytes)),
            net.map(|x| x.interfaces),
            disk.map(|d| sat(d.read_bytes)),
            disk.map(|d| sat(d.write_bytes)),
            disk.map(|d| d.disks),
            load.map(|l| l.load_1m),
            load.map(|l| l.load_5m),
            load.map(|l| l.load_15m),
            load.map(|l| l.runnable),
            load.map(|l| l.threads),
            self.late
        ])?;
        self.rank_ranges(tx, "node_ranks", "node_id", &n.node_id, &n.ranks)?;
        Ok(())
    }

    /// A latency result: each step completed in the round, and each application's part in it.
    fn latency(&self, tx: &Transaction<'_>, r: &LatencyResult) -> Result<(), TableError> {
        let mut step = tx.prepare_cached(LatencyRow::insert())?;
        let mut app = tx.prepare_cached(LatencyAppRow::insert())?;
        for s in &r.steps {
            step.execute(params![
                self.stream_id,
                self.round,
                id_bits(s.key_id),
                sat(s.step),
                sat(s.latency_ns),
                sat(s.start_unix_ns),
                s.start_app,
                s.start_rank,
                sat(s.stop_unix_ns),
                s.stop_app,
                s.stop_rank,
                self.late
            ])?;
            for a in &s.apps {
                app.execute(params![
                    self.stream_id,
                    self.round,
                    id_bits(s.key_id),
                    sat(s.step),
                    a.app,
                    a.ranks,
                    a.transfer_us,
                    a.compute_us,
                    self.late
                ])?;
            }
        }
        Ok(())
    }

    /// A kmeans result: its clusters with their ranks and centroids, and the fit of every k it ran.
    fn kmeans(&self, tx: &Transaction<'_>, r: &KmeansResult) -> Result<(), TableError> {
        let dims = r.dims.len();
        let metric = metric_word(r.metric);
        for c in &r.clusters {
            if c.centroid.len() != dims {
                return Err(TableError::Invalid {
                    what: "KmeansResult",
                    reason: format!(
                        "cluster {} has {} centroid values for {dims} dimensions",
                        c.cluster,
                        c.centroid.len()
                    ),
                });
            }
            let rep = c.representative.as_ref();
            tx.prepare_cached(ClusterRow::insert())?.execute(params![
                self.stream_id,
                self.round,
                c.cluster,
                sat(c.size),
                rep.map(|r| r.app.as_str()),
                rep.map(|r| r.rank),
                c.rms,
                c.max_distance,
                c.sum_squares,
                self.late
            ])?;
            self.rank_ranges(tx, "cluster_ranks", "cluster", &c.cluster, &c.ranks)?;
            let mut st = tx.prepare_cached(
                "INSERT INTO cluster_centroids (stream_id, round, cluster, id, metric, value, late)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            for (id, value) in r.dims.iter().zip(&c.centroid) {
                st.execute(params![
                    self.stream_id,
                    self.round,
                    c.cluster,
                    id_bits(*id),
                    metric,
                    value,
                    self.late
                ])?;
            }
        }
        let mut st = tx.prepare_cached(
            "INSERT INTO kmeans_fits (stream_id, round, k, fit, iterations, converged, chosen, refit, late)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?;
        for f in &r.fits {
            st.execute(params![
                self.stream_id,
                self.round,
                f.k,
                f.fit,
                f.iterations,
                f.converged,
                f.k == r.k,
                r.refit,
                self.late
            ])?;
        }
        Ok(())
    }

    /// A row per range of a group's ranks (a class, a cluster, a node), in `table` keyed by the group's
    /// `key_column`, so that "which group is rank 7 in" is a range lookup.
    fn rank_ranges(
        &self,
        tx: &Transaction<'_>,
        table: &str,
        key_column: &str,
        key: &dyn rusqlite::ToSql,
        ranks: &[RankRange],
    ) -> rusqlite::Result<()> {
        let mut st = tx.prepare_cached(&format!(
            "INSERT INTO {table} (stream_id, round, {key_column}, app, first_rank, last_rank, late)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
        ))?;
        for r in ranks {
            st.execute(params![
                self.stream_id,
                self.round,
                key,
                r.app,
                r.first.min(r.last),
                r.first.max(r.last),
                self.late
            ])?;
        }
        Ok(())
    }

    fn reduction(
        &self,
        tx: &Transaction<'_>,
        raw_bytes: u64,
        result_bytes: u64,
        classes: Option<i64>,
    ) -> rusqlite::Result<()> {
        let factor = if result_bytes == 0 {
            None
        } else {
            Some(raw_bytes as f64 / result_bytes as f64)
        };
        tx.prepare_cached(ReductionRow::insert())?.execute(params![
            self.stream_id,
            self.round,
            sat(raw_bytes),
            sat(result_bytes),
            factor,
            classes,
            self.late
        ])?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
