//! The C ABI between Canopy's daemons and filter plugins: the `#[repr(C)]` mirror of
//! `include/canopy_filter.h`. Types and constants only: no I/O, no logic.

use std::ffi::{c_char, c_int, c_void};

/// Bumped on any change to the types below; the host refuses a plugin built against another version.
pub const ABI_VERSION: u32 = 2;

/// The symbol every plugin exports.
pub const ENTRY_SYMBOL: &[u8] = b"canopy_filter_entry";

pub const LEVEL_LEAF: u32 = 0;
pub const LEVEL_RELAY: u32 = 1;
pub const LEVEL_ROOT: u32 = 2;

pub const UP: u32 = 0;
pub const DOWN: u32 = 1;

pub const OK: c_int = 0;
pub const ERROR: c_int = -1;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Bytes {
    pub ptr: *const u8,
    pub len: usize,
}

impl Bytes {
    pub const EMPTY: Bytes = Bytes {
        ptr: std::ptr::null(),
        len: 0,
    };

    /// Borrows a slice for the duration of a call.
    pub fn from_slice(s: &[u8]) -> Bytes {
        Bytes {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }

    /// # Safety
    /// `ptr` must point to `len` readable bytes (or be null with `len` 0) for the lifetime `'a`.
    pub unsafe fn as_slice<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() || self.len == 0 {
            &[]
        } else {
            // SAFETY: the caller guarantees ptr/len describe live, readable memory for 'a.
            unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Emitter {
    pub ctx: *mut c_void,
    pub emit: unsafe extern "C" fn(ctx: *mut c_void, direction: u32, phase: u32, ptr: *const u8, len: usize),
    pub reject: unsafe extern "C" fn(ctx: *mut c_void, input: usize, reason: *const c_char),
    pub fail: unsafe extern "C" fn(ctx: *mut c_void, reason: *const c_char),
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Name {
    pub id: u64,
    pub name: Bytes,
}

#[repr(C)]
#[derive(Debug)]
pub struct FilterVtable {
    pub abi_version: u32,
    pub name: *const c_char,
    pub descriptors: Bytes,
    pub result_type: *const c_char,
    pub phases: u32,
    pub create: unsafe extern "C" fn(
        params: *const u8,
        params_len: usize,
        level: u32,
        errors: *const Emitter,
    ) -> *mut c_void,
    pub upstream: unsafe extern "C" fn(
        instance: *mut c_void,
        round: u64,
        phase: u32,
        inputs: *const Bytes,
        n_inputs: usize,
        out: *const Emitter,
    ) -> c_int,
    pub downstream: unsafe extern "C" fn(
        instance: *mut c_void,
        round: u64,
        phase: u32,
        packet: Bytes,
        out: *const Emitter,
    ) -> c_int,
    pub finalize: unsafe extern "C" fn(
        instance: *mut c_void,
        round: u64,
        phase: u32,
        packet: Bytes,
        out: *const Emitter,
    ) -> c_int,
    pub names: Option<unsafe extern "C" fn(instance: *mut c_void, names: *const Name, n: usize)>,
    pub destroy: unsafe extern "C" fn(instance: *mut c_void),
}

// SAFETY: a vtable is immutable static data (function pointers and pointers to static strings and bytes).
unsafe impl Sync for FilterVtable {}
// SAFETY: as above; nothing in it is tied to a thread.
unsafe impl Send for FilterVtable {}

/// The type of `canopy_filter_entry`.
pub type EntryFn = unsafe extern "C" fn() -> *const FilterVtable;
