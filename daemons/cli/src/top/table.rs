//! The table of `canopy top`: a row per node of the tree, indented by depth, with its state, its rates and its
//! troubles; the columns that do not fit the terminal are left out in priority order.

use std::collections::{HashMap, HashSet};

use canopy_proto::v1::TopologyNode;

use super::rates::Rates;
use crate::client::{kind_word, state_word};
use crate::fit::{Column, Lines, lay_out};
use crate::units::bytes_per_second;

/// The order of the rows: the tree's (depth first, children by id), or by a figure, largest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortBy {
    #[default]
    Tree,
    Rounds,
    BytesIn,
    Lag,
    Filter,
}

impl SortBy {
    pub fn next(self) -> SortBy {
        match self {
            SortBy::Tree => SortBy::Rounds,
            SortBy::Rounds => SortBy::BytesIn,
            SortBy::BytesIn => SortBy::Lag,
            SortBy::Lag => SortBy::Filter,
            SortBy::Filter => SortBy::Tree,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            SortBy::Tree => "tree",
            SortBy::Rounds => "rounds/s",
            SortBy::BytesIn => "in/s",
            SortBy::Lag => "lag",
            SortBy::Filter => "filter time",
        }
    }
}

/// The order of node ids: by the text before the trailing number, then by the number (`agent:2` before
/// `agent:10`).
pub fn id_key(id: &str) -> (&str, u64, &str) {
    let digits = id.len() - id.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = id.split_at(id.len() - digits);
    (head, tail.parse().unwrap_or(0), tail)
}

/// The nodes depth first from the root (children by id), each with its depth; a node whose parent is not in
/// the tree starts a tree of its own.
pub fn tree_order(nodes: &[TopologyNode]) -> Vec<(usize, &TopologyNode)> {
    let by_id: HashMap<&str, &TopologyNode> = nodes.iter().map(|n| (n.node_id.as_str(), n)).collect();
    let mut roots: Vec<&TopologyNode> = nodes
        .iter()
        .filter(|n| n.parent_id.is_empty() || !by_id.contains_key(n.parent_id.as_str()))
        .collect();
    roots.sort_by(|a, b| id_key(&a.node_id).cmp(&id_key(&b.node_id)));
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut stack: Vec<(usize, &TopologyNode)> = roots.into_iter().rev().map(|r| (0, r)).collect();
    while let Some((depth, n)) = stack.pop() {
        if !seen.insert(n.node_id.as_str()) {
            continue;
        }
        out.push((depth, n));
        let mut kids: Vec<&TopologyNode> = n
            .children
            .iter()
            .filter_map(|c| by_id.get(c.as_str()).copied())
            .collect();
        kids.sort_by(|a, b| id_key(&b.node_id).cmp(&id_key(&a.node_id)));
        stack.extend(kids.into_iter().map(|k| (depth + 1, k)));
    }
    // A cycle leaves nodes out of every tree: they go last.
    for n in nodes {
        if !seen.contains(n.node_id.as_str()) {
            out.push((0, n));
        }
    }
    out
}

/// The rows in the order asked for.
pub fn sorted<'a>(
    nodes: &'a [TopologyNode],
    rates: &HashMap<String, Rates>,
    by: SortBy,
) -> Vec<(usize, &'a TopologyNode)> {
    let mut rows = tree_order(nodes);
    let figure = |n: &TopologyNode| -> f64 {
        let r = rates.get(&n.node_id);
        match by {
            SortBy::Tree => 0.0,
            SortBy::Rounds => r.map_or(0.0, |r| r.rounds),
            SortBy::BytesIn => r.map_or(0.0, |r| r.bytes_in),
            SortBy::Lag => n.lag_rounds as f64,
            SortBy::Filter => r.map_or(0.0, |r| r.filter_ms.values().sum()),
        }
    };
    if by != SortBy::Tree {
        // Stable: equal figures keep the tree's order.
        rows.sort_by(|a, b| figure(b.1).total_cmp(&figure(a.1)));
    }
    rows
}

/// The table for `width` columns: node (indented), state, kind, ranks below, rounds/s, lag, bytes/s in and out,
/// late arrivals, malformed messages, dropped dumps, and the milliseconds a second in each stream's filter
/// (`streams`: id and name). Rates are `-` until a node has been seen twice. `shift` columns after the node's
/// are left out, so that the ones further right come into a narrow view.
pub fn lines(
    rows: &[(usize, &TopologyNode)],
    rates: &HashMap<String, Rates>,
    streams: &[(u32, String)],
    width: u16,
    shift: usize,
) -> Lines {
    let (mut head, mut cols) = columns(streams);
    let mut body: Vec<Vec<String>> = rows
        .iter()
        .zip(ranks_shown(rows))
        .map(|(&(depth, n), ranks)| cells(depth, n, ranks, rates.get(&n.node_id), streams))
        .collect();
    let shifted = 1..1 + shift.min(max_shift(streams));
    head.drain(shifted.clone());
    cols.drain(shifted.clone());
    for row in &mut body {
        row.drain(shifted.clone());
    }
    lay_out(&head, &body, &cols, width, 14)
}

