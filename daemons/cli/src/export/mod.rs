//! `canopy export`: a run's tables as files for pandas, DuckDB or a spreadsheet, one file per table, CSV or
//! Parquet, with event names beside their ids and units in the column names (docs/report.md lists them).

mod csv_out;
mod parquet_out;
mod table;
mod tables;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use crate::report::data::Names;
use crate::run_store;
use tables::{Source, TABLES, table_names};

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// The run: a store (.sqlite), or a directory of runs (canopy up's --out), whose latest.sqlite (else newest
    /// run-*.sqlite) is taken.
    run: PathBuf,
    /// csv or parquet (INT64, DOUBLE and UTF-8 strings, snappy-compressed).
    #[arg(long, value_enum)]
    format: Format,
    /// The directory to write TABLE.csv or TABLE.parquet into; default, beside the store, the run's file name
    /// with -csv or -parquet.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Only these tables (repeatable, or comma-separated): streams, rounds, stats, stats_quantiles, histograms,
    /// classes, clusters, latency, latency_apps, reductions, utilization, outliers, outlier_events, node_samples,
    /// event_metrics, samples, counters, nodes. Default: every table the run has rows in, and always streams and rounds.
    #[arg(long = "table", value_name = "T", value_delimiter = ',')]
    tables: Vec<String>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Csv,
    Parquet,
}

impl Format {
    fn ext(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Parquet => "parquet",
        }
    }
}

pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    for t in &args.tables {
        if !TABLES.iter().any(|(name, ..)| name == t) {
            bail!("unknown table {t:?} for --table; tables: {}", table_names());
        }
    }
    let reader = run_store::open(&args.run)?;
    let src = Source {
        names: Names::new(reader.names()?),
        streams: reader
            .streams()?
            .into_iter()
            .map(|s| (s.stream_id, s.name))
            .collect::<HashMap<_, _>>(),
        reader: &reader,
    };
    let dir = args
        .out
        .unwrap_or_else(|| default_dir(reader.path(), args.format.ext()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut written = 0;
    for (name, store_table, build) in TABLES {
        let wanted = if args.tables.is_empty() {
            matches!(*name, "streams" | "rounds") || reader.count(*store_table)? > 0
        } else {
            args.tables.iter().any(|t| t == name)
        };
        if !wanted {
            continue;
        }
        let table = build(&src)?;
        let path = dir.join(format!("{name}.{}", args.format.ext()));
        let file =
            std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        match args.format {
            Format::Csv => csv_out::write(&table, std::io::BufWriter::new(file)),
            Format::Parquet => parquet_out::write(&table, file),
        }
        .with_context(|| format!("cannot write {}", path.display()))?;
        println!("{} ({} rows)", path.display(), table.rows());
        written += 1;
    }
    println!(
        "canopy export: {written} tables of {} in {}",
        reader.path().display(),
        dir.display()
    );
    Ok(())
}

/// Beside the store, its run's file name with `-csv` or `-parquet` (through a `latest.sqlite` link).
fn default_dir(store: &Path, ext: &str) -> PathBuf {
    let real = std::fs::canonicalize(store).unwrap_or_else(|_| store.to_path_buf());
    let stem = real
        .file_stem()
        .map_or_else(|| "run".to_string(), |s| s.to_string_lossy().into_owned());
    real.with_file_name(format!("{stem}-{ext}"))
}
