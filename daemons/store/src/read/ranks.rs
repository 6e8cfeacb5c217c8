//! The reader's queries over rows of ranks and nodes: samples, counters, per-event metrics, traces, utilization,
//! outliers, latency steps and the nodes' samples.

use super::*;

impl StoreReader {
    /// Rows of `samples`, by stream, round, app, rank, then as stored.
    pub fn samples(&self, select: Select) -> Result<Vec<SampleRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, app, rank, event_id, calls, subrs, incl_us, excl_us, calls_total,
                    subrs_total, incl_total_us, excl_total_us, dump_unix_ns, late
             FROM samples{clause} ORDER BY stream_id, round, app, rank, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(SampleRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                app: r.get(2)?,
                rank: r.get(3)?,
                event_id: id_of(r.get(4)?),
                calls: opt_u64(r, 5)?,
                subrs: opt_u64(r, 6)?,
                incl_us: r.get(7)?,
                excl_us: r.get(8)?,
                calls_total: opt_u64(r, 9)?,
                subrs_total: opt_u64(r, 10)?,
                incl_total_us: r.get(11)?,
                excl_total_us: r.get(12)?,
                dump_unix_ns: opt_u64(r, 13)?,
                late: r.get(14)?,
            })
        })
    }

    /// Rows of `counters`, by stream, round, app, rank, then as stored.
    pub fn counters(&self, select: Select) -> Result<Vec<CounterRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, app, rank, counter_id, value, total, dump_unix_ns, late
             FROM counters{clause} ORDER BY stream_id, round, app, rank, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(CounterRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                app: r.get(2)?,
                rank: r.get(3)?,
                counter_id: id_of(r.get(4)?),
                value: r.get(5)?,
                total: r.get(6)?,
                dump_unix_ns: opt_u64(r, 7)?,
                late: r.get(8)?,
            })
        })
    }

    /// Rows of `event_metrics`, by stream, round, app and rank, then as stored (event by event, each event's
    /// metrics in the profile's order).
    pub fn event_metrics(&self, select: Select) -> Result<Vec<EventMetricRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, app, rank, event_id, metric, value, total, late
             FROM event_metrics{clause} ORDER BY stream_id, round, app, rank, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(EventMetricRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                app: r.get(2)?,
                rank: r.get(3)?,
                event_id: id_of(r.get(4)?),
                metric: metric(r, 5)?,
                value: r.get(6)?,
                total: r.get(7)?,
                late: r.get(8)?,
            })
        })
    }

    /// Rows of `trace`, by stream, round, app, rank, thread, then in time order.
    pub fn trace(&self, select: Select) -> Result<Vec<TraceRow>, StoreError> {
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, app, rank, thread, unix_ns, kind, event_id, peer, bytes, late
             FROM trace{clause} ORDER BY stream_id, round, app, rank, thread, unix_ns, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(TraceRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                app: r.get(2)?,
                rank: r.get(3)?,
                thread: r.get(4)?,
                unix_ns: u64_at(r, 5)?,
                kind: r.get(6)?,
                event_id: r.get::<_, Option<i64>>(7)?.map(id_of),
                peer: r.get(8)?,
                bytes: opt_u64(r, 9)?,
                late: r.get(10)?,
            })
        })
    }

    /// Rows of `utilization`, by stream, round and bin, then in activity order as stored (0, "other", first).
    /// A store older than version 7 has none.
    pub fn utilization(&self, select: Select) -> Result<Vec<UtilizationRow>, StoreError> {
        if self.version < 7 {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, bin, start_unix_ns, activity_id, share, ranks, late
             FROM utilization{clause} ORDER BY stream_id, round, bin, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(UtilizationRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                bin: r.get(2)?,
                start_unix_ns: u64_at(r, 3)?,
                activity_id: id_of(r.get(4)?),
                share: r.get(5)?,
                ranks: r.get(6)?,
                late: r.get(7)?,
            })
        })
    }

    /// Rows of `outliers`, by stream and round, then as stored: group by group in the result's order (class ids
    /// as unsigned numbers), each by place in the group's top (0: the highest score). A store older than
    /// version 12 has none.
    pub fn outliers(&self, select: Select) -> Result<Vec<OutlierRow>, StoreError> {
        if self.version < 12 {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, class_id, position, app, rank, score, group_ranks, late
             FROM outliers{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(OutlierRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                class_id: id_of(r.get(2)?),
                position: r.get(3)?,
                app: r.get(4)?,
                rank: r.get(5)?,
                score: r.get(6)?,
                group_ranks: u64_at(r, 7)?,
                late: r.get(8)?,
            })
        })
    }

    /// Rows of `outlier_events`, by stream and round, then as stored: by group, the rank's place and the event's.
    /// A store older than version 12 has none.
    pub fn outlier_events(&self, select: Select) -> Result<Vec<OutlierEventRow>, StoreError> {
        if self.version < 12 {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, class_id, position, event_position, event_id, metric, value, mean, std,
                    contribution, late
             FROM outlier_events{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(OutlierEventRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                class_id: id_of(r.get(2)?),
                position: r.get(3)?,
                event_position: r.get(4)?,
                event_id: id_of(r.get(5)?),
                metric: metric(r, 6)?,
                value: r.get(7)?,
                mean: r.get(8)?,
                std: r.get(9)?,
                contribution: r.get(10)?,
                late: r.get(11)?,
            })
        })
    }

    /// Rows of `latency`, by stream and round, then by key and step. A store older than version 16 has none.
    pub fn latency(&self, select: Select) -> Result<Vec<LatencyRow>, StoreError> {
        if self.version < 16 {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, key_id, step, latency_ns, start_unix_ns, start_app, start_rank,
                    stop_unix_ns, stop_app, stop_rank, late
             FROM latency{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(LatencyRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                key_id: id_of(r.get(2)?),
                step: u64_at(r, 3)?,
                latency_ns: u64_at(r, 4)?,
                start_unix_ns: u64_at(r, 5)?,
                start_app: r.get(6)?,
                start_rank: r.get(7)?,
                stop_unix_ns: u64_at(r, 8)?,
                stop_app: r.get(9)?,
                stop_rank: r.get(10)?,
                late: r.get(11)?,
            })
        })
    }

    /// Rows of `latency_apps`, by stream and round, then by key, step and application. A store older than
    /// version 16 has none.
    pub fn latency_apps(&self, select: Select) -> Result<Vec<LatencyAppRow>, StoreError> {
        if self.version < 16 {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, key_id, step, app, ranks, transfer_us, compute_us, late
             FROM latency_apps{clause} ORDER BY stream_id, round, rowid"
        );
        self.rows(&sql, &values, |r| {
            Ok(LatencyAppRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                key_id: id_of(r.get(2)?),
                step: u64_at(r, 3)?,
                app: r.get(4)?,
                ranks: r.get(5)?,
                transfer_us: r.get(6)?,
                compute_us: r.get(7)?,
                late: r.get(8)?,
            })
        })
    }

    /// Rows of `node_samples`, by stream, round and node. A store older than version 8 has none.
    pub fn node_samples(&self, select: Select) -> Result<Vec<NodeSampleRow>, StoreError> {
        if self.version < 8 {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT {NODE_SAMPLE_COLUMNS} FROM node_samples{clause} ORDER BY stream_id, round, node_id, rowid"
        );
        self.rows(&sql, &values, node_sample_row)
    }

    /// Rows of `node_ranks`, by stream, round, node, then rank. A store older than version 8 has none.
    pub fn node_ranks(&self, select: Select) -> Result<Vec<NodeRanksRow>, StoreError> {
        if self.version < 8 {
            return Ok(Vec::new());
        }
        let (clause, values) = select.clause(true);
        let sql = format!(
            "SELECT stream_id, round, node_id, app, first_rank, last_rank, late
             FROM node_ranks{clause} ORDER BY stream_id, round, node_id, app, first_rank"
        );
        self.rows(&sql, &values, |r| {
            Ok(NodeRanksRow {
                stream_id: r.get(0)?,
                round: u64_at(r, 1)?,
                node_id: r.get(2)?,
                app: r.get(3)?,
                first_rank: r.get(4)?,
                last_rank: r.get(5)?,
                late: r.get(6)?,
            })
        })
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
            "SELECT {NODE_SAMPLE_COLUMNS} FROM node_samples WHERE rowid = (
                 SELECT ns.rowid FROM node_ranks nr
                 JOIN node_samples ns ON ns.stream_id = nr.stream_id AND ns.round = nr.round
                                      AND ns.node_id = nr.node_id AND ns.late = 0
                 WHERE nr.stream_id = ?1 AND nr.round = ?2 AND nr.app = ?3
                   AND ?4 BETWEEN nr.first_rank AND nr.last_rank AND nr.late = 0
                 ORDER BY ns.rowid LIMIT 1)"
        );
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut st| {
                st.query_row(
                    rusqlite::params![nodes_stream, sat(round), app, rank],
                    node_sample_row,
                )
                .optional()
            })
            .map_err(self.sqlite())
    }
}

