//! ToM's functional classes of ranks, as classify defines them and other filters reuse them: which event names
//! a stream selects (a [`Scheme`]), and a rank's class id, the xxh3-64 ([`canopy_wire::event_id`]) of its
//! selected event names, sorted, deduplicated and joined with "\n".
//!
//! An event whose name this node was never told (through the filter's `names`) takes its id in 16 hex digits
//! as its name, so the class is still stable across ranks; the host gives the leaves the names before the
//! first round.
//!
//! Broken down by application ([`Selection::by_app`]), a class is the ranks of one application that select the
//! same names: its id is the xxh3-64 of the application's name, a NUL, then the names joined as above, so two
//! applications never share a class. An application's ranks together are the group [`app_group`].

use std::collections::HashMap;

pub use crate::select::Scheme;
use canopy_wire::v1::RankProfile;

/// A node's view of the names and of what its scheme selects, kept across rounds.
#[derive(Debug, Clone)]
pub struct Selection {
    scheme: Scheme,
    /// Names by id, as the host gives them.
    names: HashMap<u64, String>,
    /// Per id, its name if the scheme selects it; cleared when names change.
    selected: HashMap<u64, Option<String>>,
    /// Whether classes are per application.
    by_app: bool,
}

/// The id of the group of every rank of `app`: the xxh3-64 of its name and a NUL (the class id of its ranks
/// that select no name, when classes are per application).
pub fn app_group(app: &str) -> u64 {
    canopy_wire::event_id(&format!("{app}\0"))
}

impl Selection {
    pub fn new(scheme: Scheme) -> Selection {
        Selection {
            scheme,
            names: HashMap::new(),
            selected: HashMap::new(),
            by_app: false,
        }
    }

    /// The same selection with classes per application when `yes` (see the module documentation).
    pub fn by_app(self, yes: bool) -> Selection {
        Selection { by_app: yes, ..self }
    }

    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// Learns names (the filter's `names` call).
    pub fn names(&mut self, names: &[(u64, &str)]) {
        for (id, name) in names {
            self.names.insert(*id, (*name).to_string());
        }
        // A name may replace an id's hex stand-in: selection is decided again.
        self.selected.clear();
    }

    /// Decides, once per id, whether the scheme selects it and under which name.
    fn remember(&mut self, id: u64) {
        if self.selected.contains_key(&id) {
            return;
        }
        let name = self
            .names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("{id:016x}"));
        let chosen = match &self.scheme {
            Scheme::All => Some(name),
            Scheme::Pattern(re) => re.is_match(&name).then_some(name),
        };
        self.selected.insert(id, chosen);
    }

    /// Whether the scheme selects the event (or counter) `id`.
    pub fn selects(&mut self, id: u64) -> bool {
        self.remember(id);
        matches!(self.selected.get(&id), Some(Some(_)))
    }

    /// A rank's class id (events only, not counters) and its first selected name.
    pub fn class_of(&mut self, p: &RankProfile) -> (u64, String) {
        for e in &p.events {
            self.remember(e.event_id);
        }
        let mut names: Vec<&str> = p
            .events
            .iter()
            .filter_map(|e| self.selected.get(&e.event_id).and_then(|s| s.as_deref()))
            .collect();
        names.sort_unstable();
        names.dedup();
        let joined = names.join("\n");
        let id = if self.by_app {
            canopy_wire::event_id(&format!("{}\0{joined}", p.app))
        } else {
            canopy_wire::event_id(&joined)
        };
        (id, names.first().map(|n| n.to_string()).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Params;
    use canopy_filter_proto::v1::Metric;
    use canopy_wire::v1::EventSample;
    use regex_lite::Regex;

    fn profile(ids: &[u64]) -> RankProfile {
        RankProfile {
            events: ids
                .iter()
                .map(|&event_id| EventSample {
                    event_id,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn per_application_the_same_names_make_one_class_per_application() {
        let a = canopy_wire::event_id("MPI_Send");
        let mut s = Selection::new(Scheme::All).by_app(true);
        s.names(&[(a, "MPI_Send")]);
        let of = |app: &str| RankProfile {
            app: app.into(),
            ..profile(&[a])
        };
        let (sim, analysis) = (s.class_of(&of("sim")).0, s.class_of(&of("analysis")).0);
        assert_ne!(sim, analysis);
        assert_eq!(sim, canopy_wire::event_id("sim\0MPI_Send"));
        let empty = RankProfile {
            app: "sim".into(),
            ..profile(&[])
        };
        assert_eq!(s.class_of(&empty).0, app_group("sim"));
        // Over every application the application plays no part.
        let mut over_all = Selection::new(Scheme::All);
        over_all.names(&[(a, "MPI_Send")]);
        assert_eq!(over_all.class_of(&of("sim")), over_all.class_of(&of("analysis")));
    }

    #[test]
    fn class_id_hashes_the_sorted_selected_names() {
        let (a, b) = (canopy_wire::event_id("MPI_Send"), canopy_wire::event_id("main"));
        let mut s = Selection::new(Scheme::Pattern(Regex::new("^MPI_").unwrap()));
        s.names(&[(a, "MPI_Send"), (b, "main")]);
        assert_eq!(
            s.class_of(&profile(&[b, a, a])),
            (canopy_wire::event_id("MPI_Send"), "MPI_Send".to_string())
        );
        assert!(s.selects(a) && !s.selects(b));
        let mut all = Selection::new(Scheme::All);
        // Unknown names stand in as hex ids.
        assert_eq!(
            all.class_of(&profile(&[7])).0,
            canopy_wire::event_id("0000000000000007")
        );
        all.names(&[(a, "MPI_Send"), (b, "main")]);
        assert_eq!(
            all.class_of(&profile(&[b, a])).0,
            canopy_wire::event_id("MPI_Send\nmain")
        );
        assert_eq!(
            all.class_of(&profile(&[])),
            (canopy_wire::event_id(""), String::new())
        );
    }

    #[test]
    fn scheme_and_metric_params() {
        let p = |t: &str| Params::parse(t, &["events", "pattern", "metric"]).unwrap();
        assert!(matches!(Scheme::from_params(&p("{}"), "events"), Ok(Scheme::All)));
        assert_eq!(
            Scheme::from_params(&p(r#"{"events": "pattern", "pattern": "^MPI_"}"#), "events")
                .unwrap()
                .describe(),
            "pattern:^MPI_"
        );
        assert_eq!(
            Scheme::from_params(&p(r#"{"pattern": "x"}"#), "events").unwrap_err(),
            "pattern needs events \"pattern\""
        );
        assert_eq!(
            Scheme::from_params(&p(r#"{"events": "pattern"}"#), "events").unwrap_err(),
            "events \"pattern\" needs a pattern"
        );
        assert!(
            Scheme::from_params(&p(r#"{"events": "pattern", "pattern": "("}"#), "events")
                .unwrap_err()
                .starts_with("pattern \"(\" is not a valid regex: ")
        );
        assert_eq!(p("{}").metric(), Ok(Metric::Exclusive));
        assert_eq!(p(r#"{"metric": "calls"}"#).metric(), Ok(Metric::Calls));
        assert!(
            p(r#"{"metric": "time"}"#)
                .metric()
                .unwrap_err()
                .ends_with("got \"time\"")
        );
    }
}
