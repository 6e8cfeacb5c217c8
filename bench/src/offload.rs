//! `canopy-bench offload`: the ToM offload benchmark (paper 001, Fig. 8). N rank processes, each linking the
//! real SDK, loop `work(period); dump; barrier`; the table gives the mean, over rounds, of the worst dump time
//! across the ranks, for a sweep of periods and fanouts, with `passthrough` (ToM) against `histogram` (ToM
//! Reduce). The tree (front-end, relays, agents serving the ranks on Unix sockets, 8 ranks per agent) runs in
//! the bench's process over loopback gRPC. A dump only queues a snapshot, so where the offered rate passes what
//! the tree serves, the sign is not a slower dump but a growing lag, then dumps dropped at the ranks: the
//! table marks the knee where the rounds stored per second fall below the rounds offered.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use canopy_integration_tests::TreeBuilder;

use crate::stats;

/// One rank: the loop, timing each dump; prints the times (us), then the SDK's drop count.
pub fn rank(
    socket: &Path,
    barrier: &Path,
    rank: u32,
    nranks: u32,
    period_us: u64,
    rounds: u64,
) -> anyhow::Result<()> {
    let mut config = canopy_sdk::Config::from_env("offload", Some(rank), Some(nranks))?;
    config.socket = socket.to_path_buf();
    canopy_sdk::init_with(config)?;
    let timers: Vec<_> = (0..20)
        .map(|i| canopy_sdk::timer(&format!("region {i:02}")))
        .collect::<Result<_, _>>()?;
    let mut bar = UnixStream::connect(barrier)?;
    // Everyone attached before the first round.
    bar.write_all(&[0])?;
    bar.read_exact(&mut [0])?;
    let mut times = Vec::with_capacity(rounds as usize);
    for _ in 0..rounds {
        let start = Instant::now();
        for t in &timers {
            t.start();
            t.stop();
        }
        // work(period): the ranks wait rather than compute, so 256 of them share two cores.
        let left = Duration::from_micros(period_us).saturating_sub(start.elapsed());
        #[allow(
            clippy::disallowed_methods,
            reason = "a synchronous rank process: it waits out its period as an application computes"
        )]
        std::thread::sleep(left);
        let t = Instant::now();
        let _ = canopy_sdk::dump();
        times.push(t.elapsed().as_nanos() as f64 / 1000.0);
        bar.write_all(&[0])?;
        bar.read_exact(&mut [0])?;
    }
    let _ = canopy_sdk::finalize();
    let mut out = std::io::stdout().lock();
    for t in &times {
        write!(out, "{t:.2} ")?;
    }
    writeln!(out)?;
    writeln!(out, "dropped {}", canopy_sdk::stats().dropped)?;
    Ok(())
}

/// Releases all `n` ranks each time every one of them has arrived.
fn barrier(listener: UnixListener, n: usize) {
    std::thread::spawn(move || {
        let mut conns: Vec<UnixStream> = listener.incoming().take(n).filter_map(Result::ok).collect();
        let mut byte = [0u8];
        loop {
            for c in &mut conns {
                if c.read_exact(&mut byte).is_err() {
                    return;
                }
            }
            for c in &mut conns {
                let _ = c.write_all(&byte);
            }
        }
    });
}

struct Run {
    worst_mean_us: f64,
    offered: f64,
    stored: f64,
    dropped: u64,
}

