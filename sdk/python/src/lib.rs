//! `canopy._canopy`: the SDK's calls for the Python package (sdk/python/python/canopy wraps them in Python's
//! habits). Every call that may wait (a dump, the last dump and the wait for the agent at finalize) releases the
//! GIL; every error is a `canopy.CanopyError` with the SDK's message.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _canopy,
    CanopyError,
    PyException,
    "An SDK call failed: a bad name or value, an unreachable agent, dumps that were not delivered."
);

fn err(e: canopy_sdk::Error) -> PyErr {
    match e {
        canopy_sdk::Error::NotInitialized => {
            CanopyError::new_err("canopy is not initialized (call canopy.init() first)")
        }
        e => CanopyError::new_err(e.to_string()),
    }
}

/// A timer's handle: its start and stop time the code between them on the calling thread.
#[pyclass(frozen, module = "canopy._canopy")]
struct Timer {
    timer: &'static canopy_sdk::Timer,
}

#[pymethods]
impl Timer {
    fn start(&self) {
        self.timer.start();
    }

    fn stop(&self) {
        self.timer.stop();
    }

    #[getter]
    fn name(&self) -> &str {
        self.timer.name()
    }
}

/// The handle of the timer `name` (made on first use; the same name gives the same handle).
#[pyfunction]
fn timer(name: &str) -> PyResult<Timer> {
    canopy_sdk::timer(name).map(|timer| Timer { timer }).map_err(err)
}

/// Starts the SDK: `app` names the application (empty: the program's name), `rank` and `nranks` (None: from the
/// launcher's environment, as the C SDK reads them).
#[pyfunction]
#[pyo3(signature = (app, rank=None, nranks=None))]
fn init(app: &str, rank: Option<u32>, nranks: Option<u32>) -> PyResult<()> {
    canopy_sdk::init(app, rank, nranks).map_err(err)?;
    finalize_at_process_exit();
    Ok(())
}

/// Finalizes at the process's exit as well as at the interpreter's: a runtime that ends the process from C
/// (charm4py's CkExit calls exit(3) without finalizing Python) would otherwise lose the last round. After the
/// interpreter's own finalize this finds the SDK finalized and does nothing.
fn finalize_at_process_exit() {
    extern "C" fn at_exit() {
        match canopy_sdk::finalize() {
            Ok(()) | Err(canopy_sdk::Error::Finalized | canopy_sdk::Error::NotInitialized) => {}
            Err(e) => eprintln!("canopy: finalize at exit: {e}"),
        }
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    #[allow(unsafe_code)] // one call to atexit(3); the safety argument is below
    ONCE.call_once(|| {
        // SAFETY: atexit(3) takes a plain function of no arguments that lives as long as the process (this
        // extension is never unloaded); it runs once, on the exiting thread.
        unsafe {
            libc::atexit(at_exit);
        }
    });
}

/// The calling thread becomes idle (the activity `Idle`), and busy again.
#[pyfunction]
fn idle_begin() {
    canopy_sdk::idle_begin();
}

#[pyfunction]
fn idle_end() {
    canopy_sdk::idle_end();
}

/// Adds `value` to the counter `name`.
#[pyfunction]
fn counter(name: &str, value: f64) -> PyResult<()> {
    canopy_sdk::counter(name, value).map_err(err)
}

/// Offloads this round's profile to the agent (from the SDK's own thread).
#[pyfunction]
fn dump(py: Python<'_>) -> PyResult<()> {
    py.detach(canopy_sdk::dump).map_err(err)
}

/// Marks the start of step `step` of the workflow key `key` on this rank.
#[pyfunction]
fn step_start(key: &str, step: u64) -> PyResult<()> {
    canopy_sdk::step_start(key, step).map_err(err)
}

/// Marks the end of step `step` of the workflow key `key` on this rank.
#[pyfunction]
fn step_stop(key: &str, step: u64) -> PyResult<()> {
    canopy_sdk::step_stop(key, step).map_err(err)
}

/// Takes the last dump, ships what is queued and waits for the agent's acknowledgement.
#[pyfunction]
fn finalize(py: Python<'_>) -> PyResult<()> {
    py.detach(canopy_sdk::finalize).map_err(err)
}

/// The SDK's counts: dumps taken, dropped and delivered, and stops without a start.
#[pyfunction]
fn stats() -> (u64, u64, u64, u64) {
    let s = canopy_sdk::stats();
    (s.dumps, s.dropped, s.delivered, s.mismatched_stops)
}

#[pymodule]
fn _canopy(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CanopyError", m.py().get_type::<CanopyError>())?;
    m.add_class::<Timer>()?;
    m.add_function(wrap_pyfunction!(timer, m)?)?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(counter, m)?)?;
    m.add_function(wrap_pyfunction!(dump, m)?)?;
    m.add_function(wrap_pyfunction!(step_start, m)?)?;
    m.add_function(wrap_pyfunction!(step_stop, m)?)?;
    m.add_function(wrap_pyfunction!(finalize, m)?)?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    m.add_function(wrap_pyfunction!(idle_begin, m)?)?;
    m.add_function(wrap_pyfunction!(idle_end, m)?)?;
    Ok(())
}
