//! The `canopy` commands that talk to a running front-end: `streams`, `ctl`, `topology` (live); their text
//! tables are in [`crate::render`].

use std::collections::HashMap;

use anyhow::Context;
use canopy_proto::v1::frontend_client::FrontendClient;
use canopy_proto::v1::{
    CloseStreamRequest, ControlRequest, CreateStreamRequest, ListStreamsRequest, NodeKind, NodeState,
    StreamInfo, SyncMode, TopologyNode, TopologyRequest, control_request,
};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage};
use tonic::transport::Channel;

/// Where the front-end listens.
#[derive(clap::Args, Debug, Clone)]
pub struct Target {
    /// The front-end's address.
    #[arg(
        long,
        env = "CANOPY_FRONTEND",
        default_value = "127.0.0.1:7400",
        global = true
    )]
    pub frontend: String,
    /// Print JSON (one object per line) instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// The directory holding ca.pem, client.pem and client.key (`canopy up` writes OUT/tls, `canopy certs`
    /// makes one). Default: ./canopy-out/tls if it exists.
    #[arg(long, env = "CANOPY_TLS_DIR", global = true, value_name = "DIR")]
    pub tls_dir: Option<std::path::PathBuf>,
    /// Plaintext, for a front-end started with --insecure (loopback only).
    #[arg(long, global = true, conflicts_with = "tls_dir")]
    pub insecure: bool,
}

