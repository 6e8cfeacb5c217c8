//! The launchers `canopy run` starts a program with, and how each is given the environment every rank needs:
//! Open MPI's `mpirun` (`-x`), Hydra's `mpiexec` of MPICH, Intel MPI and MVAPICH (`-genv`), Slurm's `srun`
//! (`--export`), or the program itself; where a launcher's own options end and the program begins, and how many
//! ranks they ask for.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// How the program's ranks are started, which decides how they get the wrapper and the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// Open MPI's `mpirun`/`mpiexec` (or PRRTE's `prterun`): `-x NAME=VALUE`.
    OpenMpi,
    /// MPICH's or Intel MPI's Hydra `mpiexec`/`mpirun`: `-genv NAME VALUE`.
    Hydra,
    /// Slurm's `srun`: `--export=ALL,NAME=VALUE,...`.
    Srun,
    /// A program started directly: its own environment (the wrapper only if it is linked with MPI).
    Plain,
}

impl Launcher {
    /// The launcher `program` is, asking an `mpirun` or `mpiexec` for its version.
    pub fn of(program: &str) -> anyhow::Result<Launcher> {
        match Launcher::of_name(program) {
            None => Ok(Launcher::Plain),
            Some(Some(known)) => Ok(known),
            Some(None) => {
                let out = std::process::Command::new(program).arg("--version").output();
                let text = out
                    .map(|o| {
                        format!(
                            "{}{}",
                            String::from_utf8_lossy(&o.stdout),
                            String::from_utf8_lossy(&o.stderr)
                        )
                    })
                    .unwrap_or_default();
                Launcher::of_version(&text).with_context(|| {
                    let said = text.lines().next().unwrap_or("nothing");
                    format!(
                        "{program} --version names neither Open MPI nor MPICH, Intel MPI or MVAPICH ({said}): its \
                         ranks cannot be given the wrapper and the socket; start them with CANOPY_AGENT_SOCKET and \
                         LD_PRELOAD set as that launcher passes environment (sdk/README.md)"
                    )
                })
            }
        }
    }

    /// Whether `program` is a launcher by its name: `None` if not, `Some(None)` for an `mpirun` or `mpiexec`
    /// whose family its `--version` tells.
    pub(crate) fn of_name(program: &str) -> Option<Option<Launcher>> {
        let name = Path::new(program)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match name.as_str() {
            "srun" => Some(Some(Launcher::Srun)),
            "orterun" | "prterun" | "prun" => Some(Some(Launcher::OpenMpi)),
            "mpiexec.hydra" => Some(Some(Launcher::Hydra)),
            n if n.starts_with("mpirun") || n.starts_with("mpiexec") => Some(None),
            _ => None,
        }
    }

    /// The launcher an `mpirun --version` text names: Hydra (MPICH, Intel MPI, MVAPICH) or Open MPI (ORTE,
    /// PRRTE); none for another (a vendor's launcher passes environment its own way).
    pub fn of_version(text: &str) -> Option<Launcher> {
        let hydra = ["HYDRA", "MPICH", "Intel(R) MPI", "MVAPICH"];
        let open_mpi = ["Open MPI", "OpenRTE", "PRRTE", "prterun"];
        if hydra.iter().any(|h| text.contains(h)) {
            Some(Launcher::Hydra)
        } else if open_mpi.iter().any(|o| text.contains(o)) {
            Some(Launcher::OpenMpi)
        } else {
            None
        }
    }

    /// How many arguments after `opt` are its values (`--mca NAME VALUE` takes two); 0 for a flag or an option
    /// that carries its value (`--ntasks=8`, `-N2`). An option not known here is taken for a flag.
    fn values_of(self, opt: &str) -> usize {
        if opt.contains('=') {
            return 0;
        }
        if self != Launcher::Srun && HOST_OPTIONS.contains(&opt) {
            return 1;
        }
        let (one, two) = self.valued_options();
        if two.contains(&opt) {
            2
        } else {
            usize::from(one.contains(&opt))
        }
    }

