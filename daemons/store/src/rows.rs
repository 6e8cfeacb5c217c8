//! The rows the [`StoreReader`](crate::StoreReader) returns: one type per table or query, with enums typed and
//! counts unsigned. A table's own row type is declared with [`table_row!`], its columns beside its fields.

use canopy_proto::filters::v1::Metric;
use canopy_proto::v1::{NodeKind, NodeState, SyncMode};

use crate::rounds::MissingCounts;
use crate::table_row::{Update, table_row};

mod rounds;

use crate::words::StreamState;
pub use rounds::{RoundAppRow, RoundRow};

table_row! {
    /// A stream as the store recorded it, with counts of what it stored.
    #[derive(Debug, Clone, PartialEq)]
    pub struct StreamRow in Streams order "stream_id" key ["stream_id"] {
        pub stream_id: u32 = "stream_id",
        pub name: String = "name" { export: "stream" },
        pub filter: String = "filter",
        /// The filter's parameters, as JSON text.
        pub params: String = "params",
        pub sync_mode: SyncMode = "sync_mode",
        pub timeout_ms: u32 = "timeout_ms",
        /// `None` for a state this version does not know.
        pub state: Option<StreamState> = "state",
        pub failure: Option<String> = "failure",
        pub opened_unix_ns: Option<u64> = "opened_unix_ns" { update: Update::Keep },
        /// When it ended: the first time it was stored ended, cleared if it is opened again.
        pub closed_unix_ns: Option<u64> = "closed_unix_ns" {
            update: Update::Sql(
                "CASE WHEN excluded.closed_unix_ns IS NULL THEN NULL
                 ELSE coalesce(streams.closed_unix_ns, excluded.closed_unix_ns) END"
            ),
        },
        /// The protobuf type of its results, once known (and kept once known).
        pub result_type: Option<String> = "result_type" { update: Update::Fill },
        /// The ranks that feed it (empty: all).
        pub ranks: String = "ranks",
    } and {
        /// Later rank sets, (from round, ranks; empty: none), by round: a detail stream moved to other ranks.
        pub stages: Vec<(u64, String)>,
        /// Rounds stored.
        pub rounds: u64,
        /// Rounds stored at full coverage.
        pub full_rounds: u64,
        /// Packets that arrived after their round was stored.
        pub late_packets: u64,
        /// The highest round stored, if any.
        pub last_round: Option<u64>,
    }
}

/// One application's rank-rounds over the rounds a query picks (`round_apps` summed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppCoverageTotal {
    pub app: String,
    pub covered: u64,
    pub expected: u64,
    /// Rank-rounds missing per reason, the reasons with some only, in the proto's order.
    pub missing: Vec<(canopy_proto::v1::MissingReason, u64)>,
}

/// Where [`StoreReader::new_rounds`] left off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundCursor(pub(crate) i64);

/// A round as a replay sends it: its coverage and its result as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRound {
    pub round: u64,
    pub covered: u32,
    pub expected: u32,
    pub missing: MissingCounts,
    /// Each application's part of the coverage (`round_apps`), by application name.
    pub apps: Vec<RoundAppRow>,
    /// A passthrough round's `ProfileBatch` as it was stored; any other stream's final result.
    pub payload: Vec<u8>,
}

impl StoredRound {
    /// The round's coverage, in all and per application, as the tree sent it: the one conversion from a stored
    /// round. (The nodes named unreachable are kept as text, in `rounds.unreachable_nodes`, not here.)
    pub fn coverage(&self) -> canopy_proto::v1::Coverage {
        use canopy_proto::v1::{AppCoverage, Coverage, Missing};
        let missing_of = |missing: &MissingCounts| -> Vec<Missing> {
            missing
                .iter()
                .map(|(reason, ranks)| Missing {
                    reason: reason as i32,
                    ranks,
                })
                .collect()
        };
        Coverage {
            covered: self.covered,
            expected: self.expected,
            missing: missing_of(&self.missing),
            apps: self
                .apps
                .iter()
                .map(|a| AppCoverage {
                    app: a.app.clone(),
                    covered: a.covered,
                    expected: a.expected,
                    missing: missing_of(&a.missing),
                })
                .collect(),
            unreachable: vec![],
        }
    }