impl Target {
    /// The client's TLS settings: `None` for plaintext.
    fn tls(&self) -> anyhow::Result<Option<tonic::transport::ClientTlsConfig>> {
        if self.insecure {
            anyhow::ensure!(
                canopy_runtime::tls::is_loopback(&self.frontend),
                "--insecure is for loopback addresses only, and the front-end is {}",
                self.frontend
            );
            return Ok(None);
        }
        let dir = match &self.tls_dir {
            Some(dir) => dir.clone(),
            None => {
                let dir = std::path::PathBuf::from("canopy-out/tls");
                anyhow::ensure!(
                    dir.join("client.pem").is_file(),
                    "no client certificate: give --tls-dir DIR (`canopy up` writes OUT/tls; `canopy certs` makes \
                     one) or --insecure for a plaintext front-end on loopback"
                );
                dir
            }
        };
        let tls = canopy_runtime::tls::TlsFiles::in_dir(&dir, "client")
            .load()?
            .context("a TLS directory gives TLS")?;
        Ok(Some(tls.client()))
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum StreamsCmd {
    /// Every stream with its state, filter and counts.
    List,
    /// Open a stream on the whole tree.
    Open {
        /// The filter plugin's name (stats, histogram, classify, passthrough, ...).
        filter: String,
        #[arg(long)]
        name: Option<String>,
        /// The filter's parameters as JSON.
        #[arg(long, default_value = "")]
        params: String,
        /// Milliseconds a round waits for missing children (default 1000).
        #[arg(long, default_value_t = 0)]
        timeout_ms: u32,
        /// Merge each arrival at once instead of waiting for every child.
        #[arg(long)]
        dont_wait: bool,
        /// Only these ranks feed the stream ("0-7,17"); the others count as sampled out.
        #[arg(long, default_value = "")]
        ranks: String,
    },
    /// Close a stream.
    Close { stream_id: u32 },
}

#[derive(clap::Subcommand, Debug)]
pub enum CtlCmd {
    /// Start (or resume) collection on every rank.
    Start,
    /// Pause collection on every rank.
    Stop,
    /// Replace what every rank measures, from its next dump on (no option: the defaults). With --app, replace
    /// one application's own options instead (no option: it runs the global ones again); the global options
    /// and the other applications' stay in force.
    Set {
        /// The application whose options these are (its ranks' name, as CANOPY_APP gives it): its include,
        /// exclude, metrics and sample_below replace the global ones for its ranks alone.
        #[arg(long, conflicts_with_all = ["period_ms", "modules", "trace_ranks", "counters", "time_rounds"])]
        app: Option<String>,
        /// Report only the events whose name matches (a regular expression; repeatable).
        #[arg(long)]
        include: Vec<String>,
        /// Leave out the events whose name matches (repeatable).
        #[arg(long)]
        exclude: Vec<String>,
        /// Report only these metrics: calls, inclusive, exclusive, counters (comma-separated).
        #[arg(long, value_delimiter = ',')]
        metrics: Vec<String>,
        /// A new dump period for ranks that dump on a timer.
        #[arg(long, default_value_t = 0)]
        period_ms: u64,
        /// Only ranks below this number report; the others count as sampled out. 0: every rank, or with --app,
        /// none of the application's ranks (the application is disabled).
        #[arg(long)]
        sample_below: Option<u32>,
        /// The measurement modules the ranks run: profile, trace, null (comma-separated; none: each rank's
        /// own CANOPY_MODULES).
        #[arg(long, value_delimiter = ',')]
        modules: Vec<String>,
        /// Rounds by time window (on) or by dump count (off), for every application; unset: the front-end's
        /// `time_rounds` key.
        #[arg(long, value_name = "on|off", value_parser = on_off)]
        time_rounds: Option<bool>,
        /// The ranks that ship their event trace (the trace module) with each profile, as ranges: 0,17,40-43.
        #[arg(long, default_value = "")]
        trace_ranks: String,
        /// The per-event metrics every rank measures (comma-separated): perf counters (task-clock, page-faults,
        /// context-switches, cpu-migrations, minor-faults, major-faults, cycles, instructions,
        /// cache-references, cache-misses, branch-instructions, branch-misses), heap and depth; none: each
        /// rank's own CANOPY_COUNTERS.
        #[arg(long, value_delimiter = ',')]
        counters: Vec<String>,
    },
    /// Full detail (raw profiles) from chosen ranks, in a stream of its own; close it to end the detail.
    Detail {
        /// The ranks, as ranges: 0,17,40-43.
        #[arg(required_unless_present = "auto", conflicts_with = "auto")]
        ranks: Option<String>,
        #[arg(long, default_value = "")]
        name: String,
        /// Only the ranks that matter, moved at round boundaries: the latest top outliers and each cluster's
        /// representative (opens an outliers and a kmeans stream if none is open).
        #[arg(long)]
        auto: bool,
        /// With --auto: the outliers stream to follow, by name.
        #[arg(long, requires = "auto", default_value = "")]
        outliers: String,
        /// With --auto: the kmeans stream to follow, by name.
        #[arg(long, requires = "auto", default_value = "")]
        clusters: String,
    },
    /// Collect exactly the rounds FROM through TO (both included), at every rank: collection pauses until FROM
    /// (or starts, if stopped) and stops after TO. FROM must be a round the tree has not admitted yet.
    Window {
        /// The first round collected.
        #[arg(long)]
        from: u64,
        /// The last round collected.
        #[arg(long)]
        to: u64,
    },
    /// Rank the metrics of a stats stream by how well they explain a workflow's end-to-end latency (a latency
    /// stream's steps), choose a subset by correlation-based selection, and say how well it predicts the latency
    /// beside every metric; with --apply, each application then reports only its chosen metrics.
    Select {
        /// The latency stream, by name (default: the one open latency stream).
        #[arg(long, default_value = "")]
        latency_stream: String,
        /// The stats stream whose metrics are the candidates, by name (default: the one open stats stream).
        #[arg(long, default_value = "")]
        stats_stream: String,
        /// Only the steps of this workflow key (default: every key's).
        #[arg(long, default_value = "")]
        key: String,
        /// The latest rounds to learn from.
        #[arg(long, default_value_t = 100)]
        rounds: u32,
        /// Narrow collection to the chosen metrics, from the ranks' next dump on.
        #[arg(long)]
        apply: bool,
        /// Rows of the ranking printed (the chosen ones always are).
        #[arg(long, default_value_t = 15)]
        top: usize,
    },
}

pub async fn connect(target: &Target) -> anyhow::Result<FrontendClient<Channel>> {
    let tls = target.tls()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{}", target.frontend))?;
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls)?;
    }
    let channel = endpoint.connect().await.map_err(|e| {
        let chain = canopy_runtime::tls_hint::error_chain(&e);
        let hint = canopy_runtime::tls_hint::hint(&chain).unwrap_or("is it running? --frontend ADDR");
        anyhow::anyhow!(
            "cannot reach the front-end at {}: {chain} ({hint})",
            target.frontend
        )
    })?;
    Ok(FrontendClient::new(channel).max_decoding_message_size(canopy_proto::MAX_MESSAGE_BYTES))
}

