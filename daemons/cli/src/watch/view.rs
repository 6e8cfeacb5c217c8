//! The two live views of a utilization stream: ten seconds as 100 stacked bars of 100 ms that scroll left,
//! and the latest 250 ms as 1 ms bars; each with a y axis of 0-100% and a legend of the activities' shares.

use std::collections::HashMap;

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Widget;

use super::utilization::{Bar, History, OTHER, Shares, UNTRACKED, percent};

/// Which view is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Ten seconds, 100 bars of 100 ms.
    #[default]
    Stacked,
    /// The latest 250 ms, 250 bars of 1 ms (of the stream's bins).
    HighRes,
}

impl Mode {
    pub fn toggled(self) -> Mode {
        match self {
            Mode::Stacked => Mode::HighRes,
            Mode::HighRes => Mode::Stacked,
        }
    }
}

/// Bars in the stacked view and the time each covers.
pub const STACKED_BARS: usize = 100;
pub const STACKED_BAR_US: u64 = 100_000;
/// Bars in the high-resolution view (one bin each).
pub const HIGHRES_BARS: usize = 250;

/// The colours of the activities, given in order of first appearance; "other" and the untracked time have
/// their own.
const PALETTE: [Color; 12] = [
    Color::Blue,
    Color::Red,
    Color::Green,
    Color::Yellow,
    Color::Magenta,
    Color::Cyan,
    Color::LightBlue,
    Color::LightRed,
    Color::LightGreen,
    Color::LightYellow,
    Color::LightMagenta,
    Color::LightCyan,
];
pub const OTHER_COLOUR: Color = Color::Gray;
pub const UNTRACKED_COLOUR: Color = Color::DarkGray;

/// An activity's colour: stable for as long as the history lives.
pub fn colour(h: &History, id: u64) -> Color {
    if id == OTHER {
        OTHER_COLOUR
    } else {
        PALETTE[h.slot(id) % PALETTE.len()]
    }
}

/// Columns of the y axis ("100%" and its line).
pub const AXIS: u16 = 5;
/// The narrowest legend beside the chart.
const LEGEND_MIN: u16 = 30;

/// How the chart is laid out in an area: where the bars go, how many columns a bar takes (0: two bars per
/// column, with half blocks), how many panels the bars are cut into, and where the legend goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Each panel's bars (the columns from the axis on, the time row under them included).
    pub panels: Vec<Rect>,
    pub bars_per_panel: usize,
    pub cols_per_bar: u16,
    pub legend: Rect,
    /// The legend is beside the chart (one entry a line), not under it.
    pub beside: bool,
}

impl Layout {
    /// The chart's layout for `n` bars in `area` with a legend of `entries` entries; at most `max_panels`.
    pub fn new(area: Rect, n: usize, entries: usize, max_panels: usize) -> Layout {
        let avail = area.width.saturating_sub(AXIS);
        for p in 1..=max_panels.max(1) {
            let m = n.div_ceil(p);
            for right in [true, false] {
                let w = if right {
                    avail.saturating_sub(LEGEND_MIN + 1)
                } else {
                    avail
                } as usize;
                let (cols, chart_w) = if w >= m {
                    let k = (w / m).min(4);
                    (k as u16, m * k)
                } else if w >= m.div_ceil(2) {
                    (0, m.div_ceil(2))
                } else {
                    continue;
                };
                return Self::place(area, n, p, cols, chart_w as u16, right, entries);
            }
        }
        // Too narrow for every bar: as many of the newest as fit, two to a column.
        Self::place(area, n, 1, 0, avail, false, entries)
    }

    fn place(area: Rect, n: usize, p: usize, cols: u16, chart_w: u16, right: bool, entries: usize) -> Layout {
        let (chart, legend) = if right {
            let chart = Rect::new(area.x, area.y, AXIS + chart_w, area.height);
            let lx = chart.right() + 1;
            (
                chart,
                Rect::new(lx, area.y, area.right().saturating_sub(lx), area.height),
            )
        } else {
            let per_row = (area.width / LEGEND_MIN).max(1) as usize;
            let rows = (entries.div_ceil(per_row) as u16).min(area.height / 3);
            let chart = Rect::new(
                area.x,
                area.y,
                (AXIS + chart_w).min(area.width),
                area.height - rows,
            );
            (chart, Rect::new(area.x, chart.bottom(), area.width, rows))
        };
        let ph = chart.height / p as u16;
        let panels = (0..p as u16)
            .map(|i| Rect::new(chart.x, chart.y + i * ph, chart.width, ph))
            .collect();
        Layout {
            panels,
            bars_per_panel: n.div_ceil(p),
            cols_per_bar: cols,
            legend,
            beside: right,
        }
    }
}

