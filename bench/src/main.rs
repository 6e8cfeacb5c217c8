//! `canopy-bench`: measures Canopy and prints tables (median of repeats, min and max beside it, and a
//! ratio against a baseline run in the same process). Never a pass/fail test: docs/benchmarks.md keeps the
//! latest tables and the commands that made them.

#![forbid(unsafe_code)]
#![allow(
    clippy::disallowed_types,
    reason = "benchmarks measure wall time and never run on a paused clock"
)]

mod heal;
mod instructions;
mod kafka;
mod latency;
mod leaf;
mod mpi_wrapper;
mod offload;
mod ompt;
mod perturbation;
mod processes;
mod quantiles;
mod reduction;
mod samplers;
mod sdk;
mod throughput;
mod utilization;

use std::time::{Duration, Instant};

use anyhow::Context as _;
use canopy_core::engine::{Accepted, Arrival, GroupKey, RoundEngine, StreamSync};
use canopy_core::filter::{FilterFactory, Level};
use canopy_integration_tests::TreeBuilder;
use canopy_proto::v1::{AppCoverage, Coverage, EventSample, ProfileBatch, RankProfile, SyncMode};
use clap::{Parser, Subcommand};
use prost::Message;

#[derive(Parser)]
#[command(
    name = "canopy-bench",
    about = "Canopy's benchmarks: print tables, never pass or fail"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
    /// Repeats of each measurement; the table shows their median, min and max.
    #[arg(long, default_value_t = 5, global = true)]
    repeats: usize,
    /// tree and throughput: run each tree as separate processes (`canopy up`, from beside this executable)
    /// instead of in-process daemons, and report CPU per round by kind of process, from /proc.
    #[arg(long, global = true)]
    processes: bool,
}

