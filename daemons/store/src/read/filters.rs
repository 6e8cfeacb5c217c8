//! The reader's queries over the standard filters' tables: results, stats and their quantiles, histograms, classes,
//! clusters and reductions.

use super::*;

impl StoreReader {
    /// Rows of `results`, by stream, round, then as stored.
    pub fn results(&self, select: Select) -> Result<Vec<ResultRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, phase, payload, late FROM results{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(ResultRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                phase: r.get(2)?,
                payload: r.get::<_, Option<Vec<u8>>>(3)?.unwrap_or_default(),
                late: r.get(4)?,
            })
        })
    }

    /// The `app` column of `stats` and `stats_quantiles`, or NULL in a store older than the column.
    fn stats_app(&self) -> &'static str {
        if self.version >= STATS_APP_SINCE {
            "app"
        } else {
            "NULL"
        }
    }

    /// Rows of `stats`, by stream, round, then as stored.
    pub fn stats(&self, select: Select) -> Result<Vec<StatRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let app = self.stats_app();
        let sql = format!(
            "SELECT stream_id, round, class_id, id, metric, count, mean, std, min, max, min_app, min_rank,
                    max_app, max_rank, late, {app}
             FROM stats{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(StatRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                class_id: r.get::<_, Option<i64>>(2)?.map(id_of),
                id: id_of(r.get(3)?),
                metric: metric(r, 4)?,
                count: u64_at(r, 5)?,
                mean: r.get(6)?,
                std: r.get(7)?,
                min: r.get(8)?,
                max: r.get(9)?,
                min_app: r.get(10)?,
                min_rank: r.get(11)?,
                max_app: r.get(12)?,
                max_rank: r.get(13)?,
                late: r.get(14)?,
                app: r.get(15)?,
            })
        })
    }

    /// Rows of `stats_quantiles` (none in a store older than the table), by stream, round, then as stored.
    pub fn stats_quantiles(&self, select: Select) -> Result<Vec<QuantileRow>, StoreError> {
        if self.version < Table::StatsQuantiles.since() {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let app = self.stats_app();
        let sql = format!(
            "SELECT stream_id, round, class_id, id, metric, q, value, late, {app}
             FROM stats_quantiles{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(QuantileRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                class_id: r.get::<_, Option<i64>>(2)?.map(id_of),
                id: id_of(r.get(3)?),
                metric: metric(r, 4)?,
                q: r.get(5)?,
                value: r.get(6)?,
                late: r.get(7)?,
                app: r.get(8)?,
            })
        })
    }

    /// Bins of `histograms`, by stream, round, then as stored.
    pub fn histograms(&self, select: Select) -> Result<Vec<HistogramRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let app = if self.version >= HISTOGRAMS_APP_SINCE {
            "app"
        } else {
            "NULL"
        };
        let sql = format!(
            "SELECT stream_id, round, class_id, id, metric, bin, lo, hi, count, late, {app}
             FROM histograms{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(HistogramRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                class_id: r.get::<_, Option<i64>>(2)?.map(id_of),
                id: id_of(r.get(3)?),
                metric: metric(r, 4)?,
                bin: r.get(5)?,
                lo: r.get(6)?,
                hi: r.get(7)?,
                count: u64_at(r, 8)?,
                late: r.get(9)?,
                app: r.get(10)?,
            })
        })
    }

    /// Rows of `classes`, by stream, round, then as stored.
    pub fn classes(&self, select: Select) -> Result<Vec<ClassRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, class_id, size, ranks, example_event, late
             FROM classes{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(ClassRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                class_id: id_of(r.get(2)?),
                size: u64_at(r, 3)?,
                ranks: r.get(4)?,
                example_event: r.get(5)?,
                late: r.get(6)?,
            })
        })
    }

    /// Rows of `clusters`, by stream, round and cluster, each with its ranks as compact ranges.
    pub fn clusters(&self, select: Select) -> Result<Vec<ClusterRow>, StoreError> {
        if self.version < Table::Clusters.since() {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, cluster, size, representative_app, representative_rank, rms, max_distance,
                    sum_squares, late
             FROM clusters{clause} ORDER BY stream_id, round, cluster, rowid"
        );
        let mut rows = self.rows(&sql, &values, |r| {
            let app: Option<String> = r.get(4)?;
            let rank: Option<u32> = r.get(5)?;
            Ok(ClusterRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                cluster: r.get(2)?,
                size: u64_at(r, 3)?,
                ranks: String::new(),
                representative: app.zip(rank),
                rms: r.get(6)?,
                max_distance: r.get(7)?,
                sum_squares: r.get(8)?,
                late: r.get(9)?,
            })
        })?;
        let sql = format!(
            "SELECT stream_id, round, cluster, app, first_rank, last_rank, late
             FROM cluster_ranks{clause} ORDER BY stream_id, round, cluster, app, first_rank"
        );
        let ranges = self.rows(&sql, &values, |r| {
            Ok((
                (
                    r.get::<_, u32>(0)?,
                    u64_at(r, 1)?,
                    r.get::<_, u32>(2)?,
                    r.get::<_, bool>(6)?,
                ),
                RankRange {
                    app: r.get(3)?,
                    first: r.get(4)?,
                    last: r.get(5)?,
                },
            ))
        })?;
        let mut by_cluster: std::collections::HashMap<(u32, u64, u32, bool), Vec<RankRange>> =
            std::collections::HashMap::new();
        for (key, range) in ranges {
            by_cluster.entry(key).or_default().push(range);
        }
        for row in &mut rows {
            let key = (row.stream_id, row.round, row.cluster, row.late);
            if let Some(mine) = by_cluster.get(&key) {
                row.ranks = crate::tables::ranges_text(mine);
            }
        }
        Ok(rows)
    }

    /// Rows of `reductions`, by stream, round, then as stored.
    pub fn reductions(&self, select: Select) -> Result<Vec<ReductionRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, raw_bytes, result_bytes, reduction_factor, classes, late
             FROM reductions{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(ReductionRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                raw_bytes: u64_at(r, 2)?,
                result_bytes: u64_at(r, 3)?,
                reduction_factor: r.get(4)?,
                classes: opt_u64(r, 5)?,
                late: r.get(6)?,
            })
        })
    }
}