/// The colour of a bar at a height (0 at the bottom, 1 at the top); `None` where the bar has no data.
fn colour_at(h: &History, bar: &Option<Bar>, y: f64) -> Option<Color> {
    let bar = bar.as_ref()?;
    let mut top = 0.0;
    for (id, f) in &bar.parts {
        top += f;
        if y < top {
            return Some(colour(h, *id));
        }
    }
    Some(UNTRACKED_COLOUR)
}

/// Draws `bars` into `area` (the y axis, the bars, a time row at the bottom labelled by `times`).
fn draw_bars(h: &History, bars: &[Option<Bar>], cols: u16, area: Rect, times: [&str; 3], buf: &mut Buffer) {
    if area.height < 3 || area.width <= AXIS {
        return;
    }
    let rows = area.height - 1;
    let x0 = area.x + AXIS;
    let width = area.width - AXIS;
    let axis = Style::new().fg(Color::Gray);
    for r in 0..rows {
        let label = if r == 0 {
            "100%"
        } else if r == rows / 2 && rows >= 4 {
            " 50%"
        } else if r == rows - 1 {
            "  0%"
        } else {
            ""
        };
        buf.set_string(area.x, area.y + r, format!("{label:>4}"), axis);
        buf.set_string(area.x + 4, area.y + r, "│", axis);
    }
    // The bars shown: the newest that fit.
    // No columns a bar: two bars to a column.
    let fit = usize::from(width.checked_div(cols).unwrap_or(width.saturating_mul(2)));
    let shown = &bars[bars.len().saturating_sub(fit)..];
    for r in 0..rows {
        let y = (f64::from(rows - r) - 0.5) / f64::from(rows);
        let row = area.y + r;
        if cols == 0 {
            for (i, pair) in shown.chunks(2).enumerate() {
                let x = x0 + i as u16;
                let left = colour_at(h, &pair[0], y);
                let right = pair.get(1).and_then(|b| colour_at(h, b, y));
                let (symbol, style) = match (left, right) {
                    (Some(l), Some(r)) => ("▌", Style::new().fg(l).bg(r)),
                    (Some(l), None) => ("▌", Style::new().fg(l)),
                    (None, Some(r)) => ("▐", Style::new().fg(r)),
                    (None, None) => continue,
                };
                if let Some(cell) = buf.cell_mut((x, row)) {
                    cell.set_symbol(symbol).set_style(style);
                }
            }
        } else {
            for (i, bar) in shown.iter().enumerate() {
                let Some(c) = colour_at(h, bar, y) else { continue };
                for k in 0..cols {
                    if let Some(cell) = buf.cell_mut((x0 + i as u16 * cols + k, row)) {
                        cell.set_symbol("█").set_style(Style::new().fg(c));
                    }
                }
            }
        }
    }
    let used = if cols == 0 {
        shown.len().div_ceil(2) as u16
    } else {
        shown.len() as u16 * cols
    };
    let t = area.y + rows;
    buf.set_string(x0, t, times[0], axis);
    let mid = times[1].len() as u16;
    if used > mid * 3 {
        buf.set_string(x0 + used / 2 - mid / 2, t, times[1], axis);
    }
    let end = times[2].len() as u16;
    buf.set_string((x0 + used).saturating_sub(end), t, times[2], axis);
}

