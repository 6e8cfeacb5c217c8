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
    fn new_run_ids_differ() {
        let ids: std::collections::HashSet<String> = (0..100).map(|_| new_run_id()).collect();
        assert_eq!(ids.len(), 100);
        assert!(ids.iter().all(|id| id.len() == 16));
    }
}
