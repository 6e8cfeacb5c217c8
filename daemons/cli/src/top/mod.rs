//! `canopy top`: the live tree, refreshed every second from the front-end's Topology: a row per node with its
//! state, ranks, rounds per second, lag, traffic and troubles. Full screen on a terminal; with `--once` or when
//! piped, one plain table (rates over one interval) for scripts.

pub mod rates;
pub mod table;

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Duration;

use tokio::time::Instant;

use canopy_proto::v1::frontend_client::FrontendClient;
use canopy_proto::v1::{ListStreamsRequest, NodeKind, NodeState, TopologyNode, TopologyRequest};
use crossterm::event::Event;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use tonic::transport::Channel;

use crate::client::{Target, connect, status_error};
use crate::keys::{Action, action_of};
use crate::tui::Tui;
use crate::units::elapsed;
use crate::watch::header::count;
use rates::Rates;
use table::SortBy;

#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// Print one plain table (rates over one interval) and exit; the same when stdout is not a terminal.
    #[arg(long)]
    once: bool,
    /// Seconds between refreshes (and the interval the rates are over).
    #[arg(long, default_value_t = 1.0, value_parser = interval)]
    interval: f64,
}

fn interval(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.1..=3600.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not between 0.1 and 3600 seconds"))
    }
}

/// The tree as last seen, the one before for the rates, and what the keys chose.
struct Top {
    frontend: String,
    started: Instant,
    nodes: Vec<TopologyNode>,
    before: Option<(Instant, Vec<TopologyNode>)>,
    rates: HashMap<String, Rates>,
    streams: Vec<(u32, String)>,
    sort: SortBy,
    scroll: usize,
    /// Columns shifted out to the left (→ and ←), so a narrow terminal reaches every column.
    shift: usize,
    help: bool,
    /// Set while the front-end does not answer: the view keeps its last figures and says so.
    notice: Option<String>,
}

async fn snapshot(
    api: &mut FrontendClient<Channel>,
) -> anyhow::Result<(Vec<TopologyNode>, Vec<(u32, String)>)> {
    let nodes = api
        .topology(TopologyRequest {})
        .await
        .map_err(status_error)?
        .into_inner()
        .nodes;
    let streams = api
        .list_streams(ListStreamsRequest {})
        .await
        .map_err(status_error)?
        .into_inner()
        .streams
        .into_iter()
        .filter(|s| s.state == "open")
        .map(|s| (s.stream_id, s.name))
        .collect();
    Ok((nodes, streams))
}

impl Top {
    fn new(frontend: &str) -> Top {
        Top {
            frontend: frontend.to_string(),
            started: Instant::now(),
            nodes: Vec::new(),
            before: None,
            rates: HashMap::new(),
            streams: Vec::new(),
            sort: SortBy::default(),
            scroll: 0,
            shift: 0,
            help: false,
            notice: None,
        }
    }

    /// Takes a new snapshot taken at `at`: the rates are over the time since the previous one.
    fn take(&mut self, nodes: Vec<TopologyNode>, streams: Vec<(u32, String)>, at: Instant) {
        if let Some((then, before)) = &self.before {
            let seconds = at.saturating_duration_since(*then).as_secs_f64();
            self.rates = nodes
                .iter()
                .filter_map(|n| rates::between(before, n, seconds).map(|r| (n.node_id.clone(), r)))
                .collect();
        }
        self.before = Some((at, nodes.clone()));
        self.nodes = nodes;
        self.streams = streams;
    }

    fn header(&self, now: Instant) -> [Line<'static>; 2] {
        let of = |k: NodeKind| self.nodes.iter().filter(|n| n.kind == k as i32).count();
        let root_rate = self
            .nodes
            .iter()
            .find(|n| n.kind == NodeKind::Frontend as i32)
            .and_then(|n| self.rates.get(&n.node_id))
            .map_or("-".to_string(), |r| format!("{:.1}", r.rounds));
        let first = Line::from(vec![
            Span::styled(
                format!(
                    "{} nodes: {} relays, {} agents",
                    self.nodes.len(),
                    of(NodeKind::Relay),
                    of(NodeKind::Agent)
                ),
                Style::new().add_modifier(Modifier::BOLD),
            ),
            Span::raw(format!(
                "  root {root_rate} rounds/s  {}  up {}",
                self.frontend,
                elapsed(now.saturating_duration_since(self.started)),
            )),
        ]);
        let lost = self
            .nodes
            .iter()
            .filter(|n| n.state == NodeState::Lost as i32)
            .count() as u64;
        let mut second = Vec::new();
        second.extend(count("lost", lost));
        second.extend(count("late", self.nodes.iter().map(|n| n.late_arrivals).sum()));
        second.extend(count("malformed", self.nodes.iter().map(|n| n.malformed).sum()));
        second.extend(count(
            "dropped",
            self.nodes.iter().map(|n| n.rank_dumps_dropped).sum(),
        ));
        second.extend(count("failed", self.nodes.iter().map(|n| n.streams_failed).sum()));
        second.push(Span::styled(
            format!("sort: {}  ?: keys", self.sort.word()),
            Style::new().fg(Color::Gray),
        ));
        [first, Line::from(second)]
    }

