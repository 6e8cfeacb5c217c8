//! The wrappers written from the list and mpi.h: each procedure's C and Fortran wrappers into one C source, and
//! the Rust that exports them under their MPI names with the table of names.

use std::fmt::Write as _;

use crate::header;
use crate::list::*;

/// How a generated wrapper reads an argument: C passes values, Fortran passes everything by reference with
/// integer handles.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lang {
    C,
    Fortran,
}

pub(crate) fn arg(f: &Function, name: &str, lang: Lang) -> String {
    if is_literal(name) {
        return name.to_string();
    }
    let p = f.param(name).expect("checked when the list was read");
    if lang == Lang::C {
        return name.to_string();
    }
    match p.ty.as_str() {
        "int" => format!("(*(const MPI_Fint *){name})"),
        "MPI_Datatype" => format!("PMPI_Type_f2c(*(const MPI_Fint *){name})"),
        "MPI_Comm" => format!("PMPI_Comm_f2c(*(const MPI_Fint *){name})"),
        "const int *" => format!("((const int *){name})"),
        _ => name.to_string(),
    }
}

pub(crate) fn in_place_test(buf: &str, lang: Lang) -> String {
    match lang {
        Lang::C => format!("{buf} == MPI_IN_PLACE"),
        Lang::Fortran => format!("cm_f_in_place({buf})"),
    }
}

pub(crate) fn bytes_expr(
    f: &Function,
    count: &str,
    ty: &str,
    sum: Option<(&str, Blocks)>,
    lang: Lang,
) -> String {
    match sum {
        Some((comm, blocks)) => format!(
            "cm_sum_bytes({}, {}, {})",
            arg(f, count, lang),
            arg(f, ty, lang),
            blocks.count(&arg(f, comm, lang))
        ),
        None => format!("cm_bytes({}, {})", arg(f, count, lang), arg(f, ty, lang)),
    }
}

/// The statement that adds `expr` bytes to the call's counter: now, or at each start of its persistent request.
pub(crate) fn add_bytes(f: &Function, k: usize, expr: &str, lang: Lang) -> String {
    match &f.at_start {
        Some(request) => format!(
            "        cm_persist_bytes({}, {k}, {expr});\n",
            request_handle(request, lang)
        ),
        None => format!("        cm_add_bytes({k}, {expr});\n"),
    }
}

/// The statements that record what a successful call moved.
pub(crate) fn effects(f: &Function, k: usize, lang: Lang) -> String {
    let mut s = String::new();
    for e in &f.effects {
        match e {
            Effect::Send {
                dest,
                count,
                ty,
                comm,
            } => {
                let _ = writeln!(
                    s,
                    "        cm_send({}, {}, {}, {});",
                    arg(f, dest, lang),
                    arg(f, count, lang),
                    arg(f, ty, lang),
                    arg(f, comm, lang)
                );
            }
            Effect::Recv { status } => match lang {
                Lang::C => {
                    let _ = writeln!(s, "        cm_received({k}, {status});");
                }
                Lang::Fortran => {
                    let _ = writeln!(
                        s,
                        "        MPI_Status cm_c_status;\n        if (PMPI_Status_f2c((const MPI_Fint *){status}, &cm_c_status) == MPI_SUCCESS) cm_received({k}, &cm_c_status);"
                    );
                }
            },
            Effect::Bytes { count, ty, in_place }
            | Effect::Sum {
                counts: count,
                ty,
                in_place,
                ..
            } => {
                let sum = match e {
                    Effect::Sum { comm, blocks, .. } => Some((comm.as_str(), *blocks)),
                    _ => None,
                };
                let normal = bytes_expr(f, count, ty, sum, lang);
                let expr = match in_place {
                    None => normal,
                    Some(ip) => {
                        let instead = match &ip.instead {
                            Some((c, t)) => bytes_expr(f, c, t, None, lang),
                            None => "0".to_string(),
                        };
                        format!("({}) ? {instead} : {normal}", in_place_test(&ip.buf, lang))
                    }
                };
                s.push_str(&add_bytes(f, k, &expr, lang));
            }
            Effect::Persist {
                dest,
                count,
                ty,
                comm,
                request,
            } => {
                let _ = writeln!(
                    s,
                    "        cm_persist({}, {}, {}, {}, {});",
                    request_handle(request, lang),
                    arg(f, dest, lang),
                    arg(f, count, lang),
                    arg(f, ty, lang),
                    arg(f, comm, lang)
                );
            }
            Effect::Start { request } => {
                let _ = writeln!(s, "        cm_start({});", request_handle(request, lang));
            }
            Effect::StartAll { count, requests } => {
                let each = match lang {
                    Lang::C => format!("{requests}[cm_i]"),
                    Lang::Fortran => format!("PMPI_Request_f2c(((const MPI_Fint *){requests})[cm_i])"),
                };
                let _ = writeln!(
                    s,
                    "        for (int cm_i = 0; cm_i < {}; cm_i++) cm_start({each});",
                    arg(f, count, lang)
                );
            }
            Effect::Forget { .. } => {
                let _ = writeln!(s, "        cm_forget(cm_freed);");
            }
            // Fortran's waits and tests reach MPI through its own binding, not the C wrappers: its receives are
            // not followed, or they would stay in the table.
            Effect::Track { .. } | Effect::Done(_) if lang == Lang::Fortran => {}
            Effect::Track { request, persistent } => {
                let _ = writeln!(
                    s,
                    "        cm_track_receive(*{request}, {k}, {});",
                    u8::from(*persistent)
                );
            }
            Effect::Done(done) => s.push_str(&done.after()),
            Effect::SumW {
                counts,
                types,
                comm,
                blocks,
                in_place,
            } => {
                let n = blocks.count(&arg(f, comm, lang));
                let sum = match lang {
                    Lang::C => format!("cm_sumw_bytes({counts}, {types}, {n})"),
                    Lang::Fortran => {
                        format!("cm_f_sumw_bytes((const MPI_Fint *){counts}, (const MPI_Fint *){types}, {n})")
                    }
                };
                let expr = match in_place {
                    Some(buf) => format!("({}) ? 0 : {sum}", in_place_test(buf, lang)),
                    None => sum,
                };
                s.push_str(&add_bytes(f, k, &expr, lang));
            }
        }
    }
    s
}

