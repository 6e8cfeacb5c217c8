//! `canopy-bench instructions`: instruction budgets, a CI gate. Wall-clock figures move from run to run; the
//! instructions an operation executes do not. Each workload runs under `valgrind --tool=callgrind` twice, for a
//! few and then more operations, and the difference over the operations between them is its count per
//! operation, start-up and shutdown cancelled out. Against the budgets in `bench/instruction-budgets.txt`
//! (counted in the `instr` profile: optimized, without whole-program LTO), a count more than [`TOLERANCE`] over
//! its budget fails, naming the functions whose own instructions grew most; `--update` writes the counts of this
//! build as the new budgets.
//!
//! The workloads:
//! - `sdk-event`: a timer's start and stop in the application SDK with its profile module (what every event
//!   costs a rank);
//! - `sdk-dump`: `canopy_dump` of a profile of 100 events, to a stand-in agent;
//! - `mpi-call`: `MPI_Comm_rank` through the MPI wrapper (`libcanopy_mpi.so` preloaded into an Open MPI
//!   program, a singleton without mpirun), where `mpicc` is installed;
//! - `relay-merge`: a relay's phase 0 of one round of the MRNet kit's 4 x 16 tree: the `stats` plugin merging two
//!   agents' packets of 16 ranks and 100 events each;
//! - `root-round`: the front-end's round of that tree: the root's `stats` call over its two relays' packets,
//!   the result finalized, the round written to a store with its rows, and the committed round noted for the
//!   metrics endpoint's series, as the store writer's thread does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use canopy_agent::sim::{Scenario, Selection, SimConfig, Simulator};
use canopy_core::filter::{FilterFactory, Level};

/// How far over its budget a count may go before the gate fails.
pub const TOLERANCE: f64 = 0.05;

/// Every workload, in the order they run.
pub const WORKLOADS: [&str; 5] = ["sdk-event", "sdk-dump", "mpi-call", "relay-merge", "root-round"];

/// Operations of the short and the long run of a workload: the difference is what is counted, and a few
/// operations suffice, since the counts do not vary.
fn runs(name: &str) -> [u64; 2] {
    match name {
        "relay-merge" => [4, 24],
        "root-round" => [10, 60],
        "sdk-dump" => [10, 60],
        _ => [1_000, 11_000],
    }
}

/// The functions kept with a budget: those that execute most of an operation's instructions.
const FUNCTIONS_KEPT: usize = 12;

/// One workload's count: instructions per operation, and each function's own per operation.
#[derive(Debug, Clone, Default)]
pub struct Count {
    pub per_op: f64,
    pub functions: BTreeMap<String, f64>,
}

/// Runs `operations` of workload `name` in this process: what callgrind counts.
pub fn workload(name: &str, operations: u64) -> anyhow::Result<()> {
    match name {
        "sdk-event" => {
            let _agent = stand_in_agent()?;
            let t = canopy_sdk::timer("event")?;
            for _ in 0..operations {
                t.start();
                t.stop();
            }
        }
        "sdk-dump" => {
            let _agent = stand_in_agent()?;
            let timers: Vec<&canopy_sdk::Timer> = (0..100)
                .map(|i| canopy_sdk::timer(&format!("event {i}")))
                .collect::<Result<_, _>>()?;
            for _ in 0..operations {
                for t in &timers {
                    t.start();
                    t.stop();
                }
                canopy_sdk::dump()?;
                // The dump goes out on the SDK's own thread: each is delivered before the next, so every run
                // counts every dump whole and none waits in a queue.
                let made = canopy_sdk::stats().dumps;
                while canopy_sdk::stats().delivered < made {
                    #[allow(
                        clippy::disallowed_methods,
                        reason = "a workload's pause, outside any runtime"
                    )]
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
        }
        "relay-merge" => {
            let (agents, _) = kit_packets()?;
            let plugins = canopy_core::plugin::filters_from(&[]);
            let mut relay = plugins.create("stats", "", Level::Relay)?;
            let inputs: Vec<&[u8]> = agents.iter().map(Vec::as_slice).collect();
            for round in 0..operations {
                std::hint::black_box(relay.upstream(round, 0, &inputs)?);
            }
        }
        "root-round" => {
            let (_, relays) = kit_packets()?;
            let plugins = canopy_core::plugin::filters_from(&[]);
            let mut root = plugins.create("stats", "", Level::Root)?;
            let dir = tempfile::tempdir()?;
            let mut store = canopy_store::Store::create(dir.path())?;
            let series = canopy_frontend::app_metrics::AppMetrics::new(10);
            let inputs: Vec<&[u8]> = relays.iter().map(Vec::as_slice).collect();
            for round in 0..operations {
                let up = root.upstream(round, 0, &inputs)?;
                let packet = up.up.first().map(|p| p.payload.clone()).unwrap_or_default();
                let result = root.finalize(round, 0, &packet)?;
                let record = canopy_store::RoundRecord {
                    stream_id: 1,
                    stream_name: "stats".into(),
                    round,
                    covered: 64,
                    expected: 64,
                    ..Default::default()
                };
                let rows = canopy_store::Rows {
                    result_type: "canopy.filters.v1.StatsResult",
                    payload: &result,
                };
                store.write_round_with(
                    &record,
                    canopy_store::Payload::Blob {
                        phase: 0,
                        payload: &result,
                    },
                    Some(rows),
                )?;
                let committed = canopy_core::node::RoundResult {
                    stream: canopy_proto::v1::StreamSpec {
                        stream_id: 1,
                        name: "stats".into(),
                        ..Default::default()
                    },
                    round,
                    phase: 0,
                    coverage: canopy_proto::v1::Coverage {
                        covered: 64,
                        expected: 64,
                        ..Default::default()
                    },
                    first_dump_unix_ns: 0,
                    payload: result,
                    late: false,
                };
                series.note(&committed, "canopy.filters.v1.StatsResult");
            }
        }
        other => anyhow::bail!("no workload {other:?} (known: {})", WORKLOADS.join(", ")),
    }
    Ok(())
}

