//! The agent's heap warmed before the first round, in a process of its own (the heap settings are process-wide
//! and a thread's heap is its own): the first round's memory is served without the kernel faulting it in.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

mod common;

use std::hint::black_box;

use canopy_agent::heap;
use common::minor_faults;

/// The faults taken to write a round's dumps (128 of 8 KiB, kept until the caller drops them).
fn a_rounds_dumps() -> (Vec<Vec<u8>>, u64) {
    let before = minor_faults();
    let dumps: Vec<Vec<u8>> = (0..128u32).map(|r| vec![r as u8 | 1; 8 << 10]).collect();
    black_box(&dumps);
    (dumps, minor_faults() - before)
}

#[test]
fn a_warmed_heap_serves_the_first_round_without_faults() {
    assert!(heap::keep_freed_memory(), "glibc takes the settings");
    let (cold, warmed) = std::thread::spawn(|| {
        // A thread's first round on a heap of its own: 1 MiB, 256 pages, faulted in one by one.
        let (first, cold) = a_rounds_dumps();
        heap::warm(heap::WARM);
        let (second, warmed) = a_rounds_dumps();
        drop((first, second));
        (cold, warmed)
    })
    .join()
    .unwrap();
    assert!(
        cold >= 200,
        "a new heap faults its first round in page by page: {cold} faults"
    );
    assert!(
        warmed < 32,
        "a warmed heap serves a round from pages already in: {warmed} faults"
    );
}
