//! `libcanopy`: the C interface of Canopy's application SDK (see include/canopy.h). Every function catches
//! panics and returns an error code instead; none blocks on I/O or aborts the application.

// The C boundary reads C strings and hands out pointers: this crate is where the SDK must use unsafe code.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_double, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use canopy_sdk::{Activity, Counter, Error, Timer};

/// The opaque handle C code holds: a `canopy_sdk::Timer`, which lives as long as the process.
#[allow(non_camel_case_types)]
pub type canopy_timer = Timer;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = c);
}

/// Runs `f`, turning an error or a panic into a negative code and the thread's last error.
fn guard(f: impl FnOnce() -> Result<(), Error>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            set_error(&e.to_string());
            e.code()
        }
        Err(_) => {
            set_error("internal error in canopy (a panic was caught)");
            -2
        }
    }
}

/// A C string argument as UTF-8; NULL gives `None`.
///
/// # Safety
/// `s` is NULL or points to a NUL-terminated string.
unsafe fn str_arg<'a>(s: *const c_char, what: &str) -> Result<Option<&'a str>, Error> {
    if s.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller passes a NUL-terminated string, as canopy.h documents.
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str()
        .map(Some)
        .map_err(|_| Error::Invalid(format!("{what} is not valid UTF-8")))
}

/// See canopy.h.
///
/// # Safety
/// `app` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canopy_init(app: *const c_char, rank: c_int, nranks: c_int) -> c_int {
    guard(|| {
        // SAFETY: as documented above.
        let app = unsafe { str_arg(app, "the application name") }?.unwrap_or("");
        let rank = u32::try_from(rank).ok();
        let nranks = u32::try_from(nranks).ok();
        canopy_sdk::init(app, rank, nranks)
    })
}

/// See canopy.h.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canopy_timer_get(name: *const c_char) -> *const canopy_timer {
    let mut out: *const canopy_timer = std::ptr::null();
    guard(|| {
        // SAFETY: as documented above.
        let name = unsafe { str_arg(name, "the timer name") }?
            .ok_or_else(|| Error::Invalid("canopy_timer_get: the name is NULL".into()))?;
        out = canopy_sdk::timer(name)?;
        Ok(())
    });
    out
}

/// See canopy.h.
///
/// # Safety
/// `t` is NULL or a handle from `canopy_timer_get`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canopy_start(t: *const canopy_timer) {
    // SAFETY: handles from canopy_timer_get point to timers that are never freed.
    if let Some(t) = unsafe { t.as_ref() } {
        let t: &'static Timer = unsafe { &*(t as *const Timer) };
        t.start();
    }
}

/// See canopy.h.
///
/// # Safety
/// `t` is NULL or a handle from `canopy_timer_get`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canopy_stop(t: *const canopy_timer) {
    // SAFETY: handles from canopy_timer_get point to timers that are never freed.
    if let Some(t) = unsafe { t.as_ref() } {
        let t: &'static Timer = unsafe { &*(t as *const Timer) };
        t.stop();
    }
}

/// See canopy.h.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canopy_counter(name: *const c_char, value: c_double) {
    guard(|| {
        // SAFETY: as documented above.
        let name = unsafe { str_arg(name, "the counter name") }?
            .ok_or_else(|| Error::Invalid("canopy_counter: the name is NULL".into()))?;
        canopy_sdk::counter(name, value)
    });
}

/// A step mark's key as a string.
///
/// # Safety
/// `key` is NULL or a NUL-terminated string.
unsafe fn key_arg<'a>(key: *const c_char, call: &str) -> Result<&'a str, Error> {
    // SAFETY: as documented above.
    unsafe { str_arg(key, "the step key") }?.ok_or_else(|| Error::Invalid(format!("{call}: the key is NULL")))
}

/// See canopy.h.
///
/// # Safety
/// `key` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canopy_step_start(key: *const c_char, step: u64) -> c_int {
    guard(|| {
        // SAFETY: as documented above.
        let key = unsafe { key_arg(key, "canopy_step_start") }?;
        canopy_sdk::step_start(key, step)
    })
}

/// See canopy.h.
///
/// # Safety
/// `key` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canopy_step_stop(key: *const c_char, step: u64) -> c_int {
    guard(|| {
        // SAFETY: as documented above.
        let key = unsafe { key_arg(key, "canopy_step_stop") }?;
        canopy_sdk::step_stop(key, step)
    })
}

/// See canopy.h.
#[unsafe(no_mangle)]
pub extern "C" fn canopy_dump() -> c_int {
    guard(canopy_sdk::dump)
}

/// See canopy.h.
#[unsafe(no_mangle)]
pub extern "C" fn canopy_finalize() -> c_int {
    guard(canopy_sdk::finalize)
}

/// See canopy.h.
#[unsafe(no_mangle)]
pub extern "C" fn canopy_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|e| e.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// See canopy.h.
///
/// # Safety
/// Each pointer is NULL or points to writable storage of its type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canopy_stats(dumps: *mut u64, dropped: *mut u64, delivered: *mut u64) -> c_int {
    let s = canopy_sdk::stats();
    // SAFETY: as documented above.
    unsafe {
        if let Some(p) = dumps.as_mut() {
            *p = s.dumps;
        }
        if let Some(p) = dropped.as_mut() {
            *p = s.dropped;
        }
        if let Some(p) = delivered.as_mut() {
            *p = s.delivered;
        }
    }
    i32::from(s.connected)
}

/// See canopy.h.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canopy_activity(name: *const c_char) -> c_int {
    let mut out = -1;
    let code = guard(|| {
        // SAFETY: as documented above.
        let name = unsafe { str_arg(name, "the activity name") }?
            .ok_or_else(|| Error::Invalid("canopy_activity: the name is NULL".into()))?;
        out = canopy_sdk::activity(name)?.index() as c_int;
        Ok(())
    });
    if code < 0 { code } else { out }
}

/// See canopy.h.
#[unsafe(no_mangle)]
pub extern "C" fn canopy_begin(activity: c_int) {
    if let Some(a) = u32::try_from(activity).ok().and_then(Activity::from_index) {
        a.begin();
    }
}

/// See canopy.h.
#[unsafe(no_mangle)]
pub extern "C" fn canopy_end(activity: c_int) {
    if let Some(a) = u32::try_from(activity).ok().and_then(Activity::from_index) {
        a.end();
    }
}

/// See canopy.h.
#[unsafe(no_mangle)]
pub extern "C" fn canopy_send(dest: c_int, bytes: u64) {
    if let Ok(dest) = u32::try_from(dest) {
        canopy_sdk::send(dest, bytes);
    }
}

/// See canopy.h.
#[unsafe(no_mangle)]
pub extern "C" fn canopy_idle_begin() {
    canopy_sdk::idle_begin();
}

/// See canopy.h.
#[unsafe(no_mangle)]
pub extern "C" fn canopy_idle_end() {
    canopy_sdk::idle_end();
}

/// See canopy.h.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canopy_counter_id(name: *const c_char) -> c_int {
    let mut out = -1;
    let code = guard(|| {
        // SAFETY: as documented above.
        let name = unsafe { str_arg(name, "the counter name") }?
            .ok_or_else(|| Error::Invalid("canopy_counter_id: the name is NULL".into()))?;
        out = canopy_sdk::counter_id(name)?.index() as c_int;
        Ok(())
    });
    if code < 0 { code } else { out }
}

/// See canopy.h.
#[unsafe(no_mangle)]
pub extern "C" fn canopy_count(counter: c_int, value: c_double) {
    if let Some(c) = u32::try_from(counter).ok().and_then(Counter::from_index) {
        c.add(value);
    }
}
