//! `canopy`: the user's command. `canopy up` launches a whole local tree of real processes with simulated
//! ranks and shows the rounds live; `canopy topology` prints the parent of every node of a tree shape; `canopy
//! report` and `canopy export` turn a run's store into an HTML page of figures or into CSV and Parquet files.

#![forbid(unsafe_code)]

mod certs;
mod client;
mod cmd;
mod daemons;
mod fit;
mod generate;
mod keys;
mod kinds;
mod launcher;
mod render;
mod run_job;
mod top;
mod topology_cmd;
mod tui;
mod units;
mod up;
mod watch;

use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "canopy",
    version,
    about = "Canopy: an online performance monitor for parallel applications"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a local tree (front-end, relays, agents with simulated ranks) on loopback and watch its rounds.
    Up(up::UpArgs),
    /// Run a real program under a local tree, one command: `canopy run -- mpirun -np 8 ./app`. Starts a
    /// front-end and an agent, gives every rank the MPI wrapper and the agent's socket (Open MPI, MPICH, srun or a
    /// plain program), waits for the program, writes the report, and exits with the program's status.
    Run(run_job::RunArgs),
    /// The running tree with the state of every node; or, with --fanout/--spec/--file, the parent of every
    /// node of a tree shape.
    Topology(topology_cmd::TopologyArgs),
    /// List, open and close streams on a running tree.
    Streams {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        cmd: client::StreamsCmd,
    },
    /// Start or stop collection on a running tree.
    Ctl {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        cmd: client::CtlCmd,
    },
    /// Make the certificates of a tree: a site CA, node and client certificates, or one run's set.
    #[command(subcommand)]
    Certs(certs::CertsCmd),
    /// Every stream live: utilization as stacked bars (10 s of 100 ms bars, or 250 ms of 1 ms bars), other
    /// streams as tables (top events, histograms, classes); a line per period when piped or with --plain.
    Watch {
        #[command(flatten)]
        target: client::Target,
        #[command(flatten)]
        args: watch::WatchArgs,
    },
    /// The live tree, refreshed every second: a row per node with its state, rounds/s, lag, traffic and troubles;
    /// one plain table with --once or when piped.
    Top {
        #[command(flatten)]
        target: client::Target,
        #[command(flatten)]
        args: top::TopArgs,
    },
    /// Print the completion script for a shell (deploy/install.sh installs bash's, zsh's and fish's).
    Completions(generate::CompletionsArgs),
    /// Print the man page of canopy, or with --out write one page per command and subcommand.
    Man(generate::ManArgs),
    /// Write the protobuf descriptor set of every message Canopy sends (RoundUpdate, the filters' results), for
    /// consumers in other languages (docs/kafka.md).
    Descriptors(generate::DescriptorsArgs),
    /// A run's store as one self-contained HTML page of figures (summary, coverage, top events with their
    /// spread, histograms as heat maps, classes, utilization, outliers, clusters, nodes), or one figure as PNG.
    Report(cmd::report::ReportArgs),
    /// A run's tables as CSV or Parquet files, one per table, with event names and units in column names.
    Export(cmd::export::ExportArgs),
}