async fn one(ranks: u32, fanout: usize, filter: &str, period_us: u64, rounds: u64) -> anyhow::Result<Run> {
    let dir = tempfile::tempdir()?;
    let sockets = dir.path().join("s");
    std::fs::create_dir_all(&sockets)?;
    let agents = (ranks as usize / 8).max(1);
    let builder = TreeBuilder {
        agents,
        fanout,
        ranks,
        rounds,
        timeout_ms: 10_000,
        streams: vec![filter.to_string()],
        socket_dir: Some(sockets.clone()),
        ..TreeBuilder::default()
    };
    let mut sandbox = builder.start().await;
    for k in 0..agents {
        let s = sockets.join(format!("agent-{k}.sock"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !s.exists() {
            anyhow::ensure!(Instant::now() < deadline, "agent {k} has no socket");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let bar_path = dir.path().join("barrier.sock");
    barrier(UnixListener::bind(&bar_path)?, ranks as usize);
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let children: Vec<Child> = (0..ranks)
        .map(|r| {
            Command::new(&exe)
                .arg("offload-rank")
                .arg("--socket")
                .arg(sockets.join(format!("agent-{}.sock", r as usize / 8)))
                .arg("--barrier")
                .arg(&bar_path)
                .args(["--rank", &r.to_string(), "--nranks", &ranks.to_string()])
                .args([
                    "--period-us",
                    &period_us.to_string(),
                    "--rounds",
                    &rounds.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let outputs = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|c| c.wait_with_output())
            .collect::<Result<Vec<_>, _>>()
    })
    .await??;
    let elapsed = started.elapsed().as_secs_f64();
    let mut per_round = vec![0f64; rounds as usize];
    let mut dropped = 0;
    for out in &outputs {
        anyhow::ensure!(
            out.status.success(),
            "a rank failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines = text.lines();
        for (k, t) in lines.next().unwrap_or("").split_whitespace().enumerate() {
            if let (Some(slot), Ok(t)) = (per_round.get_mut(k), t.parse::<f64>()) {
                *slot = slot.max(t);
            }
        }
        dropped += lines
            .next()
            .and_then(|l| l.strip_prefix("dropped "))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
    }
    sandbox
        .wait_frontend(Duration::from_secs(120))
        .await
        .map_err(anyhow::Error::msg)?;
    let stored = canopy_store::StoreReader::open(&sandbox.store)?.rounds(canopy_store::Select::all())?;
    // Both rates count from the first round's first dump, so the start (processes spawning, ranks attaching,
    // the dumps held until collection starts) weighs on neither: offered is the ranks' pace from their first
    // dump to their last, stored the rounds stored from that first dump to the last one's result.
    let n = stored.len() as i64;
    let first_round = stored.iter().map(|r| r.round as i64).min().unwrap_or(0);
    let last_round = stored.iter().map(|r| r.round as i64).max().unwrap_or(0);
    let first_dump = stored
        .iter()
        .filter_map(|r| r.first_dump_unix_ns)
        .min()
        .unwrap_or(0) as i64;
    let last_closed = stored.iter().filter_map(|r| r.closed_unix_ns).max().unwrap_or(0) as i64;
    // The first dump of the highest round (the last stream's, if several stored it).
    let last_dump = stored
        .iter()
        .max_by_key(|r| r.round)
        .and_then(|r| r.first_dump_unix_ns)
        .unwrap_or(0) as i64;
    let rate = |count: i64, from: i64, to: i64| {
        let span = (to - from) as f64 / 1e9;
        if span > 0.0 && count > 0 {
            count as f64 / span
        } else {
            0.0
        }
    };
    let offered = if last_round > first_round {
        rate(last_round - first_round, first_dump, last_dump)
    } else {
        // Too few rounds stored to see the ranks' pace: the whole run's.
        rounds as f64 / elapsed
    };
    Ok(Run {
        worst_mean_us: per_round.iter().sum::<f64>() / per_round.len().max(1) as f64,
        offered,
        stored: rate(n - 1, first_dump, last_closed),
        dropped,
    })
}

pub async fn run(
    sizes: &[u32],
    fanouts: &[usize],
    periods_us: &[u64],
    filters: &[String],
    repeats: usize,
) -> anyhow::Result<()> {
    println!(
        "\n## offload: N rank processes loop work(period); dump; barrier through the real SDK, 8 ranks per agent"
    );
    println!(
        "\n| ranks | fanout | filter | period us | worst dump us, mean over rounds (median) | min | max | offered rounds/s | stored rounds/s | dumps dropped | |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for &n in sizes {
        for filter in filters {
            for &fanout in fanouts {
                for &period in periods_us {
                    // About two seconds a run, 20 to 200 rounds.
                    let rounds = (2_000_000 / period.max(1)).clamp(20, 200);
                    let mut runs = Vec::new();
                    for _ in 0..repeats {
                        runs.push(one(n, fanout, filter, period, rounds).await?);
                    }
                    let (m, lo, hi) = stats(runs.iter().map(|r| r.worst_mean_us).collect());
                    let (offered, _, _) = stats(runs.iter().map(|r| r.offered).collect());
                    let (stored, _, _) = stats(runs.iter().map(|r| r.stored).collect());
                    let dropped: u64 = runs.iter().map(|r| r.dropped).sum();
                    let knee = if stored < offered * 0.95 || dropped > 0 {
                        "past the knee"
                    } else {
                        ""
                    };
                    println!(
                        "| {n} | {fanout} | {filter} | {period} | {m:.2} | {lo:.2} | {hi:.2} | {offered:.1} | {stored:.1} | {dropped} | {knee} |"
                    );
                }
            }
        }
    }
    Ok(())
}
