//! `canopy watch`: every stream's results as they arrive. On a terminal, utilization streams are live views
//! (stacked bars over ten seconds, or 1 ms bars over the latest 250 ms) and other streams their tables; piped
//! or with `--plain`, a line per utilization period and the tables as text; with `--json`, the updates as JSON.

pub mod utilization;
pub mod view;

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal, Write};
use std::time::Duration;

use canopy_proto::filters::v1::UtilizationResult;
use canopy_proto::v1::{EventNamesRequest, RoundUpdate, SubscribeRequest};
use crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use prost::Message;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use crate::client::{Target, connect, json_of, render, status_error};
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

/// The keys the views answer, as the header shows them.
const KEYS: &str = "h: 1 ms/100 ms view  Tab: next stream  q: quit";

/// What one stream shows.
enum Screen {
    /// A utilization stream's history and its latest round.
    Utilization { history: Box<History>, header: String },
    /// Any other stream's latest table.
    Text(String),
}

/// Every stream's screen, the one shown and the view of utilization streams.
#[derive(Default)]
struct Screens {
    screens: BTreeMap<String, Screen>,
    shown: Option<String>,
    mode: Mode,
}

fn is_utilization(u: &RoundUpdate) -> bool {
    u.result
        .as_ref()
        .is_some_and(|a| a.type_url.ends_with("UtilizationResult"))
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
    fn update(&mut self, u: &RoundUpdate, names: &HashMap<u64, String>, top: usize) {
        if is_utilization(u) {
            let screen = self
                .screens
                .entry(u.stream.clone())
                .or_insert_with(|| Screen::Utilization {
                    history: Box::default(),
                    header: String::new(),
                });
            if let Screen::Utilization { history, header } = screen {
                if let Some(r) = utilization_of(u) {
                    // A result that does not hold together is left out; the header still moves on.
                    let _ = history.push(&r);
                }
                *header = header_of(u);
            }
            if !matches!(
                self.shown.as_ref().and_then(|s| self.screens.get(s)),
                Some(Screen::Utilization { .. })
            ) {
                self.shown = Some(u.stream.clone());
            }
        } else {
            self.screens
                .insert(u.stream.clone(), Screen::Text(render(u, names, top)));
            if self.shown.is_none() {
                self.shown = Some(u.stream.clone());
            }
        }
    }

    fn has_utilization(&self) -> bool {
        self.screens
            .values()
            .any(|s| matches!(s, Screen::Utilization { .. }))
    }

    /// Shows the next stream (or the previous one).
    fn cycle(&mut self, back: bool) {
        let keys: Vec<&String> = self.screens.keys().collect();
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

    fn draw(&self, frame: &mut ratatui::Frame<'_>, names: &HashMap<u64, String>) {
        let area = frame.area();
        let Some(screen) = self.shown.as_ref().and_then(|s| self.screens.get(s)) else {
            return;
        };
        let streams = self.screens.len();
        let keys = if streams > 1 {
            KEYS
        } else {
            "h: 1 ms/100 ms view  q: quit"
        };
        match screen {
            Screen::Utilization { history, header } => frame.render_widget(
                UtilView {
                    history,
                    names,
                    mode: self.mode,
                    header: header.clone(),
                    keys,
                },
                area,
            ),
            Screen::Text(text) => {
                let keys = Line::from(vec![Span::styled(
                    "Tab: next stream  q: quit",
                    Style::new().fg(Color::Gray).add_modifier(Modifier::DIM),
                )]);
                frame.render_widget(keys, Rect::new(area.x, area.y, area.width, 1.min(area.height)));
                let body = Rect::new(
                    area.x,
                    area.y + 1.min(area.height),
                    area.width,
                    area.height.saturating_sub(1),
                );
                frame.render_widget(Paragraph::new(text.as_str()), body);
            }
        }
    }
}

/// The terminal while the views are drawn: raw mode and the alternate screen, put back when dropped.
struct Tui {
    terminal: ratatui::DefaultTerminal,
}

impl Tui {
    /// Takes the terminal and starts a thread that forwards its events (keys, resizes) to `events`.
    fn start(events: tokio::sync::mpsc::Sender<Event>) -> anyhow::Result<Tui> {
        let terminal = ratatui::try_init()?;
        std::thread::Builder::new()
            .name("watch-keys".into())
            .spawn(move || {
                while let Ok(ev) = crossterm::event::read() {
                    if events.blocking_send(ev).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Tui { terminal })
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// What a key asks for.
#[derive(Debug, PartialEq, Eq)]
enum Action {
    Quit,
    ToggleView,
    Next,
    Previous,
    Redraw,
    Nothing,
}

fn action_of(ev: &Event) -> Action {
    match ev {
        Event::Key(KeyEvent {
            code,
            modifiers,
            kind: KeyEventKind::Press | KeyEventKind::Repeat,
            ..
        }) => match code {
            KeyCode::Char('c') if modifiers.contains(KeyModifiers::CONTROL) => Action::Quit,
            KeyCode::Char('q') | KeyCode::Esc => Action::Quit,
            KeyCode::Char('h') => Action::ToggleView,
            KeyCode::Tab => Action::Next,
            KeyCode::BackTab => Action::Previous,
            _ => Action::Nothing,
        },
        Event::Resize(..) => Action::Redraw,
        _ => Action::Nothing,
    }
}

/// Every stream's results, live: views on a terminal, text otherwise, or JSON.
pub async fn watch(target: Target, args: WatchArgs) -> anyhow::Result<()> {
    let mut api = connect(&target).await?;
    let mut names: HashMap<u64, String> = HashMap::new();
    let req = SubscribeRequest {
        stream_names: args.streams.clone(),
        ..Default::default()
    };
    let mut updates = api.subscribe(req).await.map_err(status_error)?.into_inner();
    let terminal = !args.plain && std::io::stdout().is_terminal();
    let mut screens = Screens::default();
    let mut tui: Option<Tui> = None;
    let (events_tx, mut events) = tokio::sync::mpsc::channel::<Event>(64);
    // The views redraw on every update, key and resize; the tick only keeps a quiet stream's screen fresh.
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut seen = 0u64;
    loop {
        tokio::select! {
            u = updates.message() => {
                let Some(u) = u.map_err(status_error)? else { break };
                seen += 1;
                if target.json {
                    println!("{}", json_of("canopy.v1.RoundUpdate", &u));
                } else {
                    if names.len() < 8 || u.missed > 0 || seen.is_multiple_of(50) {
                        let list = api
                            .event_names(EventNamesRequest {})
                            .await
                            .map_err(status_error)?
                            .into_inner();
                        names.extend(list.names.into_iter().map(|n| (n.id, n.name)));
                    }
                    if !terminal {
                        print_plain(&u, &names, args.top);
                    } else {
                        screens.update(&u, &names, args.top);
                        if tui.is_none() && screens.has_utilization() {
                            tui = Some(Tui::start(events_tx.clone())?);
                        }
                        match tui.as_mut() {
                            Some(t) => {
                                t.terminal.draw(|f| screens.draw(f, &names))?;
                            }
                            None => print_tables(&screens),
                        }
                    }
                }
                if args.updates > 0 && seen >= args.updates {
                    break;
                }
            }
            Some(ev) = events.recv() => {
                match action_of(&ev) {
                    Action::Quit => break,
                    Action::ToggleView => screens.mode = screens.mode.toggled(),
                    Action::Next => screens.cycle(false),
                    Action::Previous => screens.cycle(true),
                    Action::Redraw => {
                        if let Some(t) = tui.as_mut() {
                            t.terminal.autoresize()?;
                        }
                    }
                    Action::Nothing => continue,
                }
                if let Some(t) = tui.as_mut() {
                    t.terminal.draw(|f| screens.draw(f, &names))?;
                }
            }
            _ = tick.tick(), if tui.is_some() => {
                if let Some(t) = tui.as_mut() {
                    t.terminal.draw(|f| screens.draw(f, &names))?;
                }
            }
        }
    }
    drop(tui);
    Ok(())
}

/// A terminal without a utilization stream: every stream's latest table, the screen cleared between.
fn print_tables(screens: &Screens) {
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "\x1b[2J\x1b[H");
    for screen in screens.screens.values() {
        if let Screen::Text(text) = screen {
            let _ = writeln!(out, "{text}");
        }
    }
    let _ = out.flush();
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
    use utilization::tests::result;

    fn update(stream: &str, round: u64, r: &UtilizationResult) -> RoundUpdate {
        RoundUpdate {
            stream: stream.into(),
            filter: "utilization".into(),
            round,
            result: Some(prost_types_any(r)),
            ..Default::default()
        }
    }

    fn prost_types_any(r: &UtilizationResult) -> prost_types::Any {
        prost_types::Any {
            type_url: "type.googleapis.com/canopy.filters.v1.UtilizationResult".into(),
            value: r.encode_to_vec(),
        }
    }

    #[test]
    fn keys_quit_switch_views_and_cycle_streams() {
        let key = |c| Event::Key(KeyEvent::new(c, KeyModifiers::NONE));
        assert_eq!(action_of(&key(KeyCode::Char('q'))), Action::Quit);
        assert_eq!(action_of(&key(KeyCode::Esc)), Action::Quit);
        assert_eq!(
            action_of(&Event::Key(KeyEvent::new(
                KeyCode::Char('c'),
                KeyModifiers::CONTROL
            ))),
            Action::Quit
        );
        assert_eq!(action_of(&key(KeyCode::Char('h'))), Action::ToggleView);
        assert_eq!(action_of(&key(KeyCode::Tab)), Action::Next);
        assert_eq!(action_of(&Event::Resize(100, 40)), Action::Redraw);
    }

    #[test]
    fn a_utilization_stream_is_shown_first_and_tab_cycles_the_streams() {
        let mut s = Screens::default();
        let names = HashMap::new();
        let stats = RoundUpdate {
            stream: "a-stats".into(),
            filter: "stats".into(),
            ..Default::default()
        };
        s.update(&stats, &names, 5);
        assert_eq!(s.shown.as_deref(), Some("a-stats"));
        assert!(!s.has_utilization());
        let r = result(1_700_000_000_000, 1000, &[(7, "MPI_Allreduce", 100)]);
        s.update(&update("util", 3, &r), &names, 5);
        assert!(s.has_utilization());
        assert_eq!(s.shown.as_deref(), Some("util"));
        s.cycle(false);
        assert_eq!(s.shown.as_deref(), Some("a-stats"));
        s.cycle(false);
        assert_eq!(s.shown.as_deref(), Some("util"));
        // Another update of the table stream does not take the screen.
        s.update(&stats, &names, 5);
        assert_eq!(s.shown.as_deref(), Some("util"));
        let mut term = ratatui::Terminal::new(ratatui::backend::TestBackend::new(80, 24)).unwrap();
        term.draw(|f| s.draw(f, &names)).unwrap();
        let buf = term.backend().buffer().clone();
        let top: String = (0..80).map(|x| buf[(x, 0)].symbol()).collect();
        assert!(top.starts_with("util [utilization] round 3"), "{top}");
        s.cycle(false);
        term.draw(|f| s.draw(f, &names)).unwrap();
        let buf = term.backend().buffer().clone();
        let second: String = (0..80).map(|x| buf[(x, 1)].symbol()).collect();
        assert!(second.starts_with("a-stats [stats] round 0"), "{second}");
    }
}
