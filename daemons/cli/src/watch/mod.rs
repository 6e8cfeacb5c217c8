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
mod tests;
