//! The report's figures and how they are drawn, with plotters, on any backend: SVG text for the HTML page, PNG
//! for one figure. A [`Figure`] holds its data already shaped (see `data`); drawing it reads nothing else.

use std::path::Path;
use std::sync::Once;

use anyhow::{Context, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use super::data::{Band, HeatCell, Stack};

/// The font every figure's text is measured and drawn with: DejaVu Sans cut to Latin-1 and a few symbols (µ, –),
/// about 20 KB. SVG figures name `sans-serif` and let the browser draw it; PNG figures draw these glyphs.
const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans-subset.ttf");
const FAMILY: &str = "sans-serif";

/// The size figures are drawn at, in pixels (SVG scales to the page's width).
pub const SIZE: (u32, u32) = (900, 400);

/// Ten colours told apart on white (Tableau 10), used in turn for series.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The colour of the `i`-th series.
pub fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

fn fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font is part of the binary and known good; a failure would only leave text out of PNG figures.
        let _ = register_font(FAMILY, FontStyle::Normal, FONT);
    });
}

/// A line per series, with `(x, y)` points.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// What a figure draws.
#[derive(Debug, Clone, PartialEq)]
pub enum Chart {
    /// Each band's mean as a line over rounds, its min–max range shaded behind it.
    Bands(Vec<Band>),
    /// Bins over rounds: a rectangle per (round, bin), its colour the bin's count.
    Heat(Vec<HeatCell>),
    /// Series stacked over rounds, each a filled band on the ones before it; `outline` is drawn on top as a line
    /// (the expected ranks of a coverage figure).
    Stacked { stack: Stack, outline: Option<Line> },
    /// Plain lines.
    Lines(Vec<Line>),
}

/// One figure of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// How `--figure` names it: `<kind>:<stream>[:<part>]`.
    pub id: String,
    pub title: String,
    /// The axes' labels, with units.
    pub x_label: String,
    pub y_label: String,
    pub chart: Chart,
}