/// The fixed columns: heading, natural width and priority (0 is kept first).
const FIXED: [(&str, u16, u8); FIXED_COLUMNS] = [
    ("node", 0, 0),
    ("state", 8, 1),
    ("kind", 9, 5),
    ("ranks", 6, 3),
    ("rounds/s", 8, 0),
    ("lag", 5, 2),
    ("in/s", 11, 1),
    ("out/s", 11, 2),
    ("late", 6, 3),
    ("malformed", 9, 4),
    ("dropped", 7, 4),
];

/// The table's headings and columns: the fixed ones, then each stream's filter time, the first left out of a
/// narrow view.
fn columns(streams: &[(u32, String)]) -> (Vec<String>, Vec<Column>) {
    let mut head: Vec<String> = FIXED.iter().map(|(name, _, _)| name.to_string()).collect();
    let mut cols: Vec<Column> = FIXED
        .iter()
        .map(|&(_, width, priority)| Column { width, priority })
        .collect();
    for (_, name) in streams {
        let label = format!("{name} ms/s");
        cols.push(Column {
            width: label.chars().count().max(7) as u16,
            priority: 6,
        });
        head.push(label);
    }
    (head, cols)
}

/// The ranks each row shows: its node's ranks below; for a node that reports no ranks of its own (the
/// front-end), the ranks its children serve.
fn ranks_shown(rows: &[(usize, &TopologyNode)]) -> Vec<u32> {
    let ranks_of: HashMap<&str, u32> = rows
        .iter()
        .map(|(_, n)| (n.node_id.as_str(), n.ranks_below))
        .collect();
    rows.iter()
        .map(|(_, n)| {
            if n.ranks_below > 0 {
                n.ranks_below
            } else {
                n.children.iter().filter_map(|c| ranks_of.get(c.as_str())).sum()
            }
        })
        .collect()
}

/// A node's row: its id indented by `depth`, state, kind, `ranks`, its rates `r` (`-` until it has been seen
/// twice), lag, troubles, and the milliseconds a second in each stream's filter.
fn cells(
    depth: usize,
    n: &TopologyNode,
    ranks: u32,
    r: Option<&Rates>,
    streams: &[(u32, String)],
) -> Vec<String> {
    let dash = || "-".to_string();
    let mut cells = vec![
        format!("{:indent$}{}", "", n.node_id, indent = depth * 2),
        state_word(n.state).to_string(),
        kind_word(n.kind).to_string(),
        ranks.to_string(),
        r.map_or_else(dash, |r| format!("{:.1}", r.rounds)),
        n.lag_rounds.to_string(),
        r.map_or_else(dash, |r| bytes_per_second(r.bytes_in)),
        r.map_or_else(dash, |r| bytes_per_second(r.bytes_out)),
        n.late_arrivals.to_string(),
        n.malformed.to_string(),
        n.rank_dumps_dropped.to_string(),
    ];
    for (id, _) in streams {
        cells.push(r.map_or_else(dash, |r| {
            r.filter_ms
                .get(id)
                .map_or_else(|| "0.0".to_string(), |ms| format!("{ms:.1}"))
        }));
    }
    cells
}

/// The most columns [`lines`] shifts out: all but the node's and the last.
pub fn max_shift(streams: &[(u32, String)]) -> usize {
    FIXED_COLUMNS + streams.len() - 2
}

