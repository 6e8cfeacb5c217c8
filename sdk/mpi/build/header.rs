//! The procedures the MPI library's mpi.h declares, read from its compiler's preprocessor output. Each one
//! functions.list does not annotate gets a wrapper that times it as an activity (its calls and time), so the
//! whole of the MPI the library is built against is monitored, not only the list's calls. A declaration this
//! reader cannot take apart fails the build, by name.

use std::path::Path;
use std::process::Command;

/// A procedure as mpi.h declares it.
#[derive(Debug, Clone)]
pub struct Declared {
    /// `MPI_Comm_get_name`.
    pub name: String,
    /// The return type: `int` for nearly all, `double`, `MPI_Aint`, a handle for the conversions.
    pub ret: String,
    /// The parameter list as written, names included (`MPI_Comm comm, char *comm_name, int *resultlen`).
    pub params: String,
    /// The parameters' names, in order, to pass them on.
    pub args: Vec<String>,
}

/// Procedures left unwrapped, and why.
pub const SKIPPED: &[(&str, &str)] = &[
    (
        "MPI_Wtime",
        "the program's own clock, read in timing loops: timing it would perturb what it times",
    ),
    (
        "MPI_Wtick",
        "the resolution of the program's own clock, a constant",
    ),
    (
        "MPI_Pcontrol",
        "it takes a variable argument list, which a wrapper cannot pass on",
    ),
];

/// mpi.h through `mpicc -E`, with the preprocessor's line markers dropped.
pub fn preprocessed(mpicc: &str, out: &Path) -> Result<String, String> {
    let probe = out.join("mpi_h.c");
    std::fs::write(&probe, "#include <mpi.h>\n").map_err(|e| format!("{}: {e}", probe.display()))?;
    let o = Command::new(mpicc)
        .arg("-E")
        .arg(&probe)
        .output()
        .map_err(|e| format!("`{mpicc} -E` did not run: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "`{mpicc} -E` of mpi.h failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join(" "))
}

/// Every `MPI_` procedure declared at file scope in `text`, and the names of those whose declaration cannot be
/// taken apart (a parameter without a name, a variable argument list that is not in SKIPPED).
pub fn declarations(text: &str) -> (Vec<Declared>, Vec<String>) {
    let (mut found, mut unreadable) = (Vec::new(), Vec::new());
    let mut depth = 0usize;
    let mut statement = String::new();
    for c in text.chars() {
        match c {
            '{' => {
                depth += 1;
                statement.clear();
            }
            '}' => {
                depth = depth.saturating_sub(1);
                statement.clear();
            }
            ';' if depth == 0 => {
                match declaration(&statement) {
                    Some(Ok(d)) => found.push(d),
                    Some(Err(name)) => unreadable.push(name),
                    None => {}
                }
                statement.clear();
            }
            _ if depth == 0 => statement.push(c),
            _ => {}
        }
    }
    (found, unreadable)
}

/// `s` without its `__attribute__((...))` parts.
fn without_attributes(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find("__attribute__") {
        out.push_str(&rest[..at]);
        rest = &rest[at + "__attribute__".len()..];
        // Skip the balanced parentheses that follow.
        let mut depth = 0usize;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ if depth == 0 && !c.is_whitespace() => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// One file-scope statement: None if it declares no `MPI_` procedure; Err(name) if it declares one this reader
/// cannot take apart.
fn declaration(statement: &str) -> Option<Result<Declared, String>> {
    let s = without_attributes(statement).replace("__extension__", " ");
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.starts_with("typedef") || s.contains("extern \"C\"") {
        return None;
    }
    let open = s.find('(')?;
    let head = s[..open].trim_end();
    let name_at = head
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    let name = &head[name_at..];
    let ret = head[..name_at].trim().trim_start_matches("extern ").trim();
    if !name.starts_with("MPI_") || ret.is_empty() || ret.contains('(') {
        return None;
    }
    // The parameter list: from the '(' to its match; nothing may follow it.
    let mut depth = 0usize;
    let mut close = None;
    for (i, c) in s[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(open + i);
                    break;
                }
            }
            _ => {}
        }
    }
    let Some(close) = close else {
        return Some(Err(name.to_string()));
    };
    if !s[close + 1..].trim().is_empty() {
        return Some(Err(name.to_string()));
    }
    let params = s[open + 1..close].trim().to_string();
    let mut args = Vec::new();
    if params != "void" && !params.is_empty() {
        for p in split_params(&params) {
            if p.trim() == "..." {
                return Some(Err(name.to_string()));
            }
            // The name: the last identifier once array brackets are dropped.
            let mut bare = String::new();
            let mut in_brackets = 0usize;
            for c in p.chars() {
                match c {
                    '[' => in_brackets += 1,
                    ']' => in_brackets = in_brackets.saturating_sub(1),
                    _ if in_brackets == 0 => bare.push(c),
                    _ => {}
                }
            }
            let bare = bare.trim();
            let at = bare
                .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
                .map_or(0, |i| i + 1);
            let arg = &bare[at..];
            // A lone type ("int", "MPI_Comm") has no name to pass on.
            if arg.is_empty() || at == 0 || p.contains('(') {
                return Some(Err(name.to_string()));
            }
            args.push(arg.to_string());
        }
    }
    Some(Ok(Declared {
        name: name.to_string(),
        ret: ret.to_string(),
        params,
        args,
    }))
}

/// The parameters of a list, split at the commas outside brackets and parentheses.
fn split_params(params: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in params.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&params[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&params[start..]);
    out
}
