//! What deploy/install.sh gives an HPC site to build against: the SDK's libraries under a versioned SONAME with
//! their links, pkg-config files for shared and static linking, a CMake package that works from a staged or
//! moved tree, the interfaces (.proto files, canopy_filter.h), shell completions and man pages, and a library
//! directory of the site's choosing (--libdir lib64). Each test installs the build beside it into a temporary
//! directory and compiles small C programs against it with the system's C compiler.
//!
//! pkg-config, cmake and readelf are needed; `.ci/run` installs them and says so with CANOPY_PACKAGING_TEST=1, and
//! then a missing tool fails the test. Elsewhere the test prints what is missing and passes.

#![allow(
    clippy::disallowed_types,
    reason = "synchronous tests that wait on real processes by the wall clock; no tokio clock to pause"
)]

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use canopy_integration_tests::{bin_dir, ids_named, start_frontend, start_socket_agent, wait_socket};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const MAJOR: &str = env!("CARGO_PKG_VERSION_MAJOR");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Whether every tool in `tools` is installed; if not, prints why `test` is skipped, or fails it under
/// CANOPY_PACKAGING_TEST.
fn have(test: &str, tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "{} not installed (.ci/run installs pkg-config, cmake and binutils)",
        missing.join(", ")
    );
    assert!(
        std::env::var_os("CANOPY_PACKAGING_TEST").is_none(),
        "CANOPY_PACKAGING_TEST is set but {test} cannot run: {why}"
    );
    println!("{test}: skipped: {why}");
    false
}

/// deploy/install.sh with `args`, installing the build beside the test; its output, whatever the status.
fn install_sh(args: &[OsString]) -> Output {
    let profile = bin_dir().file_name().unwrap().to_string_lossy().into_owned();
    Command::new(repo().join("deploy/install.sh"))
        .args(["--profile", &profile])
        .args(args)
        .env("CARGO_TARGET_DIR", bin_dir().parent().unwrap())
        .stdin(Stdio::null())
        .output()
        .expect("deploy/install.sh runs")
}

