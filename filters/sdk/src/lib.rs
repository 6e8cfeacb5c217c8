//! Write Canopy filter plugins in safe Rust: implement [`Filter`], then `export_filter!(MyFilter);` exports
//! the one C symbol the daemons look for. Every entry point catches panics: a panicking filter fails its call
//! with the panic message, the daemon lives, and the instance refuses later calls. What most plugins would
//! otherwise repeat has a default: Canopy's own descriptors, packets from above passed on down, and a root
//! packet that is already the result.

// The FFI glue behind export_filter! turns raw pointers into slices; every unsafe block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

pub use canopy_filter_abi as abi;

/// Where an instance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// The leaf agent: upstream inputs are single-rank `canopy.v1.ProfileBatch` encodings (for the `nodes` filter,
    /// the node's own sample, a `canopy.filters.v1.NodeSamples` of one).
    Leaf,
    Relay,
    /// The front-end: packets emitted up go through `finalize`.
    Root,
}

impl Level {
    pub fn from_abi(level: u32) -> Option<Level> {
        match level {
            abi::LEVEL_LEAF => Some(Level::Leaf),
            abi::LEVEL_RELAY => Some(Level::Relay),
            abi::LEVEL_ROOT => Some(Level::Root),
            _ => None,
        }
    }

    pub fn to_abi(self) -> u32 {
        match self {
            Level::Leaf => abi::LEVEL_LEAF,
            Level::Relay => abi::LEVEL_RELAY,
            Level::Root => abi::LEVEL_ROOT,
        }
    }
}

/// Where a call sends its packets.
pub trait Emit {
    /// A packet toward the root.
    fn up(&mut self, phase: u32, payload: &[u8]);
    /// A packet toward the leaves.
    fn down(&mut self, phase: u32, payload: &[u8]);
    /// The input at `index` could not be read; its ranks are counted as malformed.
    fn reject(&mut self, index: usize, reason: &str);
}

/// A filter, as its author writes it. One value per stream per node; calls come one at a time, from any of
/// the daemon's threads (hence `Send`).
pub trait Filter: Sized + Send + 'static {
    /// As in `libcanopy_filter_<NAME>.so`.
    const NAME: &'static str;
    /// The full protobuf name of the result message.
    const RESULT_TYPE: &'static str;
    /// Phases of a round (1: merge on the way up; 3: ToM's histogram scheme). A round is done at a node when
    /// it sends up a packet of phase `PHASES - 1`.
    const PHASES: u32 = 1;
    /// An encoded `google.protobuf.FileDescriptorSet` that defines `RESULT_TYPE`. By default Canopy's own
    /// ([`canopy_filter_proto::FILE_DESCRIPTOR_SET`]: `canopy.v1.ProfileBatch` and every `canopy.filters.v1`
    /// message); a filter whose result is a message of its own returns its own set.
    fn descriptors() -> &'static [u8] {
        canopy_filter_proto::FILE_DESCRIPTOR_SET
    }
    /// `params` is JSON text (empty for none); an error names the bad parameter.
    fn create(params: &str, level: Level) -> Result<Self, String>;
    fn upstream(
        &mut self,
        round: u64,
        phase: u32,
        inputs: &[&[u8]],
        out: &mut dyn Emit,
    ) -> Result<(), String>;
    /// A packet from the parent. By default it goes on to the children unchanged, as MRNet's null filter
    /// does (at a leaf, which has no children, it goes nowhere).
    fn downstream(
        &mut self,
        _round: u64,
        phase: u32,
        packet: &[u8],
        out: &mut dyn Emit,
    ) -> Result<(), String> {
        out.down(phase, packet);
        Ok(())
    }
    /// At the root: the stored result for a packet this filter emitted up. By default the packet itself, for
    /// a filter whose packets are already encodings of `RESULT_TYPE`.
    fn finalize(&mut self, _round: u64, _phase: u32, packet: &[u8]) -> Result<Vec<u8>, String> {
        Ok(packet.to_vec())
    }
    /// Event and counter names, as the node learns them.
    fn names(&mut self, _names: &[(u64, &str)]) {}
}

/// For a filter of one phase: an error naming the phase unless it is 0.
pub fn one_phase(filter: &str, phase: u32) -> Result<(), String> {
    if phase == 0 {
        Ok(())
    } else {
        Err(format!("{filter} has one phase (0), got phase {phase}"))
    }
}

/// For a filter that sends nothing down: the error for a packet that came from above.
pub fn nothing_down(filter: &str, phase: u32) -> Result<(), String> {
    Err(format!("{filter} sends nothing down, got a phase {phase} packet"))
}

/// Exports `canopy_filter_entry` for a [`Filter`] type. Use once per plugin crate. The symbol's one unsafe
/// attribute belongs to this macro, so the plugin crate itself can `#![forbid(unsafe_code)]`.
#[macro_export]
macro_rules! export_filter {
    ($ty:ty) => {
        /// The plugin's entry point: returns its vtable.
        #[unsafe(no_mangle)]
        pub extern "C" fn canopy_filter_entry() -> *const $crate::abi::FilterVtable {
            static VTABLE: ::std::sync::OnceLock<$crate::abi::FilterVtable> = ::std::sync::OnceLock::new();
            VTABLE.get_or_init($crate::vtable::<$ty>)
        }
    };
}