/// Any Canopy message as proto3 JSON, the way grpcurl prints it.
pub(crate) fn json_of<M: Message>(full_name: &str, msg: &M) -> String {
    static POOL: std::sync::OnceLock<DescriptorPool> = std::sync::OnceLock::new();
    let pool =
        POOL.get_or_init(|| DescriptorPool::decode(canopy_proto::FILE_DESCRIPTOR_SET).unwrap_or_default());
    let Some(desc) = pool.get_message_by_name(full_name) else {
        return format!("{{\"error\": \"no type {full_name}\"}}");
    };
    match DynamicMessage::decode(desc, msg.encode_to_vec().as_slice()) {
        Ok(m) => serde_json::to_string(&m).unwrap_or_default(),
        Err(e) => format!("{{\"error\": \"{e}\"}}"),
    }
}

pub(crate) fn status_error(e: tonic::Status) -> anyhow::Error {
    // A call that failed below gRPC (a handshake, a protocol) says why in the status's sources.
    let mut said = format!("{:?}: {}", e.code(), e.message());
    if let Some(source) = std::error::Error::source(&e) {
        let chain = canopy_runtime::tls_hint::error_chain(source);
        if !said.ends_with(&chain) {
            said = format!("{said}: {chain}");
        }
    }
    anyhow::anyhow!("{}", canopy_runtime::tls_hint::with_hint(&said))
}

fn print_stream(s: &StreamInfo) {
    let failure = if s.failure.is_empty() {
        String::new()
    } else {
        format!("  ({})", s.failure)
    };
    println!(
        "{:>3}  {:<16} {:<12} {:<7} {:>7} rounds  {:>7} full  {:>5} late{failure}",
        s.stream_id, s.name, s.filter, s.state, s.rounds, s.full_rounds, s.late_packets
    );
}

pub async fn streams(target: Target, cmd: StreamsCmd) -> anyhow::Result<()> {
    let mut api = connect(&target).await?;
    match cmd {
        StreamsCmd::List => {
            let list = api
                .list_streams(ListStreamsRequest {})
                .await
                .map_err(status_error)?
                .into_inner();
            if target.json {
                println!("{}", json_of("canopy.v1.ListStreamsResponse", &list));
            } else {
                println!(
                    " id  {:<16} {:<12} {:<7} {:>14}  {:>12}  {:>10}",
                    "name", "filter", "state", "", "", ""
                );
                list.streams.iter().for_each(print_stream);
            }
        }
        StreamsCmd::Open {
            filter,
            name,
            params,
            timeout_ms,
            dont_wait,
            ranks,
        } => {
            let sync = if dont_wait {
                SyncMode::DontWait
            } else {
                SyncMode::WaitForAll
            };
            let req = CreateStreamRequest {
                filter,
                name: name.unwrap_or_default(),
                params_json: params,
                sync_mode: sync as i32,
                timeout_ms,
                ranks,
                params: None,
            };
            let info = api.create_stream(req).await.map_err(status_error)?.into_inner();
            if target.json {
                println!("{}", json_of("canopy.v1.StreamInfo", &info))
            } else {
                print_stream(&info)
            }
        }
        StreamsCmd::Close { stream_id } => {
            let info = api
                .close_stream(CloseStreamRequest { stream_id })
                .await
                .map_err(status_error)?
                .into_inner();
            if target.json {
                println!("{}", json_of("canopy.v1.StreamInfo", &info))
            } else {
                print_stream(&info)
            }
        }
    }
    Ok(())
}

