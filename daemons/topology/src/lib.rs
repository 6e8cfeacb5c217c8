//! Tree shapes: MRNet topology files, `kary:`/`b:` specs and agent trees, reduced to who is whose parent.
//!
//! The model and its builder live here; `spec` reads the `kary:` / `b:` specs and `mrnet` reads and writes
//! MRNet's topology file format. Only the launchers (the `canopy` command, tests) need it: no daemon does.

#![forbid(unsafe_code)]

mod mrnet;
mod spec;

use std::collections::HashMap;
use std::fmt;

/// The largest tree a spec may ask for; beyond it a typo (`b:64^6`) would exhaust memory instead of failing.
const MAX_NODES: usize = 1 << 22;

/// The most levels below the root a spec may lay out. A tree of daemons is a few levels deep; a chain of millions
/// of fanout-1 levels (`b:1^1777737`) is a mistake that would take quadratic time to lay out.
const MAX_LEVELS: usize = 64;

/// One node of a topology: `host:index` in MRNet's notation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeName {
    pub host: String,
    pub index: u32,
}

impl NodeName {
    pub fn new(host: impl Into<String>, index: u32) -> Self {
        Self {
            host: host.into(),
            index,
        }
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.index)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TopologyError {
    #[error("topology line {line}, column {column}: {message}")]
    Parse {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("topology spec: {0}")]
    Spec(String),
}

/// A rooted tree of named nodes, stored in BFS order so that iteration and rendering are stable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    order: Vec<NodeName>,
    position: HashMap<NodeName, usize>,
    parents: Vec<Option<usize>>,
    children: Vec<Vec<NodeName>>,
    depth: usize,
}

impl Topology {
    /// A tree whose leaves are `leaves` agents under a root, with relays inserted so that no node has more than
    /// `fanout` children (fanout >= 2; with leaves <= fanout there are no relays). Names: root `frontend:0`,
    /// relays `relay:0`.. and agents `agent:0`.., both numbered in BFS order. Relay levels are built bottom-up,
    /// each grouping the level below into as few and as even groups as `fanout` allows, so every agent sits at
    /// depth ceil(log_fanout(leaves)) (at least 1).
    pub fn for_leaves(leaves: usize, fanout: usize) -> Result<Topology, TopologyError> {
        if fanout < 2 {
            return Err(spec_error(format!("fanout must be at least 2, got {fanout}")));
        }
        if leaves == 0 {
            return Err(spec_error("no leaves"));
        }
        if leaves > MAX_NODES {
            return Err(spec_error(format!(
                "{leaves} leaves exceed the limit of {MAX_NODES} nodes"
            )));
        }
        // group_sizes[k][j]: how many level-k items the j-th item of level k+1 holds (level 0 = agents).
        let mut group_sizes: Vec<Vec<usize>> = Vec::new();
        let mut width = leaves;
        while width > fanout {
            let groups = width.div_ceil(fanout);
            let (base, extra) = (width / groups, width % groups);
            group_sizes.push((0..groups).map(|j| base + usize::from(j < extra)).collect());
            width = groups;
        }

        let mut b = Builder::default();
        let (mut relays, mut agents) = (0, 0);
        let mut make = |b: &mut Builder, is_relay: bool| {
            let name = if is_relay {
                relays += 1;
                NodeName::new("relay", relays - 1)
            } else {
                agents += 1;
                NodeName::new("agent", agents - 1)
            };
            b.insert(name)
        };
        let root = b.insert(NodeName::new("frontend", 0));
        let mut level: Vec<usize> = Vec::with_capacity(width);
        for _ in 0..width {
            let id = make(&mut b, !group_sizes.is_empty());
            b.attach(root, id);
            level.push(id);
        }
        // Top-down, left to right: creation order is BFS order, which numbers relays and agents as promised.
        for k in (0..group_sizes.len()).rev() {
            let mut next = Vec::new();
            for (&parent, &size) in level.iter().zip(&group_sizes[k]) {
                for _ in 0..size {
                    let id = make(&mut b, k > 0);
                    b.attach(parent, id);
                    next.push(id);
                }
            }
            level = next;
        }
        Ok(b.finish(root))
    }

    /// Reads a hosts file: one host per line, `#` comments and blank lines ignored, duplicates kept (a host can
    /// run several nodes).
    pub fn read_hosts(text: &str) -> Vec<String> {
        text.lines()
            .map(|line| line.split('#').next().unwrap_or("").trim())
            .filter(|line| !line.is_empty())
            .map(str::to_owned)
            .collect()
    }

    pub fn root(&self) -> &NodeName {
        &self.order[0]
    }

