//! The filter host: loads `libcanopy_filter_<name>.so` from the configured search path, checks its ABI, and
//! wraps each instance as a [`FilterInstance`]. Only a filter's name ever reaches this module from the network; the
//! directories searched come from the daemon's own configuration.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use canopy_filter_abi as abi;

use crate::filter::{FilterError, FilterFactory, FilterInstance, Level, Output, Packet};
use crate::guard::guarded;

/// The filters Canopy ships. Their payload readers are fuzzed and their work is linear in their inputs, so the
/// daemons run them inline by default (`inline_filters`); every other plugin runs contained, on a thread per
/// stream.
pub const BUNDLED_FILTERS: &[&str] = &[
    "classify",
    "histogram",
    "kmeans",
    "latency",
    "nodes",
    "outliers",
    "passthrough",
    "stats",
    "utilization",
];

/// Where the daemons look for plugins when the configuration names no directory: beside the running
/// executable (a build tree), `../lib/canopy/filters` and `../lib64/canopy/filters` from it (an installation
/// under any prefix, with either library directory), then the system directories.
pub fn default_search_path() -> Vec<PathBuf> {
    let mut path = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        path.push(dir.clone());
        path.push(dir.join("../lib/canopy/filters"));
        path.push(dir.join("../lib64/canopy/filters"));
    }
    for system in ["/usr/lib/canopy/filters", "/usr/lib64/canopy/filters"] {
        let system = PathBuf::from(system);
        if !path.contains(&system) {
            path.push(system);
        }
    }
    path
}

/// The factory a daemon uses: its configured directories, or the defaults when it names none.
pub fn filters_from(configured: &[PathBuf]) -> std::sync::Arc<PluginFilters> {
    let path = if configured.is_empty() {
        default_search_path()
    } else {
        configured.to_vec()
    };
    std::sync::Arc::new(PluginFilters::new(path))
}

/// A loaded plugin: the library stays open as long as any instance or the factory holds it.
struct Plugin {
    // Declared before `_lib` so the pointer is never used after the library is unloaded.
    vtable: *const abi::FilterVtable,
    path: PathBuf,
    descriptors: Vec<u8>,
    result_type: String,
    phases: u32,
    _lib: libloading::Library,
}

impl Plugin {
    fn create_fn(&self) -> unsafe extern "C" fn(*const u8, usize, u32, *const abi::Emitter) -> *mut c_void {
        // SAFETY: the vtable was checked at load and lives as long as the library this `Plugin` holds.
        unsafe { (*self.vtable).create }
    }
}

// SAFETY: the vtable is immutable static data inside the library, which `Plugin` keeps loaded.
unsafe impl Send for Plugin {}
// SAFETY: as above; the vtable's functions are called with per-instance state only.
unsafe impl Sync for Plugin {}

/// Loads filters by name from a search path.
pub struct PluginFilters {
    search_path: Vec<PathBuf>,
    loaded: Mutex<HashMap<String, Arc<Plugin>>>,
}

impl std::fmt::Debug for PluginFilters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginFilters")
            .field("search_path", &self.search_path)
            .finish()
    }
}

/// What the front-end needs to know of a plugin to decode its results.
#[derive(Debug, Clone)]
pub struct PluginInfo {
    pub name: String,
    pub path: PathBuf,
    pub result_type: String,
    /// Phases of a round (more than one needs wait-for-all streams).
    pub phases: u32,
    pub descriptors: Vec<u8>,
}

impl PluginFilters {
    pub fn new(search_path: Vec<PathBuf>) -> Self {
        Self {
            search_path,
            loaded: Mutex::default(),
        }
    }

    pub fn search_path(&self) -> &[PathBuf] {
        &self.search_path
    }

    /// Loads (once) and checks a plugin; its descriptors and result type.
    pub fn info(&self, name: &str) -> Result<PluginInfo, FilterError> {
        let p = self.load(name)?;
        Ok(PluginInfo {
            name: name.to_string(),
            path: p.path.clone(),
            result_type: p.result_type.clone(),
            phases: p.phases,
            descriptors: p.descriptors.clone(),
        })
    }

    fn find(&self, name: &str) -> Option<PathBuf> {
        let file = format!("libcanopy_filter_{name}.so");
        self.search_path
            .iter()
            .map(|d| d.join(&file))
            .find(|p| p.is_file())
    }