/// A stand-in agent on a socket of its own, and the SDK initialized against it.
fn stand_in_agent() -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("agent.sock");
    crate::sdk::sink(&socket)?;
    let mut config = canopy_sdk::Config::from_env("bench", Some(0), Some(1))?;
    config.socket = socket;
    canopy_sdk::init_with(config)?;
    Ok(dir)
}

/// Encoded packets, one per child.
type Packets = Vec<Vec<u8>>;

/// The kit's round at the two levels above the leaves: four agents' `stats` packets of 16 simulated ranks and
/// 100 events (each rank its own), and the two relays' packets that merge them in pairs.
fn kit_packets() -> anyhow::Result<(Packets, Packets)> {
    let plugins = canopy_core::plugin::filters_from(&[]);
    let mut agents = Vec::new();
    for agent in 0..4u32 {
        let mut sim = Simulator::new(SimConfig {
            scenario: Scenario::Flash,
            ranks: 16,
            events: 100,
            rank_offset: agent * 16,
            total_ranks: 64,
            seed: 1,
            app: "sim".into(),
            plants: Vec::new(),
        });
        let selection = Selection::everything();
        let mut batch: Vec<prost::bytes::Bytes> = Vec::new();
        sim.encode_round(0, 1, &selection, |_, b| batch.extend(b));
        let mut leaf = plugins.create("stats", "", Level::Leaf)?;
        let inputs: Vec<&[u8]> = batch.iter().map(|b| b.as_ref()).collect();
        let out = leaf.upstream(0, 0, &inputs)?;
        agents.push(out.up.first().map(|p| p.payload.clone()).unwrap_or_default());
    }
    let mut relays = Vec::new();
    for pair in agents.chunks(2) {
        let mut relay = plugins.create("stats", "", Level::Relay)?;
        let inputs: Vec<&[u8]> = pair.iter().map(Vec::as_slice).collect();
        let out = relay.upstream(0, 0, &inputs)?;
        relays.push(out.up.first().map(|p| p.payload.clone()).unwrap_or_default());
    }
    Ok((agents, relays))
}

