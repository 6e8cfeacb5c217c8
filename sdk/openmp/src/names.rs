//! The activities' names: a construct and its place in the source, read from the code pointer OMPT gives
//! (`omp for @stencil.c:42`; the function where the program has no line tables; the construct alone where
//! neither is known). Each construct's place is read once; after that a thread finds its activity without a lock.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use crate::ompt;
use crate::sink;

/// The activity of a worksharing construct (`ompt_work_t`); none for a `single` this thread skips.
pub fn work_label(wstype: c_int) -> Option<&'static str> {
    Some(match wstype {
        // ompt_work_loop; newer runtimes tell static, dynamic, guided and other schedules apart (10 to 13).
        1 | 10..=13 => "omp for",
        2 => "omp sections",
        3 => "omp single",
        5 => "omp workshare",
        6 => "omp distribute",
        7 => "omp taskloop",
        8 => "omp scope",
        _ => return None,
    })
}

/// The activity of a synchronization region (`ompt_sync_region_t`), and of the time a thread waits in it.
pub fn sync_labels(kind: c_int) -> (&'static str, &'static str) {
    match kind {
        1 | 3 => ("omp barrier", "omp barrier wait"),
        2 | 4 | 8 | 9 => ("omp barrier (implicit)", "omp barrier (implicit) wait"),
        10 => ("omp barrier (teams)", "omp barrier (teams) wait"),
        5 => ("omp taskwait", "omp taskwait wait"),
        6 => ("omp taskgroup", "omp taskgroup wait"),
        7 => ("omp reduction", "omp reduction wait"),
        _ => ("omp sync", "omp sync wait"),
    }
}

/// The activity of a parallel region, of an explicit task.
pub const PARALLEL: &str = "omp parallel";
pub const TASK: &str = "omp task";

/// Where a construct is in the source: `path` as the line tables give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Line { path: String, line: u32 },
    Function(String),
    Unknown,
}

/// The activity's name: the construct, then its place (the file's name alone, as short names read best).
pub fn name(label: &str, place: &Place) -> String {
    match place {
        Place::Line { path, line } => {
            let file = Path::new(path)
                .file_name()
                .map_or(path.as_str().into(), |f| f.to_string_lossy());
            format!("{label} @{file}:{line}")
        }
        Place::Function(f) => format!("{label} @{f}"),
        Place::Unknown => label.to_string(),
    }
}

/// The name of a construct at `place`, given the files each short name was first given to (`taken`): a file
/// whose short name another file holds at the same construct and line is named by its whole path, so that
/// `kernel.c` in two directories are two activities.
pub fn unique_name(label: &str, place: &Place, taken: &mut HashMap<String, String>) -> String {
    let short = name(label, place);
    let Place::Line { path, line } = place else {
        return short;
    };
    match taken.get(&short) {
        Some(first) if first != path => format!("{label} @{path}:{line}"),
        Some(_) => short,
        None => {
            taken.insert(short.clone(), path.clone());
            short
        }
    }
}

/// Where the code pointer `codeptr` (a return address in the program) is: the call's line, read from the
/// line tables of the object that holds it, or the function's name.
pub fn place(codeptr: *const c_void) -> Place {
    if codeptr.is_null() {
        return Place::Unknown;
    }
    // A return address is the instruction after the call; the call's line is the byte before it.
    let call = codeptr.cast::<u8>().wrapping_sub(1).cast::<c_void>().cast_mut();
    let mut line = None;
    let mut function = None;
    backtrace::resolve(call, |symbol| {
        if line.is_none()
            && let (Some(file), Some(l)) = (symbol.filename(), symbol.lineno())
        {
            line = Some((file.to_string_lossy().into_owned(), l));
        }
        if function.is_none() {
            function = symbol.name().map(|n| format!("{n:#}"));
        }
    });
    match (line, function) {
        (Some((path, line)), _) => Place::Line { path, line },
        (None, Some(f)) => Place::Function(f),
        (None, None) => Place::Unknown,
    }
}

/// A construct at a code pointer.
type Key = (usize, usize);

/// The activities found so far, by construct and code pointer (the slow path: one lock).
fn found() -> &'static Mutex<HashMap<Key, Option<u32>>> {
    static FOUND: OnceLock<Mutex<HashMap<Key, Option<u32>>>> = OnceLock::new();
    FOUND.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The file each short name was first given to (see `unique_name`).
fn taken() -> &'static Mutex<HashMap<String, String>> {
    static TAKEN: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    TAKEN.get_or_init(|| Mutex::new(HashMap::new()))
}

thread_local! {
    /// This thread's copy of what it has looked up.
    static SEEN: RefCell<HashMap<Key, Option<u32>>> = RefCell::new(HashMap::new());
}