    /// The round as a Subscribe client receives it ([`canopy_proto::v1::RoundUpdate::of`], as a live round is).
    /// `replayed` says it was read from the store rather than sent live.
    pub fn update(self, stream: &StreamRow, replayed: bool) -> canopy_proto::v1::RoundUpdate {
        let coverage = self.coverage();
        canopy_proto::v1::RoundUpdate::of(
            canopy_proto::StreamOf {
                id: stream.stream_id,
                name: &stream.name,
                filter: &stream.filter,
                result_type: stream.result_type.as_deref().unwrap_or_default(),
            },
            canopy_proto::RoundOf {
                round: self.round,
                phase: 0,
                coverage,
                payload: self.payload,
                late: false,
            },
            replayed,
        )
    }
}

/// One rank's event over a passthrough stream's rounds (its rows of `samples` that arrived with their round,
/// summed): the per-rank view of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RankTotal {
    pub app: String,
    pub rank: u32,
    pub event_id: u64,
    pub calls: u64,
    pub incl_us: f64,
    pub excl_us: f64,
}

table_row! {
    /// One row of `samples`: a rank's event in a passthrough round. Metrics the rank's options left out are `None`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct SampleRow in Samples order "stream_id, round, app, rank, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub app: String = "app",
        pub rank: u32 = "rank",
        pub event_id: u64 = "event_id" as Event,
        pub calls: Option<u64> = "calls",
        pub subrs: Option<u64> = "subrs",
        pub incl_us: Option<f64> = "incl_us",
        pub excl_us: Option<f64> = "excl_us",
        pub calls_total: Option<u64> = "calls_total",
        pub subrs_total: Option<u64> = "subrs_total",
        pub incl_total_us: Option<f64> = "incl_total_us",
        pub excl_total_us: Option<f64> = "excl_total_us",
        pub dump_unix_ns: Option<u64> = "dump_unix_ns",
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `trace`: one event of a rank's trace, shipped with its profile of a passthrough round.
    #[derive(Debug, Clone, PartialEq)]
    pub struct TraceRow in Trace order "stream_id, round, app, rank, thread, unix_ns, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub app: String = "app",
        pub rank: u32 = "rank",
        pub thread: u32 = "thread",
        pub unix_ns: u64 = "unix_ns",
        /// begin, end, send, idle_begin or idle_end.
        pub kind: String = "kind",
        /// The activity, for begin and end.
        pub event_id: Option<u64> = "event_id" as Event,
        /// The destination rank and the bytes, for a send.
        pub peer: Option<u32> = "peer",
        pub bytes: Option<u64> = "bytes",
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `utilization`: an activity's average share of one bin of a utilization round.
    #[derive(Debug, Clone, PartialEq)]
    pub struct UtilizationRow in Utilization order "stream_id, round, bin, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        /// The bin's index in the round's period.
        pub bin: u32 = "bin",
        /// When the bin begins, in nanoseconds since the Unix epoch.
        pub start_unix_ns: u64 = "start_unix_ns",
        /// The activity's event id; 0 for "other", the activities below the threshold together.
        pub activity_id: u64 = "activity_id" as Event,
        /// The average share of the bin, 0 to 250 (the whole bin).
        pub share: u32 = "share" { export: "share_of_250" },
        /// The ranks the average is over: those whose profile covers the bin.
        pub ranks: u32 = "ranks",
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `outliers`: a rank among the top of its group (all ranks, or a functional class) in one round.
    /// Rows are read group by group in the result's order, each by place in the group's top.
    #[derive(Debug, Clone, PartialEq)]
    pub struct OutlierRow in Outliers order "stream_id, round, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        /// 0 for all ranks; otherwise the functional class (classify's class id).
        pub class_id: u64 = "class_id" as Id,
        /// The rank's place in the group's top: 0 has the highest score.
        pub position: u32 = "position",
        pub app: String = "app",
        pub rank: u32 = "rank",
        /// The sum over the rank's events of its distance from the mean in standard deviations (weighted or not).
        pub score: f64 = "score" { export: "score_std_devs" },
        /// How many ranks the group scored.
        pub group_ranks: u64 = "group_ranks",
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `outlier_events`: an event that weighs in a top rank's score.
    #[derive(Debug, Clone, PartialEq)]
    pub struct OutlierEventRow in OutlierEvents order "stream_id, round, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub class_id: u64 = "class_id" as Id,
        /// The rank's place in the group's top (its `outliers` row).
        pub position: u32 = "position",
        /// The event's place among the rank's events: 0 weighs most.
        pub event_position: u32 = "event_position",
        pub event_id: u64 = "event_id" as Event,
        pub metric: Metric = "metric",
        pub value: f64 = "value",
        pub mean: f64 = "mean",
        pub std: f64 = "std",
        pub contribution: f64 = "contribution" { export: "contribution_std_devs" },
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `node_samples`: a node's sample of one round of a node stream (the `nodes` filter). What its
    /// agent did not sample is `None`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct NodeSampleRow in NodeSamples order "stream_id, round, node_id, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub node_id: String = "node_id",
        pub hostname: String = "hostname",
        /// The ranks the node served in the round, as compact ranges (`app:0-7,9`).
        pub ranks: String = "ranks",
        /// When the sample was read, and the interval it covers (ending then), in nanoseconds.
        pub sample_unix_ns: Option<u64> = "sample_unix_ns",
        pub interval_ns: Option<u64> = "interval_ns",
        pub cpus: Option<u32> = "cpus",
        /// Each CPU state's share (0 to 1) of all the node's CPU time over the interval.
        pub cpu_user_share: Option<f64> = "cpu_user_share",
        pub cpu_nice_share: Option<f64> = "cpu_nice_share",
        pub cpu_system_share: Option<f64> = "cpu_system_share",
        pub cpu_idle_share: Option<f64> = "cpu_idle_share",
        pub cpu_iowait_share: Option<f64> = "cpu_iowait_share",
        pub cpu_irq_share: Option<f64> = "cpu_irq_share",
        pub cpu_steal_share: Option<f64> = "cpu_steal_share",
        pub mem_total_bytes: Option<u64> = "mem_total_bytes",
        pub mem_available_bytes: Option<u64> = "mem_available_bytes",
        pub mem_used_bytes: Option<u64> = "mem_used_bytes",
        /// Page faults over the interval, all and major.
        pub mem_page_faults: Option<u64> = "mem_page_faults",
        pub mem_major_faults: Option<u64> = "mem_major_faults",
        /// Bytes over the interval, every interface but loopback.
        pub net_rx_bytes: Option<u64> = "net_rx_bytes",
        pub net_tx_bytes: Option<u64> = "net_tx_bytes",
        pub net_interfaces: Option<u32> = "net_interfaces",
        /// Bytes over the interval, whole disks.
        pub disk_read_bytes: Option<u64> = "disk_read_bytes",
        pub disk_write_bytes: Option<u64> = "disk_write_bytes",
        pub disks: Option<u32> = "disks",
        pub load_1m: Option<f64> = "load_1m",
        pub load_5m: Option<f64> = "load_5m",
        pub load_15m: Option<f64> = "load_15m",
        pub load_runnable: Option<u32> = "load_runnable",
        pub load_threads: Option<u32> = "load_threads",
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `node_ranks`: a range of the ranks a node served in a round of a node stream.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct NodeRanksRow in NodeRanks order "stream_id, round, node_id, app, first_rank" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub node_id: String = "node_id",
        pub app: String = "app",
        pub first_rank: u32 = "first_rank",
        /// Inclusive.
        pub last_rank: u32 = "last_rank",
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `counters`: a rank's counter in a passthrough round.
    #[derive(Debug, Clone, PartialEq)]
    pub struct CounterRow in Counters order "stream_id, round, app, rank, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub app: String = "app",
        pub rank: u32 = "rank",
        pub counter_id: u64 = "counter_id" as Event,
        pub value: Option<f64> = "value",
        pub total: Option<f64> = "total",
        pub dump_unix_ns: Option<u64> = "dump_unix_ns",
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `event_metrics`: one per-event metric of one event of one rank's passthrough profile. Rows are
    /// read by rank, then event by event, each event's metrics in the profile's order.
    #[derive(Debug, Clone, PartialEq)]
    pub struct EventMetricRow in EventMetrics order "stream_id, round, app, rank, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub app: String = "app",
        pub rank: u32 = "rank",
        pub event_id: u64 = "event_id" as Event,
        /// A per-event metric (`Metric::PageFaultsExclusive`, `Metric::HeapAtEntry`, ...).
        pub metric: Metric = "metric",
        /// This round's value.
        pub value: Option<f64> = "value",
        /// Since the rank started.
        pub total: Option<f64> = "total",
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `results`: a filter's result as it encoded it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct ResultRow in Results order "stream_id, round, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub phase: u32 = "phase",
        pub payload: Vec<u8> = "payload",
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `stats_quantiles`: a quantile of the `stats` row of the same key.
    #[derive(Debug, Clone, PartialEq)]
    pub struct QuantileRow in StatsQuantiles order "stream_id, round, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub class_id: Option<u64> = "class_id" as Id,
        /// The application of the `stats` row the quantile belongs to (see [`StatRow::app`]).
        pub app: Option<String> = "app" { since: 15 },
        /// The event's (or counter's) id.
        pub id: u64 = "id" as Event { export: "event_id" },
        pub metric: Metric = "metric",
        /// In [0, 1].
        pub q: f64 = "q",
        pub value: Option<f64> = "value",
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `stats`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct StatRow in Stats order "stream_id, round, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub class_id: Option<u64> = "class_id" as Id,
        /// The application the row stands for, when the stats filter breaks its rows down by application
        /// (`by_app`); `None` for a row over every application (and every row of a store before version 15).
        pub app: Option<String> = "app" { since: 15 },
        /// The event's (or counter's) id.
        pub id: u64 = "id" as Event { export: "event_id" },
        pub metric: Metric = "metric",
        /// Ranks.
        pub count: u64 = "count" { export: "count_ranks" },
        pub mean: Option<f64> = "mean",
        pub std: Option<f64> = "std",
        pub min: Option<f64> = "min",
        pub max: Option<f64> = "max",
        pub min_app: Option<String> = "min_app",
        pub min_rank: Option<u32> = "min_rank",
        pub max_app: Option<String> = "max_app",
        pub max_rank: Option<u32> = "max_rank",
        pub late: bool = "late",
    }
}

