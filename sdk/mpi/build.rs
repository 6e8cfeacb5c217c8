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

/// A parameter of a prototype: its C type (with `[]` as a pointer) and its name.
#[derive(Debug, Clone)]
struct Param {
    ty: String,
    name: String,
}

/// What a call moves, from the annotation after `|`.
#[derive(Debug, Clone)]
enum Effect {
    Send {
        dest: String,
        count: String,
        ty: String,
        comm: String,
    },
    Recv {
        status: String,
    },
    Bytes {
        count: String,
        ty: String,
        in_place: Option<InPlace>,
    },
    Sum {
        counts: String,
        ty: String,
        comm: String,
        blocks: Blocks,
        in_place: Option<InPlace>,
    },
    /// A persistent send's request, remembered with its message (MPI_Send_init).
    Persist {
        dest: String,
        count: String,
        ty: String,
        comm: String,
        request: String,
    },
    /// A persistent request started: a message-send event if it is a remembered send.
    Start {
        request: String,
    },
    /// Every request of an array started (MPI_Startall).
    StartAll {
        count: String,
        requests: String,
    },
    /// A request freed: forgotten (read before the call, which sets it to MPI_REQUEST_NULL).
    Forget {
        request: String,
    },
    /// A receive's request (MPI_Irecv, or a persistent one of MPI_Recv_init), followed to its completion in a
    /// wait or a test, where its status gives the bytes: counted then, in this call's counter. C only.
    Track {
        request: String,
        persistent: bool,
    },
    /// A wait or a test: the followed receives among its requests that it completed count their bytes. C only.
    Done(Done),
    /// Per-block counts, each in its own type (MPI_Alltoallw).
    SumW {
        counts: String,
        types: String,
        comm: String,
        blocks: Blocks,
        in_place: Option<String>,
    },
}

/// How a wait or a test names the requests it completes.
#[derive(Debug, Clone)]
enum Done {
    /// `MPI_Wait`, `MPI_Test`: one request.
    One {
        request: String,
        status: String,
        flag: Option<String>,
    },
    /// `MPI_Waitall`, `MPI_Testall`: every request of the array.
    All {
        count: String,
        requests: String,
        statuses: String,
        flag: Option<String>,
    },
    /// `MPI_Waitany`, `MPI_Testany`: the one at the index.
    Any {
        count: String,
        requests: String,
        index: String,
        status: String,
        flag: Option<String>,
    },
    /// `MPI_Waitsome`, `MPI_Testsome`: those at the indices.
    Some {
        count: String,
        requests: String,
        outcount: String,
        indices: String,
        statuses: String,
    },
}

impl Done {
    fn names(&self) -> Vec<&str> {
        match self {
            Done::One {
                request,
                status,
                flag,
            } => [request.as_str(), status]
                .into_iter()
                .chain(flag.as_deref())
                .collect(),
            Done::All {
                count,
                requests,
                statuses,
                flag,
            } => [count.as_str(), requests, statuses]
                .into_iter()
                .chain(flag.as_deref())
                .collect(),
            Done::Any {
                count,
                requests,
                index,
                status,
                flag,
            } => [count.as_str(), requests, index, status]
                .into_iter()
                .chain(flag.as_deref())
                .collect(),
            Done::Some {
                count,
                requests,
                outcount,
                indices,
                statuses,
            } => vec![count.as_str(), requests, outcount, indices, statuses],
        }
    }

