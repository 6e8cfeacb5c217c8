//! The SDK's configuration: arguments to `init`, then the environment the launcher and the user set.

use std::path::PathBuf;
use std::time::Duration;

use crate::Error;

/// How the SDK runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The application id every profile carries.
    pub app: String,
    pub rank: u32,
    /// Ranks in the whole application: the tree waits for that many before it starts collection.
    pub nranks: u32,
    /// The leaf agent's socket (CANOPY_AGENT_SOCKET; default: see `canopy_wire::default_socket_path`).
    pub socket: PathBuf,
    /// Dump from a background thread at this period (CANOPY_DUMP_PERIOD_MS), for codes that never call dump.
    pub period: Option<Duration>,
    /// Dumps the queue holds while the agent is absent or slow (CANOPY_QUEUE_DUMPS, default 64); beyond it
    /// dumps are dropped and counted.
    pub queue_dumps: usize,
    /// How long finalize waits for the agent's FINACK (CANOPY_FINALIZE_TIMEOUT_MS, default 5000).
    pub finalize_timeout: Duration,
    /// The measurement modules in force from `init` (CANOPY_MODULES, default "profile"), as bits; the tree's
    /// options may switch them.
    pub modules: u32,
    /// Events each thread's trace ring holds (CANOPY_TRACE_EVENTS, default 16384).
    pub trace_events: usize,
    /// Activity switches each thread's utilization ring holds between two periods (CANOPY_UTILIZATION_EVENTS,
    /// default 65536).
    pub utilization_events: usize,
    /// The share of a bin (0 to 250) below which the utilization module folds an activity into "other"
    /// (CANOPY_UTILIZATION_THRESHOLD, in percent, default 10).
    pub utilization_threshold: u32,
    /// The per-event metrics measured from `init` (CANOPY_COUNTERS, comma-separated names of
    /// `canopy_wire::event_metrics`; default none), as bits over its table; the tree's options may replace them.
    pub counters: u32,
}

/// Where launchers put a process's rank, first match wins.
const RANK_VARS: [&str; 6] = [
    "CANOPY_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "OMPI_COMM_WORLD_RANK",
    "MV2_COMM_WORLD_RANK",
    "SLURM_PROCID",
];
/// And the application's size.
const SIZE_VARS: [&str; 6] = [
    "CANOPY_NRANKS",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "MV2_COMM_WORLD_SIZE",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
];

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn parse<T: std::str::FromStr>(name: &'static str, v: &str) -> Result<T, Error>
where
    T::Err: std::fmt::Display,
{
    v.trim().parse().map_err(|e: T::Err| Error::BadEnv {
        var: name,
        value: v.to_string(),
        reason: e.to_string(),
    })
}

fn first_of(vars: &[&'static str]) -> Result<Option<u32>, Error> {
    for name in vars {
        if let Some(v) = var(name) {
            return parse(name, &v).map(Some);
        }
    }
    Ok(None)
}

fn program_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "app".into())
}

