//! Tree shapes from a spec: `kary:F` (breadth-first fanout) and `b:F1xF2...` / `b:F^D` (balanced levels), laid
//! over a list of hosts.

use std::collections::HashMap;

use crate::mrnet::is_host_name;
use crate::{Builder, MAX_LEVELS, MAX_NODES, NodeName, Topology, TopologyError, spec_error};

impl Topology {
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
                if fanout == 1 && hosts.len() > MAX_LEVELS + 1 {
                    return Err(spec_error(format!(
                        "`kary:1` over {} hosts is a chain of more than {MAX_LEVELS} levels",
                        hosts.len()
                    )));
                }
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
        if fanouts.len().saturating_add(levels) > MAX_LEVELS {
            return Err(spec_error(format!("`b:{arg}` has more than {MAX_LEVELS} levels")));
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{hosts, n};

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
                "kary:1",
                &(0..66).map(|i| format!("h{i}")).collect::<Vec<_>>(),
                "`kary:1` over 66 hosts is a chain of more than 64 levels",
            ),
            // A chain found by the topology fuzz target: laying it out took 14 s and 1.4 GB.
            ("b:1^1777737", &h, "`b:1^1777737` has more than 64 levels"),
            ("b:1^30x1^40", &h, "`b:1^30x1^40` has more than 64 levels"),
            ("b:1^99999999999", &h, "`b:1^99999999999` has more than 64 levels"),
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
}