/// Builds the vtable of `F`; called once by the code `export_filter!` generates.
pub fn vtable<F: Filter>() -> abi::FilterVtable {
    // Leaked once per process: the vtable's strings must outlive every instance.
    let name = Box::leak(CString::new(F::NAME).unwrap_or_default().into_boxed_c_str());
    let result_type = Box::leak(
        CString::new(F::RESULT_TYPE)
            .unwrap_or_default()
            .into_boxed_c_str(),
    );
    abi::FilterVtable {
        abi_version: abi::ABI_VERSION,
        name: name.as_ptr(),
        descriptors: abi::Bytes::from_slice(F::descriptors()),
        result_type: result_type.as_ptr(),
        phases: F::PHASES,
        create: create::<F>,
        upstream: upstream::<F>,
        downstream: downstream::<F>,
        finalize: finalize::<F>,
        names: Some(names::<F>),
        destroy: destroy::<F>,
    }
}

struct Instance<F> {
    filter: F,
    /// Set after a panic: the filter's state may be broken, so later calls fail.
    poisoned: Option<String>,
}

/// The host's emitter, seen through [`Emit`].
struct HostEmit<'a> {
    raw: &'a abi::Emitter,
}

impl Emit for HostEmit<'_> {
    fn up(&mut self, phase: u32, payload: &[u8]) {
        // SAFETY: the host's emitter is valid for the call; it copies the bytes before returning.
        unsafe { (self.raw.emit)(self.raw.ctx, abi::UP, phase, payload.as_ptr(), payload.len()) }
    }

    fn down(&mut self, phase: u32, payload: &[u8]) {
        // SAFETY: as in `up`.
        unsafe { (self.raw.emit)(self.raw.ctx, abi::DOWN, phase, payload.as_ptr(), payload.len()) }
    }

    fn reject(&mut self, index: usize, reason: &str) {
        let reason = c_string(reason);
        // SAFETY: the emitter is valid for the call and `reason` outlives it.
        unsafe { (self.raw.reject)(self.raw.ctx, index, reason.as_ptr()) }
    }
}

fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

fn fail(out: *const abi::Emitter, reason: &str) {
    if out.is_null() {
        return;
    }
    let reason = c_string(reason);
    // SAFETY: a non-null emitter from the host is valid for the call.
    unsafe { ((*out).fail)((*out).ctx, reason.as_ptr()) }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_string());
    format!("filter panicked: {what}")
}

