//! Where the tool's events go: the Canopy SDK already in the process, or the tool's own.
//!
//! A program can hold a Canopy SDK before the tool is loaded: the MPI wrapper (`libcanopy_mpi`, preloaded) or
//! `libcanopy` (a program instrumented with the SDK). Then the tool reports through that SDK's C interface, found
//! by name among the process's global symbols, so that OpenMP's events and MPI's (or the program's own) are one
//! rank's profile, started and finished by its owner (`MPI_Init`, `canopy_init`). Otherwise the tool starts its
//! own SDK as the rank the environment names, dumps on the SDK's period (one second unless
//! `CANOPY_DUMP_PERIOD_MS` says otherwise) and finishes it when the OpenMP runtime shuts down.

use std::ffi::{CString, c_char, c_int};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The dump period of a process the tool started, when CANOPY_DUMP_PERIOD_MS does not give one.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(1);

/// The C interface of an SDK already in the process.
#[derive(Clone, Copy)]
pub struct Host {
    activity: unsafe extern "C" fn(*const c_char) -> c_int,
    begin: extern "C" fn(c_int),
    end: extern "C" fn(c_int),
    idle_begin: extern "C" fn(),
    idle_end: extern "C" fn(),
}

/// Where events go.
#[derive(Clone, Copy)]
pub enum Sink {
    /// The SDK linked into this library.
    Own,
    /// Another library's, through its C interface.
    Host(Host),
}

static SINK: OnceLock<Sink> = OnceLock::new();
/// Whether the tool started its own SDK (and so finishes it).
static STARTED: AtomicBool = AtomicBool::new(false);

/// The C function `name` among the process's global symbols.
fn global(name: &str) -> Option<*mut libc::c_void> {
    let name = CString::new(name).ok()?;
    // SAFETY: dlsym with RTLD_DEFAULT reads the loaded objects' symbol tables; the name is NUL-terminated.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!f.is_null()).then_some(f)
}

/// The SDK's C interface in another loaded library, if there is one. This library does not export it, so a
/// hit is another's.
fn host() -> Option<Host> {
    let (activity, begin, end) = (
        global("canopy_activity")?,
        global("canopy_begin")?,
        global("canopy_end")?,
    );
    let (idle_begin, idle_end) = (global("canopy_idle_begin")?, global("canopy_idle_end")?);
    // SAFETY: these are canopy.h's functions, with the signatures declared there.
    unsafe {
        Some(Host {
            activity: std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn(*const c_char) -> c_int>(
                activity,
            ),
            begin: std::mem::transmute::<*mut libc::c_void, extern "C" fn(c_int)>(begin),
            end: std::mem::transmute::<*mut libc::c_void, extern "C" fn(c_int)>(end),
            idle_begin: std::mem::transmute::<*mut libc::c_void, extern "C" fn()>(idle_begin),
            idle_end: std::mem::transmute::<*mut libc::c_void, extern "C" fn()>(idle_end),
        })
    }
}

/// Chooses where events go, once, when the runtime starts the tool: another SDK in the process, else this
/// library's own, started now. Returns which it chose.
pub fn open() -> Sink {
    *SINK.get_or_init(|| match host() {
        Some(h) => Sink::Host(h),
        None => {
            start_own();
            Sink::Own
        }
    })
}

/// Starts this library's SDK as the rank the environment names. A failure is one line: the program runs on,
/// its events kept by the profile but not shipped.
fn start_own() {
    let start = || {
        let mut config = canopy_sdk::Config::from_env("", None, None)?;
        config.period = config.period.or(Some(DEFAULT_PERIOD));
        canopy_sdk::init_with(config)
    };
    match std::panic::catch_unwind(start) {
        Ok(Ok(())) => STARTED.store(true, Ordering::Release),
        Ok(Err(e)) => say(&format!(
            "canopy-omp: Canopy did not start, this process is not monitored: {e}"
        )),
        Err(_) => say("canopy-omp: Canopy did not start (an internal error was caught)"),
    }
}

/// A line on stderr; a stderr that cannot be written to is no reason to stop the program (eprintln would panic,
/// and a panic in the runtime's callback aborts).
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Finishes the SDK the tool started (the last dump, FIN, the agent's FINACK); an SDK another library owns is
/// that library's to finish.
pub fn close() {
    if !STARTED.swap(false, Ordering::AcqRel) {
        return;
    }
    // finalize takes the last dump.
    let _ = std::panic::catch_unwind(|| {
        if let Err(e) = canopy_sdk::finalize() {
            say(&format!("canopy-omp: finalize: {e}"));
        }
    });
}

/// The activity named `name`, registered with the sink's SDK; None when it has no room for another name.
pub fn activity(name: &str) -> Option<u32> {
    match SINK.get()? {
        Sink::Own => canopy_sdk::activity(name).ok().map(|a| a.index()),
        Sink::Host(h) => {
            let name = CString::new(name).ok()?;
            // SAFETY: canopy_activity reads a NUL-terminated name.
            let id = unsafe { (h.activity)(name.as_ptr()) };
            u32::try_from(id).ok()
        }
    }
}

/// Activity `id` begins on the calling thread.
#[inline]
pub fn begin(id: u32) {
    match SINK.get() {
        Some(Sink::Own) => {
            if let Some(a) = canopy_sdk::Activity::from_index(id) {
                a.begin()
            }
        }
        Some(Sink::Host(h)) => (h.begin)(id as c_int),
        None => {}
    }
}

/// Activity `id`, the one begun last on the calling thread, ends.
#[inline]
pub fn end(id: u32) {
    match SINK.get() {
        Some(Sink::Own) => {
            if let Some(a) = canopy_sdk::Activity::from_index(id) {
                a.end()
            }
        }
        Some(Sink::Host(h)) => (h.end)(id as c_int),
        None => {}
    }
}

/// The calling thread waits.
#[inline]
pub fn idle_begin() {
    match SINK.get() {
        Some(Sink::Own) => canopy_sdk::idle_begin(),
        Some(Sink::Host(h)) => (h.idle_begin)(),
        None => {}
    }
}

/// The calling thread works again.
#[inline]
pub fn idle_end() {
    match SINK.get() {
        Some(Sink::Own) => canopy_sdk::idle_end(),
        Some(Sink::Host(h)) => (h.idle_end)(),
        None => {}
    }
}
