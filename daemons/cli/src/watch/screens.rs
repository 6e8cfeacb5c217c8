//! The full-screen view's state: each stream's screen, the one shown, what the keys chose, and how it draws.

use std::collections::{BTreeMap, HashMap};

use tokio::time::Instant;

use canopy_proto::filters::known::{Known, KnownResult};
use canopy_proto::filters::v1::{ClassResult, EventStats, Histogram, Metric, UtilizationResult};
use canopy_proto::v1::RoundUpdate;
use prost::Message;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Sparkline, Widget};

use super::header::{Header, StreamStatus};
use super::spark::{self, Means};
use super::table::{
    SortBy, class_lines, histogram_lines, label, metric_title, metrics_of, several_apps, sorted, stats_lines,
};
use super::utilization::History;
use super::view::{Mode, UtilView};
use crate::fit::{first_shown, truncate};
use crate::keys::Action;
use crate::render::render;

/// The keys, on the help line (`?`).
pub(super) const HELP: &str =
    "Tab/→ next stream  Shift-Tab/← previous  m metric  s sort  h utilization view  q quit";

/// What one stream shows.
pub(super) enum Screen {
    /// A utilization stream's history and its latest round.
    Utilization { history: Box<History>, header: String },
    /// Summaries (a stats or histogram stream): the latest round's, its histograms and the recent means.
    Summaries {
        stats: Vec<EventStats>,
        hists: Vec<Histogram>,
        means: Box<Means>,
    },
    /// A classify stream's latest classes.
    Classes(ClassResult),
    /// Any other stream's latest table, as text.
    Text(String),
}

pub(super) struct Stream {
    pub(super) filter: String,
    pub(super) screen: Screen,
    pub(super) status: StreamStatus,
}

/// Every stream's screen, the one shown, and what the keys chose.
pub(super) struct Screens {
    pub(super) streams: BTreeMap<String, Stream>,
    pub(super) shown: Option<String>,
    pub(super) mode: Mode,
    pub(super) metric: i32,
    pub(super) sort: SortBy,
    pub(super) help: bool,
    pub(super) header: Header,
    pub(super) top: usize,
}

pub(super) fn is_utilization(u: &RoundUpdate) -> bool {
    u.result
        .as_ref()
        .is_some_and(|a| Known::of(&a.type_url) == Some(Known::Utilization))
}

pub(super) fn utilization_of(u: &RoundUpdate) -> Option<UtilizationResult> {
    let any = u.result.as_ref()?;
    UtilizationResult::decode(any.value.as_slice()).ok()
}

pub(super) fn header_of(u: &RoundUpdate) -> String {
    let cov = u.coverage.clone().unwrap_or_default();
    let missed = if u.missed > 0 {
        format!("  (missed {})", u.missed)
    } else {
        String::new()
    };
    format!(
        "{} [{}] round {}  ranks {}/{}{missed}",
        u.stream, u.filter, u.round, cov.covered, cov.expected
    )
}

impl Screens {
    /// The line a watch leaves when the run ended: each stream's last round and coverage, and the store.
    pub(super) fn summary(&self, store: &str) -> String {
        let streams: Vec<String> = self
            .streams
            .iter()
            .map(|(name, s)| {
                format!(
                    "{name} round {} coverage {}/{}",
                    s.status.round, s.status.covered, s.status.expected
                )
            })
            .collect();
        let mut line = "canopy watch: the run ended".to_string();
        if !streams.is_empty() {
            line.push_str(&format!("; {}", streams.join(", ")));
        }
        if !store.is_empty() {
            line.push_str(&format!("; store {store} (canopy report {store})"));
        }
        line
    }

    pub(super) fn new(frontend: &str, top: usize) -> Screens {
        Screens {
            streams: BTreeMap::new(),
            shown: None,
            mode: Mode::default(),
            metric: Metric::Exclusive as i32,
            sort: SortBy::default(),
            help: false,
            header: Header::new(frontend),
            top,
        }
    }

