//! Step marks: where a rank started or stopped a step of a workflow (a simulation's step s, stopped by the
//! analysis that consumed it), shipped with the rank's next dump. The latency filter pairs the earliest start
//! with the latest stop of each (key, step) over every rank of every application.
//!
//! A key is named like a timer: its id is the xxh3-64 of its name, and the name reaches the front-end as an
//! event name does. Marks wait in a process-wide buffer of at most [`MAX_MARKS`]; beyond it they are counted
//! as lost, and the count travels with the next profile.

use std::sync::Mutex;

use crate::Error;

/// The most marks one dump carries.
pub const MAX_MARKS: usize = 4096;

/// One mark: (key id, step, stop, Unix ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    pub key_id: u64,
    pub step: u64,
    pub stop: bool,
    pub unix_ns: u64,
}

#[derive(Debug, Default)]
struct Pending {
    marks: Vec<Mark>,
    lost: u64,
}

static PENDING: Mutex<Pending> = Mutex::new(Pending {
    marks: Vec::new(),
    lost: 0,
});

fn pending() -> std::sync::MutexGuard<'static, Pending> {
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records a mark of `key`'s step `step` now; the error names an empty key.
pub(crate) fn mark(key: &str, step: u64, stop: bool) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::Invalid("a step mark needs a key".into()));
    }
    // The key is registered as a timer's name (never started, so it adds no event): that gives its id and
    // sends its name with the first profile that carries it.
    let key_id = crate::measure::registry().timer(key)?.id();
    let unix_ns = crate::unix_ns();
    let mut p = pending();
    if p.marks.len() >= MAX_MARKS {
        p.lost += 1;
    } else {
        p.marks.push(Mark {
            key_id,
            step,
            stop,
            unix_ns,
        });
    }
    Ok(())
}

/// Moves the marks since the previous take into `into` (cleared first) and gives how many were lost.
pub(crate) fn take(into: &mut Vec<Mark>) -> u64 {
    into.clear();
    let mut p = pending();
    std::mem::swap(&mut p.marks, into);
    std::mem::take(&mut p.lost)
}

/// Lets the marks since the previous take go, counted as lost in the next profile: a dump that carries no
/// profile (sampled out, stopped) cannot ship them.
pub(crate) fn let_go() {
    let mut p = pending();
    let n = p.marks.len() as u64;
    p.lost = p.lost.saturating_add(n);
    p.marks.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Marks beyond the bound are counted, not kept, and a take empties the buffer. (The only test that
    /// touches the process-wide buffer.)
    #[test]
    fn marks_are_bounded_and_taken_once() {
        let mut got = Vec::new();
        take(&mut got);
        for s in 0..(MAX_MARKS as u64 + 3) {
            mark("exchange", s, s % 2 == 1).unwrap();
        }
        assert_eq!(take(&mut got), 3);
        assert_eq!(got.len(), MAX_MARKS);
        let id = crate::measure::registry().timer("exchange").unwrap().id();
        assert!(got.iter().all(|m| m.key_id == id));
        assert_eq!((got[1].step, got[1].stop), (1, true));
        assert!(got.windows(2).all(|w| w[0].unix_ns <= w[1].unix_ns));
        assert_eq!(take(&mut got), 0);
        assert!(got.is_empty());
        // Marks a dump without a profile lets go are counted in the next take.
        mark("exchange", 1, false).unwrap();
        mark("exchange", 1, true).unwrap();
        let_go();
        assert_eq!(take(&mut got), 2);
        assert!(got.is_empty());
        assert!(matches!(mark("", 1, false), Err(Error::Invalid(_))));
    }
}
