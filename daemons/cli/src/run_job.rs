//! `canopy run -- LAUNCHER ARGS...`: one command for a real program on a workstation or a login node. It starts
//! a front-end and an agent on loopback, runs the launcher with Canopy's MPI wrapper and the agent's socket set
//! for every rank (Open MPI's `-x`, MPICH's `-genv`, Slurm's `--export`, or the environment of a plain program),
//! waits for the program, lets the tree finish, writes the report, and exits with the program's status.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use anyhow::{Context, bail};
use canopy_runtime::tls::Credentials;
use tokio::process::Command;

use crate::daemons::{
    Daemon, Launch, RunDir, binaries_dir, check_filters, security_flags, signal, spawn, stop_all, wait_ready,
};
use crate::kinds::Kind;
use crate::launcher::{Launcher, ranks_asked, warn_of_other_hosts, which};

#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    dir: RunDir,
    /// Filters to run as streams over the program's ranks, comma-separated.
    #[arg(long, default_value = "stats,outliers", value_delimiter = ',')]
    filters: Vec<String>,
    /// Keep each rank's own profile every round (a passthrough stream, the per-rank views of canopy watch and
    /// canopy report) when the launcher starts at most this many ranks (0: never).
    #[arg(long, default_value_t = 1024, value_name = "RANKS")]
    per_rank_up_to: u32,
    /// A filter's parameters, NAME=JSON (repeatable).
    #[arg(long = "filter-params", value_name = "NAME=JSON")]
    filter_params: Vec<String>,
    /// The application's name in the results (default: the program's file name).
    #[arg(long)]
    app: Option<String>,
    /// Canopy's MPI wrapper (default: $CANOPY_MPI_LIB, else the one of the program's MPI beside canopy or in
    /// ../lib: libcanopy_mpi.so, or libcanopy_mpi_mpich.so for a program linked with MPICH).
    #[arg(long, value_name = "PATH")]
    mpi_lib: Option<PathBuf>,
    /// Do not load the MPI wrapper: the program reports through the SDK itself.
    #[arg(long)]
    no_wrapper: bool,
    /// Monitor the program's OpenMP constructs too: every rank loads Canopy's OMPT tool (OMP_TOOL_LIBRARIES),
    /// which needs an OpenMP runtime with OMPT (LLVM's libomp, `clang -fopenmp`; not GCC's libgomp).
    #[arg(long)]
    openmp: bool,
    /// Canopy's OMPT tool (default: $CANOPY_OMP_LIB, else libcanopy_omp.so beside canopy or in ../lib).
    #[arg(long, value_name = "PATH", requires = "openmp")]
    omp_lib: Option<PathBuf>,
    /// Milliseconds a round waits for a missing rank.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u32,
    /// Do not write the HTML report at the end.
    #[arg(long)]
    no_report: bool,
    /// Plaintext between the daemons instead of mutual TLS (the tree is on loopback either way).
    #[arg(long)]
    insecure: bool,
    /// The launcher and its arguments (`mpirun -np 8 ./app`, `srun -n 8 ./app`, `./app`), after `--`.
    #[arg(last = true, required = true, value_name = "LAUNCHER ARGS")]
    command: Vec<String>,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run_job(args))
}

