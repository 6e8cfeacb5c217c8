//! canopy_filter.h and the Rust mirror describe the same memory: a C program built against the header
//! prints its sizes and offsets, and they must equal Rust's.

use std::mem::{offset_of, size_of};

use canopy_filter_abi as abi;

const PROBE: &str = r#"
#include <stddef.h>
#include <stdio.h>
#include "canopy_filter.h"
int main(void) {
    printf("%zu %zu %zu %zu\n", sizeof(canopy_bytes), sizeof(canopy_emitter), sizeof(canopy_name),
           sizeof(canopy_filter_vtable));
    printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\n",
           offsetof(canopy_filter_vtable, abi_version), offsetof(canopy_filter_vtable, name),
           offsetof(canopy_filter_vtable, descriptors), offsetof(canopy_filter_vtable, result_type),
           offsetof(canopy_filter_vtable, phases),
           offsetof(canopy_filter_vtable, create), offsetof(canopy_filter_vtable, upstream),
           offsetof(canopy_filter_vtable, downstream), offsetof(canopy_filter_vtable, finalize),
           offsetof(canopy_filter_vtable, names), offsetof(canopy_filter_vtable, destroy));
    printf("%u %u %u %u %u %u\n", CANOPY_FILTER_ABI_VERSION, CANOPY_LEVEL_LEAF, CANOPY_LEVEL_RELAY,
           CANOPY_LEVEL_ROOT, CANOPY_UP, CANOPY_DOWN);
    printf("%s\n", CANOPY_FILTER_ENTRY_SYMBOL);
    return 0;
}
"#;

#[test]
fn the_c_header_and_the_rust_types_agree() {
    let dir = std::env::temp_dir().join(format!("canopy-abi-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    let exe = dir.join("probe");
    std::fs::write(&src, PROBE).unwrap();
    let include = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let status = std::process::Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("cc runs");
    assert!(status.success(), "the header does not compile");
    let out = std::process::Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let sizes = format!(
        "{} {} {} {}",
        size_of::<abi::Bytes>(),
        size_of::<abi::Emitter>(),
        size_of::<abi::Name>(),
        size_of::<abi::FilterVtable>()
    );
    assert_eq!(lines[0], sizes);
    type V = abi::FilterVtable;
    let offsets = [
        offset_of!(V, abi_version),
        offset_of!(V, name),
        offset_of!(V, descriptors),
        offset_of!(V, result_type),
        offset_of!(V, phases),
        offset_of!(V, create),
        offset_of!(V, upstream),
        offset_of!(V, downstream),
        offset_of!(V, finalize),
        offset_of!(V, names),
        offset_of!(V, destroy),
    ]
    .map(|o| o.to_string())
    .join(" ");
    assert_eq!(lines[1], offsets);
    let constants = [
        abi::ABI_VERSION,
        abi::LEVEL_LEAF,
        abi::LEVEL_RELAY,
        abi::LEVEL_ROOT,
        abi::UP,
        abi::DOWN,
    ]
    .map(|c| c.to_string())
    .join(" ");
    assert_eq!(lines[2], constants);
    assert_eq!(lines[3].as_bytes(), abi::ENTRY_SYMBOL);
}
