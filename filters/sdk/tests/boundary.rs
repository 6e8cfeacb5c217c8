//! The FFI boundary the export macro builds, called the way the host calls it: errors and panics come back
//! as error codes with a reason, and a panicked instance refuses later calls.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_void};

use canopy_filter_sdk::{Emit, Filter, Level, abi};

struct Flaky;

impl Filter for Flaky {
    const NAME: &'static str = "flaky";
    const RESULT_TYPE: &'static str = "canopy.v1.ProfileBatch";

    fn descriptors() -> &'static [u8] {
        b"descriptor bytes"
    }

    fn create(params: &str, level: Level) -> Result<Self, String> {
        match params {
            "panic" => panic!("no such luck"),
            "bad" => Err("bins must be between 1 and 10000, got 0".into()),
            _ if level == Level::Relay => Ok(Flaky),
            _ => Err(format!("wrong level {level:?}")),
        }
    }

    fn upstream(
        &mut self,
        _round: u64,
        phase: u32,
        inputs: &[&[u8]],
        out: &mut dyn Emit,
    ) -> Result<(), String> {
        if inputs.first() == Some(&&b"boom"[..]) {
            panic!("boom in upstream");
        }
        out.reject(1, "second input unreadable");
        out.up(phase, &inputs.concat());
        out.down(phase + 1, b"range");
        Ok(())
    }

    fn downstream(
        &mut self,
        _round: u64,
        _phase: u32,
        _packet: &[u8],
        _out: &mut dyn Emit,
    ) -> Result<(), String> {
        Err("downstream not supported".into())
    }

    fn finalize(&mut self, _round: u64, _phase: u32, packet: &[u8]) -> Result<Vec<u8>, String> {
        Ok(packet.iter().rev().copied().collect())
    }
}

canopy_filter_sdk::export_filter!(Flaky);

#[derive(Default)]
struct Seen {
    emitted: Vec<(u32, u32, Vec<u8>)>,
    rejected: Vec<(usize, String)>,
    failed: Option<String>,
}

unsafe extern "C" fn emit(ctx: *mut c_void, dir: u32, phase: u32, ptr: *const u8, len: usize) {
    // SAFETY: ctx is the test's `Seen`; the bytes are valid for the call.
    let (seen, bytes) = unsafe { (&mut *(ctx as *mut Seen), std::slice::from_raw_parts(ptr, len)) };
    seen.emitted.push((dir, phase, bytes.to_vec()));
}

unsafe extern "C" fn reject(ctx: *mut c_void, input: usize, reason: *const c_char) {
    // SAFETY: as above; reason is a C string valid for the call.
    let (seen, reason) = unsafe { (&mut *(ctx as *mut Seen), canopy_filter_sdk::read_c_str(reason)) };
    seen.rejected.push((input, reason));
}

unsafe extern "C" fn fail(ctx: *mut c_void, reason: *const c_char) {
    // SAFETY: as above.
    let (seen, reason) = unsafe { (&mut *(ctx as *mut Seen), canopy_filter_sdk::read_c_str(reason)) };
    seen.failed = Some(reason);
}

fn emitter(seen: &mut Seen) -> abi::Emitter {
    abi::Emitter {
        ctx: seen as *mut Seen as *mut c_void,
        emit,
        reject,
        fail,
    }
}

fn vtable() -> &'static abi::FilterVtable {
    // SAFETY: the exported entry returns a pointer to a static vtable.
    unsafe { &*canopy_filter_entry() }
}

fn create(params: &str, level: u32, seen: &mut Seen) -> *mut c_void {
    let e = emitter(seen);
    // SAFETY: params and the emitter live across the call.
    unsafe { (vtable().create)(params.as_ptr(), params.len(), level, &e) }
}

#[test]
fn the_vtable_describes_the_filter() {
    let vt = vtable();
    assert_eq!(vt.abi_version, abi::ABI_VERSION);
    // SAFETY: the strings and bytes are static.
    unsafe {
        assert_eq!(canopy_filter_sdk::read_c_str(vt.name), "flaky");
        assert_eq!(
            canopy_filter_sdk::read_c_str(vt.result_type),
            "canopy.v1.ProfileBatch"
        );
        assert_eq!(vt.descriptors.as_slice(), b"descriptor bytes");
    }
}

#[test]
fn create_reports_bad_parameters_and_panics_as_reasons() {
    let mut seen = Seen::default();
    assert!(create("bad", abi::LEVEL_RELAY, &mut seen).is_null());
    assert_eq!(
        seen.failed.as_deref(),
        Some("bins must be between 1 and 10000, got 0")
    );
    let mut seen = Seen::default();
    assert!(create("panic", abi::LEVEL_RELAY, &mut seen).is_null());
    assert_eq!(seen.failed.as_deref(), Some("filter panicked: no such luck"));
    let mut seen = Seen::default();
    assert!(create("", 7, &mut seen).is_null());
    assert_eq!(seen.failed.as_deref(), Some("unknown level 7"));
}

#[test]
fn calls_emit_both_ways_and_a_panic_poisons_the_instance() {
    let vt = vtable();
    let mut seen = Seen::default();
    let inst = create("", abi::LEVEL_RELAY, &mut seen);
    assert!(!inst.is_null());
    let inputs = [abi::Bytes::from_slice(b"ab"), abi::Bytes::from_slice(b"cd")];
    let mut seen = Seen::default();
    let e = emitter(&mut seen);
    // SAFETY: instance from create; inputs and emitter live across the call.
    let code = unsafe { (vt.upstream)(inst, 4, 0, inputs.as_ptr(), 2, &e) };
    assert_eq!(code, abi::OK);
    assert_eq!(
        seen.emitted,
        vec![(abi::UP, 0, b"abcd".to_vec()), (abi::DOWN, 1, b"range".to_vec())]
    );
    assert_eq!(seen.rejected, vec![(1, "second input unreadable".to_string())]);

    let mut seen = Seen::default();
    let e = emitter(&mut seen);
    // SAFETY: as above.
    let code = unsafe { (vt.finalize)(inst, 4, 0, abi::Bytes::from_slice(b"xyz"), &e) };
    assert_eq!(code, abi::OK);
    assert_eq!(seen.emitted, vec![(abi::UP, 0, b"zyx".to_vec())]);

    let mut seen = Seen::default();
    let e = emitter(&mut seen);
    // SAFETY: as above.
    let code = unsafe { (vt.downstream)(inst, 4, 1, abi::Bytes::from_slice(b"r"), &e) };
    assert_eq!(
        (code, seen.failed.as_deref()),
        (abi::ERROR, Some("downstream not supported"))
    );

    let boom = [abi::Bytes::from_slice(b"boom")];
    let mut seen = Seen::default();
    let e = emitter(&mut seen);
    // SAFETY: as above.
    let code = unsafe { (vt.upstream)(inst, 5, 0, boom.as_ptr(), 1, &e) };
    assert_eq!(
        (code, seen.failed.as_deref()),
        (abi::ERROR, Some("filter panicked: boom in upstream"))
    );

    let mut seen = Seen::default();
    let e = emitter(&mut seen);
    // SAFETY: as above.
    let code = unsafe { (vt.upstream)(inst, 6, 0, inputs.as_ptr(), 2, &e) };
    assert_eq!(code, abi::ERROR);
    assert_eq!(
        seen.failed.as_deref(),
        Some("filter unusable after an earlier failure: filter panicked: boom in upstream")
    );
    // SAFETY: created above, destroyed once.
    unsafe { (vt.destroy)(inst) };
}
