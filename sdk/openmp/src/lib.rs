//! libcanopy_omp: Canopy for an unmodified OpenMP program, through the OpenMP tools interface (OMPT).
//!
//! The OpenMP runtime loads it where `OMP_TOOL_LIBRARIES` names it (`canopy run --openmp` sets that for every
//! rank) and calls `ompt_start_tool`. From then on every parallel region, worksharing construct,
//! synchronization region and explicit task of the program is an activity of Canopy's SDK on the thread that
//! runs it, named for the construct and its place in the source (`omp for @lulesh.cc:1032`): callbacks.rs has
//! the whole mapping. The profile module sums a rank's threads; the utilization module sees the threads idle
//! while they wait at barriers; the trace module keeps each thread's events apart.
//!
//! With the MPI wrapper (or a program's own SDK) in the process, the events go to that SDK, so an MPI+OpenMP
//! program is one rank; alone, the tool is a rank of its own (sink.rs).
//!
//! LLVM's runtime (libomp, `clang -fopenmp`) and Intel's implement OMPT; GCC's libgomp does not call
//! `ompt_start_tool`, so a program built with `gcc -fopenmp` is not seen by the tool (its MPI calls still are).

// The runtime's entry point and callbacks are C functions over raw pointers: this crate must use unsafe code.
#![allow(unsafe_code)]

mod callbacks;
mod names;
mod ompt;
mod sink;

use std::ffi::{c_char, c_int, c_uint};

use ompt::{Data, InterfaceFn, Lookup, SET_IMPOSSIBLE, SetCallback, StartToolResult, event};

/// The tools interface's entry point: the runtime calls it once at start-up. The tool is active in any
/// process whose runtime calls it, unless CANOPY_OPENMP is `0`.
///
/// # Safety
/// Called by the OpenMP runtime as the OpenMP standard specifies.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ompt_start_tool(
    _omp_version: c_uint,
    _runtime_version: *const c_char,
) -> *mut StartToolResult {
    if std::env::var("CANOPY_OPENMP").is_ok_and(|v| v == "0") {
        return std::ptr::null_mut();
    }
    Box::leak(Box::new(StartToolResult {
        initialize,
        finalize,
        tool_data: Data { value: 0 },
    }))
}

/// The callbacks the tool registers, as the runtime takes them.
fn callbacks() -> [(c_int, &'static str, InterfaceFn); 7] {
    // SAFETY (each): a callback is registered as the generic `ompt_callback_t` and called by the runtime with
    // its own signature, which each function has (ompt.rs).
    unsafe {
        [
            (
                event::PARALLEL_BEGIN,
                "parallel_begin",
                std::mem::transmute::<ompt::ParallelBegin, InterfaceFn>(callbacks::parallel_begin),
            ),
            (
                event::IMPLICIT_TASK,
                "implicit_task",
                std::mem::transmute::<ompt::ImplicitTask, InterfaceFn>(callbacks::implicit_task),
            ),
            (
                event::WORK,
                "work",
                std::mem::transmute::<ompt::Work, InterfaceFn>(callbacks::work),
            ),
            (
                event::SYNC_REGION,
                "sync_region",
                std::mem::transmute::<ompt::SyncRegion, InterfaceFn>(callbacks::sync_region),
            ),
            (
                event::SYNC_REGION_WAIT,
                "sync_region_wait",
                std::mem::transmute::<ompt::SyncRegion, InterfaceFn>(callbacks::sync_region_wait),
            ),
            (
                event::TASK_CREATE,
                "task_create",
                std::mem::transmute::<ompt::TaskCreate, InterfaceFn>(callbacks::task_create),
            ),
            (
                event::TASK_SCHEDULE,
                "task_schedule",
                std::mem::transmute::<ompt::TaskSchedule, InterfaceFn>(callbacks::task_schedule),
            ),
        ]
    }
}

/// `ompt_initialize_t`: picks where events go, then registers the callbacks. Returns 0 (the tool stays
/// inactive) when the runtime offers no way to register them.
unsafe extern "C" fn initialize(lookup: Lookup, _initial_device: c_int, _tool_data: *mut Data) -> c_int {
    let Some(lookup) = lookup else { return 0 };
    // SAFETY: the runtime's lookup takes a NUL-terminated name.
    let Some(set) = (unsafe { lookup(c"ompt_set_callback".as_ptr()) }) else {
        sink::say("canopy-omp: the OpenMP runtime has no ompt_set_callback; OpenMP is not monitored");
        return 0;
    };
    // SAFETY: ompt_set_callback has the signature `ompt_set_callback_t`.
    let set = unsafe { std::mem::transmute::<unsafe extern "C" fn(), SetCallback>(set) };
    sink::open();
    let mut never = Vec::new();
    for (event, name, callback) in callbacks() {
        // SAFETY: as `callbacks` says.
        if unsafe { set(event, callback) } <= SET_IMPOSSIBLE {
            never.push(name);
        }
    }
    if !never.is_empty() {
        sink::say(&format!(
            "canopy-omp: this OpenMP runtime does not report {}; those constructs are not monitored",
            never.join(", ")
        ));
    }
    1
}

/// `ompt_finalize_t`: the runtime shuts down; the SDK the tool started is finished.
unsafe extern "C" fn finalize(_tool_data: *mut Data) {
    sink::close();
}
