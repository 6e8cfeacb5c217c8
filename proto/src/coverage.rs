//! Coverage arithmetic: how many ranks a packet or a result covers out of how many were expected, and why the
//! others are missing, in all and per application. Every coverage keeps one invariant, [`Coverage::is_exact`].
//!
//! The per-application counts (`apps`, sorted by name) are a part of the whole: a rank counts in its
//! application's entry when the node that first counts it knows the application (a rank's own dump or absence,
//! a child whose last packet said how its ranks divide among applications), and in the whole alone otherwise.

use std::cmp::Ordering;

use crate::v1::{AppCoverage, Coverage, Missing, MissingReason, Unreachable};

/// The most applications one coverage may name: a child naming more is refused, so a round's coverage (which
/// every node keeps for the rounds in flight) stays within a few kilobytes whatever a child sends; a node with
/// more below it counts the others in the whole alone.
pub const MAX_COVERAGE_APPS: usize = 64;

/// The most nodes one coverage names as unreachable: a round cut off from many subtrees names the ones with the
/// most ranks, and counts the others' ranks as unreachable without a name.
pub const MAX_UNREACHABLE_NODES: usize = 16;

/// How a source's ranks divide among applications, sorted by name: (application, ranks).
pub type Composition = Vec<(String, u32)>;

impl Coverage {
    /// The coverage of one rank of `app` that delivered.
    pub fn full(app: &str) -> Coverage {
        Coverage {
            covered: 1,
            expected: 1,
            missing: vec![],
            apps: vec![AppCoverage {
                app: app.to_string(),
                covered: 1,
                expected: 1,
                missing: vec![],
            }],
            unreachable: vec![],
        }
    }

    /// The coverage of one rank of `app` that answers for a round without a profile, and why.
    pub fn absent(app: &str, reason: MissingReason) -> Coverage {
        let missing = vec![Missing {
            reason: reason as i32,
            ranks: 1,
        }];
        Coverage {
            covered: 0,
            expected: 1,
            missing: missing.clone(),
            apps: vec![AppCoverage {
                app: app.to_string(),
                covered: 0,
                expected: 1,
                missing,
            }],
            unreachable: vec![],
        }
    }

    /// Adds `other` into this coverage: covered, expected and each reason, in all and per application.
    pub fn add(&mut self, other: &Coverage) {
        self.covered = self.covered.saturating_add(other.covered);
        self.expected = self.expected.saturating_add(other.expected);
        add_reasons(&mut self.missing, &other.missing);
        for u in &other.unreachable {
            self.name_unreachable(&u.node, u.ranks);
        }
        if self.apps.is_empty() && other.apps.len() <= MAX_COVERAGE_APPS {
            self.apps.clone_from(&other.apps);
            return;
        }
        // Both sorted by name, each application once: each of `other`'s is found (or placed) by binary search, so
        // adding a rank's coverage to a node's (the common case, an application already there) allocates nothing.
        for t in &other.apps {
            match self.apps.binary_search_by(|a| a.app.as_str().cmp(&t.app)) {
                Ok(i) => {
                    let a = &mut self.apps[i];
                    a.covered = a.covered.saturating_add(t.covered);
                    a.expected = a.expected.saturating_add(t.expected);
                    add_reasons(&mut a.missing, &t.missing);
                }
                // Beyond the most a parent takes, further applications count in the whole alone.
                Err(i) if self.apps.len() < MAX_COVERAGE_APPS => self.apps.insert(i, t.clone()),
                Err(_) => {}
            }
        }
    }

    /// Counts `ranks` more under `reason`, keeping one entry per reason, in the whole only (their applications
    /// are not known here).
    pub fn add_missing(&mut self, reason: MissingReason, ranks: u32) {
        add_reason(&mut self.missing, reason, ranks);
    }