pub async fn ctl(target: Target, cmd: CtlCmd) -> anyhow::Result<()> {
    let mut api = connect(&target).await?;
    if let CtlCmd::Select {
        latency_stream,
        stats_stream,
        key,
        rounds,
        apply,
        top,
    } = cmd
    {
        let r = api
            .select_metrics(canopy_proto::v1::SelectMetricsRequest {
                latency_stream,
                stats_stream,
                key,
                rounds,
                apply,
            })
            .await
            .map_err(status_error)?
            .into_inner();
        if target.json {
            println!("{}", json_of("canopy.v1.SelectMetricsResponse", &r));
        } else {
            print!("{}", selection_text(&r, top));
        }
        return Ok(());
    }
    let r = api
        .control(ControlRequest {
            action: control_action(cmd),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if target.json {
        println!("{}", json_of("canopy.v1.ControlResponse", &r));
    } else {
        println!("{}", applied_text(&r));
    }
    Ok(())
}

/// The control action a command asks of every rank; none for `select`, which asks for a metric selection
/// instead.
fn control_action(cmd: CtlCmd) -> Option<control_request::Action> {
    match cmd {
        CtlCmd::Select { .. } => None,
        CtlCmd::Start => Some(control_request::Action::Start(true)),
        CtlCmd::Stop => Some(control_request::Action::Stop(true)),
        CtlCmd::Set { .. } => set_action(cmd),
        CtlCmd::Detail {
            ranks,
            name,
            auto,
            outliers,
            clusters,
        } => Some(control_request::Action::Detail(canopy_proto::v1::DetailRequest {
            ranks: ranks.unwrap_or_default(),
            name,
            auto,
            outliers,
            clusters,
        })),
        CtlCmd::Window { from, to } => Some(control_request::Action::Window(canopy_proto::v1::Window {
            from_round: from,
            to_round: to,
        })),
    }
}

/// The options a `set` command gives: one application's with --app, else every rank's; none for another
/// command.
fn set_action(cmd: CtlCmd) -> Option<control_request::Action> {
    match cmd {
        CtlCmd::Set {
            app: Some(app),
            include,
            exclude,
            metrics,
            sample_below,
            ..
        } => Some(control_request::Action::AppOptions(
            canopy_proto::v1::AppOptions {
                app,
                include,
                exclude,
                metrics,
                sample_below,
            },
        )),
        CtlCmd::Set {
            app: None,
            include,
            exclude,
            metrics,
            period_ms,
            sample_below,
            modules,
            trace_ranks,
            counters,
            time_rounds,
        } => Some(control_request::Action::Options(canopy_proto::v1::Options {
            include,
            exclude,
            metrics,
            period_ms,
            sample_below: sample_below.unwrap_or(0),
            modules,
            trace_ranks,
            counters,
            apps: Vec::new(),
            time_rounds,
        })),
        _ => None,
    }
}

/// A control response as people read it: what was applied, and the stream that carries a detail.
fn applied_text(r: &canopy_proto::v1::ControlResponse) -> String {
    if r.stream_id > 0 {
        format!("{}: applied (stream {})", r.applied, r.stream_id)
    } else {
        format!("{}: applied", r.applied)
    }
}

/// A selection as people read it: what it learned from, the ranking with the chosen metrics marked, the
/// prediction errors, and what was applied.
fn selection_text(r: &canopy_proto::v1::SelectMetricsResponse, top: usize) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "learned from {} rounds ({} to {}), mean end-to-end latency {:.3} ms; {} candidates{}",
        r.observations,
        r.from_round,
        r.to_round,
        r.latency_mean_ms,
        r.ranking.len(),
        if r.incomplete > 0 {
            format!(" ({} more left out: missing in some round)", r.incomplete)
        } else {
            String::new()
        }
    );
    let _ = writeln!(out, "  chosen  |r|     metric");
    for (i, c) in r.ranking.iter().enumerate() {
        if i >= top && !c.selected {
            continue;
        }
        let app = if c.app.is_empty() {
            String::new()
        } else {
            format!("{}: ", c.app)
        };
        let _ = writeln!(
            out,
            "  {:<6}  {:.3}  {app}{} {}",
            if c.selected { "*" } else { "" },
            c.correlation,
            c.event,
            c.metric
        );
    }
    let chosen = r.ranking.iter().filter(|c| c.selected).count();
    let _ = writeln!(
        out,
        "chosen {chosen} of {} (merit {:.3}, {} subsets scored); relative absolute error predicting the latency: \
         {:.1}% with the chosen, {:.1}% with every candidate",
        r.ranking.len(),
        r.merit,
        r.subsets_evaluated,
        100.0 * r.error_selected,
        100.0 * r.error_all
    );
    for a in &r.applied {
        let _ = writeln!(
            out,
            "applied: {} reports {} (metrics: {})",
            a.app,
            a.include.join(" "),
            if a.metrics.is_empty() {
                "all".to_string()
            } else {
                a.metrics.join(",")
            }
        );
    }
    out
}