    /// The C statements before the call: the requests' handles kept, statuses of the watch's own where the
    /// program ignores them.
    fn before(&self) -> String {
        match self {
            Done::One { request, status, .. } => format!(
                "    cm_watch_t cm_w;\n    MPI_Status cm_one;\n    cm_watch(&cm_w, {request}, 1, NULL, 0);\n    if (cm_w.on && {status} == MPI_STATUS_IGNORE) {status} = &cm_one;\n"
            ),
            Done::Any {
                count,
                requests,
                status,
                ..
            } => format!(
                "    cm_watch_t cm_w;\n    MPI_Status cm_one;\n    cm_watch(&cm_w, {requests}, {count}, NULL, 0);\n    if (cm_w.on && {status} == MPI_STATUS_IGNORE) {status} = &cm_one;\n"
            ),
            Done::All {
                count,
                requests,
                statuses,
                ..
            }
            | Done::Some {
                count,
                requests,
                statuses,
                ..
            } => format!(
                "    cm_watch_t cm_w;\n    {statuses} = cm_watch(&cm_w, {requests}, {count}, {statuses}, {statuses} == MPI_STATUSES_IGNORE);\n"
            ),
        }
    }

    /// The C statement after a successful call: what it completed counted.
    fn after(&self) -> String {
        let when = |flag: &Option<String>| flag.as_ref().map_or("1".to_string(), |f| format!("*{f}"));
        match self {
            Done::One { status, flag, .. } => {
                format!(
                    "        if ({}) cm_watched(&cm_w, NULL, 1, {status});\n",
                    when(flag)
                )
            }
            Done::All {
                count,
                statuses,
                flag,
                ..
            } => format!(
                "        if ({}) cm_watched(&cm_w, NULL, {count}, {statuses});\n",
                when(flag)
            ),
            Done::Any {
                index, status, flag, ..
            } => format!(
                "        if ({}) cm_watched_one(&cm_w, *{index}, {status});\n",
                when(flag)
            ),
            Done::Some {
                outcount,
                indices,
                statuses,
                ..
            } => format!("        cm_watched(&cm_w, {indices}, *{outcount}, {statuses});\n"),
        }
    }
}

/// The blocks a vector procedure's counts cover.
#[derive(Debug, Clone, Copy)]
enum Blocks {
    /// One per rank of the communicator (of its remote group for an intercommunicator).
    Peers,
    /// One per out-neighbour of the communicator's topology (neighbourhood collectives).
    OutNeighbours,
}

impl Blocks {
    /// The C expression for the number of blocks.
    fn count(self, comm: &str) -> String {
        match self {
            Blocks::Peers => format!("cm_peers({comm})"),
            Blocks::OutNeighbours => format!("cm_out_neighbours({comm})"),
        }
    }
}

/// When `buf` is MPI_IN_PLACE: another count and type, or no bytes.
#[derive(Debug, Clone)]
struct InPlace {
    buf: String,
    instead: Option<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Special {
    None,
    Init,
    InitThread,
    Finalize,
}

#[derive(Debug, Clone)]
struct Function {
    /// `Send` for MPI_Send.
    name: String,
    params: Vec<Param>,
    effects: Vec<Effect>,
    special: Special,
    fortran: bool,
    /// A procedure of mpi.h the list does not annotate: wrapped as declared, timed as an activity.
    declared: Option<header::Declared>,
    /// A persistent collective's request (`atstart REQUEST`): its bytes are added at each MPI_Start of it, not
    /// at this call.
    at_start: Option<String>,
    /// What the call moves as the list says it (after `|`, without `nofortran`): the large-count (`_c`) form of
    /// the procedure moves the same.
    note: String,
}

impl Function {
    /// The wrapper of a procedure as mpi.h declares it: its activity, no other effect, C only.
    fn declared(d: header::Declared) -> Function {
        Function {
            name: d.name.trim_start_matches("MPI_").to_string(),
            params: Vec::new(),
            effects: Vec::new(),
            special: Special::None,
            fortran: false,
            declared: Some(d),
            at_start: None,
            note: String::new(),
        }
    }
    fn c_name(&self) -> String {
        format!("MPI_{}", self.name)
    }
    fn fortran_name(&self) -> String {
        format!("mpi_{}_", self.name.to_lowercase())
    }
    fn param(&self, name: &str) -> Result<&Param, String> {
        self.params
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| format!("MPI_{} has no parameter {name}", self.name))
    }
    fn counts_bytes(&self) -> bool {
        self.effects.iter().any(|e| {
            matches!(
                e,
                Effect::Recv { .. }
                    | Effect::Bytes { .. }
                    | Effect::Sum { .. }
                    | Effect::SumW { .. }
                    | Effect::Track { .. }
            )
        })
    }
}

