//! Per-event metrics beyond time (see `canopy_wire::event_metrics`): each thread's perf counters, opened as one
//! group on the thread's first event after the set changes and read with one system call at each entry and exit,
//! and the heap in use read at entry.
//!
//! A counter the kernel will not open (a hardware event on a machine without a PMU, a kernel that forbids it) is
//! reported once per process on standard error and in `Stats`, by name and reason, and left out; the others go on.

#![allow(
    unsafe_code,
    reason = "one audited use: taking ownership of the group leader's descriptor (see ThreadCounters::open)"
)]

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::os::unix::io::{FromRawFd, IntoRawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use canopy_wire::event_metrics::{ALL, Source};
use perf_event::events::{Hardware, Software};
use perf_event::{Builder, Counter, ReadFormat};

/// The perf counters of `event_metrics::ALL` (its first entries): a thread reads at most these many.
pub(crate) const COUNTERS: usize = 12;
/// `ALL`'s index of the heap and of the depth.
pub(crate) const HEAP: usize = 12;
pub(crate) const DEPTH: usize = 13;

/// The per-event metrics in force, as bits over `ALL` (0: none, the default).
static WANTED: AtomicU32 = AtomicU32::new(0);
/// Bumped at every change of `WANTED`: a thread whose counters belong to an older set reopens them.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The metrics some thread could not open, as bits over `ALL`.
static UNAVAILABLE: AtomicU32 = AtomicU32::new(0);
/// Each unavailable metric, once: (name, reason).
static REPORTED: Mutex<Vec<(&'static str, String)>> = Mutex::new(Vec::new());

/// Puts a set of per-event metrics in force (bits over `ALL`); threads reopen their counters at their next event.
pub(crate) fn set(bits: u32) {
    if WANTED.swap(bits, Ordering::AcqRel) != bits {
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
}

/// The per-event metrics in force (bits over `ALL`).
#[inline]
pub(crate) fn wanted() -> u32 {
    WANTED.load(Ordering::Relaxed)
}

pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// The metrics in force that every thread could open: the ones a profile reports.
pub(crate) fn reported() -> u32 {
    WANTED.load(Ordering::Acquire) & !UNAVAILABLE.load(Ordering::Acquire)
}

/// How many metrics could not be opened (the length of `unavailable()`), without taking its lock.
pub(crate) fn unavailable_count() -> usize {
    UNAVAILABLE.load(Ordering::Acquire).count_ones() as usize
}

/// The metrics that could not be opened, by name and reason.
pub(crate) fn unavailable() -> Vec<(String, String)> {
    lock(&REPORTED)
        .iter()
        .map(|(n, r)| (n.to_string(), r.clone()))
        .collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records that metric `i` cannot be measured, and says so the first time.
fn report(i: usize, reason: String) {
    let bit = 1 << i;
    if UNAVAILABLE.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
        return;
    }
    eprintln!(
        "canopy: counter {:?} is unavailable ({reason}); the other counters go on",
        ALL[i].name
    );
    lock(&REPORTED).push((ALL[i].name, reason));
}

/// Why the kernel refused a counter, in words.
fn reason(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(2) | Some(95) => "the machine has no such counter (no hardware PMU exposed here)".into(),
        Some(1) | Some(13) => format!(
            "not permitted by the kernel (kernel.perf_event_paranoid is {})",
            std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into())
        ),
        _ => e.to_string(),
    }
}

/// One thread's perf counters: a group read at once.
#[derive(Default)]
pub(crate) struct ThreadCounters {
    /// The group leader, owned as a file so a read takes one system call and no allocation.
    leader: Option<File>,
    /// The other members (closing one would take it out of the group).
    _members: Vec<Counter>,
    /// For each value a group read gives, in order, its index in `ALL`.
    order: Vec<u8>,
    /// A group read: the number of values, then (value, id) for each.
    buf: Vec<u8>,
}

impl std::fmt::Debug for ThreadCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadCounters")
            .field("order", &self.order)
            .finish()
    }
}

