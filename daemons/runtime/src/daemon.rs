//! What every daemon's thin `main` shares: config errors exit 64, `validate` checks and exits, logs are set
//! up once, and `run(config, shutdown)` gets SIGINT/SIGTERM as its shutdown future.

use std::future::Future;
use std::process::ExitCode;

use crate::config::{ConfigError, EXIT_CONFIG, LogFormat};

/// The exit code for a node its parent refused (protocol mismatch, duplicate id): EX_PROTOCOL.
pub const EXIT_REFUSED: u8 = 76;

/// How long a clean shutdown may take after the first signal before the process exits without it: room for the
/// front-end's drain (`drain_timeout_ms`, 12 s) and then its subscribers and its store's last writes.
pub const FORCE_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

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
    C: DaemonConfig + Send + 'static,
    F: FnOnce(C, std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut + Send + 'static,
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
    crate::telemetry::init_daemon(role, &config.common().node_id, log, "info");
    crate::memory::watch(config.common().memory_budget_mb);
    match crate::net::raise_fd_limit() {
        Ok(limit) => tracing::debug!(limit, "open descriptors"),
        Err(e) => tracing::warn!("cannot raise the limit on open descriptors: {e}"),
    }
    // Counted on a thread of their own, so that a worker held by a long call cannot delay a forced exit.
    let crate::shutdown::Signals { mut first, force } = match crate::shutdown::start(FORCE_AFTER) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("canopy-{role}: cannot listen for signals: {e}");
            return ExitCode::FAILURE;
        }
    };
    let shutdown: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
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
    let workers = config.common().worker_threads;
    let daemon = move || run(config, shutdown);
    let ended = match workers {
        1 => on_one_thread(daemon, force),
        n => on_workers(n, daemon, force),
    };
    let result = match ended {
        Ok(Ended::Ran(result)) => result,
        Ok(Ended::Forced(why)) => {
            tracing::warn!("exiting at once: {why}");
            eprintln!("canopy-{role}: exiting at once: {why}");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("canopy-{role}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
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

/// How a daemon's run ended.
enum Ended<T> {
    /// The daemon returned.
    Ran(T),
    /// A second signal, or a clean shutdown past its time: the process ends now, whatever still runs.
    Forced(&'static str),
}

/// One worker: a current-thread runtime on a thread of its own. The daemon's tasks (a link's stream, the HTTP/2
/// connection, the node) hand each other work on one run queue, with none of a work-stealing scheduler's
/// bookkeeping on each wake. This thread only waits, for the daemon's end or a forced exit, which a long call on
/// the worker cannot delay.
fn on_one_thread<F, Fut>(
    daemon: F,
    force: impl Future<Output = &'static str>,
) -> std::io::Result<Ended<Fut::Output>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future,
    Fut::Output: Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("canopy-blocking")
        .build()?;
    let (done_tx, done) = tokio::sync::oneshot::channel();
    let worker = std::thread::Builder::new()
        .name(WORKER_THREAD.into())
        .spawn(move || {
            let result = runtime.block_on(async move { daemon().await });
            // Its blocking tasks end before the daemon is said to have ended, as a multi-threaded runtime's do.
            drop(runtime);
            let _ = done_tx.send(result);
        })?;
    let waiter = tokio::runtime::Builder::new_current_thread().build()?;
    Ok(waiter.block_on(async move {
        tokio::select! {
            result = done => match result {
                Ok(result) => Ended::Ran(result),
                // The worker dropped its sender as it unwound: its panic goes on here.
                Err(_) => std::panic::resume_unwind(match worker.join() {
                    Err(panic) => panic,
                    Ok(()) => Box::new("the worker thread ended without the daemon's result"),
                }),
            },
            why = force => Ended::Forced(why),
        }
    }))
}

/// Several workers: a multi-threaded runtime, the daemon on one of them.
fn on_workers<F, Fut>(
    workers: usize,
    daemon: F,
    force: impl Future<Output = &'static str>,
) -> std::io::Result<Ended<Fut::Output>>
where
    F: FnOnce() -> Fut,
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()?;
    let ended = runtime.block_on(async {
        // On a worker, not on this thread: the daemon's tasks (streams, links, ranks) hand it work all the
        // time, and waking a task on a worker is cheaper than waking the thread that blocks on the runtime.
        let daemon = tokio::spawn(daemon());
        tokio::select! {
            r = daemon => Ended::Ran(r.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))),
            why = force => Ended::Forced(why),
        }
    });
    if let Ended::Forced(_) = ended {
        // Dropping the runtime would wait for blocking tasks (a store writer finishing its queue, say): a forced
        // exit leaves them behind instead.
        runtime.shutdown_background();
    }
    Ok(ended)
}

/// The name of a one-worker daemon's thread that runs its tasks.
pub const WORKER_THREAD: &str = "canopy-worker";

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
    /// The keys every daemon has: its log format, node id (empty: the daemon names it once it runs), worker
    /// threads and memory budget (watched against its resident size) among them.
    fn common(&self) -> &crate::common::CommonConfig;
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
    C: DaemonConfig + Send + 'static,
    R: FnOnce(C, std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display + IsRefusal + Send + 'static,
{
    use clap::FromArgMatches;
    let matches = command::<C>(name, about).get_matches();
    let args = DaemonArgs::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let flags = crate::config::flags_given::<C>(&matches).unwrap_or_else(|e| e.exit());
    let loaded = crate::config::load::<C, _>(role, args.config.as_deref(), &flags);
    let log = loaded.as_ref().map(|c| c.common().log_format).unwrap_or_default();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn never() -> impl Future<Output = &'static str> {
        std::future::pending()
    }

    /// The daemon runs on the worker thread, its tasks beside it, and its result comes back.
    #[test]
    fn one_worker_runs_the_daemon_and_its_tasks_on_its_own_thread() {
        let ended = on_one_thread(
            || async {
                let name = || std::thread::current().name().map(str::to_string);
                let task = tokio::spawn(async move { name() }).await.unwrap();
                (name(), task)
            },
            never(),
        )
        .unwrap();
        let Ended::Ran((daemon, task)) = ended else {
            panic!("the daemon did not return its result");
        };
        assert_eq!(daemon.as_deref(), Some(WORKER_THREAD));
        assert_eq!(task.as_deref(), Some(WORKER_THREAD));
    }

    /// A panic on the worker goes on in the caller, with its message.
    #[test]
    fn a_panic_on_the_one_worker_goes_on_in_the_caller() {
        let caught = std::panic::catch_unwind(|| {
            let _ = on_one_thread(|| async { panic!("the daemon broke") }, never());
        })
        .unwrap_err();
        assert_eq!(caught.downcast_ref::<&str>(), Some(&"the daemon broke"));
    }

    /// A worker held by a call that does not return cannot delay a forced exit: the word to exit comes once the
    /// worker is inside its call, and is taken while the call still runs.
    #[test]
    fn a_held_worker_does_not_delay_a_forced_exit() {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (inside_tx, inside) = tokio::sync::oneshot::channel::<()>();
        let (ended_tx, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let ended = on_one_thread(
                move || async move {
                    let _ = inside_tx.send(());
                    // Blocks the worker itself, as a hung inline filter call would.
                    let _ = held.recv();
                },
                async move {
                    let _ = inside.await;
                    "a second signal"
                },
            );
            let _ = ended_tx.send(ended.map(|e| matches!(e, Ended::Forced("a second signal"))));
        });
        let forced = ended.recv_timeout(std::time::Duration::from_secs(30));
        drop(release);
        assert!(
            matches!(forced, Ok(Ok(true))),
            "the forced exit waited for the held worker"
        );
    }
}
