//! Tree shapes: MRNet topology files, `kary:`/`b:` specs and agent trees, reduced to who is whose parent.

use std::collections::HashMap;
use std::fmt;

/// The largest tree a spec may ask for; beyond it a typo (`b:64^6`) would exhaust memory instead of failing.
const MAX_NODES: usize = 1 << 22;

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
    /// Parses MRNet's topology file format: lines `host:N => child:N child:N ;`, `#` comments to end of line,
    /// whitespace and newlines free (a rule may span lines; it ends at `;`). The first rule's parent is the root.
    /// A rule `host:N ;` (no children) is accepted as MRNet does, so a lone root can be written down, and a
    /// parent may have several rules, whose children are appended.
    /// Errors: a `TopologyError::Parse { line, column, message }` (1-based) for: missing `=>`, missing `;`,
    /// a name without `:N` or with a non-numeric N, a node that has two parents, a node that is its own
    /// ancestor (cycle), a rule whose parent never appeared as a child of an earlier rule nor is the root
    /// (disconnected), an empty file. Line/column point at the offending token.
    pub fn parse_mrnet(text: &str) -> Result<Topology, TopologyError> {
        Parser {
            tokens: lex(text),
            pos: 0,
        }
        .parse()
    }

    /// A spec string: `kary:F` (every node has up to F children, filled breadth-first) or `b:F1xF2x...` /
    /// `b:F^D` (balanced: level i has fanout Fi; `b:8^3` = 1 root, 8, 64, 512 leaves; the two forms mix, as
    /// in `b:8^2x4`), laid over `hosts` (round-robin assignment of BFS positions to hosts; the index counts
    /// per host from 0). For kary the number of nodes is `hosts.len()`; for balanced it is given by the spec.
    pub fn from_spec(spec: &str, hosts: &[String]) -> Result<Topology, TopologyError> {
        if hosts.is_empty() {
            return Err(spec_error("no hosts"));
        }
        if let Some(bad) = hosts.iter().find(|h| !is_host_name(h)) {
            return Err(spec_error(format!("invalid host name `{bad}`")));
        }
        let spec = spec.trim();
        let Some((kind, arg)) = spec.split_once(':') else {
            return Err(spec_error(format!(
                "`{spec}` is not `kary:F`, `b:F1xF2...` or `b:F^D`"
            )));
        };
        match kind {
            "kary" => {
                let fanout = parse_count(arg, "fanout")?;
                let names = round_robin(hosts, hosts.len());
                Ok(Builder::from_bfs(names, |i| (i - 1) / fanout).finish(0))
            }
            "b" => {
                let fanouts = parse_balanced(arg)?;
                let mut parents = Vec::new();
                let (mut level_start, mut level_len) = (0, 1);
                for fanout in fanouts {
                    for j in 0..level_len * fanout {
                        parents.push(level_start + j / fanout);
                    }
                    level_start += level_len;
                    level_len *= fanout;
                }
                let names = round_robin(hosts, parents.len() + 1);
                Ok(Builder::from_bfs(names, |i| parents[i - 1]).finish(0))
            }
            _ => Err(spec_error(format!(
                "unknown kind `{kind}` (expected `kary` or `b`)"
            ))),
        }
    }

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

    /// Renders back to MRNet format: one rule per non-leaf node in BFS order (a lone root as `host:N ;`), so
    /// that `parse_mrnet(&t.to_mrnet()) == Ok(t)`.
    pub fn to_mrnet(&self) -> String {
        if self.order.len() == 1 {
            return format!("{} ;\n", self.order[0]);
        }
        let mut out = String::new();
        for (node, children) in self.order.iter().zip(&self.children) {
            if children.is_empty() {
                continue;
            }
            out.push_str(&format!("{node} =>"));
            for child in children {
                out.push_str(&format!(" {child}"));
            }
            out.push_str(" ;\n");
        }
        out
    }
}

fn spec_error(message: impl Into<String>) -> TopologyError {
    TopologyError::Spec(message.into())
}

/// MRNet's scanner accepts `[a-zA-Z0-9][a-zA-Z0-9._-]*`; anything else would not survive `to_mrnet`.
fn is_host_name(host: &str) -> bool {
    host.starts_with(|c: char| c.is_ascii_alphanumeric()) && host.chars().all(is_host_char)
}

fn is_host_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')
}