    pub(super) fn update(&mut self, u: &RoundUpdate, names: &HashMap<u64, String>) {
        let at = self.header.started.elapsed().as_secs_f64();
        self.header.missed += u.missed;
        let payload = u.result.as_ref().map(|a| a.value.as_slice()).unwrap_or_default();
        let type_url = u.result.as_ref().map(|a| a.type_url.as_str()).unwrap_or_default();
        let stream = self.streams.entry(u.stream.clone()).or_insert_with(|| Stream {
            filter: u.filter.clone(),
            screen: Screen::Text(String::new()),
            status: StreamStatus::default(),
        });
        let newest = u.round >= stream.status.round;
        stream.status.update(u, at);
        if is_utilization(u) {
            if !matches!(stream.screen, Screen::Utilization { .. }) {
                stream.screen = Screen::Utilization {
                    history: Box::default(),
                    header: String::new(),
                };
            }
            if let Screen::Utilization { history, header } = &mut stream.screen {
                if let Some(r) = utilization_of(u) {
                    // A result that does not hold together is left out; the header still moves on.
                    let _ = history.push(&r);
                }
                *header = header_of(u);
            }
            // A utilization stream takes the screen from a table.
            if !matches!(
                self.shown
                    .as_ref()
                    .and_then(|s| self.streams.get(s))
                    .map(|s| &s.screen),
                Some(Screen::Utilization { .. })
            ) {
                self.shown = Some(u.stream.clone());
            }
            return;
        }
        if newest {
            let (summaries, other) = match KnownResult::decode(type_url, payload) {
                Ok(KnownResult::Stats(r)) => (Some((r.stats, Vec::new())), None),
                Ok(KnownResult::Histogram(r)) => (Some((r.stats, r.histograms)), None),
                other => (None, other.ok()),
            };
            match summaries {
                Some((stats, hists)) => {
                    if !matches!(stream.screen, Screen::Summaries { .. }) {
                        stream.screen = Screen::Summaries {
                            stats: Vec::new(),
                            hists: Vec::new(),
                            means: Box::default(),
                        };
                    }
                    if let Screen::Summaries {
                        stats: s,
                        hists: h,
                        means,
                    } = &mut stream.screen
                    {
                        means.push(&stats);
                        *s = stats;
                        *h = hists;
                    }
                }
                None => {
                    stream.screen = match other {
                        Some(KnownResult::Classes(r)) => Screen::Classes(r),
                        _ => Screen::Text(render(u, names, self.top)),
                    }
                }
            }
        }
        if self.shown.is_none() {
            self.shown = Some(u.stream.clone());
        }
    }

    /// Shows the next stream (or the previous one).
    pub(super) fn cycle(&mut self, back: bool) {
        let keys: Vec<&String> = self.streams.keys().collect();
        if keys.is_empty() {
            return;
        }
        let at = self
            .shown
            .as_ref()
            .and_then(|s| keys.iter().position(|k| *k == s))
            .unwrap_or(0);
        let next = if back {
            (at + keys.len() - 1) % keys.len()
        } else {
            (at + 1) % keys.len()
        };
        self.shown = Some(keys[next].clone());
    }

    /// The metrics `m` cycles through on the shown stream.
    pub(super) fn metrics(&self) -> Vec<i32> {
        match self
            .shown
            .as_ref()
            .and_then(|s| self.streams.get(s))
            .map(|s| &s.screen)
        {
            Some(Screen::Summaries { stats, .. }) => metrics_of(stats),
            _ => Vec::new(),
        }
    }

    /// The metric the tables show: the chosen one, or the first the shown stream has.
    pub(super) fn metric_shown(&self) -> i32 {
        let ms = self.metrics();
        if ms.is_empty() || ms.contains(&self.metric) {
            self.metric
        } else {
            ms[0]
        }
    }

    pub(super) fn next_metric(&mut self) {
        let ms = self.metrics();
        if ms.is_empty() {
            return;
        }
        let at = ms.iter().position(|m| *m == self.metric_shown()).unwrap_or(0);
        self.metric = ms[(at + 1) % ms.len()];
    }

