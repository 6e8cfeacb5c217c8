//! Gives libcanopy.so its SONAME, `libcanopy.so.MAJOR` (the crate's major version), so that programs linked
//! against it record the versioned name and an installation can keep the releases of different ABIs side by
//! side (deploy/install.sh installs `libcanopy.so.VERSION` and the links `libcanopy.so.MAJOR` and
//! `libcanopy.so`).
//!
//! A program linked in the build tree (`-L target/release -Wl,-rpath,... -lcanopy`) looks for the SONAME at run
//! time, so the script also puts the link `libcanopy.so.MAJOR -> libcanopy.so` beside the library cargo builds.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets CARGO_PKG_VERSION_MAJOR");
    let soname = format!("libcanopy.so.{major}");
    // rustc-link-arg, not rustc-cdylib-link-arg: cargo passes a dependency's cdylib link arguments on to the
    // cdylibs that depend on it, and libcanopy_mpi (sdk/mpi) links this crate in, so it would get this SONAME
    // too. rustc-link-arg stays with this package, where only the cdylib is linked with it.
    println!("cargo:rustc-link-arg=-Wl,-soname,{soname}");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    if let Some(profile_dir) = profile_dir(&out) {
        link(&profile_dir, &soname, "libcanopy.so");
    }
}

/// The directory cargo puts the profile's libraries in: OUT_DIR is `<it>/build/<crate>-<hash>/out`.
fn profile_dir(out: &Path) -> Option<PathBuf> {
    let dir = out.ancestors().nth(3)?;
    (out.parent()?.parent()?.file_name()? == "build").then(|| dir.to_path_buf())
}

/// Makes `dir/name` a symbolic link to `target` (relative), replacing what was there.
fn link(dir: &Path, name: &str, target: &str) {
    let path = dir.join(name);
    if std::fs::read_link(&path).is_ok_and(|t| t == Path::new(target)) {
        return;
    }
    let _ = std::fs::remove_file(&path);
    if let Err(e) = std::os::unix::fs::symlink(target, &path) {
        println!("cargo:warning=could not link {} -> {target}: {e}", path.display());
    }
}