#[derive(Subcommand)]
enum Command {
    /// The Kafka export's cost and pace: a tree as separate processes, without and with the export to a local
    /// broker (tansu), alternating; then a finished run published by `canopy export`.
    Kafka {
        #[arg(long, default_value_t = 1024)]
        ranks: u32,
        #[arg(long, default_value_t = 16)]
        agents: usize,
        #[arg(long, default_value_t = 4)]
        fanout: usize,
        #[arg(long, default_value_t = 20)]
        events: u32,
        /// Milliseconds between two rounds (10: 100 rounds/s).
        #[arg(long, default_value_t = 10)]
        period_ms: u64,
        #[arg(long, default_value_t = 1000)]
        rounds: u64,
        #[arg(long, default_value = "stats,histogram")]
        filters: String,
    },
    /// A relay killed with SIGKILL at a random moment under load, in fresh trees of processes: the time back to
    /// full coverage, and the rank-rounds lost or counted twice.
    Heal {
        #[arg(long, default_value_t = 20)]
        trials: usize,
        #[arg(long, default_value_t = 100)]
        period_ms: u64,
        /// Rounds per trial (the kill comes after round 10).
        #[arg(long, default_value_t = 60)]
        rounds: u64,
    },
    /// One node's round engine and passthrough merge, in-process, against concatenating the same bytes.
    Engine {
        /// Sources (children or ranks) per node, comma-separated.
        #[arg(long, default_value = "8,64,1024", value_delimiter = ',')]
        sources: Vec<usize>,
        #[arg(long, default_value_t = 200)]
        rounds: u64,
        /// Events per rank profile.
        #[arg(long, default_value_t = 100)]
        events: usize,
    },
    /// A whole tree on loopback (gRPC, the store): sustained rounds per second and latency from the first
    /// rank's dump to the stored result.
    Tree {
        #[arg(long, default_value_t = 256)]
        ranks: u32,
        #[arg(long, default_value_t = 8)]
        agents: usize,
        #[arg(long, default_value_t = 8)]
        fanout: usize,
        #[arg(long, default_value_t = 20)]
        events: u32,
        #[arg(long, default_value_t = 20)]
        period_ms: u64,
        #[arg(long, default_value_t = 100)]
        rounds: u64,
        /// The stream's filter: passthrough, stats, histogram or classify.
        #[arg(long, default_value = "passthrough")]
        filter: String,
        /// The links between the nodes: tls (mutual TLS, as deployed), plaintext, or both (each repeat runs
        /// plaintext then TLS, and TLS's ratio to plaintext is printed).
        #[arg(long, default_value = "tls", value_parser = ["tls", "plaintext", "both"])]
        security: String,
        /// The stream's parameters (JSON), in-process only; none: the filter's defaults.
        #[arg(long)]
        params: Option<String>,
        /// With `--filter stats`, in-process: each repeat runs the stream without quantiles
        /// (`{"quantiles": []}`), then with its default p50, p90 and p99, and the ratios are printed.
        #[arg(long)]
        quantiles_cost: bool,
    },
    /// Where a round's latency goes, hop by hop: a tree of separate processes at a light rate, with the
    /// nodes' latency account on.
    Latency {
        /// An MRNet topology file or a balanced spec, instead of --agents and --fanout.
        #[arg(long)]
        topology: Option<std::path::PathBuf>,
        #[arg(long, default_value_t = 1024)]
        ranks: u32,
        #[arg(long, default_value_t = 16)]
        agents: usize,
        #[arg(long, default_value_t = 4)]
        fanout: usize,
        #[arg(long, default_value_t = 100)]
        events: u32,
        /// Milliseconds between two rounds (40: 25 rounds/s).
        #[arg(long, default_value_t = 40)]
        period_ms: u64,
        #[arg(long, default_value_t = 200)]
        rounds: u64,
        #[arg(long, default_value = "stats")]
        filter: String,
    },
    /// A leaf agent's work per rank-round, with the simulated ranks' generation apart from the leaf filter.
    Leaf {
        /// Simulated ranks of the agent.
        #[arg(long, default_value_t = 64)]
        ranks: u32,
        #[arg(long, default_value_t = 100)]
        events: u32,
        #[arg(long, default_value_t = 200)]
        rounds: u64,
        /// Children of the relay timed over the leaves' packets.
        #[arg(long, default_value_t = 2)]
        children: usize,
        /// Leaf filters timed, each over the same encoded rounds.
        #[arg(long, default_value = "stats,histogram", value_delimiter = ',')]
        filters: Vec<String>,
    },
    /// The highest round rate a tree sustains, per size, fanout and filter, with its latency.
    Throughput {
        #[arg(long, default_value = "256,1024,4096", value_delimiter = ',')]
        ranks: Vec<u32>,
        #[arg(long, default_value = "8,32", value_delimiter = ',')]
        fanouts: Vec<usize>,
        #[arg(
            long,
            default_value = "passthrough,stats,histogram,classify",
            value_delimiter = ','
        )]
        filters: Vec<String>,
        /// Offered rates tried in order, rounds per second.
        #[arg(long, default_value = "25,50,100,200,333,500", value_delimiter = ',')]
        rates: Vec<u64>,
        #[arg(long, default_value_t = 100)]
        events: u32,
    },
    /// ToM's offload benchmark: rank processes loop work(period); dump; barrier through the real SDK.
    Offload {
        #[arg(long, default_value = "64,256", value_delimiter = ',')]
        ranks: Vec<u32>,
        #[arg(long, default_value = "2,4,8,16", value_delimiter = ',')]
        fanouts: Vec<usize>,
        /// Periods between dumps, microseconds.
        #[arg(long, default_value = "100,1000,10000,100000", value_delimiter = ',')]
        periods_us: Vec<u64>,
        #[arg(long, default_value = "passthrough,histogram", value_delimiter = ',')]
        filters: Vec<String>,
    },
    /// One rank of `offload` (started by it).
    #[command(hide = true)]
    OffloadRank {
        #[arg(long)]
        socket: std::path::PathBuf,
        #[arg(long)]
        barrier: std::path::PathBuf,
        #[arg(long)]
        rank: u32,
        #[arg(long)]
        nranks: u32,
        #[arg(long)]
        period_us: u64,
        #[arg(long)]
        rounds: u64,
    },
    /// What online monitoring costs an application: the C stencil without the SDK, with it and no agent,
    /// and dumping through a real tree.
    Perturbation {
        /// Milliseconds of work per iteration (one dump each).
        #[arg(long, default_value_t = 10)]
        period_ms: u64,
        #[arg(long, default_value_t = 300)]
        iterations: u64,
    },
    /// What libcanopy_mpi costs an unmodified MPI program: the added ns per call on a tight loop of
    /// MPI_Comm_rank (sdk/examples/mpi/ping.c, -np 1), and the MPI stencil run unmodified under the preloaded
    /// wrapper with a dump every `period_ms` through a real tree, against the same run without it.
    MpiWrapper {
        /// The MPI family: its compiler, launcher and the wrapper built for it.
        #[arg(long, value_enum, default_value = "openmpi")]
        family: mpi_wrapper::Family,
        /// MPI_Comm_rank calls per ping run.
        #[arg(long, default_value_t = 20_000_000)]
        calls: u64,
        /// Ranks of the stencil (mpirun -np); 1 leaves a core of this 2-core machine to the tree's daemons.
        #[arg(long, default_value_t = 1)]
        ranks: u32,
        #[arg(long, default_value_t = 2000)]
        iterations: u64,
        /// The wrapper's dump period in the stencil runs (CANOPY_DUMP_PERIOD_MS).
        #[arg(long, default_value_t = 10)]
        period_ms: u64,
    },
    /// What libcanopy_omp costs an unmodified OpenMP program: empty parallel regions (a loop and a barrier each)
    /// with and without the OMPT tool loaded, per region and per event on a thread.
    Ompt {
        /// Parallel regions per run.
        #[arg(long, default_value_t = 200_000)]
        regions: u64,
        /// Threads a region (OMP_NUM_THREADS).
        #[arg(long, default_value_t = 2)]
        threads: u32,
    },
    /// Seed 000's utilization figures: creating a rank's compressed profile of a second, the merged message at
    /// each level and the bytes per second at the front-end with 1024 simulated namd ranks, and the
    /// perturbation of the utilization module through a real tree.
    Utilization {
        /// Tables to print: compress, tree, perturbation.
        #[arg(long, default_value = "compress,tree,perturbation", value_delimiter = ',')]
        tables: Vec<String>,
        /// Activity switches per second of the measured rank.
        #[arg(long, default_value_t = 10_000)]
        rate_hz: u64,
        /// Seconds of work per perturbation run.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Simulated ranks of the tree table (leaves of 32).
        #[arg(long, default_value_t = 1024)]
        ranks: u32,
    },
    /// The agent's node samplers: the CPU of one sample of /proc in-process, by sampler, and of an idle agent
    /// process sampling every period against one without samplers.
    Samplers {
        /// Tables to print: sample, agent.
        #[arg(long, default_value = "sample,agent", value_delimiter = ',')]
        tables: Vec<String>,
        /// Samples per repeat of the `sample` table.
        #[arg(long, default_value_t = 2000)]
        samples: u32,
        /// The sampling period of the `agent` table's agent, milliseconds.
        #[arg(long, default_value_t = 1000)]
        period_ms: u64,
        /// Seconds per repeat of the `agent` table.
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
    },
    /// Bytes per round at the front-end for each standard filter against passthrough, and classify's
    /// reduction factor per classification scheme (ToM's Fig. 7).
    Reduction {
        #[arg(long, default_value = "64,256,1024", value_delimiter = ',')]
        ranks: Vec<u32>,
        #[arg(long, default_value = "uintah,flash", value_delimiter = ',')]
        scenarios: Vec<String>,
        /// Events per rank for flash; for uintah, the framework tasks every rank runs besides its MPI and
        /// patch events.
        #[arg(long, default_value_t = 100)]
        events: u32,
        #[arg(long, default_value_t = 10)]
        rounds: u64,
        /// Tables to print: `main` (every filter against passthrough), `schemes` (classify per scheme).
        #[arg(long, default_value = "main,schemes", value_delimiter = ',')]
        tables: Vec<String>,
        /// classify's schemes for the `schemes` table: patch1 (`^Patch 1 ->`), mpi (`^MPI_`), all.
        #[arg(long, default_value = "patch1,mpi,all", value_delimiter = ',')]
        schemes: Vec<String>,
    },
    /// The application SDK on the application's thread: timer pairs, dumps, allocations.
    Sdk {
        /// Timers in the dumped profile.
        #[arg(long, default_value_t = 100)]
        events: usize,
        /// Timer pairs per repeat.
        #[arg(long, default_value_t = 1_000_000)]
        pairs: u64,
        /// Dumps per repeat.
        #[arg(long, default_value_t = 2000)]
        dumps: usize,
        /// Microseconds between two dumps (the application's iteration).
        #[arg(long, default_value_t = 200)]
        gap_us: u64,
    },
    /// Instruction budgets (a CI gate): each workload counted under callgrind per operation, against
    /// bench/instruction-budgets.txt; fails on one more than 5% over its budget, naming the functions that grew.
    Instructions {
        /// Write this build's counts as the budgets instead of checking them.
        #[arg(long)]
        update: bool,
        /// Fail, rather than skip, a workload that cannot run here (no valgrind, no mpicc).
        #[arg(long)]
        require_all: bool,
        /// The budgets file (default: bench/instruction-budgets.txt).
        #[arg(long)]
        budgets: Option<std::path::PathBuf>,
    },
    /// One workload of `instructions`, run under callgrind: OPERATIONS of it in this process.
    #[command(hide = true)]
    InstructionsWorkload { name: String, operations: u64 },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // The in-process daemons log to stderr when asked to (CANOPY_LOG=canopy::latency=debug, say); quiet otherwise.
    if std::env::var_os("CANOPY_LOG").is_some() {
        canopy_runtime::telemetry::init(canopy_runtime::config::LogFormat::Text, "warn");
    }
    if let Command::InstructionsWorkload { name, operations } = &args.command {
        return instructions::workload(name, *operations);
    }
    if !matches!(args.command, Command::OffloadRank { .. }) {
        println!(
            "# canopy-bench on {} cores",
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        );
        println!("# command: {}", std::env::args().collect::<Vec<_>>().join(" "));
    }
    match args.command {
        Command::Kafka {
            ranks,
            agents,
            fanout,
            events,
            period_ms,
            rounds,
            filters,
        } => kafka::run(
            &Shape {
                ranks,
                agents,
                fanout,
                events,
                period_ms,
                rounds,
                filter: filters,
                params: None,
                processes: true,
                tls: true,
            },
            args.repeats,
        ),
        Command::Heal {
            trials,
            period_ms,
            rounds,
        } => heal::run(trials, period_ms, rounds),
        Command::Engine {
            sources,
            rounds,
            events,
        } => engine(&sources, rounds, events, args.repeats),
        Command::Tree {
            ranks,
            agents,
            fanout,
            events,
            period_ms,
            rounds,
            filter,
            security,
            params,
            quantiles_cost,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            let shape = Shape {
                ranks,
                agents,
                fanout,
                events,
                period_ms,
                rounds,
                filter,
                params,
                processes: args.processes,
                tls: security != "plaintext",
            };
            if (quantiles_cost || shape.params.is_some()) && shape.processes {
                anyhow::bail!("--params and --quantiles-cost run in-process only, without --processes");
            }
            if quantiles_cost {
                rt.block_on(quantiles::cost(&shape, args.repeats))
            } else if security == "both" {
                rt.block_on(tls_cost(&shape, args.repeats))
            } else {
                rt.block_on(tree(&shape, args.repeats))
            }
        }
        Command::Reduction {
            ranks,
            scenarios,
            events,
            rounds,
            tables,
            schemes,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(reduction::run(&reduction::Plan {
                sizes: &ranks,
                scenarios: &scenarios,
                events,
                rounds,
                tables: &tables,
                schemes: &schemes,
            }))
        }
        Command::Leaf {
            ranks,
            events,
            rounds,
            children,
            filters,
        } => leaf::run(ranks, events, rounds, children, &filters, args.repeats),
        Command::Latency {
            topology,
            ranks,
            agents,
            fanout,
            events,
            period_ms,
            rounds,
            filter,
        } => {
            let shape = Shape {
                ranks,
                agents,
                fanout,
                events,
                period_ms,
                rounds,
                filter,
                params: None,
                processes: true,
                tls: true,
            };
            latency::run(&shape, topology.as_deref(), args.repeats)
        }
        Command::Throughput {
            ranks,
            fanouts,
            filters,
            rates,
            events,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(throughput::run(
                &throughput::Sweep {
                    sizes: &ranks,
                    fanouts: &fanouts,
                    filters: &filters,
                    rates: &rates,
                    events,
                    processes: args.processes,
                },
                args.repeats,
            ))
        }
        Command::Offload {
            ranks,
            fanouts,
            periods_us,
            filters,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(offload::run(
                &ranks,
                &fanouts,
                &periods_us,
                &filters,
                args.repeats,
            ))
        }
        Command::OffloadRank {
            socket,
            barrier,
            rank,
            nranks,
            period_us,
            rounds,
        } => offload::rank(&socket, &barrier, rank, nranks, period_us, rounds),
        Command::Perturbation {
            period_ms,
            iterations,
        } => perturbation::run_all(period_ms, iterations, args.repeats),
        Command::MpiWrapper {
            family,
            calls,
            ranks,
            iterations,
            period_ms,
        } => mpi_wrapper::run(family, calls, ranks, iterations, period_ms, args.repeats),
        Command::Ompt { regions, threads } => ompt::run(regions, threads, args.repeats),
        Command::Sdk {
            events,
            pairs,
            dumps,
            gap_us,
        } => sdk::run(events, pairs, dumps, gap_us, args.repeats),
        Command::Instructions {
            update,
            require_all,
            budgets,
        } => instructions::check(
            &budgets.unwrap_or_else(instructions::default_budgets),
            update,
            require_all,
        ),
        Command::InstructionsWorkload { .. } => unreachable!("run before the header"),
        Command::Samplers {
            tables,
            samples,
            period_ms,
            seconds,
        } => samplers::run(&samplers::Plan {
            tables: &tables,
            samples,
            period_ms,
            seconds,
            repeats: args.repeats,
        }),
        Command::Utilization {
            tables,
            rate_hz,
            seconds,
            ranks,
        } => utilization::run(&utilization::Plan {
            tables: &tables,
            rate_hz,
            seconds,
            ranks,
            repeats: args.repeats,
        }),
    }
}