    /// Names `node` as the node behind `ranks` of the coverage's unreachable ranks (counted under
    /// [`MissingReason::Unreachable`] by the caller). A name longer than [`crate::MAX_APP_NAME`] bytes is
    /// cut there; past [`MAX_UNREACHABLE_NODES`] names the node with the fewest ranks goes unnamed.
    pub fn name_unreachable(&mut self, node: &str, ranks: u32) {
        if ranks == 0 {
            return;
        }
        let mut end = node.len().min(crate::MAX_APP_NAME);
        while !node.is_char_boundary(end) {
            end -= 1;
        }
        let node = &node[..end];
        let list = &mut self.unreachable;
        match list.binary_search_by(|u| u.node.as_str().cmp(node)) {
            Ok(i) => list[i].ranks = list[i].ranks.saturating_add(ranks),
            Err(i) => {
                list.insert(
                    i,
                    Unreachable {
                        node: node.to_string(),
                        ranks,
                    },
                );
                if list.len() > MAX_UNREACHABLE_NODES {
                    let fewest = (0..list.len())
                        .min_by_key(|&j| list[j].ranks)
                        .expect("the list is not empty");
                    list.remove(fewest);
                }
            }
        }
    }

    /// `ranks` more expected and missing under `reason`, the ranks of a source whose ranks divide among
    /// applications as `apps` says: per application too when `apps` accounts for exactly these ranks, else in the
    /// whole only.
    pub fn add_missing_of(&mut self, reason: MissingReason, ranks: u32, apps: &[(String, u32)]) {
        if ranks == 0 {
            return;
        }
        self.expected = self.expected.saturating_add(ranks);
        let attributed: u64 = apps.iter().map(|(_, n)| u64::from(*n)).sum();
        if attributed != u64::from(ranks) {
            self.add_missing(reason, ranks);
            return;
        }
        let part = Coverage {
            covered: 0,
            expected: 0,
            missing: vec![],
            apps: apps
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(app, n)| AppCoverage {
                    app: app.clone(),
                    covered: 0,
                    expected: *n,
                    missing: vec![Missing {
                        reason: reason as i32,
                        ranks: *n,
                    }],
                })
                .collect(),
            unreachable: vec![],
        };
        self.add_missing(reason, ranks);
        self.add(&part);
    }

    /// Moves the ranks `input` covered to `reason` (a payload the filter rejected), in all and per application.
    pub fn uncover_input(&mut self, reason: MissingReason, input: &Coverage) {
        let ranks = input.covered.min(self.covered);
        self.covered -= ranks;
        self.add_missing(reason, ranks);
        for part in &input.apps {
            if let Ok(i) = self.apps.binary_search_by(|a| a.app.as_str().cmp(&part.app)) {
                let a = &mut self.apps[i];
                let ranks = part.covered.min(a.covered);
                a.covered -= ranks;
                add_reason(&mut a.missing, reason, ranks);
            }
        }
    }

    /// Moves every covered rank to `reason` (a round whose result never came), in all and per application.
    pub fn uncover_all(&mut self, reason: MissingReason) {
        let whole = self.clone();
        self.uncover_input(reason, &whole);
    }

    /// Moves `ranks` counted missing under `from` to `to` (a source's ranks counted late in a round it had
    /// finished before), per application as `apps` divides them, and takes `node`'s name off the unreachable ones
    /// when they leave [`MissingReason::Unreachable`]. Never moves more than `from` holds, in all or per
    /// application.
    pub fn recount(
        &mut self,
        from: MissingReason,
        to: MissingReason,
        ranks: u32,
        apps: &[(String, u32)],
        node: &str,
    ) {
        let moved = take_reason(&mut self.missing, from, ranks);
        add_reason(&mut self.missing, to, moved);
        for (app, n) in apps {
            if let Ok(i) = self.apps.binary_search_by(|a| a.app.as_str().cmp(app)) {
                let a = &mut self.apps[i];
                let moved = take_reason(&mut a.missing, from, *n);
                add_reason(&mut a.missing, to, moved);
            }
        }
        if from == MissingReason::Unreachable
            && let Ok(i) = self.unreachable.binary_search_by(|u| u.node.as_str().cmp(node))
        {
            self.unreachable[i].ranks = self.unreachable[i].ranks.saturating_sub(moved);
            if self.unreachable[i].ranks == 0 {
                self.unreachable.remove(i);
            }
        }
    }

    /// How the ranks a coverage expects divide among applications, as far as it tells.
    pub fn composition(&self) -> Composition {
        self.apps.iter().map(|a| (a.app.clone(), a.expected)).collect()
    }

    /// The invariant every coverage keeps, in all and per application.
    pub fn is_exact(&self) -> bool {
        exact(self.covered, self.expected, &self.missing)
            && self.apps.iter().all(|a| exact(a.covered, a.expected, &a.missing))
    }

    /// Whether a child's coverage may be taken in: exact, for no more ranks than `ranks_below` (the most
    /// [`crate::MAX_RANKS`]), its applications sorted, each once, at most [`MAX_COVERAGE_APPS`] of them, each
    /// with ranks and a name of at most [`crate::MAX_APP_NAME`] bytes, and together no more than the whole;
    /// the reason when not.
    pub fn check_child(&self, ranks_below: u32) -> Result<(), String> {
        if !exact(self.covered, self.expected, &self.missing) {
            let missing: u64 = self.missing.iter().map(|m| u64::from(m.ranks)).sum();
            return Err(format!(
                "coverage is not exact: {} covered and {missing} missing, but {} expected",
                self.covered, self.expected
            ));
        }
        if self.expected > ranks_below {
            return Err(format!(
                "coverage expects {} ranks, more than the {ranks_below} the child has below",
                self.expected
            ));
        }
        if self.apps.len() > MAX_COVERAGE_APPS {
            return Err(format!(
                "coverage names {} applications, more than the {MAX_COVERAGE_APPS} allowed",
                self.apps.len()
            ));
        }
        for pair in self.apps.windows(2) {
            if pair[0].app.cmp(&pair[1].app) != Ordering::Less {
                return Err(format!(
                    "coverage names its applications out of order or twice: {:?} before {:?}",
                    pair[0].app, pair[1].app
                ));
            }
        }
        if let Some(a) = self.apps.iter().find(|a| a.expected == 0) {
            return Err(format!("coverage names application {:?} with no ranks", a.app));
        }
        if let Some(a) = self.apps.iter().find(|a| a.app.len() > crate::MAX_APP_NAME) {
            return Err(format!(
                "coverage names an application of {} bytes, longer than the {} allowed",
                a.app.len(),
                crate::MAX_APP_NAME
            ));
        }
        if let Some(a) = self
            .apps
            .iter()
            .find(|a| !exact(a.covered, a.expected, &a.missing))
        {
            let missing: u64 = a.missing.iter().map(|m| u64::from(m.ranks)).sum();
            return Err(format!(
                "coverage of application {:?} is not exact: {} covered and {missing} missing, but {} expected",
                a.app, a.covered, a.expected
            ));
        }
        check_unreachable_names(self)?;
        let (covered, expected) = self.apps.iter().fold((0u64, 0u64), |(c, e), a| {
            (c + u64::from(a.covered), e + u64::from(a.expected))
        });
        if covered > u64::from(self.covered) || expected > u64::from(self.expected) {
            return Err(format!(
                "coverage's applications cover {covered} of {expected} ranks, more than the whole's {} of {}",
                self.covered, self.expected
            ));
        }
        Ok(())
    }

    /// Ranks missing under `reason`.
    pub fn missing_for(&self, reason: MissingReason) -> u32 {
        self.missing
            .iter()
            .filter(|m| m.reason() == reason)
            .map(|m| m.ranks)
            .sum()
    }
}

