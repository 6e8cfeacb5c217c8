use super::*;
use std::time::Duration;

/// The totals of one timer, summed over the threads.
fn totals_of(t: &Timer) -> TimerTotals {
    let mut all = Totals::default();
    registry().totals(&mut all);
    all.timers[t.index as usize]
}

fn timer(name: &str) -> &'static Timer {
    registry().timer(name).unwrap()
}

#[test]
fn the_same_name_gives_the_same_handle() {
    assert!(std::ptr::eq(timer("same"), timer("same")));
    assert!(!std::ptr::eq(timer("same"), timer("other")));
    assert_eq!(timer("same").id(), crate::event_id("same"));
}

#[test]
#[allow(
    clippy::disallowed_methods,
    reason = "a synchronous test: the timers measure real time, so real time must pass"
)]
fn nested_timers_split_inclusive_and_exclusive_time() {
    let (outer, inner) = (timer("nest outer"), timer("nest inner"));
    outer.start();
    std::thread::sleep(Duration::from_millis(2));
    inner.start();
    std::thread::sleep(Duration::from_millis(4));
    inner.stop();
    outer.stop();
    let (o, i) = (totals_of(outer), totals_of(inner));
    assert_eq!((o.calls, o.subrs, i.calls, i.subrs), (1, 1, 1, 0));
    assert!(i.incl_ns >= 4_000_000 && i.excl_ns == i.incl_ns, "{i:?}");
    assert!(o.incl_ns >= 6_000_000, "{o:?}");
    assert_eq!(o.excl_ns, o.incl_ns - i.incl_ns);
}

#[test]
#[allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "a synchronous test: the timers measure real time, so real time must pass, and std's clock brackets it"
)]
fn a_recursive_timer_counts_its_inclusive_time_once() {
    let t = timer("recursive");
    let before = Instant::now();
    t.start();
    std::thread::sleep(Duration::from_millis(2));
    t.start();
    std::thread::sleep(Duration::from_millis(2));
    t.stop();
    t.stop();
    let outer = before.elapsed().as_nanos() as u64;
    let v = totals_of(t);
    assert_eq!(v.calls, 2);
    // Inclusive: the outer call only, which the clock read around it brackets, not outer plus inner (at
    // least 2 ms more than the bracket), however long a loaded machine stretches the sleeps.
    assert!(
        v.incl_ns >= 4_000_000 && v.incl_ns <= outer,
        "{v:?}, outer call within {outer} ns"
    );
    assert!(v.excl_ns <= v.incl_ns, "{v:?}");
}

#[test]
fn timers_of_several_threads_add_up() {
    let t = timer("threads");

    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..10 {
                    t.start();
                    t.stop();
                }
            });
        }
    });
    // The threads have ended: their values still count, whether a thread's table was already folded into
    // the retired totals or not yet (its thread-local destructor may run after the join).
    assert_eq!(totals_of(t).calls, 40);
}

#[test]
fn a_thread_that_ends_folds_its_values_into_the_retired_totals() {
    let t = timer("retired");
    let handle = std::thread::spawn(move || {
        for _ in 0..7 {
            t.start();
            t.stop();
        }
    });
    handle.join().unwrap();
    // A plain join waits for the thread to exit, thread-local destructors included.
    let retired = lock(&registry().retired);
    assert_eq!(retired.timers[t.index as usize].calls, 7);
    drop(retired);
    assert_eq!(totals_of(t).calls, 7);
}

#[test]
fn a_stop_that_does_not_match_is_ignored_and_counted() {
    let (a, b) = (timer("mismatch a"), timer("mismatch b"));
    let before = registry().mismatched_stops();
    b.stop();
    a.start();
    b.stop();
    a.stop();
    assert_eq!(registry().mismatched_stops() - before, 2);
    assert_eq!((totals_of(a).calls, totals_of(b).calls), (1, 0));
}

/// Touches `pages` fresh pages (each costs one page fault): of a block larger than glibc's largest mmap
/// threshold (32 MiB), which the allocator maps afresh each time rather than reusing pages.
fn touch(pages: usize) -> u64 {
    let block = vec![0u8; (40 << 20).max(pages * 4096)];
    let sum = block
        .iter()
        .step_by(4096)
        .take(pages)
        .map(|b| u64::from(*b))
        .sum();
    std::hint::black_box(block);
    sum
}

#[test]
#[allow(clippy::disallowed_methods, reason = "each sleep is one context switch")]
fn per_event_counters_split_inclusive_and_exclusive_counts() {
    let _turn = crate::events::tests::SWITCHING
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let (outer, inner) = (timer("perf outer"), timer("perf inner"));
    let bits =
        canopy_wire::event_metrics::parse_list("page-faults,context-switches,cycles,heap,depth").unwrap();
    perf::set(bits);
    // On a thread of its own: its counters open on its first event and count nothing of other tests.
    std::thread::spawn(move || {
        for _ in 0..10 {
            outer.start();
            touch(300);
            inner.start();
            touch(500);
            for _ in 0..3 {
                std::thread::sleep(Duration::from_millis(1));
            }
            inner.stop();
            outer.stop();
        }
    })
    .join()
    .unwrap();
    perf::set(0);
    let mut all = Totals::default();
    registry().totals(&mut all);
    let (o, i) = (
        all.metrics[outer.index as usize],
        all.metrics[inner.index as usize],
    );
    let (faults, switches) = (1, 2);
    // 5,000 pages touched inside the inner timer, 3,000 more inside the outer one alone; a few more for
    // the allocator's own pages and the timers' first use.
    assert!((5_000..5_300).contains(&i.incl[faults]), "{i:?}");
    assert_eq!(i.excl[faults], i.incl[faults]);
    assert!((8_000..8_600).contains(&o.incl[faults]), "{o:?}");
    assert_eq!(o.excl[faults], o.incl[faults] - i.incl[faults]);
    // 30 sleeps, each a switch away and back (all but one or two: a sleep whose timer fires before the thread
    // is off the core switches nothing); the outer timer's own share has none of them (a busy machine may
    // preempt the thread now and then, anywhere).
    assert!((28..=60).contains(&i.incl[switches]), "{i:?}");
    assert_eq!(o.incl[switches], i.incl[switches] + o.excl[switches]);
    assert!(o.excl[switches] <= 20, "{o:?}");
    assert_eq!((o.depth, i.depth), (1, 2));
    // The heap is the process's, which the tests running beside this one grow and shrink: both timers read
    // one, and no more can be said of their sizes.
    assert!(o.heap > 0 && i.heap > 0, "{o:?} {i:?}");
    // This machine's VM exposes no hardware PMU: cycles is reported by name and left out, the rest go on.
    if std::fs::read_dir("/sys/bus/event_source/devices/cpu").is_err() {
        assert!(
            perf::unavailable()
                .iter()
                .any(|(n, r)| n == "cycles" && r.contains("no hardware PMU")),
            "{:?}",
            perf::unavailable()
        );
        assert_eq!(i.incl[6], 0);
    }
}

#[test]
fn counters_add_up_over_threads() {
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                counter("bytes", 1.5).unwrap();
                counter("bytes", 2.5).unwrap();
            });
        }
    });
    let mut all = Totals::default();
    registry().totals(&mut all);
    let index = registry().counter_index("bytes").unwrap();
    assert_eq!(all.counters[index as usize], 12.0);
}