fn parse_param(text: &str) -> Result<Param, String> {
    let text = text.trim();
    let (text, array) = match text.strip_suffix("[]") {
        Some(t) => (t.trim(), true),
        None => (text, false),
    };
    let split = text
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .ok_or_else(|| format!("no type in parameter {text:?}"))?;
    let (ty, name) = text.split_at(split + 1);
    let mut ty = ty.trim().to_string();
    if array {
        ty.push_str(" *");
    }
    if name.is_empty() || ty.is_empty() {
        return Err(format!("cannot read parameter {text:?}"));
    }
    Ok(Param {
        ty,
        name: name.to_string(),
    })
}

fn parse_in_place(words: &[&str]) -> Result<Option<InPlace>, String> {
    match words {
        [] => Ok(None),
        ["inplace", buf, "skip"] => Ok(Some(InPlace {
            buf: buf.to_string(),
            instead: None,
        })),
        ["inplace", buf, count, ty] => Ok(Some(InPlace {
            buf: buf.to_string(),
            instead: Some((count.to_string(), ty.to_string())),
        })),
        _ => Err(format!(
            "cannot read {:?} (inplace BUF skip | inplace BUF COUNT TYPE)",
            words.join(" ")
        )),
    }
}

fn parse_line(line: &str) -> Result<Function, String> {
    let (proto, note) = line
        .split_once('|')
        .ok_or("no `|` between the prototype and what the call moves")?;
    let proto = proto.trim();
    let rest = proto
        .strip_prefix("int MPI_")
        .ok_or("the prototype does not start with `int MPI_`")?;
    let (name, params) = rest.split_once('(').ok_or("no `(` in the prototype")?;
    let params = params
        .trim()
        .strip_suffix(')')
        .ok_or("the prototype does not end with `)`")?;
    let params = if params.trim() == "void" {
        Vec::new()
    } else {
        params
            .split(',')
            .map(parse_param)
            .collect::<Result<Vec<_>, _>>()?
    };
    let mut f = Function {
        name: name.trim().to_string(),
        params,
        effects: Vec::new(),
        special: Special::None,
        fortran: true,
        declared: None,
        at_start: None,
        note: String::new(),
    };
    let mut note = note.trim();
    if let Some(n) = note.strip_suffix("nofortran") {
        f.fortran = false;
        note = n.trim();
    }
    f.note = note.to_string();
    for part in note.split(';') {
        let words: Vec<&str> = part.split_whitespace().collect();
        let effect = match words.as_slice() {
            ["none"] => None,
            ["init"] => {
                f.special = Special::Init;
                None
            }
            ["init_thread"] => {
                f.special = Special::InitThread;
                None
            }
            ["finalize"] => {
                f.special = Special::Finalize;
                None
            }
            ["send", dest, count, ty, comm] => Some(Effect::Send {
                dest: dest.to_string(),
                count: count.to_string(),
                ty: ty.to_string(),
                comm: comm.to_string(),
            }),
            ["recv", status] => Some(Effect::Recv {
                status: status.to_string(),
            }),
            ["bytes", count, ty, rest @ ..] => Some(Effect::Bytes {
                count: count.to_string(),
                ty: ty.to_string(),
                in_place: parse_in_place(rest)?,
            }),
            [kind @ ("sum" | "nsum"), counts, ty, comm, rest @ ..] => Some(Effect::Sum {
                counts: counts.to_string(),
                ty: ty.to_string(),
                comm: comm.to_string(),
                blocks: blocks(kind),
                in_place: parse_in_place(rest)?,
            }),
            ["persist", dest, count, ty, comm, request] => Some(Effect::Persist {
                dest: dest.to_string(),
                count: count.to_string(),
                ty: ty.to_string(),
                comm: comm.to_string(),
                request: request.to_string(),
            }),
            ["start", request] => Some(Effect::Start {
                request: request.to_string(),
            }),
            ["startall", count, requests] => Some(Effect::StartAll {
                count: count.to_string(),
                requests: requests.to_string(),
            }),
            ["track", request] => Some(Effect::Track {
                request: request.to_string(),
                persistent: false,
            }),
            ["track", "persistent", request] => Some(Effect::Track {
                request: request.to_string(),
                persistent: true,
            }),
            ["done", request, status, flag @ ..] if flag.len() <= 1 => Some(Effect::Done(Done::One {
                request: request.to_string(),
                status: status.to_string(),
                flag: flag.first().map(|f| f.to_string()),
            })),
            ["doneall", count, requests, statuses, flag @ ..] if flag.len() <= 1 => {
                Some(Effect::Done(Done::All {
                    count: count.to_string(),
                    requests: requests.to_string(),
                    statuses: statuses.to_string(),
                    flag: flag.first().map(|f| f.to_string()),
                }))
            }
            ["doneany", count, requests, index, status, flag @ ..] if flag.len() <= 1 => {
                Some(Effect::Done(Done::Any {
                    count: count.to_string(),
                    requests: requests.to_string(),
                    index: index.to_string(),
                    status: status.to_string(),
                    flag: flag.first().map(|f| f.to_string()),
                }))
            }
            ["donesome", count, requests, outcount, indices, statuses] => Some(Effect::Done(Done::Some {
                count: count.to_string(),
                requests: requests.to_string(),
                outcount: outcount.to_string(),
                indices: indices.to_string(),
                statuses: statuses.to_string(),
            })),
            ["atstart", request] => {
                f.at_start = Some(request.to_string());
                None
            }
            ["forget", request] => Some(Effect::Forget {
                request: request.to_string(),
            }),
            [kind @ ("sumw" | "nsumw"), counts, types, comm, rest @ ..] => Some(Effect::SumW {
                counts: counts.to_string(),
                types: types.to_string(),
                comm: comm.to_string(),
                blocks: blocks(kind),
                in_place: match rest {
                    [] => None,
                    ["inplace", buf, "skip"] => Some(buf.to_string()),
                    _ => return Err(format!("sumw takes `inplace BUF skip` after it, not {rest:?}")),
                },
            }),
            _ => return Err(format!("cannot read what the call moves: {part:?}")),
        };
        f.effects.extend(effect);
    }
    // Every name an annotation uses is a parameter.
    if let Some(request) = &f.at_start {
        f.param(request)?;
        if !f.counts_bytes() {
            return Err("`atstart` defers bytes, and the call counts none".into());
        }
    }
    for e in &f.effects {
        let names: Vec<&str> = match e {
            Effect::Send {
                dest,
                count,
                ty,
                comm,
            } => vec![dest.as_str(), count, ty, comm],
            Effect::Recv { status } => vec![status.as_str()],
            Effect::Persist {
                dest,
                count,
                ty,
                comm,
                request,
            } => vec![dest.as_str(), count, ty, comm, request],
            Effect::Start { request } | Effect::Forget { request } | Effect::Track { request, .. } => {
                vec![request.as_str()]
            }
            Effect::Done(done) => done.names(),
            Effect::StartAll { count, requests } => vec![count.as_str(), requests],
            Effect::SumW {
                counts,
                types,
                comm,
                in_place,
                ..
            } => [counts.as_str(), types, comm]
                .into_iter()
                .chain(in_place.as_deref())
                .collect(),
            Effect::Bytes { count, ty, in_place }
            | Effect::Sum {
                counts: count,
                ty,
                in_place,
                ..
            } => {
                let mut v = vec![count.as_str(), ty.as_str()];
                if let Effect::Sum { comm, .. } = e {
                    v.push(comm);
                }
                if let Some(ip) = in_place {
                    v.push(&ip.buf);
                    if let Some((c, t)) = &ip.instead {
                        v.extend([c.as_str(), t.as_str()]);
                    }
                }
                v
            }
        };
        for n in names.into_iter().filter(|n| !is_literal(n)) {
            f.param(n)?;
        }
    }
    Ok(f)
}