async fn run_job(mut args: RunArgs) -> anyhow::Result<ExitCode> {
    // From the start, so that no signal ends this process and leaves the daemons (in groups of their own).
    let mut signals = Signals::new()?;
    let launcher = Launcher::of(&args.command[0])?;
    let ranks = ranks_asked(launcher, &args.command);
    if ranks.is_some_and(|n| n <= args.per_rank_up_to) && !args.filters.iter().any(|f| f == "passthrough") {
        args.filters.push("passthrough".into());
    }
    let bin_dir = binaries_dir()?;
    if let Some(nodes) = slurm_nodes(launcher) {
        return delegate_to_canopy_run(&args, &bin_dir, nodes).await;
    }
    warn_of_other_hosts(launcher, &args.command);
    check_filters(&bin_dir, &args.filters, &args.filter_params)?;
    let logs = args.dir.prepare()?;
    let wrapper = match args.no_wrapper {
        true => None,
        false => wrapper(&args, &bin_dir, launcher)?,
    };
    let omp_tool = match args.openmp {
        true => Some(omp_tool(&args, &bin_dir, launcher)?),
        false => None,
    };
    // A socket path must be short (108 bytes): the run's own directory under the temporary one, made here and
    // now (one that is there already, another user's perhaps, is not taken), private to the user.
    let socket_dir = std::env::temp_dir().join(format!("canopy-run-{}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&socket_dir)
        .with_context(|| format!("cannot create {}", socket_dir.display()))?;
    let ready_dir = args.dir.ready_dir("run");
    let mut daemons: Vec<Daemon> = Vec::new();
    let result = match std::fs::create_dir_all(&ready_dir) {
        Ok(()) => {
            tree_and_program(
                &args,
                launcher,
                wrapper.as_deref(),
                omp_tool.as_deref(),
                &bin_dir,
                &logs,
                &ready_dir,
                &socket_dir,
                &mut daemons,
                &mut signals,
            )
            .await
        }
        Err(e) => Err(anyhow::anyhow!("cannot create {}: {e}", ready_dir.display())),
    };
    stop_all(&mut daemons).await;
    let _ = std::fs::remove_dir_all(&ready_dir);
    let _ = std::fs::remove_dir_all(&socket_dir);
    let (status, store) = result?;
    if !args.no_report
        && let Err(e) = crate::cmd::report::html_beside_store(&store)
    {
        eprintln!("canopy run: no report: {e:#}");
    }
    println!(
        "canopy run: {} {}; store {}",
        args.command[0],
        ended(status),
        store.display()
    );
    Ok(exit_code(status))
}

/// The signals `canopy run` answers for its whole life: an interrupt (Ctrl-C, which the program in the
/// terminal's group gets too), a termination (a batch system's end of job) and a hang-up (the terminal closed).
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal, in words.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "interrupted",
            _ = self.terminate.recv() => "terminated",
            _ = self.hangup.recv() => "hung up",
        }
    }
}

/// The wrapper the ranks load, if the program is an MPI program: one an MPI launcher starts, or a plain program
/// linked with an MPI library.
fn wrapper(args: &RunArgs, bin_dir: &Path, launcher: Launcher) -> anyhow::Result<Option<PathBuf>> {
    if launcher == Launcher::Plain && !links_mpi(&args.command[0]) {
        return Ok(None);
    }
    // The library built for the program's MPI: libcanopy_mpi for Open MPI (or whatever mpicc was at build
    // time), libcanopy_mpi_mpich for MPICH.
    let program = launcher
        .program_at(&args.command)
        .map(|i| which(&args.command[i]));
    // A program an MPI launcher starts that is not an MPI program (hostname, an OpenMP code) would carry a
    // wrapper that never starts, and ship nothing: it goes without, and reports through the SDK or the OMPT
    // tool. A script or a static executable keeps it: ldd cannot tell what it runs.
    if let Some(p) = &program
        && mpi_linkage(p) == Some(false)
    {
        println!(
            "canopy run: {} is not linked with MPI: no MPI wrapper",
            p.display()
        );
        return Ok(None);
    }
    let program_family = program.as_deref().and_then(libmpi_of).and_then(|l| family(&l));
    let file = match program_family {
        Some("MPICH") => "libcanopy_mpi_mpich.so",
        _ => "libcanopy_mpi.so",
    };
    let candidates = library_candidates(args.mpi_lib.as_deref(), "CANOPY_MPI_LIB", bin_dir, file);
    match candidates.iter().find(|p| p.is_file()) {
        Some(p) => {
            let lib = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            check_family(&lib, &args.command, launcher)?;
            if let Some(f) = program_family {
                println!("canopy run: the program uses {f}: MPI wrapper {}", lib.display());
            }
            Ok(Some(lib))
        }
        None => bail!(
            "Canopy's MPI wrapper is not at {}: build the workspace (cargo build --release --workspace), give \
             --mpi-lib, or --no-wrapper for a program that reports through the SDK",
            candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        ),
    }
}

