//! Canopy's front-end: the root of the tree. It opens the streams, finalizes every round, writes the results
//! into the run's SQLite store, and serves `canopy.v1.Tree`, gRPC health and server reflection on one port.

#![forbid(unsafe_code)]

pub mod api;
pub mod app_metrics;
pub mod auto_detail;
pub mod error;
pub mod kafka;
pub mod reflection;
pub mod resume;
pub mod selection;
pub mod state;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use canopy_core::node::{
    Node, NodeConfig, NodeError, RoleConfig, RootHandle, RootOptions, RootSink, RoundResult, StreamState, Up,
};
use canopy_core::transport::TreeService;
use canopy_proto::v1::{NodeKind, StreamSpec, SyncMode, up_message};
use canopy_runtime::config::{CheckConfig, ConfigIssue, LogFormat, check_addr};
use canopy_store::{RoundRecord, Store, StoreError, Writer, WriterThread};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use state::State;

pub use canopy_store::RunSummary;

/// The front-end's configuration (`[frontend]` in canopy.toml, `CANOPY_FRONTEND_*`, and a `--kebab-case` flag
/// per key).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct FrontendConfig {
    /// This node's id.
    #[arg(long)]
    pub node_id: String,
    /// The one port for the tree, health and reflection, ip:port.
    #[arg(long)]
    pub listen: String,
    /// Directory of the run stores (one SQLite file per run, `latest.sqlite` links the newest).
    #[arg(long)]
    pub out: PathBuf,
    /// Filters to open as streams at start, one stream each; comma-separated as a flag.
    #[arg(long, value_delimiter = ',')]
    pub streams: Vec<String>,
    #[command(flatten)]
    pub stream_params: StreamParams,
    /// Milliseconds a round waits for missing children before it closes partial.
    #[arg(long)]
    pub stream_timeout_ms: u32,
    /// wait_for_all or dont_wait.
    #[arg(long)]
    pub sync_mode: String,
    /// Start collection once this many ranks are attached (0: as soon as any are).
    #[arg(long)]
    pub expect_ranks: u32,
    /// Milliseconds after the first rank attached that collection starts even if announced ranks are missing
    /// (they count as absent in every round); 0: wait for them all.
    #[arg(long)]
    pub start_timeout_ms: u64,
    /// Exit once every child has finished (the run ends with its application).
    #[arg(long, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub exit_on_fin: bool,
    /// The measurement modules every rank runs from the start (profile, trace, utilization, null), and whenever the options
    /// in force name none; empty: each rank's own CANOPY_MODULES. `canopy ctl set --modules` overrides them.
    #[arg(long, value_delimiter = ',')]
    pub modules: Vec<String>,
    /// Number rounds by time window from the start (Options.time_rounds): every rank dumps each period on the
    /// tree's clock, so applications that iterate at different rates, or attach mid-run, line up. `canopy ctl set
    /// --time-rounds` overrides it.
    #[arg(long, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub time_rounds: bool,
    /// Metric selection (seed 004) by itself every this many rounds of the open latency stream, over the
    /// metrics of the open stats stream (0: only on request, `canopy ctl select`).
    #[arg(long)]
    pub select_every_rounds: u64,
    /// Metric selection by itself when the moving average of the end-to-end latency (over 10 rounds) moves by
    /// this fraction from its value at the previous selection (0.5 for 50%; 0: never).
    #[arg(long)]
    pub select_on_change: f64,
    /// Apply what a selection that ran by itself chooses: each application reports only its chosen metrics.
    #[arg(long, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub select_apply: bool,
    /// The latest rounds a selection that ran by itself learns from.
    #[arg(long)]
    pub select_rounds: u32,
    /// Milliseconds a shutdown waits for the tree to deliver what it holds.
    #[arg(long)]
    pub drain_timeout_ms: u64,
    /// Rounds that may be open at once before children are made to wait.
    #[arg(long)]
    pub max_rounds_in_flight: u64,
    /// Results a Subscribe client may fall behind by before it misses the oldest (it is told how many).
    #[arg(long)]
    pub subscriber_buffer: usize,
    /// On the metrics endpoint, the application's series: each stats or histogram stream's top this many events
    /// per application (mean, min, max and quantiles across the ranks of the latest round); 0 for each stream's
    /// latest round and coverage only. Never a series per rank.
    #[arg(long)]
    pub metrics_top_events: usize,
    /// Milliseconds the front-end, its run over, waits for Subscribe clients to take the results they are behind
    /// by before it exits (0: it does not wait).
    #[arg(long)]
    pub subscriber_drain_ms: u64,
    /// Serve Prometheus metrics (`/metrics`) and a health check (`/health`) over HTTP at this ip:port (port 0
    /// picks a free one). Empty: no endpoint. Plain HTTP and read-only: bind it to a management network.
    #[arg(long)]
    pub metrics_listen: String,
    /// Log lines as text or as one JSON object each.
    #[arg(long, value_enum)]
    pub log_format: LogFormat,
    /// Threads that run the daemon's tasks. One (the default) hands a message from task to task on the same
    /// thread, with no wake-up of another; more let a node with many children or clients use more cores.
    #[arg(long)]
    pub worker_threads: usize,
    /// The memory this daemon may use, in MiB: the buffers that grow with load (the copies of what it sent up,
    /// kept until the root has them; at the front-end, rounds its store could not write yet) each take a quarter
    /// at most, and a resident size past it is logged.
    #[arg(long)]
    pub memory_budget_mb: u64,
    /// Directories searched for filter plugins (libcanopy_filter_<name>.so), in order; colon-separated as a
    /// flag. Empty: the directory of the running executable, PREFIX/lib/canopy/filters and
    /// PREFIX/lib64/canopy/filters beside its bin/, then /usr/lib/canopy/filters and /usr/lib64/canopy/filters.
    #[arg(long, value_delimiter = ':')]
    pub filter_path: Vec<PathBuf>,
    /// Milliseconds one call into a contained filter may run before the watchdog fails its stream (and only it);
    /// an inline call past it is logged as holding the node.
    #[arg(long)]
    pub filter_call_timeout_ms: u64,
    /// Filters run inline, on the node's own task; every other one runs contained, on a thread per stream, where
    /// a hang fails only its stream. Inline saves a hand-off between threads per call, but a hang holds the node.
    /// Default: the filters Canopy ships. Comma-separated as a flag; empty: every filter contained.
    #[arg(long, value_delimiter = ',')]
    pub inline_filters: Vec<String>,
    /// Continue the latest run's store under `out` if the front-end that wrote it did not end it (it crashed or
    /// was killed): the same file, the same stream ids. A run that ended is never continued.
    #[arg(long, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub resume: bool,
    /// Continue an unfinished run only if its store was written less than this many seconds ago; an older one
    /// has no tree left to continue it (nodes keep what they sent for 300 s), and a tree started now is new.
    #[arg(long)]
    pub resume_within_s: u64,
    /// Written once serving: `addr=HOST:PORT` and `store=PATH` lines.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Connections this node's port keeps open at once; more are closed as they come.
    #[arg(long)]
    pub max_connections: usize,
    /// MiB of results kept in memory while the store cannot write (a full or failing disk), retried every
    /// second. Past it the oldest rounds keep only their coverage: their rows, written once the store writes
    /// again, count their ranks as `store_failed`. 0 (the default): a quarter of memory_budget_mb.
    #[arg(long)]
    pub store_retry_mb: usize,
    /// Bearer tokens API clients may present (`authorization: Bearer TOKEN`): one `ROLE TOKEN` per line, role
    /// read or control; not readable by other users.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA every certificate of the tree chains to (`canopy certs` makes one).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// PEM file of this node's certificate (its names include canopy-node).
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM file of this node's private key (not readable by other users).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Plaintext instead of TLS: allowed on loopback addresses only.
    #[arg(long)]
    pub insecure: bool,
    /// Kafka brokers (host:port, comma-separated as a flag) to publish every stored round to, each exactly once
    /// (docs/kafka.md). Empty: no export.
    #[arg(long, value_delimiter = ',')]
    pub kafka_brokers: Vec<String>,
    /// Each stream's rounds go to the topic `<prefix>.<stream name>`.
    #[arg(long)]
    pub kafka_topic_prefix: String,
    /// Replicas of a topic the front-end creates (a topic that exists is used as it is).
    #[arg(long)]
    pub kafka_replication_factor: i16,
    /// PEM file of the CA the brokers' certificates chain to: TLS to the brokers. Unset: plaintext.
    #[arg(long)]
    pub kafka_tls_ca: Option<PathBuf>,
    /// SASL to the brokers: plain, scram-sha-256 or scram-sha-512. Empty: none.
    #[arg(long)]
    pub kafka_sasl_mechanism: String,
    /// The SASL user.
    #[arg(long)]
    pub kafka_sasl_username: String,
    /// A file holding the SASL password (not readable by other users).
    #[arg(long)]
    pub kafka_sasl_password_file: Option<PathBuf>,
    /// Milliseconds the front-end, its run over, goes on publishing what the brokers have not acknowledged
    /// before it exits (what is left is published later with `canopy export`).
    #[arg(long)]
    pub kafka_drain_ms: u64,
}