/// The MPI_Request a request argument holds (a pointer to it in C, to its Fortran handle in Fortran).
pub(crate) fn request_handle(request: &str, lang: Lang) -> String {
    match lang {
        Lang::C => format!("*{request}"),
        Lang::Fortran => format!("PMPI_Request_f2c(*(const MPI_Fint *){request})"),
    }
}

/// What must be read before the call: a request it frees, the requests a wait or a test may complete (C).
pub(crate) fn before(f: &Function, lang: Lang) -> String {
    f.effects
        .iter()
        .filter_map(|e| match e {
            Effect::Forget { request } => Some(format!(
                "    MPI_Request cm_freed = {};\n",
                request_handle(request, lang)
            )),
            Effect::Done(done) if lang == Lang::C => Some(done.before()),
            _ => None,
        })
        .collect()
}

/// Whether the C wrapper watches the requests of a wait or a test (and lets go of them after).
pub(crate) fn watches(f: &Function) -> bool {
    f.effects.iter().any(|e| matches!(e, Effect::Done(_)))
}

pub(crate) fn status_param(f: &Function) -> Option<&str> {
    f.effects.iter().find_map(|e| match e {
        Effect::Recv { status } => Some(status.as_str()),
        _ => None,
    })
}

/// The wrapper of a procedure of mpi.h the list does not annotate: its activity around the next definition.
pub(crate) fn declared_wrapper(d: &header::Declared, k: usize) -> String {
    let (name, ret) = (&d.name, &d.ret);
    let params = if d.params.is_empty() { "void" } else { &d.params };
    let args = d.args.join(", ");
    // A procedure mpi.h declares that the library lacks: its PMPI_ name is weak, so the library still loads.
    let missing = match ret.as_str() {
        "int" => "return MPI_ERR_OTHER;".to_string(),
        _ => format!("{{ static {ret} cm_none; return cm_none; }}"),
    };
    format!(
        "#pragma weak P{name}\ntypedef {ret} (*cm_fn_{name})({params});\nstatic cm_fn_{name} cm_next_{name}(void) {{\n    static cm_fn_{name} next;\n    cm_fn_{name} f = __atomic_load_n(&next, __ATOMIC_ACQUIRE);\n    if (f == NULL) {{\n        f = (cm_fn_{name})cm_next(\"{name}\", (void *)&P{name});\n        __atomic_store_n(&next, f, __ATOMIC_RELEASE);\n    }}\n    return f;\n}}\n{ret} canopy_mpi_c_{name}({params}) {{\n    cm_fn_{name} cm_f = cm_next_{name}();\n    {ret} cm_rc;\n    if (cm_f == NULL) {missing}\n    cm_begin({k});\n    cm_rc = cm_f({args});\n    cm_end({k});\n    return cm_rc;\n}}\n\n"
    )
}