pub(crate) fn kind_word(k: i32) -> &'static str {
    match NodeKind::try_from(k).unwrap_or(NodeKind::Unspecified) {
        NodeKind::Agent => "agent",
        NodeKind::Relay => "relay",
        NodeKind::Frontend => "front-end",
        NodeKind::Unspecified => "?",
    }
}

pub(crate) fn state_word(s: i32) -> &'static str {
    match NodeState::try_from(s).unwrap_or(NodeState::Unspecified) {
        NodeState::Attached => "attached",
        NodeState::Lost => "LOST",
        NodeState::Finished => "finished",
        NodeState::Unspecified => "?",
    }
}

/// The live tree, drawn from its root.
pub async fn topology(target: Target) -> anyhow::Result<()> {
    let mut api = connect(&target).await?;
    let topo = api
        .topology(TopologyRequest {})
        .await
        .map_err(status_error)?
        .into_inner();
    if target.json {
        println!("{}", json_of("canopy.v1.TopologyResponse", &topo));
        return Ok(());
    }
    let by_id: HashMap<&str, &TopologyNode> = topo.nodes.iter().map(|n| (n.node_id.as_str(), n)).collect();
    let roots: Vec<&TopologyNode> = topo
        .nodes
        .iter()
        .filter(|n| n.parent_id.is_empty() || !by_id.contains_key(n.parent_id.as_str()))
        .collect();
    fn draw(n: &TopologyNode, by_id: &HashMap<&str, &TopologyNode>, depth: usize) {
        let detail = if n.detail.is_empty() {
            String::new()
        } else {
            format!("  ({})", n.detail)
        };
        let filter_ms: f64 = n.filter_time.iter().map(|f| f.micros as f64 / 1000.0).sum();
        let detail = format!(", lag {}, {filter_ms:.1} ms in filters{detail}", n.lag_rounds);
        println!(
            "{:indent$}{} {} [{}] {} ranks, {} rounds ({} partial), {} in, {} out{detail}",
            "",
            kind_word(n.kind),
            n.node_id,
            state_word(n.state),
            n.ranks_below,
            n.rounds_closed,
            n.rounds_partial,
            crate::units::bytes(n.bytes_in),
            crate::units::bytes(n.bytes_out),
            indent = depth * 2
        );
        let mut kids: Vec<&&TopologyNode> = n.children.iter().filter_map(|c| by_id.get(c.as_str())).collect();
        kids.sort_by_key(|k| k.node_id.clone());
        for k in kids {
            draw(k, by_id, depth + 1);
        }
    }
    for r in roots {
        draw(r, &by_id, 0);
    }
    Ok(())
}

/// `on` or `off`, for a switch that may also be left unset.
fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?} is neither on nor off")),
    }
}