/// The columns of `node_samples`, in [`NodeSampleRow`]'s order.
const NODE_SAMPLE_COLUMNS: &str = "stream_id, round, node_id, COALESCE(hostname, ''), COALESCE(ranks, ''), \
    sample_unix_ns, interval_ns, cpus, cpu_user_share, cpu_nice_share, cpu_system_share, cpu_idle_share, \
    cpu_iowait_share, cpu_irq_share, cpu_steal_share, mem_total_bytes, mem_available_bytes, mem_used_bytes, \
    mem_page_faults, mem_major_faults, net_rx_bytes, net_tx_bytes, net_interfaces, disk_read_bytes, \
    disk_write_bytes, disks, load_1m, load_5m, load_15m, load_runnable, load_threads, late";

fn node_sample_row(r: &Row<'_>) -> rusqlite::Result<NodeSampleRow> {
    Ok(NodeSampleRow {
        stream_id: r.get(0)?,
        round: u64_at(r, 1)?,
        node_id: r.get(2)?,
        hostname: r.get(3)?,
        ranks: r.get(4)?,
        sample_unix_ns: opt_u64(r, 5)?,
        interval_ns: opt_u64(r, 6)?,
        cpus: r.get(7)?,
        cpu_user_share: r.get(8)?,
        cpu_nice_share: r.get(9)?,
        cpu_system_share: r.get(10)?,
        cpu_idle_share: r.get(11)?,
        cpu_iowait_share: r.get(12)?,
        cpu_irq_share: r.get(13)?,
        cpu_steal_share: r.get(14)?,
        mem_total_bytes: opt_u64(r, 15)?,
        mem_available_bytes: opt_u64(r, 16)?,
        mem_used_bytes: opt_u64(r, 17)?,
        mem_page_faults: opt_u64(r, 18)?,
        mem_major_faults: opt_u64(r, 19)?,
        net_rx_bytes: opt_u64(r, 20)?,
        net_tx_bytes: opt_u64(r, 21)?,
        net_interfaces: r.get(22)?,
        disk_read_bytes: opt_u64(r, 23)?,
        disk_write_bytes: opt_u64(r, 24)?,
        disks: r.get(25)?,
        load_1m: r.get(26)?,
        load_5m: r.get(27)?,
        load_15m: r.get(28)?,
        load_runnable: r.get(29)?,
        load_threads: r.get(30)?,
        late: r.get(31)?,
    })
}