fn block_on(f: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)?;
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Up(a) => up::run(a),
        Command::Run(a) => run_job::run(a),
        Command::Topology(a) => topology_cmd::run(a),
        Command::Certs(cmd) => certs::run(cmd).map(|()| ExitCode::SUCCESS),
        Command::Streams { target, cmd } => block_on(client::streams(target, cmd)),
        Command::Ctl { target, cmd } => block_on(client::ctl(target, cmd)),
        Command::Watch { target, args } => block_on(watch::watch(target, args)),
        Command::Top { target, args } => block_on(top::run(target, args)),
        Command::Completions(a) => generate::completions(Args::command(), a).map(|()| ExitCode::SUCCESS),
        Command::Man(a) => generate::man(Args::command(), a).map(|()| ExitCode::SUCCESS),
        Command::Descriptors(a) => generate::descriptors(a).map(|()| ExitCode::SUCCESS),
        Command::Report(a) => cmd::report::run(a).map(|()| ExitCode::SUCCESS),
        Command::Export(a) => cmd::export::run(a).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("canopy: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command as Process;

    use clap::CommandFactory as _;

    use super::Args;
    use crate::generate::{completion_script, man_pages};

    /// Every visible subcommand path of the CLI, as the man pages name them: `canopy-streams-list`.
    fn command_paths(cmd: &clap::Command, prefix: &str, out: &mut Vec<String>) {
        out.push(prefix.to_string());
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            command_paths(sub, &format!("{prefix}-{}", sub.get_name()), out);
        }
    }

    /// `canopy ctl set ARGS` as parsed, or clap's message.
    fn ctl_set(args: &[&str]) -> Result<crate::client::CtlCmd, String> {
        use clap::Parser as _;
        let all = ["canopy", "ctl", "set"].iter().chain(args);
        match Args::try_parse_from(all).map_err(|e| e.to_string())?.command {
            super::Command::Ctl { cmd, .. } => Ok(cmd),
            _ => unreachable!("ctl parses as ctl"),
        }
    }

    #[test]
    fn ctl_set_with_app_takes_the_fields_an_application_has_and_zero_sampling_is_explicit() {
        let Ok(crate::client::CtlCmd::Set {
            app, sample_below, ..
        }) = ctl_set(&["--app", "analysis", "--sample-below", "0"])
        else {
            panic!("ctl set --app parses")
        };
        assert_eq!((app.as_deref(), sample_below), (Some("analysis"), Some(0)));
        let Ok(crate::client::CtlCmd::Set { sample_below, .. }) = ctl_set(&[]) else {
            panic!("ctl set parses")
        };
        assert_eq!(sample_below, None, "no --sample-below: absent, not 0");
        for global in ["--period-ms", "--modules", "--trace-ranks", "--counters"] {
            let e = ctl_set(&["--app", "analysis", global, "1"]).unwrap_err();
            assert!(e.contains("cannot be used with") && e.contains(global), "{e}");
        }
    }

    #[test]
    fn ctl_set_time_rounds_is_on_off_or_unset_and_global_only() {
        let time_rounds = |args: &[&str]| match ctl_set(args) {
            Ok(crate::client::CtlCmd::Set { time_rounds, .. }) => Ok(time_rounds),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        };
        assert_eq!(time_rounds(&["--time-rounds", "on"]), Ok(Some(true)));
        assert_eq!(time_rounds(&["--time-rounds", "off"]), Ok(Some(false)));
        assert_eq!(time_rounds(&[]), Ok(None), "unset: the front-end's key holds");
        let e = time_rounds(&["--time-rounds", "yes"]).unwrap_err();
        assert!(e.contains("\"yes\" is neither on nor off"), "{e}");
        // Rounds mean the same window for every application: not an application's own option.
        let e = time_rounds(&["--app", "analysis", "--time-rounds", "on"]).unwrap_err();
        assert!(
            e.contains("cannot be used with") && e.contains("--time-rounds"),
            "{e}"
        );
    }

    #[test]
    fn every_command_and_subcommand_gets_a_man_page() {
        let cmd = Args::command();
        let mut expected = Vec::new();
        command_paths(&cmd, "canopy", &mut expected);
        let mut expected: Vec<String> = expected.into_iter().map(|p| format!("{p}.1")).collect();
        expected.sort();
        let mut names: Vec<String> = man_pages(cmd).unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names[0], "canopy.1");
        names.sort();
        assert_eq!(names, expected);
        for page in [
            "canopy-up.1",
            "canopy-streams-list.1",
            "canopy-man.1",
            "canopy-completions.1",
        ] {
            assert!(names.iter().any(|n| n == page), "no {page}");
        }
    }

    #[test]
    fn the_man_page_of_up_documents_every_option_of_up() {
        let cmd = Args::command();
        let up = cmd.find_subcommand("up").unwrap().clone();
        let pages = man_pages(cmd).unwrap();
        let (_, page) = pages.iter().find(|(n, _)| n == "canopy-up.1").unwrap();
        let page = String::from_utf8(page.clone()).unwrap();
        assert!(page.contains(".TH canopy-up 1"), "{page}");
        let mut checked = 0;
        for arg in up.get_arguments().filter(|a| !a.is_hide_set()) {
            let Some(long) = arg.get_long() else { continue };
            // roff writes a hyphen as \-.
            let flag = format!("--{long}").replace('-', "\\-");
            assert!(
                page.contains(&flag),
                "canopy-up.1 does not document --{long}:\n{page}"
            );
            if let Some(help) = arg.get_help() {
                let first = help.to_string();
                let word = first.split_whitespace().next().unwrap();
                assert!(page.contains(word), "canopy-up.1 lacks the help of --{long}");
            }
            checked += 1;
        }
        assert!(checked >= 10, "up has {checked} options");
        // The page is the command's, not another's: no option of `topology` that `up` lacks.
        assert!(!page.contains("\\-\\-leaves"), "{page}");
    }

    #[test]
    fn the_bash_completion_is_valid_bash_and_completes_every_subcommand() {
        let cmd = Args::command();
        let script = String::from_utf8(completion_script(cmd.clone(), clap_complete::Shell::Bash)).unwrap();
        let check = Process::new("bash")
            .args(["-n", "-c", &script])
            .output()
            .expect("bash runs");
        assert!(
            check.status.success(),
            "{}",
            String::from_utf8_lossy(&check.stderr)
        );
        let complete = |words: &str, cword: usize| {
            let probe = format!(
                "{script}\nCOMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE=\"${{COMP_WORDS[*]}}\"; \
                 COMP_POINT=${{#COMP_LINE}}; _canopy canopy \"${{COMP_WORDS[$COMP_CWORD]}}\" \
                 \"${{COMP_WORDS[$COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\""
            );
            let out = Process::new("bash")
                .args(["-c", &probe])
                .output()
                .expect("bash runs");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect::<Vec<String>>()
        };
        let offered = complete("canopy ''", 1);
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            assert!(
                offered.iter().any(|w| w == sub.get_name()),
                "{} not offered: {offered:?}",
                sub.get_name()
            );
        }
        // A prefix narrows the choice, and the options of a subcommand are offered after it.
        assert_eq!(complete("canopy wa", 1), ["watch"]);
        let up = complete("canopy up --", 2);
        for arg in cmd
            .find_subcommand("up")
            .unwrap()
            .get_arguments()
            .filter(|a| !a.is_hide_set())
        {
            if let Some(long) = arg.get_long() {
                assert!(
                    up.iter().any(|w| w == &format!("--{long}")),
                    "--{long} not offered: {up:?}"
                );
            }
        }
    }
}
