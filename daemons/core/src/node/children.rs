//! A node's children: the sender of each one's down stream, whether it finished, the size of the application it
//! announced, and the last event of every node below (the subtree view that goes up again after a re-attach).

use std::collections::{BTreeMap, HashMap, HashSet};

use canopy_proto::v1::{NodeEvent, NodeState};

use super::input::ChildSender;

struct Child {
    /// The connection this child is on: events of an earlier connection of the same id are stale.
    conn: u64,
    tx: Option<ChildSender>,
    finished: bool,
    announced: u32,
}

/// What became of a child that hung up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gone {
    /// It had finished: nothing is lost.
    Finished,
    /// It had not: its ranks are lost, and this is the event that says so; then the events of the nodes below
    /// it that were attached, lost with it (their way to the root went through it).
    Lost(NodeEvent, Vec<NodeEvent>),
}

#[derive(Default)]
pub(crate) struct ChildTable {
    children: HashMap<String, Child>,
    subtree: BTreeMap<String, NodeEvent>,
    /// Nodes that moved from below a child that was not known lost yet (the adopter heard of them first): the
    /// child, the ranks it answers for no more once it is, and whether this node is the adopter.
    moved: HashMap<String, (String, u32, bool)>,
    /// Per lost child, the nodes below it that were adopted elsewhere: told to the child if it comes back.
    adopted_away: HashMap<String, Vec<String>>,
}

impl ChildTable {
    /// Registers a child on a new connection (replacing any earlier one of the same id).
    pub(crate) fn attach(&mut self, id: &str, conn: u64, tx: ChildSender, announced: u32) {
        self.children.insert(
            id.to_string(),
            Child {
                conn,
                tx: Some(tx),
                finished: false,
                announced,
            },
        );
    }

    /// Whether no child has ever attached (a lost one stays here).
    pub(crate) fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// Whether `conn` is the child's current connection.
    pub(crate) fn is_current(&self, id: &str, conn: u64) -> bool {
        self.children.get(id).is_some_and(|c| c.conn == conn)
    }

    /// The child's connection ended; `None` if that connection was not its current one.
    pub(crate) fn gone(&mut self, id: &str, conn: u64, reason: String, parent: &str) -> Option<Gone> {
        let child = self.children.get_mut(id).filter(|c| c.conn == conn)?;
        child.tx = None;
        if child.finished {
            return Some(Gone::Finished);
        }
        let mut ev = self.subtree.get(id).cloned().unwrap_or_default();
        ev.node_id = id.to_string();
        ev.parent_id = parent.to_string();
        ev.state = NodeState::Lost as i32;
        ev.detail = reason;
        Some(Gone::Lost(ev, self.below(id)))
    }

    /// The nodes below `id` (as last reported) that were attached, each as lost with it.
    fn below(&self, id: &str) -> Vec<NodeEvent> {
        let mut out = Vec::new();
        let mut parents = vec![id.to_string()];
        while let Some(parent) = parents.pop() {
            for ev in self.subtree.values().filter(|ev| ev.parent_id == parent) {
                parents.push(ev.node_id.clone());
                if ev.state == NodeState::Attached as i32 {
                    let mut lost = ev.clone();
                    lost.state = NodeState::Lost as i32;
                    lost.detail = format!("lost with {id}, its way to the root");
                    out.push(lost);
                }
            }
        }
        out
    }

    /// The child sent Fin; returns the event that says so.
    pub(crate) fn finish(&mut self, id: &str, parent: &str) -> NodeEvent {
        if let Some(c) = self.children.get_mut(id) {
            c.finished = true;
        }
        let mut ev = self.subtree.get(id).cloned().unwrap_or_default();
        ev.node_id = id.to_string();
        ev.parent_id = parent.to_string();
        ev.state = NodeState::Finished as i32;
        ev
    }

    pub(crate) fn set_announced(&mut self, id: &str, announced: u32) {
        if let Some(c) = self.children.get_mut(id) {
            c.announced = announced;
        }
    }