table_row! {
    /// One bin of `histograms`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct HistogramRow in Histograms order "stream_id, round, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub class_id: Option<u64> = "class_id" as Id,
        /// The application the histogram stands for; `None` for every application.
        pub app: Option<String> = "app" { since: 17 },
        pub id: u64 = "id" as Event { export: "event_id" },
        pub metric: Metric = "metric",
        pub bin: u32 = "bin",
        pub lo: Option<f64> = "lo",
        pub hi: Option<f64> = "hi",
        /// Ranks in the bin.
        pub count: u64 = "count" { export: "count_ranks" },
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `classes`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct ClassRow in Classes order "stream_id, round, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub class_id: u64 = "class_id" as Id,
        pub size: u64 = "size" { export: "size_ranks" },
        /// Compact ranges, `app:0-7,9`.
        pub ranks: String = "ranks",
        pub example_event: Option<String> = "example_event",
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `clusters` (the kmeans filter), with its ranks from `cluster_ranks` as compact ranges.
    #[derive(Debug, Clone, PartialEq)]
    pub struct ClusterRow in Clusters order "stream_id, round, cluster, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub cluster: u32 = "cluster",
        pub size: u64 = "size" { export: "size_ranks" },
        /// The representative rank; `None` for an empty cluster.
        pub representative_app: Option<String> = "representative_app",
        pub representative_rank: Option<u32> = "representative_rank",
        pub rms: f64 = "rms",
        pub max_distance: f64 = "max_distance",
        pub sum_squares: f64 = "sum_squares",
        pub late: bool = "late",
    } and {
        /// Compact ranges, `app:0-7,9`.
        pub ranks: String,
    }
}

