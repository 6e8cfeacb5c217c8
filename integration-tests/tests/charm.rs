//! Canopy's Charm++ trace module (sdk/charm) end to end: Charm++'s own `jacobi2d-2d-decomposition` example,
//! unmodified, linked with `-tracemode canopy -tracemode projections` and run on 2 PEs under `canopy run`. Each
//! entry method's executions per PE in the store equal those in Projections' logs of the same run; each PE's
//! Idle time is there, and its utilization profiles share their bins between Idle and the entry methods; the
//! program prints what it prints without the module.
//!
//! It needs a Charm++ build with tracing, named by CHARM_DIR (sdk/charm/build-charm.sh makes one from the source
//! of charmplusplus/charm, which CI cannot fetch), and CHARM_SMP_DIR for an SMP build (PEs as threads of one
//! rank): elsewhere each test says it was skipped and passes. With CANOPY_CHARM_TEST set, a missing build fails
//! instead.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests that run real processes"
)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use canopy_integration_tests::{bin_dir, canopy_command, printed_store, read_rounds, stored_calls};

const PES: u32 = 2;

/// The Charm++ build `var` names, or why there is none (said, or failed with CANOPY_CHARM_TEST).
fn charm_dir(var: &str) -> Option<PathBuf> {
    let why = match std::env::var_os(var) {
        None => format!("{var} does not name a Charm++ build (sdk/charm/build-charm.sh makes one)"),
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.join("bin/charmc").is_file() {
                return Some(dir);
            }
            format!("{var}={} has no bin/charmc", dir.display())
        }
    };
    assert!(
        std::env::var_os("CANOPY_CHARM_TEST").is_none(),
        "CANOPY_CHARM_TEST is set but the Charm++ tests cannot run: {why}"
    );
    eprintln!("skipped: {why}");
    None
}

