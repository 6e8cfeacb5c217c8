//! canopy-stencil: a 2-D Jacobi stencil, one process per rank, instrumented with `canopy-sdk`.
//!
//! Each iteration exchanges its halo (copies the boundary rows, as a message would), sweeps the grid in two
//! threads (each times its half under `sweep_half`: the threads' timers add up into the rank's profile) and
//! computes the residual, all inside `iteration`; it counts the bytes it exchanged and dumps its profile. The
//! rank comes from the launcher's environment.
//!
//! ```text
//! canopy-stencil [ITERATIONS [N [SLEEP_US]]]     defaults: 100 iterations, N = 256, no sleep
//! ```

#![forbid(unsafe_code)]
#![allow(
    clippy::disallowed_types,
    reason = "an application, not a daemon: it runs on no tokio clock and times itself by the wall clock"
)]

use std::process::ExitCode;
use std::time::{Duration, Instant};

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> Result<T, String> {
    match args.get(i) {
        None => Ok(default),
        Some(s) => s.parse().map_err(|_| format!("bad argument {s:?}")),
    }
}

/// One Jacobi sweep of rows `rows` of `a` into `out` (the same rows of the next grid).
fn sweep(a: &[f64], out: &mut [f64], n: usize, rows: std::ops::Range<usize>) {
    for (k, i) in rows.enumerate() {
        for j in 1..n - 1 {
            out[k * n + j] =
                0.25 * (a[(i - 1) * n + j] + a[(i + 1) * n + j] + a[i * n + j - 1] + a[i * n + j + 1]);
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = (|| {
        Ok::<_, String>((
            arg(&args, 0, 100u64)?,
            arg(&args, 1, 256usize)?,
            arg(&args, 2, 0u64)?,
        ))
    })();
    let (iterations, n, sleep_us) = match parsed {
        Ok(v) if v.1 >= 4 => v,
        _ => {
            eprintln!("usage: canopy-stencil [ITERATIONS [N (>= 4) [SLEEP_US]]]");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = canopy_sdk::init("stencil-rs", None, None) {
        eprintln!("canopy-stencil: canopy init: {e} (running without monitoring)");
    }
    let timer = |name| canopy_sdk::timer(name).expect("a valid timer name");
    let (t_iter, t_halo, t_sweep, t_half, t_resid) = (
        timer("iteration"),
        timer("halo_exchange"),
        timer("sweep"),
        timer("sweep_half"),
        timer("residual"),
    );
    let mut a = vec![0.0f64; n * n];
    a[..n].fill(1.0);
    let mut b = a.clone();
    let mut halo = vec![0.0f64; 2 * n];
    let started = Instant::now();
    let mut residual = 0.0;
    for _ in 0..iterations {
        let _iteration = t_iter.scope();
        {
            let _halo = t_halo.scope();
            halo[..n].copy_from_slice(&a[n..2 * n]);
            halo[n..].copy_from_slice(&a[(n - 2) * n..(n - 1) * n]);
            if sleep_us > 0 {
                #[allow(
                    clippy::disallowed_methods,
                    reason = "a synchronous rank standing in for a message's wait; no runtime here"
                )]
                std::thread::sleep(Duration::from_micros(sleep_us));
            }
            let _ = canopy_sdk::counter("bytes_exchanged", (halo.len() * 8) as f64);
        }
        {
            let _sweep = t_sweep.scope();
            let mid = n / 2;
            let (top, bottom) = b[n..(n - 1) * n].split_at_mut((mid - 1) * n);
            let a = &a;
            std::thread::scope(|s| {
                s.spawn(move || {
                    let _half = t_half.scope();
                    sweep(a, top, n, 1..mid);
                });
                s.spawn(move || {
                    let _half = t_half.scope();
                    sweep(a, bottom, n, mid..n - 1);
                });
            });
        }
        {
            let _resid = t_resid.scope();
            residual = a.iter().zip(&b).map(|(x, y)| (y - x) * (y - x)).sum();
            std::mem::swap(&mut a, &mut b);
        }
        drop(_iteration);
        let _ = canopy_sdk::dump();
    }
    let elapsed = started.elapsed().as_secs_f64();
    if let Err(e) = canopy_sdk::finalize() {
        eprintln!("canopy-stencil: canopy finalize: {e}");
    }
    println!("canopy-stencil: {iterations} iterations of {n}x{n} in {elapsed:.6} s, residual {residual:.6e}");
    ExitCode::SUCCESS
}