/// Median, min and max.
fn stats(mut xs: Vec<f64>) -> (f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    (xs[xs.len() / 2], xs[0], xs[xs.len() - 1])
}

fn percentile(mut xs: Vec<f64>, p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    xs[((xs.len() - 1) as f64 * p).round() as usize]
}

fn profile(rank: u32, events: usize) -> Vec<u8> {
    let events = (0..events as u64)
        .map(|e| EventSample {
            event_id: e * 0x9e37_79b9_7f4a_7c15,
            calls: 10,
            subrs: 2,
            incl_us: 100.0 + e as f64,
            excl_us: 50.0,
            calls_total: 1000,
            subrs_total: 200,
            incl_total_us: 1e4,
            excl_total_us: 5e3,
            ..Default::default()
        })
        .collect();
    ProfileBatch {
        profiles: vec![RankProfile {
            rank,
            events,
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

fn engine(sources: &[usize], rounds: u64, events: usize, repeats: usize) -> anyhow::Result<()> {
    println!(
        "\n## engine: rounds per second through one node (wait-for-all, passthrough), {events} events per rank"
    );
    println!(
        "| sources | bytes/round | engine rounds/s (median) | min | max | baseline rounds/s | engine/baseline |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let plugins = canopy_core::plugin::filters_from(&[]);
    for &n in sources {
        let payloads: Vec<Vec<u8>> = (0..n as u32).map(|r| profile(r, events)).collect();
        let ids: Vec<String> = (0..n).map(|i| format!("rank:{i}")).collect();
        let bytes: usize = payloads.iter().map(Vec::len).sum();
        let mut with_engine = Vec::new();
        let mut baseline = Vec::new();
        for _ in 0..repeats {
            let mut e = RoundEngine::new();
            for id in &ids {
                e.add_source(id, 1);
            }
            e.open_stream(
                1,
                StreamSync {
                    mode: SyncMode::WaitForAll,
                    timeout: Duration::from_secs(60),
                },
            );
            // The real plugin, loaded from beside this executable as the daemons load it.
            let mut filter = plugins.create("passthrough", "", Level::Relay)?;
            let t = Instant::now();
            let now = tokio::time::Instant::now();
            for round in 0..rounds {
                for (id, p) in ids.iter().zip(&payloads) {
                    let a = Arrival {
                        source: id.clone(),
                        // A rank's coverage names its application, as a leaf's does.
                        coverage: Coverage {
                            covered: 1,
                            expected: 1,
                            missing: vec![],
                            apps: vec![AppCoverage {
                                app: "bench".into(),
                                covered: 1,
                                expected: 1,
                                missing: vec![],
                            }],
                            unreachable: vec![],
                        },
                        payload: p.clone().into(),
                        first_dump_unix_ns: 0,
                    };
                    if let Accepted::Closed(c) = e.accept(
                        GroupKey {
                            stream: 1,
                            round,
                            phase: 0,
                        },
                        a,
                        now,
                    )? {
                        let inputs: Vec<&[u8]> = c.inputs.iter().map(|a| a.payload.as_ref()).collect();
                        std::hint::black_box(filter.upstream(round, 0, &inputs)?);
                    }
                }
            }
            with_engine.push(rounds as f64 / t.elapsed().as_secs_f64());
            // The least any node must do: copy each payload once and append it to the round's packet.
            let t = Instant::now();
            for _ in 0..rounds {
                let mut merged = Vec::with_capacity(bytes);
                for p in &payloads {
                    let owned = p.clone();
                    merged.extend_from_slice(&owned);
                }
                std::hint::black_box(merged);
            }
            baseline.push(rounds as f64 / t.elapsed().as_secs_f64());
        }
        let (m, lo, hi) = stats(with_engine);
        let (b, _, _) = stats(baseline);
        println!(
            "| {n} | {bytes} | {m:.0} | {lo:.0} | {hi:.0} | {b:.0} | {:.3} |",
            m / b
        );
    }
    Ok(())
}

/// A tree benchmark's shape.
pub struct Shape {
    pub ranks: u32,
    pub agents: usize,
    pub fanout: usize,
    pub events: u32,
    pub period_ms: u64,
    pub rounds: u64,
    pub filter: String,
    /// The stream's parameters (JSON), in-process only; `None`: the filter's defaults.
    pub params: Option<String>,
    /// Separate processes (`canopy up`) instead of in-process daemons.
    pub processes: bool,
    /// Mutual TLS between the nodes (the default of a deployed tree); otherwise plaintext on loopback.
    pub tls: bool,
}

/// One run of a tree on loopback, read back from its store.
pub struct TreeRun {
    /// Rounds stored per second.
    pub rate: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Latency p50 of the first and of the last quarter of the rounds: a lag that grows shows between them.
    pub first_quarter_ms: f64,
    pub last_quarter_ms: f64,
    pub coverage: f64,
    /// CPU of every daemon of the tree (with the simulated ranks' generation at the agents) per round stored,
    /// in ms: the whole process's in-process, the sum of the processes' with `processes`.
    pub cpu_ms_per_round: f64,
    /// With `processes`: the CPU per round by kind of process.
    pub cpu_by_kind: Option<processes::CpuByKind>,
}

/// User and system CPU this process has used.
fn process_cpu() -> anyhow::Result<Duration> {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_SELF)?;
    let d = |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    Ok(d(u.user_time()) + d(u.system_time()))
}

/// Runs one tree of `shape` to its end.
pub async fn tree_run(shape: &Shape) -> anyhow::Result<TreeRun> {
    if shape.processes {
        let dir = tempfile::tempdir()?;
        let (store, cpu) = processes::run(shape, dir.path())?;
        return read_run(&store, cpu.total(), Some(cpu));
    }
    let builder = TreeBuilder {
        agents: shape.agents,
        fanout: shape.fanout,
        ranks: shape.ranks,
        rounds: shape.rounds,
        period_ms: shape.period_ms,
        events: shape.events,
        timeout_ms: 5000,
        streams: vec![shape.filter.clone()],
        stream_params: shape
            .params
            .iter()
            .map(|p| (shape.filter.clone(), p.clone()))
            .collect(),
        tls: shape.tls,
        ..TreeBuilder::default()
    };
    let cpu_before = process_cpu()?;
    let mut sandbox = builder.start().await;
    sandbox
        .wait_frontend(Duration::from_secs(600))
        .await
        .map_err(anyhow::Error::msg)?;
    let cpu = process_cpu()? - cpu_before;
    let rounds = canopy_store::StoreReader::open(&sandbox.store)?
        .rounds(canopy_store::Select::all())?
        .len();
    read_run(
        &sandbox.store,
        cpu.as_secs_f64() * 1e3 / rounds.max(1) as f64,
        None,
    )
}

/// A finished run's figures, from its store.
fn read_run(
    store: &std::path::Path,
    cpu_ms_per_round: f64,
    cpu_by_kind: Option<processes::CpuByKind>,
) -> anyhow::Result<TreeRun> {
    let mut stored = canopy_store::StoreReader::open(store)?.rounds(canopy_store::Select::all())?;
    stored.sort_by_key(|r| r.round);
    let rows: Vec<(i64, i64, i64, i64)> = stored
        .iter()
        .map(|r| {
            let at = |t: Option<u64>| t.context("a round without its times").map(|t| t as i64);
            Ok((
                at(r.first_dump_unix_ns)?,
                at(r.closed_unix_ns)?,
                r.covered.into(),
                r.expected.into(),
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let lat: Vec<f64> = rows.iter().map(|(f, c, _, _)| (c - f) as f64 / 1e6).collect();
    let span = (rows.last().map(|r| r.1).unwrap_or(0) - rows.first().map(|r| r.1).unwrap_or(0)) as f64 / 1e9;
    let q = (lat.len() / 4).max(1);
    let (cov, exp) = rows.iter().fold((0i64, 0i64), |(a, b), r| (a + r.2, b + r.3));
    Ok(TreeRun {
        rate: (rows.len().saturating_sub(1)) as f64 / span.max(1e-9),
        p50_ms: percentile(lat.clone(), 0.5),
        p99_ms: percentile(lat.clone(), 0.99),
        first_quarter_ms: percentile(lat[..q.min(lat.len())].to_vec(), 0.5),
        last_quarter_ms: percentile(lat[lat.len().saturating_sub(q)..].to_vec(), 0.5),
        coverage: 100.0 * cov as f64 / exp.max(1) as f64,
        cpu_ms_per_round,
        cpu_by_kind,
    })
}

async fn tree(shape: &Shape, repeats: usize) -> anyhow::Result<()> {
    let Shape {
        ranks,
        agents,
        fanout,
        events,
        period_ms,
        ref filter,
        processes,
        ..
    } = *shape;
    let how = if processes {
        "separate processes (canopy up)"
    } else {
        "in-process daemons"
    };
    println!(
        "\n## tree: {ranks} simulated ranks, {agents} agents, fanout {fanout}, {events} events, one round every {period_ms} ms, {filter}, {how} over loopback gRPC"
    );
    let offered = 1000.0 / period_ms as f64;
    let mut rates = Vec::new();
    let mut p50s = Vec::new();
    let mut p99s = Vec::new();
    let mut coverage = Vec::new();
    let mut cpu = Vec::new();
    let mut by_kind = Vec::new();
    for _ in 0..repeats {
        let run = tree_run(shape).await?;
        cpu.push(run.cpu_ms_per_round);
        by_kind.extend(run.cpu_by_kind);
        rates.push(run.rate);
        p50s.push(run.p50_ms);
        p99s.push(run.p99_ms);
        coverage.push(run.coverage);
    }
    let (r, rlo, rhi) = stats(rates);
    let (p50, _, _) = stats(p50s);
    let (p99, p99lo, p99hi) = stats(p99s);
    let (c, _, _) = stats(coverage);
    let (cpu, cpu_lo, cpu_hi) = stats(cpu);
    println!(
        "| offered rounds/s | stored rounds/s (median) | min | max | stored/offered | latency p50 ms | latency p99 ms (median) | p99 min | p99 max | coverage % |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {offered:.1} | {r:.1} | {rlo:.1} | {rhi:.1} | {:.3} | {p50:.2} | {p99:.2} | {p99lo:.2} | {p99hi:.2} | {c:.1} |",
        r / offered
    );
    // Their own tables, so the one above keeps its columns for the tools that read it.
    if !by_kind.is_empty() {
        print_cpu_by_kind(&[(format!("{} runs", by_kind.len()), by_kind)]);
        return Ok(());
    }
    println!(
        "\n| CPU ms per round stored, whole process: every daemon and the simulated ranks' generation (median) | min | max |"
    );
    println!("|---:|---:|---:|");
    println!("| {cpu:.2} | {cpu_lo:.2} | {cpu_hi:.2} |");
    Ok(())
}

/// What mutual TLS costs: each repeat runs the tree in plaintext, then on TLS, in this process; the medians of
/// both, and TLS's ratio to plaintext.
async fn tls_cost(shape: &Shape, repeats: usize) -> anyhow::Result<()> {
    let how = if shape.processes {
        "separate processes (canopy up)"
    } else {
        "in-process daemons"
    };
    println!(
        "\n## tree, plaintext against mutual TLS: {} simulated ranks, {} agents, fanout {}, {} events, one round every {} ms, {}, {how}",
        shape.ranks, shape.agents, shape.fanout, shape.events, shape.period_ms, shape.filter
    );
    let mut runs: [Vec<TreeRun>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..repeats {
        for (i, tls) in [false, true].into_iter().enumerate() {
            let shape = Shape {
                tls,
                filter: shape.filter.clone(),
                params: shape.params.clone(),
                ..*shape
            };
            runs[i].push(tree_run(&shape).await?);
        }
    }
    println!(
        "| links | stored rounds/s (median) | min | max | latency p50 ms | latency p99 ms | CPU ms per round (median) | min | max | coverage % |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut medians = Vec::new();
    for (label, runs) in ["plaintext", "mutual TLS"].into_iter().zip(&runs) {
        let (r, rlo, rhi) = stats(runs.iter().map(|r| r.rate).collect());
        let (p50, _, _) = stats(runs.iter().map(|r| r.p50_ms).collect());
        let (p99, _, _) = stats(runs.iter().map(|r| r.p99_ms).collect());
        let (cpu, cpu_lo, cpu_hi) = stats(runs.iter().map(|r| r.cpu_ms_per_round).collect());
        let (c, _, _) = stats(runs.iter().map(|r| r.coverage).collect());
        println!(
            "| {label} | {r:.1} | {rlo:.1} | {rhi:.1} | {p50:.2} | {p99:.2} | {cpu:.2} | {cpu_lo:.2} | {cpu_hi:.2} | {c:.1} |"
        );
        medians.push((r, cpu, p50));
    }
    let ((r0, c0, p0), (r1, c1, p1)) = (medians[0], medians[1]);
    println!(
        "\nTLS/plaintext: throughput {:.3}, CPU per round {:.3}, latency p50 {:.3}",
        r1 / r0.max(f64::MIN_POSITIVE),
        c1 / c0.max(f64::MIN_POSITIVE),
        p1 / p0.max(f64::MIN_POSITIVE)
    );
    Ok(())
}

/// CPU per round by kind of process, one row per labelled set of repeats: median, min and max of each kind.
pub fn print_cpu_by_kind(rows: &[(String, Vec<processes::CpuByKind>)]) {
    println!(
        "\n| CPU ms per round stored, from /proc (median, min to max) | front-end | relays, all | agents, all (with the simulated ranks) | total |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (label, runs) in rows {
        let col = |f: fn(&processes::CpuByKind) -> f64| {
            let (m, lo, hi) = stats(runs.iter().map(f).collect());
            format!("{m:.2} ({lo:.2} to {hi:.2})")
        };
        println!(
            "| {label} | {} | {} | {} | {} |",
            col(|c| c.frontend),
            col(|c| c.relays),
            col(|c| c.agents),
            col(processes::CpuByKind::total)
        );
    }
}
