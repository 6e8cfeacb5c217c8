//! functions.list read: each procedure's prototype, with what its wrapper records (bytes sent or received, requests
//! to watch, in-place buffers, the special cases) and how to write its call.

use crate::header;

/// A parameter of a prototype: its C type (with `[]` as a pointer) and its name.
#[derive(Debug, Clone)]
pub(crate) struct Param {
    pub(crate) ty: String,
    pub(crate) name: String,
}

/// What a call moves, from the annotation after `|`.
#[derive(Debug, Clone)]
pub(crate) enum Effect {
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
pub(crate) enum Done {
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
    pub(crate) fn names(&self) -> Vec<&str> {
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
    pub(crate) fn before(&self) -> String {
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
    pub(crate) fn after(&self) -> String {
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
pub(crate) enum Blocks {
    /// One per rank of the communicator (of its remote group for an intercommunicator).
    Peers,
    /// One per out-neighbour of the communicator's topology (neighbourhood collectives).
    OutNeighbours,
}

impl Blocks {
    /// The C expression for the number of blocks.
    pub(crate) fn count(self, comm: &str) -> String {
        match self {
            Blocks::Peers => format!("cm_peers({comm})"),
            Blocks::OutNeighbours => format!("cm_out_neighbours({comm})"),
        }
    }
}

/// When `buf` is MPI_IN_PLACE: another count and type, or no bytes.
#[derive(Debug, Clone)]
pub(crate) struct InPlace {
    pub(crate) buf: String,
    pub(crate) instead: Option<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Special {
    None,
    Init,
    InitThread,
    Finalize,
}

#[derive(Debug, Clone)]
pub(crate) struct Function {
    /// `Send` for MPI_Send.
    pub(crate) name: String,
    pub(crate) params: Vec<Param>,
    pub(crate) effects: Vec<Effect>,
    pub(crate) special: Special,
    pub(crate) fortran: bool,
    /// A procedure of mpi.h the list does not annotate: wrapped as declared, timed as an activity.
    pub(crate) declared: Option<header::Declared>,
    /// A persistent collective's request (`atstart REQUEST`): its bytes are added at each MPI_Start of it, not
    /// at this call.
    pub(crate) at_start: Option<String>,
    /// What the call moves as the list says it (after `|`, without `nofortran`): the large-count (`_c`) form of
    /// the procedure moves the same.
    pub(crate) note: String,
}

impl Function {
    /// The wrapper of a procedure as mpi.h declares it: its activity, no other effect, C only.
    pub(crate) fn declared(d: header::Declared) -> Function {
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
    pub(crate) fn c_name(&self) -> String {
        format!("MPI_{}", self.name)
    }
    pub(crate) fn fortran_name(&self) -> String {
        format!("mpi_{}_", self.name.to_lowercase())
    }
    pub(crate) fn param(&self, name: &str) -> Result<&Param, String> {
        self.params
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| format!("MPI_{} has no parameter {name}", self.name))
    }
    pub(crate) fn counts_bytes(&self) -> bool {
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

pub(crate) fn parse_param(text: &str) -> Result<Param, String> {
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

pub(crate) fn parse_in_place(words: &[&str]) -> Result<Option<InPlace>, String> {
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

pub(crate) fn parse_line(line: &str) -> Result<Function, String> {
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
        let effect = annotation(&mut f, part)?;
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
        for n in e.names().into_iter().filter(|n| !is_literal(n)) {
            f.param(n)?;
        }
    }
    Ok(f)
}

/// One `;`-separated part of what a call moves: an effect, or a mark on the function itself (`init`, `atstart`).
fn annotation(f: &mut Function, part: &str) -> Result<Option<Effect>, String> {
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
    Ok(effect)
}

impl Effect {
    /// The names this effect reads from the call's parameters (literals among them).
    fn names(&self) -> Vec<&str> {
        match self {
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
                if let Effect::Sum { comm, .. } = self {
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
        }
    }
}

/// The blocks of a `sum`/`sumw` (one per peer) or an `nsum`/`nsumw` (one per out-neighbour).
pub(crate) fn blocks(kind: &str) -> Blocks {
    match kind.starts_with('n') {
        true => Blocks::OutNeighbours,
        false => Blocks::Peers,
    }
}

/// A count written as a number in an annotation (`bytes 1 datatype`: one element).
pub(crate) fn is_literal(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit())
}

pub(crate) fn parse_list(text: &str) -> Result<Vec<Function>, String> {
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