impl Config {
    /// The configuration for `app` (empty: the program's name), with rank and size from the arguments or,
    /// when they are `None`, from the launcher's environment (a process with neither is rank 0 of 1).
    pub fn from_env(app: &str, rank: Option<u32>, nranks: Option<u32>) -> Result<Config, Error> {
        let rank = match rank {
            Some(r) => r,
            None => first_of(&RANK_VARS)?.unwrap_or(0),
        };
        let nranks = match nranks {
            Some(n) => n,
            None => first_of(&SIZE_VARS)?.unwrap_or(rank.saturating_add(1)),
        };
        if nranks != 0 && rank >= nranks {
            return Err(Error::Invalid(format!(
                "rank {rank} is not below the size {nranks}"
            )));
        }
        let socket = var("CANOPY_AGENT_SOCKET")
            .map(PathBuf::from)
            .unwrap_or_else(canopy_wire::default_socket_path);
        let period = match var("CANOPY_DUMP_PERIOD_MS") {
            None => None,
            Some(v) => match parse::<u64>("CANOPY_DUMP_PERIOD_MS", &v)? {
                0 => None,
                ms if ms > canopy_wire::options::MAX_PERIOD_MS => {
                    return Err(Error::BadEnv {
                        var: "CANOPY_DUMP_PERIOD_MS",
                        value: v,
                        reason: "over the limit of one hour".into(),
                    });
                }
                ms => Some(Duration::from_millis(ms)),
            },
        };
        let queue_dumps = match var("CANOPY_QUEUE_DUMPS") {
            None => 64,
            Some(v) => match parse::<usize>("CANOPY_QUEUE_DUMPS", &v)? {
                n @ 1..=65536 => n,
                _ => {
                    return Err(Error::BadEnv {
                        var: "CANOPY_QUEUE_DUMPS",
                        value: v,
                        reason: "must be between 1 and 65536".into(),
                    });
                }
            },
        };
        let finalize_timeout = match var("CANOPY_FINALIZE_TIMEOUT_MS") {
            None => Duration::from_secs(5),
            // At most a day: the application's exit must not hang on it.
            Some(v) => Duration::from_millis(parse::<u64>("CANOPY_FINALIZE_TIMEOUT_MS", &v)?.min(86_400_000)),
        };
        let modules = match var("CANOPY_MODULES") {
            None => 1,
            Some(v) => {
                let names: Vec<String> = v.split(',').map(|n| n.trim().to_string()).collect();
                crate::events::modules_named(&names).map_err(|reason| Error::BadEnv {
                    var: "CANOPY_MODULES",
                    value: v.clone(),
                    reason,
                })?
            }
        };
        let trace_events = match var("CANOPY_TRACE_EVENTS") {
            None => crate::trace::DEFAULT_EVENTS,
            Some(v) => match parse::<usize>("CANOPY_TRACE_EVENTS", &v)? {
                n @ 1..=crate::trace::MAX_EVENTS => n,
                _ => {
                    return Err(Error::BadEnv {
                        var: "CANOPY_TRACE_EVENTS",
                        value: v,
                        reason: format!("must be between 1 and {}", crate::trace::MAX_EVENTS),
                    });
                }
            },
        };
        let utilization_events = match var("CANOPY_UTILIZATION_EVENTS") {
            None => crate::utilization::DEFAULT_EVENTS,
            Some(v) => match parse::<usize>("CANOPY_UTILIZATION_EVENTS", &v)? {
                n @ 1..=crate::utilization::MAX_EVENTS => n,
                _ => {
                    return Err(Error::BadEnv {
                        var: "CANOPY_UTILIZATION_EVENTS",
                        value: v,
                        reason: format!("must be between 1 and {}", crate::utilization::MAX_EVENTS),
                    });
                }
            },
        };
        let utilization_threshold = match var("CANOPY_UTILIZATION_THRESHOLD") {
            None => canopy_wire::utilization::DEFAULT_THRESHOLD,
            Some(v) => match parse::<u32>("CANOPY_UTILIZATION_THRESHOLD", &v)? {
                p @ 0..=100 => (p * canopy_wire::utilization::FULL + 50) / 100,
                _ => {
                    return Err(Error::BadEnv {
                        var: "CANOPY_UTILIZATION_THRESHOLD",
                        value: v,
                        reason: "must be a percentage from 0 to 100".into(),
                    });
                }
            },
        };
        let counters = match var("CANOPY_COUNTERS") {
            None => 0,
            Some(v) => canopy_wire::event_metrics::parse_list(&v).map_err(|reason| Error::BadEnv {
                var: "CANOPY_COUNTERS",
                value: v.clone(),
                reason,
            })?,
        };
        Ok(Config {
            counters,
            app: if app.is_empty() {
                var("CANOPY_APP").unwrap_or_else(program_name)
            } else {
                app.to_string()
            },
            rank,
            nranks,
            socket,
            period,
            queue_dumps,
            finalize_timeout,
            modules,
            trace_events,
            utilization_events,
            utilization_threshold,
        })
    }
}
