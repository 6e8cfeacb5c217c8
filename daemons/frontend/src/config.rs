//! The front-end's configuration: its keys, their defaults, and the checks `validate` and the start run.

use std::path::PathBuf;

use canopy_proto::v1::{StreamSpec, SyncMode};
use canopy_runtime::common::CommonConfig;
use canopy_runtime::config::{CheckConfig, ConfigIssue, check_addr};
use serde::{Deserialize, Serialize};

use crate::{kafka, selection};

/// The most events per stream and application the metrics endpoint serves series for.
const MAX_METRICS_TOP_EVENTS: usize = 1000;

/// The front-end's configuration (`[frontend]` in canopy.toml, `CANOPY_FRONTEND_*`, and a `--kebab-case` flag
/// per key).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, clap::Args)]
#[serde(default)]
pub struct FrontendConfig {
    /// The keys every daemon has.
    #[serde(flatten, skip_deserializing)]
    #[command(flatten)]
    pub common: CommonConfig,
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
    /// Milliseconds a shutdown waits for the tree to deliver what it holds. A tree that drains ends at once (0.01 to
    /// 1.9 s measured with 4,096 ranks on 64 agents and busy loops on both cores); the default is longer than a
    /// filter call may run (`filter_call_timeout_ms`, 10 s), so a slow but healthy last call is not cut short.
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
    /// Continue the latest run's store under `out` if the front-end that wrote it did not end it (it crashed or
    /// was killed): the same file, the same stream ids. A run that ended is never continued.
    #[arg(long, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub resume: bool,
    /// Continue an unfinished run only if its store was written less than this many seconds ago; an older one
    /// has no tree left to continue it (nodes keep what they sent for 300 s), and a tree started now is new.
    #[arg(long)]
    pub resume_within_s: u64,
    /// Written once serving: `addr=HOST:PORT`, `store=PATH` and (with `metrics_listen`) `metrics=HOST:PORT` lines.
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
            common: CommonConfig {
                node_id: "frontend".into(),
                ..CommonConfig::default()
            },
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
            drain_timeout_ms: 12_000,
            max_rounds_in_flight: 64,
            subscriber_buffer: 1024,
            metrics_top_events: 10,
            subscriber_drain_ms: 10_000,
            ready_file: None,
            max_connections: canopy_runtime::net::DEFAULT_MAX_CONNECTIONS,
            store_retry_mb: 0,
            token_file: None,
            resume: true,
            resume_within_s: 300,
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

impl canopy_runtime::daemon::DaemonConfig for FrontendConfig {
    fn common(&self) -> &CommonConfig {
        &self.common
    }
}

impl CheckConfig for FrontendConfig {
    fn check(&self) -> Result<(), ConfigIssue> {
        self.common.check()?;
        self.check_modules()?;
        check_addr("listen", &self.listen)?;
        canopy_runtime::outdir::check_out_dir(&self.out).map_err(|e| ConfigIssue::new("out", e))?;
        if self.common.insecure && self.token_file.is_some() {
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
        self.check_streams()?;
        self.check_selection()?;
        self.check_rounds()?;
        if self.out.as_os_str().is_empty() {
            return Err(ConfigIssue::new("out", "must name a directory"));
        }
        kafka::check(self)?;
        // Last: a wrong value elsewhere is the more useful message.
        self.common.tls().check(&[("listen", &self.listen)])?;
        Ok(())
    }

    fn common_mut(&mut self) -> Option<&mut CommonConfig> {
        Some(&mut self.common)
    }
}

impl FrontendConfig {
    /// Checks that `modules` names measurement modules every rank can run.
    fn check_modules(&self) -> Result<(), ConfigIssue> {
        let modules = canopy_proto::v1::Options {
            modules: self.modules.clone(),
            ..Default::default()
        };
        if let Err(e) = canopy_core::options::Measure::from_options(&modules) {
            return Err(ConfigIssue::new("modules", e.to_string()));
        }
        Ok(())
    }

    /// Checks that every stream's filter loads, runs in the sync mode and takes its parameters, and that every
    /// filter given parameters runs as a stream.
    fn check_streams(&self) -> Result<(), ConfigIssue> {
        // Every stream's filter must load here, as it will on every node: a typo fails now, not mid-run.
        let filters = canopy_core::plugin::filters_from(&self.common.filter_path);
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
        Ok(())
    }

    /// Checks that the metric selection's change threshold and rounds are in their ranges.
    fn check_selection(&self) -> Result<(), ConfigIssue> {
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
        Ok(())
    }

    /// Checks that the streams' round timeout and sync mode, the rounds in flight, the subscribers' buffers and
    /// the metrics' events per stream have allowed values.
    fn check_rounds(&self) -> Result<(), ConfigIssue> {
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
        Ok(())
    }
}

impl FrontendConfig {
    /// The streams the configuration opens at start, one per filter of `streams`, their ids not given yet.
    pub fn configured_streams(&self) -> Vec<StreamSpec> {
        let sync = parse_sync_mode(&self.sync_mode).unwrap_or(SyncMode::WaitForAll);
        self.streams
            .iter()
            .map(|filter| StreamSpec {
                stream_id: 0,
                name: filter.clone(),
                filter: filter.clone(),
                params: self.stream_params.get(filter).cloned().unwrap_or_default(),
                ranks: String::new(),
                sync_mode: sync as i32,
                timeout_ms: self.stream_timeout_ms,
                stages: Vec::new(),
                // The root sets it.
                first_round: None,
            })
            .collect()
    }
}

pub(crate) fn parse_sync_mode(s: &str) -> Result<SyncMode, String> {
    match s {
        "wait_for_all" => Ok(SyncMode::WaitForAll),
        "dont_wait" => Ok(SyncMode::DontWait),
        _ => Err(format!("{s:?} is not a sync mode (wait_for_all, dont_wait)")),
    }
}