/// How a workload is started under callgrind: this executable's hidden subcommand, or for `mpi-call` a small
/// MPI program with the wrapper preloaded. `None` when the workload cannot run here, with the reason.
fn command(name: &str, operations: u64, work: &Path) -> Result<Command, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    if name != "mpi-call" {
        let mut cmd = Command::new(&exe);
        cmd.args(["instructions-workload", name, &operations.to_string()]);
        return Ok(cmd);
    }
    let wrapper = exe.with_file_name("libcanopy_mpi.so");
    if !wrapper.is_file() {
        return Err(format!("{} is not built", wrapper.display()));
    }
    let program = work.join("comm_rank");
    if !program.is_file() {
        let source = work.join("comm_rank.c");
        std::fs::write(
            &source,
            "#include <mpi.h>\n#include <stdlib.h>\nint main(int argc, char **argv) {\n    MPI_Init(&argc, &argv);\n    \
             long n = atol(argv[1]);\n    int rank;\n    for (long i = 0; i < n; i++) MPI_Comm_rank(MPI_COMM_WORLD, &rank);\n    \
             MPI_Finalize();\n    return 0;\n}\n",
        )
        .map_err(|e| e.to_string())?;
        let built = Command::new("mpicc")
            .arg("-O2")
            .arg("-o")
            .arg(&program)
            .arg(&source)
            .status()
            .map_err(|e| format!("mpicc: {e}"))?;
        if !built.success() {
            return Err("mpicc failed".to_string());
        }
    }
    let mut cmd = Command::new(&program);
    cmd.arg(operations.to_string())
        .env("LD_PRELOAD", &wrapper)
        // No agent: the wrapper keeps its backlog and says so once; the calls are timed all the same.
        .env("CANOPY_AGENT_SOCKET", work.join("no-agent.sock"))
        .env("OMPI_MCA_plm_rsh_agent", "false");
    Ok(cmd)
}

/// Counts workload `name` per operation under callgrind.
pub fn count(name: &str, work: &Path) -> Result<Count, String> {
    let [few, many] = runs(name);
    let mut counted = Vec::new();
    for operations in [few, many] {
        let out = work.join(format!("{name}-{operations}.callgrind"));
        let cmd = command(name, operations, work)?;
        let program = cmd.get_program().to_owned();
        let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
        let envs: Vec<_> = cmd
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
            .collect();
        // The front-end's round is the writer's thread's work: the store's background checkpoints run by the
        // clock, not by the round, and are left out.
        let main_only = name == "root-round";
        let status = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(format!(
                "--separate-threads={}",
                if main_only { "yes" } else { "no" }
            ))
            .arg("--quiet")
            .arg(program)
            .args(args)
            .envs(envs)
            .output()
            .map_err(|e| format!("valgrind: {e}"))?;
        if !status.status.success() {
            return Err(format!(
                "{name} under callgrind exited with {}: {}",
                status.status,
                String::from_utf8_lossy(&status.stderr)
                    .lines()
                    .last()
                    .unwrap_or_default()
            ));
        }
        let out = if main_only {
            let mut first = out.into_os_string();
            first.push("-01");
            PathBuf::from(first)
        } else {
            out
        };
        counted.push(self_costs(&out)?);
    }
    let runs = counted;
    let ops = (many - few) as f64;
    let total = |c: &BTreeMap<String, u64>| c.get(TOTAL).copied().unwrap_or(0) as f64;
    let per_op = (total(&runs[1]) - total(&runs[0])) / ops;
    let mut functions: Vec<(String, f64)> = runs[1]
        .iter()
        .filter(|(f, _)| f.as_str() != TOTAL)
        .map(|(f, n)| {
            let before = runs[0].get(f).copied().unwrap_or(0) as f64;
            (f.clone(), (*n as f64 - before) / ops)
        })
        .collect();
    functions.sort_by(|a, b| b.1.total_cmp(&a.1));
    functions.truncate(FUNCTIONS_KEPT);
    Ok(Count {
        per_op,
        functions: functions.into_iter().filter(|(_, n)| *n >= 1.0).collect(),
    })
}

const TOTAL: &str = "PROGRAM TOTALS";

/// Each function's own instructions in a callgrind output, as callgrind_annotate lists them.
fn self_costs(out: &Path) -> Result<BTreeMap<String, u64>, String> {
    let annotated = Command::new("callgrind_annotate")
        .args(["--auto=no", "--threshold=100", "--inclusive=no"])
        .arg(out)
        .output()
        .map_err(|e| format!("callgrind_annotate: {e}"))?;
    if !annotated.status.success() {
        return Err(format!(
            "callgrind_annotate failed: {}",
            String::from_utf8_lossy(&annotated.stderr)
        ));
    }
    let mut costs = BTreeMap::new();
    for line in String::from_utf8_lossy(&annotated.stdout).lines() {
        let line = line.trim_start();
        let Some((number, rest)) = line.split_once(' ') else {
            continue;
        };
        let Ok(n) = number.replace(',', "").parse::<u64>() else {
            continue;
        };
        // "1,234 (12.3%)  file:function [object]" or "1,234 (100.0%)  PROGRAM TOTALS".
        let name = rest.trim_start();
        let name = name
            .strip_prefix('(')
            .and_then(|r| r.split_once(')'))
            .map_or(name, |(_, r)| r)
            .trim();
        if name.contains("=>") || name.is_empty() {
            continue;
        }
        *costs.entry(short(name)).or_insert(0) += n;
    }
    if !costs.contains_key(TOTAL) {
        return Err(format!("no program totals in {}", out.display()));
    }
    Ok(costs)
}