/// Where a library of Canopy's may be: the path given, else the one the variable `var` names, else `file` beside
/// canopy or in the installation's library directory.
fn library_candidates(given: Option<&Path>, var: &str, bin_dir: &Path, file: &str) -> Vec<PathBuf> {
    match (given, std::env::var_os(var)) {
        (Some(p), _) => vec![p.to_path_buf()],
        (None, Some(p)) => vec![PathBuf::from(p)],
        (None, None) => ["", "../lib", "../lib64"]
            .iter()
            .map(|d| bin_dir.join(d).join(file))
            .collect(),
    }
}

/// The OMPT tool every rank loads for `--openmp`. A program whose OpenMP runtime has no OMPT is said to be one
/// (GCC's libgomp calls no tool), since the run would otherwise show no OpenMP and not say why.
fn omp_tool(args: &RunArgs, bin_dir: &Path, launcher: Launcher) -> anyhow::Result<PathBuf> {
    let candidates = library_candidates(
        args.omp_lib.as_deref(),
        "CANOPY_OMP_LIB",
        bin_dir,
        "libcanopy_omp.so",
    );
    let Some(lib) = candidates.iter().find(|p| p.is_file()) else {
        bail!(
            "Canopy's OMPT tool is not at {}: build the workspace (cargo build --release --workspace) or give \
             --omp-lib",
            candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        );
    };
    if let Some(program) = launcher
        .program_at(&args.command)
        .map(|i| which(&args.command[i]))
    {
        let libs = std::process::Command::new("ldd")
            .arg(&program)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let runtime = |name: &str| libs.lines().any(|l| l.trim().starts_with(name));
        if runtime("libgomp.so") && !runtime("libomp.so") && !runtime("libiomp5.so") {
            eprintln!(
                "canopy run: {} uses GCC's OpenMP runtime (libgomp), which has no OMPT: its OpenMP constructs \
                 will not be seen; build it with clang -fopenmp (LLVM's libomp) for them",
                program.display()
            );
        } else if !libs.is_empty() && !runtime("libomp.so") && !runtime("libiomp5.so") {
            eprintln!(
                "canopy run: {} is not linked with an OpenMP runtime that has OMPT (libomp, libiomp5); --openmp \
                 sees nothing unless the program loads one itself",
                program.display()
            );
        }
    }
    let lib = std::fs::canonicalize(lib).unwrap_or_else(|_| lib.clone());
    println!("canopy run: OpenMP through {}", lib.display());
    Ok(lib)
}

/// OMP_TOOL_LIBRARIES for the ranks: Canopy's tool first. The runtime starts the first tool of the list that
/// accepts, so one the user had set is kept after it, and said to be idle while Canopy's runs.
fn omp_tool_libraries(tool: &Path) -> String {
    match std::env::var("OMP_TOOL_LIBRARIES") {
        Ok(before) if before.contains("libcanopy_omp") => before,
        Ok(before) if !before.is_empty() => {
            eprintln!(
                "canopy run: OMP_TOOL_LIBRARIES was {before}; Canopy's OMPT tool goes first, and the OpenMP \
                 runtime starts only one tool, so those stay unused"
            );
            format!("{}:{before}", tool.display())
        }
        _ => tool.display().to_string(),
    }
}

/// The MPI library a binary is linked with, as the loader resolves it (`libmpi.so.40 => /usr/lib/...`).
fn libmpi_of(binary: &Path) -> Option<String> {
    let out = std::process::Command::new("ldd").arg(binary).output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("libmpi.so") || l.starts_with("libmpich.so"))
        .map(str::to_string)
}

