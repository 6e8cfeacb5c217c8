//! Which rows a query reads ([`Select`]: a stream, a span of rounds, late or not) and the tables whose rows can be
//! counted or selected that way ([`Table`]).

use super::*;

/// Which rows of a table a query returns: all, or those of one stream, from one round on, late or not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Select {
    stream_id: Option<u32>,
    from_round: Option<u64>,
    to_round: Option<u64>,
    late: Option<bool>,
}

impl Select {
    /// Every row.
    pub fn all() -> Select {
        Select::default()
    }

    /// Only the rows of this stream.
    pub fn stream(mut self, stream_id: u32) -> Select {
        self.stream_id = Some(stream_id);
        self
    }

    /// Only the rows of this round and later ones.
    pub fn from_round(mut self, round: u64) -> Select {
        self.from_round = Some(round);
        self
    }

    /// Only the rows of this round and earlier ones.
    pub fn to_round(mut self, round: u64) -> Select {
        self.to_round = Some(round);
        self
    }

    /// Only the rows whose data arrived after its round was stored (`true`), or with it (`false`). Tables
    /// without a `late` column (`rounds`, `late_arrivals`) ignore it.
    pub fn late(mut self, late: bool) -> Select {
        self.late = Some(late);
        self
    }

    /// ` WHERE ...` (or nothing) and its parameters.
    pub(super) fn clause(&self, has_late: bool) -> (String, Vec<i64>) {
        let mut terms = Vec::new();
        let mut values = Vec::new();
        if let Some(id) = self.stream_id {
            values.push(i64::from(id));
            terms.push(format!("stream_id = ?{}", values.len()));
        }
        if let Some(round) = self.from_round {
            values.push(sat(round));
            terms.push(format!("round >= ?{}", values.len()));
        }
        if let Some(round) = self.to_round {
            values.push(sat(round));
            terms.push(format!("round <= ?{}", values.len()));
        }
        if let (true, Some(late)) = (has_late, self.late) {
            values.push(i64::from(late));
            terms.push(format!("late = ?{}", values.len()));
        }
        if terms.is_empty() {
            (String::new(), values)
        } else {
            (format!(" WHERE {}", terms.join(" AND ")), values)
        }
    }
}

/// A table of the store, for counting its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Rounds,
    RoundApps,
    Samples,
    Counters,
    EventMetrics,
    Trace,
    Utilization,
    Outliers,
    OutlierEvents,
    NodeSamples,
    NodeRanks,
    Results,
    ProfileBatches,
    Stats,
    StatsQuantiles,
    Histograms,
    Classes,
    Clusters,
    Latency,
    LatencyApps,
    Reductions,
    LateArrivals,
    Names,
    NameCollisions,
    Nodes,
    Streams,
}

impl Table {
    /// Its name in SQL.
    pub fn name(self) -> &'static str {
        match self {
            Table::Rounds => "rounds",
            Table::RoundApps => "round_apps",
            Table::Samples => "samples",
            Table::Counters => "counters",
            Table::EventMetrics => "event_metrics",
            Table::Trace => "trace",
            Table::Utilization => "utilization",
            Table::Outliers => "outliers",
            Table::OutlierEvents => "outlier_events",
            Table::NodeSamples => "node_samples",
            Table::NodeRanks => "node_ranks",
            Table::Results => "results",
            Table::ProfileBatches => "profile_batches",
            Table::Stats => "stats",
            Table::StatsQuantiles => "stats_quantiles",
            Table::Histograms => "histograms",
            Table::Classes => "classes",
            Table::Clusters => "clusters",
            Table::Latency => "latency",
            Table::LatencyApps => "latency_apps",
            Table::Reductions => "reductions",
            Table::LateArrivals => "late_arrivals",
            Table::Names => "names",
            Table::NameCollisions => "name_collisions",
            Table::Nodes => "nodes",
            Table::Streams => "streams",
        }
    }

    pub(crate) fn has_late(self) -> bool {
        matches!(
            self,
            Table::Samples
                | Table::Counters
                | Table::EventMetrics
                | Table::Trace
                | Table::Utilization
                | Table::Outliers
                | Table::OutlierEvents
                | Table::NodeSamples
                | Table::NodeRanks
                | Table::Results
                | Table::ProfileBatches
                | Table::Stats
                | Table::StatsQuantiles
                | Table::Histograms
                | Table::Classes
                | Table::Clusters
                | Table::Latency
                | Table::LatencyApps
                | Table::Reductions
        )
    }

    /// The schema version that added the table: an older store has no rows of it (see also
    /// [`STATS_APP_SINCE`] for a column added later).
    pub(crate) fn since(self) -> u32 {
        match self {
            Table::ProfileBatches => 3,
            Table::Trace => 6,
            Table::Utilization => 7,
            Table::NodeSamples | Table::NodeRanks => 8,
            Table::EventMetrics => 9,
            Table::StatsQuantiles => 13,
            Table::Outliers | Table::OutlierEvents => 12,
            Table::Clusters => 14,
            Table::Latency | Table::LatencyApps => 16,
            Table::RoundApps => 17,
            _ => 1,
        }
    }

    pub(super) fn has_rounds(self) -> bool {
        !matches!(
            self,
            Table::Names | Table::NameCollisions | Table::Nodes | Table::Streams
        )
    }
}