    /// The largest application size any child announced.
    pub(crate) fn announced(&self) -> u32 {
        self.children.values().map(|c| c.announced).max().unwrap_or(0)
    }

    /// Remembers the latest event of a node below. An event that leaves the parent or the address out (a
    /// count of ranks that changed, say) keeps the ones known, as the store does.
    pub(crate) fn record(&mut self, ev: &NodeEvent) {
        let mut ev = ev.clone();
        if let Some(known) = self.subtree.get(&ev.node_id) {
            if ev.parent_id.is_empty() {
                ev.parent_id = known.parent_id.clone();
            }
            if ev.address.is_empty() {
                ev.address = known.address.clone();
            }
        }
        self.subtree.insert(ev.node_id.clone(), ev);
    }

    /// The child of `this` (a node's own id) that `id` was last known to be below, or `id` itself if it was a
    /// child: the first step on its way to the root from here.
    pub(crate) fn way_from(&self, this: &str, id: &str) -> Option<String> {
        let mut at = id.to_string();
        for _ in 0..=self.subtree.len() {
            let parent = &self.subtree.get(&at)?.parent_id;
            if parent == this {
                return Some(at);
            }
            at = parent.clone();
        }
        None
    }

    /// Remembers that `node` moved from below `child` with `ranks` (to this node itself when `adopted_here`), for
    /// when `child` is known lost.
    pub(crate) fn moved_from(&mut self, node: &str, child: &str, ranks: u32, adopted_here: bool) {
        self.moved
            .insert(node.to_string(), (child.to_string(), ranks, adopted_here));
    }

    /// The ranks of the nodes that moved from below `child`, now that it is lost (each counted once), and those
    /// of them this node adopted.
    pub(crate) fn take_moved(&mut self, child: &str) -> (u32, Vec<String>) {
        let mut ranks = 0u32;
        let mut here = Vec::new();
        let mut away = Vec::new();
        self.moved.retain(|node, (from, r, adopted_here)| {
            let keep = from != child;
            if !keep {
                ranks = ranks.saturating_add(*r);
                away.push(node.clone());
                if *adopted_here {
                    here.push(node.clone());
                }
            }
            keep
        });
        for node in away {
            self.adopted_away(child, &node);
        }
        here.sort();
        (ranks, here)
    }

    /// Remembers that `node`, below the lost `child`, was adopted elsewhere.
    pub(crate) fn adopted_away(&mut self, child: &str, node: &str) {
        let nodes = self.adopted_away.entry(child.to_string()).or_default();
        if !nodes.iter().any(|n| n == node) {
            nodes.push(node.to_string());
        }
    }

    /// The nodes below `child` adopted elsewhere while it was lost, now that it is back.
    pub(crate) fn take_adopted_away(&mut self, child: &str) -> Vec<String> {
        self.adopted_away.remove(child).unwrap_or_default()
    }

    /// Forgets a node that is no longer below this one (it was adopted elsewhere), and the nodes below it.
    pub(crate) fn forget(&mut self, id: &str) {
        let mut gone = vec![id.to_string()];
        while let Some(at) = gone.pop() {
            self.subtree.remove(&at);
            gone.extend(
                self.subtree
                    .values()
                    .filter(|ev| ev.parent_id == at)
                    .map(|ev| ev.node_id.clone()),
            );
        }
    }

    /// The sender of a connected child's down stream.
    pub(crate) fn sender(&self, id: &str) -> Option<ChildSender> {
        self.children.get(id).and_then(|c| c.tx.clone())
    }

    /// The latest event of a node below.
    pub(crate) fn recorded(&self, id: &str) -> Option<&NodeEvent> {
        self.subtree.get(id)
    }

    /// Every node below as last reported, for a parent this node attaches (again) to.
    pub(crate) fn subtree(&self) -> impl Iterator<Item = &NodeEvent> {
        self.subtree.values()
    }