/// Draws the legend: a swatch, the name and the share over what the view shows, largest first, "other" and
/// the untracked time last.
fn draw_legend(
    h: &History,
    names: &HashMap<u64, String>,
    shares: &Shares,
    over: &str,
    area: Rect,
    beside: bool,
    buf: &mut Buffer,
) {
    if area.height == 0 || area.width < 8 {
        return;
    }
    let mut entries: Vec<(Color, String, f64)> = shares
        .activities
        .iter()
        .filter(|a| a.0 != OTHER)
        .map(|&(id, f)| (colour(h, id), super::utilization::display_name(h, names, id), f))
        .collect();
    if let Some(&(id, f)) = shares.activities.iter().find(|a| a.0 == OTHER) {
        entries.push((OTHER_COLOUR, super::utilization::display_name(h, names, id), f));
    }
    if shares.bins > 0 {
        entries.push((UNTRACKED_COLOUR, UNTRACKED.to_string(), shares.untracked));
    }
    let tall = beside && area.height > 2;
    let (per_row, first_row) = if tall {
        // Beside the chart: a heading, then one entry a line.
        buf.set_line(
            area.x,
            area.y,
            &Line::styled(
                format!("share over {over}"),
                Style::new().add_modifier(Modifier::BOLD),
            ),
            area.width,
        );
        (1usize, 1u16)
    } else {
        ((area.width / LEGEND_MIN).max(1) as usize, 0u16)
    };
    let slots = usize::from(area.height - first_row) * per_row;
    let more = entries.len().saturating_sub(slots);
    let cell_w = if per_row == 1 { area.width } else { LEGEND_MIN };
    for (i, (c, name, f)) in entries.iter().enumerate() {
        if more > 0 && i + 1 == slots {
            let rest: f64 = entries[i..entries.len() - 1].iter().map(|e| e.2).sum();
            let (x, y) = (
                area.x + (i % per_row) as u16 * cell_w,
                area.y + first_row + (i / per_row) as u16,
            );
            let text = format!("+{} more {}", entries.len() - i, percent(rest));
            buf.set_line(x, y, &Line::raw(text), cell_w);
            break;
        }
        let (x, y) = (
            area.x + (i % per_row) as u16 * cell_w,
            area.y + first_row + (i / per_row) as u16,
        );
        let pct = percent(*f);
        // Swatch, space, name, space, a six-column percentage and a column between entries.
        let name_w = usize::from(cell_w).saturating_sub(2 + 1 + 1 + 6 + 1);
        let name: String = name.chars().take(name_w).collect();
        let line = Line::from(vec![
            Span::styled("██", Style::new().fg(*c)),
            Span::raw(format!(" {name:<name_w$} {pct:>6}")),
        ]);
        buf.set_line(x, y, &line, cell_w.saturating_sub(1));
    }
}

/// A utilization stream drawn in one of its views, under a header line.
pub struct UtilView<'a> {
    pub history: &'a History,
    pub names: &'a HashMap<u64, String>,
    pub mode: Mode,
    /// The stream, its round and its coverage.
    pub header: String,
    /// The keys, after the header.
    pub keys: &'a str,
}

impl Widget for UtilView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.height < 2 {
            return;
        }
        let h = self.history;
        let view = match self.mode {
            Mode::Stacked => "10 s, 100 ms bars",
            Mode::HighRes => "250 ms, 1 ms bars",
        };
        let header = Line::from(vec![
            Span::styled(self.header, Style::new().add_modifier(Modifier::BOLD)),
            Span::raw(format!("  {view}  ")),
            Span::styled(self.keys, Style::new().fg(Color::Gray)),
        ]);
        buf.set_line(area.x, area.y, &header, area.width);
        let body = Rect::new(area.x, area.y + 1, area.width, area.height - 1);
        if h.len() == 0 {
            buf.set_string(body.x, body.y, "waiting for the first period", Style::new());
            return;
        }
        let (bars, shares, over, max_panels) = match self.mode {
            Mode::Stacked => (h.bars(STACKED_BARS, STACKED_BAR_US), h.window_shares(), "10 s", 1),
            Mode::HighRes => {
                let bin = u64::from(h.bin_us().max(1));
                let end = h.newest_end();
                let from = end.saturating_sub(HIGHRES_BARS as u64 * bin);
                (h.bars(HIGHRES_BARS, bin), h.shares(from, end), "250 ms", 4)
            }
        };
        let entries = shares.activities.len() + 1;
        let layout = Layout::new(body, bars.len(), entries, max_panels);
        let p = layout.panels.len();
        for (i, (panel, chunk)) in layout
            .panels
            .iter()
            .zip(bars.chunks(layout.bars_per_panel))
            .enumerate()
        {
            let times = match self.mode {
                Mode::Stacked => ["-10 s", "-5 s", "newest"],
                Mode::HighRes => {
                    let bin_ms = f64::from(h.bin_us()) / 1000.0;
                    let ago = |k: usize| (bars.len() - k) as f64 * bin_ms;
                    let first = i * layout.bars_per_panel;
                    let last = first + chunk.len();
                    let (a, m, b) = (ago(first), ago((first + last) / 2), ago(last));
                    let a = format!("-{a:.0} ms");
                    let m = format!("-{m:.0} ms");
                    let b = if i + 1 == p {
                        "newest".to_string()
                    } else {
                        format!("-{b:.0} ms")
                    };
                    draw_bars(h, chunk, layout.cols_per_bar, *panel, [&a, &m, &b], buf);
                    continue;
                }
            };
            draw_bars(h, chunk, layout.cols_per_bar, *panel, times, buf);
        }
        draw_legend(h, self.names, &shares, over, layout.legend, layout.beside, buf);
    }
}

