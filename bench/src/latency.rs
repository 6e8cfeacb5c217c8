//! `canopy-bench latency`: where a round's latency goes, hop by hop. A tree runs as separate processes
//! (`canopy up`) at a light rate with the latency account on (`CANOPY_LOG=canopy::latency=debug`); every node
//! logs, in microseconds since the round's first dump, when a child's packet was read off its stream and
//! handled, when the round closed and was filtered, and when its packet was handed to the parent's stream; the
//! root, when it handed the finalized round to the store's writer; the store, when the writer took it up.
//! Each step is taken at the last node of its level to reach it (the one the level above waits for), and the
//! table gives its median over the rounds.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::Context;

use crate::{Shape, processes, stats};

/// One latency event of one node.
#[derive(Debug, Clone, PartialEq)]
struct Event {
    /// The node the event happened at; for a packet read, the child whose stream it was read from (the node
    /// that read it is that child's parent).
    node: String,
    /// For a packet handled: the child it came from.
    child: Option<String>,
    what: &'static str,
    round: u64,
    /// The first dump the packet or round stands for, and when the event happened: wall clock, ns.
    first_dump_ns: u64,
    at_ns: u64,
}

pub fn run(shape: &Shape, topology: Option<&Path>, repeats: usize) -> anyhow::Result<()> {
    let tree = topology.map_or_else(
        || format!("{} agents, fanout {}", shape.agents, shape.fanout),
        |t| format!("topology {}", t.display()),
    );
    println!(
        "\n## latency: {} simulated ranks ({} events), {tree}, {}, one round every {} ms, {} rounds, separate processes (canopy up) over loopback gRPC",
        shape.ranks, shape.events, shape.filter, shape.period_ms, shape.rounds
    );
    let mut steps: BTreeMap<(usize, usize), (String, Vec<f64>)> = BTreeMap::new();
    for _ in 0..repeats {
        let dir = tempfile::tempdir()?;
        let mut cmd = processes::up_command(shape, topology, dir.path())?;
        cmd.env("CANOPY_LOG", format!("{}=debug,info", canopy_core::LATENCY));
        processes::finish(&mut cmd)?;
        let events = read_logs(&dir.path().join("logs"))?;
        let stored = stored_latency(&dir.path().join("latest.sqlite"))?;
        // Every step is logged by every node: one missing from all the logs means the lines changed.
        for what in [
            "packet read",
            "packet in",
            "closed",
            "filtered",
            "packet out",
            "finalized",
        ] {
            anyhow::ensure!(
                events.iter().any(|e| e.what == what),
                "no `{what}` step in the nodes' latency account: the log lines and this reader disagree"
            );
        }
        let mut account = account(&events);
        let top = account.keys().map(|&(level, _)| level).max().unwrap_or(0);
        account.insert(
            (top, 6),
            (
                "front-end: taken by the store writer (the round's `closed_unix_ns`, where the peer kit's latency ends)"
                    .to_string(),
                stored,
            ),
        );
        for (key, (label, median)) in account {
            steps
                .entry(key)
                .or_insert_with(|| (label, Vec::new()))
                .1
                .push(median);
        }
    }
    println!(
        "\n| step (at the last node of its level) | us since the round's first dump (median over rounds; median of {repeats} runs) | min | max | this step, us |"
    );
    println!("|---|---:|---:|---:|---:|");
    let mut before = 0.0;
    for (label, runs) in steps.into_values() {
        let (m, lo, hi) = stats(runs);
        println!("| {label} | {m:.0} | {lo:.0} | {hi:.0} | {:.0} |", m - before);
        before = m;
    }
    Ok(())
}

/// The median over a run's rounds of the time from the round's first dump to the store writer taking it up (the
/// `rounds` table's `closed_unix_ns`), in microseconds.
fn stored_latency(store: &Path) -> anyhow::Result<f64> {
    let conn = rusqlite::Connection::open_with_flags(store, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .with_context(|| format!("cannot open the run's store {}", store.display()))?;
    let mut st = conn.prepare(
        "SELECT (closed_unix_ns - first_dump_unix_ns) / 1000.0 FROM rounds
         WHERE first_dump_unix_ns > 0 AND closed_unix_ns >= first_dump_unix_ns",
    )?;
    let us: Vec<f64> = st.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
    anyhow::ensure!(
        !us.is_empty(),
        "no round with its first dump and its closing in {}",
        store.display()
    );
    Ok(stats(us).0)
}

/// The latency events in every log of a run's directory.
fn read_logs(dir: &Path) -> anyhow::Result<Vec<Event>> {
    let mut events = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        events.extend(text.lines().flat_map(parse_line));
    }
    Ok(events)
}

