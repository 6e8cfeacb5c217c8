//! `canopy export`: a run's tables as files for pandas, DuckDB or a spreadsheet, one file per table, CSV or
//! Parquet, with event names beside their ids and units in the column names (docs/report.md lists them).

mod csv_out;
mod kafka;
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
    /// csv or parquet (INT64, DOUBLE and UTF-8 strings, snappy-compressed); with --training, csv or arff.
    #[arg(long, value_enum, required_unless_present = "kafka_brokers")]
    format: Option<Format>,
    /// Write a workflow's training data for metric selection instead of the tables: per round, the mean
    /// end-to-end latency of a latency stream's steps beside each application's mean of every metric a stats
    /// stream holds, one column each, in one file (training.csv, or training.arff for Weka, the latency last).
    #[arg(long)]
    training: bool,
    /// With --training: the latency stream, by name (default: the one open, or the only, latency stream).
    #[arg(long, requires = "training", default_value = "")]
    latency_stream: String,
    /// With --training: the stats stream, by name (default: the one open, or the only, stats stream).
    #[arg(long, requires = "training", default_value = "")]
    stats_stream: String,
    /// With --training: only the steps of this workflow key (default: every key's, averaged per round).
    #[arg(long, requires = "training", default_value = "")]
    key: String,
    /// With --training: the latest rounds (0: every round).
    #[arg(long, requires = "training", default_value_t = 0)]
    rounds: u32,
    /// The directory to write TABLE.csv or TABLE.parquet into; default, beside the store, the run's file name
    /// with -csv or -parquet. `-o/--output`, as every command that writes; `--out` is kept.
    #[arg(short = 'o', long = "output", visible_alias = "out", value_name = "DIR")]
    out: Option<PathBuf>,
    /// Only these tables (repeatable, or comma-separated): streams, rounds, stats, stats_quantiles, histograms,
    /// classes, clusters, latency, latency_apps, reductions, utilization, outliers, outlier_events, node_samples,
    /// event_metrics, samples, counters, nodes. Default: every table the run has rows in, and always streams and rounds.
    #[arg(long = "table", value_name = "T", value_delimiter = ',')]
    tables: Vec<String>,
    #[command(flatten)]
    kafka: kafka::KafkaArgs,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Csv,
    Parquet,
    /// Weka's attribute-relation file format: --training only.
    Arff,
}

impl Format {
    fn ext(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Parquet => "parquet",
            Format::Arff => "arff",
        }
    }
}

pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    if !args.kafka.kafka_brokers.is_empty() {
        if args.format.is_some() || args.training || !args.tables.is_empty() || args.out.is_some() {
            bail!(
                "--kafka-brokers publishes the run's rounds to Kafka: it takes no --format, --training, --table or --output"
            );
        }
        return kafka::publish(&args.run, &args.kafka);
    }
    let Some(format) = args.format else {
        bail!("--format is needed (csv or parquet), or --kafka-brokers");
    };
    if args.training {
        return training(&args, format);
    }
    if format == Format::Arff {
        bail!("--format arff is for --training (a workflow's training data); the tables are csv or parquet");
    }
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
        .unwrap_or_else(|| default_dir(reader.path(), format.ext()));
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
        let path = dir.join(format!("{name}.{}", format.ext()));
        let file =
            std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        match format {
            Format::Csv => csv_out::write(&table, std::io::BufWriter::new(file)),
            Format::Parquet => parquet_out::write(&table, file),
            Format::Arff => unreachable!("refused above"),
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

/// `--training`: the workflow's training data in one file, as `canopy ctl select` learns from it.
fn training(args: &ExportArgs, format: Format) -> anyhow::Result<()> {
    if format == Format::Parquet {
        bail!("--training writes csv or arff");
    }
    let reader = run_store::open(&args.run)?;
    let t = reader.training_of(&canopy_store::TrainingQuery {
        latency_stream: args.latency_stream.clone(),
        stats_stream: args.stats_stream.clone(),
        key: args.key.clone(),
        rounds: if args.rounds == 0 { u32::MAX } else { args.rounds },
    })?;
    let ds = canopy_select::Dataset::new(
        t.candidates.iter().map(canopy_store::Candidate::label).collect(),
        t.latency_ms.clone(),
        t.columns.clone(),
    )
    .context("the training data cannot be written")?;
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| default_dir(reader.path(), format.ext()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(format!("training.{}", format.ext()));
    let file = std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut w = std::io::BufWriter::new(file);
    match format {
        Format::Arff => canopy_select::write_arff(&ds, "canopy_workflow", "latency_ms", &mut w),
        _ => canopy_select::write_csv(&ds, "latency_ms", &mut w),
    }
    .and_then(|()| std::io::Write::flush(&mut w))
    .with_context(|| format!("cannot write {}", path.display()))?;
    println!(
        "{}: {} rounds ({} to {}), {} metrics beside the latency{}",
        path.display(),
        t.rounds.len(),
        t.rounds.first().copied().unwrap_or_default(),
        t.rounds.last().copied().unwrap_or_default(),
        t.candidates.len(),
        if t.incomplete > 0 {
            format!(" ({} left out: missing in some round)", t.incomplete)
        } else {
            String::new()
        }
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
