//! The RUN argument of `canopy report` and `canopy export`: a run store file, or a directory of runs (`canopy up
//! --out`), where the run is `latest.sqlite` or else the newest `run-*.sqlite`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use canopy_store::{LATEST, StoreError, StoreReader};

/// The store file RUN names.
pub fn resolve(run: &Path) -> anyhow::Result<PathBuf> {
    if !run.exists() {
        bail!(
            "RUN {} does not exist: give a run store (a .sqlite file) or a directory holding {LATEST} or \
             run-*.sqlite (canopy up's --out)",
            run.display()
        );
    }
    if !run.is_dir() {
        return Ok(run.to_path_buf());
    }
    let latest = run.join(LATEST);
    if latest.is_file() {
        return Ok(latest);
    }
    let newest = std::fs::read_dir(run)
        .with_context(|| format!("cannot list {}", run.display()))?
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("run-") && name.ends_with(".sqlite")
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max();
    match newest {
        Some((_, path)) => Ok(path),
        None => bail!(
            "directory {} holds no Canopy run: neither {LATEST} nor a run-*.sqlite file",
            run.display()
        ),
    }
}

/// Opens the store RUN names, read-only; a file that is not a Canopy store is refused by name.
pub fn open(run: &Path) -> anyhow::Result<StoreReader> {
    let path = resolve(run)?;
    match StoreReader::open(&path) {
        Ok(reader) => Ok(reader),
        Err(StoreError::Version { found: 0, .. }) => bail!(
            "{} is not a Canopy run store: it has no Canopy schema (no meta.schema_version)",
            path.display()
        ),
        Err(StoreError::Sqlite { source, .. }) => bail!(
            "{} is not a Canopy run store: SQLite cannot read it ({source})",
            path.display()
        ),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_without_runs_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("canopy-run-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = resolve(&dir).unwrap_err().to_string();
        assert!(err.contains("holds no Canopy run"), "{err}");
        assert!(err.contains(&dir.display().to_string()), "{err}");
        std::fs::write(dir.join("run-1-2.sqlite"), b"").unwrap();
        assert_eq!(resolve(&dir).unwrap(), dir.join("run-1-2.sqlite"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_path_names_itself_and_what_is_expected() {
        let err = resolve(Path::new("/no/such/run.sqlite")).unwrap_err().to_string();
        assert!(err.contains("/no/such/run.sqlite does not exist"), "{err}");
        assert!(err.contains(LATEST), "{err}");
    }
}