fn parse_count(text: &str, what: &str) -> Result<usize, TopologyError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(spec_error(format!("missing {what}")));
    }
    match text.parse::<usize>() {
        Ok(0) => Err(spec_error(format!("{what} must be at least 1"))),
        Ok(n) => Ok(n),
        Err(_) => Err(spec_error(format!("{what} `{text}` is not a positive number"))),
    }
}

/// Expands `F1xF2^D...` into one fanout per level, refusing trees larger than `MAX_NODES` before building them.
fn parse_balanced(arg: &str) -> Result<Vec<usize>, TopologyError> {
    let mut fanouts = Vec::new();
    let (mut nodes, mut level_len) = (1usize, 1usize);
    for term in arg.split('x') {
        let (fanout, levels) = match term.split_once('^') {
            Some((f, d)) => (parse_count(f, "fanout")?, parse_count(d, "level count")?),
            None => (parse_count(term, "fanout")?, 1),
        };
        for _ in 0..levels {
            level_len = level_len.saturating_mul(fanout);
            nodes = nodes.saturating_add(level_len);
            if nodes > MAX_NODES {
                return Err(spec_error(format!("`b:{arg}` has more than {MAX_NODES} nodes")));
            }
            fanouts.push(fanout);
        }
    }
    Ok(fanouts)
}

/// Names `count` BFS positions after `hosts` in turn, numbering each host's nodes from 0.
fn round_robin(hosts: &[String], count: usize) -> Vec<NodeName> {
    let mut used: HashMap<&str, u32> = HashMap::new();
    (0..count)
        .map(|i| {
            let host = hosts[i % hosts.len()].as_str();
            let index = used.entry(host).or_insert(0);
            *index += 1;
            NodeName::new(host, *index - 1)
        })
        .collect()
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind<'a> {
    Word(&'a str),
    Colon,
    Arrow,
    Semi,
    Stray(char),
    End,
}

#[derive(Debug, Clone, Copy)]
struct Token<'a> {
    kind: Kind<'a>,
    line: usize,
    column: usize,
}

impl fmt::Display for Token<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::Word(w) => write!(f, "`{w}`"),
            Kind::Colon => f.write_str("`:`"),
            Kind::Arrow => f.write_str("`=>`"),
            Kind::Semi => f.write_str("`;`"),
            Kind::Stray(c) => write!(f, "`{c}`"),
            Kind::End => f.write_str("end of file"),
        }
    }
}

/// Splits the whole text up front; characters MRNet would reject become `Stray` tokens so that the parser
/// reports errors in file order. The `End` token sits just after the last real token.
fn lex(text: &str) -> Vec<Token<'_>> {
    let mut tokens = Vec::new();
    let (mut line, mut column) = (1, 1);
    let mut end = (1, 1);
    let mut chars = text.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        let (tline, tcolumn) = (line, column);
        column += 1;
        let kind = match c {
            '\n' => {
                line += 1;
                column = 1;
                continue;
            }
            '#' => {
                while chars.next_if(|&(_, c)| c != '\n').is_some() {}
                continue;
            }
            c if c.is_whitespace() => continue,
            ':' => Kind::Colon,
            ';' => Kind::Semi,
            '=' if chars.next_if(|&(_, c)| c == '>').is_some() => {
                column += 1;
                Kind::Arrow
            }
            c if is_host_char(c) => {
                let mut stop = start + c.len_utf8();
                while let Some((i, c)) = chars.next_if(|&(_, c)| is_host_char(c)) {
                    stop = i + c.len_utf8();
                    column += 1;
                }
                Kind::Word(&text[start..stop])
            }
            c => Kind::Stray(c),
        };
        end = (line, column);
        tokens.push(Token {
            kind,
            line: tline,
            column: tcolumn,
        });
    }
    tokens.push(Token {
        kind: Kind::End,
        line: end.0,
        column: end.1,
    });
    tokens
}

fn parse_error(at: Token<'_>, message: impl Into<String>) -> TopologyError {
    TopologyError::Parse {
        line: at.line,
        column: at.column,
        message: message.into(),
    }
}