/// The MPI family of a libmpi line of ldd: Open MPI's libmpi.so.40, MPICH's libmpi.so.12 (or libmpich).
fn family(libmpi: &str) -> Option<&'static str> {
    let lower = libmpi.to_ascii_lowercase();
    if lower.contains("openmpi") || libmpi.starts_with("libmpi.so.40") {
        Some("Open MPI")
    } else if lower.contains("mpich") || libmpi.starts_with("libmpi.so.12") {
        Some("MPICH")
    } else {
        None
    }
}

/// The wrapper calls into the MPI it was built for: a program linked with another family would crash in it or
/// measure nothing. Refused with both named, when both can be told.
fn check_family(wrapper: &Path, command: &[String], launcher: Launcher) -> anyhow::Result<()> {
    let Some(program) = launcher.program_at(command).map(|i| which(&command[i])) else {
        return Ok(());
    };
    let (Some(built), Some(linked)) = (libmpi_of(wrapper), libmpi_of(&program)) else {
        return Ok(());
    };
    match (family(&built), family(&linked)) {
        (Some(w), Some(p)) if w != p => bail!(
            "{} is linked with {p} ({linked}), but Canopy's MPI wrapper {} was built for {w} ({built}): rebuild \
             canopy with MPICC naming {p}'s mpicc, or give --mpi-lib a wrapper built for it",
            program.display(),
            wrapper.display()
        ),
        _ => Ok(()),
    }
}

/// Whether `program` (found on PATH if it has no slash) is linked with an MPI library.
fn links_mpi(program: &str) -> bool {
    mpi_linkage(&which(program)) == Some(true)
}

/// Whether a dynamic executable is linked with an MPI library; None when ldd cannot tell (a script, a static
/// executable, no ldd).
fn mpi_linkage(program: &Path) -> Option<bool> {
    let out = std::process::Command::new("ldd").arg(program).output().ok()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    (out.status.success() && !stdout.contains("not a dynamic executable")).then(|| stdout.contains("libmpi"))
}

/// The front-end and the agent up, the program run to its end, the tree finished: the program's status and the
/// store.
#[allow(clippy::too_many_arguments)]
async fn tree_and_program(
    args: &RunArgs,
    launcher: Launcher,
    wrapper: Option<&Path>,
    omp_tool: Option<&Path>,
    bin_dir: &Path,
    logs: &Path,
    ready_dir: &Path,
    socket_dir: &Path,
    daemons: &mut Vec<Daemon>,
    signals: &mut Signals,
) -> anyhow::Result<(ExitStatus, PathBuf)> {
    let creds = match args.insecure {
        true => None,
        false => Some(
            canopy_runtime::tls::write_credentials(&args.dir.out.join("tls"), &[], 30, true)
                .context("cannot make the run's certificates")?,
        ),
    };
    let security = security_flags(creds.as_ref());
    let fe_ready = ready_dir.join("frontend");
    let fe = frontend_launch(args, bin_dir, &fe_ready, &security, creds.as_ref());
    daemons.push(spawn("frontend", Kind::FrontEnd, fe, logs)?);
    let ready = tokio::select! {
        ready = wait_ready(&fe_ready, &mut daemons[0]) => ready?,
        why = signals.next() => bail!("{why} before the tree was up"),
    };
    let fe_addr = ready.addr.to_string();
    let store = ready.store.context("the front-end's ready file names no store")?;

    let socket = socket_dir.join("agent.sock");
    let agent = agent_launch(bin_dir, &security, &fe_addr, &socket);
    daemons.push(spawn("agent", Kind::Agent, agent, logs)?);
    tokio::select! {
        up = wait_socket(&socket, &mut daemons[1]) => up?,
        why = signals.next() => bail!("{why} before the tree was up"),
    }

    println!("canopy run: front-end {fe_addr}, store {}", store.display());
    println!("  watch it: {}", watch_command(&fe_addr, creds.as_ref()));
    println!("  logs      {}", logs.display());

    let env = rank_env(args, launcher, wrapper, omp_tool, &socket)?;
    let (line, own_env) = launcher.command_line(&args.command, &env);
    let status = run_program(&line, own_env, signals).await?;
    finish_tree(&mut daemons[0]).await;
    Ok((status, store))
}