/// The events of one log line of the latency account (text format), phase 0 only; none for other lines.
fn parse_line(line: &str) -> Vec<Event> {
    let Some((_, rest)) = line.split_once(&format!("{}: ", canopy_core::LATENCY)) else {
        return Vec::new();
    };
    let Some((what, fields)) = [
        "packet read",
        "packet in",
        "round closed",
        "round filtered",
        "packet out",
        "round finalized",
    ]
    .into_iter()
    .find_map(|w| rest.strip_prefix(w).map(|f| (w, f))) else {
        return Vec::new();
    };
    let fields: HashMap<&str, &str> = fields
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let num = |k: &str| fields.get(k).and_then(|v| v.parse::<u64>().ok());
    // A round is finalized at the root from its last phase; every other step is taken in its first.
    if num("phase") != Some(0) && what != "round finalized" {
        return Vec::new();
    }
    let Some(round) = num("round") else {
        return Vec::new();
    };
    // A packet read is logged by the child's stream, which knows the child, not the node: the child stands
    // for it, and the account places it at the child's parent.
    let node = fields.get("node").or_else(|| fields.get("child"));
    let Some(node) = node.map(|n| n.to_string()) else {
        return Vec::new();
    };
    let child = match what {
        "packet in" => fields.get("child").map(|c| c.to_string()),
        _ => None,
    };
    let Some(first_dump_ns) = num("first_dump_ns") else {
        return Vec::new();
    };
    let event = |what: &'static str, at_ns: u64| Event {
        node: node.clone(),
        child: child.clone(),
        what,
        round,
        first_dump_ns,
        at_ns,
    };
    match what {
        // A node logs the close when it calls the filter, and the filtered round when the answer is routed.
        "round closed" => num("closed_ns")
            .map(|c| vec![event("closed", c)])
            .unwrap_or_default(),
        "round filtered" => num("filtered_ns")
            .map(|f| vec![event("filtered", f)])
            .unwrap_or_default(),
        "round finalized" => num("at_ns")
            .map(|at| vec![event("finalized", at)])
            .unwrap_or_default(),
        _ => num("at_ns").map(|at| vec![event(what, at)]).unwrap_or_default(),
    }
}

/// The median time of each step over the rounds, keyed by (level, order within the level) and labelled.
/// Levels count from the leaves (0) up; a node's level is one more than its highest child's.
fn account(events: &[Event]) -> BTreeMap<(usize, usize), (String, f64)> {
    let parent_of: HashMap<&str, &str> = events
        .iter()
        .filter_map(|e| Some((e.child.as_deref()?, e.node.as_str())))
        .collect();
    let level = levels(&parent_of);
    // Each round's origin: its first dump anywhere in the tree.
    let mut origin: HashMap<u64, u64> = HashMap::new();
    for e in events {
        let o = origin.entry(e.round).or_insert(e.first_dump_ns);
        *o = (*o).min(e.first_dump_ns);
    }
    let mut at: BTreeMap<(usize, usize, u64), u64> = BTreeMap::new();
    for e in events {
        let node = match e.what {
            "packet read" => match parent_of.get(e.node.as_str()) {
                Some(p) => *p,
                None => continue,
            },
            _ => e.node.as_str(),
        };
        let l = level.get(node).copied().unwrap_or(0);
        let order = match e.what {
            "packet read" => 0,
            "packet in" => 1,
            "closed" => 2,
            "filtered" => 3,
            "finalized" => 5,
            _ => 4,
        };
        let at_us = e.at_ns.saturating_sub(origin[&e.round]) / 1000;
        let slot = at.entry((l, order, e.round)).or_insert(0);
        *slot = (*slot).max(at_us);
    }
    let mut by_step: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
    for ((l, order, _), us) in at {
        by_step.entry((l, order)).or_default().push(us as f64);
    }
    let top = level.values().copied().max().unwrap_or(0);
    by_step
        .into_iter()
        .map(|((l, order), values)| {
            let who = match l {
                0 => "leaves".to_string(),
                l if l == top => "front-end".to_string(),
                l => format!("relays, level {l}"),
            };
            let step = match (l, order) {
                (0, 2) => "every rank's dump in, round closed",
                (_, 0) => "last child's packet read off its stream",
                (_, 1) => "last child's packet handled by the node",
                (_, 2) => "round closed",
                (_, 3) => "filtered",
                (_, 5) => "finalized, handed to the store writer",
                _ => "packet handed to the parent's stream",
            };
            let (m, _, _) = stats(values);
            ((l, order), (format!("{who}: {step}"), m))
        })
        .collect()
}