struct Parser<'a> {
    tokens: Vec<Token<'a>>,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Token<'a> {
        self.tokens[self.pos]
    }

    fn next(&mut self) -> Token<'a> {
        let token = self.tokens[self.pos];
        if token.kind != Kind::End {
            self.pos += 1;
        }
        token
    }

    fn parse(mut self) -> Result<Topology, TopologyError> {
        let mut tree = Builder::default();
        // The line of the rule that attached each node, to point a two-parents error at the first one.
        let mut attached_on: Vec<usize> = Vec::new();
        let mut root = None;
        while self.peek().kind != Kind::End {
            let (name, at) = self.host()?;
            let parent = match root {
                None => {
                    let id = tree.insert(name.clone());
                    attached_on.push(at.line);
                    root = Some(id);
                    id
                }
                // Only the root and attached children are ever inserted, so membership means connected.
                Some(_) => match tree.ids.get(&name) {
                    Some(&id) => id,
                    None => {
                        return Err(parse_error(
                            at,
                            format!(
                                "`{name}` is neither the root nor a child in an earlier rule (disconnected)"
                            ),
                        ));
                    }
                },
            };
            let after = self.next();
            match after.kind {
                Kind::Semi => continue,
                Kind::Arrow => {}
                _ => {
                    return Err(parse_error(
                        after,
                        format!("expected `=>` after `{name}`, found {after}"),
                    ));
                }
            }
            let mut count = 0;
            loop {
                let token = self.peek();
                match token.kind {
                    Kind::Semi if count == 0 => {
                        return Err(parse_error(
                            token,
                            format!("rule for `{name}` has no children after `=>`"),
                        ));
                    }
                    Kind::Semi => {
                        self.next();
                        break;
                    }
                    Kind::End => {
                        return Err(parse_error(
                            token,
                            format!("missing `;` at the end of the rule for `{name}`"),
                        ));
                    }
                    _ => {}
                }
                let (child, at) = self.host()?;
                if self.peek().kind == Kind::Arrow {
                    return Err(parse_error(at, format!("missing `;` before `{child} =>`")));
                }
                if let Some(&existing) = tree.ids.get(&child) {
                    if tree.is_ancestor_or_self(existing, parent) {
                        return Err(parse_error(
                            at,
                            format!("`{child}` would be its own ancestor (cycle)"),
                        ));
                    }
                    let first = tree.parent[existing].unwrap_or(existing);
                    return Err(parse_error(
                        at,
                        format!(
                            "`{child}` already has parent `{}` (line {})",
                            tree.names[first], attached_on[existing]
                        ),
                    ));
                }
                let id = tree.insert(child);
                attached_on.push(at.line);
                tree.attach(parent, id);
                count += 1;
            }
        }
        match root {
            Some(root) => Ok(tree.finish(root)),
            None => Err(parse_error(self.peek(), "topology file is empty")),
        }
    }

    /// `host:index`, returning the token of the host for error positions.
    fn host(&mut self) -> Result<(NodeName, Token<'a>), TopologyError> {
        let at = self.next();
        let Kind::Word(host) = at.kind else {
            return Err(parse_error(
                at,
                format!("expected a node name `host:index`, found {at}"),
            ));
        };
        if !is_host_name(host) {
            return Err(parse_error(
                at,
                format!("host name `{host}` must start with a letter or digit"),
            ));
        }
        if self.peek().kind != Kind::Colon {
            return Err(parse_error(at, format!("node name `{host}` lacks `:index`")));
        }
        self.next();
        let index = self.next();
        match index.kind {
            Kind::Word(digits) if digits.bytes().all(|b| b.is_ascii_digit()) => match digits.parse::<u32>() {
                Ok(n) => Ok((NodeName::new(host, n), at)),
                Err(_) => Err(parse_error(
                    index,
                    format!("index `{digits}` of `{host}` is out of range"),
                )),
            },
            Kind::Word(word) => Err(parse_error(
                index,
                format!("index `{word}` of `{host}` is not a number"),
            )),
            _ => Err(parse_error(
                index,
                format!("expected an index after `{host}:`, found {index}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(host: &str, index: u32) -> NodeName {
        NodeName::new(host, index)
    }

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|h| h.to_string()).collect()
    }

    fn parse_err(line: usize, column: usize, message: &str) -> TopologyError {
        TopologyError::Parse {
            line,
            column,
            message: message.to_string(),
        }
    }

    /// Number of nodes at each depth, from the root down.
    fn level_sizes(t: &Topology) -> Vec<usize> {
        let mut sizes = vec![0; t.depth() + 1];
        for node in t.nodes() {
            let mut d = 0;
            let mut at = node;
            while let Some(p) = t.parent(at) {
                d += 1;
                at = p;
            }
            sizes[d] += 1;
        }
        sizes
    }

    const REAL_FILE: &str = "\
# MRNet topology: front-end on the login node, two communication nodes
# generated by hand; comments may follow rules too
login01:0 =>
    node-a.cluster:0    # first comm node
    node-b.cluster:0
    ;

node-a.cluster:0 => be_1:0 be_1:1
                    be_2:0 ;   # two back-ends share be_1
node-b.cluster:0=>be_3:0;
\tbe_3:0 => leaf:7 ;
login01:0 => extra:0 ;  # a second rule for a parent appends, as in MRNet
";

    #[test]
    fn parses_a_multi_line_file_with_comments() {
        let t = Topology::parse_mrnet(REAL_FILE).unwrap();
        assert_eq!(t.root(), &n("login01", 0));
        assert_eq!(
            t.children(t.root()),
            &[n("node-a.cluster", 0), n("node-b.cluster", 0), n("extra", 0)]
        );
        assert_eq!(
            t.children(&n("node-a.cluster", 0)),
            &[n("be_1", 0), n("be_1", 1), n("be_2", 0)]
        );
        assert_eq!(t.parent(&n("leaf", 7)), Some(&n("be_3", 0)));
        assert_eq!(t.parent(&n("be_3", 0)), Some(&n("node-b.cluster", 0)));
        assert_eq!(t.parent(t.root()), None);
        let bfs: Vec<String> = t.nodes().map(ToString::to_string).collect();
        assert_eq!(
            bfs,
            [
                "login01:0",
                "node-a.cluster:0",
                "node-b.cluster:0",
                "extra:0",
                "be_1:0",
                "be_1:1",
                "be_2:0",
                "be_3:0",
                "leaf:7"
            ]
        );
        let leaves: Vec<String> = t.leaves().iter().map(ToString::to_string).collect();
        assert_eq!(leaves, ["extra:0", "be_1:0", "be_1:1", "be_2:0", "leaf:7"]);
        assert_eq!(t.len(), 9);
        assert!(!t.is_empty());
        assert_eq!(t.depth(), 3);
    }

    #[test]
    fn a_lone_root_rule_is_a_one_node_tree() {
        let t = Topology::parse_mrnet("  fe:0 ;  # nothing below\n").unwrap();
        assert_eq!(t.root(), &n("fe", 0));
        assert_eq!(t.len(), 1);
        assert_eq!(t.depth(), 0);
        assert_eq!(t.leaves(), [&n("fe", 0)]);
    }

    #[test]
    fn unknown_nodes_have_no_parent_and_no_children() {
        let t = Topology::parse_mrnet("r:0 => a:0 ;").unwrap();
        assert_eq!(t.parent(&n("zz", 0)), None);
        assert!(t.children(&n("zz", 0)).is_empty());
        assert!(t.children(&n("a", 0)).is_empty());
    }

    #[test]
    fn parse_errors_point_at_the_offending_token() {
        let cases: &[(&str, &str, TopologyError)] = &[
            (
                "missing arrow",
                "root:0 => a:0 ;\na:0 b:1 ;\n",
                parse_err(2, 5, "expected `=>` after `a:0`, found `b`"),
            ),
            (
                "single equals",
                "root:0 = a:0 ;",
                parse_err(1, 8, "expected `=>` after `root:0`, found `=`"),
            ),
            (
                "missing semicolon before the next rule",
                "root:0 => a:0 b:0\na:0 => c:0 ;\n",
                parse_err(2, 1, "missing `;` before `a:0 =>`"),
            ),
            (
                "missing semicolon at end of file",
                "root:0 => a:0 b:0  # trailing\n\n",
                parse_err(1, 18, "missing `;` at the end of the rule for `root:0`"),
            ),
            (
                "missing index",
                "root:0 => a:0 ;\na:0 => b ;\n",
                parse_err(2, 8, "node name `b` lacks `:index`"),
            ),
            (
                "empty index",
                "r:0 => a: ;",
                parse_err(1, 11, "expected an index after `a:`, found `;`"),
            ),
            (
                "non-numeric index",
                "root:0 => a:x ;",
                parse_err(1, 13, "index `x` of `a` is not a number"),
            ),
            (
                "negative index",
                "root:0 => a:-1 ;",
                parse_err(1, 13, "index `-1` of `a` is not a number"),
            ),
            (
                "index too large",
                "r:0 => a:4294967296 ;",
                parse_err(1, 10, "index `4294967296` of `a` is out of range"),
            ),
            (
                "two parents",
                "root:0 => a:0 b:0 ;\na:0 => c:0 ;\nb:0 =>\n  c:0 ;\n",
                parse_err(4, 3, "`c:0` already has parent `a:0` (line 2)"),
            ),
            (
                "listed twice in one rule",
                "r:0 => a:0 a:0 ;",
                parse_err(1, 12, "`a:0` already has parent `r:0` (line 1)"),
            ),
            (
                "own child",
                "a:0 => a:0 ;",
                parse_err(1, 8, "`a:0` would be its own ancestor (cycle)"),
            ),
            (
                "cycle through the root",
                "root:0 => a:0 ;\na:0 => b:0 ;\nb:0 => root:0 ;\n",
                parse_err(3, 8, "`root:0` would be its own ancestor (cycle)"),
            ),
            (
                "cycle below the root",
                "r:0 => a:0 ;\na:0 => b:0 ;\nb:0 => c:0 a:0 ;\n",
                parse_err(3, 12, "`a:0` would be its own ancestor (cycle)"),
            ),
            (
                "disconnected",
                "root:0 => a:0 ;\n# later\nx:0 => y:0 ;\n",
                parse_err(
                    3,
                    1,
                    "`x:0` is neither the root nor a child in an earlier rule (disconnected)",
                ),
            ),
            (
                "rule before its parent's rule",
                "r:0 => a:0 ;\nb:0 => c:0 ;\na:0 => b:0 ;\n",
                parse_err(
                    2,
                    1,
                    "`b:0` is neither the root nor a child in an earlier rule (disconnected)",
                ),
            ),
            ("empty file", "", parse_err(1, 1, "topology file is empty")),
            (
                "only comments",
                "# nothing\n\n   # here\n",
                parse_err(1, 1, "topology file is empty"),
            ),
            (
                "no children",
                "root:0 => ;",
                parse_err(1, 11, "rule for `root:0` has no children after `=>`"),
            ),
            (
                "columns count characters",
                "r:0 => a:0 ; # héllo\n\tä:0",
                parse_err(2, 2, "expected a node name `host:index`, found `ä`"),
            ),
            (
                "host starting with punctuation",
                "r:0 => -a:0 ;",
                parse_err(1, 8, "host name `-a` must start with a letter or digit"),
            ),
        ];
        for (what, text, want) in cases {
            assert_eq!(Topology::parse_mrnet(text).as_ref(), Err(want), "{what}");
        }
    }

    #[test]
    fn parse_error_display_names_line_and_column() {
        let err = Topology::parse_mrnet("r:0 => a:x ;").unwrap_err();
        assert_eq!(
            err.to_string(),
            "topology line 1, column 10: index `x` of `a` is not a number"
        );
    }

    #[test]
    fn kary_fills_breadth_first_over_the_hosts() {
        let names: Vec<String> = (0..10).map(|i| format!("h{i}")).collect();
        let t = Topology::from_spec("kary:3", &names).unwrap();
        assert_eq!(t.len(), 10);
        assert_eq!(t.root(), &n("h0", 0));
        assert_eq!(t.children(&n("h0", 0)), &[n("h1", 0), n("h2", 0), n("h3", 0)]);
        for i in 1..10 {
            let parent = format!("h{}", (i - 1) / 3);
            assert_eq!(t.parent(&n(&format!("h{i}"), 0)), Some(&n(&parent, 0)), "h{i}");
        }
        assert_eq!(t.depth(), 2);
        assert_eq!(level_sizes(&t), [1, 3, 6]);
    }

    #[test]
    fn kary_numbers_repeated_hosts_per_host() {
        let t = Topology::from_spec("kary:2", &hosts(&["a", "b", "a", "a"])).unwrap();
        let bfs: Vec<&NodeName> = t.nodes().collect();
        assert_eq!(bfs, [&n("a", 0), &n("b", 0), &n("a", 1), &n("a", 2)]);
        assert_eq!(t.parent(&n("a", 2)), Some(&n("b", 0)));
    }

    #[test]
    fn kary_over_one_host_is_a_lone_root() {
        let t = Topology::from_spec("kary:8", &hosts(&["fe"])).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t.depth(), 0);
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
    fn balanced_power_spec_has_the_level_sizes() {
        let t = Topology::from_spec("b:8^3", &hosts(&["n1", "n2", "n3"])).unwrap();
        assert_eq!(t.len(), 1 + 8 + 64 + 512);
        assert_eq!(level_sizes(&t), [1, 8, 64, 512]);
        assert_eq!(t.leaves().len(), 512);
        assert_eq!(t.depth(), 3);
        for node in t.nodes() {
            let c = t.children(node).len();
            assert!(c == 0 || c == 8, "{node} has {c} children");
        }
        // Round-robin over 3 hosts: 585 positions give n1 195 nodes, numbered 0..195.
        assert_eq!(t.nodes().filter(|x| x.host == "n1").count(), 195);
        assert!(t.nodes().any(|x| *x == n("n1", 194)));
        assert_eq!(
            t,
            Topology::from_spec("b:8x8x8", &hosts(&["n1", "n2", "n3"])).unwrap()
        );
    }

    #[test]
    fn balanced_levels_take_their_own_fanouts() {
        let t = Topology::from_spec("b:2x3", &hosts(&["h0", "h1", "h2", "h3"])).unwrap();
        assert_eq!(level_sizes(&t), [1, 2, 6]);
        assert_eq!(t.children(&n("h0", 0)), &[n("h1", 0), n("h2", 0)]);
        assert_eq!(t.children(&n("h1", 0)), &[n("h3", 0), n("h0", 1), n("h1", 1)]);
        assert_eq!(t.children(&n("h2", 0)), &[n("h2", 1), n("h3", 1), n("h0", 2)]);
        let mixed = Topology::from_spec(" b:2^2x3 ", &hosts(&["h"])).unwrap();
        assert_eq!(level_sizes(&mixed), [1, 2, 4, 12]);
        assert_eq!(mixed.root(), &n("h", 0));
        assert!(mixed.nodes().any(|x| *x == n("h", 18)));
    }

    #[test]
    fn spec_errors_name_the_problem() {
        let h = hosts(&["a", "b"]);
        let cases: &[(&str, &[String], &str)] = &[
            ("kary:0", &h, "fanout must be at least 1"),
            ("kary:x", &h, "fanout `x` is not a positive number"),
            ("kary:-2", &h, "fanout `-2` is not a positive number"),
            ("kary:", &h, "missing fanout"),
            ("tree:4", &h, "unknown kind `tree` (expected `kary` or `b`)"),
            ("8", &h, "`8` is not `kary:F`, `b:F1xF2...` or `b:F^D`"),
            ("b:8x0", &h, "fanout must be at least 1"),
            ("b:8x", &h, "missing fanout"),
            ("b:8^0", &h, "level count must be at least 1"),
            ("b:^3", &h, "missing fanout"),
            ("b:64^6", &h, "`b:64^6` has more than 4194304 nodes"),
            (
                "b:1^99999999999",
                &h,
                "`b:1^99999999999` has more than 4194304 nodes",
            ),
            ("kary:2", &[], "no hosts"),
            ("b:2", &[], "no hosts"),
        ];
        for (spec, hosts, want) in cases {
            assert_eq!(
                Topology::from_spec(spec, hosts),
                Err(TopologyError::Spec(want.to_string())),
                "{spec}"
            );
        }
        let bad = hosts(&["ok", "bad host"]);
        assert_eq!(
            Topology::from_spec("kary:2", &bad).unwrap_err().to_string(),
            "topology spec: invalid host name `bad host`"
        );
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
    fn to_mrnet_round_trips() {
        let trees = [
            Topology::parse_mrnet(REAL_FILE).unwrap(),
            Topology::from_spec("kary:8", &hosts(&["fe"])).unwrap(),
            Topology::from_spec("kary:3", &hosts(&["a", "b", "a", "c", "a", "b", "d"])).unwrap(),
            Topology::from_spec("b:3x2^2", &hosts(&["x.example.org", "y-1", "z_2"])).unwrap(),
            Topology::for_leaves(1, 2).unwrap(),
            Topology::for_leaves(40, 3).unwrap(),
        ];
        for t in trees {
            let text = t.to_mrnet();
            assert_eq!(Topology::parse_mrnet(&text), Ok(t), "{text}");
        }
        assert_eq!(
            Topology::from_spec("kary:8", &hosts(&["fe"])).unwrap().to_mrnet(),
            "fe:0 ;\n"
        );
    }

    #[test]
    fn read_hosts_skips_comments_and_blanks_and_keeps_duplicates() {
        let text = "# cluster hosts\nnode1\n\n  node2  # spare\nnode1\n#node3\n\t\n";
        assert_eq!(Topology::read_hosts(text), ["node1", "node2", "node1"]);
        assert!(Topology::read_hosts("").is_empty());
    }
}
