//! MRNet topology files (`canopy up --topology FILE`, `canopy topology --file`), tree specs (`b:8^3`,
//! `kary:4`) over a hosts file, and the generated trees for a number of leaves.

use canopy_topology::Topology;

use crate::input::Input;

/// The most nodes a spec or a number of leaves may ask for here: larger trees are valid (up to the library's
/// own limit) but cost milliseconds to seconds to build and check, which tells a fuzzer nothing new.
const MAX_SPEC_NODES: u128 = 256;

pub fn topology(data: &[u8]) {
    let mut input = Input::new(data);
    match input.below(3) {
        0 => {
            let text = String::from_utf8_lossy(input.rest());
            if let Ok(t) = Topology::parse_mrnet(&text) {
                check(&t);
            }
        }
        1 => {
            let spec = input.string(64);
            let hosts = Topology::read_hosts(&String::from_utf8_lossy(input.rest()));
            if !too_large(&spec)
                && let Ok(t) = Topology::from_spec(&spec, &hosts)
            {
                check(&t);
            }
        }
        _ => {
            let leaves = input.uint(2) as usize % (MAX_SPEC_NODES as usize + 1);
            let fanout = usize::from(input.byte());
            if let Ok(t) = Topology::for_leaves(leaves, fanout) {
                check(&t);
                if leaves > 0 {
                    assert_eq!(t.leaves().len(), leaves);
                }
            }
        }
    }
}

/// Whether a `b:` spec asks for more than [`MAX_SPEC_NODES`] nodes (a spec this cannot read is left to the
/// parser, which refuses it).
fn too_large(spec: &str) -> bool {
    let Some(arg) = spec.trim().strip_prefix("b:") else {
        return false;
    };
    let (mut total, mut level) = (1u128, 1u128);
    for part in arg.split('x') {
        let parsed = match part.split_once('^') {
            Some((f, d)) => f.trim().parse::<u128>().ok().zip(d.trim().parse::<u128>().ok()),
            None => part.trim().parse::<u128>().ok().map(|f| (f, 1)),
        };
        let Some((fanout, depth)) = parsed else {
            return false;
        };
        for _ in 0..depth.min(64) {
            level = level.saturating_mul(fanout);
            total = total.saturating_add(level);
        }
        if total > MAX_SPEC_NODES || (depth > 64 && fanout > 1) {
            return true;
        }
    }
    false
}

/// What every topology keeps: one root, every other node under a parent that lists it (and only there), and a file written
/// from it that reads back as the same tree.
fn check(t: &Topology) {
    assert!(!t.is_empty());
    let root = t.root().clone();
    assert_eq!(t.parent(&root), None);
    let mut edges = 0;
    for node in t.nodes() {
        if *node != root {
            assert!(t.parent(node).is_some(), "{node} has no parent");
        }
        for child in t.children(node) {
            assert_eq!(t.parent(child), Some(node));
            edges += 1;
        }
    }
    // With every child's parent right, this makes every parent's list of children right too.
    assert_eq!(edges, t.len() - 1);
    let _ = t.render_parents();
    let text = t.to_mrnet();
    assert_eq!(
        Topology::parse_mrnet(&text).as_ref(),
        Ok(t),
        "the tree written as\n{text}"
    );
}
