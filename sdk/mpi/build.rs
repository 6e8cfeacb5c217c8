//! Generates libcanopy_mpi's wrappers from functions.list and mpi.h, and compiles them with the MPI compiler
//! wrapper. Every procedure mpi.h declares that the list does not annotate is wrapped as declared, timed as an
//! activity (build/header.rs).
//!
//! For every line of the list it writes a C wrapper (`canopy_mpi_c_MPI_<Name>`, calling the next `MPI_<Name>` in
//! link order, another PMPI tool's or the MPI library's, found with `dlsym(RTLD_NEXT)`, else `PMPI_<Name>`) and a
//! Fortran one (`canopy_mpi_c_mpi_<name>_`, calling the next `mpi_<name>_` the same way, else `pmpi_<name>_`) into
//! `$OUT_DIR/wrappers.c`, and the Rust
//! that exports them under their MPI names (`$OUT_DIR/exports.rs`: a jump per symbol, as a Rust cdylib exports
//! only what Rust defines) with the table of names (`$OUT_DIR/functions.rs`). The C is compiled with `mpicc`
//! (`MPICC` overrides it) and libmpi is linked with the flags it reports (`--showme:link` for Open MPI, `-show`
//! for MPICH). Without an MPI compiler the library is built without wrappers, says so at build time (a cargo
//! warning) and when it is loaded (a line on stderr).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "build/header.rs"]
mod header;
#[path = "build/list.rs"]
mod list;
#[path = "build/wrappers.rs"]
mod wrappers;

use list::*;
use wrappers::*;

