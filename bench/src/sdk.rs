//! `canopy-bench sdk`: what the application SDK costs on the application's thread. A timer start+stop pair
//! against two clock reads (the floor of any timer), a dump of a 100-event profile against copying the same
//! values, and the heap allocations start and stop make once a timer exists (counted on the calling thread by the
//! allocation-counter crate's allocator). The dumps go to a sink that plays the agent: it accepts the SDK's connection
//! and reads everything, so the queue drains as it would with a live agent.

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::time::Instant;

use crate::stats;

/// A stand-in agent: accepts each rank (the control a rank waits for before it sends a dump), then reads and
/// discards whatever the connection sends.
pub(crate) fn sink(path: &std::path::Path) -> anyhow::Result<()> {
    use canopy_wire::v1::{AgentMessage, RankControl, agent_message};
    let listener = UnixListener::bind(path)?;
    let accept = AgentMessage {
        msg: Some(agent_message::Msg::Control(RankControl {
            collecting: true,
            ..Default::default()
        })),
    };
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let accept = accept.clone();
            std::thread::spawn(move || {
                let mut stream = stream;
                if canopy_wire::write_frame(&mut stream, &accept).is_err() {
                    return;
                }
                let mut buf = vec![0u8; 1 << 16];
                while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    Ok(())
}

/// The event interface's sets of modules, each timed per event.
const MODULE_SETS: [&[&str]; 7] = [
    &[],
    &["null"],
    &["profile"],
    &["trace"],
    &["utilization"],
    &["profile", "utilization"],
    &["profile", "trace", "null"],
];

/// The profile module's sets of per-event metrics, each timed per event.
const COUNTER_SETS: [&[&str]; 5] = [
    &[],
    &["task-clock", "page-faults", "context-switches"],
    &["task-clock", "page-faults", "context-switches", "depth"],
    &["heap"],
    &[
        "task-clock",
        "page-faults",
        "context-switches",
        "minor-faults",
        "major-faults",
        "cpu-migrations",
    ],
];

pub fn run(events: usize, pairs: u64, dumps: usize, gap_us: u64, repeats: usize) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("canopy-bench-sdk-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("agent.sock");
    sink(&socket)?;
    let mut config = canopy_sdk::Config::from_env("bench", Some(0), Some(1))?;
    config.socket = socket.clone();
    canopy_sdk::init_with(config)?;

    let timers = timer_pairs(pairs, repeats)?;
    let marks = step_marks(pairs, repeats)?;
    let dumped = dumps_of(events, dumps, gap_us, repeats)?;
    let activity = canopy_sdk::activity("event")?;
    let (per_set, clock_event_ns) = per_module_set(&activity, pairs, repeats)?;
    let (per_counter_set, counter_allocs) = per_counter_set(&activity, pairs, repeats)?;
    let unavailable = canopy_sdk::unavailable_counters();
    let _ = canopy_sdk::finalize();
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "\n## sdk: timer pairs ({pairs} per repeat), dumps of {events} events ({dumps} per repeat, {gap_us} us apart), to a sink agent"
    );
    println!("\n| measurement | median | min | max | baseline (median) | median/baseline |");
    println!("|---|---:|---:|---:|---:|---:|");
    let (m, lo, hi) = stats(timers.pair_ns);
    let (b, _, _) = stats(timers.clock_ns);
    println!(
        "| timer start+stop, ns | {m:.1} | {lo:.1} | {hi:.1} | two clock reads: {b:.1} | {:.2} |",
        m / b
    );
    let (m, lo, hi) = stats(marks);
    println!(
        "| step_start+step_stop (a cross-application timer's two ends), ns | {m:.1} | {lo:.1} | {hi:.1} | two clock reads: {b:.1} | {:.2} |",
        m / b
    );
    println!(
        "| the same per step of 100 ms (the workflow scenario's rate), % | {:.5} | {:.5} | {:.5} | | |",
        m / 1e6,
        lo / 1e6,
        hi / 1e6
    );
    let (m, lo, hi) = stats(dumped.dump_us);
    let (b, _, _) = stats(dumped.copy_us);
    println!(
        "| dump of {events} events, us (per dump, median over the run) | {m:.2} | {lo:.2} | {hi:.2} | copy of {events}x64 bytes: {b:.3} | {:.1} |",
        m / b
    );
    let (m, lo, hi) = stats(dumped.dump_p99);
    println!("| dump of {events} events, p99 us | {m:.2} | {lo:.2} | {hi:.2} | | |");
    let (m, lo, hi) = stats(timers.allocs);
    println!(
        "| heap allocations on the timing thread in {pairs} start+stop pairs | {m:.0} | {lo:.0} | {hi:.0} | | |"
    );
    print_sets(pairs, per_set, clock_event_ns, per_counter_set, counter_allocs);
    if !unavailable.is_empty() {
        println!("\ncounters unavailable: {unavailable:?}");
    }
    println!(
        "\ndumps dropped (queue full): {}; SDK stats: {:?}",
        dumped.dropped,
        canopy_sdk::stats()
    );
    Ok(())
}

/// Per repeat: a timer pair's nanoseconds, two clock reads' (what a pair cannot do without), and the
/// allocations of all the pairs.
struct TimerPairs {
    pair_ns: Vec<f64>,
    clock_ns: Vec<f64>,
    allocs: Vec<f64>,
}

fn timer_pairs(pairs: u64, repeats: usize) -> anyhow::Result<TimerPairs> {
    let t = canopy_sdk::timer("pair")?;
    t.start();
    t.stop();
    // A count of 0 below means something only if the counter sees allocations at all.
    let probe = allocation_counter::measure(|| {
        std::hint::black_box(Box::new(0u64));
    });
    anyhow::ensure!(
        probe.count_total >= 1,
        "the allocation counter is not active: a Box allocation was not counted"
    );
    let (mut pair_ns, mut clock_ns, mut allocs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..repeats {
        let start = Instant::now();
        let made = allocation_counter::measure(|| {
            for _ in 0..pairs {
                t.start();
                t.stop();
            }
        })
        .count_total;
        let elapsed = start.elapsed();
        pair_ns.push(elapsed.as_nanos() as f64 / pairs as f64);
        allocs.push(made as f64);
        let start = Instant::now();
        let mut sink = 0u64;
        for _ in 0..pairs {
            let a = Instant::now();
            let b = Instant::now();
            sink = sink.wrapping_add((b - a).as_nanos() as u64);
        }
        std::hint::black_box(sink);
        clock_ns.push(start.elapsed().as_nanos() as f64 / pairs as f64);
    }
    Ok(TimerPairs {
        pair_ns,
        clock_ns,
        allocs,
    })
}

/// Cross-application timers (seed 004's INIT_TIMER and TRACK_TIMER): a step's start and stop marks, 1000 pairs
/// between dumps (a dump carries at most 4096 marks), the dumps not timed. Nanoseconds a pair, per repeat.
fn step_marks(pairs: u64, repeats: usize) -> anyhow::Result<Vec<f64>> {
    let mut mark_ns = Vec::new();
    for _ in 0..repeats {
        let (mut spent, mut done) = (std::time::Duration::ZERO, 0u64);
        while done < pairs {
            let batch = 1000.min(pairs - done);
            let start = Instant::now();
            for step in done..done + batch {
                canopy_sdk::step_start("bench", step)?;
                canopy_sdk::step_stop("bench", step)?;
            }
            spent += start.elapsed();
            done += batch;
            let _ = canopy_sdk::dump();
        }
        mark_ns.push(spent.as_nanos() as f64 / pairs as f64);
    }
    Ok(mark_ns)
}

/// Per repeat: a dump's median and p99 microseconds, and a copy of as many values'.
struct Dumps {
    dump_us: Vec<f64>,
    dump_p99: Vec<f64>,
    copy_us: Vec<f64>,
    dropped: u64,
}

/// Dumps of `events` timers, each run once per round, and the copy of as many values.
fn dumps_of(events: usize, dumps: usize, gap_us: u64, repeats: usize) -> anyhow::Result<Dumps> {
    let timers: Vec<_> = (0..events)
        .map(|i| canopy_sdk::timer(&format!("event {i:03}")))
        .collect::<Result<_, _>>()?;
    let (mut dump_us, mut dump_p99, mut copy_us, mut dropped) = (Vec::new(), Vec::new(), Vec::new(), 0u64);
    let values: Vec<[u64; 8]> = (0..events as u64).map(|i| [i; 8]).collect();
    let mut copy: Vec<[u64; 8]> = Vec::with_capacity(events);
    for _ in 0..repeats {
        let mut times = Vec::with_capacity(dumps);
        for _ in 0..dumps {
            for t in &timers {
                t.start();
                t.stop();
            }
            let start = Instant::now();
            if canopy_sdk::dump().is_err() {
                dropped += 1;
            }
            times.push(start.elapsed().as_nanos() as f64 / 1000.0);
            // An application's iteration takes time; the shipper runs meanwhile.
            #[allow(
                clippy::disallowed_methods,
                reason = "stands in for an application's computing thread, which is not a runtime worker"
            )]
            std::thread::sleep(std::time::Duration::from_micros(gap_us));
        }
        dump_p99.push(crate::percentile(times.clone(), 0.99));
        dump_us.push(stats(times).0);
        let start = Instant::now();
        for _ in 0..dumps {
            copy.clear();
            copy.extend_from_slice(std::hint::black_box(&values));
            std::hint::black_box(&copy);
        }
        copy_us.push(start.elapsed().as_nanos() as f64 / 1000.0 / dumps as f64);
    }
    Ok(Dumps {
        dump_us,
        dump_p99,
        copy_us,
        dropped,
    })
}