impl ClusterRow {
    /// The representative rank (app, rank); `None` for an empty cluster.
    pub fn representative(&self) -> Option<(&str, u32)> {
        self.representative_app.as_deref().zip(self.representative_rank)
    }
}

table_row! {
    /// One row of `latency` (the latency filter): a step completed in the round.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct LatencyRow in Latency order "stream_id, round, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub key_id: u64 = "key_id" as Event,
        pub step: u64 = "step",
        pub latency_ns: u64 = "latency_ns",
        pub start_unix_ns: u64 = "start_unix_ns",
        pub start_app: String = "start_app",
        pub start_rank: u32 = "start_rank",
        pub stop_unix_ns: u64 = "stop_unix_ns",
        pub stop_app: String = "stop_app",
        pub stop_rank: u32 = "stop_rank",
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `latency_apps`: an application's part in a step.
    #[derive(Debug, Clone, PartialEq)]
    pub struct LatencyAppRow in LatencyApps order "stream_id, round, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub key_id: u64 = "key_id" as Event,
        pub step: u64 = "step",
        pub app: String = "app",
        pub ranks: u32 = "ranks",
        pub transfer_us: f64 = "transfer_us",
        pub compute_us: f64 = "compute_us",
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `reductions`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct ReductionRow in Reductions order "stream_id, round, rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub raw_bytes: u64 = "raw_bytes",
        pub result_bytes: u64 = "result_bytes",
        pub reduction_factor: Option<f64> = "reduction_factor",
        pub classes: Option<u64> = "classes",
        pub late: bool = "late",
    }
}

