//! The agent process's heap: memory its ranks' dumps used in one round is kept for the next.
//!
//! Every rank's dump of a round lives in a buffer of its own until the round closes (about 8 KiB for a profile
//! of 100 events), and the round's other buffers come and go with it. glibc's malloc gives freed memory at the
//! top of a heap back to the kernel once it exceeds 128 KiB (a threshold it raises only as blocks of its own
//! mappings come and go), and the next round takes it back one page fault at a time, each page zeroed and
//! charged to the memory cgroup again. On the 4 x 16 tree saturated, an agent took 1,000 to 2,200 such faults a
//! second; with this heap, none to 60, and the agents' CPU per round fell by 5 to 10% (docs/benchmarks.md).

use std::sync::atomic::{AtomicBool, Ordering};

/// Freed memory above this stays with the process (glibc's default is 128 KiB, raised as large blocks come and
/// go); it is the most each of malloc's heaps (one per thread that allocates at once, up to eight a core) keeps
/// beyond what it uses.
pub const KEEP_FREED: usize = 32 << 20;
/// Blocks up to this size come from the heap, and are reused, rather than from a mapping of their own that
/// is faulted in afresh each time (glibc's default is 128 KiB).
pub const MAP_ABOVE: usize = 4 << 20;
/// The heap [`warm`] faults in before the first round: more than the round of an agent of 128 ranks with 100
/// events each takes (it grows by about 0.3 MiB with 4 or 64 such ranks).
pub const WARM: usize = 2 << 20;

/// Makes the process keep up to [`KEEP_FREED`] bytes of freed heap and serve blocks up to [`MAP_ABOVE`] from
/// it. Process-wide: called once, by the agent's `main`. Returns whether the allocator took the settings (only
/// glibc's has them; elsewhere the allocator's own policy stays).
pub fn keep_freed_memory() -> bool {
    let kept = set(KEEP_FREED, MAP_ABOVE);
    KEEPING.store(kept, Ordering::Relaxed);
    kept
}

/// [`keep_freed_memory`]'s settings are in force: what [`warm`] frees stays in the heap.
static KEEPING: AtomicBool = AtomicBool::new(false);

/// Faults `bytes` of the calling thread's heap in now, before the first round needs them, and leaves them free
/// for it; only once [`keep_freed_memory`] is in force, without which the heap would give them back at once.
/// Otherwise the first round takes its memory one page fault at a time: on the peer kit's tree of 16 agents of 4
/// ranks on two cores, about 330 us of kernel time at each agent, most of what made the first round twice as slow
/// as the next. Call it on the thread that handles the rounds: malloc gives the threads that allocate at once
/// heaps of their own (up to eight a core), and only the calling thread's is warmed.
pub fn warm(bytes: usize) {
    if !KEEPING.load(Ordering::Relaxed) {
        return;
    }
    let mut block: Vec<u8> = Vec::with_capacity(bytes);
    // Written, not zeroed: a zeroed block may come as fresh pages that are never touched.
    block.resize(bytes, 1);
    std::hint::black_box(&mut block);
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // two calls to glibc's mallopt; the safety argument is below
fn set(keep: usize, map_above: usize) -> bool {
    let (Ok(keep), Ok(map_above)) = (i32::try_from(keep), i32::try_from(map_above)) else {
        return false;
    };
    // SAFETY: mallopt takes two integers, changes only the allocator's tunables (under its own lock), and is
    // safe to call at any time from any thread.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, keep) == 1
            && libc::mallopt(libc::M_MMAP_THRESHOLD, map_above) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set(_keep: usize, _map_above: usize) -> bool {
    false
}