/// Parameters of the streams' filters, as JSON text by filter name (`classify = '{"scheme": "all"}'`); as a
/// flag, `--stream-params NAME=JSON` once per filter. Its own type because clap derives no flag for a map.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StreamParams(pub std::collections::BTreeMap<String, String>);

impl std::ops::Deref for StreamParams {
    type Target = std::collections::BTreeMap<String, String>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl FromIterator<(String, String)> for StreamParams {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(pairs: I) -> Self {
        Self(pairs.into_iter().collect())
    }
}

impl clap::FromArgMatches for StreamParams {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut params = Self::default();
        params.update_from_arg_matches(matches)?;
        Ok(params)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        if let Some(pairs) = matches.get_many::<(String, String)>("stream_params") {
            *self = pairs.cloned().collect();
        }
        Ok(())
    }
}

impl clap::Args for StreamParams {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        // The id is the config key, so the flag's value lands on `stream_params` and errors name the flag.
        cmd.arg(
            clap::Arg::new("stream_params")
                .long("stream-params")
                .value_name("NAME=JSON")
                .action(clap::ArgAction::Append)
                .value_parser(|pair: &str| {
                    let (name, json) = pair.split_once('=').unwrap_or((pair, ""));
                    Ok::<_, std::convert::Infallible>((name.to_string(), json.to_string()))
                })
                .help("A stream filter's parameters, NAME=JSON (repeat for several filters)"),
        )
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl Default for FrontendConfig {
    fn default() -> Self {
        Self {
            node_id: "frontend".into(),
            listen: "0.0.0.0:7400".into(),
            out: "canopy-out".into(),
            streams: vec!["stats".into()],
            stream_params: Default::default(),
            stream_timeout_ms: 1000,
            sync_mode: "wait_for_all".into(),
            expect_ranks: 0,
            start_timeout_ms: 30_000,
            exit_on_fin: false,
            modules: Vec::new(),
            time_rounds: false,
            select_every_rounds: 0,
            select_on_change: 0.0,
            select_apply: false,
            select_rounds: selection::DEFAULT_ROUNDS,
            drain_timeout_ms: 3000,
            max_rounds_in_flight: 64,
            subscriber_buffer: 1024,
            metrics_top_events: 10,
            subscriber_drain_ms: 10_000,
            metrics_listen: String::new(),
            log_format: LogFormat::Text,
            worker_threads: canopy_runtime::daemon::DEFAULT_WORKER_THREADS,
            memory_budget_mb: canopy_runtime::memory::DEFAULT_MEMORY_BUDGET_MB,
            filter_path: Vec::new(),
            filter_call_timeout_ms: canopy_core::node::DEFAULT_FILTER_CALL_TIMEOUT.as_millis() as u64,
            inline_filters: canopy_core::plugin::BUNDLED_FILTERS
                .iter()
                .map(|f| f.to_string())
                .collect(),
            ready_file: None,
            max_connections: canopy_runtime::net::DEFAULT_MAX_CONNECTIONS,
            store_retry_mb: 0,
            token_file: None,
            resume: true,
            resume_within_s: 300,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            insecure: false,
            kafka_brokers: Vec::new(),
            kafka_topic_prefix: kafka::DEFAULT_TOPIC_PREFIX.into(),
            kafka_replication_factor: 1,
            kafka_tls_ca: None,
            kafka_sasl_mechanism: String::new(),
            kafka_sasl_username: String::new(),
            kafka_sasl_password_file: None,
            kafka_drain_ms: 10_000,
        }
    }
}

impl FrontendConfig {
    /// The TLS keys, as the runtime checks and loads them.
    pub fn tls(&self) -> canopy_runtime::tls::TlsFiles {
        canopy_runtime::tls::TlsFiles {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            insecure: self.insecure,
        }
    }
}

impl canopy_runtime::daemon::DaemonConfig for FrontendConfig {
    fn log_format(&self) -> LogFormat {
        self.log_format
    }
    fn node_id(&self) -> &str {
        &self.node_id
    }
    fn worker_threads(&self) -> usize {
        self.worker_threads
    }
    fn memory_budget_mb(&self) -> u64 {
        self.memory_budget_mb
    }
}

impl CheckConfig for FrontendConfig {
    fn check(&self) -> Result<(), ConfigIssue> {
        canopy_runtime::daemon::check_worker_threads(self.worker_threads)?;
        canopy_runtime::memory::check(self.memory_budget_mb)?;
        let modules = canopy_proto::v1::Options {
            modules: self.modules.clone(),
            ..Default::default()
        };
        if let Err(e) = canopy_core::options::Measure::from_options(&modules) {
            return Err(ConfigIssue::new("modules", e.to_string()));
        }
        if !(10..=3_600_000).contains(&self.filter_call_timeout_ms) {
            return Err(ConfigIssue::new(
                "filter_call_timeout_ms",
                "must be between 10 and 3600000 (an hour)",
            ));
        }
        check_addr("listen", &self.listen)?;
        canopy_runtime::outdir::check_out_dir(&self.out).map_err(|e| ConfigIssue::new("out", e))?;
        if !self.metrics_listen.is_empty() {
            check_addr("metrics_listen", &self.metrics_listen)?;
        }
        if self.insecure && self.token_file.is_some() {
            return Err(ConfigIssue::new(
                "token_file",
                "bearer tokens need TLS: on a plaintext port every caller is admitted",
            ));
        }
        if self.store_retry_mb > 65_536 {
            return Err(ConfigIssue::new(
                "store_retry_mb",
                "must be at most 65536 (MiB); 0 is a quarter of memory_budget_mb",
            ));
        }
        if self.max_connections == 0 {
            return Err(ConfigIssue::new("max_connections", "must be at least 1"));
        }
        // Every stream's filter must load here, as it will on every node: a typo fails now, not mid-run.
        let filters = canopy_core::plugin::filters_from(&self.filter_path);
        let dont_wait = parse_sync_mode(&self.sync_mode) == Ok(SyncMode::DontWait);
        for (i, name) in self.streams.iter().enumerate() {
            let info = filters
                .info(name)
                .map_err(|e| ConfigIssue::new(format!("streams.{i}"), e.to_string()))?;
            if dont_wait && info.phases > 1 {
                return Err(ConfigIssue::new(
                    "sync_mode",
                    format!(
                        "filter {name} has {} phases and runs only in wait_for_all streams",
                        info.phases
                    ),
                ));
            }
            // Parameters are checked by the filter itself, as the root will create it.
            let params = self.stream_params.get(name).map(String::as_str).unwrap_or("");
            if let Err(e) = canopy_core::filter::FilterFactory::create(
                &*filters,
                name,
                params,
                canopy_core::filter::Level::Root,
            ) {
                return Err(ConfigIssue::new(format!("stream_params.{name}"), e.to_string()));
            }
        }
        for name in self.stream_params.keys() {
            if !self.streams.contains(name) {
                return Err(ConfigIssue::new(
                    format!("stream_params.{name}"),
                    format!("no stream runs filter {name:?}"),
                ));
            }
        }
        if !(0.0..=100.0).contains(&self.select_on_change) {
            return Err(ConfigIssue::new(
                "select_on_change",
                "must be a fraction between 0 (never) and 100",
            ));
        }
        if !(selection::MIN_ROUNDS..=selection::MAX_ROUNDS).contains(&self.select_rounds) {
            return Err(ConfigIssue::new(
                "select_rounds",
                format!(
                    "must be between {} (the check validates on a fifth of them) and {}",
                    selection::MIN_ROUNDS,
                    selection::MAX_ROUNDS
                ),
            ));
        }
        if self.stream_timeout_ms == 0 {
            return Err(ConfigIssue::new("stream_timeout_ms", "must be at least 1"));
        }
        parse_sync_mode(&self.sync_mode).map_err(|m| ConfigIssue::new("sync_mode", m))?;
        if self.max_rounds_in_flight == 0 {
            return Err(ConfigIssue::new("max_rounds_in_flight", "must be at least 1"));
        }
        if self.subscriber_buffer == 0 {
            return Err(ConfigIssue::new("subscriber_buffer", "must be at least 1"));
        }
        if self.metrics_top_events > MAX_METRICS_TOP_EVENTS {
            return Err(ConfigIssue::new(
                "metrics_top_events",
                format!("must be at most {MAX_METRICS_TOP_EVENTS} (series per stream and application)"),
            ));
        }
        if self.out.as_os_str().is_empty() {
            return Err(ConfigIssue::new("out", "must name a directory"));
        }
        kafka::check(self)?;
        // Last: a wrong value elsewhere is the more useful message.
        self.tls().check(&[("listen", &self.listen)])?;
        Ok(())
    }
}

fn parse_sync_mode(s: &str) -> Result<SyncMode, String> {
    match s {
        "wait_for_all" => Ok(SyncMode::WaitForAll),
        "dont_wait" => Ok(SyncMode::DontWait),
        _ => Err(format!("{s:?} is not a sync mode (wait_for_all, dont_wait)")),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("server failed: {0}")]
    Server(#[from] tonic::transport::Error),
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("TLS: {0}")]
    Tls(#[from] canopy_runtime::tls::TlsError),
    #[error("token file: {0}")]
    Tokens(#[from] canopy_runtime::auth::TokenFileError),
    #[error("Kafka export: {0}")]
    Kafka(String),
}

impl canopy_runtime::daemon::IsRefusal for FrontendError {
    fn is_refusal(&self) -> bool {
        false
    }
}

/// A finalized result on its way through the store to live subscribers: stored from its payload, then passed
/// on whole once committed.
struct Committed(Arc<RoundResult>);

impl AsRef<[u8]> for Committed {
    fn as_ref(&self) -> &[u8] {
        &self.0.payload
    }
}

/// The root's way up and its sink: everything goes to the store's writer thread, in order.
#[derive(Clone)]
struct StoreUp {
    writer: Writer<Committed>,
    /// Tells what each stream's results are, so standard results become tables.
    filters: Arc<canopy_core::plugin::PluginFilters>,
    /// What the API serves live: results, node status, result types.
    shared: Arc<State>,
    /// The application's series on the metrics endpoint: a stream that ends takes its own with it.
    app_metrics: Arc<app_metrics::AppMetrics>,
}

impl Up for StoreUp {
    async fn send(&mut self, msg: up_message::Msg) {
        match msg {
            up_message::Msg::Names(d) => {
                let names: Vec<(u64, String)> = d.names.into_iter().map(|n| (n.id, n.name)).collect();
                self.shared.add_names(&names);
                self.writer.names(names).await;
            }
            up_message::Msg::NodeEvent(ev) => self.writer.node(ev).await,
            up_message::Msg::Fin(f) => self.writer.meta("rounds_end", f.rounds_end.to_string()).await,
            up_message::Msg::Status(st) => {
                tracing::debug!(node = %st.node_id, closed = st.rounds_closed, partial = st.rounds_partial,
                    late = st.late_arrivals, malformed = st.malformed, "node status");
                self.shared.set_status(st);
            }
            up_message::Msg::StreamError(e) => {
                tracing::error!(stream = e.stream_id, node = %e.node_id, "stream error: {}", e.reason);
            }
            // The root has no parent to ask for rounds (it never sends a Want) and sets a stream's first round
            // itself (it never passes a StreamReady on).
            up_message::Msg::Envelope(_)
            | up_message::Msg::Hello(_)
            | up_message::Msg::Want(_)
            | up_message::Msg::StreamReady(_) => {}
        }
    }
}

impl RootSink for StoreUp {
    fn result(&mut self, result: RoundResult) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let record = RoundRecord {
                stream_id: result.stream.stream_id,
                stream_name: result.stream.name.clone(),
                round: result.round,
                covered: result.coverage.covered,
                expected: result.coverage.expected,
                missing: result
                    .coverage
                    .missing
                    .iter()
                    .map(|m| (m.reason(), m.ranks))
                    .collect(),
                first_dump_unix_ns: result.first_dump_unix_ns,
                // Stamped by the writer as it stores the round.
                closed_unix_ns: 0,
                apps: result
                    .coverage
                    .apps
                    .iter()
                    .map(|a| canopy_store::AppRecord {
                        app: a.app.clone(),
                        covered: a.covered,
                        expected: a.expected,
                        missing: a.missing.iter().map(|m| (m.reason(), m.ranks)).collect(),
                    })
                    .collect(),
                unreachable: result
                    .coverage
                    .unreachable
                    .iter()
                    .map(|u| (u.node.clone(), u.ranks))
                    .collect(),
            };
            let round = canopy_store::Round {
                record,
                phase: result.phase,
                late: result.late,
                result_type: self.shared.result_type(result.stream.stream_id),
                payload: Committed(Arc::new(result)),
            };
            self.writer.round(round).await;
        })
    }