/// A function's name without its source file (`file:function`, the file `???` when unknown) or its object.
fn short(name: &str) -> String {
    // The object, when callgrind_annotate names it: " [/path/lib.so]".
    let name = name.rsplit_once(" [/").map_or(name, |(f, _)| f);
    let bytes = name.as_bytes();
    // The file ends at the first colon that is not half of a path separator `::`.
    let lone = (0..bytes.len())
        .find(|&i| bytes[i] == b':' && bytes.get(i + 1) != Some(&b':') && (i == 0 || bytes[i - 1] != b':'));
    match lone {
        Some(i) if name != TOTAL => name[i + 1..].to_string(),
        _ => name.to_string(),
    }
}

/// The budgets file: `WORKLOAD <TAB> per_op <TAB> N` and `WORKLOAD <TAB> FUNCTION <TAB> N` lines, `#` comments.
pub fn read_budgets(path: &Path) -> anyhow::Result<BTreeMap<String, Count>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read the budgets {}: {e}", path.display()))?;
    let mut budgets: BTreeMap<String, Count> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        let [workload, key, n] = fields.as_slice() else {
            anyhow::bail!(
                "{}:{}: expected three tab-separated fields",
                path.display(),
                i + 1
            );
        };
        let n: f64 = n
            .parse()
            .map_err(|_| anyhow::anyhow!("{}:{}: {n:?} is not a number", path.display(), i + 1))?;
        let c = budgets.entry(workload.to_string()).or_default();
        match *key {
            "per_op" => c.per_op = n,
            f => {
                c.functions.insert(f.to_string(), n);
            }
        }
    }
    Ok(budgets)
}

fn write_budgets(path: &Path, counts: &BTreeMap<String, Count>) -> anyhow::Result<()> {
    let mut text = String::from(
        "# Instructions per operation, counted under callgrind by `canopy-bench instructions` in the `instr` build\n\
         # profile, and the functions that execute most of them. CI fails a count more than 5% over its budget.\n\
         # After a change meant to cost more (or less): cargo build --profile instr -p canopy-bench\n\
         # -p canopy-filter-stats -p canopy-mpi && target/instr/canopy-bench instructions --update\n",
    );
    for (workload, c) in counts {
        text.push_str(&format!("{workload}\tper_op\t{:.0}\n", c.per_op));
        let mut functions: Vec<_> = c.functions.iter().collect();
        functions.sort_by(|a, b| b.1.total_cmp(a.1));
        for (f, n) in functions {
            text.push_str(&format!("{workload}\t{f}\t{n:.0}\n"));
        }
    }
    std::fs::write(path, text)?;
    Ok(())
}

/// The budgets file beside this crate's sources.
pub fn default_budgets() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("instruction-budgets.txt")
}