/// Runs one call on an instance: refuses a poisoned one, catches a panic and poisons it.
fn call<F: Filter>(
    instance: *mut c_void,
    out: *const abi::Emitter,
    body: impl FnOnce(&mut F, &mut HostEmit<'_>) -> Result<(), String>,
) -> c_int {
    if instance.is_null() || out.is_null() {
        return abi::ERROR;
    }
    // SAFETY: `instance` came from `create::<F>` and the host makes one call at a time on it.
    let inst = unsafe { &mut *(instance as *mut Instance<F>) };
    if let Some(why) = &inst.poisoned {
        fail(out, &format!("filter unusable after an earlier failure: {why}"));
        return abi::ERROR;
    }
    // SAFETY: checked non-null above; the host keeps it valid for the call.
    let mut emit = HostEmit {
        raw: unsafe { &*out },
    };
    match catch_unwind(AssertUnwindSafe(|| body(&mut inst.filter, &mut emit))) {
        Ok(Ok(())) => abi::OK,
        Ok(Err(e)) => {
            fail(out, &e);
            abi::ERROR
        }
        Err(payload) => {
            let msg = panic_message(payload);
            inst.poisoned = Some(msg.clone());
            fail(out, &msg);
            abi::ERROR
        }
    }
}

unsafe extern "C" fn create<F: Filter>(
    params: *const u8,
    params_len: usize,
    level: u32,
    errors: *const abi::Emitter,
) -> *mut c_void {
    // SAFETY: the host passes `params_len` readable bytes at `params` (or null and 0).
    let params = unsafe {
        abi::Bytes {
            ptr: params,
            len: params_len,
        }
        .as_slice()
    };
    let result = catch_unwind(|| {
        let params = std::str::from_utf8(params).map_err(|_| "parameters are not UTF-8".to_string())?;
        let level = Level::from_abi(level).ok_or_else(|| format!("unknown level {level}"))?;
        F::create(params, level)
    });
    match result {
        Ok(Ok(filter)) => Box::into_raw(Box::new(Instance {
            filter,
            poisoned: None,
        })) as *mut c_void,
        Ok(Err(e)) => {
            fail(errors, &e);
            std::ptr::null_mut()
        }
        Err(payload) => {
            fail(errors, &panic_message(payload));
            std::ptr::null_mut()
        }
    }
}

unsafe extern "C" fn upstream<F: Filter>(
    instance: *mut c_void,
    round: u64,
    phase: u32,
    inputs: *const abi::Bytes,
    n_inputs: usize,
    out: *const abi::Emitter,
) -> c_int {
    let raw: &[abi::Bytes] = if inputs.is_null() || n_inputs == 0 {
        &[]
    } else {
        // SAFETY: the host passes `n_inputs` descriptors at `inputs`, valid for the call.
        unsafe { std::slice::from_raw_parts(inputs, n_inputs) }
    };
    // SAFETY: each descriptor points to readable bytes for the call.
    let slices: Vec<&[u8]> = raw.iter().map(|b| unsafe { b.as_slice() }).collect();
    call::<F>(instance, out, |f, emit| f.upstream(round, phase, &slices, emit))
}

unsafe extern "C" fn downstream<F: Filter>(
    instance: *mut c_void,
    round: u64,
    phase: u32,
    packet: abi::Bytes,
    out: *const abi::Emitter,
) -> c_int {
    // SAFETY: the packet is readable for the call.
    let packet = unsafe { packet.as_slice() };
    call::<F>(instance, out, |f, emit| f.downstream(round, phase, packet, emit))
}

unsafe extern "C" fn finalize<F: Filter>(
    instance: *mut c_void,
    round: u64,
    phase: u32,
    packet: abi::Bytes,
    out: *const abi::Emitter,
) -> c_int {
    // SAFETY: the packet is readable for the call.
    let packet = unsafe { packet.as_slice() };
    call::<F>(instance, out, |f, emit| {
        let result = f.finalize(round, phase, packet)?;
        emit.up(phase, &result);
        Ok(())
    })
}

unsafe extern "C" fn names<F: Filter>(instance: *mut c_void, names: *const abi::Name, n: usize) {
    if instance.is_null() || names.is_null() {
        return;
    }
    // SAFETY: the host passes `n` names valid for the call.
    let raw = unsafe { std::slice::from_raw_parts(names, n) };
    let owned: Vec<(u64, String)> =
        // SAFETY: each name's bytes are readable for the call.
        raw.iter().map(|nm| (nm.id, String::from_utf8_lossy(unsafe { nm.name.as_slice() }).into_owned())).collect();
    let borrowed: Vec<(u64, &str)> = owned.iter().map(|(id, s)| (*id, s.as_str())).collect();
    // SAFETY: `instance` came from `create::<F>`; one call at a time.
    let inst = unsafe { &mut *(instance as *mut Instance<F>) };
    if inst.poisoned.is_none() {
        let res = catch_unwind(AssertUnwindSafe(|| inst.filter.names(&borrowed)));
        if let Err(payload) = res {
            inst.poisoned = Some(panic_message(payload));
        }
    }
}

unsafe extern "C" fn destroy<F: Filter>(instance: *mut c_void) {
    if instance.is_null() {
        return;
    }
    // SAFETY: `instance` came from `Box::into_raw` in `create::<F>` and is destroyed once.
    let inst = unsafe { Box::from_raw(instance as *mut Instance<F>) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(inst)));
}

/// Reads a C string the host or a plugin handed over (for tests and the host).
///
/// # Safety
/// `ptr` must be null or a NUL-terminated string valid for the call.
pub unsafe fn read_c_str(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A filter that writes only what has no default.
    struct Minimal;

    impl Filter for Minimal {
        const NAME: &'static str = "minimal";
        const RESULT_TYPE: &'static str = "canopy.v1.ProfileBatch";

        fn create(_params: &str, _level: Level) -> Result<Self, String> {
            Ok(Minimal)
        }

        fn upstream(
            &mut self,
            _round: u64,
            phase: u32,
            inputs: &[&[u8]],
            out: &mut dyn Emit,
        ) -> Result<(), String> {
            out.up(phase, &inputs.concat());
            Ok(())
        }
    }

    #[derive(Default)]
    struct Record {
        down: Vec<(u32, Vec<u8>)>,
        up: usize,
    }

    impl Emit for Record {
        fn up(&mut self, _phase: u32, _payload: &[u8]) {
            self.up += 1;
        }
        fn down(&mut self, phase: u32, payload: &[u8]) {
            self.down.push((phase, payload.to_vec()));
        }
        fn reject(&mut self, _index: usize, _reason: &str) {}
    }

    #[test]
    fn defaults_describe_canopys_messages_pass_packets_down_and_store_the_packet() {
        assert_eq!(Minimal::descriptors(), canopy_filter_proto::FILE_DESCRIPTOR_SET);
        let mut f = Minimal::create("", Level::Relay).unwrap();
        let mut out = Record::default();
        f.downstream(4, 1, b"ranges", &mut out).unwrap();
        assert_eq!((out.down, out.up), (vec![(1, b"ranges".to_vec())], 0));
        assert_eq!(f.finalize(4, 0, b"result").unwrap(), b"result");
    }
}