fn add_reasons(into: &mut Vec<Missing>, other: &[Missing]) {
    for m in other {
        add_reason(into, m.reason(), m.ranks);
    }
}

/// Takes up to `ranks` off `reason`'s entry, dropping it when emptied; how many were taken.
fn take_reason(missing: &mut Vec<Missing>, reason: MissingReason, ranks: u32) -> u32 {
    let Some(i) = missing.iter().position(|m| m.reason() == reason) else {
        return 0;
    };
    let taken = ranks.min(missing[i].ranks);
    missing[i].ranks -= taken;
    if missing[i].ranks == 0 {
        missing.remove(i);
    }
    taken
}

fn add_reason(missing: &mut Vec<Missing>, reason: MissingReason, ranks: u32) {
    if ranks == 0 {
        return;
    }
    match missing.iter_mut().find(|m| m.reason() == reason) {
        Some(m) => m.ranks = m.ranks.saturating_add(ranks),
        None => missing.push(Missing {
            reason: reason as i32,
            ranks,
        }),
    }
}

fn exact(covered: u32, expected: u32, missing: &[Missing]) -> bool {
    u64::from(covered) + missing.iter().map(|m| u64::from(m.ranks)).sum::<u64>() == u64::from(expected)
}

/// Whether the unreachable nodes a child names are few, sorted, each once, with short names and ranks that add
/// up to no more than its unreachable count.
fn check_unreachable_names(cov: &Coverage) -> Result<(), String> {
    let list = &cov.unreachable;
    if list.len() > MAX_UNREACHABLE_NODES {
        return Err(format!(
            "coverage names {} unreachable nodes, more than the {MAX_UNREACHABLE_NODES} allowed",
            list.len()
        ));
    }
    if let Some(pair) = list.windows(2).find(|p| p[0].node >= p[1].node) {
        return Err(format!(
            "coverage names its unreachable nodes out of order or twice: {:?} before {:?}",
            pair[0].node, pair[1].node
        ));
    }
    if let Some(u) = list
        .iter()
        .find(|u| u.ranks == 0 || u.node.is_empty() || u.node.len() > crate::MAX_APP_NAME)
    {
        return Err(format!(
            "coverage names unreachable node {:?} with {} ranks: a name of 1 to {} bytes with ranks is needed",
            u.node,
            u.ranks,
            crate::MAX_APP_NAME
        ));
    }
    let named: u64 = list.iter().map(|u| u64::from(u.ranks)).sum();
    let counted = cov.missing_for(MissingReason::Unreachable);
    if named > u64::from(counted) {
        return Err(format!(
            "coverage names {named} unreachable ranks, more than the {counted} it counts unreachable"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn app_of<'a>(c: &'a Coverage, app: &str) -> &'a AppCoverage {
        c.apps.iter().find(|a| a.app == app).unwrap()
    }

    fn reason_of(missing: &[Missing], reason: MissingReason) -> u32 {
        missing
            .iter()
            .filter(|m| m.reason() == reason)
            .map(|m| m.ranks)
            .sum()
    }

    #[test]
    fn uncovering_keeps_the_invariant_and_one_entry_per_reason() {
        let mut c = Coverage::full("a");
        c.add(&Coverage::absent("a", MissingReason::Late));
        c.add(&Coverage::full("b"));
        assert_eq!((c.covered, c.expected), (2, 3));
        c.uncover_all(MissingReason::Late);
        assert_eq!(c.covered, 0);
        assert_eq!(c.missing_for(MissingReason::Late), 3);
        assert_eq!(c.missing.len(), 1);
        assert_eq!(
            (
                app_of(&c, "a").expected,
                reason_of(&app_of(&c, "a").missing, MissingReason::Late)
            ),
            (2, 2)
        );
        assert!(c.is_exact());
        assert_eq!(c.check_child(3), Ok(()));
    }

    #[test]
    fn a_recount_moves_ranks_between_reasons_in_all_per_application_and_by_name() {
        let mut c = Coverage::full("a");
        let apps = vec![("a".to_string(), 2), ("b".to_string(), 2)];
        c.add_missing_of(MissingReason::Unreachable, 4, &apps);
        c.name_unreachable("relay-1", 4);
        c.add_missing_of(MissingReason::Late, 1, &[("a".to_string(), 1)]);
        c.recount(
            MissingReason::Unreachable,
            MissingReason::Stopped,
            4,
            &apps,
            "relay-1",
        );
        assert_eq!(c.missing_for(MissingReason::Unreachable), 0);
        assert_eq!(c.missing_for(MissingReason::Stopped), 4);
        assert_eq!(
            c.missing_for(MissingReason::Late),
            1,
            "another source's late rank stays"
        );
        assert_eq!(reason_of(&app_of(&c, "b").missing, MissingReason::Stopped), 2);
        assert_eq!(reason_of(&app_of(&c, "a").missing, MissingReason::Late), 1);
        assert!(c.unreachable.is_empty());
        assert!(c.is_exact());
        // Never more than the reason holds.
        c.recount(MissingReason::Late, MissingReason::Stopped, 9, &[], "x");
        assert_eq!(c.missing_for(MissingReason::Stopped), 5);
        assert_eq!(c.missing_for(MissingReason::Late), 0);
        assert!(c.is_exact() && c.missing.iter().all(|m| m.ranks > 0));
    }

    #[test]
    fn unreachable_nodes_are_named_sorted_bounded_and_checked() {
        let mut c = Coverage::default();
        for i in 0..(MAX_UNREACHABLE_NODES as u32 + 4) {
            // Node i has i + 1 ranks: the four with the fewest go unnamed.
            c.add_missing_of(MissingReason::Unreachable, i + 1, &[]);
            c.name_unreachable(&format!("relay{i:02}"), i + 1);
        }
        assert_eq!(c.unreachable.len(), MAX_UNREACHABLE_NODES);
        assert_eq!(c.unreachable[0].node, "relay04");
        assert!(c.unreachable.windows(2).all(|p| p[0].node < p[1].node));
        assert_eq!(c.check_child(c.expected), Ok(()));
        // Two children that name the same node add up; a long name is cut to what a parent takes.
        let mut d = c.clone();
        d.add(&c);
        assert_eq!(d.unreachable[0].ranks, 2 * c.unreachable[0].ranks);
        let mut long = Coverage::default();
        long.add_missing_of(MissingReason::Unreachable, 1, &[]);
        long.name_unreachable(&"é".repeat(100), 1);
        assert_eq!(long.unreachable[0].node.len(), crate::MAX_APP_NAME);
        assert_eq!(long.check_child(1), Ok(()));
        // A child naming more unreachable ranks than it counts, or out of order, is refused.
        let mut forged = long.clone();
        forged.unreachable[0].ranks = 2;
        assert!(forged.check_child(1).unwrap_err().contains("more than the 1"));
        let mut twice = c.clone();
        twice.unreachable.swap(0, 1);
        assert!(
            twice
                .check_child(c.expected)
                .unwrap_err()
                .contains("out of order")
        );
    }

    #[test]
    fn sums_saturate_rather_than_wrap() {
        let mut c = Coverage {
            covered: u32::MAX,
            expected: u32::MAX,
            ..Default::default()
        };
        c.add(&Coverage::full("a"));
        c.add_missing(MissingReason::Late, u32::MAX);
        c.add_missing(MissingReason::Late, 1);
        assert_eq!((c.covered, c.expected), (u32::MAX, u32::MAX));
        assert_eq!(c.missing_for(MissingReason::Late), u32::MAX);
    }

    #[test]
    fn a_sources_missing_ranks_count_in_their_applications_only_when_the_composition_accounts_for_them() {
        let apps = vec![("lammps".to_string(), 3), ("bonds".to_string(), 1)];
        let mut c = Coverage::full("bonds");
        c.add_missing_of(
            MissingReason::Lost,
            4,
            &[("bonds".into(), 1), ("lammps".into(), 3)],
        );
        assert_eq!(
            (c.covered, c.expected, c.missing_for(MissingReason::Lost)),
            (1, 5, 4)
        );
        assert_eq!(
            (app_of(&c, "bonds").covered, app_of(&c, "bonds").expected),
            (1, 2)
        );
        assert_eq!(app_of(&c, "lammps").expected, 3);
        assert_eq!(
            c.apps.iter().map(|a| a.app.as_str()).collect::<Vec<_>>(),
            ["bonds", "lammps"]
        );
        // Five ranks of which the composition tells four: the whole alone counts them.
        let mut d = Coverage::default();
        d.add_missing_of(MissingReason::Late, 5, &apps);
        assert_eq!((d.expected, d.missing_for(MissingReason::Late)), (5, 5));
        assert!(d.apps.is_empty());
        assert!(c.is_exact() && d.is_exact());
    }

    #[test]
    fn a_rejected_input_uncovers_its_own_applications_ranks() {
        let mut input = Coverage::full("a");
        input.add(&Coverage::full("b"));
        let mut c = input.clone();
        c.add(&Coverage::full("b"));
        c.uncover_input(MissingReason::Malformed, &input);
        assert_eq!((c.covered, c.missing_for(MissingReason::Malformed)), (1, 2));
        assert_eq!((app_of(&c, "a").covered, app_of(&c, "b").covered), (0, 1));
        assert!(c.is_exact());
    }

    #[test]
    fn a_childs_coverage_must_add_up_and_stay_within_its_ranks() {
        assert_eq!(Coverage::full("a").check_child(1), Ok(()));
        assert_eq!(Coverage::absent("a", MissingReason::Lost).check_child(4), Ok(()));
        assert_eq!(
            Coverage::full("a").check_child(0),
            Err("coverage expects 1 ranks, more than the 0 the child has below".into())
        );
        let inexact = Coverage {
            covered: 4,
            expected: 4,
            missing: vec![Missing {
                reason: MissingReason::Late as i32,
                ranks: u32::MAX,
            }],
            apps: vec![],
            unreachable: vec![],
        };
        assert_eq!(
            inexact.check_child(8),
            Err("coverage is not exact: 4 covered and 4294967295 missing, but 4 expected".into())
        );
        let mut twice = Coverage::full("a");
        twice.apps.push(twice.apps[0].clone());
        twice.apps[1].covered = 0;
        twice.apps[1].expected = 0;
        assert_eq!(
            twice.check_child(1),
            Err("coverage names its applications out of order or twice: \"a\" before \"a\"".into())
        );
        let mut more = Coverage::full("a");
        more.apps[0].covered = 2;
        more.apps[0].expected = 2;
        assert_eq!(
            more.check_child(1),
            Err("coverage's applications cover 2 of 2 ranks, more than the whole's 1 of 1".into())
        );
        let mut bad = Coverage::full("a");
        bad.apps[0].covered = 0;
        assert_eq!(
            bad.check_child(1),
            Err("coverage of application \"a\" is not exact: 0 covered and 0 missing, but 1 expected".into())
        );
        // A node with more applications below it than a parent takes names the first 64 and counts the others
        // in the whole alone, so its packets are still taken in.
        let mut many = Coverage::default();
        for i in 0..=MAX_COVERAGE_APPS {
            many.add(&Coverage::full(&format!("app{i:05}")));
        }
        assert_eq!((many.apps.len(), many.covered), (MAX_COVERAGE_APPS, 65));
        assert_eq!(many.check_child(u32::MAX), Ok(()));
        let mut forged = many.clone();
        forged.apps.push(Coverage::full("zzz").apps[0].clone());
        assert_eq!(
            forged.check_child(u32::MAX),
            Err(format!(
                "coverage names 65 applications, more than the {MAX_COVERAGE_APPS} allowed"
            ))
        );
        // Applications without ranks or with names too long to carry every round are refused.
        let mut empty = Coverage::full("a");
        empty.apps.push(AppCoverage {
            app: "b".into(),
            ..Default::default()
        });
        assert_eq!(
            empty.check_child(1),
            Err("coverage names application \"b\" with no ranks".into())
        );
        let long = Coverage::full(&"x".repeat(crate::MAX_APP_NAME + 1));
        assert_eq!(
            long.check_child(1),
            Err("coverage names an application of 129 bytes, longer than the 128 allowed".into())
        );
    }

    proptest! {
        /// However ranks' coverages are grouped and added up (a tree of any shape), the result per application
        /// is that application's ranks counted at once, the whole is every rank, and the child check accepts it.
        #[test]
        fn adding_up_in_any_grouping_counts_each_application_exactly(
            ranks in prop::collection::vec((0usize..4, 0u8..3), 1..60),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let names = ["lammps", "bonds", "csym", "a"];
            let one = |&(app, what): &(usize, u8)| match what {
                0 => Coverage::full(names[app]),
                1 => Coverage::absent(names[app], MissingReason::SampledOut),
                _ => Coverage::absent(names[app], MissingReason::Dropped),
            };
            let mut bounds: Vec<usize> = cuts.iter().map(|c| c.index(ranks.len())).collect();
            bounds.extend([0, ranks.len()]);
            bounds.sort_unstable();
            bounds.dedup();
            let mut root = Coverage::default();
            for w in bounds.windows(2) {
                let mut part = Coverage::default();
                for r in &ranks[w[0]..w[1]] {
                    part.add(&one(r));
                }
                prop_assert_eq!(part.check_child(part.expected), Ok(()));
                root.add(&part);
            }
            prop_assert_eq!(root.check_child(ranks.len() as u32), Ok(()));
            for (i, name) in names.iter().enumerate() {
                let of: Vec<_> = ranks.iter().filter(|(a, _)| *a == i).collect();
                match root.apps.iter().find(|a| a.app == *name) {
                    None => prop_assert!(of.is_empty()),
                    Some(a) => {
                        prop_assert_eq!(a.expected as usize, of.len());
                        prop_assert_eq!(a.covered as usize, of.iter().filter(|(_, w)| *w == 0).count());
                        prop_assert_eq!(
                            reason_of(&a.missing, MissingReason::Dropped) as usize,
                            of.iter().filter(|(_, w)| *w == 2).count()
                        );
                    }
                }
            }
            prop_assert_eq!(root.expected as usize, ranks.len());
        }
    }
}