/// Each node's level from the child-to-parent links: a node that is nobody's parent is a leaf (0), a parent
/// is one above its highest child.
fn levels<'a>(parent_of: &HashMap<&'a str, &'a str>) -> HashMap<&'a str, usize> {
    let mut level: HashMap<&str, usize> = HashMap::new();
    let parents: std::collections::HashSet<&str> = parent_of.values().copied().collect();
    for &child in parent_of.keys() {
        if !parents.contains(child) {
            // Walk up from each leaf, raising each ancestor above the level it is reached from.
            let (mut node, mut l) = (child, 0usize);
            level.entry(node).or_insert(0);
            while let Some(&p) = parent_of.get(node) {
                l += 1;
                let e = level.entry(p).or_insert(0);
                *e = (*e).max(l);
                l = *e;
                node = p;
                if l > parent_of.len() {
                    break;
                }
            }
        }
    }
    level
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_account_from_log_lines() {
        // As the node logs them (`node/rounds.rs`): the close when the filter is called, then the answer.
        let closed = "2026-11-24T02:48:13.123Z DEBUG canopy::latency: round closed node=localhost:1 round=50 phase=0 first_dump_ns=1000 closed_ns=1198000";
        let filtered = "2026-11-24T02:48:13.124Z DEBUG canopy::latency: round filtered node=localhost:1 round=50 phase=0 first_dump_ns=1000 filtered_ns=1268000";
        let ev = |what, at_ns| Event {
            node: "localhost:1".into(),
            child: None,
            what,
            round: 50,
            first_dump_ns: 1000,
            at_ns,
        };
        assert_eq!(parse_line(closed), vec![ev("closed", 1198000)]);
        assert_eq!(parse_line(filtered), vec![ev("filtered", 1268000)]);
        let read = "… DEBUG canopy::latency: packet read child=localhost:3 round=5 phase=0 first_dump_ns=7 at_ns=675";
        assert_eq!(parse_line(read)[0].node, "localhost:3");
        let handled = "… DEBUG canopy::latency: packet in node=localhost:1 child=localhost:3 round=5 phase=0 first_dump_ns=7 at_ns=690";
        assert_eq!(parse_line(handled)[0].child.as_deref(), Some("localhost:3"));
        assert!(parse_line(&read.replace("phase=0", "phase=2")).is_empty());
        assert!(parse_line(&read.replace(" first_dump_ns=7", "")).is_empty());
        assert!(parse_line("… INFO canopy_core: attached to parent").is_empty());
        // The root finalizes a round from its last phase: that step is read whatever the phase.
        let finalized = "… DEBUG canopy::latency: round finalized node=localhost:0 round=5 phase=2 first_dump_ns=7 at_ns=900";
        assert_eq!(parse_line(finalized)[0].what, "finalized");
    }

    /// Two leaves under a relay under the front-end: each step is the later of the level's nodes, a packet
    /// read counts at the reader's level, and the levels come out of the links.
    #[test]
    fn each_step_is_the_last_node_of_its_level() {
        // Leaf a dumped first (at 1 ms); b's own first dump came 50 us later, and b's times count from a's.
        let ev = |node: &str, child: Option<&str>, what: &'static str, at_us: u64| Event {
            node: node.into(),
            child: child.map(Into::into),
            what,
            round: 1,
            first_dump_ns: if node == "b" { 1_050_000 } else { 1_000_000 },
            at_ns: 1_000_000 + at_us * 1000,
        };
        let events = vec![
            ev("a", None, "closed", 100),
            ev("b", None, "closed", 150),
            ev("a", None, "packet out", 200),
            ev("b", None, "packet out", 260),
            ev("a", None, "packet read", 300),
            ev("b", None, "packet read", 310),
            ev("r", Some("a"), "packet in", 320),
            ev("r", Some("b"), "packet in", 330),
            ev("r", None, "closed", 340),
            ev("r", None, "packet out", 400),
            ev("r", None, "packet read", 450),
            ev("fe", Some("r"), "packet in", 460),
            ev("fe", None, "closed", 470),
        ];
        let got: Vec<(String, f64)> = account(&events).into_values().collect();
        let want = [
            ("leaves: every rank's dump in, round closed", 150.0),
            ("leaves: packet handed to the parent's stream", 260.0),
            ("relays, level 1: last child's packet read off its stream", 310.0),
            ("relays, level 1: last child's packet handled by the node", 330.0),
            ("relays, level 1: round closed", 340.0),
            ("relays, level 1: packet handed to the parent's stream", 400.0),
            ("front-end: last child's packet read off its stream", 450.0),
            ("front-end: last child's packet handled by the node", 460.0),
            ("front-end: round closed", 470.0),
        ];
        let want: Vec<(String, f64)> = want.iter().map(|(l, v)| (l.to_string(), *v)).collect();
        assert_eq!(got, want);
    }
}
