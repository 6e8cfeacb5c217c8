//! `canopy watch`: every stream's results as they arrive. On a terminal, a full-screen view: a header (the
//! front-end, the elapsed time, the shown stream's round, rate and coverage, the tree's troubles), a line of the
//! streams, and the shown stream: utilization as bars (stacked over ten seconds, or 1 ms bars over the latest
//! 250 ms), summaries as a table of the chosen metric with sparklines of the top events' means, histograms as
//! block characters, classes as a table. Piped or with `--plain`, a line per utilization period and the tables as
//! text; with `--json`, the updates as JSON, each with the names of its events.

pub mod header;
pub mod json;
mod screens;
pub mod spark;
pub mod table;
pub mod utilization;
pub mod view;

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::ops::ControlFlow;
use std::time::Duration;

use tokio::time::Instant;

use canopy_proto::v1::frontend_client::FrontendClient;
use canopy_proto::v1::{
    EventNamesRequest, ListStreamsRequest, RoundUpdate, SubscribeRequest, TopologyRequest, subscribe_request,
};
use crossterm::event::Event;
use tonic::transport::Channel;

use crate::client::{Target, connect, json_of, status_error};
use crate::keys::{Action, action_of};
use crate::render::render;
use crate::tui::Tui;
use header::Troubles;
use screens::{Screens, is_utilization, utilization_of};

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
    let terminal = !args.plain && !target.json && std::io::stdout().is_terminal();
    // On a terminal, the sparklines' span of rounds; otherwise the latest round.
    let history = if terminal { spark::SPAN as u64 } else { 1 };
    let req = SubscribeRequest {
        stream_names: args.streams.clone(),
        start: latest_start(&mut api, &args.streams, history).await?,
        ..Default::default()
    };
    let updates = api.subscribe(req).await.map_err(status_error)?.into_inner();
    // Said when the run ends, after the front-end is gone.
    let store = api
        .topology(TopologyRequest {})
        .await
        .map(|t| t.into_inner().store_path)
        .unwrap_or_default();
    let screens = Screens::new(&target.frontend, args.top);
    let (events_tx, events) = tokio::sync::mpsc::channel::<Event>(64);
    // The terminal is taken once the front-end has answered, so that failing to reach it is one plain line.
    let tui = if terminal {
        Some(Tui::start(events_tx)?)
    } else {
        None
    };
    let mut view = Watch {
        target: &target,
        args: &args,
        api,
        updates,
        names: HashMap::new(),
        screens,
        tui,
        events,
        seen: 0,
        next_round: 0,
    };
    view.draw()?;
    let ended = view.run().await?;
    drop(view.tui.take());
    if ended && !target.json {
        println!("{}", view.screens.summary(&store));
    }
    Ok(())
}

/// A watch under way: the front-end's client and subscription, the events' names, the screens and the terminal
/// they are drawn on, and how far the updates have come.
struct Watch<'a> {
    target: &'a Target,
    args: &'a WatchArgs,
    api: FrontendClient<Channel>,
    updates: tonic::Streaming<RoundUpdate>,
    names: HashMap<u64, String>,
    screens: Screens,
    tui: Option<Tui>,
    events: tokio::sync::mpsc::Receiver<Event>,
    /// The updates seen so far.
    seen: u64,
    /// The round after the newest seen: where a subscription made again after a lost front-end starts.
    next_round: u64,
}

