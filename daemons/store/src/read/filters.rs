//! The reader's queries over the standard filters' tables: results, stats and their quantiles, histograms, classes,
//! clusters and reductions.

use super::*;

impl StoreReader {
    /// Rows of `results`, by stream, round, then as stored.
    pub fn results(&self, select: Select) -> Result<Vec<ResultRow>, StoreError> {
        self.table_rows(select)
    }

    /// Rows of `stats`, by stream, round, then as stored.
    pub fn stats(&self, select: Select) -> Result<Vec<StatRow>, StoreError> {
        self.table_rows(select)
    }

    /// Rows of `stats_quantiles` (none in a store older than the table), by stream, round, then as stored.
    pub fn stats_quantiles(&self, select: Select) -> Result<Vec<QuantileRow>, StoreError> {
        self.table_rows(select)
    }

    /// Bins of `histograms`, by stream, round, then as stored.
    pub fn histograms(&self, select: Select) -> Result<Vec<HistogramRow>, StoreError> {
        self.table_rows(select)
    }

    /// Rows of `classes`, by stream, round, then as stored.
    pub fn classes(&self, select: Select) -> Result<Vec<ClassRow>, StoreError> {
        self.table_rows(select)
    }

    /// Rows of `clusters`, by stream, round and cluster, each with its ranks as compact ranges.
    pub fn clusters(&self, select: Select) -> Result<Vec<ClusterRow>, StoreError> {
        let mut rows: Vec<ClusterRow> = self.table_rows(select)?;
        if rows.is_empty() {
            return Ok(rows);
        }
        let (clause, values) = select.clause(true);
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
        self.table_rows(select)
    }
}
