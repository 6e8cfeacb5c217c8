//! Canopy's run store: one SQLite file per run that the front-end writes and everyone else reads. This crate is
//! the only one that knows the schema: the migrations ([`SCHEMA_VERSION`]), the words enumerations are stored
//! as ([`Word`]), the writer thread ([`Writer`]) and the typed reader ([`StoreReader`]).

#![forbid(unsafe_code)]

mod checkpoint;
mod error;
#[cfg(feature = "writer")]
mod gap;
mod kafka_log;
#[cfg(feature = "writer")]
mod partial_log;
mod profiles;
mod read;
mod rounds;
mod rows;
mod schema;
mod sql;
mod stat_rows;
mod store;
mod table_row;
mod tables;
mod training;
mod words;
#[cfg(feature = "writer")]
mod writer;

pub use error::StoreError;
pub use kafka_log::{KafkaCounts, KafkaLog, Published};
pub use profiles::PROFILE_BATCH_TYPE;
pub use read::{EXAMPLE_QUERY, RANK_NODE_QUERY, Select, StoreReader, Table};
pub use rounds::{AppRecord, MissingCounts, RoundRecord};
pub use rows::{
    AppCoverageTotal, ClassRow, ClusterRow, CounterRow, EventMetricRow, HistogramRow, LateArrival,
    LatencyAppRow, LatencyRow, NodeChange, NodeRanksRow, NodeRow, NodeSampleRow, OutlierEventRow, OutlierRow,
    QuantileRow, RankTotal, ReductionRow, ResultRow, RoundAppRow, RoundCursor, RoundRow, SampleRow, StatRow,
    StoreSummary, StoredRound, StreamRow, TraceRow, UtilizationRow,
};
pub use schema::SCHEMA_VERSION;
pub use store::{Collision, ENDED, LATEST, Payload, Rows, Store};
pub use table_row::{Column, Kind, TableRow, Value};
pub use tables::{is_tabulated, ranges_text};
pub use training::{Candidate, DEFAULT_TRAINING_ROUNDS, Training, TrainingQuery, TrainingSpec};
pub use words::{StreamState, Word, metric_unit};
#[cfg(feature = "writer")]
pub use writer::{Round, RunSummary, Writer, WriterThread};
