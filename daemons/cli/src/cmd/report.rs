//! `canopy report`: a run's store as one self-contained HTML page, or one of its figures as a PNG (the
//! canopy-report library draws them).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use canopy_proto::filters::v1::Metric;
use canopy_report::report::{self, Page, data::Names};
use canopy_report::run_store;

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// The run: a store (.sqlite), or a directory of runs (canopy up's --out), whose latest.sqlite (else newest
    /// run-*.sqlite) is taken.
    run: PathBuf,
    /// Where to write. Default: the page beside the store, as the run's file name with .html; a PNG in the
    /// current directory as the figure's name with `-` for `:` (stats-STREAM.png).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// html: the whole report as one page; png: the one figure --figure names.
    #[arg(long, value_enum, default_value_t = Format::Html)]
    format: Format,
    /// The figure to write as PNG, by its name in the report (`stats:STREAM`, `histogram:STREAM:EVENT`,
    /// `classes:STREAM`, `clusters:STREAM`, `coverage:STREAM`, `utilization:STREAM`, `outliers:STREAM`,
    /// `nodes:STREAM:cpu`, `nodes:STREAM:memory`).
    #[arg(long, value_name = "NAME")]
    figure: Option<String>,
    /// Events per stats figure, and histogram heat maps per stream: those with the largest total mean time.
    #[arg(long, default_value_t = report::DEFAULT_TOP as u16, value_parser = clap::value_parser!(u16).range(1..=64))]
    top: u16,
    /// The metric of the stats figures: calls, inclusive, exclusive, or any metric the stats table holds
    /// (task_clock_exclusive, ...). Default: exclusive time where the stream has it.
    #[arg(long, value_parser = report::parse_metric)]
    metric: Option<Metric>,
}

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    if args.format == Format::Html && args.figure.is_some() {
        bail!("--figure picks the figure of --format png; the HTML report holds every figure");
    }
    let reader = run_store::open(&args.run)?;
    let ctx = report::Context {
        names: Names::new(reader.names()?),
        reader: &reader,
        top: usize::from(args.top),
        metric: args.metric,
    };
    let sections = report::sections(&ctx)?;
    match args.format {
        Format::Html => {
            let out = args
                .output
                .unwrap_or_else(|| report::beside(reader.path(), "html"));
            let page = report::write_html(&reader, &sections, &out)?;
            say_written(&out, page);
        }
        Format::Png => {
            let Some(name) = args.figure else {
                bail!(
                    "--format png writes one figure: name it with --figure; figures of {}: {}",
                    reader.path().display(),
                    report::figure_names(&sections)
                );
            };
            let figure = report::find_figure(&sections, &name).with_context(|| {
                format!(
                    "no figure {name:?} in {}; its figures: {}",
                    reader.path().display(),
                    report::figure_names(&sections)
                )
            })?;
            let out = args
                .output
                .unwrap_or_else(|| PathBuf::from(format!("{}.png", report::file_safe(&figure.id))));
            figure.png(&out)?;
            println!("canopy report: {} ({})", out.display(), figure.title);
        }
    }
    Ok(())
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Html,
    Png,
}

/// The HTML report of the run in `run` beside its store (`canopy run` writes it as the run ends), said on stdout.
pub fn html_beside_store(run: &Path) -> anyhow::Result<PathBuf> {
    let (out, page) = report::html_beside_store(run)?;
    say_written(&out, page);
    Ok(out)
}

fn say_written(out: &Path, page: Page) {
    println!(
        "canopy report: {} ({} sections, {} figures)",
        out.display(),
        page.sections,
        page.figures
    );
}