    /// The launcher's own options that take one value and those that take two, host options aside.
    fn valued_options(self) -> (&'static [&'static str], &'static [&'static str]) {
        match self {
            Launcher::OpenMpi => (OPEN_MPI_ONE_VALUE, OPEN_MPI_TWO_VALUES),
            Launcher::Hydra => (HYDRA_ONE_VALUE, HYDRA_TWO_VALUES),
            Launcher::Srun => (SRUN_ONE_VALUE, &[]),
            Launcher::Plain => (&[], &[]),
        }
    }

    /// Where the program starts in `command` (the launcher first): after the launcher's own options and their
    /// values. `None` when nothing follows them.
    pub(crate) fn program_at(self, command: &[String]) -> Option<usize> {
        if self == Launcher::Plain {
            return Some(0);
        }
        let mut i = 1;
        while let Some(arg) = command.get(i) {
            if !arg.starts_with('-') {
                return Some(i);
            }
            if arg == "--" {
                return (i + 1 < command.len()).then_some(i + 1);
            }
            i += 1 + self.values_of(arg);
        }
        None
    }

    /// The command line that starts `command` (launcher first) with `env` set for every rank, and the variables
    /// to set on the launcher's own process (a plain program's).
    pub fn command_line(
        self,
        command: &[String],
        env: &[(String, String)],
    ) -> (Vec<String>, Vec<(String, String)>) {
        let (program, rest) = command.split_first().expect("a command is required");
        let mut line = vec![program.clone()];
        match self {
            Launcher::OpenMpi => {
                for (k, v) in env {
                    line.extend(["-x".to_string(), format!("{k}={v}")]);
                }
            }
            Launcher::Hydra => {
                for (k, v) in env {
                    line.extend(["-genv".to_string(), k.clone(), v.clone()]);
                }
            }
            Launcher::Srun => {
                // ALL passes the rest of the environment (the user's CANOPY_ settings, with commas or not);
                // a user's own --export keeps its list, with these added.
                let vars: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let theirs = rest.iter().find_map(|a| a.strip_prefix("--export="));
                let base = match theirs {
                    None => "ALL".to_string(),
                    Some(t) => t.to_string(),
                };
                line.push(format!("--export={base},{}", vars.join(",")));
                line.extend(rest.iter().filter(|a| !a.starts_with("--export=")).cloned());
                return (line, Vec::new());
            }
            Launcher::Plain => {
                line.extend(rest.iter().cloned());
                return (line, env.to_vec());
            }
        }
        line.extend(rest.iter().cloned());
        (line, Vec::new())
    }
}

/// The MPI launchers' options that name hosts (each takes one value): Open MPI's and Hydra's.
const HOST_OPTIONS: &[&str] = &[
    "-H",
    "--host",
    "-host",
    "--hostfile",
    "-hostfile",
    "--machinefile",
    "-machinefile",
    "--default-hostfile",
    "--rankfile",
    "-f",
    "-hosts",
];

/// Open MPI's options that take one value (`-np 8`, `--map-by core`).
const OPEN_MPI_ONE_VALUE: &[&str] = &[
    "-np",
    "-n",
    "-c",
    "--np",
    "--n",
    "-x",
    "--map-by",
    "--rank-by",
    "--bind-to",
    "--wdir",
    "-wdir",
    "--prefix",
    "--output-filename",
    "-N",
    "--npernode",
    "--app",
    "--preload-files",
    "--personality",
];

/// Open MPI's options that take two values (`--mca NAME VALUE`).
const OPEN_MPI_TWO_VALUES: &[&str] = &["--mca", "-mca", "--gmca", "-gmca", "--prtemca"];

/// Hydra's options that take one value (`-n 8`, `-ppn 2`).
const HYDRA_ONE_VALUE: &[&str] = &[
    "-n",
    "-np",
    "-ppn",
    "-genvlist",
    "-envlist",
    "-wdir",
    "-bind-to",
    "-map-by",
    "-launcher",
    "-iface",
    "-configfile",
];

/// Hydra's options that take two values (`-genv NAME VALUE`).
const HYDRA_TWO_VALUES: &[&str] = &["-genv", "-env"];