impl Figure {
    /// The figure as an SVG document.
    pub fn svg(&self) -> anyhow::Result<String> {
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
            self.draw(&root)?;
            root.present().map_err(|e| anyhow!("{e}"))?;
        }
        Ok(out)
    }

    /// The figure as a PNG file at `path`.
    pub fn png(&self, path: &Path) -> anyhow::Result<()> {
        let root = BitMapBackend::new(path, SIZE).into_drawing_area();
        self.draw(&root)?;
        root.present()
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("cannot write {}", path.display()))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()> {
        fonts();
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing {}: {e}", self.id);
        root.fill(&WHITE).map_err(err)?;
        match &self.chart {
            Chart::Bands(bands) => self.draw_bands(root, bands).map_err(err),
            Chart::Heat(cells) => self.draw_heat(root, cells).map_err(err),
            Chart::Stacked { stack, outline } => {
                self.draw_stacked(root, stack, outline.as_ref()).map_err(err)
            }
            Chart::Lines(lines) => self.draw_lines(root, lines).map_err(err),
        }
    }

    fn draw_bands<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        bands: &[Band],
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let xs = bands.iter().flat_map(|b| b.points.iter().map(|p| p.round as f64));
        let ys = bands.iter().flat_map(|b| b.points.iter().map(|p| p.max));
        // From the least rank's value, not from 0, so that the spread and the drift show.
        let least = bands
            .iter()
            .flat_map(|b| b.points.iter().map(|p| p.min))
            .filter(|v| v.is_finite())
            .fold(f64::INFINITY, f64::min);
        let floor = if least.is_finite() { least } else { 0.0 };
        let mut chart = self.axes(root, x_range(xs), y_range(ys, floor))?;
        // Rounds without a value (none of their ranks delivered) are a gap in the line, not a straight stretch.
        for (i, band) in bands.iter().enumerate() {
            let c = colour(i);
            for run in consecutive_rounds(&band.points) {
                let mut outline: Vec<(f64, f64)> = run.iter().map(|p| (p.round as f64, p.max)).collect();
                outline.extend(run.iter().rev().map(|p| (p.round as f64, p.min)));
                chart.draw_series(std::iter::once(Polygon::new(outline, c.mix(0.15))))?;
            }
        }
        for (i, band) in bands.iter().enumerate() {
            let c = colour(i);
            for (k, run) in consecutive_rounds(&band.points).into_iter().enumerate() {
                let points = run.iter().map(|p| (p.round as f64, p.mean));
                let series = chart.draw_series(LineSeries::new(points, c.stroke_width(2)))?;
                if k == 0 {
                    series
                        .label(band.label.clone())
                        .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 14, y + 4)], c.filled()));
                }
            }
        }
        legend(&mut chart)
    }

    fn draw_heat<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        cells: &[HeatCell],
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let (plot, scale) = root.split_horizontally(SIZE.0 - 90);
        let x = x_range(
            cells
                .iter()
                .flat_map(|c| [c.round as f64, (c.round + c.rounds - 1) as f64]),
        );
        let x = (x.start - 0.5)..(x.end + 0.5);
        let lo = cells.iter().map(|c| c.lo).fold(f64::INFINITY, f64::min);
        let hi = cells.iter().map(|c| c.hi).fold(f64::NEG_INFINITY, f64::max);
        let (lo, hi) = if lo.is_finite() && hi > lo {
            (lo, hi)
        } else if lo.is_finite() {
            (lo - 0.5, lo + 0.5)
        } else {
            (0.0, 1.0)
        };
        // A bin of zero width (every value equal) is drawn as a band of 1% of the axis.
        let thin = (hi - lo) * 0.005;
        let most = cells.iter().map(|c| c.count).max().unwrap_or(0).max(1);
        let mut chart = self.axes(&plot, x, lo - thin..hi + thin)?;
        chart.draw_series(cells.iter().map(|c| {
            let (x0, x1) = (c.round as f64 - 0.5, (c.round + c.rounds) as f64 - 0.5);
            let (y0, y1) = if c.hi > c.lo {
                (c.lo, c.hi)
            } else {
                (c.lo - thin, c.lo + thin)
            };
            Rectangle::new([(x0, y0), (x1, y1)], heat(c.count as f64 / most as f64).filled())
        }))?;
        // The colour scale: 0 at the bottom, the largest count at the top.
        let steps = 20;
        let (_, h) = scale.dim_in_pixel();
        let (top, bottom) = (40i32, h as i32 - 60);
        let step = (bottom - top) as f64 / steps as f64;
        for i in 0..steps {
            let y1 = bottom - (i as f64 * step) as i32;
            let y0 = bottom - ((i + 1) as f64 * step) as i32;
            scale.draw(&Rectangle::new(
                [(10, y0), (30, y1)],
                heat(i as f64 / (steps - 1) as f64).filled(),
            ))?;
        }
        let text = (FAMILY, 12).into_font();
        scale.draw_text(&most.to_string(), &text.color(&BLACK), (34, top - 6))?;
        scale.draw_text("0", &text.color(&BLACK), (34, bottom - 10))?;
        scale.draw_text("ranks", &text.color(&BLACK), (4, top - 28))?;
        Ok(())
    }

    fn draw_stacked<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        stack: &Stack,
        outline: Option<&Line>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let xs: Vec<f64> = stack.rounds.iter().map(|&r| r as f64).collect();
        let tops = stack.totals();
        let outline_ys = outline.into_iter().flat_map(|l| l.points.iter().map(|p| p.1));
        let y = y_range(tops.iter().copied().chain(outline_ys), 0.0);
        let mut chart = self.axes(root, x_range(xs.iter().copied()), y)?;
        let mut below = vec![0.0; xs.len()];
        for (i, (label, values)) in stack.series.iter().enumerate() {
            let c = colour(i);
            let above: Vec<f64> = below.iter().zip(values).map(|(b, v)| b + v).collect();
            let mut shape: Vec<(f64, f64)> = xs.iter().copied().zip(above.iter().copied()).collect();
            shape.extend(xs.iter().copied().zip(below.iter().copied()).rev());
            chart
                .draw_series(std::iter::once(Polygon::new(shape, c.mix(0.75))))?
                .label(label.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 14, y + 4)], c.mix(0.75).filled()));
            // The top edge as a line, so a thin layer still shows.
            chart.draw_series(LineSeries::new(
                xs.iter().copied().zip(above.iter().copied()),
                c.stroke_width(1),
            ))?;
            below = above;
        }
        if let Some(line) = outline {
            chart
                .draw_series(LineSeries::new(
                    line.points.iter().copied(),
                    BLACK.stroke_width(2),
                ))?
                .label(line.label.clone())
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], BLACK.stroke_width(2)));
        }
        legend(&mut chart)
    }

    fn draw_lines<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        lines: &[Line],
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
        let ys = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1));
        let mut chart = self.axes(root, x_range(xs), y_range(ys, 0.0))?;
        for (i, line) in lines.iter().enumerate() {
            let c = colour(i);
            chart
                .draw_series(LineSeries::new(line.points.iter().copied(), c.stroke_width(2)))?
                .label(line.label.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 14, y + 4)], c.filled()));
        }
        legend(&mut chart)
    }

    /// A chart with the figure's title and labelled axes over `x` and `y`.
    fn axes<'a, DB: DrawingBackend>(
        &self,
        root: &'a DrawingArea<DB, Shift>,
        x: std::ops::Range<f64>,
        y: std::ops::Range<f64>,
    ) -> Result<Chart2d<'a, DB>, DrawingAreaErrorKind<DB::ErrorType>> {
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, (FAMILY, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x, y)?;
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .label_style((FAMILY, 12))
            .axis_desc_style((FAMILY, 14))
            .x_label_formatter(&|v| short(*v))
            .y_label_formatter(&|v| short(*v))
            .draw()?;
        Ok(chart)
    }
}

