//! Compiles the crash guard (src/guard.c: sigsetjmp and a signal handler, which Rust cannot express) into a
//! static library with the system's C compiler and `ar`, so the crate needs no build dependency.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/guard.c");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let ar = std::env::var("AR").unwrap_or_else(|_| "ar".into());
    let obj = out.join("guard.o");
    let status = Command::new(&cc)
        .args(["-c", "-fPIC", "-O2", "-Wall", "-Werror", "src/guard.c", "-o"])
        .arg(&obj)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(status.success(), "{cc} failed on src/guard.c");
    let lib = out.join("libcanopy_guard.a");
    let _ = std::fs::remove_file(&lib);
    let status = Command::new(&ar)
        .arg("crs")
        .arg(&lib)
        .arg(&obj)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {ar}: {e}"));
    assert!(status.success(), "{ar} failed");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=canopy_guard");
}