/// The event interface: the cost of one event (half a begin+end pair) with each of [`MODULE_SETS`] in force,
/// against one clock read (what a timed event cannot do without). Nanoseconds per set and repeat, and the clock's.
fn per_module_set(
    activity: &canopy_sdk::Activity,
    pairs: u64,
    repeats: usize,
) -> anyhow::Result<(Vec<Vec<f64>>, Vec<f64>)> {
    let sets = MODULE_SETS;
    let mut per_set: Vec<Vec<f64>> = vec![Vec::new(); sets.len()];
    let mut clock_event_ns = Vec::new();
    for _ in 0..repeats {
        for (k, set) in sets.iter().enumerate() {
            canopy_sdk::set_modules(set)?;
            let start = Instant::now();
            for _ in 0..pairs {
                activity.begin();
                activity.end();
            }
            per_set[k].push(start.elapsed().as_nanos() as f64 / (2 * pairs) as f64);
        }
        let start = Instant::now();
        let mut sink = 0u64;
        for _ in 0..pairs {
            sink = sink.wrapping_add(Instant::now().elapsed().as_nanos() as u64);
        }
        std::hint::black_box(sink);
        clock_event_ns.push(start.elapsed().as_nanos() as f64 / pairs as f64 / 2.0);
    }
    canopy_sdk::set_modules(&["profile"])?;
    Ok((per_set, clock_event_ns))
}