/// The blocks of a `sum`/`sumw` (one per peer) or an `nsum`/`nsumw` (one per out-neighbour).
fn blocks(kind: &str) -> Blocks {
    match kind.starts_with('n') {
        true => Blocks::OutNeighbours,
        false => Blocks::Peers,
    }
}

/// A count written as a number in an annotation (`bytes 1 datatype`: one element).
fn is_literal(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit())
}

fn parse_list(text: &str) -> Result<Vec<Function>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse_line(line).map_err(|e| format!("functions.list line {}: {e}", i + 1))?);
    }
    Ok(out)
}

/// How a generated wrapper reads an argument: C passes values, Fortran passes everything by reference with
/// integer handles.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lang {
    C,
    Fortran,
}

fn arg(f: &Function, name: &str, lang: Lang) -> String {
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

fn in_place_test(buf: &str, lang: Lang) -> String {
    match lang {
        Lang::C => format!("{buf} == MPI_IN_PLACE"),
        Lang::Fortran => format!("cm_f_in_place({buf})"),
    }
}

fn bytes_expr(f: &Function, count: &str, ty: &str, sum: Option<(&str, Blocks)>, lang: Lang) -> String {
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
fn add_bytes(f: &Function, k: usize, expr: &str, lang: Lang) -> String {
    match &f.at_start {
        Some(request) => format!(
            "        cm_persist_bytes({}, {k}, {expr});\n",
            request_handle(request, lang)
        ),
        None => format!("        cm_add_bytes({k}, {expr});\n"),
    }
}

/// The statements that record what a successful call moved.
fn effects(f: &Function, k: usize, lang: Lang) -> String {
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
fn request_handle(request: &str, lang: Lang) -> String {
    match lang {
        Lang::C => format!("*{request}"),
        Lang::Fortran => format!("PMPI_Request_f2c(*(const MPI_Fint *){request})"),
    }
}

/// What must be read before the call: a request it frees, the requests a wait or a test may complete (C).
fn before(f: &Function, lang: Lang) -> String {
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
fn watches(f: &Function) -> bool {
    f.effects.iter().any(|e| matches!(e, Effect::Done(_)))
}

fn status_param(f: &Function) -> Option<&str> {
    f.effects.iter().find_map(|e| match e {
        Effect::Recv { status } => Some(status.as_str()),
        _ => None,
    })
}

/// The wrapper of a procedure of mpi.h the list does not annotate: its activity around the next definition.
fn declared_wrapper(d: &header::Declared, k: usize) -> String {
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

fn c_wrapper(f: &Function, k: usize) -> String {
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

fn fortran_wrapper(f: &Function, k: usize) -> String {
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

fn c_source(functions: &[Function]) -> String {
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
fn exported(functions: &[Function]) -> Vec<String> {
    let mut out = Vec::new();
    for f in functions {
        out.push(f.c_name());
        if f.fortran {
            out.push(f.fortran_name());
        }
    }
    out
}

fn exports_rs(functions: &[Function], jump: &str) -> String {
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

fn functions_rs(functions: &[Function]) -> String {
    let mut s = String::from(
        "// Generated by sdk/mpi/build.rs from functions.list.\n\n/// The wrapped calls, by the index the C wrappers know them by.\npub(crate) const FUNCTIONS: &[&str] = &[\n",
    );
    for f in functions {
        let _ = writeln!(s, "    \"{}\",", f.c_name());
    }
    s.push_str("];\n");
    s
}

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