/// srun's options that take one value (`-n 8`, `--partition debug`); none takes two.
const SRUN_ONE_VALUE: &[&str] = &[
    "-n",
    "-N",
    "-c",
    "-p",
    "-t",
    "-J",
    "-o",
    "-e",
    "-i",
    "-w",
    "-x",
    "-A",
    "-q",
    "-m",
    "-B",
    "-D",
    "-d",
    "-G",
    "-L",
    "-M",
    "-S",
    "-W",
    "-T",
    "--ntasks",
    "--nodes",
    "--cpus-per-task",
    "--partition",
    "--time",
    "--job-name",
    "--output",
    "--error",
    "--input",
    "--nodelist",
    "--exclude",
    "--account",
    "--qos",
    "--mpi",
    "--ntasks-per-node",
    "--chdir",
    "--export",
    "--gres",
    "--mem",
    "--mem-per-cpu",
    "--distribution",
    "--nodefile",
    "--constraint",
    "--reservation",
    "--cpu-bind",
    "--het-group",
    "--gpus",
    "--time-min",
    "--signal",
];

/// Ranks on other hosts than this one cannot reach this host's agent: said once when the launcher is given
/// other hosts.
pub(crate) fn warn_of_other_hosts(launcher: Launcher, command: &[String]) {
    let host_flags = HOST_OPTIONS;
    let end = launcher.program_at(command).unwrap_or(command.len());
    let given = command[1.min(end)..end]
        .iter()
        .any(|a| host_flags.contains(&a.split('=').next().unwrap_or("")));
    if given {
        eprintln!(
            "canopy run: the launcher is given hosts: ranks on other hosts than this one cannot reach this host's \
             agent (run canopy-agent on each host, docs/deploy.md; inside a Slurm allocation, srun is handed to \
             canopy-run)"
        );
    }
}

/// `program` as the shell finds it: itself if it has a slash, else on PATH.
pub(crate) fn which(program: &str) -> PathBuf {
    if program.contains('/') {
        return PathBuf::from(program);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(program))
}