/// The activity of construct `label` at `codeptr`: registered with the SDK the first time any thread meets it.
/// None when the SDK has no room for another name, nor for the construct's name alone.
pub fn activity(label: &'static str, codeptr: *const c_void) -> Option<u32> {
    let key = (label.as_ptr() as usize, codeptr as usize);
    let cached = SEEN.try_with(|seen| seen.try_borrow().ok().and_then(|s| s.get(&key).copied()));
    if let Ok(Some(hit)) = cached {
        return hit;
    }
    let known = found()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .copied();
    let id = match known {
        Some(id) => id,
        None => {
            // Read outside the lock: the line tables take a while, and other threads go on meanwhile. Two
            // threads that read the same construct register the same name, which gives the same activity.
            let place = place(codeptr);
            let name = unique_name(
                label,
                &place,
                &mut taken().lock().unwrap_or_else(|e| e.into_inner()),
            );
            let id = sink::activity(&name).or_else(|| sink::activity(label));
            *found()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(key)
                .or_insert(id)
        }
    };
    let _ = SEEN.try_with(|seen| {
        if let Ok(mut seen) = seen.try_borrow_mut() {
            seen.insert(key, id);
        }
    });
    id
}

/// The tool keeps a construct's code pointer in its runtime word (a parallel region's, for its team's implicit
/// tasks and implicit barrier; an explicit task's, for when it runs), with a tag that says which: a word the
/// tool never set is 0, which has neither tag. An untied task's word says so too.
pub fn keep(data: *mut ompt::Data, codeptr: *const c_void, tag: u64) {
    if !data.is_null() {
        // SAFETY: the runtime hands the tool this word to keep; it is the tool's alone.
        unsafe { (*data).value = tag | (codeptr as u64 & !TAGS) };
    }
}

/// The code pointer kept in a runtime word with `tag` (PARALLEL_TAG or TASK_TAG), if the word has that tag.
pub fn kept(data: *const ompt::Data, tag: u64) -> Option<*const c_void> {
    word(data).and_then(|value| (value & KINDS == tag).then_some((value & !TAGS) as *const c_void))
}

/// Whether a task's word says it is untied.
pub fn untied(data: *const ompt::Data) -> bool {
    word(data).is_some_and(|value| value & UNTIED_TAG != 0)
}

fn word(data: *const ompt::Data) -> Option<u64> {
    // SAFETY: as in `keep`.
    (!data.is_null()).then(|| unsafe { (*data).value })
}

/// Tags of the words the tool keeps: a parallel region's, an explicit task's, and whether that task is untied.
/// User-space addresses stay below all three bits.
pub const PARALLEL_TAG: u64 = 1 << 62;
pub const TASK_TAG: u64 = 1 << 63;
pub const UNTIED_TAG: u64 = 1 << 61;
const KINDS: u64 = PARALLEL_TAG | TASK_TAG;
const TAGS: u64 = KINDS | UNTIED_TAG;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_the_construct_and_its_place() {
        let line = Place::Line {
            path: "/src/lulesh/lulesh.cc".into(),
            line: 1234,
        };
        assert_eq!(name("omp for", &line), "omp for @lulesh.cc:1234");
        assert_eq!(
            name("omp parallel", &Place::Function("CalcForce".into())),
            "omp parallel @CalcForce"
        );
        assert_eq!(name("omp barrier", &Place::Unknown), "omp barrier");
    }

    #[test]
    fn two_files_of_one_name_at_one_line_are_two_activities() {
        let mut taken = HashMap::new();
        let a = Place::Line {
            path: "/app/a/kernel.c".into(),
            line: 12,
        };
        let b = Place::Line {
            path: "/app/b/kernel.c".into(),
            line: 12,
        };
        assert_eq!(unique_name("omp for", &a, &mut taken), "omp for @kernel.c:12");
        assert_eq!(
            unique_name("omp for", &b, &mut taken),
            "omp for @/app/b/kernel.c:12"
        );
        assert_eq!(
            unique_name("omp for", &a, &mut taken),
            "omp for @kernel.c:12",
            "the first keeps its name"
        );
        assert_eq!(
            unique_name("omp barrier", &b, &mut taken),
            "omp barrier @kernel.c:12",
            "another construct"
        );
    }

    #[test]
    fn constructs_are_named_as_the_standard_names_them() {
        assert_eq!(work_label(1), Some("omp for"));
        assert_eq!(
            work_label(10),
            Some("omp for"),
            "a static loop, as newer runtimes report it"
        );
        assert_eq!(work_label(13), Some("omp for"));
        assert_eq!(
            work_label(4),
            None,
            "a single another thread executes is not this thread's work"
        );
        assert_eq!(work_label(7), Some("omp taskloop"));
        assert_eq!(sync_labels(3), ("omp barrier", "omp barrier wait"));
        assert_eq!(sync_labels(9).0, "omp barrier (implicit)");
        assert_eq!(sync_labels(5).0, "omp taskwait");
    }

    #[test]
    fn a_null_code_pointer_has_no_place() {
        assert_eq!(place(std::ptr::null()), Place::Unknown);
    }

    #[test]
    fn a_word_keeps_a_code_pointer_with_its_tag() {
        let mut word = ompt::Data { value: 0 };
        assert_eq!(
            kept(&word, TASK_TAG),
            None,
            "a word the tool never set holds nothing"
        );
        let here = 0x5555_1234_usize as *const c_void;
        keep(&mut word, here, TASK_TAG);
        assert_eq!(kept(&word, TASK_TAG), Some(here));
        assert_eq!(
            kept(&word, PARALLEL_TAG),
            None,
            "a task's word is not a parallel region's"
        );
        keep(&mut word, std::ptr::null(), PARALLEL_TAG);
        assert_eq!(
            kept(&word, PARALLEL_TAG),
            Some(std::ptr::null()),
            "a construct with no code pointer is kept"
        );
    }
}