/// How the run's front-end is started: on a free loopback port, ending the run on the ranks' FINs, with the
/// run's streams, and writing its ready file at `ready_file`.
fn frontend_launch(
    args: &RunArgs,
    bin_dir: &Path,
    ready_file: &Path,
    security: &[String],
    creds: Option<&Credentials>,
) -> Launch {
    let mut fe = Launch::new(bin_dir.join("canopy-frontend"));
    fe.args([
        "--listen",
        "127.0.0.1:0",
        "--exit-on-fin",
        "true",
        "--resume",
        "false",
    ])
    .args(["--out".to_string(), args.dir.out.display().to_string()])
    .args(["--streams", &args.filters.join(",")])
    .args(
        args.filter_params
            .iter()
            .flat_map(|p| ["--stream-params", p.as_str()]),
    )
    .args(["--stream-timeout-ms", &args.timeout_ms.to_string()])
    .args(["--ready-file".to_string(), ready_file.display().to_string()])
    .args(security.iter().cloned());
    if let Some(c) = creds {
        fe.args(["--token-file".to_string(), c.tokens().display().to_string()]);
    }
    fe
}

/// How the run's agent is started: a child of the front-end at `fe_addr`, serving the ranks on `socket`.
fn agent_launch(bin_dir: &Path, security: &[String], fe_addr: &str, socket: &Path) -> Launch {
    let mut agent = Launch::new(bin_dir.join("canopy-agent"));
    agent
        .args(security.iter().cloned())
        .args(["--node-id", "agent", "--parent", fe_addr])
        .args(["--socket".to_string(), socket.display().to_string()]);
    agent
}

/// The `canopy watch` command that watches the run's front-end at `fe_addr`, with the run's credentials or
/// without.
fn watch_command(fe_addr: &str, creds: Option<&Credentials>) -> String {
    match creds {
        Some(c) => format!("canopy watch --frontend {fe_addr} --tls-dir {}", c.dir.display()),
        None => format!("canopy watch --frontend {fe_addr} --insecure"),
    }
}

/// The environment Canopy sets for every rank: the agent's socket, the MPI wrapper preloaded, the OMPT tool,
/// the application's name and the user's own CANOPY_ settings. Refused under srun when a value holds a comma.
fn rank_env(
    args: &RunArgs,
    launcher: Launcher,
    wrapper: Option<&Path>,
    omp_tool: Option<&Path>,
    socket: &Path,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut env = vec![("CANOPY_AGENT_SOCKET".to_string(), socket.display().to_string())];
    if let Some(lib) = wrapper {
        env.push(("LD_PRELOAD".to_string(), ld_preload(lib)));
    }
    if let Some(tool) = omp_tool {
        env.push(("OMP_TOOL_LIBRARIES".to_string(), omp_tool_libraries(tool)));
    }
    if let Some(app) = &args.app {
        env.push(("CANOPY_APP".to_string(), app.clone()));
    }
    // The user's own settings for the ranks (CANOPY_MPI_DUMP_ON, CANOPY_QUEUE_DUMPS...) reach them too: Open
    // MPI passes on only what it is told to. (srun passes the whole environment.)
    if launcher != Launcher::Srun {
        for (name, value) in std::env::vars() {
            if name.starts_with("CANOPY_") && !env.iter().any(|(n, _)| *n == name) {
                env.push((name, value));
            }
        }
    } else if let Some((name, _)) = env.iter().find(|(_, v)| v.contains(',')) {
        bail!("{name} holds a comma, which srun's --export cannot pass");
    }
    Ok(env)
}