impl Watch<'_> {
    /// Handles updates, keys and ticks until the run ends (true), a key quits or the updates asked for have
    /// come (false).
    async fn run(&mut self) -> anyhow::Result<bool> {
        // The view redraws on every update, key and resize; the tick keeps the header's clock and the tree's
        // troubles fresh.
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            let flow = tokio::select! {
                u = self.updates.message() => match u {
                    Ok(Some(u)) => self.on_update(u).await?,
                    // The run ended: the front-end closed the subscription.
                    Ok(None) => {
                        self.keep_last_screens().await?;
                        return Ok(true);
                    }
                    Err(status) if lost_front_end(&status) => self.resubscribe(status).await?,
                    Err(status) => return Err(status_error(status)),
                },
                Some(ev) = self.events.recv() => self.on_key(&ev)?,
                _ = tick.tick(), if self.tui.is_some() => {
                    self.refresh_header().await;
                    self.draw()?;
                    ControlFlow::Continue(())
                }
            };
            if flow.is_break() {
                return Ok(false);
            }
        }
    }

    /// Draws the screens on the terminal, if the watch has one.
    fn draw(&mut self) -> anyhow::Result<()> {
        if let Some(t) = self.tui.as_mut() {
            let (screens, names) = (&self.screens, &self.names);
            t.terminal.draw(|f| screens.draw(f, names))?;
        }
        Ok(())
    }

    /// Shows an update: as JSON, on the screens, or as plain text. Breaks once the updates asked for have come.
    async fn on_update(&mut self, u: RoundUpdate) -> anyhow::Result<ControlFlow<()>> {
        self.next_round = self.next_round.max(u.round + 1);
        self.seen += 1;
        if wants_names(self.names.len(), u.missed, self.seen) {
            let list = self
                .api
                .event_names(EventNamesRequest {})
                .await
                .map_err(status_error)?
                .into_inner();
            self.names.extend(list.names.into_iter().map(|n| (n.id, n.name)));
        }
        if self.target.json {
            println!(
                "{}",
                json::with_names(&json_of("canopy.v1.RoundUpdate", &u), &self.names)
            );
        } else if self.tui.is_some() {
            self.screens.update(&u, &self.names);
            self.draw()?;
        } else {
            self.screens.update(&u, &self.names);
            print_plain(&u, &self.names, self.args.top);
        }
        if self.args.updates > 0 && self.seen >= self.args.updates {
            return Ok(ControlFlow::Break(()));
        }
        Ok(ControlFlow::Continue(()))
    }

    /// After the run ended, a full-screen watch keeps its streams' last screens until `q` leaves: the keys
    /// still move between them.
    async fn keep_last_screens(&mut self) -> anyhow::Result<()> {
        if self.tui.is_none() {
            return Ok(());
        }
        self.screens.header.notice = Some("the run ended: q leaves".into());
        self.draw()?;
        while let Some(ev) = self.events.recv().await {
            if self.on_key(&ev)?.is_break() {
                break;
            }
        }
        Ok(())
    }

    /// Acts on a key or a resize and redraws; breaks on the key that quits.
    fn on_key(&mut self, ev: &Event) -> anyhow::Result<ControlFlow<()>> {
        match action_of(ev) {
            Action::Quit => return Ok(ControlFlow::Break(())),
            Action::Nothing => return Ok(ControlFlow::Continue(())),
            Action::Redraw => {
                if let Some(t) = self.tui.as_mut() {
                    t.terminal.autoresize()?;
                }
            }
            other => self.screens.act(other),
        }
        self.draw()?;
        Ok(ControlFlow::Continue(()))
    }

    /// After the front-end was lost, subscribes again from the round after the newest seen, saying so; breaks
    /// if a key quits first.
    async fn resubscribe(&mut self, status: tonic::Status) -> anyhow::Result<ControlFlow<()>> {
        let said = status_error(status);
        let notice = format!("front-end lost ({said}); reconnecting");
        if self.tui.is_none() {
            eprintln!("canopy watch: {notice}");
        }
        self.screens.header.notice = Some("front-end lost: reconnecting".into());
        self.draw()?;
        let again = tokio::select! {
            r = reconnect(self.target, &self.args.streams, self.next_round) => Some(r),
            Some(ev) = quit_key(&mut self.events) => { let _ = ev; None }
        };
        let Some((api, updates)) = again else {
            return Ok(ControlFlow::Break(()));
        };
        (self.api, self.updates) = (api, updates);
        self.screens.header.notice = None;
        if self.tui.is_none() {
            eprintln!(
                "canopy watch: reconnected to {}, from round {}",
                self.target.frontend, self.next_round
            );
        }
        Ok(ControlFlow::Continue(()))
    }

    /// Asks the front-end for the tree's troubles and the run's age, for the header; keeps the last ones if it
    /// does not answer.
    async fn refresh_header(&mut self) {
        if let Ok(topo) = self.api.topology(TopologyRequest {}).await {
            let topo = topo.into_inner();
            self.screens.header.troubles = Troubles::of(&topo.nodes);
            if topo.run_started_unix_ns > 0 {
                let age = unix_now_ns().saturating_sub(topo.run_started_unix_ns);
                self.screens.header.run_age = Some((Duration::from_nanos(age), Instant::now()));
            }
        }
    }
}

/// Whether to ask the front-end for the events' names again: while few are known, after missed rounds, and every
/// 50th update.
fn wants_names(known: usize, missed: u64, seen: u64) -> bool {
    known < 8 || missed > 0 || seen.is_multiple_of(50)
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
mod tests;
