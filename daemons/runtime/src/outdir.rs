//! Whether a directory can take a run's output: checked before a daemon or `canopy up` starts, so a read-only or
//! full disk is a clear refusal at the start, not a stream of failed writes in the middle of a run.

use std::path::Path;

/// The least free space an output directory must have for a run to start: a store's first minutes of rounds.
pub const MIN_FREE_BYTES: u64 = 16 << 20;

/// Why `dir` (made if missing) cannot take a run's output, or `Ok` if it can: the directory, or the nearest
/// ancestor that exists, must be a directory this process may write in, on a file system with at least
/// [`MIN_FREE_BYTES`] free.
pub fn check_out_dir(dir: &Path) -> Result<(), String> {
    use nix::unistd::{AccessFlags, access};
    use std::io::ErrorKind;
    let mut at = dir;
    let meta = loop {
        match std::fs::metadata(at) {
            Ok(meta) => break meta,
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => match at.parent()
            {
                Some(parent) if !parent.as_os_str().is_empty() => at = parent,
                _ => {
                    at = Path::new(".");
                    break std::fs::metadata(at).map_err(|e| format!("cannot inspect .: {e}"))?;
                }
            },
            Err(e) => return Err(format!("cannot inspect {}: {e}", at.display())),
        }
    };
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", at.display()));
    }
    access(at, AccessFlags::W_OK | AccessFlags::X_OK)
        .map_err(|e| format!("cannot write in {}: {}", at.display(), e.desc()))?;
    let fs = nix::sys::statvfs::statvfs(at)
        .map_err(|e| format!("cannot inspect {}: {}", at.display(), e.desc()))?;
    #[allow(
        clippy::useless_conversion,
        reason = "fsblkcnt_t and c_ulong are not u64 on every target"
    )]
    let free = u64::from(fs.blocks_available()).saturating_mul(u64::from(fs.fragment_size()));
    if free < MIN_FREE_BYTES {
        return Err(format!(
            "{} has {} free, less than the {} MiB a run's store needs to start",
            at.display(),
            bytes(free),
            MIN_FREE_BYTES >> 20
        ));
    }
    Ok(())
}

fn bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / f64::from(1 << 20))
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / f64::from(1 << 10))
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_is_judged_by_the_nearest_one_that_exists() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(check_out_dir(&dir.path().join("a/b/c")), Ok(()));
        let file = dir.path().join("f");
        std::fs::write(&file, b"").unwrap();
        assert_eq!(
            check_out_dir(&file.join("out")),
            Err(format!("{} is not a directory", file.display()))
        );
    }

    #[test]
    fn proc_has_no_room_for_a_store() {
        let e = check_out_dir(Path::new("/proc/nope")).unwrap_err();
        assert!(e.starts_with("/proc has 0 bytes free"), "{e}");
    }
}