    /// Every node, in BFS order from the root.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeName> {
        self.order.iter()
    }

    /// The node's parent; `None` for the root and for nodes not in the tree.
    pub fn parent(&self, node: &NodeName) -> Option<&NodeName> {
        let &at = self.position.get(node)?;
        self.parents[at].map(|p| &self.order[p])
    }

    /// The node's children in order; empty for leaves and for nodes not in the tree.
    pub fn children(&self, node: &NodeName) -> &[NodeName] {
        self.position.get(node).map_or(&[], |&at| &self.children[at])
    }

    /// The nodes without children, in BFS order.
    pub fn leaves(&self) -> Vec<&NodeName> {
        self.order
            .iter()
            .zip(&self.children)
            .filter(|(_, c)| c.is_empty())
            .map(|(n, _)| n)
            .collect()
    }

    /// Edges from the root to the deepest leaf; the root alone is 0.
    pub fn depth(&self) -> usize {
        self.depth
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Always false: a topology has at least its root.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Renders one line per node in BFS order: `NODE <= PARENT` (root: `NODE <= -`). Stable, for
    /// `canopy topology`.
    pub fn render_parents(&self) -> String {
        let mut out = String::new();
        for (node, parent) in self.order.iter().zip(&self.parents) {
            match parent {
                Some(p) => out.push_str(&format!("{node} <= {}\n", self.order[*p])),
                None => out.push_str(&format!("{node} <= -\n")),
            }
        }
        out
    }
}

fn spec_error(message: impl Into<String>) -> TopologyError {
    TopologyError::Spec(message.into())
}

/// A tree under construction, by insertion ids; `finish` reorders it breadth-first.
#[derive(Default)]
struct Builder {
    names: Vec<NodeName>,
    ids: HashMap<NodeName, usize>,
    parent: Vec<Option<usize>>,
    children: Vec<Vec<usize>>,
}

impl Builder {
    /// Names in BFS order, with `parent_of(i) < i` for every non-root position.
    fn from_bfs(names: Vec<NodeName>, parent_of: impl Fn(usize) -> usize) -> Builder {
        let mut b = Builder::default();
        for (i, name) in names.into_iter().enumerate() {
            let id = b.insert(name);
            if i > 0 {
                b.attach(parent_of(i), id);
            }
        }
        b
    }

    fn insert(&mut self, name: NodeName) -> usize {
        let id = self.names.len();
        self.ids.insert(name.clone(), id);
        self.names.push(name);
        self.parent.push(None);
        self.children.push(Vec::new());
        id
    }

    fn attach(&mut self, parent: usize, child: usize) {
        self.parent[child] = Some(parent);
        self.children[parent].push(child);
    }

    fn is_ancestor_or_self(&self, candidate: usize, mut node: usize) -> bool {
        loop {
            if node == candidate {
                return true;
            }
            match self.parent[node] {
                Some(p) => node = p,
                None => return false,
            }
        }
    }

    fn finish(self, root: usize) -> Topology {
        let mut bfs = vec![root];
        let mut level = vec![0usize; self.names.len()];
        let mut at = 0;
        while at < bfs.len() {
            let id = bfs[at];
            for &c in &self.children[id] {
                level[c] = level[id] + 1;
                bfs.push(c);
            }
            at += 1;
        }
        let mut new_pos = vec![usize::MAX; self.names.len()];
        for (pos, &id) in bfs.iter().enumerate() {
            new_pos[id] = pos;
        }
        let order: Vec<NodeName> = bfs.iter().map(|&id| self.names[id].clone()).collect();
        Topology {
            position: order.iter().cloned().enumerate().map(|(i, n)| (n, i)).collect(),
            parents: bfs
                .iter()
                .map(|&id| self.parent[id].map(|p| new_pos[p]))
                .collect(),
            children: bfs
                .iter()
                .map(|&id| self.children[id].iter().map(|&c| self.names[c].clone()).collect())
                .collect(),
            depth: bfs.iter().map(|&id| level[id]).max().unwrap_or(0),
            order,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn n(host: &str, index: u32) -> NodeName {
        NodeName::new(host, index)
    }

    pub(crate) fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|h| h.to_string()).collect()
    }

    #[test]
    fn unknown_nodes_have_no_parent_and_no_children() {
        let t = Topology::parse_mrnet("r:0 => a:0 ;").unwrap();
        assert_eq!(t.parent(&n("zz", 0)), None);
        assert!(t.children(&n("zz", 0)).is_empty());
        assert!(t.children(&n("a", 0)).is_empty());
    }