type Chart2d<'a, DB> = ChartContext<
    'a,
    DB,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart2d<'a, DB>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FAMILY, 12))
        .draw()
}

/// The x axis over `xs`: their range, widened to 1 when it is a single value.
/// `points` cut where rounds are missing: each piece's rounds follow one another.
pub fn consecutive_rounds(points: &[super::data::BandPoint]) -> Vec<&[super::data::BandPoint]> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=points.len() {
        if i == points.len() || points[i].round != points[i - 1].round + 1 {
            if i > start {
                runs.push(&points[start..i]);
            }
            start = i;
        }
    }
    runs
}

pub fn x_range(xs: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = xs
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        0.0..1.0
    } else if hi > lo {
        lo..hi
    } else {
        lo..lo + 1.0
    }
}

/// The y axis over `ys`, from `floor` (or the least value if lower) to 5% above the largest.
pub fn y_range(ys: impl Iterator<Item = f64>, floor: f64) -> std::ops::Range<f64> {
    let (lo, hi) = ys
        .filter(|v| v.is_finite())
        .fold((floor, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !hi.is_finite() || hi <= lo {
        lo..lo + 1.0
    } else {
        lo..hi + (hi - lo) * 0.05
    }
}

/// A tick label: integers as such, large values with k/M/G, small ones with 3 significant digits.
pub fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v.fract() == 0.0 || a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    } else {
        format!("{v:.3}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    }
}

/// A heat map colour for `t` from 0 (empty: almost white) to 1 (the fullest bin: dark blue), through yellow and
/// green (a viridis-like ramp, read in grey too).
pub fn heat(t: f64) -> RGBColor {
    const STOPS: [(f64, (f64, f64, f64)); 5] = [
        (0.0, (247.0, 247.0, 240.0)),
        (0.25, (253.0, 231.0, 37.0)),
        (0.5, (94.0, 201.0, 98.0)),
        (0.75, (33.0, 145.0, 140.0)),
        (1.0, (59.0, 28.0, 140.0)),
    ];
    let t = if t.is_finite() { t.clamp(0.0, 1.0) } else { 0.0 };
    let i = STOPS
        .iter()
        .rposition(|(at, _)| *at <= t)
        .unwrap_or(0)
        .min(STOPS.len() - 2);
    let ((a, ca), (b, cb)) = (STOPS[i], STOPS[i + 1]);
    let f = (t - a) / (b - a);
    let mix = |x: f64, y: f64| (x + (y - x) * f).round() as u8;
    RGBColor(mix(ca.0, cb.0), mix(ca.1, cb.1), mix(ca.2, cb.2))
}

#[cfg(test)]
mod gap_tests {
    use super::super::data::BandPoint;
    use super::*;

    #[test]
    fn a_band_is_cut_where_rounds_are_missing() {
        let at = |round| BandPoint {
            round,
            mean: 1.0,
            min: 0.0,
            max: 2.0,
        };
        let points: Vec<BandPoint> = [0, 1, 2, 6, 7, 9].into_iter().map(at).collect();
        let runs: Vec<Vec<u64>> = consecutive_rounds(&points)
            .iter()
            .map(|r| r.iter().map(|p| p.round).collect())
            .collect();
        assert_eq!(runs, vec![vec![0, 1, 2], vec![6, 7], vec![9]]);
        assert!(consecutive_rounds(&[]).is_empty());
        // Drawn, the gap is two lines, not one across it.
        let fig = Figure {
            id: "stats:s".into(),
            title: "t".into(),
            x_label: "round".into(),
            y_label: "us".into(),
            chart: Chart::Bands(vec![super::super::data::Band {
                label: "work".into(),
                points,
            }]),
        };
        let svg = fig.svg().unwrap();
        let lines = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains("stroke-width=\"2\""));
        assert_eq!(lines.count(), 3, "{svg}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::data::BandPoint;

    #[test]
    fn axes_widen_a_single_value_and_start_at_the_floor() {
        assert_eq!(x_range([3.0, 3.0].into_iter()), 3.0..4.0);
        assert_eq!(x_range(std::iter::empty()), 0.0..1.0);
        assert_eq!(x_range([5.0, 1.0, f64::NAN].into_iter()), 1.0..5.0);
        assert_eq!(y_range([10.0, 20.0].into_iter(), 0.0), 0.0..21.0);
        assert_eq!(y_range([-10.0].into_iter(), 0.0), -10.0..-9.0);
        assert_eq!(y_range(std::iter::empty(), 0.0), 0.0..1.0);
    }

    #[test]
    fn tick_labels_are_short() {
        assert_eq!(short(12.0), "12");
        assert_eq!(short(1.5), "1.5");
        assert_eq!(short(0.125), "0.125");
        assert_eq!(short(25_000.0), "25k");
        assert_eq!(short(3_400_000.0), "3.4M");
    }

    #[test]
    fn the_heat_ramp_runs_from_near_white_to_dark() {
        assert_eq!(heat(0.0), RGBColor(247, 247, 240));
        assert_eq!(heat(1.0), RGBColor(59, 28, 140));
        assert_eq!(heat(2.0), heat(1.0));
        assert_eq!(heat(f64::NAN), heat(0.0));
        let brightness = |c: RGBColor| u32::from(c.0) + u32::from(c.1) + u32::from(c.2);
        assert!(brightness(heat(0.9)) < brightness(heat(0.1)));
    }

    fn band_figure() -> Figure {
        let points = (0..50)
            .map(|r| BandPoint {
                round: r,
                mean: (r % 7) as f64,
                min: 0.0,
                max: 2.0 * r as f64,
            })
            .collect();
        Figure {
            id: "stats:s".into(),
            title: "Top events".into(),
            x_label: "round".into(),
            y_label: "exclusive time (µs)".into(),
            chart: Chart::Bands(vec![Band {
                label: "MPI_Send".into(),
                points,
            }]),
        }
    }

    #[test]
    fn a_band_figure_draws_its_line_band_labels_and_legend_as_svg() {
        let svg = band_figure().svg().unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        let line = svg
            .split("<polyline")
            .skip(1)
            .map(|p| p.split("points=\"").nth(1).unwrap().split('"').next().unwrap())
            .find(|pts| pts.split_whitespace().count() == 50);
        assert!(line.is_some(), "no polyline of 50 points");
        assert!(svg.contains("<polygon"), "no band");
        for text in ["Top events", "MPI_Send", "exclusive time (µs)", "round"] {
            assert!(svg.contains(text), "{text} missing");
        }
    }

    #[test]
    fn a_heat_figure_draws_a_rectangle_per_cell_and_a_png_has_pixels() {
        let cells: Vec<HeatCell> = (0..10)
            .flat_map(|r| {
                (0u32..4).map(move |b| HeatCell {
                    round: r,
                    rounds: 1,
                    lo: f64::from(b),
                    hi: f64::from(b + 1),
                    count: u64::from(b),
                })
            })
            .collect();
        let fig = Figure {
            id: "histogram:h:x".into(),
            title: "x".into(),
            x_label: "round".into(),
            y_label: "µs".into(),
            chart: Chart::Heat(cells),
        };
        let svg = fig.svg().unwrap();
        // 40 cells, 20 steps of the colour scale, the background.
        assert!(
            svg.matches("<rect").count() >= 60,
            "{}",
            svg.matches("<rect").count()
        );
        let path = std::env::temp_dir().join(format!("canopy-heat-{}.png", std::process::id()));
        fig.png(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 2000, "{}", bytes.len());
    }
}
