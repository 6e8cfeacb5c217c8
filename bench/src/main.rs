//! `canopy-bench`: measures Canopy and prints tables (median of repeats, min and max beside it, and a
//! ratio against a baseline run in the same process). Never a pass/fail test: docs/benchmarks.md keeps the
//! latest tables and the commands that made them.

#![forbid(unsafe_code)]
#![allow(
    clippy::disallowed_types,
    reason = "benchmarks measure wall time and never run on a paused clock"
)]

mod engine;
mod heal;
mod instructions;
mod kafka;
mod latency;
mod leaf;
mod model;
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
mod tree;
mod utilization;

use clap::{Parser, Subcommand};

pub use tree::{Shape, TreeRun, print_cpu_by_kind, tree_run};

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
    /// What a node costs per rank-round and per child packet, measured on trees of processes (`canopy up`), and a
    /// model built from them that predicts any tree's throughput, latency and CPU per level: checked against
    /// measured trees it was not built from, then its predictions for deployments of 100,000 and 1,000,000 ranks.
    Model {
        /// The trees the costs are fitted to, RANKS:AGENTS:FANOUT: agents with few and many ranks, relays and the
        /// front-end with few and many children.
        #[arg(
            long,
            default_value = "64:2:2,512:2:2,256:8:8,256:8:2,2048:16:8",
            value_delimiter = ','
        )]
        calibrate: Vec<model::TreeShape>,
        /// The trees the model is checked against.
        #[arg(
            long,
            default_value = "64:4:2,256:4:4,1024:16:4,4096:32:8,16384:128:8",
            value_delimiter = ','
        )]
        check: Vec<model::TreeShape>,
        #[arg(long, default_value_t = 100)]
        events: u32,
        #[arg(long, default_value = "stats")]
        filter: String,
        /// Rounds of a saturated run of 256 ranks; a larger tree runs fewer, in proportion (at least 30).
        #[arg(long, default_value_t = 300)]
        rounds: u64,
        /// The least period of the light runs that measure latency, ms (a tree that sustains less runs at a third
        /// of its saturated rate).
        #[arg(long, default_value_t = 40)]
        light_period_ms: u64,
        #[arg(long, default_value_t = 100)]
        light_rounds: u64,
        /// Deployments predicted: ranks in all.
        #[arg(long, default_value = "100000,1000000", value_delimiter = ',')]
        deploy_ranks: Vec<f64>,
        /// Deployments predicted: ranks on each node, one agent a node.
        #[arg(long, default_value = "64,128", value_delimiter = ',')]
        ranks_per_agent: Vec<f64>,
        /// Deployments predicted: fanouts tried.
        #[arg(long, default_value = "8,16,32,64", value_delimiter = ',')]
        fanouts: Vec<usize>,
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
                timeout_ms: 5000,
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
        } => engine::run(&sources, rounds, events, args.repeats),
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
                timeout_ms: 5000,
            };
            if (quantiles_cost || shape.params.is_some()) && shape.processes {
                anyhow::bail!("--params and --quantiles-cost run in-process only, without --processes");
            }
            if quantiles_cost {
                rt.block_on(quantiles::cost(&shape, args.repeats))
            } else if security == "both" {
                rt.block_on(tree::tls_cost(&shape, args.repeats))
            } else {
                rt.block_on(tree::tree(&shape, args.repeats))
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
        Command::Model {
            calibrate,
            check,
            events,
            filter,
            rounds,
            light_period_ms,
            light_rounds,
            deploy_ranks,
            ranks_per_agent,
            fanouts,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(model::run(
                &model::Plan {
                    calibrate: &calibrate,
                    check: &check,
                    events,
                    filter: &filter,
                    rounds,
                    light_period_ms,
                    light_rounds,
                    deploy_ranks: &deploy_ranks,
                    deploy_ranks_per_agent: &ranks_per_agent,
                    deploy_fanouts: &fanouts,
                },
                args.repeats,
            ))
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
                timeout_ms: 5000,
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