/// The columns before the streams' filter times.
const FIXED_COLUMNS: usize = 11;

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::v1::{NodeKind, NodeState};

    fn node(id: &str, parent: &str, children: &[&str], kind: NodeKind) -> TopologyNode {
        TopologyNode {
            node_id: id.into(),
            parent_id: parent.into(),
            children: children.iter().map(|c| c.to_string()).collect(),
            kind: kind as i32,
            state: NodeState::Attached as i32,
            ranks_below: 4,
            ..Default::default()
        }
    }

    fn tree() -> Vec<TopologyNode> {
        vec![
            node("agent:1", "relay:0", &[], NodeKind::Agent),
            node("relay:0", "frontend:0", &["agent:1", "agent:0"], NodeKind::Relay),
            node("frontend:0", "", &["relay:1", "relay:0"], NodeKind::Frontend),
            node("agent:0", "relay:0", &[], NodeKind::Agent),
            node("relay:1", "frontend:0", &["agent:2"], NodeKind::Relay),
            node("agent:2", "relay:1", &[], NodeKind::Agent),
        ]
    }

    #[test]
    fn the_tree_order_is_depth_first_with_children_by_id() {
        let nodes = tree();
        let order: Vec<(usize, &str)> = tree_order(&nodes)
            .into_iter()
            .map(|(d, n)| (d, n.node_id.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                (0, "frontend:0"),
                (1, "relay:0"),
                (2, "agent:0"),
                (2, "agent:1"),
                (1, "relay:1"),
                (2, "agent:2")
            ]
        );
    }

    #[test]
    fn ids_sort_by_their_number() {
        let mut ids = vec!["agent:10", "agent:2", "relay:0", "agent:1", "frontend"];
        ids.sort_by_key(|i| id_key(i));
        assert_eq!(ids, ["agent:1", "agent:2", "agent:10", "frontend", "relay:0"]);
    }

    #[test]
    fn sorting_by_a_figure_puts_the_largest_first() {
        let mut nodes = tree();
        nodes[5].lag_rounds = 9;
        let rates: HashMap<String, Rates> = [(
            "relay:1".to_string(),
            Rates {
                rounds: 50.0,
                ..Default::default()
            },
        )]
        .into();
        assert_eq!(sorted(&nodes, &rates, SortBy::Rounds)[0].1.node_id, "relay:1");
        assert_eq!(sorted(&nodes, &rates, SortBy::Lag)[0].1.node_id, "agent:2");
        // Equal figures keep the tree's order.
        assert_eq!(sorted(&nodes, &rates, SortBy::Lag)[1].1.node_id, "frontend:0");
        let mut by = SortBy::Tree;
        for _ in 0..5 {
            by = by.next();
        }
        assert_eq!(by, SortBy::Tree);
    }

    #[test]
    fn the_table_fits_80_columns_and_the_widest_has_every_column() {
        let mut nodes = tree();
        nodes[2].ranks_below = 0;
        let rates: HashMap<String, Rates> = [(
            "relay:0".to_string(),
            Rates {
                rounds: 9.5,
                bytes_in: 3.0 * 1024.0 * 1024.0,
                bytes_out: 2048.0,
                filter_ms: [(1, 12.5)].into(),
            },
        )]
        .into();
        let streams = [(1, "stats".to_string())];
        let rows = tree_order(&nodes);
        let wide = lines(&rows, &rates, &streams, 200, 0);
        for col in [
            "node",
            "state",
            "kind",
            "ranks",
            "rounds/s",
            "lag",
            "in/s",
            "out/s",
            "late",
            "malformed",
            "dropped",
            "stats ms/s",
        ] {
            assert!(wide.header.contains(col), "{col}: {}", wide.header);
        }
        let relay = &wide.rows[1];
        assert!(relay.starts_with("  relay:0"), "{relay}");
        for figure in ["9.5", "3.0 MiB/s", "2.0 KiB/s", "12.5", "attached", "relay"] {
            assert!(relay.contains(figure), "{figure}: {relay}");
        }
        // The front-end reports no ranks of its own: it shows its children's (4 + 4).
        assert_eq!(
            wide.rows[0].split_whitespace().nth(3),
            Some("8"),
            "{}",
            wide.rows[0]
        );
        // A node seen once has no rates yet.
        assert!(wide.rows[0].contains(" - "), "{}", wide.rows[0]);
        for width in [60u16, 80, 100] {
            let t = lines(&rows, &rates, &streams, width, 0);
            for l in std::iter::once(&t.header).chain(&t.rows) {
                assert!(l.chars().count() <= usize::from(width), "{width}: {l}");
            }
            // The rate of rounds and the state stay; the filter time goes first.
            assert!(
                t.header.contains("rounds/s") && t.header.contains("state"),
                "{}",
                t.header
            );
            assert!(!t.header.contains("stats ms/s"), "{}", t.header);
        }
        // Shifted, the columns on the right come into 80 columns, the node's first.
        let t = lines(&rows, &rates, &streams, 80, 7);
        for col in ["node", "late", "malformed", "dropped", "stats ms/s"] {
            assert!(t.header.contains(col), "{col}: {}", t.header);
        }
        assert!(
            t.rows[1].starts_with("  relay:0") && t.rows[1].ends_with("12.5"),
            "{}",
            t.rows[1]
        );
        // No further than the last column.
        assert_eq!(
            lines(&rows, &rates, &streams, 80, 99).header,
            lines(&rows, &rates, &streams, 80, 10).header
        );
        assert!(
            lines(&rows, &rates, &streams, 80, 10)
                .header
                .contains("stats ms/s")
        );
    }
}
