//! The report: a run's store as one self-contained HTML page (inline CSS and SVG, nothing fetched), or one
//! of its figures as a PNG. A section per stream, drawn by the function of the stream's kind (stats,
//! histogram, classify, kmeans, utilization, outliers, nodes) after the run's summary, then every stream's coverage.

mod classes;
mod clusters;
pub mod coverage;
pub mod data;
mod histogram;
mod latency;
mod nodes;
mod outliers;
mod page;
mod per_rank;
pub mod plot;
mod stats;
mod summary;
mod utilization;

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use canopy_proto::filters::v1::Metric;
use canopy_store::{StoreReader, StreamRow};

use crate::run_store;
use data::Names;
use plot::Figure;

/// Top events a figure shows unless told otherwise.
pub const DEFAULT_TOP: usize = 8;

/// A metric by its word (`calls`, `exclusive`, `task_clock_exclusive`, ...), as `--metric` takes it.
pub fn parse_metric(word: &str) -> Result<Metric, String> {
    use canopy_store::Word;
    Metric::from_word(word)
        .filter(|m| *m != Metric::Unspecified)
        .ok_or_else(|| {
            let words: Vec<&str> = Metric::WORDS
                .iter()
                .filter(|(m, _)| *m != Metric::Unspecified)
                .map(|(_, w)| *w)
                .collect();
            format!("no metric {word:?}; the metrics: {}", words.join(", "))
        })
}

/// What every section reads from.
pub struct Context<'a> {
    pub reader: &'a StoreReader,
    pub names: Names,
    pub top: usize,
    /// The metric asked for (`--metric`), where a stream has it.
    pub metric: Option<Metric>,
}

/// A part of the report: a heading, a line saying what it shows and where from, facts and figures.
#[derive(Debug, Default)]
pub struct Section {
    /// The HTML anchor.
    pub anchor: String,
    pub title: String,
    /// What the section shows, and from which table.
    pub intro: String,
    pub facts: Vec<(String, String)>,
    pub tables: Vec<TextTable>,
    pub figures: Vec<Figure>,
}

/// A table of text in a section: a caption, a header row and rows of cells.
#[derive(Debug, Default)]
pub struct TextTable {
    pub caption: String,
    pub head: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// The kinds of stream the report draws, by the type of their results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stats,
    Histogram,
    Classify,
    Kmeans,
    Latency,
    Utilization,
    Outliers,
    Nodes,
    PerRank,
}

impl Kind {
    fn of(stream: &StreamRow) -> Option<Kind> {
        use canopy_proto::filters::known::Known;
        Some(match Known::of(stream.result_type.as_deref()?)? {
            Known::Stats => Kind::Stats,
            Known::Histogram => Kind::Histogram,
            Known::Classes => Kind::Classify,
            Known::Kmeans => Kind::Kmeans,
            Known::Latency => Kind::Latency,
            Known::Utilization => Kind::Utilization,
            Known::Outliers => Kind::Outliers,
            Known::Nodes => Kind::Nodes,
            Known::Profiles => Kind::PerRank,
        })
    }

    /// The section of a stream of this kind.
    fn section(self, ctx: &Context<'_>, stream: &StreamRow) -> anyhow::Result<Section> {
        match self {
            Kind::Stats => stats::section(ctx, stream),
            Kind::Histogram => histogram::section(ctx, stream),
            Kind::Classify => classes::section(ctx, stream),
            Kind::Kmeans => clusters::section(ctx, stream),
            Kind::Latency => latency::section(ctx, stream),
            Kind::Utilization => utilization::section(ctx, stream),
            Kind::Outliers => outliers::section(ctx, stream),
            Kind::Nodes => nodes::section(ctx, stream),
            Kind::PerRank => per_rank::section(ctx, stream),
        }
    }
}

/// Every section of the report, in page order: one per stream the report can draw, then coverage.
pub fn sections(ctx: &Context<'_>) -> anyhow::Result<Vec<Section>> {
    let streams = ctx.reader.streams()?;
    let mut out = Vec::new();
    for stream in &streams {
        if let Some(kind) = Kind::of(stream) {
            out.push(kind.section(ctx, stream)?);
        }
    }
    out.push(coverage::section(ctx, &streams)?);
    Ok(out)
}

/// What a page holds, to say so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    /// Sections, the run's summary included.
    pub sections: usize,
    pub figures: usize,
}

/// The HTML report of the run in `run` (a store, or a directory of runs: its latest) beside its store, with the
/// default number of top events; its path and what it holds.
pub fn html_beside_store(run: &Path) -> anyhow::Result<(PathBuf, Page)> {
    let reader = run_store::open(run)?;
    let ctx = Context {
        names: Names::new(reader.names()?),
        reader: &reader,
        top: DEFAULT_TOP,
        metric: None,
    };
    let sections = sections(&ctx)?;
    let out = beside(reader.path(), "html");
    let page = write_html(&reader, &sections, &out)?;
    Ok((out, page))
}

