//! The Kafka export's cost and pace: the same tree (`canopy up`, separate processes) run without and with
//! `--kafka-brokers` against a local broker (tansu), alternating; the front-end's CPU per round in each, the rounds
//! stored and published per second, the time from a round's store to the broker's acknowledgment, and what was
//! left unpublished. Then the export's own rate: a finished run's store published by `canopy export`.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use canopy_integration_tests::kafka::Broker;

use crate::{Shape, percentile, processes, stats};

/// One run with the export: its figures from the store.
struct Exported {
    frontend_ms_per_round: f64,
    stored_per_s: f64,
    published_per_s: f64,
    ack_p50_ms: f64,
    ack_p99_ms: f64,
    unpublished: u64,
}

pub fn run(shape: &Shape, repeats: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let Some(broker) = Broker::start(dir.path(), "canopy-bench kafka") else {
        bail!(
            "no Kafka broker: install tansu (cargo install tansu --locked --features dynostore) or set CANOPY_TANSU"
        );
    };
    println!(
        "kafka export: {} ranks, {} agents, fanout {}, {} events, a round every {} ms, {} rounds, streams {}; \
         broker {} (tansu, in memory); {repeats} repeats, without and with the export alternating",
        shape.ranks,
        shape.agents,
        shape.fanout,
        shape.events,
        shape.period_ms,
        shape.rounds,
        shape.filter,
        broker.addr
    );
    let mut without = Vec::new();
    let mut with = Vec::new();
    let mut last_store = None;
    for repeat in 0..repeats {
        let plain = tempfile::tempdir()?;
        let (store, cpu) = processes::run(shape, plain.path())?;
        without.push(cpu.frontend);
        let exported = tempfile::tempdir()?;
        let mut cmd = processes::up_command(shape, None, exported.path())?;
        cmd.args(["--kafka-brokers", &broker.addr]);
        processes::finish(&mut cmd)?;
        let (kstore, kcpu) = processes::read_cpu(&exported.path().join("latest-cpu.json"))?;
        let e = exported_figures(&kstore, kcpu.frontend)?;
        println!(
            "  repeat {repeat}: front-end {:.3} ms/round without, {:.3} with; stored {:.0}/s, published {:.0}/s; \
             store to ack p50 {:.1} ms, p99 {:.1} ms; unpublished {}",
            cpu.frontend,
            e.frontend_ms_per_round,
            e.stored_per_s,
            e.published_per_s,
            e.ack_p50_ms,
            e.ack_p99_ms,
            e.unpublished
        );
        with.push(e);
        let keep = dir.path().join(format!("run-{repeat}.sqlite"));
        std::fs::copy(&store, &keep)?;
        last_store = Some(keep);
    }
    let col = |f: fn(&Exported) -> f64| stats(with.iter().map(f).collect());
    let show = |(m, lo, hi): (f64, f64, f64), unit: &str| format!("{m:.2}{unit} ({lo:.2} to {hi:.2})");
    let plain = stats(without.clone());
    let ratio = stats(
        with.iter()
            .zip(&without)
            .map(|(w, p)| w.frontend_ms_per_round / p)
            .collect(),
    );
    let rows = [
        ("front-end CPU per round, without the export", show(plain, " ms")),
        (
            "front-end CPU per round, with the export",
            show(col(|e| e.frontend_ms_per_round), " ms"),
        ),
        ("with / without", show(ratio, "")),
        (
            "rounds stored per second (all streams)",
            show(col(|e| e.stored_per_s), ""),
        ),
        (
            "rounds published per second (all streams)",
            show(col(|e| e.published_per_s), ""),
        ),
        ("store to acknowledgment, p50", show(col(|e| e.ack_p50_ms), " ms")),
        ("store to acknowledgment, p99", show(col(|e| e.ack_p99_ms), " ms")),
        ("rounds left unpublished", show(col(|e| e.unpublished as f64), "")),
    ];
    println!("| figure | median (min to max) |");
    println!("|---|---|");
    for (figure, value) in rows {
        println!("| {figure} | {value} |");
    }
    if let Some(store) = last_store {
        let (rounds, secs) = export_rate(&store, &broker.addr)?;
        println!(
            "| `canopy export` of a finished run: {rounds} rounds | {:.0} rounds/s ({secs:.2} s) |",
            rounds as f64 / secs
        );
    }
    Ok(())
}

/// The figures of a run with the export, from its store: rounds stored and published per second over the run,
/// and each round's time from its store (`rounds.closed_unix_ns`) to its acknowledgment.
fn exported_figures(store: &Path, frontend_ms_per_round: f64) -> anyhow::Result<Exported> {
    let conn = rusqlite_open(store)?;
    let closed: Vec<(i64, Option<i64>)> = {
        let mut st = conn.prepare(
            "SELECT r.closed_unix_ns, k.acked_unix_ns FROM rounds r
             LEFT JOIN kafka_rounds k ON k.stream_id = r.stream_id AND k.round = r.round AND k.offset IS NOT NULL
             WHERE r.closed_unix_ns IS NOT NULL",
        )?;
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?
    };
    if closed.is_empty() {
        bail!("{}: no rounds stored", store.display());
    }
    let span = |xs: &[i64]| {
        let (lo, hi) = (
            xs.iter().min().copied().unwrap_or(0),
            xs.iter().max().copied().unwrap_or(0),
        );
        ((hi - lo) as f64 / 1e9).max(1e-3)
    };
    let stored: Vec<i64> = closed.iter().map(|(c, _)| *c).collect();
    let acked: Vec<i64> = closed.iter().filter_map(|(_, a)| *a).collect();
    let latency: Vec<f64> = closed
        .iter()
        .filter_map(|(c, a)| a.map(|a| (a - c) as f64 / 1e6))
        .collect();
    Ok(Exported {
        frontend_ms_per_round,
        stored_per_s: stored.len() as f64 / span(&stored),
        published_per_s: acked.len() as f64 / span(&acked),
        ack_p50_ms: percentile(latency.clone(), 0.5),
        ack_p99_ms: percentile(latency, 0.99),
        unpublished: (closed.len() - acked.len()) as u64,
    })
}

/// `canopy export` of a finished store to a topic prefix of its own: its rounds and the seconds it took.
fn export_rate(store: &Path, brokers: &str) -> anyhow::Result<(u64, f64)> {
    let canopy = std::env::current_exe()?.with_file_name("canopy");
    let rounds: u64 = rusqlite_open(store)?.query_row("SELECT count(*) FROM rounds", [], |r| r.get(0))?;
    let started = Instant::now();
    let out = std::process::Command::new(&canopy)
        .arg("export")
        .arg(store)
        .args(["--kafka-brokers", brokers, "--kafka-topic-prefix", "bench-export"])
        .output()
        .context("cannot run canopy export")?;
    let secs = started.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("canopy export failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok((rounds, secs))
}

fn rusqlite_open(store: &Path) -> anyhow::Result<rusqlite::Connection> {
    rusqlite::Connection::open_with_flags(store, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .with_context(|| format!("cannot open {}", store.display()))
}
