//! The part of the OpenMP tools interface (OMPT, OpenMP 5.x, `omp-tools.h`) the tool uses: the start-up
//! handshake, the callbacks it registers and their arguments. Values and layouts are the header's.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `ompt_data_t`: a word the runtime keeps for the tool with each parallel region, task and thread.
#[repr(C)]
pub union Data {
    pub value: u64,
    pub ptr: *mut c_void,
}

/// `ompt_interface_fn_t`, as `ompt_function_lookup_t` returns it.
pub type InterfaceFn = Option<unsafe extern "C" fn()>;
/// `ompt_function_lookup_t`.
pub type Lookup = Option<unsafe extern "C" fn(name: *const c_char) -> InterfaceFn>;
/// `ompt_set_callback_t`: registers `callback` for `event`; returns an `ompt_set_result_t`.
pub type SetCallback = unsafe extern "C" fn(event: c_int, callback: InterfaceFn) -> c_int;
/// `ompt_initialize_t`: nonzero keeps the tool active.
pub type Initialize =
    unsafe extern "C" fn(lookup: Lookup, initial_device: c_int, tool_data: *mut Data) -> c_int;
/// `ompt_finalize_t`.
pub type Finalize = unsafe extern "C" fn(tool_data: *mut Data);

/// `ompt_start_tool_result_t`: what `ompt_start_tool` hands the runtime.
#[repr(C)]
pub struct StartToolResult {
    pub initialize: Initialize,
    pub finalize: Finalize,
    pub tool_data: Data,
}

/// `ompt_set_result_t` values at or below this (error, never, impossible) mean the callback will never be called.
pub const SET_IMPOSSIBLE: c_int = 2;

/// `ompt_callbacks_t`: the events the tool registers for.
pub mod event {
    use std::ffi::c_int;
    pub const PARALLEL_BEGIN: c_int = 3;
    pub const TASK_CREATE: c_int = 5;
    pub const TASK_SCHEDULE: c_int = 6;
    pub const IMPLICIT_TASK: c_int = 7;
    pub const SYNC_REGION_WAIT: c_int = 16;
    pub const WORK: c_int = 20;
    pub const SYNC_REGION: c_int = 23;
}

/// `ompt_scope_endpoint_t`.
pub mod scope {
    use std::ffi::c_int;
    pub const BEGIN: c_int = 1;
    pub const END: c_int = 2;
    pub const BEGINEND: c_int = 3;
}

/// `ompt_task_flag_t` bits.
pub mod task_flag {
    use std::ffi::c_int;
    pub const INITIAL: c_int = 0x1;
    pub const EXPLICIT: c_int = 0x4;
    pub const UNTIED: c_int = 0x1000_0000;
}

/// `ompt_task_status_t` values after which the prior task is suspended, not over.
pub mod task_status {
    use std::ffi::c_int;
    pub const YIELD: c_int = 2;
    pub const SWITCH: c_int = 7;
}

/// `ompt_callback_parallel_begin_t`.
pub type ParallelBegin = unsafe extern "C" fn(
    encountering_task: *mut Data,
    encountering_frame: *const c_void,
    parallel: *mut Data,
    requested_parallelism: c_uint,
    flags: c_int,
    codeptr_ra: *const c_void,
);

/// `ompt_callback_implicit_task_t`.
pub type ImplicitTask = unsafe extern "C" fn(
    endpoint: c_int,
    parallel: *mut Data,
    task: *mut Data,
    actual_parallelism: c_uint,
    index: c_uint,
    flags: c_int,
);

/// `ompt_callback_work_t`.
pub type Work = unsafe extern "C" fn(
    wstype: c_int,
    endpoint: c_int,
    parallel: *mut Data,
    task: *mut Data,
    count: u64,
    codeptr_ra: *const c_void,
);

/// `ompt_callback_sync_region_t` (and `_wait`, which has the same arguments).
pub type SyncRegion = unsafe extern "C" fn(
    kind: c_int,
    endpoint: c_int,
    parallel: *mut Data,
    task: *mut Data,
    codeptr_ra: *const c_void,
);

/// `ompt_callback_task_create_t`.
pub type TaskCreate = unsafe extern "C" fn(
    encountering_task: *mut Data,
    encountering_frame: *const c_void,
    new_task: *mut Data,
    flags: c_int,
    has_dependences: c_int,
    codeptr_ra: *const c_void,
);

/// `ompt_callback_task_schedule_t`.
pub type TaskSchedule = unsafe extern "C" fn(prior: *mut Data, prior_status: c_int, next: *mut Data);