/// Writes the report of `sections` as one page to `out`.
pub fn write_html(reader: &StoreReader, sections: &[Section], out: &Path) -> anyhow::Result<Page> {
    let summary = summary::summary(reader)?;
    let html = page::render(reader, &summary, sections)?;
    std::fs::write(out, html).with_context(|| format!("cannot write {}", out.display()))?;
    Ok(Page {
        sections: sections.len() + 1,
        figures: sections.iter().map(|s| s.figures.len()).sum(),
    })
}

/// The figure named `name`.
pub fn find_figure<'a>(sections: &'a [Section], name: &str) -> Option<&'a Figure> {
    sections.iter().flat_map(|s| &s.figures).find(|f| f.id == name)
}

/// The names of every figure, comma-separated, for an error message.
pub fn figure_names(sections: &[Section]) -> String {
    let names: Vec<&str> = sections
        .iter()
        .flat_map(|s| &s.figures)
        .map(|f| f.id.as_str())
        .collect();
    if names.is_empty() {
        "none (the run stored no rounds)".to_string()
    } else {
        names.join(", ")
    }
}

/// A figure's name as a file name: `:` and `/` become `-`.
pub fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| if matches!(c, ':' | '/' | '\\') { '-' } else { c })
        .collect()
}

/// The store's path with another extension, through a `latest.sqlite` link to the run file it names.
pub fn beside(store: &Path, ext: &str) -> PathBuf {
    let real = std::fs::canonicalize(store).unwrap_or_else(|_| store.to_path_buf());
    real.with_extension(ext)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(result_type: Option<&str>) -> StreamRow {
        StreamRow {
            stream_id: 1,
            name: "s".into(),
            filter: "f".into(),
            params: String::new(),
            sync_mode: canopy_proto::v1::SyncMode::WaitForAll,
            timeout_ms: 0,
            state: None,
            failure: None,
            result_type: result_type.map(str::to_string),
            ranks: String::new(),
            stages: Vec::new(),
            opened_unix_ns: None,
            closed_unix_ns: None,
            rounds: 0,
            full_rounds: 0,
            late_packets: 0,
            last_round: None,
        }
    }

    #[test]
    fn a_stream_is_drawn_by_the_type_of_its_results() {
        let kind = |ty| Kind::of(&stream(ty));
        assert_eq!(kind(Some("canopy.filters.v1.StatsResult")), Some(Kind::Stats));
        assert_eq!(
            kind(Some("canopy.filters.v1.HistogramResult")),
            Some(Kind::Histogram)
        );
        assert_eq!(kind(Some("canopy.filters.v1.ClassResult")), Some(Kind::Classify));
        assert_eq!(
            kind(Some("canopy.filters.v1.UtilizationResult")),
            Some(Kind::Utilization)
        );
        assert_eq!(kind(Some("canopy.filters.v1.NodeSamples")), Some(Kind::Nodes));
        assert_eq!(kind(Some("canopy.filters.v1.LatencyResult")), Some(Kind::Latency));
        // Passthrough profiles: the per-rank view. A plugin's own type, or no result yet: coverage only.
        assert_eq!(kind(Some("canopy.v1.ProfileBatch")), Some(Kind::PerRank));
        assert_eq!(kind(Some("canopy.filters.v1.RankCount")), None);
        // A third-party plugin's message of a built-in's name is not drawn as the built-in.
        assert_eq!(kind(Some("acme.v1.StatsResult")), None);
        assert_eq!(kind(None), None);
    }

    #[test]
    fn figure_names_become_file_names() {
        assert_eq!(file_safe("histogram:h:MPI/Send"), "histogram-h-MPI-Send");
    }

    #[test]
    fn figures_are_found_by_name_and_listed_when_not() {
        let fig = |id: &str| Figure {
            id: id.into(),
            title: String::new(),
            x_label: String::new(),
            y_label: String::new(),
            chart: plot::Chart::Lines(Vec::new()),
        };
        let sections = vec![
            Section {
                figures: vec![fig("coverage:a")],
                ..Section::default()
            },
            Section {
                figures: vec![fig("stats:a"), fig("histogram:b:x")],
                ..Section::default()
            },
        ];
        assert_eq!(find_figure(&sections, "stats:a").unwrap().id, "stats:a");
        assert!(find_figure(&sections, "stats:b").is_none());
        assert_eq!(figure_names(&sections), "coverage:a, stats:a, histogram:b:x");
        assert_eq!(figure_names(&[]), "none (the run stored no rounds)");
    }
}