impl ThreadCounters {
    /// Opens the counters of `bits` for the calling thread; each one refused is reported and left out.
    pub(crate) fn open(bits: u32) -> ThreadCounters {
        let mut leader: Option<Counter> = None;
        let mut members = Vec::new();
        let mut order = Vec::new();
        for (i, m) in ALL.iter().enumerate().take(COUNTERS) {
            if bits & (1 << i) == 0 {
                continue;
            }
            let mut b = match m.source {
                Source::Software(config) => Builder::new(Software::from(config)),
                Source::Hardware(config) => Builder::new(Hardware::from(config)),
                Source::Heap | Source::Depth => continue,
            };
            b.enabled(true).read_format(ReadFormat::GROUP);
            // Kernel-side events (a context switch, a fault's handling) count only when the kernel is
            // included; a kernel that forbids that to this user still counts the user side.
            let mut built = build(b.exclude_kernel(false), leader.as_mut());
            if matches!(&built, Err(e) if matches!(e.raw_os_error(), Some(1) | Some(13))) {
                built = build(b.exclude_kernel(true), leader.as_mut());
            }
            match built {
                Ok(c) if leader.is_none() => leader = Some(c),
                Ok(c) => members.push(c),
                Err(e) => {
                    report(i, reason(&e));
                    continue;
                }
            }
            order.push(i as u8);
        }
        // SAFETY: `into_raw_fd` hands over the descriptor, which nothing else owns or closes from then on.
        let leader = leader.map(|c| unsafe { File::from_raw_fd(c.into_raw_fd()) });
        ThreadCounters {
            leader,
            _members: members,
            buf: vec![0; 8 * (1 + 2 * order.len())],
            order,
        }
    }

    /// Reads every counter of the group into `out`, by index in `ALL`; false (and `out` untouched) if the read
    /// failed.
    #[inline]
    pub(crate) fn read(&mut self, out: &mut [u64; COUNTERS]) -> bool {
        let Some(leader) = self.leader.as_mut() else {
            return true;
        };
        match leader.read(&mut self.buf) {
            Ok(n) if n == self.buf.len() => {}
            _ => return false,
        }
        for (k, i) in self.order.iter().enumerate() {
            let at = 8 + 16 * k;
            out[*i as usize] = u64::from_ne_bytes(self.buf[at..at + 8].try_into().expect("8 bytes"));
        }
        true
    }
}

fn build(b: &mut Builder<'_>, leader: Option<&mut Counter>) -> std::io::Result<Counter> {
    match leader {
        None => b.build(),
        Some(l) => b.build_with_group(l),
    }
}

/// The process's heap in use now, in bytes: its anonymous resident memory (resident less file-backed and
/// shared pages, from /proc/self/statm), the kernel's view whatever allocator the process uses. 0 if unreadable.
pub(crate) fn heap_bytes() -> u64 {
    static STATM: OnceLock<Option<(File, u64)>> = OnceLock::new();
    let Some((file, page)) = STATM.get_or_init(|| {
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .unwrap_or(4096) as u64;
        File::open("/proc/self/statm").ok().map(|f| (f, page))
    }) else {
        return 0;
    };
    let mut buf = [0u8; 128];
    let Ok(n) = file.read_at(&mut buf, 0) else {
        return 0;
    };
    let mut fields = buf[..n].split(|b| *b == b' ').map(|f| {
        f.iter()
            .take_while(|b| b.is_ascii_digit())
            .fold(0u64, |v, b| v * 10 + u64::from(b - b'0'))
    });
    let (_size, resident, shared) = (fields.next(), fields.next(), fields.next());
    match (resident, shared) {
        (Some(r), Some(s)) => r.saturating_sub(s) * page,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heap_grows_with_memory_touched() {
        let before = heap_bytes();
        assert!(before > 0);
        let block = vec![1u8; 64 << 20];
        let during = heap_bytes();
        assert!(during >= before + (60 << 20), "{before} -> {during}");
        drop(block);
    }

    #[test]
    fn software_counters_open_and_count_this_thread() {
        let bits = canopy_wire::event_metrics::parse_list("page-faults,context-switches").unwrap();
        let mut c = ThreadCounters::open(bits);
        let (mut a, mut b) = ([0; COUNTERS], [0; COUNTERS]);
        assert!(c.read(&mut a));
        // 256 fresh pages (of a block the allocator maps afresh), each touched once.
        let block = vec![0u8; 40 << 20];
        let touched: u64 = block.iter().step_by(4096).take(256).map(|b| u64::from(*b)).sum();
        #[allow(clippy::disallowed_methods, reason = "a sleep is a context switch")]
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert!(c.read(&mut b));
        assert_eq!(touched, 0);
        assert!(b[1] - a[1] >= 200, "page faults {} -> {}", a[1], b[1]);
        assert!(b[2] > a[2], "context switches {} -> {}", a[2], b[2]);
    }
}