#[cfg(test)]
mod tests {
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    use super::*;
    use crate::watch::utilization::tests::result;

    const T0: u64 = 1_700_000_000_000;

    fn draw(h: &History, mode: Mode, w: u16, ht: u16) -> Buffer {
        let mut term = Terminal::new(TestBackend::new(w, ht)).unwrap();
        let names = HashMap::new();
        term.draw(|f| {
            f.render_widget(
                UtilView {
                    history: h,
                    names: &names,
                    mode,
                    header: "util [utilization] round 4".into(),
                    keys: "h: view  Tab: stream  q: quit",
                },
                f.area(),
            )
        })
        .unwrap();
        term.backend().buffer().clone()
    }

    fn text(buf: &Buffer) -> Vec<String> {
        (0..buf.area.height)
            .map(|y| (0..buf.area.width).map(|x| buf[(x, y)].symbol()).collect())
            .collect()
    }

    /// Five seconds of A at 50% and B at 20%, then one second of A alone at 100%.
    fn history() -> History {
        let mut h = History::default();
        for s in 0..5 {
            h.push(&result(
                T0 + s * 1000,
                1000,
                &[(7, "MPI_Allreduce", 125), (9, "MPI_Waitall", 50)],
            ))
            .unwrap();
        }
        h.push(&result(T0 + 5000, 1000, &[(7, "MPI_Allreduce", 250)]))
            .unwrap();
        h
    }

    /// The colours down column `x` of the chart, top first, over `rows` rows from row 1.
    fn column(buf: &Buffer, x: u16, rows: u16, left: bool) -> Vec<Color> {
        (1..=rows)
            .map(|y| {
                let c = &buf[(x, y)];
                if left || c.symbol() == "▐" { c.fg } else { c.bg }
            })
            .collect()
    }

    #[test]
    fn the_stacked_view_fits_80x24_with_two_bars_a_column() {
        let h = history();
        let buf = draw(&h, Mode::Stacked, 80, 24);
        let lines = text(&buf);
        let layout = Layout::new(Rect::new(0, 1, 80, 23), STACKED_BARS, 4, 1);
        assert_eq!(layout.cols_per_bar, 0, "{layout:?}");
        let chart = layout.panels[0];
        assert_eq!(chart.width, AXIS + 50);
        let rows = chart.height - 1;
        // 6 s of data in a 10 s window: the first 40 bars (20 columns) empty, the rest drawn.
        let x0 = AXIS;
        for x in x0..x0 + 20 {
            assert!(
                (1..=rows).all(|y| buf[(x, y)].symbol() == " "),
                "column {x}:\n{}",
                lines.join("\n")
            );
        }
        for x in x0 + 20..x0 + 50 {
            assert!(
                (1..=rows).all(|y| buf[(x, y)].symbol() == "▌"),
                "column {x}:\n{}",
                lines.join("\n")
            );
        }
        // The stacking of a bar of the first five seconds: A (blue) below B (red) below the untracked time.
        let a = colour(&h, 7);
        let b = colour(&h, 9);
        assert_ne!(a, b);
        let col = column(&buf, x0 + 30, rows, true);
        let bottom = col.iter().rev().take_while(|c| **c == a).count() as f64 / f64::from(rows);
        assert!((bottom - 0.5).abs() <= 1.0 / f64::from(rows), "{col:?}");
        assert!(col.contains(&b) && col[0] == UNTRACKED_COLOUR, "{col:?}");
        let order: Vec<Color> = col.iter().rev().fold(Vec::new(), |mut v, c| {
            if v.last() != Some(c) {
                v.push(*c);
            }
            v
        });
        assert_eq!(order, vec![a, b, UNTRACKED_COLOUR]);
        // The last second: A alone, the whole bar.
        let newest = column(&buf, x0 + 49, rows, false);
        assert!(newest.iter().all(|c| *c == a), "{newest:?}");
        // The y axis and the legend.
        assert!(lines[1].starts_with("100%│"));
        assert!(lines[rows as usize].starts_with("  0%│"));
        let all = lines.join("\n");
        for name in ["MPI_Allreduce", "MPI_Waitall", "untracked (compute)"] {
            assert!(all.contains(name), "{name} missing:\n{all}");
        }
        // MPI_Allreduce: (5 s at 50% + 1 s at 100%) / 6 s.
        assert!(all.contains("58.3%"), "{all}");
        assert!(lines.iter().all(|l| l.chars().count() == 80));
    }