/// LD_PRELOAD for the ranks with the MPI wrapper `lib`. Canopy first: a tool loaded before it that calls PMPI_X
/// itself (Darshan's MPI_Init) would hide the calls from it; after it, every tool sees every call. One already
/// preloaded is left as it is.
fn ld_preload(lib: &Path) -> String {
    match std::env::var("LD_PRELOAD") {
        Ok(before) if before.contains("libcanopy_mpi") => before,
        Ok(before) if !before.is_empty() => format!("{}:{before}", lib.display()),
        _ => lib.display().to_string(),
    }
}

/// Starts the program (the launcher's command `line`, with the environment `own_env` it does not pass itself)
/// and waits for its end: its status. Ctrl-C reaches the program, in the terminal's process group, and ends
/// it; a termination or a hang-up is passed on to it. The tree (in groups of its own) is finished afterwards.
async fn run_program(
    line: &[String],
    own_env: Vec<(String, String)>,
    signals: &mut Signals,
) -> anyhow::Result<ExitStatus> {
    let mut program = Command::new(&line[0]);
    program.args(&line[1..]).envs(own_env).kill_on_drop(true);
    let mut child = program
        .spawn()
        .with_context(|| format!("cannot start {}", line[0]))?;
    loop {
        tokio::select! {
            status = child.wait() => return Ok(status?),
            why = signals.next() => {
                eprintln!("canopy run: {why}; waiting for the program to end");
                if why != "interrupted" {
                    signal_child(&child, nix::sys::signal::Signal::SIGTERM);
                }
            }
        }
    }
}

/// Lets the front-end end the run once the program has ended. Every rank said FIN: the front-end ends the run
/// on its own. Ranks that died without one (or a program that never reported) are waited for a few seconds,
/// then the front-end drains the tree: what the agent holds is stored, and its rounds close with the ranks
/// counted.
async fn finish_tree(frontend: &mut Daemon) {
    if frontend.wait_reaped(FIN_WAIT).await.is_none() {
        signal(&frontend.child, nix::sys::signal::Signal::SIGTERM);
        frontend.wait_reaped(Duration::from_secs(30)).await;
    }
}

/// Sends `sig` to the program's process.
fn signal_child(child: &tokio::process::Child, sig: nix::sys::signal::Signal) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

/// How long the front-end is given, once the program has ended, to end the run on the ranks' FINs.
const FIN_WAIT: Duration = Duration::from_secs(3);