    fn act(&mut self, a: Action) {
        match a {
            Action::Sort => self.sort = self.sort.next(),
            Action::Help => self.help = !self.help,
            Action::Next => self.shift = (self.shift + 1).min(table::max_shift(&self.streams)),
            Action::Previous => self.shift = self.shift.saturating_sub(1),
            Action::Scroll(d) => {
                let to = self.scroll as i64 + i64::from(d);
                self.scroll = to.clamp(0, self.nodes.len().saturating_sub(1) as i64) as usize;
            }
            _ => {}
        }
    }

    fn render(&self, area: Rect, buf: &mut Buffer, now: Instant) {
        let mut y = area.y;
        for line in self.header(now) {
            if y < area.bottom() {
                buf.set_line(area.x, y, &line, area.width);
                y += 1;
            }
        }
        if let Some(n) = &self.notice
            && y < area.bottom()
        {
            let style = Style::new().fg(Color::Red).add_modifier(Modifier::BOLD);
            buf.set_line(area.x, y, &Line::styled(n.clone(), style), area.width);
            y += 1;
        }
        if self.help && y < area.bottom() {
            buf.set_line(
                area.x,
                y,
                &Line::styled(
                    "s sort (tree, rounds/s, in/s, lag, filter time)  ←→ columns  ↑↓ PgUp PgDn scroll  q quit",
                    Style::new().fg(Color::Gray),
                ),
                area.width,
            );
            y += 1;
        }
        if y >= area.bottom() {
            return;
        }
        let rows = table::sorted(&self.nodes, &self.rates, self.sort);
        let t = table::lines(&rows, &self.rates, &self.streams, area.width, self.shift);
        buf.set_line(
            area.x,
            y,
            &Line::styled(t.header, Style::new().add_modifier(Modifier::BOLD)),
            area.width,
        );
        y += 1;
        let visible = usize::from(area.bottom() - y);
        // Scrolled no further than shows the last row at the bottom.
        let from = self.scroll.min(t.rows.len().saturating_sub(visible));
        for ((_, n), text) in rows.iter().zip(&t.rows).skip(from).take(visible) {
            let style = if n.state == NodeState::Lost as i32 {
                Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
            } else {
                Style::new()
            };
            buf.set_line(area.x, y, &Line::styled(text.clone(), style), area.width);
            y += 1;
        }
    }
}