    #[test]
    fn render_parents_is_exact() {
        let t = Topology::from_spec("kary:2", &hosts(&["a", "b", "a", "a"])).unwrap();
        assert_eq!(
            t.render_parents(),
            "a:0 <= -\nb:0 <= a:0\na:1 <= a:0\na:2 <= b:0\n"
        );
        assert_eq!(t.to_mrnet(), "a:0 => b:0 a:1 ;\nb:0 => a:2 ;\n");
    }

    #[test]
    fn for_leaves_respects_fanout_and_minimal_depth() {
        for leaves in 1..=40usize {
            for fanout in 2..=9usize {
                let what = format!("{leaves} leaves, fanout {fanout}");
                let t = Topology::for_leaves(leaves, fanout).unwrap();
                assert_eq!(t.root(), &n("frontend", 0), "{what}");

                let got: Vec<&NodeName> = t.leaves();
                let want: Vec<NodeName> = (0..leaves as u32).map(|i| n("agent", i)).collect();
                assert_eq!(got, want.iter().collect::<Vec<_>>(), "{what}");

                let relays: Vec<&NodeName> = t.nodes().filter(|x| x.host == "relay").collect();
                let want: Vec<NodeName> = (0..relays.len() as u32).map(|i| n("relay", i)).collect();
                assert_eq!(relays, want.iter().collect::<Vec<_>>(), "{what}");
                assert_eq!(t.len(), 1 + relays.len() + leaves, "{what}");
                if leaves <= fanout {
                    assert!(relays.is_empty(), "{what}");
                }

                for node in t.nodes() {
                    assert!(
                        t.children(node).len() <= fanout,
                        "{what}: {node} has too many children"
                    );
                    for child in t.children(node) {
                        assert_eq!(t.parent(child), Some(node), "{what}");
                    }
                }

                // ceil(log_fanout(leaves)), but at least one edge from the root to an agent.
                let mut want_depth = 1;
                while fanout.pow(want_depth as u32) < leaves {
                    want_depth += 1;
                }
                assert_eq!(t.depth(), want_depth, "{what}");
                for agent in t.leaves() {
                    let mut hops = 0;
                    let mut at = agent;
                    while let Some(p) = t.parent(at) {
                        hops += 1;
                        at = p;
                    }
                    assert_eq!(at, t.root(), "{what}: {agent} unreachable");
                    assert_eq!(hops, want_depth, "{what}: {agent} at the wrong depth");
                }
            }
        }
    }

    #[test]
    fn for_leaves_makes_even_groups() {
        let t = Topology::for_leaves(4, 2).unwrap();
        assert_eq!(
            t.render_parents(),
            "frontend:0 <= -\n\
             relay:0 <= frontend:0\n\
             relay:1 <= frontend:0\n\
             agent:0 <= relay:0\n\
             agent:1 <= relay:0\n\
             agent:2 <= relay:1\n\
             agent:3 <= relay:1\n"
        );

        let t = Topology::for_leaves(5, 4).unwrap();
        assert_eq!(t.children(&n("relay", 0)).len(), 3);
        assert_eq!(t.children(&n("relay", 1)).len(), 2);

        let t = Topology::for_leaves(10, 3).unwrap();
        assert_eq!(t.children(t.root()), &[n("relay", 0), n("relay", 1)]);
        assert_eq!(t.children(&n("relay", 0)), &[n("relay", 2), n("relay", 3)]);
        assert_eq!(t.children(&n("relay", 1)), &[n("relay", 4), n("relay", 5)]);
        let sizes: Vec<usize> = (2..6).map(|i| t.children(&n("relay", i)).len()).collect();
        assert_eq!(sizes, [3, 3, 2, 2]);
        assert_eq!(t.parent(&n("agent", 6)), Some(&n("relay", 4)));

        let t = Topology::for_leaves(3, 4).unwrap();
        assert_eq!(
            t.children(t.root()),
            &[n("agent", 0), n("agent", 1), n("agent", 2)]
        );
    }

    #[test]
    fn for_leaves_rejects_bad_arguments() {
        assert_eq!(
            Topology::for_leaves(4, 1),
            Err(TopologyError::Spec(
                "fanout must be at least 2, got 1".to_string()
            ))
        );
        assert_eq!(
            Topology::for_leaves(0, 4),
            Err(TopologyError::Spec("no leaves".to_string()))
        );
    }

    #[test]
    fn read_hosts_skips_comments_and_blanks_and_keeps_duplicates() {
        let text = "# cluster hosts\nnode1\n\n  node2  # spare\nnode1\n#node3\n\t\n";
        assert_eq!(Topology::read_hosts(text), ["node1", "node2", "node1"]);
        assert!(Topology::read_hosts("").is_empty());
    }
}