/// Waits for the agent's socket; the agent's last log lines if it exits first.
async fn wait_socket(socket: &Path, agent: &mut Daemon) -> anyhow::Result<()> {
    for _ in 0..1000 {
        if socket.exists() {
            return Ok(());
        }
        if let Some(status) = agent.child.try_wait()? {
            let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            bail!(
                "the agent exited with {status} before its socket was there:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("the agent's socket {} was not there after 20 s", socket.display())
}

/// The nodes of the Slurm allocation this runs in when `srun` would start ranks on other nodes than this one
/// (more than one, or one that is not this host): an agent here would serve none of them, so the tree must be
/// laid over the allocation (`canopy-run`).
fn slurm_nodes(launcher: Launcher) -> Option<u32> {
    if launcher != Launcher::Srun {
        return None;
    }
    std::env::var_os("SLURM_JOB_ID")?;
    let nodes: u32 = ["SLURM_JOB_NUM_NODES", "SLURM_NNODES"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())?;
    // One node that is not this one (salloc's shell on a login node) is another node too.
    let here = nix::unistd::gethostname().ok()?.to_string_lossy().into_owned();
    let short = here.split('.').next().unwrap_or(&here).to_string();
    let elsewhere = std::env::var("SLURM_JOB_NODELIST").is_ok_and(|list| list != short && list != here);
    (nodes > 1 || elsewhere).then_some(nodes)
}

/// Inside a Slurm allocation of several nodes, `canopy-run` does the work: a front-end here, an agent on every
/// node and relays as the fanout calls for, the application under `srun` with its socket on each node.
async fn delegate_to_canopy_run(args: &RunArgs, bin_dir: &Path, nodes: u32) -> anyhow::Result<ExitCode> {
    let script = [
        bin_dir.join("canopy-run"),
        bin_dir.join("../share/canopy/canopy-run"),
        // A build tree: target/<profile>/canopy beside the repository's deploy/.
        bin_dir.join("../../deploy/slurm/canopy-run"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .with_context(|| {
        format!(
            "srun starts ranks on {nodes} nodes of this allocation, which needs canopy-run (deploy/slurm/canopy-run) \
             beside canopy; it is not there"
        )
    })?;
    let Some(at) = Launcher::Srun.program_at(&args.command) else {
        bail!("no program after srun's own arguments: canopy run -- srun [SRUN ARGS] PROGRAM ARGS...");
    };
    let (srun_args, program) = (&args.command[1..at], &args.command[at..]);
    let mut cmd = Command::new(&script);
    cmd.args(["--filters", &args.filters.join(",")])
        .args(["--timeout-ms", &args.timeout_ms.to_string()])
        .args(["--out".to_string(), args.dir.out.display().to_string()])
        .args(["--bin".to_string(), bin_dir.display().to_string()])
        .args(["--srun-args", &srun_args.join(" ")]);
    // The wrapper for an MPI program; one that reports through the SDK itself needs none.
    if !args.no_wrapper && links_mpi(&program[0]) {
        cmd.arg("--mpi");
    }
    if let Some(lib) = &args.mpi_lib {
        cmd.env("CANOPY_MPI_LIB", lib);
    }
    if let Some(app) = &args.app {
        cmd.env("CANOPY_APP", app);
    }
    // srun passes the whole environment, so every rank on every node finds the tool.
    if args.openmp {
        cmd.env(
            "OMP_TOOL_LIBRARIES",
            omp_tool_libraries(&omp_tool(args, bin_dir, Launcher::Srun)?),
        );
    }
    cmd.arg("--").args(program);
    println!(
        "canopy run: srun over {nodes} nodes: {} lays the tree over the allocation",
        script.display()
    );
    let status = cmd
        .status()
        .await
        .with_context(|| format!("cannot start {}", script.display()))?;
    // canopy-run leaves the run's store in --out; the report goes beside it, as for a run here.
    if !args.no_report
        && let Err(e) = crate::cmd::report::html_beside_store(&args.dir.out)
    {
        eprintln!("canopy run: no report: {e:#}");
    }
    Ok(exit_code(status))
}

/// How the program ended, in words.
fn ended(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        (None, None) => format!("ended ({status})"),
    }
}

/// The program's status as `canopy run`'s own: its code, or 128 + the signal that ended it, as a shell says.
fn exit_code(status: ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_mpi_library_is_told_by_its_soname_or_its_path() {
        assert_eq!(
            family("libmpi.so.40 => /lib/x86_64-linux-gnu/libmpi.so.40 (0x7f)"),
            Some("Open MPI")
        );
        assert_eq!(
            family("libmpi.so.12 => /usr/lib/x86_64-linux-gnu/libmpi.so.12 (0x7f)"),
            Some("MPICH")
        );
        assert_eq!(
            family("libmpich.so.12 => /opt/mpich/lib/libmpich.so.12"),
            Some("MPICH")
        );
        assert_eq!(family("libmpi.so.0 => /opt/other/lib/libmpi.so.0"), None);
    }

    #[test]
    fn a_signal_ends_with_128_and_its_number() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), ExitCode::from(3));
        assert_eq!(exit_code(ExitStatus::from_raw(9)), ExitCode::from(137));
    }
}