    /// The senders of every connected child.
    pub(crate) fn all(&self) -> Vec<ChildSender> {
        self.children.values().filter_map(|c| c.tx.clone()).collect()
    }

    /// The senders of the connected children in `ids` (all of them when `ids` is `None`).
    pub(crate) fn among(&self, ids: Option<&[&str]>) -> Vec<ChildSender> {
        self.children
            .iter()
            .filter(|(id, _)| ids.is_none_or(|p| p.contains(&id.as_str())))
            .filter_map(|(_, c)| c.tx.clone())
            .collect()
    }

    /// Ends every child's down stream; returns the children (and their connections) that were connected.
    pub(crate) fn close_all(&mut self) -> HashSet<(String, u64)> {
        self.children
            .iter_mut()
            .filter_map(|(id, c)| c.tx.take().map(|_| (id.clone(), c.conn)))
            .collect()
    }

    /// Whether any child's down stream is open.
    #[cfg(test)]
    pub(crate) fn any_connected(&self) -> bool {
        self.children.values().any(|c| c.tx.is_some())
    }

    /// Children whose down stream is open.
    pub(crate) fn connected(&self) -> usize {
        self.children.values().filter(|c| c.tx.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_connection_cannot_mark_the_current_one_gone() {
        let mut t = ChildTable::default();
        let (tx1, _rx1) = tokio::sync::mpsc::channel(1);
        let (tx2, _rx2) = tokio::sync::mpsc::channel(1);
        t.attach("a", 1, tx1, 0);
        t.attach("a", 2, tx2, 8);
        assert!(!t.is_current("a", 1));
        assert_eq!(t.gone("a", 1, "old".into(), "p"), None);
        assert!(t.any_connected());
        assert_eq!(t.announced(), 8);
        match t.gone("a", 2, "reset".into(), "p") {
            Some(Gone::Lost(ev, below)) => {
                assert!(below.is_empty());
                assert_eq!(ev.state, NodeState::Lost as i32);
                assert_eq!(ev.detail, "reset");
                assert_eq!(ev.parent_id, "p");
            }
            other => panic!("expected lost, got {other:?}"),
        }
        assert!(!t.any_connected());
    }

    #[test]
    fn the_nodes_below_a_lost_child_are_lost_with_it() {
        let mut t = ChildTable::default();
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        t.attach("relay-a", 1, tx, 0);
        let ev = |id: &str, parent: &str, state: NodeState| NodeEvent {
            node_id: id.into(),
            parent_id: parent.into(),
            state: state as i32,
            ..Default::default()
        };
        t.record(&ev("relay-a", "p", NodeState::Attached));
        t.record(&ev("relay-b", "relay-a", NodeState::Attached));
        t.record(&ev("agent-1", "relay-b", NodeState::Attached));
        t.record(&ev("agent-2", "relay-b", NodeState::Finished));
        t.record(&ev("agent-3", "relay-c", NodeState::Attached));
        // A later event of agent-1 that leaves its parent out keeps the one known.
        t.record(&ev("agent-1", "", NodeState::Attached));
        let Some(Gone::Lost(_, below)) = t.gone("relay-a", 1, "reset".into(), "p") else {
            panic!("not lost");
        };
        let mut lost: Vec<(&str, &str)> = below
            .iter()
            .map(|e| (e.node_id.as_str(), e.detail.as_str()))
            .collect();
        lost.sort();
        assert_eq!(
            lost,
            [
                ("agent-1", "lost with relay-a, its way to the root"),
                ("relay-b", "lost with relay-a, its way to the root")
            ]
        );
        assert!(below.iter().all(|e| e.state == NodeState::Lost as i32));
    }

    #[test]
    fn a_finished_child_that_hangs_up_is_not_lost() {
        let mut t = ChildTable::default();
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        t.attach("a", 1, tx, 0);
        let ev = t.finish("a", "p");
        assert_eq!(ev.state, NodeState::Finished as i32);
        assert_eq!(t.gone("a", 1, "bye".into(), "p"), Some(Gone::Finished));
    }
}
