//! `canopy watch`: every stream's results as they arrive. On a terminal, a full-screen view: a header (the
//! front-end, the elapsed time, the shown stream's round, rate and coverage, the tree's troubles), a line of the
//! streams, and the shown stream: utilization as bars (stacked over ten seconds, or 1 ms bars over the latest
//! 250 ms), summaries as a table of the chosen metric with sparklines of the top events' means, histograms as
//! block characters, classes as a table. Piped or with `--plain`, a line per utilization period and the tables as
//! text; with `--json`, the updates as JSON, each with the names of its events.

pub mod header;
pub mod json;
pub mod spark;
pub mod table;
pub mod utilization;
pub mod view;

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal, Write};
use std::time::Duration;

use tokio::time::Instant;

use canopy_proto::filters::known::{Known, KnownResult};
use canopy_proto::filters::v1::{ClassResult, EventStats, Histogram, Metric, UtilizationResult};
use canopy_proto::v1::frontend_client::FrontendClient;
use canopy_proto::v1::{
    EventNamesRequest, ListStreamsRequest, RoundUpdate, SubscribeRequest, TopologyRequest, subscribe_request,
};
use crossterm::event::Event;
use prost::Message;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Sparkline, Widget};
use tonic::transport::Channel;

use crate::client::{Target, connect, json_of, status_error};
use crate::fit::{first_shown, truncate};
use crate::keys::{Action, action_of};
use crate::render::render;
use crate::tui::Tui;
use header::{Header, StreamStatus, Troubles};
use spark::Means;
use table::{
    SortBy, class_lines, histogram_lines, label, metric_title, metrics_of, several_apps, sorted, stats_lines,
};
use utilization::History;
use view::{Mode, UtilView};

#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    /// Only these streams, by name (repeatable).
    #[arg(long = "stream")]
    streams: Vec<String>,
    /// Rows per table; activities per plain utilization line.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Stop after this many updates (0: until interrupted).
    #[arg(long, default_value_t = 0)]
    updates: u64,
    /// Plain text even on a terminal: a line per utilization period, tables as text, no escape codes.
    #[arg(long, conflicts_with = "json")]
    plain: bool,
}

/// The keys, on the help line (`?`).
const HELP: &str = "Tab/→ next stream  Shift-Tab/← previous  m metric  s sort  h utilization view  q quit";