    pub(super) fn act(&mut self, a: Action) {
        match a {
            Action::ToggleView => self.mode = self.mode.toggled(),
            Action::Next => self.cycle(false),
            Action::Previous => self.cycle(true),
            Action::Metric => self.next_metric(),
            Action::Sort => self.sort = self.sort.next(),
            Action::Help => self.help = !self.help,
            Action::Quit | Action::Scroll(_) | Action::Redraw | Action::Nothing => {}
        }
    }

    pub(super) fn draw(&self, frame: &mut ratatui::Frame<'_>, names: &HashMap<u64, String>) {
        let area = frame.area();
        self.render(area, frame.buffer_mut(), names, Instant::now());
    }

    pub(super) fn render(&self, area: Rect, buf: &mut Buffer, names: &HashMap<u64, String>, now: Instant) {
        let shown = self
            .shown
            .as_ref()
            .and_then(|s| self.streams.get(s).map(|st| (s.as_str(), st)));
        let [first, second] = self.header.lines(
            shown.map(|(n, s)| (n, &s.status)),
            now,
            &format!("sort: {}  ?: keys", self.sort.word()),
        );
        let mut y = area.y;
        for line in [first, second] {
            if y < area.bottom() {
                buf.set_line(area.x, y, &line, area.width);
                y += 1;
            }
        }
        // The streams, the shown one highlighted (and on screen: the first ones give way if need be).
        if y < area.bottom() {
            let labels: Vec<(String, bool)> = self
                .streams
                .iter()
                .map(|(name, s)| {
                    (
                        format!(" {name} [{}] ", s.filter),
                        Some(name) == self.shown.as_ref(),
                    )
                })
                .collect();
            let widths: Vec<u16> = labels.iter().map(|(l, _)| l.chars().count() as u16).collect();
            let at = labels.iter().position(|(_, shown)| *shown).unwrap_or(0);
            let first = first_shown(&widths, at, area.width.saturating_sub(1));
            let mut spans = Vec::new();
            if first > 0 {
                spans.push(Span::styled("…", Style::new().fg(Color::Gray)));
            }
            for (label, shown) in labels.into_iter().skip(first) {
                let style = if shown {
                    Style::new().add_modifier(Modifier::REVERSED | Modifier::BOLD)
                } else {
                    Style::new().fg(Color::Gray)
                };
                spans.push(Span::styled(label, style));
            }
            buf.set_line(area.x, y, &Line::from(spans), area.width);
            y += 1;
        }
        if self.help && y < area.bottom() {
            buf.set_line(
                area.x,
                y,
                &Line::styled(HELP, Style::new().fg(Color::Gray)),
                area.width,
            );
            y += 1;
        }
        let body = Rect::new(area.x, y, area.width, area.bottom().saturating_sub(y));
        let Some((_, stream)) = shown else {
            if body.height > 0 {
                buf.set_string(body.x, body.y, "waiting for the first round", Style::new());
            }
            return;
        };
        match &stream.screen {
            Screen::Utilization { history, header } => UtilView {
                history,
                names,
                mode: self.mode,
                header: header.clone(),
                keys: "h: 1 ms/100 ms view",
            }
            .render(body, buf),
            Screen::Summaries { stats, hists, means } => {
                self.summaries(stats, hists, means, names, body, buf)
            }
            Screen::Classes(r) => {
                let mut lines = vec![Line::raw(truncate(
                    &format!(
                        "{} classes by {}, reduction factor {:.2} ({} of profiles -> {})",
                        r.classes.len(),
                        metric_title(r.metric),
                        r.reduction_factor,
                        crate::units::bytes(r.raw_bytes),
                        crate::units::bytes(r.result_bytes)
                    ),
                    usize::from(body.width),
                ))];
                let t = class_lines(r, body.width, self.top);
                lines.push(Line::styled(t.header, Style::new().add_modifier(Modifier::BOLD)));
                lines.extend(t.rows.into_iter().map(Line::raw));
                Paragraph::new(lines).render(body, buf);
            }
            Screen::Text(text) => Paragraph::new(text.as_str()).render(body, buf),
        }
    }

