//! What every daemon's thin `main` shares: config errors exit 64, `validate` checks and exits, logs are set
//! up once, and `run(config, shutdown)` gets SIGINT/SIGTERM as its shutdown future.

use std::future::Future;
use std::process::ExitCode;

use crate::config::{ConfigError, EXIT_CONFIG, LogFormat};

/// The exit code for a node its parent refused (protocol mismatch, duplicate id): EX_PROTOCOL.
pub const EXIT_REFUSED: u8 = 76;

/// How long a clean shutdown may take after the first signal before the process exits without it.
pub const FORCE_AFTER: std::time::Duration = std::time::Duration::from_secs(20);

/// A daemon's worker threads unless its configuration says otherwise. A node's work is a chain of small tasks
/// (a link's stream, the HTTP/2 connection, the node, the store writer's queue): on one thread each hands the
/// next its message without waking another thread, which at a light rate is most of a round's latency.
pub const DEFAULT_WORKER_THREADS: usize = 1;

/// The most worker threads a daemon may ask for.
const MAX_WORKER_THREADS: usize = 256;

/// Checks a daemon's `worker_threads`.
pub fn check_worker_threads(n: usize) -> Result<(), crate::config::ConfigIssue> {
    if (1..=MAX_WORKER_THREADS).contains(&n) {
        return Ok(());
    }
    Err(crate::config::ConfigIssue::new(
        "worker_threads",
        format!("must be between 1 and {MAX_WORKER_THREADS}"),
    ))
}

/// What `validate` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Validate {
    /// Run the daemon.
    No,
    /// Check the configuration and exit.
    Check,
    /// Check it and print this: the configuration in force and where each value comes from.
    Print(String),
}

