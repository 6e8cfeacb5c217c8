//! The OMPT callbacks: each turns a runtime event on a thread into the SDK's events on that thread.
//!
//! - A parallel region is the activity `omp parallel @place` on every thread of its team, from its implicit
//!   task's begin to its end: its calls are the team's threads, its time the threads' time in it.
//! - A worksharing construct is `omp for @place` (`sections`, `single`, `workshare`, `distribute`,
//!   `taskloop`, `scope`) on each thread that takes part, from its begin to its end.
//! - A synchronization region is `omp barrier @place` (`barrier (implicit)`, `taskwait`, `taskgroup`,
//!   `reduction`), and the time a thread waits in it `omp barrier wait @place`, nested in it, during which
//!   the thread is idle (the SDK's idle events, which the utilization module reads).
//! - An explicit task is `omp task @place` on the thread that runs it, from when it is scheduled to when it
//!   completes. A task that runs tasks while it waits (at a taskwait) holds them as nested activities; a tied
//!   task suspended at a yield stays begun until it completes on this thread; an untied one ends where it is
//!   suspended and begins again where it resumes.
//!
//! Each thread keeps a stack of what the tool began there. An end closes its own frame, and any the runtime
//! left open above it, so the SDK's begin-end pairs stay nested whatever order the runtime reports in.

use std::cell::RefCell;
use std::ffi::{c_int, c_uint, c_void};

use crate::names::{self, PARALLEL, PARALLEL_TAG, TASK, TASK_TAG};
use crate::ompt::{Data, scope, task_flag, task_status};
use crate::sink;

/// What a frame stands for, so that an end finds its own begin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    ImplicitTask,
    Work,
    Sync,
    Wait,
    /// An explicit task, by the address of its runtime word.
    Task(usize),
}

/// An activity the tool began on this thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub token: Token,
    pub activity: u32,
    /// An implicit task of a worker (not the team's primary thread).
    pub worker: bool,
}

/// Ends `token` on a thread's stack: hands `end` its frame and those above it, innermost first, and takes them
/// off (nothing when `token` is not on the stack).
pub fn close(stack: &mut Vec<Frame>, token: Token, mut end: impl FnMut(Frame)) {
    if let Some(at) = stack.iter().rposition(|f| f.token == token) {
        stack[at..].iter().rev().for_each(|f| end(*f));
        stack.truncate(at);
    }
}

thread_local! {
    static STACK: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

/// Begins `activity` on this thread as `token`.
fn push(token: Token, activity: Option<u32>) {
    push_frame(token, activity, false)
}

fn push_frame(token: Token, activity: Option<u32>, worker: bool) {
    let Some(activity) = activity else { return };
    let pushed = STACK.try_with(|s| match s.try_borrow_mut() {
        Ok(mut s) => {
            s.push(Frame {
                token,
                activity,
                worker,
            });
            true
        }
        Err(_) => false,
    });
    if pushed == Ok(true) {
        sink::begin(activity);
        // Idle inside the wait's activity: the utilization module credits the innermost activity.
        if token == Token::Wait {
            sink::idle_begin();
        }
    }
}

/// Ends `token`'s frame on this thread, and any left open above it.
fn pop(token: Token) {
    let _ = STACK.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            close(&mut s, token, |f| {
                if f.token == Token::Wait {
                    sink::idle_end();
                }
                sink::end(f.activity);
            });
        }
    });
}

/// Whether this thread's innermost implicit task is a worker's (None outside any).
fn in_worker_task() -> Option<bool> {
    STACK
        .try_with(|s| {
            s.try_borrow().ok().and_then(|s| {
                s.iter()
                    .rev()
                    .find(|f| f.token == Token::ImplicitTask)
                    .map(|f| f.worker)
            })
        })
        .ok()
        .flatten()
}

/// Whether `token` is begun on this thread.
fn running(token: Token) -> bool {
    STACK
        .try_with(|s| {
            s.try_borrow()
                .map(|s| s.iter().any(|f| f.token == token))
                .unwrap_or(false)
        })
        .unwrap_or(false)
}