/// The live tree: full screen on a terminal, or one table with `--once` or when piped.
pub async fn run(target: Target, args: TopArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !target.json,
        "canopy top has no --json: `canopy topology --json` gives the tree's counters as JSON"
    );
    let mut api = connect(&target).await?;
    let mut top = Top::new(&target.frontend);
    let period = Duration::from_secs_f64(args.interval);
    let (nodes, streams) = snapshot(&mut api).await?;
    top.take(nodes, streams, Instant::now());
    let terminal = std::io::stdout().is_terminal();
    if args.once || !terminal {
        // Rates need a second look, one interval later.
        tokio::time::sleep(period).await;
        let (nodes, streams) = snapshot(&mut api).await?;
        top.take(nodes, streams, Instant::now());
        let width = if terminal {
            crossterm::terminal::size().map_or(u16::MAX, |(w, _)| w)
        } else {
            u16::MAX
        };
        let rows = table::sorted(&top.nodes, &top.rates, SortBy::Tree);
        let t = table::lines(&rows, &top.rates, &top.streams, width, 0);
        println!("{}", t.header);
        for r in t.rows {
            println!("{r}");
        }
        return Ok(());
    }
    let (events_tx, mut events) = tokio::sync::mpsc::channel::<Event>(64);
    let mut tui = Tui::start(events_tx)?;
    tui.terminal
        .draw(|f| top.render(f.area(), f.buffer_mut(), Instant::now()))?;
    // The next look one interval after the first, so that the first rates are over a whole interval.
    let mut tick = tokio::time::interval_at(Instant::now() + period, period);
    loop {
        tokio::select! {
            _ = tick.tick() => match snapshot(&mut api).await {
                Ok((nodes, streams)) => {
                    top.notice = None;
                    top.take(nodes, streams, Instant::now());
                }
                // The front-end went away (it died, restarted, or the link broke): the last figures stay, with a
                // notice, and the next tick tries again, connecting anew.
                Err(e) => {
                    top.notice = Some(format!("front-end lost, reconnecting: {e}"));
                    if let Ok(again) = connect(&target).await {
                        api = again;
                    }
                }
            },
            Some(ev) = events.recv() => {
                match action_of(&ev) {
                    Action::Quit => break,
                    Action::Nothing => continue,
                    Action::Redraw => {
                        tui.terminal.autoresize()?;
                    }
                    other => top.act(other),
                }
            }
        }
        tui.terminal
            .draw(|f| top.render(f.area(), f.buffer_mut(), Instant::now()))?;
    }
    drop(tui);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, parent: &str, children: &[&str], kind: NodeKind, rounds: u64) -> TopologyNode {
        TopologyNode {
            node_id: id.into(),
            parent_id: parent.into(),
            children: children.iter().map(|c| c.to_string()).collect(),
            kind: kind as i32,
            state: NodeState::Attached as i32,
            rounds_closed: rounds,
            ..Default::default()
        }
    }

    fn tree(rounds: u64, agents: usize) -> Vec<TopologyNode> {
        let ids: Vec<String> = (0..agents).map(|k| format!("agent:{k}")).collect();
        let kids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let mut nodes = vec![
            node("frontend:0", "", &["relay:0"], NodeKind::Frontend, rounds),
            node("relay:0", "frontend:0", &kids, NodeKind::Relay, rounds),
        ];
        for id in &ids {
            nodes.push(node(id, "relay:0", &[], NodeKind::Agent, rounds));
        }
        nodes
    }

    fn screen(top: &Top, w: u16, h: u16) -> Vec<String> {
        let mut buf = Buffer::empty(Rect::new(0, 0, w, h));
        top.render(buf.area, &mut buf, top.started);
        (0..h)
            .map(|y| (0..w).map(|x| buf[(x, y)].symbol()).collect::<String>())
            .collect()
    }

    #[test]
    fn the_screen_shows_every_node_with_its_rate_and_scrolls_a_tall_tree() {
        let mut top = Top::new("127.0.0.1:7400");
        let t0 = Instant::now();
        top.take(tree(10, 2), Vec::new(), t0);
        top.take(tree(30, 2), Vec::new(), t0 + Duration::from_secs(2));
        let lines = screen(&top, 80, 24);
        let all = lines.join("\n");
        assert!(
            lines[0].contains("4 nodes: 1 relays, 2 agents  root 10.0 rounds/s"),
            "{all}"
        );
        assert!(lines[2].starts_with("node"), "{all}");
        assert!(
            lines[3].starts_with("frontend:0") && lines[3].contains("10.0"),
            "{all}"
        );
        assert!(lines[5].starts_with("    agent:0"), "{all}");
        // Forty agents in 24 rows: the last is reached by scrolling, never drawn past the bottom.
        top.take(tree(40, 40), Vec::new(), t0 + Duration::from_secs(3));
        let lines = screen(&top, 80, 24);
        assert!(!lines.join("\n").contains("agent:39"));
        for _ in 0..10 {
            top.act(Action::Scroll(crate::keys::PAGE));
        }
        let lines = screen(&top, 80, 24);
        assert!(lines[23].starts_with("    agent:39"), "{}", lines.join("\n"));
        top.act(Action::Sort);
        assert!(screen(&top, 80, 24)[1].contains("sort: rounds/s"));
    }

    #[test]
    fn a_front_end_that_went_away_keeps_the_last_figures_with_a_notice() {
        let mut top = Top::new("127.0.0.1:7400");
        let t0 = Instant::now();
        top.take(tree(10, 2), Vec::new(), t0);
        top.notice = Some("front-end lost, reconnecting: Unavailable: connection refused".into());
        let all = screen(&top, 80, 24).join("\n");
        assert!(all.contains("front-end lost, reconnecting"), "{all}");
        assert!(all.contains("agent:1"), "the last figures stay: {all}");
        top.notice = None;
        assert!(!screen(&top, 80, 24).join("\n").contains("front-end lost"));
    }
}
