//! canopy-touch: a rank whose every iteration has a known cost in page faults and context switches, to check
//! the SDK's per-event counters (CANOPY_COUNTERS) against.
//!
//! Each iteration, inside `iteration`: `touch` reads one byte of each of PAGES fresh pages (a block larger
//! than glibc's largest mmap threshold, so each iteration's pages are mapped afresh: one page fault each), and
//! `nap` sleeps SLEEPS times for 200 us (one context switch each). The rank dumps after every iteration.
//!
//! ```text
//! canopy-touch [ITERATIONS [PAGES [SLEEPS]]]     defaults: 10 iterations, 1000 pages, 5 sleeps
//! ```

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

/// Bytes per page touched (the x86-64 and aarch64 base page; a larger page only lowers the faults counted).
const PAGE: usize = 4096;
/// Above glibc's largest dynamic mmap threshold (32 MiB): every allocation is a fresh mapping.
const FRESH: usize = 40 << 20;

fn arg(args: &[String], i: usize, default: u64) -> Result<u64, String> {
    match args.get(i) {
        None => Ok(default),
        Some(s) => s.parse().map_err(|_| format!("bad argument {s:?}")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (iterations, pages, sleeps) = match (arg(&args, 0, 10), arg(&args, 1, 1000), arg(&args, 2, 5)) {
        (Ok(i), Ok(p), Ok(s)) if (p as usize) * PAGE <= FRESH => (i, p as usize, s),
        _ => {
            eprintln!("usage: canopy-touch [ITERATIONS [PAGES (<= 10240) [SLEEPS]]]");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = canopy_sdk::init("touch", None, None) {
        eprintln!("canopy-touch: canopy init: {e}");
        return ExitCode::FAILURE;
    }
    let timer = |name| canopy_sdk::timer(name).expect("a valid timer name");
    let (t_iter, t_touch, t_nap) = (timer("iteration"), timer("touch"), timer("nap"));
    let mut sum = 0u64;
    for _ in 0..iterations {
        t_iter.start();
        t_touch.start();
        let block = vec![0u8; FRESH];
        sum += block
            .iter()
            .step_by(PAGE)
            .take(pages)
            .map(|b| u64::from(*b))
            .sum::<u64>();
        drop(std::hint::black_box(block));
        t_touch.stop();
        t_nap.start();
        for _ in 0..sleeps {
            #[allow(
                clippy::disallowed_methods,
                reason = "an application's own thread: the sleep is the work"
            )]
            std::thread::sleep(Duration::from_micros(200));
        }
        t_nap.stop();
        t_iter.stop();
        if let Err(e) = canopy_sdk::dump() {
            eprintln!("canopy-touch: dump: {e}");
        }
    }
    for (name, reason) in canopy_sdk::unavailable_counters() {
        println!("unavailable: {name}: {reason}");
    }
    if let Err(e) = canopy_sdk::finalize() {
        eprintln!("canopy-touch: finalize: {e}");
        return ExitCode::FAILURE;
    }
    println!("touched {} pages, sum {sum}", iterations as usize * pages);
    ExitCode::SUCCESS
}
