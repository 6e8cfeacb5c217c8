//! Every fuzz target over its seed corpus (`fuzz/seeds/<target>/`) and a bounded number of mutations of it, on
//! stable: what CI runs of the fuzzers. A failure prints the input, to add to the corpus once fixed.

// The budget is wall-clock time of this test process, which runs no tokio clock to pause.
#![allow(clippy::disallowed_types)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use canopy_fuzz_targets::mutate::{Rng, mutate};
use canopy_fuzz_targets::{TARGETS, Target};

/// Time for one target's mutations: the whole test takes a few seconds.
const BUDGET: Duration = Duration::from_millis(400);
/// Mutations per target at most (and at least, unless the budget runs out first).
const MUTATIONS: usize = 3000;
/// libFuzzer's default `-max_len` for a corpus of small seeds.
const MAX_LEN: usize = 4096;

fn seeds_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target)
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = seeds_dir(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

fn run_one(name: &str, body: fn(&[u8]), data: &[u8], what: &str) {
    let result = std::panic::catch_unwind(|| body(data));
    if result.is_err() {
        panic!("{name}: {what} fails: {data:?}");
    }
}

fn exercise((name, body): &Target) -> usize {
    let corpus = seeds(name);
    assert!(!corpus.is_empty(), "{name} has no seeds");
    for (i, seed) in corpus.iter().enumerate() {
        run_one(name, *body, seed, &format!("seed {i}"));
    }
    let mut rng = Rng::new(0x5eed ^ name.len() as u64);
    let start = Instant::now();
    let mut ran = 0;
    while ran < MUTATIONS && start.elapsed() < BUDGET {
        let seed = &corpus[rng.below(corpus.len())];
        let other = &corpus[rng.below(corpus.len())];
        let input = mutate(&mut rng, seed, other, MAX_LEN);
        run_one(name, *body, &input, "a mutation");
        ran += 1;
    }
    ran
}

#[test]
fn every_target_runs_over_its_seeds_and_their_mutations() {
    let mut report = Vec::new();
    for target in TARGETS {
        let ran = exercise(target);
        report.push(format!(
            "{}: {} seeds, {ran} mutations",
            target.0,
            seeds(target.0).len()
        ));
    }
    eprintln!("{}", report.join("\n"));
}

#[test]
fn every_target_has_a_fuzz_binary_and_seeds() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    for (name, _) in TARGETS {
        let bin = fuzz.join("fuzz_targets").join(format!("{name}.rs"));
        assert!(bin.is_file(), "{} is missing", bin.display());
        assert!(seeds_dir(name).is_dir(), "{name} has no seed directory");
    }
}