    /// A stream of summaries: the table of the shown metric, the histograms of its top events (a histogram
    /// stream), and sparklines of the top events' means over the recent rounds when there is room.
    pub(super) fn summaries(
        &self,
        stats: &[EventStats],
        hists: &[Histogram],
        means: &Means,
        names: &HashMap<u64, String>,
        body: Rect,
        buf: &mut Buffer,
    ) {
        let metric = self.metric_shown();
        let rows_shown = sorted(stats, metric, self.sort, names);
        let order: Vec<u64> = rows_shown.iter().map(|s| s.id).collect();
        let with_app = several_apps(stats);
        let h = body.height;
        // Three sparklines from 12 rows for the stream, eight from 30.
        let sparks = match h {
            0..12 => 0,
            12..30 => order.len().min(3) as u16,
            _ => order.len().min(8) as u16,
        };
        let with_hists = hists.iter().filter(|x| x.metric == metric).count().min(3) as u16;
        let hist_rows = if h >= 16 { with_hists } else { 0 };
        let reserved = sparks + u16::from(sparks > 0) + hist_rows + u16::from(hist_rows > 0);
        let table_h = h.saturating_sub(reserved);
        let rows = usize::from(table_h.saturating_sub(1)).min(self.top);
        let t = stats_lines(stats, names, metric, self.sort, body.width, rows);
        let mut lines = vec![Line::styled(t.header, Style::new().add_modifier(Modifier::BOLD))];
        if t.rows.is_empty() {
            lines.push(Line::raw("no summaries of this metric in the latest round"));
        }
        lines.extend(t.rows.into_iter().map(Line::raw));
        // The histograms and sparklines follow the table, a row below it.
        let used = (lines.len() as u16 + 1).min(table_h);
        Paragraph::new(lines).render(Rect::new(body.x, body.y, body.width, table_h), buf);
        let mut y = body.y + used;
        if hist_rows > 0 {
            let title = format!(
                "histograms ({}): range, then a character a bin",
                metric_title(metric)
            );
            buf.set_line(
                body.x,
                y,
                &Line::styled(title, Style::new().add_modifier(Modifier::BOLD)),
                body.width,
            );
            y += 1;
            for l in histogram_lines(hists, &order, names, metric, body.width, usize::from(hist_rows)) {
                buf.set_line(body.x, y, &Line::raw(l), body.width);
                y += 1;
            }
        }
        if sparks > 0 {
            let title = format!(
                "mean ({}) over the last {} rounds",
                metric_title(metric),
                spark::SPAN
            );
            buf.set_line(
                body.x,
                y,
                &Line::styled(title, Style::new().add_modifier(Modifier::BOLD)),
                body.width,
            );
            y += 1;
            let label_w = (body.width / 3).clamp(12, 40);
            for s in rows_shown.iter().take(usize::from(sparks)) {
                let mean = s.summary.as_ref().map_or(0.0, |s| s.mean);
                let value = format!(" {mean:.1}");
                let name_w = usize::from(label_w).saturating_sub(value.len() + 1);
                let label = format!(
                    "{:<name_w$}{value:>w$}",
                    truncate(&label(s, names, with_app), name_w),
                    w = value.len()
                );
                buf.set_string(body.x, y, &label, Style::new());
                let data = means.bars(&s.app, s.id, metric);
                let x = body.x + label_w + 1;
                let w = body.right().saturating_sub(x);
                let data = &data[data.len().saturating_sub(usize::from(w))..];
                Sparkline::default()
                    .data(data)
                    .max(spark::TOP)
                    .style(Style::new().fg(Color::Cyan))
                    .render(Rect::new(x, y, w, 1), buf);
                y += 1;
            }
        }
    }
}
