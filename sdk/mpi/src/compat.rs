//! TEMPORARY: the event interface's C functions over the SDK's timers and counters, until canopy-sdk-c has them.

use std::ffi::{CStr, c_char, c_double, c_int};
use std::sync::{Mutex, OnceLock};

use canopy_sdk::Timer;

const SLOTS: usize = 1024;
static ACTIVITIES: [OnceLock<&'static Timer>; SLOTS] = [const { OnceLock::new() }; SLOTS];
static COUNTERS: [OnceLock<String>; SLOTS] = [const { OnceLock::new() }; SLOTS];
static NAMES: Mutex<(Vec<String>, Vec<String>)> = Mutex::new((Vec::new(), Vec::new()));

/// # Safety
/// `name` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canopy_activity(name: *const c_char) -> c_int {
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
    let mut names = NAMES.lock().unwrap();
    if let Some(i) = names.0.iter().position(|n| *n == name) {
        return i as c_int;
    }
    let Ok(t) = canopy_sdk::timer(&name) else {
        return -1;
    };
    let i = names.0.len();
    let _ = ACTIVITIES[i].set(t);
    names.0.push(name);
    i as c_int
}

#[unsafe(no_mangle)]
pub extern "C" fn canopy_begin(id: c_int) {
    if let Some(t) = ACTIVITIES.get(id as usize).and_then(|s| s.get()) {
        t.start();
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn canopy_end(id: c_int) {
    if let Some(t) = ACTIVITIES.get(id as usize).and_then(|s| s.get()) {
        t.stop();
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn canopy_send(_dest: c_int, bytes: u64) {
    let _ = canopy_sdk::counter("messages_sent", 1.0);
    let _ = canopy_sdk::counter("bytes_sent", bytes as f64);
}

/// # Safety
/// `name` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canopy_counter_id(name: *const c_char) -> c_int {
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
    let mut names = NAMES.lock().unwrap();
    if let Some(i) = names.1.iter().position(|n| *n == name) {
        return i as c_int;
    }
    let i = names.1.len();
    let _ = COUNTERS[i].set(name.clone());
    names.1.push(name);
    i as c_int
}

#[unsafe(no_mangle)]
pub extern "C" fn canopy_count(id: c_int, value: c_double) {
    if let Some(n) = COUNTERS.get(id as usize).and_then(|s| s.get()) {
        let _ = canopy_sdk::counter(n, value);
    }
}
