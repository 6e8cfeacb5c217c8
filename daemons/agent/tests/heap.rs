//! The agent's heap settings, in a process of their own (they are process-wide): a round's worth of dumps,
//! freed, is served again without the kernel faulting its pages in anew. Only glibc's malloc has the settings.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

mod common;

use std::hint::black_box;

use common::minor_faults;

/// One round of an agent of 1024 ranks: a buffer of 8 KiB per rank's dump, written, then all freed at close.
fn round() {
    let dumps: Vec<Vec<u8>> = (0..1024u32).map(|r| vec![r as u8; 8 << 10]).collect();
    black_box(&dumps);
}

/// Faults in the second of two rounds on the same thread.
fn faults_of_a_second_round() -> u64 {
    round();
    let before = minor_faults();
    round();
    minor_faults() - before
}

#[test]
fn a_rounds_freed_dumps_serve_the_next_round() {
    // Without the settings the second round faults in its 8 MiB again (2,048 pages of 4 KiB): the heap's
    // freed top was given back at the first round's close.
    let default = std::thread::spawn(faults_of_a_second_round).join().unwrap();
    assert!(
        default >= 1024,
        "the allocator's default gives a round's memory back: {default} faults"
    );

    assert!(
        canopy_agent::heap::keep_freed_memory(),
        "glibc takes the settings"
    );
    let kept = std::thread::spawn(faults_of_a_second_round).join().unwrap();
    assert!(
        kept < 64,
        "with the agent's settings the second round reuses the first one's pages: {kept} faults"
    );
}