    #[test]
    fn the_stacked_view_uses_a_bigger_terminal() {
        let h = history();
        let buf = draw(&h, Mode::Stacked, 200, 60);
        let lines = text(&buf);
        let layout = Layout::new(Rect::new(0, 1, 200, 59), STACKED_BARS, 4, 1);
        assert_eq!(layout.cols_per_bar, 1, "{layout:?}");
        assert!(layout.legend.x > AXIS + 100, "{layout:?}");
        let rows = layout.panels[0].height - 1;
        assert!(rows > 40);
        // Bar k in column AXIS + k: 40 empty, 60 full blocks.
        for x in AXIS..AXIS + 40 {
            assert_eq!(buf[(x, 5)].symbol(), " ");
        }
        for x in AXIS + 40..AXIS + 100 {
            assert!((1..=rows).all(|y| buf[(x, y)].symbol() == "█"), "column {x}");
        }
        assert_eq!(buf[(AXIS + 100, 5)].symbol(), " ");
        let all = lines.join("\n");
        assert!(
            all.contains("MPI_Waitall") && all.contains("share over 10 s"),
            "{all}"
        );
    }

    #[test]
    fn the_high_resolution_view_shows_1_ms_bars() {
        let mut h = History::default();
        // Alternating bins: A whole, then nothing at all.
        let mut r = result(T0, 1000, &[(7, "MPI_Allreduce", 250)]);
        for k in (1..1000).step_by(2) {
            r.share[k] = 0;
        }
        h.push(&r).unwrap();
        for (w, ht) in [(80u16, 24u16), (200, 60)] {
            let buf = draw(&h, Mode::HighRes, w, ht);
            let lines = text(&buf);
            let all = lines.join("\n");
            assert!(
                all.contains("250 ms, 1 ms bars") && all.contains("MPI_Allreduce"),
                "{all}"
            );
            let layout = Layout::new(Rect::new(0, 1, w, ht - 1), HIGHRES_BARS, 3, 4);
            assert_eq!(layout.cols_per_bar, 0);
            let bars: usize = layout.panels.len() * layout.bars_per_panel;
            assert!(bars >= HIGHRES_BARS);
            for panel in &layout.panels {
                // One bin in two is A, the next is untracked: each column's left half A, its right half not.
                let x = AXIS + 10;
                // (A panel may begin on an odd bin: then the halves swap.)
                let c = &buf[(x, panel.y + 1)];
                assert_eq!(c.symbol(), "▌", "{all}");
                let mut halves = [c.fg, c.bg];
                halves.sort_by_key(|c| format!("{c:?}"));
                let mut want = [colour(&h, 7), UNTRACKED_COLOUR];
                want.sort_by_key(|c| format!("{c:?}"));
                assert_eq!(halves, want, "{all}");
            }
            assert!(lines.iter().all(|l| l.chars().count() == usize::from(w)));
        }
        let small = Layout::new(Rect::new(0, 1, 80, 23), HIGHRES_BARS, 3, 4);
        assert_eq!(small.panels.len(), 2, "{small:?}");
        let big = Layout::new(Rect::new(0, 1, 200, 59), HIGHRES_BARS, 3, 4);
        assert_eq!(big.panels.len(), 1, "{big:?}");
    }

    #[test]
    fn an_empty_history_says_it_waits() {
        let h = History::default();
        let all = text(&draw(&h, Mode::Stacked, 80, 24)).join("\n");
        assert!(all.contains("waiting for the first period"));
    }
}
