//! The crash guard: every call into a plugin runs under `guarded`, which turns a native crash inside it
//! (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) into an error on the calling thread instead of the daemon's death.
//!
//! The handler (`guard.c`) jumps back to the call with `siglongjmp`. What it jumps over is the plugin's own code and
//! one Rust trampoline that owns nothing, so nothing of the host is left half done; what the plugin held (its
//! instance, its heap, a lock it took) is abandoned with it. The host never calls that instance again.

use std::ffi::{c_int, c_void};
use std::sync::Once;

unsafe extern "C" {
    fn canopy_guard_install() -> c_int;
    fn canopy_guard_call(f: unsafe extern "C" fn(*mut c_void), arg: *mut c_void) -> c_int;
}

static INSTALL: Once = Once::new();

/// Installs the process's handler (once); the handlers that were there are called outside guarded calls.
pub fn install() {
    INSTALL.call_once(|| {
        // SAFETY: installs a signal handler for the crash signals; it chains to the previous handlers.
        if unsafe { canopy_guard_install() } != 0 {
            tracing::warn!(
                "the plugin crash guard could not be installed: a crashing plugin kills the daemon"
            );
        }
    });
}

/// A signal's name, for the reason a stream failed.
pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        11 => "SIGSEGV",
        _ => "signal",
    }
}

struct Call<F, R> {
    f: Option<F>,
    out: Option<R>,
}

unsafe extern "C" fn trampoline<F: FnOnce() -> R, R>(arg: *mut c_void) {
    // SAFETY: `arg` is the `Call` of `guarded`, alive across this call.
    let call = unsafe { &mut *(arg as *mut Call<F, R>) };
    if let Some(f) = call.f.take() {
        call.out = Some(f());
    }
}

/// Runs `f`, a call into a plugin; `Err(signal)` if the plugin crashed in it. `f` must own nothing that needs
/// dropping (it captures references and plain values), since a crash skips the rest of it.
pub(crate) fn guarded<F: FnOnce() -> R, R>(f: F) -> Result<R, i32> {
    install();
    let mut call = Call {
        f: Some(f),
        out: None,
    };
    // SAFETY: the trampoline gets the `Call` it was instantiated for; a crash jumps back into
    // `canopy_guard_call` over the plugin's frames and the trampoline's, which own nothing.
    let signal =
        unsafe { canopy_guard_call(trampoline::<F, R>, &mut call as *mut Call<F, R> as *mut c_void) };
    match (signal, call.out) {
        (0, Some(out)) => Ok(out),
        (0, None) => Err(0),
        (s, _) => Err(s),
    }
}