    fn stream_state<'a>(
        &'a mut self,
        spec: &'a StreamSpec,
        state: StreamState,
        failure: Option<&'a str>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            // The stream's result type is known from its filter once it opens; the API and the store take it
            // here.
            let result_type = match state {
                canopy_store::StreamState::Open => {
                    self.filters.info(&spec.filter).ok().map(|info| info.result_type)
                }
                _ => None,
            };
            if let Some(t) = &result_type {
                self.shared.set_result_type(spec.stream_id, t.clone());
            }
            if state.is_ended() {
                self.app_metrics.forget(spec.stream_id);
            }
            let failure = failure.map(str::to_string);
            self.writer
                .stream(spec.clone(), state, failure, result_type)
                .await;
        })
    }

    fn flush(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(summary) = self.writer.flush().await {
                tracing::info!(
                    rounds = summary.rounds,
                    full = summary.full_rounds,
                    late = summary.late_packets,
                    bytes = summary.result_bytes,
                    errors = summary.store_errors,
                    store_failed = summary.store_failed_rounds,
                    waiting = summary.backlog,
                    "store flushed"
                );
            }
        })
    }
}

/// A front-end bound to its port, its store created and its root node built, ready to run.
pub struct Frontend {
    config: FrontendConfig,
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    store_path: PathBuf,
    node: Node<StoreUp>,
    handles: canopy_core::node::NodeHandles,
    shared: Arc<State>,
    filters: Arc<canopy_core::plugin::PluginFilters>,
    writer: WriterThread,
    tls: Option<canopy_runtime::tls::Tls>,
    gate: canopy_runtime::auth::Gate,
    /// The streams of the configuration, opened at start.
    opened: Vec<StreamSpec>,
    /// The run's id, which the tree's nodes carry.
    run: canopy_core::run::RunId,
    /// Set when continuing a crashed run: the first child tells it from a new tree.
    resumed: Option<canopy_core::run::ResumeGate>,
    /// The application's latest rounds, for the metrics endpoint.
    app_metrics: Arc<app_metrics::AppMetrics>,
    /// Notified as each round is committed (the Kafka export reads the store from there).
    committed: Arc<tokio::sync::Notify>,
}