/// Per-event metrics: the profile module's cost per event with each of [`COUNTER_SETS`], and the allocations
/// with three software counters.
fn per_counter_set(
    activity: &canopy_sdk::Activity,
    pairs: u64,
    repeats: usize,
) -> anyhow::Result<(Vec<Vec<f64>>, Vec<f64>)> {
    let counter_sets = COUNTER_SETS;
    let mut per_counter_set: Vec<Vec<f64>> = vec![Vec::new(); counter_sets.len()];
    let mut counter_allocs = Vec::new();
    for _ in 0..repeats {
        for (k, set) in counter_sets.iter().enumerate() {
            canopy_sdk::set_counters(set)?;
            // The first event opens the thread's counters.
            activity.begin();
            activity.end();
            let start = Instant::now();
            let made = allocation_counter::measure(|| {
                for _ in 0..pairs {
                    activity.begin();
                    activity.end();
                }
            })
            .count_total;
            per_counter_set[k].push(start.elapsed().as_nanos() as f64 / (2 * pairs) as f64);
            if k == 1 {
                counter_allocs.push(made as f64);
            }
        }
    }
    canopy_sdk::set_counters(&[])?;
    Ok((per_counter_set, counter_allocs))
}

/// The tables of the cost per event by modules and by per-event metrics.
fn print_sets(
    pairs: u64,
    per_set: Vec<Vec<f64>>,
    clock_event_ns: Vec<f64>,
    per_counter_set: Vec<Vec<f64>>,
    counter_allocs: Vec<f64>,
) {
    let (sets, counter_sets) = (MODULE_SETS, COUNTER_SETS);
    println!(
        "\n## sdk: cost per event (begin or end of an activity) by the modules in force, {pairs} pairs per repeat"
    );
    println!("\n| modules | median ns | min | max | baseline (median) | median/baseline |");
    println!("|---|---:|---:|---:|---:|---:|");
    let (b, _, _) = stats(clock_event_ns);
    for (set, times) in sets.iter().zip(per_set) {
        let (m, lo, hi) = stats(times);
        let name = if set.is_empty() {
            "none".to_string()
        } else {
            set.join(" + ")
        };
        println!(
            "| {name} | {m:.1} | {lo:.1} | {hi:.1} | one clock read: {b:.1} | {:.2} |",
            m / b
        );
    }
    println!(
        "\n## sdk: cost per event of the profile module with per-event metrics (CANOPY_COUNTERS), {pairs} pairs per repeat"
    );
    println!("\n| per-event metrics | median ns | min | max | baseline: none (median) | median/baseline |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut baseline = None;
    for (set, times) in counter_sets.iter().zip(per_counter_set) {
        let (m, lo, hi) = stats(times);
        let b = *baseline.get_or_insert(m);
        let name = if set.is_empty() {
            "none".to_string()
        } else {
            set.join(" + ")
        };
        println!("| {name} | {m:.1} | {lo:.1} | {hi:.1} | {b:.1} | {:.2} |", m / b);
    }
    let (m, lo, hi) = stats(counter_allocs);
    println!(
        "| heap allocations in {pairs} pairs with 3 software counters | {m:.0} | {lo:.0} | {hi:.0} | | |"
    );
}