/// Installs under `root/usr` (units and configuration under `root` too), with `extra` arguments; returns the
/// prefix.
fn install(root: &Path, extra: &[&str]) -> PathBuf {
    let prefix = root.join("usr");
    let mut args: Vec<OsString> = vec![
        "--prefix".into(),
        prefix.clone().into(),
        "--unitdir".into(),
        root.join("units").into(),
        "--confdir".into(),
        root.join("etc").into(),
    ];
    args.extend(extra.iter().map(OsString::from));
    let out = install_sh(&args);
    assert!(out.status.success(), "install.sh failed:\n{}", text(&out.stderr));
    prefix
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `cmd`, asserting it succeeds; its stdout. Without the LD_LIBRARY_PATH cargo gives the tests (the build
/// tree, which holds a libcanopy.so.MAJOR too): programs find their libraries by their own run paths.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .env_remove("LD_LIBRARY_PATH")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// `pkg-config ARGS` against the .pc files in `pcdir`.
fn pkg_config(pcdir: &Path, args: &[&str]) -> Vec<String> {
    run(Command::new("pkg-config")
        .args(args)
        .env("PKG_CONFIG_PATH", pcdir)
        .env_remove("PKG_CONFIG_SYSROOT_DIR"))
    .split_whitespace()
    .map(str::to_string)
    .collect()
}

/// The SONAME and the NEEDED entries of an ELF file's dynamic section (`readelf -d`).
fn dynamic(elf: &Path) -> (Option<String>, Vec<String>) {
    let out = run(Command::new("readelf").arg("-d").arg(elf));
    let value = |line: &str| {
        line.split_once('[')
            .and_then(|(_, v)| v.split_once(']'))
            .map(|(v, _)| v.to_string())
    };
    let soname = out.lines().find(|l| l.contains("(SONAME)")).and_then(value);
    let needed = out
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(value)
        .collect();
    (soname, needed)
}

/// A C program using the SDK: init, a timer started and stopped around a region, a dump per iteration, and
/// finalize; prints each call's result and the SDK's counts.
const APP_C: &str = r#"#include <canopy.h>
#include <stdio.h>

int main(void) {
    int rc = canopy_init("packaged", 0, 1);
    printf("init: %d\n", rc);
    canopy_timer *region = canopy_timer_get("packaged_region");
    volatile double x = 0;
    for (int i = 0; i < 3; i++) {
        canopy_start(region);
        for (int j = 0; j < 1000; j++) x += j;
        canopy_stop(region);
        canopy_dump();
    }
    rc = canopy_finalize();
    uint64_t dumps = 0, delivered = 0;
    canopy_stats(&dumps, NULL, &delivered);
    printf("finalize: %d dumps: %llu delivered: %llu\n", rc, (unsigned long long)dumps,
           (unsigned long long)delivered);
    return 0;
}
"#;

/// What APP_C prints when no agent serves its socket: its dumps are counted and reported undelivered.
const WITHOUT_AGENT: &str = "init: 0\nfinalize: -4 dumps: 3 delivered: 0\n";

/// Runs a built APP_C with no agent at its socket.
fn run_without_agent(exe: &Path, dir: &Path) -> String {
    run(Command::new(exe).env("CANOPY_AGENT_SOCKET", dir.join("none.sock")))
}

/// Compiles APP_C in `dir` into `dir/name` with `flags` after the source.
fn cc(dir: &Path, name: &str, flags: &[String]) -> PathBuf {
    let src = dir.join("app.c");
    std::fs::write(&src, APP_C).unwrap();
    let exe = dir.join(name);
    run(Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(flags));
    exe
}

/// `lib.so.VERSION` is the library, `lib.so.MAJOR` links to it and `lib.so` to that, and its SONAME is
/// `lib.so.MAJOR`.
fn assert_versioned(libdir: &Path, lib: &str) {
    let full = libdir.join(format!("{lib}.so.{VERSION}"));
    let meta = std::fs::symlink_metadata(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()));
    assert!(meta.is_file(), "{} is not a file", full.display());
    assert_ne!(
        meta.permissions().mode() & 0o111,
        0,
        "{} is not executable",
        full.display()
    );
    let link =
        |name: String| std::fs::read_link(libdir.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        link(format!("{lib}.so.{MAJOR}")),
        Path::new(&format!("{lib}.so.{VERSION}"))
    );
    assert_eq!(link(format!("{lib}.so")), Path::new(&format!("{lib}.so.{MAJOR}")));
    assert_eq!(
        dynamic(&full).0.as_deref(),
        Some(format!("{lib}.so.{MAJOR}").as_str())
    );
}

#[test]
fn install_sh_names_a_bad_argument_and_a_missing_build() {
    let root = tempfile::tempdir().unwrap();
    let prefix = root.path().join("usr");
    let cases: [(&[&str], &str); 5] = [
        (&["--frobnicate"], "unknown argument --frobnicate"),
        (&["--libdir"], "--libdir needs a value"),
        (&["--prefix", "relative/usr"], "--prefix must be an absolute path"),
        (
            &["--prefix", "/opt/canopy", "--libdir", "/usr/lib64"],
            "--libdir /usr/lib64 is not under --prefix /opt/canopy",
        ),
        (
            &["--prefix", "/opt/canopy", "--libdir", "../lib"],
            "--libdir must name a directory under the prefix",
        ),
    ];
    for (args, says) in cases {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let out = install_sh(&args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(says),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    // A target directory with nothing built: the first missing file is named, with the command that builds it.
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(repo().join("deploy/install.sh"))
        .arg("--prefix")
        .arg(&prefix)
        .args(["--profile", "release"])
        .env("CARGO_TARGET_DIR", empty.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{}/release/canopy is not built", empty.path().display()))
            && err.contains("cargo build --workspace --release"),
        "{err}"
    );
    assert!(!prefix.exists(), "nothing is installed from a missing build");

    // A build whose libcanopy.so has another SONAME than this version's (built before a version change) is
    // refused rather than installed under names that do not match it.
    if !have("install_sh_names_a_stale_build", &["objdump"]) {
        return;
    }
    let stale = empty.path().join("debug");
    std::fs::create_dir(&stale).unwrap();
    for file in [
        "canopy",
        "canopy-frontend",
        "canopy-relay",
        "canopy-agent",
        "libcanopy.a",
        "libcanopy_omp.so",
    ] {
        std::fs::write(stale.join(file), "").unwrap();
    }
    let src = empty.path().join("lib.c");
    std::fs::write(&src, "int canopy_version(void) { return 9; }\n").unwrap();
    for (lib, soname) in [
        ("libcanopy.so", "libcanopy.so.99"),
        ("libcanopy_mpi.so", &format!("libcanopy_mpi.so.{MAJOR}")),
    ] {
        run(Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(stale.join(lib))
            .arg(format!("-Wl,-soname,{soname}"))
            .arg(&src));
    }
    let out = Command::new(repo().join("deploy/install.sh"))
        .arg("--prefix")
        .arg(&prefix)
        .args(["--profile", "debug"])
        .env("CARGO_TARGET_DIR", empty.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "has SONAME 'libcanopy.so.99', not libcanopy.so.{MAJOR}: rebuild it"
        )),
        "{err}"
    );
    assert!(!prefix.exists(), "nothing is installed from a stale build");
}

#[test]
fn installed_libraries_carry_a_versioned_soname_that_linked_programs_record() {
    if !have(
        "installed_libraries_carry_a_versioned_soname",
        &["pkg-config", "readelf"],
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let prefix = install(&dir.path().join("root"), &[]);
    let libdir = prefix.join("lib");
    assert_versioned(&libdir, "libcanopy");
    // libcanopy_mpi is linked by applications too (-lcanopy_mpi), and so is its MPICH build where it was built.
    assert_versioned(&libdir, "libcanopy_mpi");
    if bin_dir().join("libcanopy_mpi_mpich.so").is_file() {
        assert_versioned(&libdir, "libcanopy_mpi_mpich");
    }
    // The OMPT tool is loaded by path (OMP_TOOL_LIBRARIES), under its plain name.
    assert!(
        libdir.join("libcanopy_omp.so").is_file(),
        "libcanopy_omp.so is not installed"
    );
    // The build tree gives the SONAME's link beside the library as well, so programs linked there run.
    assert_eq!(
        std::fs::read_link(bin_dir().join(format!("libcanopy.so.{MAJOR}"))).unwrap(),
        Path::new("libcanopy.so")
    );

    // sdk/README.md's command, with a run path to this prefix.
    let mut flags = pkg_config(&libdir.join("pkgconfig"), &["--cflags", "--libs", "canopy"]);
    assert!(flags.contains(&"-lcanopy".to_string()), "{flags:?}");
    flags.push(format!("-Wl,-rpath,{}", libdir.display()));
    let exe = cc(dir.path(), "app", &flags);
    let (_, needed) = dynamic(&exe);
    assert!(needed.contains(&format!("libcanopy.so.{MAJOR}")), "{needed:?}");
    assert!(!needed.iter().any(|n| n == "libcanopy.so"), "{needed:?}");
    assert_eq!(run_without_agent(&exe, dir.path()), WITHOUT_AGENT);
    // The loader resolves the versioned name to the installed file.
    let ldd = run(Command::new("ldd").arg(&exe));
    let line = ldd.lines().find(|l| l.contains("libcanopy")).unwrap_or_default();
    assert!(
        line.contains(&format!(
            "libcanopy.so.{MAJOR} => {}",
            libdir.join(format!("libcanopy.so.{MAJOR}")).display()
        )),
        "{ldd}"
    );
}

#[test]
fn canopy_static_pc_links_the_archive_so_no_libcanopy_is_needed_at_run_time() {
    if !have("canopy_static_pc_links_the_archive", &["pkg-config", "readelf"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let prefix = install(&dir.path().join("root"), &[]);
    let pcdir = prefix.join("lib/pkgconfig");
    // canopy.pc's --static output still says -lcanopy, which the linker resolves to the shared library; the
    // archive is linked by canopy-static.pc.
    let flags = pkg_config(&pcdir, &["--static", "--cflags", "--libs", "canopy-static"]);
    let archive = prefix.join("lib/libcanopy.a").display().to_string();
    assert!(flags.contains(&archive), "{flags:?}");
    assert!(!flags.iter().any(|f| f == "-lcanopy"), "{flags:?}");
    let exe = cc(dir.path(), "app-static", &flags);
    let (_, needed) = dynamic(&exe);
    assert!(!needed.iter().any(|n| n.starts_with("libcanopy")), "{needed:?}");
    // It runs with the installed libraries gone: nothing of Canopy is loaded at run time.
    for entry in std::fs::read_dir(prefix.join("lib")).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("libcanopy.so")
        {
            std::fs::remove_file(path).unwrap();
        }
    }
    assert_eq!(run_without_agent(&exe, dir.path()), WITHOUT_AGENT);
    // Without --static too: the system libraries the archive needs are in Libs.
    let flags = pkg_config(&pcdir, &["--cflags", "--libs", "canopy-static"]);
    let exe = cc(dir.path(), "app-static-2", &flags);
    assert_eq!(run_without_agent(&exe, dir.path()), WITHOUT_AGENT);
}

const CMAKE_LISTS: &str = r#"cmake_minimum_required(VERSION 3.16)
project(packaged C)
# CMake searches PREFIX/lib64 where the system uses it (Fedora, RHEL, SUSE); on a Debian-style system, as here,
# it must be told, as it must be given a lib64 installation at all.
set_property(GLOBAL PROPERTY FIND_LIBRARY_USE_LIB64_PATHS TRUE)
find_package(Canopy ${CANOPY_WANT} REQUIRED)
if(NOT TARGET Canopy::canopy_mpi)
    message(FATAL_ERROR "Canopy::canopy_mpi is not defined")
endif()
message(STATUS "found Canopy ${Canopy_VERSION} in ${Canopy_DIR}")
add_executable(app app.c)
target_link_libraries(app PRIVATE Canopy::canopy)
add_executable(app_static app.c)
target_link_libraries(app_static PRIVATE Canopy::canopy_static)
"#;

/// `cmake` configuring the project in `src` into `build` against the installation at `prefix`, asking for
/// version `want` ("" for any).
fn cmake_configure(src: &Path, build: &Path, prefix: &Path, want: &str) -> Output {
    Command::new("cmake")
        .arg("-S")
        .arg(src)
        .arg("-B")
        .arg(build)
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
        .arg(format!("-DCANOPY_WANT={want}"))
        .stdin(Stdio::null())
        .output()
        .expect("cmake runs")
}

#[test]
fn find_package_and_pkg_config_work_from_a_staged_lib64_tree() {
    if !have(
        "find_package_and_pkg_config_work_from_a_staged_lib64_tree",
        &["cmake", "pkg-config", "readelf"],
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Staged as a package would be: for /opt/canopy, under DESTDIR, with libraries in lib64.
    let destdir = dir.path().join("stage");
    let out = install_sh(&[
        "--destdir".into(),
        destdir.clone().into(),
        "--prefix".into(),
        "/opt/canopy".into(),
        "--libdir".into(),
        "lib64".into(),
    ]);
    assert!(out.status.success(), "install.sh failed:\n{}", text(&out.stderr));
    let prefix = destdir.join("opt/canopy");
    let libdir = prefix.join("lib64");
    assert!(
        !prefix.join("lib/libcanopy.a").exists(),
        "libraries went to lib, not lib64"
    );
    assert_versioned(&libdir, "libcanopy");
    for file in [
        "cmake/Canopy/CanopyConfig.cmake",
        "cmake/Canopy/CanopyConfigVersion.cmake",
        "pkgconfig/canopy.pc",
        "pkgconfig/canopy-static.pc",
        "canopy/filters/libcanopy_filter_stats.so",
    ] {
        assert!(libdir.join(file).is_file(), "no {file} in lib64");
    }
    // The .pc files name the final prefix and lib64.
    let pc = std::fs::read_to_string(libdir.join("pkgconfig/canopy.pc")).unwrap();
    assert!(
        pc.contains("prefix=/opt/canopy\n") && pc.contains("libdir=${prefix}/lib64\n"),
        "{pc}"
    );

    // CMake finds the staged tree by where its files are, not by the prefix they were installed for.
    let src = dir.path().join("project");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("CMakeLists.txt"), CMAKE_LISTS).unwrap();
    std::fs::write(src.join("app.c"), APP_C).unwrap();
    let build = dir.path().join("build");
    let out = cmake_configure(
        &src,
        &build,
        &prefix,
        &format!("{MAJOR}.{}", env!("CARGO_PKG_VERSION_MINOR")),
    );
    assert!(
        out.status.success(),
        "cmake failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains(&format!(
            "found Canopy {VERSION} in {}",
            libdir.join("cmake/Canopy").display()
        )),
        "{}",
        text(&out.stdout)
    );
    run(Command::new("cmake").arg("--build").arg(&build));
    let app = build.join("app");
    let (_, needed) = dynamic(&app);
    assert!(needed.contains(&format!("libcanopy.so.{MAJOR}")), "{needed:?}");
    let (_, needed) = dynamic(&build.join("app_static"));
    assert!(!needed.iter().any(|n| n.starts_with("libcanopy")), "{needed:?}");
    assert_eq!(
        run_without_agent(&build.join("app_static"), dir.path()),
        WITHOUT_AGENT
    );

    // The CMake-built program against a real agent: its region reaches the front-end's store.
    let (mut fe, addr, store) = start_frontend(dir.path(), &["--streams", "stats", "--exit-on-fin", "true"]);
    let socket = dir.path().join("agent.sock");
    let mut agent = start_socket_agent(dir.path(), "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    let printed = run(Command::new(&app).env("CANOPY_AGENT_SOCKET", &socket));
    assert_eq!(printed, "init: 0\nfinalize: 0 dumps: 3 delivered: 3\n");
    let status = fe.wait_timeout(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "front-end did not finish:\n{}",
        fe.log_text()
    );
    assert_eq!(ids_named(&store, "packaged_region").len(), 1);

    // A version this installation does not provide is refused.
    let too_new = format!("{}.0", MAJOR.parse::<u32>().unwrap() + 1);
    let out = cmake_configure(&src, &dir.path().join("build-too-new"), &prefix, &too_new);
    assert!(!out.status.success());
    // CMake wraps its message: compare the words.
    let said = text(&out.stderr).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        said.contains(&format!("compatible with requested version \"{too_new}\""))
            && said.contains(&format!("version: {VERSION}")),
        "{said}"
    );

    // pkg-config against the staged tree, its prefix moved to where the files are.
    let define = format!("--define-variable=prefix={}", prefix.display());
    let mut flags = pkg_config(
        &libdir.join("pkgconfig"),
        &[&define, "--cflags", "--libs", "canopy"],
    );
    assert!(flags.contains(&format!("-L{}", libdir.display())), "{flags:?}");
    flags.push(format!("-Wl,-rpath,{}", libdir.display()));
    let exe = cc(dir.path(), "app-pc", &flags);
    assert!(dynamic(&exe).1.contains(&format!("libcanopy.so.{MAJOR}")));
    assert_eq!(run_without_agent(&exe, dir.path()), WITHOUT_AGENT);
    let flags = pkg_config(
        &libdir.join("pkgconfig"),
        &[&define, "--static", "--cflags", "--libs", "canopy-static"],
    );
    let exe = cc(dir.path(), "app-pc-static", &flags);
    assert!(!dynamic(&exe).1.iter().any(|n| n.starts_with("libcanopy")));
    assert_eq!(run_without_agent(&exe, dir.path()), WITHOUT_AGENT);
}

/// The files under `dir`, relative to it, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                out.push(path.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn the_interfaces_completions_and_man_pages_are_installed() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = install(&dir.path().join("root"), &[]);

    // The .proto files in their package layout, every import found in the tree (or one of protobuf's own).
    let protodir = prefix.join("share/canopy/proto");
    let installed = files_under(&protodir);
    let mut source: Vec<String> = files_under(&repo().join("proto"))
        .into_iter()
        .filter(|f| f.starts_with("canopy/") && f.ends_with(".proto"))
        .collect();
    source.sort();
    assert_eq!(installed, source);
    assert!(
        installed.contains(&"canopy/v1/frontend.proto".to_string()),
        "{installed:?}"
    );
    for proto in &installed {
        let body = std::fs::read_to_string(protodir.join(proto)).unwrap();
        assert_eq!(
            body,
            std::fs::read_to_string(repo().join("proto").join(proto)).unwrap()
        );
        for import in body
            .lines()
            .filter_map(|l| l.strip_prefix("import \""))
            .filter_map(|l| l.split_once('"'))
        {
            let import = import.0;
            assert!(
                import.starts_with("google/protobuf/") || protodir.join(import).is_file(),
                "{proto} imports {import}, which is not installed"
            );
        }
    }
    // canopy-run, which canopy run hands an srun job over several nodes, beside canopy; and the test plugin not
    // among the filters.
    let run_script = prefix.join("bin/canopy-run");
    assert_eq!(
        std::fs::read(&run_script).unwrap(),
        std::fs::read(repo().join("deploy/slurm/canopy-run")).unwrap()
    );
    assert!(
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&run_script).unwrap().permissions())
            & 0o111
            != 0
    );
    assert!(
        !files_under(&prefix).iter().any(|f| f.contains("faulty")),
        "{:?}",
        files_under(&prefix)
    );
    // The filter ABI's header, usable from the installed include directory.
    let include = prefix.join("include");
    assert_eq!(
        std::fs::read(include.join("canopy_filter.h")).unwrap(),
        std::fs::read(repo().join("filters/abi/include/canopy_filter.h")).unwrap()
    );
    let probe = dir.path().join("probe.c");
    std::fs::write(
        &probe,
        "#include <canopy_filter.h>\n#include <canopy.h>\nint main(void) { return 0; }\n",
    )
    .unwrap();
    run(Command::new("cc")
        .arg("-fsyntax-only")
        .arg("-I")
        .arg(&include)
        .arg(&probe));

    // Bash completion: valid, and sourced it completes the subcommands and up's options.
    let bash = prefix.join("share/bash-completion/completions/canopy");
    run(Command::new("bash").arg("-n").arg(&bash));
    let complete = |words: &str, cword: u32| -> Vec<String> {
        let script = format!(
            "source \"$0\"; COMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE=\"${{COMP_WORDS[*]}}\"; \
             COMP_POINT=${{#COMP_LINE}}; _canopy canopy \"${{COMP_WORDS[$COMP_CWORD]}}\" \
             \"${{COMP_WORDS[$COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        );
        run(Command::new("bash").arg("-c").arg(script).arg(&bash))
            .lines()
            .map(str::to_string)
            .collect()
    };
    let subcommands = complete("canopy ''", 1);
    for sub in [
        "up",
        "topology",
        "streams",
        "ctl",
        "certs",
        "watch",
        "top",
        "completions",
        "man",
    ] {
        assert!(
            subcommands.iter().any(|w| w == sub),
            "{sub} not completed: {subcommands:?}"
        );
    }
    let options = complete("canopy up --r", 2);
    assert!(
        options.iter().any(|w| w == "--ranks") && options.iter().any(|w| w == "--rounds"),
        "{options:?}"
    );
    let zsh = std::fs::read_to_string(prefix.join("share/zsh/site-functions/_canopy")).unwrap();
    assert!(zsh.starts_with("#compdef canopy"), "{zsh}");
    let fish = std::fs::read_to_string(prefix.join("share/fish/vendor_completions.d/canopy.fish")).unwrap();
    assert!(
        fish.contains("complete -c canopy") && fish.contains("-a \"up\""),
        "{fish}"
    );

    // A man page per command, as `canopy man --out` writes them.
    let mandir = prefix.join("share/man/man1");
    let written = dir.path().join("man");
    run(Command::new(bin_dir().join("canopy"))
        .arg("man")
        .arg("--out")
        .arg(&written));
    let pages = files_under(&mandir);
    assert_eq!(pages, files_under(&written));
    for page in [
        "canopy.1",
        "canopy-up.1",
        "canopy-streams-list.1",
        "canopy-certs-issue.1",
    ] {
        assert!(pages.contains(&page.to_string()), "no {page}: {pages:?}");
    }
    let up = std::fs::read_to_string(mandir.join("canopy-up.1")).unwrap();
    assert!(
        up.contains(".TH canopy-up 1") && up.contains("\\-\\-ranks"),
        "{up}"
    );
    // Without --out, canopy's own page goes to stdout.
    let page = run(Command::new(bin_dir().join("canopy")).arg("man"));
    assert_eq!(page, std::fs::read_to_string(mandir.join("canopy.1")).unwrap());
    // man(1) itself is optional: where it is installed, it renders the page.
    let man = Command::new("sh")
        .args(["-c", "command -v man"])
        .output()
        .is_ok_and(|o| o.status.success());
    if man {
        let shown = run(Command::new("man")
            .arg("-l")
            .arg(mandir.join("canopy-up.1"))
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "100"));
        assert!(shown.contains("--period-ms"), "{shown}");
    }
}