/// How a front-end's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Drained on `shutdown`, or at the application's end.
    Run,
    /// It was continuing a crashed run and a node of a new tree attached first: that run is ended, and a
    /// front-end bound now on the same `out` starts a new one.
    ForNewTree(String),
}

impl Frontend {
    pub async fn bind(config: FrontendConfig) -> Result<Self, FrontendError> {
        canopy_runtime::telemetry::set_node("frontend", &config.node_id);
        // Credentials and the port first: a front-end that cannot serve leaves no empty run behind.
        let tls = config.tls().load()?;
        let gate = match (&tls, &config.token_file) {
            (None, _) => canopy_runtime::auth::Gate::open(),
            (Some(_), None) => canopy_runtime::auth::Gate::new(Default::default()),
            (Some(_), Some(path)) => {
                canopy_runtime::auth::Gate::new(canopy_runtime::auth::Tokens::load(path)?)
            }
        };
        let listener = canopy_runtime::daemon::bind(&config.listen).await?;
        // The run an earlier front-end on this `out` did not end (it died) goes on in the same store.
        let prior = match config.resume {
            true => resume::unfinished_run(&config.out, Duration::from_secs(config.resume_within_s))?,
            false => None,
        };
        let mut store = match &prior {
            Some(run) => {
                tracing::info!(store = %run.path.display(), "continuing the run an earlier front-end did not end");
                Store::open(&run.path)?
            }
            None => Store::create(&config.out)?,
        };
        let run_id = match prior.as_ref().and_then(|p| p.run_id.clone()) {
            Some(id) => id,
            None => {
                let id = canopy_core::run::new_run_id();
                store.set_meta(resume::RUN_ID, &id)?;
                id
            }
        };
        tracing::info!(run = %run_id, "the tree's nodes carry this run id");
        let addr = listener.local_addr()?;
        let store_path = store.path().to_path_buf();
        store.set_meta("frontend_addr", &addr.to_string())?;
        store.set_meta("node_id", &config.node_id)?;
        store.put_node(&canopy_proto::v1::NodeEvent {
            node_id: config.node_id.clone(),
            kind: NodeKind::Frontend as i32,
            state: canopy_proto::v1::NodeState::Attached as i32,
            address: addr.to_string(),
            ..Default::default()
        })?;
        let sync = parse_sync_mode(&config.sync_mode).unwrap_or(SyncMode::WaitForAll);
        let configured = config
            .streams
            .iter()
            .map(|filter| StreamSpec {
                stream_id: 0,
                name: filter.clone(),
                filter: filter.clone(),
                params: config.stream_params.get(filter).cloned().unwrap_or_default(),
                ranks: String::new(),
                sync_mode: sync as i32,
                timeout_ms: config.stream_timeout_ms,
                stages: Vec::new(),
                // The root sets it.
                first_round: None,
            })
            .collect();
        let plan = resume::plan(configured, prior.as_ref());
        let opened = plan.open.clone();
        let ids: Vec<String> = plan.config_ids.iter().map(u32::to_string).collect();
        store.set_meta(resume::CONFIG_STREAMS, &ids.join(","))?;
        if let Some(prior) = &prior {
            for spec in &plan.close {
                store.put_stream(spec, canopy_store::StreamState::Closed, None, None)?;
            }
            let n = prior.restarts + 1;
            store.set_meta(resume::RESTARTS, &n.to_string())?;
            store.set_meta(&format!("restart_{n}"), &plan.changes.join("; "))?;
            tracing::info!(restart = n, "streams: {}", plan.changes.join("; "));
        }
        let first_free_stream_id = prior
            .as_ref()
            .and_then(|p| p.streams.iter().map(|s| s.stream_id).max())
            .unwrap_or(0)
            .max(plan.open.iter().map(|s| s.stream_id).max().unwrap_or(0))
            + 1;
        let filters = canopy_core::plugin::filters_from(&config.filter_path);
        let shared = State::new(config.subscriber_buffer);
        // Subscribers see a result once it is committed: one that reads the store and then follows the live
        // results misses nothing in between.
        let retry_bytes = match config.store_retry_mb {
            0 => canopy_runtime::memory::share(config.memory_budget_mb),
            mb => mb << 20,
        };
        let app_metrics = Arc::new(app_metrics::AppMetrics::new(config.metrics_top_events));
        let committed = Arc::new(tokio::sync::Notify::new());
        let (store_tx, writer) = Writer::spawn_with(store, 1024, retry_bytes, {
            let (shared, app_metrics, committed) = (shared.clone(), app_metrics.clone(), committed.clone());
            move |Committed(r)| {
                app_metrics.note(&r, &shared.result_type(r.stream.stream_id));
                let _ = shared.live.send(r);
                committed.notify_one();
            }
        })?;
        let up = StoreUp {
            writer: store_tx,
            filters: filters.clone(),
            shared: shared.clone(),
            app_metrics: app_metrics.clone(),
        };
        let node_config = NodeConfig {
            node_id: config.node_id.clone(),
            kind: NodeKind::Frontend,
            filters: filters.clone(),
            max_rounds_in_flight: config.max_rounds_in_flight,
            role: RoleConfig::Root(RootOptions {
                expect_ranks: config.expect_ranks,
                start_timeout: (config.start_timeout_ms > 0)
                    .then(|| Duration::from_millis(config.start_timeout_ms)),
                streams: opened.clone(),
                closed_below: plan.closed_below,
                // A restart waits for the ranks its run expected, as long as the start would for announced ones.
                resume_ranks: prior.as_ref().map_or(0, |p| p.expected_ranks),
                resume_wait: Duration::from_millis(
                    config.start_timeout_ms.max(u64::from(config.stream_timeout_ms)),
                ),
                first_free_stream_id,
                exit_on_fin: config.exit_on_fin,
                drain_timeout: Duration::from_millis(config.drain_timeout_ms),
                sink: Box::new(up.clone()),
            }),
            status_interval: STATUS_INTERVAL,
        };
        let (mut node, handles) = Node::new(node_config, up);
        node.set_filter_call_timeout(Duration::from_millis(config.filter_call_timeout_ms));
        node.set_inline_filters(&config.inline_filters);
        Ok(Self {
            config,
            listener,
            addr,
            store_path,
            node,
            handles,
            shared,
            filters,
            writer,
            tls,
            gate,
            opened,
            app_metrics,
            committed,
            resumed: prior
                .is_some()
                .then(|| canopy_core::run::ResumeGate::new(run_id.clone())),
            run: canopy_core::run::RunId::of_root(run_id),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The SQLite file this run writes.
    pub fn store_path(&self) -> PathBuf {
        self.store_path.clone()
    }

    /// Controls the tree from the root: start, stop, open and close streams.
    pub fn handle(&self) -> RootHandle {
        RootHandle::new(self.handles.inputs.clone())
    }

    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<Ended, FrontendError> {
        let Frontend {
            config,
            listener,
            addr,
            store_path,
            node,
            handles,
            shared,
            filters,
            writer,
            tls,
            gate,
            opened,
            run,
            resumed,
            app_metrics,
            committed,
        } = self;
        let export = kafka::Export::start(&config, &store_path, committed)?;
        let known = known_filters(&filters);
        let (reflection, reflection_v1, reflection_alpha) = reflection::services(&known)?;
        let triggers = selection::Triggers {
            every_rounds: config.select_every_rounds,
            on_change: config.select_on_change,
            apply: config.select_apply,
            rounds: config.select_rounds,
        };
        if triggers.any() {
            selection::spawn(
                shared.clone(),
                RootHandle::new(handles.inputs.clone()),
                store_path.clone(),
                triggers,
            );
        }
        let api = api::FrontendApi {
            root: RootHandle::new(handles.inputs.clone()),
            shared: shared.clone(),
            filters: filters.clone(),
            store: store_path.clone(),
            reflection,
        };
        let api = canopy_proto::v1::frontend_server::FrontendServer::new(api)
            .max_encoding_message_size(canopy_proto::MAX_MESSAGE_BYTES);
        let tree = TreeService::new(
            config.node_id.clone(),
            handles.inputs.clone(),
            handles.window.clone(),
        )
        .with_run(run);
        let tree = match &resumed {
            Some(gate) => tree.resuming(gate.clone()),
            None => tree,
        };
        let (health_reporter, health) = tonic_health::server::health_reporter();
        health_reporter
            .set_serving::<canopy_proto::v1::tree_server::TreeServer<TreeService>>()
            .await;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let limits = canopy_runtime::net::ListenLimits {
            max_connections: config.max_connections,
            ..Default::default()
        };
        let mut utilization = false;
        for spec in &opened {
            utilization |= shared.stream_filter(spec.stream_id, &spec.filter, true);
        }
        if !config.modules.is_empty() || utilization || config.time_rounds {
            // The modules every rank runs: options in force from the start, told to every child that attaches.
            // Queued before the server takes its first child, so the root records them before any attach or
            // Start: a child hears them first, and no rank dumps round 0 without them.
            shared.set_default_modules(config.modules.clone());
            shared.set_default_time_rounds(config.time_rounds);
            let options = shared.set_options(canopy_proto::v1::Options::default());
            RootHandle::new(handles.inputs.clone()).options(options).await;
        }
        let (incoming, connections) = canopy_runtime::net::incoming(listener, limits);
        // A client certificate is asked for but not required: API clients may present a bearer token instead.
        let server = tokio::spawn(
            canopy_core::transport::server(tls.map(|t| t.server(false)), gate)?
                .add_service(tree.into_server())
                .add_service(api)
                .add_service(health)
                .add_service(reflection_v1)
                .add_service(reflection_alpha)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stop_rx.await;
                }),
        );
        let mut ready = format!("addr={addr}\nstore={}\n", store_path.display());
        if !config.metrics_listen.is_empty() {
            let names = {
                let shared = shared.clone();
                move || shared.names_map()
            };
            let at = canopy_core::metrics::spawn(
                &config.metrics_listen,
                &config.node_id,
                handles.snapshot.clone(),
                std::iter::once(app_metrics.collector(names))
                    .chain(export.as_ref().map(kafka::Export::collector))
                    .collect(),
            )
            .await?;
            ready.push_str(&format!("metrics={at}\n"));
        }
        tokio::spawn(canopy_runtime::notify::watchdog(
            handles.snapshot.clone(),
            STATUS_INTERVAL,
        ));
        canopy_runtime::config::write_ready_file(config.ready_file.as_ref(), &ready)?;
        tracing::info!(%addr, store = %store_path.display(), "front-end serving");
        canopy_runtime::notify::ready(&format!("serving on {addr}, store {}", store_path.display()));
        drop(handles);
        let new_tree = async {
            match &resumed {
                Some(gate) => gate.new_tree().await,
                None => std::future::pending().await,
            }
        };
        let stop = async {
            tokio::select! {
                () = shutdown => {}
                node = new_tree => tracing::warn!(node = %node,
                    "a node of a new tree attached first while this front-end was continuing a crashed run: \
                     that run ends here, and a new run starts in a new store"),
            }
        };
        let result = node.run(stop).await;
        let new_tree = resumed
            .as_ref()
            .and_then(canopy_core::run::ResumeGate::new_tree_node);
        // Every result is out: subscriptions send what they hold and end with OK before the server stops. A
        // client behind by more than the connection's buffers still gets the run's last rounds; one that stopped
        // reading costs at most the subscriber drain.
        shared.end();
        let drain = Duration::from_millis(config.subscriber_drain_ms);
        shared
            .subscriptions_sent(tokio::time::Instant::now() + drain)
            .await;
        health_reporter
            .set_not_serving::<canopy_proto::v1::tree_server::TreeServer<TreeService>>()
            .await;
        let _ = stop_tx.send(());
        let stopped_by = tokio::time::Instant::now() + SERVER_STOP;
        let _ = tokio::time::timeout_at(stopped_by, server).await;
        // A connection the server closed lingers until its client has read the last of it and closed it too.
        connections.closed_by(stopped_by).await;
        // The node's way up (and so the writer's queue) is dropped with the node: the writer drains and ends.
        let _ = tokio::task::spawn_blocking(move || writer.join()).await;
        if result.is_ok() {
            // Ended here: a front-end started on this `out` later begins a new run.
            let mut store = Store::open(&store_path)?;
            if let Some(node) = &new_tree {
                store.set_meta(ENDED_BY, &format!("a new tree attached first ({node})"))?;
            }
            store.end_run(canopy_core::node::unix_ns() as i64)?;
        }
        // Every round is stored (with the rows the end of the run adds): the export sends what is left.
        if let Some(export) = export {
            export.finish().await;
            // Its connections closed: the store leaves WAL mode, as a store the front-end alone wrote does.
            drop(Store::open(&store_path)?);
        }
        tracing::info!(store = %store_path.display(), "front-end stopped");
        result?;
        Ok(new_tree.map_or(Ended::Run, Ended::ForNewTree))
    }
}

/// How long the front-end, its run over and its subscriptions sent, waits for its server to stop and its clients
/// to close their connections.
const SERVER_STOP: Duration = Duration::from_secs(2);

/// How often the root reports its figures (to the API's topology, the metrics endpoint and the watchdog).
const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// Every filter on the filter path at start, with the descriptors it exports: server reflection knows every
/// service on the port and these filters' result types, so `grpcurl list`, `describe` and typed JSON of any
/// result need no proto files (a filter loaded later is added as its stream opens).
fn known_filters(filters: &canopy_core::plugin::PluginFilters) -> Vec<(String, Vec<u8>)> {
    use canopy_core::filter::FilterFactory;
    filters
        .names()
        .into_iter()
        .filter_map(|name| {
            let info = filters.info(&name).ok()?;
            Some((name, info.descriptors))
        })
        .collect()
}

/// The most events per stream and application the metrics endpoint serves series for.
const MAX_METRICS_TOP_EVENTS: usize = 1000;

/// `meta` key: why a run ended other than by its front-end's shutdown or the application's end.
pub const ENDED_BY: &str = "ended_by";

/// Runs a front-end until `shutdown` completes (then drains the tree) or, with `exit_on_fin`, the run ends. A
/// crashed run it was continuing that turns out to face a new tree ends, and a new run starts on the same port.
pub async fn run(
    config: FrontendConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), FrontendError> {
    use futures::FutureExt;
    let shutdown = shutdown.shared();
    loop {
        match Frontend::bind(config.clone())
            .await?
            .run(shutdown.clone())
            .await?
        {
            Ended::Run => return Ok(()),
            Ended::ForNewTree(node) => {
                tracing::info!(%node, "starting a new run for the new tree")
            }
        }
    }
}