/// A scope's begin, end, or both at once.
fn scoped(endpoint: c_int, token: Token, activity: impl FnOnce() -> Option<u32>) {
    if endpoint == scope::BEGIN || endpoint == scope::BEGINEND {
        push(token, activity());
    }
    if endpoint == scope::END || endpoint == scope::BEGINEND {
        pop(token);
    }
}

/// `ompt_callback_parallel_begin`, on the encountering thread: the region's activity, kept in its word for
/// the team's implicit tasks.
pub unsafe extern "C" fn parallel_begin(
    _encountering_task: *mut Data,
    _encountering_frame: *const c_void,
    parallel: *mut Data,
    _requested_parallelism: c_uint,
    _flags: c_int,
    codeptr_ra: *const c_void,
) {
    names::keep(parallel, codeptr_ra, PARALLEL_TAG);
}

/// `ompt_callback_implicit_task`, on each thread of a team: the parallel region's activity on this thread.
/// The initial task, which spans the program, is not one.
pub unsafe extern "C" fn implicit_task(
    endpoint: c_int,
    parallel: *mut Data,
    _task: *mut Data,
    _actual_parallelism: c_uint,
    index: c_uint,
    flags: c_int,
) {
    if flags & task_flag::INITIAL != 0 {
        return;
    }
    if endpoint == scope::BEGIN || endpoint == scope::BEGINEND {
        let codeptr = names::kept(parallel, PARALLEL_TAG).unwrap_or(std::ptr::null());
        push_frame(
            Token::ImplicitTask,
            names::activity(PARALLEL, codeptr),
            index != 0,
        );
    }
    if endpoint == scope::END || endpoint == scope::BEGINEND {
        pop(Token::ImplicitTask);
    }
}

/// Whether a synchronization region (`ompt_sync_region_t`) on a worker is the barrier that closes a parallel
/// region: `barrier_implicit_parallel`; or, from runtimes that report every implicit barrier as the older
/// `barrier_implicit` (libomp 14), the one with no code pointer, as a worker's join barrier has none.
fn closes_region(kind: c_int, codeptr_ra: *const c_void) -> bool {
    kind == 9 || (kind == 2 && codeptr_ra.is_null())
}

/// `ompt_callback_work`: a worksharing construct on this thread.
pub unsafe extern "C" fn work(
    wstype: c_int,
    endpoint: c_int,
    _parallel: *mut Data,
    _task: *mut Data,
    _count: u64,
    codeptr_ra: *const c_void,
) {
    if let Some(label) = names::work_label(wstype) {
        scoped(endpoint, Token::Work, || names::activity(label, codeptr_ra));
    }
}

/// `ompt_callback_sync_region`: a barrier, taskwait, taskgroup or reduction on this thread.
pub unsafe extern "C" fn sync_region(
    kind: c_int,
    endpoint: c_int,
    parallel: *mut Data,
    _task: *mut Data,
    codeptr_ra: *const c_void,
) {
    let (label, _) = names::sync_labels(kind);
    if closes_region(kind, codeptr_ra) {
        match in_worker_task() {
            // A worker reaches the region's closing barrier: the runtime reports the barrier's end, and the
            // implicit task's, only when it releases the worker for the next region, after the program's
            // serial part. Its barrier is counted and its region ends here; those late ends find nothing.
            Some(true) => {
                if endpoint == scope::BEGIN || endpoint == scope::BEGINEND {
                    push(
                        Token::Sync,
                        names::activity(label, place_of(codeptr_ra, parallel)),
                    );
                    pop(Token::ImplicitTask);
                }
                return;
            }
            None => return,
            Some(false) => {}
        }
    }
    scoped(endpoint, Token::Sync, || {
        names::activity(label, place_of(codeptr_ra, parallel))
    });
}