/// How many ranks a launcher's options ask for (`-np 8`, `-n 8`, `--ntasks=8`...); one for a plain program, and
/// none when the launcher's options do not say.
pub(crate) fn ranks_asked(launcher: Launcher, command: &[String]) -> Option<u32> {
    let flags: &[&str] = match launcher {
        Launcher::Plain => return Some(1),
        Launcher::OpenMpi => &["-np", "-n", "-c", "--np", "--n"],
        Launcher::Hydra => &["-n", "-np"],
        Launcher::Srun => &["-n", "--ntasks"],
    };
    let end = launcher.program_at(command).unwrap_or(command.len());
    let options = &command[1.min(end)..end];
    options.iter().enumerate().find_map(|(i, arg)| {
        if let Some((flag, value)) = arg.split_once('=') {
            return flags.contains(&flag).then(|| value.parse().ok()).flatten();
        }
        flags
            .contains(&arg.as_str())
            .then(|| options.get(i + 1)?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_launcher_passes_the_environment_its_own_way() {
        let env = vec![
            ("CANOPY_AGENT_SOCKET".to_string(), "/tmp/a.sock".to_string()),
            ("LD_PRELOAD".to_string(), "/lib/libcanopy_mpi.so".to_string()),
        ];
        let cmd = strings(&["mpirun", "-np", "8", "./app"]);
        let (line, own) = Launcher::OpenMpi.command_line(&cmd, &env);
        assert_eq!(
            line,
            strings(&[
                "mpirun",
                "-x",
                "CANOPY_AGENT_SOCKET=/tmp/a.sock",
                "-x",
                "LD_PRELOAD=/lib/libcanopy_mpi.so",
                "-np",
                "8",
                "./app"
            ])
        );
        assert!(own.is_empty(), "the launcher itself must not load the wrapper");
        let (line, _) = Launcher::Hydra.command_line(&cmd, &env);
        assert_eq!(
            line[..7],
            strings(&[
                "mpirun",
                "-genv",
                "CANOPY_AGENT_SOCKET",
                "/tmp/a.sock",
                "-genv",
                "LD_PRELOAD",
                "/lib/libcanopy_mpi.so"
            ])[..]
        );
        let (line, _) = Launcher::Srun.command_line(&strings(&["srun", "-n", "8", "./app"]), &env);
        assert_eq!(
            line[1],
            "--export=ALL,CANOPY_AGENT_SOCKET=/tmp/a.sock,LD_PRELOAD=/lib/libcanopy_mpi.so"
        );
        // The user's own --export keeps its list, with the socket and the wrapper added.
        let (line, _) = Launcher::Srun.command_line(&strings(&["srun", "--export=NONE,HOME", "./app"]), &env);
        assert_eq!(
            line,
            strings(&[
                "srun",
                "--export=NONE,HOME,CANOPY_AGENT_SOCKET=/tmp/a.sock,LD_PRELOAD=/lib/libcanopy_mpi.so",
                "./app"
            ])
        );
        let (line, own) = Launcher::Plain.command_line(&strings(&["./app", "x"]), &env);
        assert_eq!((line, own), (strings(&["./app", "x"]), env));
    }

    #[test]
    fn the_version_text_tells_hydra_from_open_mpi_and_another_launcher_is_refused() {
        let of = Launcher::of_version;
        assert_eq!(of("mpirun (Open MPI) 4.1.6"), Some(Launcher::OpenMpi));
        assert_eq!(of("prterun (PRRTE) 3.0.0"), Some(Launcher::OpenMpi));
        assert_eq!(
            of("HYDRA build details:\n    Version: 4.2.0"),
            Some(Launcher::Hydra)
        );
        assert_eq!(of("Intel(R) MPI Library for Linux"), Some(Launcher::Hydra));
        assert_eq!(of("mpiexec version 1.2.3 (PALS)"), None);
        assert_eq!(Launcher::of("srun").unwrap(), Launcher::Srun);
        assert_eq!(Launcher::of("/opt/x/bin/prterun").unwrap(), Launcher::OpenMpi);
        assert_eq!(Launcher::of("./lulesh2.0").unwrap(), Launcher::Plain);
    }

    #[test]
    fn the_ranks_a_launcher_is_asked_for_are_read_from_its_own_options() {
        let asked = |l: Launcher, v: &[&str]| ranks_asked(l, &strings(v));
        assert_eq!(
            asked(
                Launcher::OpenMpi,
                &["mpirun", "--oversubscribe", "-np", "8", "./app", "-n", "3"]
            ),
            Some(8)
        );
        // The program's own -n is not the launcher's.
        assert_eq!(
            asked(
                Launcher::OpenMpi,
                &["mpirun", "--hostfile", "h", "./a", "-n", "3"]
            ),
            None
        );
        assert_eq!(asked(Launcher::Srun, &["srun", "--ntasks=64", "./app"]), Some(64));
        // srun's -c is CPUs per task, not ranks.
        assert_eq!(
            asked(Launcher::Srun, &["srun", "-c", "2", "-n", "4096", "./app"]),
            Some(4096)
        );
        assert_eq!(
            asked(Launcher::Hydra, &["mpiexec", "-n", "4096", "./app"]),
            Some(4096)
        );
        assert_eq!(asked(Launcher::OpenMpi, &["mpirun", "./app"]), None);
        assert_eq!(asked(Launcher::Plain, &["./app", "-n", "9"]), Some(1));
    }

    #[test]
    fn a_launcher_s_own_options_are_told_from_the_program() {
        fn at<'a>(l: Launcher, v: &[&'a str]) -> Option<&'a str> {
            l.program_at(&strings(v)).map(|i| v[i])
        }
        assert_eq!(
            at(
                Launcher::Srun,
                &["srun", "-n", "8", "--mpi=pmix", "./lulesh2.0", "-s", "30"]
            ),
            Some("./lulesh2.0")
        );
        assert_eq!(
            at(
                Launcher::Srun,
                &["srun", "--ntasks", "4", "--exclusive", "-N2", "app"]
            ),
            Some("app")
        );
        // A value that is a file is still the option's (a log of an earlier run).
        assert_eq!(
            at(
                Launcher::Srun,
                &["srun", "-o", "run.log", "--label", "sh", "-c", "x"]
            ),
            Some("sh")
        );
        assert_eq!(
            at(
                Launcher::OpenMpi,
                &[
                    "mpirun",
                    "--hostfile",
                    "h",
                    "-np",
                    "4",
                    "--mca",
                    "btl",
                    "tcp",
                    "./a.out"
                ]
            ),
            Some("./a.out")
        );
        assert_eq!(
            at(
                Launcher::Hydra,
                &["mpiexec", "-genv", "A", "1", "-n", "2", "python3", "x.py"]
            ),
            Some("python3")
        );
        assert_eq!(at(Launcher::OpenMpi, &["mpirun", "-np", "2"]), None);
        assert_eq!(at(Launcher::Plain, &["./app", "-x"]), Some("./app"));
    }
}