pub(crate) fn c_wrapper(f: &Function, k: usize) -> String {
    if let Some(d) = &f.declared {
        return declared_wrapper(d, k);
    }
    let params = if f.params.is_empty() {
        "void".to_string()
    } else {
        f.params
            .iter()
            .map(|p| format!("{} {}", p.ty, p.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let args = f
        .params
        .iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let name = f.c_name();
    // The next definition of the call in link order (another PMPI tool loaded after this one, else the MPI
    // library's), looked up once; PMPI_<Name> where there is none.
    let types = f
        .params
        .iter()
        .map(|p| p.ty.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let types = if types.is_empty() {
        "void".to_string()
    } else {
        types
    };
    let mut s = format!(
        "typedef int (*cm_fn_{name})({types});\nstatic cm_fn_{name} cm_next_{name}(void) {{\n    static cm_fn_{name} next;\n    cm_fn_{name} f = __atomic_load_n(&next, __ATOMIC_ACQUIRE);\n    if (f == NULL) {{\n        f = (cm_fn_{name})cm_next(\"{name}\", (void *)&P{name});\n        __atomic_store_n(&next, f, __ATOMIC_RELEASE);\n    }}\n    return f;\n}}\n"
    );
    let _ = writeln!(s, "int canopy_mpi_c_{name}({params}) {{");
    match f.special {
        Special::Finalize => {
            let _ = write!(
                s,
                "    canopy_mpi_finish();\n    return cm_next_{name}()({args});\n}}\n\n"
            );
            return s;
        }
        Special::Init | Special::InitThread => {
            let _ = write!(
                s,
                "    int rc;\n    cm_begin({k});\n    rc = cm_next_{name}()({args});\n    cm_end({k});\n    if (rc == MPI_SUCCESS) cm_started();\n    return rc;\n}}\n\n"
            );
            return s;
        }
        Special::None => {}
    }
    s.push_str("    int rc;\n");
    if let Some(status) = status_param(f) {
        let _ = writeln!(
            s,
            "    MPI_Status cm_status;\n    if ({status} == MPI_STATUS_IGNORE) {status} = &cm_status;"
        );
    }
    s.push_str(&before(f, Lang::C));
    let _ = writeln!(s, "    cm_begin({k});\n    rc = cm_next_{name}()({args});");
    let fx = effects(f, k, Lang::C);
    if !fx.is_empty() {
        let _ = write!(s, "    if (rc == MPI_SUCCESS) {{\n{fx}    }}\n");
    }
    if watches(f) {
        s.push_str("    cm_unwatch(&cm_w);\n");
    }
    let _ = write!(s, "    cm_end({k});\n    return rc;\n}}\n\n");
    s
}

pub(crate) fn fortran_wrapper(f: &Function, k: usize) -> String {
    // Fortran's MPI_INIT and MPI_INIT_THREAD take no argc and argv.
    let params: Vec<&Param> = f
        .params
        .iter()
        .filter(|p| {
            !(matches!(f.special, Special::Init | Special::InitThread)
                && (p.name == "argc" || p.name == "argv"))
        })
        .collect();
    let mut decl: Vec<String> = params.iter().map(|p| format!("void *{}", p.name)).collect();
    decl.push("MPI_Fint *ierr".into());
    let decl = decl.join(", ");
    let mut args: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
    args.push("ierr");
    let args = args.join(", ");
    let name = f.fortran_name();
    // As the C wrappers: the next definition in link order (another tool's, else the MPI library's Fortran
    // binding), looked up once; the profiling `p{name}` where there is none.
    let mut s = format!("extern void p{name}({decl}) __attribute__((weak));\n");
    let _ = write!(
        s,
        "typedef void (*cm_fn_{name})({decl});\nstatic cm_fn_{name} cm_next_{name}(void) {{\n    static cm_fn_{name} next;\n    cm_fn_{name} f = __atomic_load_n(&next, __ATOMIC_ACQUIRE);\n    if (f == NULL) {{\n        f = (cm_fn_{name})cm_next(\"{name}\", (void *)p{name});\n        __atomic_store_n(&next, f, __ATOMIC_RELEASE);\n    }}\n    return f;\n}}\n"
    );
    let _ = writeln!(s, "void canopy_mpi_c_{name}({decl}) {{");
    let _ = writeln!(
        s,
        "    if (cm_next_{name}() == NULL) {{ cm_no_fortran(\"{name}\"); *ierr = MPI_ERR_OTHER; return; }}"
    );
    match f.special {
        Special::Finalize => {
            let _ = write!(
                s,
                "    canopy_mpi_finish();\n    cm_next_{name}()({args});\n}}\n\n"
            );
            return s;
        }
        Special::Init | Special::InitThread => {
            let _ = write!(
                s,
                "    cm_begin({k});\n    cm_next_{name}()({args});\n    cm_end({k});\n    if (*ierr == MPI_SUCCESS) cm_started();\n}}\n\n"
            );
            return s;
        }
        Special::None => {}
    }
    if let Some(status) = status_param(f) {
        let _ = writeln!(
            s,
            "    MPI_Fint cm_f_status[sizeof(MPI_Status) / sizeof(MPI_Fint) + 2];\n    if (cm_f_status_ignore({status})) {status} = cm_f_status;"
        );
    }
    s.push_str(&before(f, Lang::Fortran));
    let _ = writeln!(s, "    cm_begin({k});\n    cm_next_{name}()({args});");
    let fx = effects(f, k, Lang::Fortran);
    if !fx.is_empty() {
        let _ = write!(s, "    if (*ierr == MPI_SUCCESS) {{\n{fx}    }}\n");
    }
    let _ = write!(s, "    cm_end({k});\n}}\n\n");
    s
}

pub(crate) fn c_source(functions: &[Function]) -> String {
    let mut s = String::from(
        "/* Generated by sdk/mpi/build.rs from functions.list. */\n#include \"wrap.h\"\n#include \"wrap_fortran.h\"\n\n",
    );
    let n = functions.len();
    let _ = writeln!(s, "const int cm_count = {n};");
    let _ = writeln!(s, "int cm_activity_ids[{n}];\nint cm_bytes_ids[{n}];");
    let _ = writeln!(s, "const char *const cm_names[{n}] = {{");
    for f in functions {
        let _ = writeln!(s, "    \"{}\",", f.c_name());
    }
    let _ = writeln!(s, "}};\nconst char *const cm_bytes_names[{n}] = {{");
    for f in functions {
        match f.counts_bytes() {
            true => {
                let _ = writeln!(s, "    \"{} bytes\",", f.c_name());
            }
            false => s.push_str("    NULL,\n"),
        }
    }
    s.push_str("};\n\n");
    for (k, f) in functions.iter().enumerate() {
        s.push_str(&c_wrapper(f, k));
        if f.fortran {
            s.push_str(&fortran_wrapper(f, k));
        }
    }
    s
}

/// The symbols the library exports: every wrapper under its MPI name.
pub(crate) fn exported(functions: &[Function]) -> Vec<String> {
    let mut out = Vec::new();
    for f in functions {
        out.push(f.c_name());
        if f.fortran {
            out.push(f.fortran_name());
        }
    }
    out
}

pub(crate) fn exports_rs(functions: &[Function], jump: &str) -> String {
    let mut s =
        String::from("// Generated by sdk/mpi/build.rs from functions.list.\n\nunsafe extern \"C\" {\n");
    let symbols = exported(functions);
    for sym in &symbols {
        let _ = writeln!(s, "    fn canopy_mpi_c_{sym}();");
    }
    s.push_str("}\n\n");
    for sym in &symbols {
        let _ = writeln!(
            s,
            "/// The wrapper of `{sym}` (see functions.list).\n#[unsafe(naked)]\n#[unsafe(no_mangle)]\npub unsafe extern \"C\" fn {sym}() {{\n    core::arch::naked_asm!(\"{jump} {{0}}\", sym canopy_mpi_c_{sym})\n}}\n"
        );
    }
    s
}

pub(crate) fn functions_rs(functions: &[Function]) -> String {
    let mut s = String::from(
        "// Generated by sdk/mpi/build.rs from functions.list.\n\n/// The wrapped calls, by the index the C wrappers know them by.\npub(crate) const FUNCTIONS: &[&str] = &[\n",
    );
    for f in functions {
        let _ = writeln!(s, "    \"{}\",", f.c_name());
    }
    s.push_str("];\n");
    s
}
