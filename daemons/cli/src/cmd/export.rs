//! `canopy export`: a run's tables as files for pandas, DuckDB or a spreadsheet (CSV or Parquet), a workflow's
//! training data (CSV or ARFF), both written by the canopy-report library; or, with `--kafka-brokers`, the run's
//! rounds into Kafka (export_kafka.rs).

use std::path::PathBuf;

use anyhow::bail;
use canopy_report::export::{self, Format as Files};
use canopy_report::run_store;

use super::export_kafka::{self, KafkaArgs};

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
    kafka: KafkaArgs,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Csv,
    Parquet,
    /// Weka's attribute-relation file format: --training only.
    Arff,
}

impl From<Format> for Files {
    fn from(f: Format) -> Files {
        match f {
            Format::Csv => Files::Csv,
            Format::Parquet => Files::Parquet,
            Format::Arff => Files::Arff,
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
        return export_kafka::publish(&args.run, &args.kafka);
    }
    let Some(format) = args.format else {
        bail!("--format is needed (csv or parquet), or --kafka-brokers");
    };
    let format = Files::from(format);
    if args.training {
        return training(&args, format);
    }
    export::check(format, &args.tables)?;
    let reader = run_store::open(&args.run)?;
    let dir = args
        .out
        .unwrap_or_else(|| export::default_dir(reader.path(), format.ext()));
    let written = export::tables(&reader, format, &args.tables, &dir)?;
    for w in &written {
        println!("{} ({} rows)", w.path.display(), w.rows);
    }
    println!(
        "canopy export: {} tables of {} in {}",
        written.len(),
        reader.path().display(),
        dir.display()
    );
    Ok(())
}

/// `--training`: the workflow's training data in one file, as `canopy ctl select` learns from it.
fn training(args: &ExportArgs, format: Files) -> anyhow::Result<()> {
    if format == Files::Parquet {
        bail!("--training writes csv or arff");
    }
    let reader = run_store::open(&args.run)?;
    let query = canopy_store::TrainingQuery {
        latency_stream: args.latency_stream.clone(),
        stats_stream: args.stats_stream.clone(),
        key: args.key.clone(),
        rounds: if args.rounds == 0 { u32::MAX } else { args.rounds },
    };
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| export::default_dir(reader.path(), format.ext()));
    let w = export::training(&reader, &query, format, &dir)?;
    let t = &w.training;
    println!(
        "{}: {} rounds ({} to {}), {} metrics beside the latency{}",
        w.path.display(),
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