/// The example's source, in the build (which links the source tree's examples) or beside it.
fn example(charm: &Path) -> PathBuf {
    let rel = "examples/charm++/jacobi2d-2d-decomposition";
    [charm.join(rel), charm.join("..").join(rel)]
        .into_iter()
        .find(|d| d.join("jacobi2d.C").is_file())
        .unwrap_or_else(|| panic!("{rel} is not in {} nor beside it", charm.display()))
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Installs the module into the build (sdk/charm/install.sh, loading the C SDK cargo built) and builds the
/// example in `dir` with the trace modes given: `dir/name`.
fn build(charm: &Path, dir: &Path, name: &str, modes: &[&str]) -> PathBuf {
    let src = example(charm);
    for f in ["jacobi2d.C", "jacobi2d.ci"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let charmc = charm.join("bin/charmc");
    run(Command::new(&charmc).arg("jacobi2d.ci").current_dir(dir));
    run(Command::new(&charmc)
        .args(["-O2", "-c", "jacobi2d.C"])
        .current_dir(dir));
    let mut link = Command::new(&charmc);
    link.args(["-language", "charm++", "-o", name, "jacobi2d.o"]);
    for mode in modes {
        link.args(["-tracemode", mode]);
    }
    run(link.current_dir(dir));
    dir.join(name)
}

fn install_module(charm: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk/charm/install.sh");
    let lib = bin_dir().join("libcanopy.so.0");
    assert!(
        lib.exists(),
        "{} is not built: run `cargo build --workspace` first",
        lib.display()
    );
    run(Command::new(script).arg(charm).arg(lib));
}

/// The lines of the program's output that do not depend on time.
fn timeless(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter(|l| l.starts_with("Running Jacobi") || l.starts_with("Array") || l.starts_with("Finish"))
        .map(|l| l.split(", total time").next().unwrap_or(l).to_string())
        .collect()
}

/// Projections' executions of each entry method per PE, by the name Canopy gives it (`Chare::entry`), from the
/// run's `prefix.sts` and plain-text `prefix.PE.log` files.
fn projections_counts(prefix: &Path) -> BTreeMap<String, BTreeMap<u32, u64>> {
    let sts = std::fs::read_to_string(format!("{}.sts", prefix.display())).expect("Projections' .sts");
    let quoted = |line: &str| -> (String, String) {
        let start = line.find('"').expect("a quoted name");
        let end = line.rfind('"').expect("a quoted name");
        (
            line[start + 1..end].to_string(),
            line[end + 1..].trim().to_string(),
        )
    };
    let mut chares: HashMap<i64, String> = HashMap::new();
    let mut entries: HashMap<i64, (String, i64)> = HashMap::new();
    for line in sts.lines() {
        if let Some(rest) = line.strip_prefix("CHARE ") {
            let id: i64 = rest.split_whitespace().next().unwrap().parse().unwrap();
            chares.insert(id, quoted(line).0);
        } else if let Some(rest) = line.strip_prefix("ENTRY CHARE ") {
            let id: i64 = rest.split_whitespace().next().unwrap().parse().unwrap();
            let (name, after) = quoted(line);
            let chare: i64 = after.split_whitespace().next().unwrap().parse().unwrap();
            entries.insert(id, (name, chare));
        }
    }
    let mut counts: BTreeMap<String, BTreeMap<u32, u64>> = BTreeMap::new();
    for pe in 0..PES {
        let log = PathBuf::from(format!("{}.{pe}.log", prefix.display()));
        let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        for line in text.lines() {
            // `2 mtype ep time event pe ...`: BEGIN_PROCESSING of entry point ep.
            let mut words = line.split_whitespace();
            if words.next() != Some("2") {
                continue;
            }
            let ep: i64 = words.nth(1).unwrap().parse().unwrap();
            let (entry, chare) = &entries[&ep];
            let name = format!("{}::{entry}", chares[chare]);
            *counts.entry(name).or_default().entry(pe).or_default() += 1;
        }
    }
    counts
}

#[test]
fn an_unmodified_charm_program_reports_each_entry_method_per_pe_as_projections_counts_it() {
    let Some(charm) = charm_dir("CHARM_DIR") else {
        return;
    };
    check_jacobi(&charm, Layout::ProcessPerPe);
}

/// The same in an SMP build (CHARM_SMP_DIR, `build-charm.sh SRC netlrts-linux-x86_64-smp`): the PEs are threads
/// of one process, which is one rank, so its counts are the sum of Projections' PEs.
#[test]
fn in_an_smp_build_the_pes_of_a_process_are_threads_of_one_rank() {
    let Some(charm) = charm_dir("CHARM_SMP_DIR") else {
        return;
    };
    check_jacobi(&charm, Layout::ThreadPerPe);
}

/// How a build lays its PEs out: a process each (one rank each), or threads of one process (one rank).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    ProcessPerPe,
    ThreadPerPe,
}

fn check_jacobi(charm: &Path, layout: Layout) {
    install_module(charm);
    let dir = tempfile::tempdir().unwrap();
    let plain = build(charm, dir.path(), "jacobi2d", &[]);
    let traced = build(charm, dir.path(), "jacobi2d.canopy", &["canopy", "projections"]);
    let charmrun = charm.join("bin/charmrun");
    let mut launch = vec![format!("+p{PES}"), "++local".to_string()];
    if layout == Layout::ThreadPerPe {
        launch.extend(["++ppn".to_string(), PES.to_string()]);
    }
    let ranks = match layout {
        Layout::ProcessPerPe => PES,
        Layout::ThreadPerPe => 1,
    };
    let args = ["64", "16", "40"];

    let alone = run(Command::new(&charmrun)
        .args(&launch)
        .arg(&plain)
        .args(args)
        .current_dir(dir.path()));
    let proj = dir.path().join("proj");
    std::fs::create_dir(&proj).unwrap();
    let out = run(canopy_command()
        .args(["run", "--filters", "stats,passthrough", "--no-report", "--out"])
        .arg(dir.path().join("out"))
        .arg("--")
        .arg(&charmrun)
        .args(&launch)
        .arg(&traced)
        .args(args)
        // Plain-text logs; one BEGIN_PROCESSING per execution (nested ones do not end and begin the outer
        // one again).
        .args(["+no-gz-trace", "+notracenested", "+traceroot"])
        .arg(&proj)
        .current_dir(dir.path())
        .stdin(Stdio::null()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("canopy-charm:"), "{stderr}");
    assert_eq!(
        timeless(&stdout),
        timeless(&String::from_utf8_lossy(&alone.stdout)),
        "the program's output with the module"
    );
    let store = PathBuf::from(printed_store(&stdout));
    let store = if store.is_absolute() {
        store
    } else {
        dir.path().join(store)
    };

    let rounds = read_rounds(&store);
    assert!(!rounds.is_empty(), "no rounds stored");
    assert!(
        rounds.iter().all(|r| r.expected == ranks && r.covered == ranks),
        "every round covers the {ranks} ranks: {rounds:?}"
    );

    let expected = projections_counts(&proj.join("jacobi2d.canopy"));
    assert!(
        expected.keys().any(|n| n.starts_with("Jacobi::")),
        "Projections saw no Jacobi entry method: {expected:?}"
    );
    // Projections stops logging when its own shutdown begins (a chare of its own and two reductions), while
    // Canopy reports to the end: those executions are Canopy's alone. With a process per PE, each of the two
    // reductions reaches PE 0 through one reduction message from PE 1.
    let shutdown: u64 = [
        "TraceProjectionsBOC::redn_wrapper_endTimeDone(CkReductionMsg *impl_msg)",
        "TraceProjectionsBOC::redn_wrapper_closeParallelShutdown(CkReductionMsg *impl_msg)",
    ]
    .iter()
    .map(|n| stored_calls(&store, n).get(&0).copied().unwrap_or(0))
    .sum();
    assert_eq!(shutdown, 2, "Projections' two shutdown reductions, on rank 0");
    let mut compared = 0;
    for (name, per_pe) in &expected {
        let mut per_rank: BTreeMap<u32, u64> = match layout {
            Layout::ProcessPerPe => per_pe.clone(),
            Layout::ThreadPerPe => [(0, per_pe.values().sum())].into(),
        };
        let stored = stored_calls(&store, name);
        if name == "CkReductionMgr::RecvMsg(CkReductionMsg* impl_msg)" {
            if layout == Layout::ThreadPerPe {
                // Within one process the shutdown's reduction messages are the runtime's to route: the count is
                // Projections' and at most one per reduction more.
                let (got, want) = (stored[&0], per_rank[&0]);
                assert!(
                    (want..=want + shutdown).contains(&got),
                    "{name}: {got}, Projections {want}"
                );
                continue;
            }
            *per_rank.entry(0).or_default() += shutdown;
        }
        assert_eq!(stored, per_rank, "{name}: Canopy per rank, Projections per PE");
        compared += 1;
    }
    let idle = stored_calls(&store, "Idle");
    assert_eq!(idle.len(), ranks as usize, "Idle on every rank: {idle:?}");
    assert_utilization_of_each_rank(&store, ranks);
    eprintln!(
        "jacobi2d on {PES} PEs ({} ranks): {compared} of {} entry methods exactly as Projections counted them",
        ranks,
        expected.len()
    );
}

/// Each rank's utilization profiles (the module's 1 ms bins, on by default): Idle and Jacobi's entry methods hold
/// shares of them, and no bin holds more than the whole.
fn assert_utilization_of_each_rank(store: &Path, ranks: u32) {
    let mut seen: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for profile in canopy_integration_tests::stored_utilization(store) {
        let pe = profile.rank;
        let mut per_bin = vec![0u64; profile.bins];
        let (idle, entries) = seen.entry(pe).or_default();
        for (bin, name, share) in profile.records {
            per_bin[bin] += u64::from(share);
            if name == "Idle" {
                *idle += u64::from(share);
            } else if name.starts_with("Jacobi::") {
                *entries += u64::from(share);
            }
        }
        assert!(
            per_bin.iter().all(|s| *s <= 250 + 2),
            "PE {pe}: a bin past the whole: {per_bin:?}"
        );
    }
    assert_eq!(
        seen.len(),
        ranks as usize,
        "utilization profiles per rank: {seen:?}"
    );
    assert!(
        seen.values().all(|(idle, entries)| *idle > 0 && *entries > 0),
        "Idle and Jacobi's entry methods in every PE's bins: {seen:?}"
    );
}
