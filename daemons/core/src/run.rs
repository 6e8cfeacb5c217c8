//! The run a node belongs to: the root's run id, which every node learns from its first Welcome and carries for
//! the rest of its life. A parent refuses a child of another run, and a child a parent of another run, so the
//! orphans of a run that ended (or of a crashed front-end's run, after a new one started on its address) are
//! refused, never merged into a run that is not theirs.

use std::sync::{Arc, OnceLock};

/// A node's run id, shared by its link up and its service for children; set once.
#[derive(Debug, Clone, Default)]
pub struct RunId(Arc<OnceLock<String>>);

impl RunId {
    /// The run id of a root: its run's own.
    pub fn of_root(id: impl Into<String>) -> RunId {
        let run = RunId::default();
        let _ = run.0.set(id.into());
        run
    }

    /// The run id, once known; empty before.
    pub fn get(&self) -> String {
        self.0.get().cloned().unwrap_or_default()
    }

    /// Learns the run id a parent's Welcome gives (an empty one says nothing): the node's run from now on.
    /// `Err` with the node's own run id if it belongs to another.
    pub fn learn(&self, id: &str) -> Result<(), String> {
        if id.is_empty() {
            return Ok(());
        }
        let own = self.0.get_or_init(|| id.to_string());
        match own == id {
            true => Ok(()),
            false => Err(own.clone()),
        }
    }

    /// Whether a node carrying `id` may attach to this one: it knows no run yet, or this one's.
    pub fn admits(&self, id: &str) -> bool {
        id.is_empty() || self.0.get().is_none_or(|own| own == id)
    }
}

/// How a root that continues a crashed run tells its tree from a new one: the first child to attach decides. One
/// that carries the run's id confirms the run (children that never attached are welcome from then on); one that
/// carries none, while no child of the run has come back, is a node of a new tree started in the run's directory:
/// it is asked to attach again in a moment, and the root ends the run and starts a new one in a new store.
#[derive(Debug, Clone)]
pub struct ResumeGate {
    run: String,
    state: Arc<tokio::sync::watch::Sender<Resumed>>,
}

/// What a [`ResumeGate`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resumed {
    /// No child has attached yet.
    Undecided,
    /// A child of the run came back: the run goes on.
    Confirmed,
    /// The node named attached first, with no run id: a new tree.
    NewTree(String),
}

impl ResumeGate {
    /// The gate of a root continuing `run`.
    pub fn new(run: impl Into<String>) -> ResumeGate {
        ResumeGate {
            run: run.into(),
            state: Arc::new(tokio::sync::watch::channel(Resumed::Undecided).0),
        }
    }

    /// Whether `node`, carrying `run_id`, may attach now: refused (with the new tree decided) when it is the
    /// first to come and carries no run id.
    pub fn admits(&self, node: &str, run_id: &str) -> bool {
        let mut admitted = true;
        self.state.send_if_modified(|state| match state {
            Resumed::Undecided if run_id == self.run => {
                *state = Resumed::Confirmed;
                true
            }
            Resumed::Undecided if run_id.is_empty() => {
                *state = Resumed::NewTree(node.to_string());
                admitted = false;
                true
            }
            Resumed::NewTree(_) => {
                admitted = false;
                false
            }
            _ => false,
        });
        admitted
    }

    /// The node of a new tree that attached first, once one did.
    pub fn new_tree_node(&self) -> Option<String> {
        match &*self.state.borrow() {
            Resumed::NewTree(node) => Some(node.clone()),
            _ => None,
        }
    }

    /// Completes once a node of a new tree attached first, with its id.
    pub async fn new_tree(&self) -> String {
        let mut rx = self.state.subscribe();
        loop {
            if let Resumed::NewTree(node) = &*rx.borrow_and_update() {
                return node.clone();
            }
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

/// A new run id: 64 random bits (the standard library's hasher keys come from the operating system's random
/// source) and the time, in hex.
pub fn new_run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_learns_its_run_once_and_refuses_another() {
        let run = RunId::default();
        assert!(run.admits("a") && run.admits(""));
        assert_eq!(run.learn(""), Ok(()));
        assert_eq!(run.get(), "");
        assert_eq!(run.learn("a"), Ok(()));
        assert_eq!(run.learn("a"), Ok(()));
        assert_eq!(run.learn("b"), Err("a".into()));
        assert!(run.admits("a") && run.admits("") && !run.admits("b"));
        assert_eq!(run.clone().get(), "a", "shared by its clones");
    }

    #[test]
    fn the_first_child_decides_whether_a_resumed_run_goes_on() {
        let gate = ResumeGate::new("r1");
        assert!(gate.admits("relay-0", "r1"));
        // Confirmed: a node that never attached joins the run.
        assert!(gate.admits("agent-9", ""));
        let fresh = ResumeGate::new("r1");
        assert!(!fresh.admits("agent-0", ""));
        // Decided: the old run's nodes are not taken either, as the run ends.
        assert!(!fresh.admits("relay-0", "r1"));
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert_eq!(rt.block_on(fresh.new_tree()), "agent-0");
    }

    #[test]
    fn new_run_ids_differ() {
        let ids: std::collections::HashSet<String> = (0..100).map(|_| new_run_id()).collect();
        assert_eq!(ids.len(), 100);
        assert!(ids.iter().all(|id| id.len() == 16));
    }
}