table_row! {
    /// One row of `late_arrivals`: a packet that reached the root after its round was stored.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct LateArrival in LateArrivals order "rowid" {
        pub stream_id: u32 = "stream_id" as Stream,
        pub round: u64 = "round",
        pub ranks: u32 = "ranks",
        pub bytes: u64 = "bytes",
        pub arrived_unix_ns: Option<u64> = "arrived_unix_ns",
    }
}

/// One row of `node_history`: a node's parent and state from a moment on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeChange {
    pub parent: Option<String>,
    pub state: NodeState,
    pub ranks_below: u32,
    pub detail: Option<String>,
    pub at_unix_ns: Option<u64>,
}

table_row! {
    /// One row of `nodes`: a node of the tree and its last known state. An event that leaves kind, parent or
    /// address unset (a parent reporting a lost child knows little more than its id) keeps what an earlier event
    /// said.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct NodeRow in Nodes order "node_id" key ["node_id"] {
        pub node_id: String = "node_id",
        pub kind: NodeKind = "kind" {
            update: Update::Sql("CASE WHEN excluded.kind = 'unspecified' THEN nodes.kind ELSE excluded.kind END"),
        },
        pub parent: Option<String> = "parent" { update: Update::Fill },
        pub state: NodeState = "state",
        pub ranks_below: u32 = "ranks_below",
        pub address: Option<String> = "address" { update: Update::Fill },
        pub detail: Option<String> = "detail",
        pub first_seen_unix_ns: Option<u64> = "first_seen_unix_ns" { update: Update::Keep },
        pub updated_unix_ns: Option<u64> = "updated_unix_ns",
    }
}

/// The run at a glance, as `canopy up` prints it when the run ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreSummary {
    pub rounds: u64,
    pub streams: u64,
    pub full_rounds: u64,
    /// Rank-rounds covered, over all rounds.
    pub covered: u64,
    /// Rank-rounds expected, over all rounds.
    pub expected: u64,
    pub result_bytes: u64,
    pub late_packets: u64,
}

impl StoreSummary {
    /// Covered rank-rounds as a percentage of the expected ones (0 when nothing was expected).
    pub fn coverage_pct(&self) -> f64 {
        if self.expected == 0 {
            0.0
        } else {
            100.0 * self.covered as f64 / self.expected as f64
        }
    }
}