/// Runs a daemon's main: `loaded` is its configuration (or why not), `validate` the `validate` subcommand.
pub fn main<C, F, Fut, E>(
    role: &str,
    loaded: Result<C, ConfigError>,
    validate: Validate,
    log: LogFormat,
    run: F,
) -> ExitCode
where
    C: DaemonConfig,
    F: FnOnce(C, std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display + IsRefusal + Send + 'static,
{
    let config = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("canopy-{role}: {e}");
            return ExitCode::from(EXIT_CONFIG as u8);
        }
    };
    match validate {
        Validate::No => {}
        Validate::Check => {
            println!("canopy-{role}: configuration is valid");
            return ExitCode::SUCCESS;
        }
        Validate::Print(text) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
    }
    crate::telemetry::init_daemon(role, config.node_id(), log, "info");
    match crate::net::raise_fd_limit() {
        Ok(limit) => tracing::debug!(limit, "open descriptors"),
        Err(e) => tracing::warn!("cannot raise the limit on open descriptors: {e}"),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.worker_threads())
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("canopy-{role}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Counted on a thread of their own, so that a worker held by a long call cannot delay a forced exit.
    let signals = match crate::shutdown::start(FORCE_AFTER) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("canopy-{role}: cannot listen for signals: {e}");
            return ExitCode::FAILURE;
        }
    };
    let crate::shutdown::Signals { mut first, force } = signals;
    let result = runtime.block_on(async {
        let shutdown = Box::pin(async move {
            if first.wait_for(|f| *f).await.is_err() {
                // The signal thread is gone without a signal: no shutdown from it.
                std::future::pending::<()>().await;
            }
            crate::notify::stopping("draining after a signal");
        });
        let force = async move {
            match force.await {
                Ok(why) => why,
                Err(_) => std::future::pending().await,
            }
        };
        // On a worker, not on this thread: the daemon's tasks (streams, links, ranks) hand it work all the
        // time, and waking a task on a worker is cheaper than waking the thread that blocks on the runtime.
        let daemon = tokio::spawn(run(config, shutdown));
        tokio::select! {
            r = daemon => Some(r.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))),
            why = force => {
                tracing::warn!("exiting at once: {why}");
                eprintln!("canopy-{role}: exiting at once: {why}");
                None
            }
        }
    });
    let Some(result) = result else {
        // Dropping the runtime would wait for blocking tasks (a store writer finishing its queue, say): a forced
        // exit leaves them behind instead.
        runtime.shutdown_background();
        return ExitCode::FAILURE;
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("canopy-{role} failed: {e}");
            eprintln!("canopy-{role}: {e}");
            if e.is_refusal() {
                ExitCode::from(EXIT_REFUSED)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Lets `main` pick the exit code of a refused node.
pub trait IsRefusal {
    fn is_refusal(&self) -> bool;
}

/// Binds a listen address, naming it in the error.
pub async fn bind(addr: &str) -> Result<tokio::net::TcpListener, std::io::Error> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
}

/// A default node id: the role, the host, and a distinguishing suffix.
pub fn default_node_id(role: &str, suffix: &str) -> String {
    let host = crate::net::hostname();
    if suffix.is_empty() {
        format!("{role}@{host}")
    } else {
        format!("{role}@{host}:{suffix}")
    }
}

/// What every daemon's command line has besides its config keys: `--config` and the `validate` subcommand.
#[derive(clap::Parser)]
pub struct DaemonArgs {
    /// A TOML file whose table for this daemon ([frontend], [relay] or [agent]) configures it.
    #[arg(long, short = 'c', global = true, env = "CANOPY_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub command: Option<DaemonCommand>,
}

#[derive(clap::Subcommand)]
pub enum DaemonCommand {
    /// Check the configuration and exit (0: valid; 64: the bad key and its source are printed).
    Validate {
        /// Also print the configuration in force, as TOML, with where each value comes from.
        #[arg(long)]
        print: bool,
    },
}

/// A daemon's configuration as `main` needs it. It is its own command line: the struct derives `clap::Args`,
/// each field `#[arg(long)]`, so every key has its `--kebab-case` flag.
pub trait DaemonConfig:
    serde::de::DeserializeOwned + serde::Serialize + Default + crate::config::CheckConfig + clap::Args
{
    fn log_format(&self) -> LogFormat;
    /// The node's id when the configuration gives it (empty: the daemon names it once it runs).
    fn node_id(&self) -> &str;
    /// The runtime's worker threads.
    fn worker_threads(&self) -> usize;
}

/// A daemon's command line: [`DaemonArgs`] and one flag per key of its config struct `C`. Every flag is
/// optional (the file, the environment or the default fills what is not given) and global, so it may follow
/// `validate`.
pub fn command<C: clap::Args>(name: &'static str, about: &'static str) -> clap::Command {
    use clap::CommandFactory;
    C::augment_args(DaemonArgs::command())
        .mut_args(|arg| arg.required(false).global(true))
        .name(name)
        .bin_name(name)
        .about(about)
        .version(env!("CARGO_PKG_VERSION"))
}

/// The whole `main` of a daemon: parse the command line, load and check the configuration, then validate or run.
pub fn run_main<C, R, Fut, E>(role: &str, name: &'static str, about: &'static str, run: R) -> ExitCode
where
    C: DaemonConfig,
    R: FnOnce(C, std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display + IsRefusal + Send + 'static,
{
    use clap::FromArgMatches;
    let matches = command::<C>(name, about).get_matches();
    let args = DaemonArgs::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let flags = crate::config::flags_given::<C>(&matches).unwrap_or_else(|e| e.exit());
    let loaded = crate::config::load::<C, _>(role, args.config.as_deref(), &flags);
    let log = loaded.as_ref().map(DaemonConfig::log_format).unwrap_or_default();
    let validate = match args.command {
        Some(DaemonCommand::Validate { print: false }) => Validate::Check,
        Some(DaemonCommand::Validate { print: true }) if loaded.is_ok() => {
            match crate::config::effective::<C, _>(role, args.config.as_deref(), &flags) {
                Ok(text) => Validate::Print(text),
                Err(e) => {
                    eprintln!("canopy-{role}: {e}");
                    return ExitCode::from(crate::config::EXIT_CONFIG as u8);
                }
            }
        }
        Some(DaemonCommand::Validate { print: true }) => Validate::Check,
        None => Validate::No,
    };
    main(role, loaded, validate, log, run)
}
