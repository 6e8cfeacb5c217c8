//! The export: a run's tables as files for pandas, DuckDB or a spreadsheet, one file per table, CSV or
//! Parquet, with event names beside their ids and units in the column names (docs/report.md lists them).

mod csv_out;
mod parquet_out;
mod table;
mod tables;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use canopy_store::{StoreReader, Training, TrainingQuery};

use crate::report::data::Names;
use tables::{Source, TABLES, table_names};

/// The files' format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Csv,
    Parquet,
    /// Weka's attribute-relation file format: --training only.
    Arff,
}

impl Format {
    /// The files' extension.
    pub fn ext(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Parquet => "parquet",
            Format::Arff => "arff",
        }
    }
}

/// A table written: its file and its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub path: PathBuf,
    pub rows: usize,
}

/// Refuses a format or a table name [`tables`] cannot write, naming the choices.
pub fn check(format: Format, wanted: &[String]) -> anyhow::Result<()> {
    if format == Format::Arff {
        bail!("--format arff is for --training (a workflow's training data); the tables are csv or parquet");
    }
    for t in wanted {
        if !TABLES.iter().any(|(name, ..)| name == t) {
            bail!("unknown table {t:?} for --table; tables: {}", table_names());
        }
    }
    Ok(())
}

/// Writes the run's tables into `dir` (made if missing), one `TABLE.csv` or `TABLE.parquet` each: those `wanted`
/// names, or, when it is empty, every table the run has rows in, and always streams and rounds.
pub fn tables(
    reader: &StoreReader,
    format: Format,
    wanted: &[String],
    dir: &Path,
) -> anyhow::Result<Vec<Written>> {
    check(format, wanted)?;
    let src = Source {
        names: Names::new(reader.names()?),
        streams: reader
            .streams()?
            .into_iter()
            .map(|s| (s.stream_id, s.name))
            .collect::<HashMap<_, _>>(),
        reader,
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut written = Vec::new();
    for (name, store_table, build) in TABLES {
        let take = if wanted.is_empty() {
            matches!(*name, "streams" | "rounds") || reader.count(*store_table)? > 0
        } else {
            wanted.iter().any(|t| t == name)
        };
        if !take {
            continue;
        }
        let table = build(&src)?;
        let path = dir.join(format!("{name}.{}", format.ext()));
        let file =
            std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        match format {
            Format::Csv => csv_out::write(&table, std::io::BufWriter::new(file)),
            Format::Parquet => parquet_out::write(&table, file),
            Format::Arff => unreachable!("refused above"),
        }
        .with_context(|| format!("cannot write {}", path.display()))?;
        written.push(Written {
            path,
            rows: table.rows(),
        });
    }
    Ok(written)
}

/// A workflow's training data written: its file and what it holds.
#[derive(Debug, Clone)]
pub struct TrainingWritten {
    pub path: PathBuf,
    pub training: Training,
}

/// Writes a workflow's training data (as `canopy ctl select` learns from it) into `dir`, as `training.csv` or
/// `training.arff`.
pub fn training(
    reader: &StoreReader,
    query: &TrainingQuery,
    format: Format,
    dir: &Path,
) -> anyhow::Result<TrainingWritten> {
    if format == Format::Parquet {
        bail!("--training writes csv or arff");
    }
    let t = reader.training_of(query)?;
    let ds = canopy_select::Dataset::new(
        t.candidates.iter().map(canopy_store::Candidate::label).collect(),
        t.latency_ms.clone(),
        t.columns.clone(),
    )
    .context("the training data cannot be written")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(format!("training.{}", format.ext()));
    let file = std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut w = std::io::BufWriter::new(file);
    match format {
        Format::Arff => canopy_select::write_arff(&ds, "canopy_workflow", "latency_ms", &mut w),
        _ => canopy_select::write_csv(&ds, "latency_ms", &mut w),
    }
    .and_then(|()| std::io::Write::flush(&mut w))
    .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(TrainingWritten { path, training: t })
}

/// Beside the store, its run's file name with `-csv` or `-parquet` (through a `latest.sqlite` link).
pub fn default_dir(store: &Path, ext: &str) -> PathBuf {
    let real = std::fs::canonicalize(store).unwrap_or_else(|_| store.to_path_buf());
    let stem = real
        .file_stem()
        .map_or_else(|| "run".to_string(), |s| s.to_string_lossy().into_owned());
    real.with_file_name(format!("{stem}-{ext}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The columns docs/report.md lists for `table`, in order (`None` where it describes them in words).
    fn documented(doc: &str, table: &str) -> Option<Vec<String>> {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{table}` | ")))
            .unwrap_or_else(|| panic!("docs/report.md has no row for {table}"));
        let columns = row.split(" | ").nth(1)?;
        if !columns.starts_with('`') || columns.contains('<') {
            return None;
        }
        // The backquoted names, leaving out what parentheses say of them (`ranks` (ranges, `app:0-7,9`)).
        let mut bare = String::new();
        let mut depth = 0;
        for ch in columns.chars() {
            match ch {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ if depth == 0 => bare.push(ch),
                _ => {}
            }
        }
        let names = bare.split('`').skip(1).step_by(2).map(str::to_string).collect();
        Some(names)
    }

    #[test]
    fn every_table_exports_the_columns_the_docs_list() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/report.md")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = canopy_store::Store::create(dir.path())
            .unwrap()
            .path()
            .to_path_buf();
        let reader = StoreReader::open(&path).unwrap();
        let src = Source {
            names: Names::new(Vec::new()),
            streams: HashMap::new(),
            reader: &reader,
        };
        let mut checked = 0;
        for (name, _, build) in TABLES {
            let table = build(&src).unwrap();
            assert_eq!(table.name, *name);
            let Some(want) = documented(&doc, name) else {
                continue;
            };
            let got: Vec<&str> = table.columns.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(got, want, "{name}: the export's columns against docs/report.md's");
            checked += 1;
        }
        assert!(
            checked >= 15,
            "only {checked} tables' columns are listed in docs/report.md"
        );
    }
}