/// Counts every workload, prints them beside their budgets and fails past [`TOLERANCE`] (or writes them as the
/// budgets with `update`). A workload that cannot run here (no valgrind, no mpicc) is named and skipped unless
/// `require_all`.
pub fn check(budgets_path: &Path, update: bool, require_all: bool) -> anyhow::Result<()> {
    if Command::new("valgrind").arg("--version").output().is_err() {
        anyhow::ensure!(
            !require_all,
            "valgrind is not installed: the instruction budgets cannot be counted"
        );
        println!("instructions: skipped, valgrind is not installed");
        return Ok(());
    }
    let budgets = if update {
        BTreeMap::new()
    } else {
        read_budgets(budgets_path)?
    };
    let work = tempfile::tempdir()?;
    let mut counts = BTreeMap::new();
    let mut failures = Vec::new();
    println!("| workload | instructions per operation | budget | change |");
    println!("|---|---:|---:|---:|");
    for name in WORKLOADS {
        let c = match count(name, work.path()) {
            Ok(c) => c,
            Err(why) if !require_all => {
                println!("| {name} | skipped: {why} | | |");
                if let Some(b) = budgets.get(name) {
                    counts.insert(name.to_string(), b.clone());
                }
                continue;
            }
            Err(why) => anyhow::bail!("{name}: {why}"),
        };
        match budgets.get(name) {
            Some(b) if b.per_op > 0.0 => {
                let change = c.per_op / b.per_op - 1.0;
                println!(
                    "| {name} | {:.0} | {:.0} | {:+.1}% |",
                    c.per_op,
                    b.per_op,
                    100.0 * change
                );
                if change > TOLERANCE {
                    failures.push(format!(
                        "{name}: {:.0} instructions per operation against a budget of {:.0} ({:+.1}%); grew most: {}",
                        c.per_op,
                        b.per_op,
                        100.0 * change,
                        grew_most(b, &c)
                    ));
                }
            }
            _ if update => println!("| {name} | {:.0} | (new) | |", c.per_op),
            _ => failures.push(format!("{name}: no budget in {}", budgets_path.display())),
        }
        counts.insert(name.to_string(), c);
    }
    if update {
        write_budgets(budgets_path, &counts)?;
        println!("budgets written to {}", budgets_path.display());
        return Ok(());
    }
    anyhow::ensure!(
        failures.is_empty(),
        "instruction budgets exceeded by more than {:.0}%:\n{}\n(if the growth is meant, `target/instr/canopy-bench instructions --update` writes the new budgets; see docs/benchmarks.md)",
        100.0 * TOLERANCE,
        failures.join("\n")
    );
    Ok(())
}

/// The functions whose own instructions per operation grew most against the budget's, largest first.
fn grew_most(budget: &Count, now: &Count) -> String {
    let mut grown: Vec<(String, f64)> = now
        .functions
        .iter()
        .map(|(f, n)| (f.clone(), n - budget.functions.get(f).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d >= 1.0)
        .collect();
    grown.sort_by(|a, b| b.1.total_cmp(&a.1));
    if grown.is_empty() {
        return "no single function (the growth is spread)".to_string();
    }
    grown
        .iter()
        .take(3)
        .map(|(f, d)| format!("{f} +{d:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.txt");
        let mut counts = BTreeMap::new();
        counts.insert(
            "relay-merge".to_string(),
            Count {
                per_op: 1234.4,
                functions: [("memcpy".to_string(), 100.0), ("merge".to_string(), 900.0)].into(),
            },
        );
        write_budgets(&path, &counts).unwrap();
        let back = read_budgets(&path).unwrap();
        assert_eq!(back["relay-merge"].per_op, 1234.0);
        assert_eq!(back["relay-merge"].functions["merge"], 900.0);
        std::fs::write(&path, "relay-merge\tper_op\n").unwrap();
        assert!(
            read_budgets(&path)
                .unwrap_err()
                .to_string()
                .ends_with(":1: expected three tab-separated fields")
        );
    }

    #[test]
    fn the_functions_that_grew_are_named_largest_first() {
        let budget = Count {
            per_op: 1000.0,
            functions: [("a".to_string(), 500.0), ("b".to_string(), 400.0)].into(),
        };
        let now = Count {
            per_op: 1300.0,
            functions: [
                ("a".to_string(), 550.0),
                ("b".to_string(), 400.0),
                ("c".to_string(), 250.0),
            ]
            .into(),
        };
        assert_eq!(grew_most(&budget, &now), "c +250, a +50");
    }

    #[test]
    fn names_lose_their_source_paths() {
        assert_eq!(
            short("/rustc/abc/library/core/src/slice/mod.rs:core::slice::foo [/x/canopy-bench]"),
            "core::slice::foo"
        );
        assert_eq!(
            short("???:core::num::<impl usize>::unchecked_add::precondition_check"),
            "core::num::<impl usize>::unchecked_add::precondition_check"
        );
        assert_eq!(short("???:memcpy [/usr/lib/libc.so.6]"), "memcpy");
        assert_eq!(short(TOTAL), TOTAL);
        assert_eq!(
            short("/x/src/slice.rs:core::slice::<impl [T]>::iter [/x/libfoo.so]"),
            "core::slice::<impl [T]>::iter"
        );
    }
}