/// The MPI compiler wrapper's link flags, as cargo directives: Open MPI's `--showme:link`, else MPICH's `-show`.
fn link_flags(mpicc: &str) -> Result<Vec<String>, String> {
    let run = |arg: &str| {
        Command::new(mpicc)
            .arg(arg)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let (text, skip_first) = match run("--showme:link") {
        Some(t) => (t, false),
        None => (
            run("-show").ok_or_else(|| format!("`{mpicc} --showme:link` and `{mpicc} -show` both failed"))?,
            true,
        ),
    };
    let mut out = Vec::new();
    for (i, word) in text.split_whitespace().enumerate() {
        if skip_first && i == 0 {
            continue;
        }
        if let Some(dir) = word.strip_prefix("-L") {
            out.push(format!("cargo:rustc-link-search=native={dir}"));
            out.push(format!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,{dir}"));
        } else if let Some(lib) = word.strip_prefix("-l") {
            out.push(format!("cargo:rustc-link-lib=dylib={lib}"));
        } else if word.starts_with("-Wl,") || word == "-pthread" {
            out.push(format!("cargo:rustc-cdylib-link-arg={word}"));
        }
    }
    if !out.iter().any(|l| l.contains("rustc-link-lib=dylib=mpi")) {
        return Err(format!(
            "`{mpicc}` reports no -lmpi in its link flags: {}",
            text.trim()
        ));
    }
    Ok(out)
}

/// What a package of the wrappers builds: `canopy-mpi` for the MPI that `mpicc` is (Open MPI on Debian; `MPICC`
/// names another), `canopy-mpi-mpich` for MPICH (`mpicc.mpich`, Debian's name; `MPICC_MPICH` names another),
/// both from sdk/mpi's sources, each library named for its family.
struct Target {
    /// The library's name without `lib` and `.so`.
    lib: &'static str,
    /// The environment variable naming the MPI compiler wrapper, and the one used without it.
    cc_var: &'static str,
    default_cc: &'static str,
    /// sdk/mpi, from the package's directory.
    sources: &'static str,
}

fn target() -> Target {
    match std::env::var("CARGO_PKG_NAME").as_deref() {
        Ok("canopy-mpi-mpich") => Target {
            lib: "canopy_mpi_mpich",
            cc_var: "MPICC_MPICH",
            default_cc: "mpicc.mpich",
            sources: "../mpi",
        },
        _ => Target {
            lib: "canopy_mpi",
            cc_var: "MPICC",
            default_cc: "mpicc",
            sources: ".",
        },
    }
}

fn mpicc(t: &Target) -> Option<String> {
    let cc = std::env::var(t.cc_var).unwrap_or_else(|_| t.default_cc.into());
    let found = Command::new(&cc)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    found.then_some(cc)
}

fn main() {
    let t = target();
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let dir = manifest.join(t.sources);
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for f in [
        "functions.list",
        "src/wrap.h",
        "src/wrap.c",
        "src/wrap_fortran.h",
        "src/lib.rs",
        "src/policy.rs",
        "build/header.rs",
        "../c/include/canopy.h",
    ] {
        println!("cargo:rerun-if-changed={}", dir.join(f).display());
    }
    println!("cargo:rerun-if-env-changed={}", t.cc_var);
    soname(&t);
    println!("cargo::rustc-check-cfg=cfg(canopy_mpi_none)");
    let list =
        std::fs::read_to_string(dir.join("functions.list")).expect("sdk/mpi/functions.list is readable");
    let functions = parse_list(&list).unwrap_or_else(|e| panic!("{e}"));
    write(&out.join("functions.rs"), &functions_rs(&functions));

    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let jump = match arch.as_str() {
        "x86_64" => Some("jmp"),
        "aarch64" => Some("b"),
        _ => None,
    };
    let without = |why: String| {
        println!("cargo:warning=libcanopy_mpi is built without MPI wrappers: {why}");
        println!("cargo:rustc-cfg=canopy_mpi_none");
        write(&out.join("why_none.txt"), &why);
        write(&out.join("exports.rs"), "");
    };
    let Some(jump) = jump else {
        return without(format!(
            "the wrappers' entry points are written for x86_64 and aarch64, not {arch}"
        ));
    };
    let Some(mpicc) = mpicc(&t) else {
        return without(format!(
            "no MPI compiler wrapper was found ({}, or the one {} names); install {} and rebuild",
            t.default_cc,
            t.cc_var,
            if t.lib == "canopy_mpi" {
                "Open MPI or MPICH"
            } else {
                "MPICH (libmpich-dev)"
            }
        ));
    };
    let flags = match link_flags(&mpicc) {
        Ok(f) => f,
        Err(e) => return without(e),
    };
    let functions = match with_declared(functions, &mpicc, &out) {
        Ok(all) => all,
        Err(e) => return without(e),
    };
    write(&out.join("functions.rs"), &functions_rs(&functions));
    write(&out.join("wrappers.c"), &c_source(&functions));
    write(&out.join("exports.rs"), &exports_rs(&functions, jump));
    cc::Build::new()
        .compiler(&mpicc)
        .file(out.join("wrappers.c"))
        .file(dir.join("src/wrap.c"))
        .include(dir.join("src"))
        .include(dir.join("../c/include"))
        // The wrappers sit on every MPI call: optimized even in a debug build.
        .opt_level(2)
        .flag("-fvisibility=hidden")
        .flag_if_supported("-Wno-unused-parameter")
        // mpi.h marks the MPI-1 procedures it still declares deprecated; they are wrapped as declared.
        .flag_if_supported("-Wno-deprecated-declarations")
        .compile(&format!("{}_wrappers", t.lib));
    for f in flags {
        println!("{f}");
    }
    // dlsym, for the next definition of each call (in libc itself from glibc 2.34, in libdl before).
    println!("cargo:rustc-link-lib=dylib=dl");
}

/// The list's functions, then every other procedure mpi.h declares (header.rs), each wrapped as an activity.
/// The procedures no wrapper covers are named in `$OUT_DIR/coverage.txt` with why; one whose declaration cannot
/// be read fails the build, by name.
fn with_declared(list: Vec<Function>, mpicc: &str, out: &Path) -> Result<Vec<Function>, String> {
    let text = header::preprocessed(mpicc, out)?;
    let (declared, unreadable) = header::declarations(&text);
    let listed = |name: &str| list.iter().any(|f| f.c_name() == name);
    let skipped = |name: &str| header::SKIPPED.iter().any(|(s, _)| *s == name);
    let uncovered: Vec<String> = unreadable
        .iter()
        .filter(|n| !listed(n) && !skipped(n))
        .cloned()
        .collect();
    if !uncovered.is_empty() {
        panic!(
            "mpi.h declares procedures no wrapper covers (their declarations could not be read): {}; annotate \
             them in sdk/mpi/functions.list, or add them to SKIPPED in sdk/mpi/build/header.rs with why",
            uncovered.join(", ")
        );
    }
    let mut report = String::from("# The procedures of mpi.h and how libcanopy_mpi covers them.\n");
    // A procedure of the list that this MPI does not declare (one of a later standard) is left out.
    let in_header: std::collections::HashSet<&str> = declared
        .iter()
        .map(|d| d.name.as_str())
        .chain(unreadable.iter().map(String::as_str))
        .collect();
    let (mut all, absent): (Vec<Function>, Vec<Function>) = list
        .into_iter()
        .partition(|f| in_header.contains(f.c_name().as_str()));
    for f in &all {
        let how = if f.effects.is_empty() {
            "activity"
        } else {
            "counted"
        };
        let _ = writeln!(report, "{how}\t{}", f.c_name());
    }
    for f in absent {
        let _ = writeln!(
            report,
            "absent\t{}\tlisted, not declared by this mpi.h",
            f.c_name()
        );
    }
    let mut seen: std::collections::HashSet<String> = all.iter().map(Function::c_name).collect();
    let mut derived = Vec::new();
    for d in declared {
        if skipped(&d.name) || !seen.insert(d.name.clone()) {
            continue;
        }
        match large_count_form(&all, &d) {
            Some(Ok(f)) => {
                let _ = writeln!(
                    report,
                    "counted\t{}\tas {}",
                    d.name,
                    d.name.trim_end_matches("_c")
                );
                derived.push(f);
            }
            Some(Err(why)) => {
                let _ = writeln!(report, "activity\t{}\t{why}", d.name);
                derived.push(Function::declared(d));
            }
            None => {
                let _ = writeln!(report, "activity\t{}", d.name);
                derived.push(Function::declared(d));
            }
        }
    }
    all.extend(derived);
    for (name, why) in header::SKIPPED {
        let _ = writeln!(report, "skipped\t{name}\t{why}");
    }
    write(&out.join("coverage.txt"), &report);
    Ok(all)
}

/// The large-count form of a listed procedure (`MPI_Send_c`: MPI_Count counts, MPI_Aint displacements) moves
/// what its base form moves: its wrapper is the base's annotation on the declared parameters. `None` if `d` is no
/// such form; an error if the annotation does not fit its parameters (then it is timed as an activity only).
fn large_count_form(list: &[Function], d: &header::Declared) -> Option<Result<Function, String>> {
    let base = d.name.strip_suffix("_c")?;
    let base = list
        .iter()
        .find(|f| f.c_name() == base && f.special == Special::None && f.note != "none")?;
    if d.ret != "int" {
        return Some(Err(format!("returns {}, not int", d.ret)));
    }
    Some(
        parse_line(&format!("int {}({}) | {} nofortran", d.name, d.params, base.note))
            .map_err(|e| format!("{}'s annotation does not fit: {e}", base.c_name())),
    )
}

/// Gives the library its SONAME, `libcanopy_mpi.so.MAJOR`, as sdk/c's build script does for libcanopy: programs
/// linked with `-lcanopy_mpi` record the versioned name, and the link of that name beside the library cargo
/// builds lets them run from the build tree.
fn soname(t: &Target) {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets CARGO_PKG_VERSION_MAJOR");
    let file = format!("lib{}.so", t.lib);
    let soname = format!("{file}.{major}");
    println!("cargo:rustc-link-arg-cdylib=-Wl,-soname,{soname}");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is `<profile dir>/build/<crate>-<hash>/out`.
    let Some(dir) = out
        .ancestors()
        .nth(3)
        .filter(|_| out.ancestors().nth(2).is_some_and(|b| b.ends_with("build")))
    else {
        return;
    };
    let path = dir.join(&soname);
    if std::fs::read_link(&path).is_ok_and(|l| l == Path::new(&file)) {
        return;
    }
    let _ = std::fs::remove_file(&path);
    if let Err(e) = std::os::unix::fs::symlink(&file, &path) {
        println!("cargo:warning=could not link {} -> {file}: {e}", path.display());
    }
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}