/// What one stream shows.
enum Screen {
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

struct Stream {
    filter: String,
    screen: Screen,
    status: StreamStatus,
}

/// Every stream's screen, the one shown, and what the keys chose.
struct Screens {
    streams: BTreeMap<String, Stream>,
    shown: Option<String>,
    mode: Mode,
    metric: i32,
    sort: SortBy,
    help: bool,
    header: Header,
    top: usize,
}

fn is_utilization(u: &RoundUpdate) -> bool {
    u.result
        .as_ref()
        .is_some_and(|a| Known::of(&a.type_url) == Some(Known::Utilization))
}

fn utilization_of(u: &RoundUpdate) -> Option<UtilizationResult> {
    let any = u.result.as_ref()?;
    UtilizationResult::decode(any.value.as_slice()).ok()
}

fn header_of(u: &RoundUpdate) -> String {
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
    fn summary(&self, store: &str) -> String {
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

    fn new(frontend: &str, top: usize) -> Screens {
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

    fn update(&mut self, u: &RoundUpdate, names: &HashMap<u64, String>) {
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
    fn cycle(&mut self, back: bool) {
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
    fn metrics(&self) -> Vec<i32> {
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
    fn metric_shown(&self) -> i32 {
        let ms = self.metrics();
        if ms.is_empty() || ms.contains(&self.metric) {
            self.metric
        } else {
            ms[0]
        }
    }

    fn next_metric(&mut self) {
        let ms = self.metrics();
        if ms.is_empty() {
            return;
        }
        let at = ms.iter().position(|m| *m == self.metric_shown()).unwrap_or(0);
        self.metric = ms[(at + 1) % ms.len()];
    }

    fn act(&mut self, a: Action) {
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

    fn draw(&self, frame: &mut ratatui::Frame<'_>, names: &HashMap<u64, String>) {
        let area = frame.area();
        self.render(area, frame.buffer_mut(), names, Instant::now());
    }

    fn render(&self, area: Rect, buf: &mut Buffer, names: &HashMap<u64, String>, now: Instant) {
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
    fn summaries(
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

/// The wall clock, in Unix ns.
fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Where a watch starts: `history` rounds below the latest the store holds, so that a run that has ended (or a
/// tree `canopy up --keep` holds) still shows its last results and the sparklines start full; live results
/// follow. From now on when nothing is stored yet.
async fn latest_start(
    api: &mut FrontendClient<Channel>,
    streams: &[String],
    history: u64,
) -> anyhow::Result<Option<subscribe_request::Start>> {
    let listed = api
        .list_streams(ListStreamsRequest {})
        .await
        .map_err(status_error)?
        .into_inner()
        .streams;
    let next = listed
        .iter()
        .filter(|s| streams.is_empty() || streams.contains(&s.name))
        .map(|s| s.next_round)
        .max()
        .unwrap_or(0);
    Ok((next > 0).then(|| subscribe_request::Start::FromRound(next.saturating_sub(history))))
}

/// Every stream's results, live: a full-screen view on a terminal, text otherwise, or JSON.
pub async fn watch(target: Target, args: WatchArgs) -> anyhow::Result<()> {
    let mut api = connect(&target).await?;
    let mut names: HashMap<u64, String> = HashMap::new();
    let terminal = !args.plain && !target.json && std::io::stdout().is_terminal();
    // On a terminal, the sparklines' span of rounds; otherwise the latest round.
    let history = if terminal { spark::SPAN as u64 } else { 1 };
    let req = SubscribeRequest {
        stream_names: args.streams.clone(),
        start: latest_start(&mut api, &args.streams, history).await?,
        ..Default::default()
    };
    let mut updates = api.subscribe(req).await.map_err(status_error)?.into_inner();
    // Said when the run ends, after the front-end is gone.
    let store = api
        .topology(TopologyRequest {})
        .await
        .map(|t| t.into_inner().store_path)
        .unwrap_or_default();
    let mut screens = Screens::new(&target.frontend, args.top);
    let (events_tx, mut events) = tokio::sync::mpsc::channel::<Event>(64);
    // The terminal is taken once the front-end has answered, so that failing to reach it is one plain line.
    let mut tui = if terminal {
        Some(Tui::start(events_tx)?)
    } else {
        None
    };
    if let Some(t) = tui.as_mut() {
        t.terminal.draw(|f| screens.draw(f, &names))?;
    }
    // The view redraws on every update, key and resize; the tick keeps the header's clock and the tree's
    // troubles fresh.
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut seen = 0u64;
    // The round after the newest seen: where a subscription made again after a lost front-end starts.
    let mut next_round = 0u64;
    let mut ended = false;
    loop {
        tokio::select! {
            u = updates.message() => {
                let u = match u {
                    Ok(Some(u)) => u,
                    // The run ended: the front-end closed the subscription. A full-screen watch keeps its
                    // streams' last screens until `q` leaves.
                    Ok(None) => {
                        ended = true;
                        if let Some(t) = tui.as_mut() {
                            screens.header.notice = Some("the run ended: q leaves".into());
                            t.terminal.draw(|f| screens.draw(f, &names))?;
                            // The keys still move between the streams' last screens.
                            while let Some(ev) = events.recv().await {
                                match action_of(&ev) {
                                    Action::Quit => break,
                                    Action::Nothing => continue,
                                    Action::Redraw => t.terminal.autoresize()?,
                                    other => screens.act(other),
                                }
                                t.terminal.draw(|f| screens.draw(f, &names))?;
                            }
                        }
                        break;
                    }
                    Err(status) if lost_front_end(&status) => {
                        let said = status_error(status);
                        let notice = format!("front-end lost ({said}); reconnecting");
                        if tui.is_none() {
                            eprintln!("canopy watch: {notice}");
                        }
                        screens.header.notice = Some("front-end lost: reconnecting".into());
                        if let Some(t) = tui.as_mut() {
                            t.terminal.draw(|f| screens.draw(f, &names))?;
                        }
                        let streams = args.streams.clone();
                        let again = tokio::select! {
                            r = reconnect(&target, &streams, next_round) => Some(r),
                            Some(ev) = quit_key(&mut events) => { let _ = ev; None }
                        };
                        let Some((a, u)) = again else { break };
                        (api, updates) = (a, u);
                        screens.header.notice = None;
                        if tui.is_none() {
                            eprintln!("canopy watch: reconnected to {}, from round {next_round}", target.frontend);
                        }
                        continue;
                    }
                    Err(status) => return Err(status_error(status)),
                };
                next_round = next_round.max(u.round + 1);
                seen += 1;
                if names.len() < 8 || u.missed > 0 || seen.is_multiple_of(50) {
                    let list = api
                        .event_names(EventNamesRequest {})
                        .await
                        .map_err(status_error)?
                        .into_inner();
                    names.extend(list.names.into_iter().map(|n| (n.id, n.name)));
                }
                if target.json {
                    println!("{}", json::with_names(&json_of("canopy.v1.RoundUpdate", &u), &names));
                } else if let Some(t) = tui.as_mut() {
                    screens.update(&u, &names);
                    t.terminal.draw(|f| screens.draw(f, &names))?;
                } else {
                    screens.update(&u, &names);
                    print_plain(&u, &names, args.top);
                }
                if args.updates > 0 && seen >= args.updates {
                    break;
                }
            }
            Some(ev) = events.recv() => {
                let a = action_of(&ev);
                match a {
                    Action::Quit => break,
                    Action::Nothing => continue,
                    Action::Redraw => {
                        if let Some(t) = tui.as_mut() {
                            t.terminal.autoresize()?;
                        }
                    }
                    other => screens.act(other),
                }
                if let Some(t) = tui.as_mut() {
                    t.terminal.draw(|f| screens.draw(f, &names))?;
                }
            }
            _ = tick.tick(), if tui.is_some() => {
                if let Ok(topo) = api.topology(TopologyRequest {}).await {
                    let topo = topo.into_inner();
                    screens.header.troubles = Troubles::of(&topo.nodes);
                    if topo.run_started_unix_ns > 0 {
                        let age = unix_now_ns().saturating_sub(topo.run_started_unix_ns);
                        screens.header.run_age = Some((Duration::from_nanos(age), Instant::now()));
                    }
                }
                if let Some(t) = tui.as_mut() {
                    t.terminal.draw(|f| screens.draw(f, &names))?;
                }
            }
        }
    }
    drop(tui);
    if ended && !target.json {
        println!("{}", screens.summary(&store));
    }
    Ok(())
}

/// Whether a subscription's error means the front-end went away (it died, restarted or the link broke), so a
/// watch should reconnect, rather than refused the call.
fn lost_front_end(status: &tonic::Status) -> bool {
    use tonic::Code::*;
    matches!(
        status.code(),
        Unavailable | Unknown | Internal | Cancelled | Aborted
    )
}

/// Connects again, every second up to every 5, until the front-end answers: a client and a subscription that
/// starts at `from` (the round after the last one seen).
async fn reconnect(
    target: &Target,
    streams: &[String],
    from: u64,
) -> (FrontendClient<Channel>, tonic::Streaming<RoundUpdate>) {
    let mut wait = Duration::from_secs(1);
    loop {
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(5));
        let Ok(mut api) = connect(target).await else {
            continue;
        };
        let req = SubscribeRequest {
            stream_names: streams.to_vec(),
            start: Some(subscribe_request::Start::FromRound(from)),
            ..Default::default()
        };
        if let Ok(updates) = api.subscribe(req).await {
            return (api, updates.into_inner());
        }
    }
}

/// The next key that quits the view (others are dropped while the front-end is away); pending forever without
/// a terminal.
async fn quit_key(events: &mut tokio::sync::mpsc::Receiver<Event>) -> Option<Event> {
    while let Some(ev) = events.recv().await {
        if matches!(action_of(&ev), Action::Quit) {
            return Some(ev);
        }
    }
    std::future::pending().await
}

/// Not a terminal: a line per utilization period, other streams' tables as they come, no escape codes.
fn print_plain(u: &RoundUpdate, names: &HashMap<u64, String>, top: usize) {
    let mut out = std::io::stdout().lock();
    if is_utilization(u) {
        let line = match utilization_of(u) {
            Some(r) => utilization::summary_line(&u.stream, u.round, &r, names, top.min(5)),
            None => format!("{} round {}  undecodable utilization result", u.stream, u.round),
        };
        let _ = writeln!(out, "{line}");
    } else {
        let _ = writeln!(out, "{}", render(u, names, top));
    }
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::filters::v1::{StatsResult, Summary};
    use canopy_proto::v1::Coverage;
    use utilization::tests::result;

    fn any<M: Message>(type_name: &str, m: &M) -> prost_types::Any {
        prost_types::Any {
            type_url: format!("type.googleapis.com/canopy.filters.v1.{type_name}"),
            value: m.encode_to_vec(),
        }
    }

    fn update(stream: &str, round: u64, r: &UtilizationResult) -> RoundUpdate {
        RoundUpdate {
            stream: stream.into(),
            filter: "utilization".into(),
            round,
            result: Some(any("UtilizationResult", r)),
            ..Default::default()
        }
    }

    fn stats_update(round: u64) -> RoundUpdate {
        let row = |id, metric: Metric, mean| EventStats {
            id,
            metric: metric as i32,
            summary: Some(Summary {
                count: 8,
                mean,
                ..Default::default()
            }),
            quantiles: Vec::new(),
            app: String::new(),
        };
        let r = StatsResult {
            stats: vec![
                row(1, Metric::Exclusive, 100.0 + round as f64),
                row(2, Metric::Exclusive, 50.0),
                row(1, Metric::Inclusive, 400.0),
                row(1, Metric::Calls, 3.0),
            ],
            raw_bytes: 0,
        };
        RoundUpdate {
            stream: "a-stats".into(),
            filter: "stats".into(),
            round,
            coverage: Some(Coverage {
                covered: 8,
                expected: 8,
                ..Default::default()
            }),
            result: Some(any("StatsResult", &r)),
            ..Default::default()
        }
    }

    fn screen(s: &Screens, names: &HashMap<u64, String>, w: u16, h: u16) -> Vec<String> {
        let mut buf = Buffer::empty(Rect::new(0, 0, w, h));
        s.render(buf.area, &mut buf, names, s.header.started);
        (0..h)
            .map(|y| (0..w).map(|x| buf[(x, y)].symbol()).collect::<String>())
            .collect()
    }

    #[test]
    fn a_utilization_stream_is_shown_first_and_tab_cycles_the_streams() {
        let mut s = Screens::new("127.0.0.1:7400", 5);
        let names = HashMap::new();
        s.update(&stats_update(0), &names);
        assert_eq!(s.shown.as_deref(), Some("a-stats"));
        let r = result(1_700_000_000_000, 1000, &[(7, "MPI_Allreduce", 100)]);
        s.update(&update("util", 3, &r), &names);
        assert_eq!(s.shown.as_deref(), Some("util"));
        s.cycle(false);
        assert_eq!(s.shown.as_deref(), Some("a-stats"));
        s.cycle(false);
        assert_eq!(s.shown.as_deref(), Some("util"));
        // Another update of the table stream does not take the screen.
        s.update(&stats_update(1), &names);
        assert_eq!(s.shown.as_deref(), Some("util"));
        let lines = screen(&s, &names, 80, 24);
        assert!(lines[0].contains("util: round 3"), "{}", lines.join("\n"));
        assert!(
            lines[3].starts_with("util [utilization] round 3"),
            "{}",
            lines.join("\n")
        );
        s.act(Action::Previous);
        let lines = screen(&s, &names, 80, 24);
        assert!(lines[0].contains("a-stats: round 1"), "{}", lines.join("\n"));
    }

    #[test]
    fn a_stats_stream_shows_names_a_metric_that_m_cycles_and_sparklines_within_80x24() {
        let names: HashMap<u64, String> =
            [(1, "MPI_Allreduce".to_string()), (2, "compute".to_string())].into();
        let mut s = Screens::new("127.0.0.1:7400", 10);
        for round in 0..5 {
            s.update(&stats_update(round), &names);
        }
        for (w, h) in [(80u16, 24u16), (200, 60)] {
            let lines = screen(&s, &names, w, h);
            let all = lines.join("\n");
            assert!(
                lines[0].contains("a-stats: round 4") && lines[0].contains("coverage 8/8"),
                "{all}"
            );
            assert!(lines[2].contains("a-stats [stats]"), "{all}");
            assert!(lines[3].starts_with("event (exclusive us)"), "{all}");
            assert!(
                lines[4].starts_with("MPI_Allreduce") && lines[4].contains("104.0"),
                "{all}"
            );
            assert!(
                all.contains("mean (exclusive us) over the last 60 rounds"),
                "{all}"
            );
            assert!(!all.contains("0000000000000001"), "{all}");
            // Rising means: the sparkline ends in a full block.
            let spark = lines
                .iter()
                .find(|l| l.starts_with("MPI_Allreduce") && l.contains('█'))
                .expect(&all);
            assert!(spark.trim_end().ends_with('█'), "{spark}");
        }
        s.act(Action::Metric);
        let lines = screen(&s, &names, 80, 24);
        assert!(
            lines[3].starts_with("event (inclusive us)"),
            "{}",
            lines.join("\n")
        );
        s.act(Action::Metric);
        s.act(Action::Metric);
        assert_eq!(s.metric_shown(), Metric::Exclusive as i32);
        s.act(Action::Sort);
        let lines = screen(&s, &names, 200, 60);
        assert!(lines[3].contains("max↓"), "{}", lines.join("\n"));
        // Many streams: the shown one stays on the stream line.
        let mut many = Screens::new("127.0.0.1:7400", 10);
        for k in 0..12 {
            let mut u = stats_update(1);
            u.stream = format!("stream-{k:02}");
            many.update(&u, &names);
        }
        for _ in 0..11 {
            many.act(Action::Next);
        }
        let lines = screen(&many, &names, 80, 24);
        assert!(
            lines[2].starts_with('…') && lines[2].contains("stream-11 [stats]"),
            "{}",
            lines[2]
        );
        s.act(Action::Help);
        let lines = screen(&s, &names, 80, 24);
        assert!(lines[3].starts_with("Tab/→ next stream"), "{}", lines.join("\n"));
    }
}