/// `ompt_callback_sync_region_wait`: the time this thread waits in one; idle meanwhile.
pub unsafe extern "C" fn sync_region_wait(
    kind: c_int,
    endpoint: c_int,
    parallel: *mut Data,
    _task: *mut Data,
    codeptr_ra: *const c_void,
) {
    let (_, label) = names::sync_labels(kind);
    // A worker's wait at the closing barrier lasts until the next region (see sync_region): not its region's.
    if closes_region(kind, codeptr_ra) && in_worker_task() != Some(false) {
        return;
    }
    scoped(endpoint, Token::Wait, || {
        names::activity(label, place_of(codeptr_ra, parallel))
    });
}

/// A synchronization region's code pointer; where the runtime gives none (a worker's implicit barrier at the
/// end of a parallel region), the region's.
fn place_of(codeptr_ra: *const c_void, parallel: *mut Data) -> *const c_void {
    match codeptr_ra.is_null() {
        true => names::kept(parallel, PARALLEL_TAG).unwrap_or(codeptr_ra),
        false => codeptr_ra,
    }
}

/// `ompt_callback_task_create`: an explicit task's activity, kept in its word until it runs.
pub unsafe extern "C" fn task_create(
    _encountering_task: *mut Data,
    _encountering_frame: *const c_void,
    new_task: *mut Data,
    flags: c_int,
    _has_dependences: c_int,
    codeptr_ra: *const c_void,
) {
    if flags & task_flag::EXPLICIT != 0 {
        let untied = match flags & task_flag::UNTIED != 0 {
            true => names::UNTIED_TAG,
            false => 0,
        };
        names::keep(new_task, codeptr_ra, TASK_TAG | untied);
    }
}

/// `ompt_callback_task_schedule`: the prior task ends unless it is only suspended; the next begins unless it
/// is already begun here (a tied task resuming). A suspended untied task may resume on another thread, so it
/// ends at its suspension and begins again where it resumes: each part is a call.
pub unsafe extern "C" fn task_schedule(prior: *mut Data, prior_status: c_int, next: *mut Data) {
    let suspended = prior_status == task_status::YIELD || prior_status == task_status::SWITCH;
    if names::kept(prior, TASK_TAG).is_some() && (!suspended || names::untied(prior)) {
        pop(Token::Task(prior as usize));
    }
    if let Some(codeptr) = names::kept(next, TASK_TAG) {
        let token = Token::Task(next as usize);
        if !running(token) {
            push(token, names::activity(TASK, codeptr));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(token: Token, activity: u32) -> Frame {
        Frame {
            token,
            activity,
            worker: false,
        }
    }

    fn ending(stack: &mut Vec<Frame>, token: Token) -> Vec<Frame> {
        let mut ended = Vec::new();
        close(stack, token, |f| ended.push(f));
        ended
    }

    #[test]
    fn an_end_closes_its_frame_and_those_left_open_above_it_innermost_first() {
        let mut stack = vec![
            frame(Token::ImplicitTask, 1),
            frame(Token::Work, 2),
            frame(Token::Task(0x1000), 3),
            frame(Token::Sync, 4),
        ];
        assert_eq!(
            ending(&mut stack, Token::Work),
            vec![
                frame(Token::Sync, 4),
                frame(Token::Task(0x1000), 3),
                frame(Token::Work, 2)
            ]
        );
        assert_eq!(stack, vec![frame(Token::ImplicitTask, 1)]);
    }

    #[test]
    fn an_end_with_no_begin_changes_nothing() {
        let mut stack = vec![frame(Token::ImplicitTask, 1)];
        assert!(ending(&mut stack, Token::Wait).is_empty());
        assert!(ending(&mut stack, Token::Task(0x2000)).is_empty());
        assert_eq!(stack.len(), 1);
    }

    #[test]
    fn the_innermost_of_two_frames_of_a_kind_ends_first() {
        // Nested parallelism: an implicit task within an implicit task.
        let mut stack = vec![frame(Token::ImplicitTask, 1), frame(Token::ImplicitTask, 5)];
        assert_eq!(
            ending(&mut stack, Token::ImplicitTask),
            vec![frame(Token::ImplicitTask, 5)]
        );
        assert_eq!(
            ending(&mut stack, Token::ImplicitTask),
            vec![frame(Token::ImplicitTask, 1)]
        );
    }
}
