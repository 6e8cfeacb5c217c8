//! The reader's queries over rows of ranks and nodes: samples, counters, per-event metrics, traces, utilization,
//! outliers, latency steps and the nodes' samples.

use super::*;
use crate::table_row::{TableRow, select_list};

impl StoreReader {
    /// Rows of `samples`, by stream, round, app, rank, then as stored.
    pub fn samples(&self, select: Select) -> Result<Vec<SampleRow>, StoreError> {
        self.table_rows(select)
    }

    /// Rows of `counters`, by stream, round, app, rank, then as stored.
    pub fn counters(&self, select: Select) -> Result<Vec<CounterRow>, StoreError> {
        self.table_rows(select)
    }

    /// Rows of `event_metrics`, by stream, round, app and rank, then as stored (event by event, each event's
    /// metrics in the profile's order). A store older than version 9 has none.
    pub fn event_metrics(&self, select: Select) -> Result<Vec<EventMetricRow>, StoreError> {
        self.table_rows(select)
    }

    /// Rows of `trace`, by stream, round, app, rank, thread, then in time order. A store older than version 6 has
    /// none.
    pub fn trace(&self, select: Select) -> Result<Vec<TraceRow>, StoreError> {
        self.table_rows(select)
    }

    /// Rows of `utilization`, by stream, round and bin, then in activity order as stored (0, "other", first).
    /// A store older than version 7 has none.
    pub fn utilization(&self, select: Select) -> Result<Vec<UtilizationRow>, StoreError> {
        self.table_rows(select)
    }

    /// Rows of `outliers`, by stream and round, then as stored: group by group in the result's order (class ids
    /// as unsigned numbers), each by place in the group's top (0: the highest score). A store older than
    /// version 12 has none.
    pub fn outliers(&self, select: Select) -> Result<Vec<OutlierRow>, StoreError> {
        self.table_rows(select)
    }

    /// Rows of `outlier_events`, by stream and round, then as stored: by group, the rank's place and the event's.
    /// A store older than version 12 has none.
    pub fn outlier_events(&self, select: Select) -> Result<Vec<OutlierEventRow>, StoreError> {
        self.table_rows(select)
    }

    /// Rows of `latency`, by stream and round, then by key and step. A store older than version 16 has none.
    pub fn latency(&self, select: Select) -> Result<Vec<LatencyRow>, StoreError> {
        self.table_rows(select)
    }

    /// Rows of `latency_apps`, by stream and round, then by key, step and application. A store older than
    /// version 16 has none.
    pub fn latency_apps(&self, select: Select) -> Result<Vec<LatencyAppRow>, StoreError> {
        self.table_rows(select)
    }

    /// Rows of `node_samples`, by stream, round and node. A store older than version 8 has none.
    pub fn node_samples(&self, select: Select) -> Result<Vec<NodeSampleRow>, StoreError> {
        self.table_rows(select)
    }

    /// Rows of `node_ranks`, by stream, round, node, then rank. A store older than version 8 has none.
    pub fn node_ranks(&self, select: Select) -> Result<Vec<NodeRanksRow>, StoreError> {
        self.table_rows(select)
    }

    /// The sample of the node that served `(app, rank)` in `round` of the node stream `nodes_stream`, found as a
    /// user's SQL finds it (`node_ranks` joined to `node_samples`, see [`RANK_NODE_QUERY`]); `None` if no sample
    /// of that round names the rank. Late samples are left out.
    pub fn rank_node_sample(
        &self,
        nodes_stream: u32,
        round: u64,
        app: &str,
        rank: u32,
    ) -> Result<Option<NodeSampleRow>, StoreError> {
        if self.version < 8 {
            return Ok(None);
        }
        let sql = format!(
            "SELECT {} FROM node_samples WHERE rowid = (
                 SELECT ns.rowid FROM node_ranks nr
                 JOIN node_samples ns ON ns.stream_id = nr.stream_id AND ns.round = nr.round
                                      AND ns.node_id = nr.node_id AND ns.late = 0
                 WHERE nr.stream_id = ?1 AND nr.round = ?2 AND nr.app = ?3
                   AND ?4 BETWEEN nr.first_rank AND nr.last_rank AND nr.late = 0
                 ORDER BY ns.rowid LIMIT 1)",
            select_list(NodeSampleRow::columns(), self.version)
        );
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut st| {
                st.query_row(
                    rusqlite::params![nodes_stream, sat(round), app, rank],
                    NodeSampleRow::read,
                )
                .optional()
            })
            .map_err(self.sqlite())
    }
}