    /// The error for a filter that is not on the path: what is, and the one the name looks like a slip of.
    fn unknown(&self, name: &str) -> FilterError {
        let names = self.names();
        let suggestion = names
            .iter()
            .map(|n| (strsim::levenshtein(name, n), n))
            .filter(|(d, n)| *d > 0 && *d <= 2.max(n.len() / 4))
            .min_by_key(|(d, _)| *d)
            .map(|(_, n)| n.clone());
        FilterError::Unknown {
            name: name.to_string(),
            available: names.join(", "),
            suggestion,
        }
    }

    fn load(&self, name: &str) -> Result<Arc<Plugin>, FilterError> {
        // A name is a word, never a path: nothing that arrives over the network can point elsewhere.
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(self.unknown(name));
        }
        let mut loaded = self.loaded.lock().expect("plugin registry");
        if let Some(p) = loaded.get(name) {
            return Ok(p.clone());
        }
        let Some(path) = self.find(name) else {
            return Err(self.unknown(name));
        };
        let failed = |reason: String| FilterError::Load {
            name: name.to_string(),
            path: path.clone(),
            reason,
        };
        // SAFETY: loading a library runs its initializers; plugins come only from the operator's search path.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| failed(e.to_string()))?;
        // SAFETY: the symbol's type is the ABI's entry type; a plugin that exports something else under this
        // name breaks the ABI contract, which the version check below catches for builds of other versions.
        let entry: abi::EntryFn = *unsafe { lib.get::<abi::EntryFn>(abi::ENTRY_SYMBOL) }
            .map_err(|_| failed("no canopy_filter_entry symbol: not a Canopy filter".to_string()))?;
        // SAFETY: calling the entry point is its documented use; it returns a pointer to static data. The
        // function pointer stays valid because `lib` moves into `Plugin` with it and is never unloaded first.
        let vtable = unsafe { entry() };
        if vtable.is_null() {
            return Err(failed("canopy_filter_entry returned null".into()));
        }
        // SAFETY: non-null, and valid while `lib` stays loaded (it moves into `Plugin` with the pointer).
        let vt = unsafe { &*vtable };
        if vt.abi_version != abi::ABI_VERSION {
            return Err(failed(format!(
                "ABI version {} but this daemon speaks version {}",
                vt.abi_version,
                abi::ABI_VERSION
            )));
        }
        // SAFETY: the vtable's strings and bytes are static data of the loaded library.
        let (plugin_name, result_type, descriptors) = unsafe {
            (
                c_str(vt.name),
                c_str(vt.result_type),
                vt.descriptors.as_slice().to_vec(),
            )
        };
        if plugin_name != name {
            return Err(failed(format!("the library calls itself {plugin_name:?}")));
        }
        tracing::info!(filter = name, path = %path.display(), "filter plugin loaded");
        if vt.phases == 0 {
            return Err(failed("declares 0 phases".into()));
        }
        let phases = vt.phases;
        let plugin = Arc::new(Plugin {
            vtable,
            path,
            descriptors,
            result_type,
            phases,
            _lib: lib,
        });
        loaded.insert(name.to_string(), plugin.clone());
        Ok(plugin)
    }
}

impl FilterFactory for PluginFilters {
    fn create(&self, name: &str, params: &str, level: Level) -> Result<Box<dyn FilterInstance>, FilterError> {
        let plugin = self.load(name)?;
        let level = match level {
            Level::Leaf => abi::LEVEL_LEAF,
            Level::Relay => abi::LEVEL_RELAY,
            Level::Root => abi::LEVEL_ROOT,
        };
        let mut sink = Sink::default();
        let emitter = sink.emitter();
        let create = plugin.create_fn();
        // SAFETY: the vtable is valid (plugin loaded); params and the emitter live across the call.
        let instance = guarded(|| unsafe { create(params.as_ptr(), params.len(), level, &emitter) })
            .map_err(|signal| FilterError::Crashed {
                filter: name.to_string(),
                call: "create".into(),
                signal,
                plugin: plugin.path.clone(),
            })?;
        if instance.is_null() {
            let reason = sink
                .fail
                .unwrap_or_else(|| "create failed without a reason".into());
            return Err(FilterError::BadParams {
                filter: name.to_string(),
                reason,
            });
        }
        Ok(Box::new(PluginFilter {
            plugin,
            instance,
            name: name.to_string(),
            crashed: None,
        }))
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .search_path
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flatten()
            .filter_map(|e| {
                let f = e.ok()?.file_name().into_string().ok()?;
                Some(
                    f.strip_prefix("libcanopy_filter_")?
                        .strip_suffix(".so")?
                        .to_string(),
                )
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

/// # Safety
/// `p` must be null or a NUL-terminated string that lives for the call.
unsafe fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// One instance of a plugin filter.
struct PluginFilter {
    plugin: Arc<Plugin>,
    instance: *mut c_void,
    name: String,
    /// The call that crashed and its signal: the instance is abandoned (never called, never destroyed).
    crashed: Option<(String, i32)>,
}

// SAFETY: the instance is only ever used through `&mut self` (one call at a time) by the node that owns it.
unsafe impl Send for PluginFilter {}
// SAFETY: no method takes `&self` into the plugin; shared references never reach the instance.
unsafe impl Sync for PluginFilter {}

impl Drop for PluginFilter {
    fn drop(&mut self) {
        if self.crashed.is_some() {
            return;
        }
        // SAFETY: the vtable is valid while the plugin is loaded.
        let destroy = unsafe { (*self.plugin.vtable).destroy };
        let instance = self.instance;
        // SAFETY: created by this plugin's `create`, destroyed once. A crash here only leaks the instance.
        if let Err(signal) = guarded(|| unsafe { destroy(instance) }) {
            tracing::error!(filter = %self.name, "destroy crashed with {}", crate::guard::signal_name(signal));
        }
    }
}

/// Collects what a call emits.
#[derive(Default)]
struct Sink {
    out: Output,
    fail: Option<String>,
}

impl Sink {
    fn emitter(&mut self) -> abi::Emitter {
        abi::Emitter {
            ctx: self as *mut Sink as *mut c_void,
            emit: sink_emit,
            reject: sink_reject,
            fail: sink_fail,
        }
    }
}

unsafe extern "C" fn sink_emit(ctx: *mut c_void, direction: u32, phase: u32, ptr: *const u8, len: usize) {
    // SAFETY: ctx is the `Sink` of the ongoing call; the bytes are readable for the call.
    let (sink, bytes) = unsafe { (&mut *(ctx as *mut Sink), abi::Bytes { ptr, len }.as_slice()) };
    let packet = Packet {
        phase,
        payload: bytes.to_vec(),
    };
    if direction == abi::DOWN {
        sink.out.down.push(packet)
    } else {
        sink.out.up.push(packet)
    }
}

unsafe extern "C" fn sink_reject(ctx: *mut c_void, input: usize, reason: *const c_char) {
    // SAFETY: as in `sink_emit`; the reason is a C string valid for the call.
    let (sink, reason) = unsafe { (&mut *(ctx as *mut Sink), c_str(reason)) };
    sink.out.rejected.push((input, reason));
}

unsafe extern "C" fn sink_fail(ctx: *mut c_void, reason: *const c_char) {
    // SAFETY: as in `sink_reject`.
    let (sink, reason) = unsafe { (&mut *(ctx as *mut Sink), c_str(reason)) };
    sink.fail = Some(reason);
}

/// A vtable entry that takes one packet: `downstream` and `finalize`.
type PacketEntry =
    unsafe extern "C" fn(*mut c_void, u64, u32, abi::Bytes, *const abi::Emitter) -> std::ffi::c_int;

impl PluginFilter {
    fn call_with_packet(
        &mut self,
        entry: PacketEntry,
        round: u64,
        phase: u32,
        packet: &[u8],
        call: &str,
    ) -> Result<Output, FilterError> {
        self.alive(call)?;
        let mut sink = Sink::default();
        let emitter = sink.emitter();
        let instance = self.instance;
        let bytes = abi::Bytes::from_slice(packet);
        // SAFETY: `entry` is this instance's plugin's (valid while the plugin is loaded); the packet and the
        // emitter live across the call.
        let code = guarded(|| unsafe { entry(instance, round, phase, bytes, &emitter) });
        let code = self.survived(code, call)?;
        self.finish(sink, code, call)
    }

    /// An instance that crashed is never called again.
    fn alive(&self, call: &str) -> Result<(), FilterError> {
        match &self.crashed {
            None => Ok(()),
            Some((crashed, signal)) => Err(FilterError::Failed {
                filter: self.name.clone(),
                reason: format!(
                    "{call} refused: {crashed} crashed with {} before",
                    crate::guard::signal_name(*signal)
                ),
            }),
        }
    }

    /// A guarded call's outcome: a crash abandons the instance.
    fn survived<R>(&mut self, out: Result<R, i32>, call: &str) -> Result<R, FilterError> {
        out.map_err(|signal| {
            self.crashed = Some((call.to_string(), signal));
            tracing::error!(filter = %self.name, plugin = %self.plugin.path.display(), call,
                "the plugin crashed with {} (signal {signal}): its instance is abandoned",
                crate::guard::signal_name(signal));
            FilterError::Crashed {
                filter: self.name.clone(),
                call: call.to_string(),
                signal,
                plugin: self.plugin.path.clone(),
            }
        })
    }

    fn finish(&self, sink: Sink, code: i32, call: &str) -> Result<Output, FilterError> {
        if code == abi::OK {
            return Ok(sink.out);
        }
        let reason = sink
            .fail
            .unwrap_or_else(|| format!("{call} returned {code} without a reason"));
        Err(FilterError::Failed {
            filter: self.name.clone(),
            reason,
        })
    }
}

impl FilterInstance for PluginFilter {
    fn upstream(&mut self, round: u64, phase: u32, inputs: &[&[u8]]) -> Result<Output, FilterError> {
        self.alive("upstream")?;
        let descs: Vec<abi::Bytes> = inputs.iter().map(|i| abi::Bytes::from_slice(i)).collect();
        let mut sink = Sink::default();
        let emitter = sink.emitter();
        // SAFETY: the vtable was checked at load and outlives the instance (see `Plugin`).
        let upstream = unsafe { (*self.plugin.vtable).upstream };
        let (instance, ptr, len) = (self.instance, descs.as_ptr(), descs.len());
        // SAFETY: instance and vtable are valid; inputs and the emitter live across the call.
        let code = guarded(|| unsafe { upstream(instance, round, phase, ptr, len, &emitter) });
        let code = self.survived(code, "upstream")?;
        self.finish(sink, code, "upstream")
    }

    fn downstream(&mut self, round: u64, phase: u32, packet: &[u8]) -> Result<Output, FilterError> {
        // SAFETY: the vtable was checked at load and outlives the instance (see `Plugin`).
        let entry = unsafe { (*self.plugin.vtable).downstream };
        self.call_with_packet(entry, round, phase, packet, "downstream")
    }

    fn finalize(&mut self, round: u64, phase: u32, payload: &[u8]) -> Result<Vec<u8>, FilterError> {
        // SAFETY: the vtable was checked at load and outlives the instance (see `Plugin`).
        let entry = unsafe { (*self.plugin.vtable).finalize };
        let mut out = self.call_with_packet(entry, round, phase, payload, "finalize")?;
        match (out.up.pop(), out.up.is_empty()) {
            (Some(p), true) => Ok(p.payload),
            (Some(_), false) => Err(FilterError::Failed {
                filter: self.name.clone(),
                reason: format!("finalize emitted {} results, not one", out.up.len() + 1),
            }),
            (None, _) => Err(FilterError::Failed {
                filter: self.name.clone(),
                reason: "finalize emitted no result".into(),
            }),
        }
    }

    fn phases(&self) -> u32 {
        self.plugin.phases
    }

    fn names(&mut self, names: &[(u64, String)]) {
        if self.crashed.is_some() {
            return;
        }
        // SAFETY: the vtable is valid while the plugin is loaded.
        let Some(f) = (unsafe { (*self.plugin.vtable).names }) else {
            return;
        };
        let descs: Vec<abi::Name> = names
            .iter()
            .map(|(id, n)| abi::Name {
                id: *id,
                name: abi::Bytes::from_slice(n.as_bytes()),
            })
            .collect();
        let (instance, ptr, len) = (self.instance, descs.as_ptr(), descs.len());
        // SAFETY: the names live across the call.
        let out = guarded(|| unsafe { f(instance, ptr, len) });
        let _ = self.survived(out, "names");
    }
}

#[cfg(test)]
mod search_path_tests {
    use std::path::PathBuf;

    #[test]
    fn the_default_path_finds_plugins_installed_under_lib_or_lib64() {
        let exe_dir = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
        let path = super::default_search_path();
        assert_eq!(
            path,
            [
                exe_dir.clone(),
                exe_dir.join("../lib/canopy/filters"),
                exe_dir.join("../lib64/canopy/filters"),
                PathBuf::from("/usr/lib/canopy/filters"),
                PathBuf::from("/usr/lib64/canopy/filters"),
            ]
        );
    }
}
