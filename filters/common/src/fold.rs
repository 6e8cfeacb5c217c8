//! A leaf's summaries, folded rank by rank in one pass with no allocation per value, and handed over as
//! columns.
//!
//! Rows live in a vector; the rank holding an extreme is an index into a table of applications, not a
//! string. Ranks of one application usually report the same keys in the same order, so the row the value at
//! each position last went to is tried first and the hash map is the fallback. The arithmetic is
//! [`crate::summary::add_value`]'s ([`crate::summary::merge_moments`]), so the columns are bit for bit those of
//! [`crate::summary::StatsMap`] turned into columns.
//!
//! Broken down by application ([`Fold::by_app`]), a row is per (application, key): each application has its
//! own map and positions, so the application's index, known once per rank, is all a value adds to the work.

use std::collections::HashMap;

use canopy_filter_proto::v1::StatsColumns;
use prost::Message;

use crate::columns::{self, Row};
use crate::metrics::Key;
use crate::sketch::{Sketch, Spec};
use crate::sketch_columns;
use crate::summary::BuildKeyHasher;

/// One rank's values going into a fold as [`crate::metrics::extract_view`] reads them; made by [`Fold::feed`].
pub struct Feed<'f> {
    fold: &'f mut Fold,
    at: RankAt,
}

impl crate::metrics::Sink for Feed<'_> {
    /// Inlined wherever the reader hands over a value: it runs for every value of every rank.
    #[inline(always)]
    fn value(&mut self, key: Key, v: f64) {
        self.fold.add(&mut self.at, key, v);
    }
}

/// Where a rank's values go: its application's index and its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankAt {
    app: u32,
    rank: u32,
    /// The rank's rows' map and positions: its application's when broken down by application, else 0.
    slot: u32,
    /// The position of the rank's next value.
    next: usize,
}

/// The summaries of a leaf's round, kept between rounds so their buffers are reused.
#[derive(Debug, Default)]
pub struct Fold {
    /// Whether rows are per (application, key) rather than per key.
    by_app: bool,
    /// Per slot (see [`RankAt`]), each key's row. Slots outlive rounds so their buffers are reused.
    index: Vec<HashMap<Key, u32, BuildKeyHasher>>,
    keys: Vec<Key>,
    /// Each row's slot: its application's index when broken down by application.
    slots: Vec<u32>,
    rows: Vec<Row>,
    apps: Vec<String>,
    /// The key and row of the value at each position, for the last rank of slot `active` that reached that
    /// position: the positions of the slot in use, at hand for every value (the key beside the row, so a
    /// value's test reads one entry).
    by_position: Vec<(Key, u32)>,
    active: u32,
    /// The other slots' positions, kept while another is active (the active slot's entry is empty).
    parked: Vec<Vec<(Key, u32)>>,
    /// With quantiles: the spec, and one sketch per row. Sketches outlive rounds (only the first
    /// `rows.len()` are in use) so their bins are reused.
    sketch: Option<Spec>,
    sketches: Vec<Sketch>,
    /// The last round's rows in output order, and the keys, slots and applications it was worked out for: a
    /// round whose ranks reported the same keys in the same order (the usual round) has the same order.
    sorted: Sorted,
}

/// An output order of rows and what it depends on.
#[derive(Debug, Default)]
struct Sorted {
    order: Vec<u32>,
    keys: Vec<Key>,
    slots: Vec<u32>,
    apps: Vec<String>,
}

impl Fold {
    /// A fold that also sketches each row's values for quantiles.
    pub fn with_sketches(spec: Spec) -> Fold {
        Fold {
            sketch: Some(spec),
            ..Fold::default()
        }
    }

    /// The same fold with rows per (application, key) when `yes`: each application's ranks summarized apart.
    pub fn by_app(self, yes: bool) -> Fold {
        Fold { by_app: yes, ..self }
    }

    /// Empties the fold for a new round, keeping its buffers.
    pub fn clear(&mut self) {
        self.index.iter_mut().for_each(HashMap::clear);
        self.keys.clear();
        self.slots.clear();
        self.rows.clear();
        self.apps.clear();
        self.by_position.clear();
        self.parked.iter_mut().for_each(Vec::clear);
    }

    /// Makes `slot`'s positions the ones at hand, parking the others.
    fn activate(&mut self, slot: u32) {
        std::mem::swap(&mut self.by_position, &mut self.parked[self.active as usize]);
        std::mem::swap(&mut self.by_position, &mut self.parked[slot as usize]);
        self.active = slot;
    }

    /// Starts a rank's values.
    pub fn rank(&mut self, app: &str, rank: u32) -> RankAt {
        let app = match self.apps.iter().rposition(|a| a == app) {
            Some(i) => i,
            None => {
                self.apps.push(app.to_string());
                self.apps.len() - 1
            }
        };
        let slot = if self.by_app { app } else { 0 };
        if self.index.len() <= slot {
            self.index.resize_with(slot + 1, HashMap::default);
            self.parked.resize_with(slot + 1, Vec::new);
        }
        if slot as u32 != self.active {
            self.activate(slot as u32);
        }
        RankAt {
            app: app as u32,
            rank,
            slot: slot as u32,
            next: 0,
        }
    }

    /// Starts a rank's values, to be fed as [`crate::metrics::extract_view`] reads them.
    pub fn feed(&mut self, app: &str, rank: u32) -> Feed<'_> {
        let at = self.rank(app, rank);
        Feed { fold: self, at }
    }

    /// Adds one value of the rank `at` to its key's row, as [`crate::summary::add_value`] does, and returns the
    /// row: rows are numbered from 0 in the order keys (per application, when broken down) first appear in the
    /// round.
    #[inline(always)]
    pub fn add(&mut self, at: &mut RankAt, key: Key, v: f64) -> u32 {
        let pos = at.next;
        at.next += 1;
        // Ranks are folded one after the other, so this is the slot `rank` made active (unless a caller
        // interleaves ranks of two applications).
        if at.slot != self.active {
            self.activate(at.slot);
        }
        let row = match self.by_position.get(pos) {
            Some(&(k, row)) if k == key => row,
            _ => {
                let row = self.row_of(at.slot as usize, key);
                if pos < self.by_position.len() {
                    self.by_position[pos] = (key, row);
                } else {
                    self.by_position.push((key, row));
                }
                row
            }
        };
        let holder = (at.app, at.rank);
        let apps = &self.apps;
        // (app, rank) in the order of the application names, then the rank.
        let before = |a: (u32, u32), b: (u32, u32)| {
            if a.0 == b.0 {
                a.1 < b.1
            } else {
                (apps[a.0 as usize].as_str(), a.1) < (apps[b.0 as usize].as_str(), b.1)
            }
        };
        self.rows[row as usize].add_one(v, holder, before);
        if let Some(spec) = &self.sketch {
            self.sketches[row as usize].add(spec, v);
        }
        row
    }

    #[cold]
    fn row_of(&mut self, slot: usize, key: Key) -> u32 {
        let next = self.rows.len() as u32;
        let row = *self.index[slot].entry(key).or_insert(next);
        if row == next {
            self.keys.push(key);
            self.slots.push(slot as u32);
            self.rows.push(Row::empty());
            if self.sketch.is_some() {
                match self.sketches.get_mut(next as usize) {
                    Some(s) => s.clear(),
                    None => self.sketches.push(Sketch::default()),
                }
            }
        }
        row
    }

    /// The summaries as columns sorted by key (by application name, then key, when broken down by
    /// application), into `out` (cleared first).
    pub fn to_columns(&mut self, raw_bytes: u64, out: &mut StatsColumns) {
        out.clear();
        // The table names only the applications that hold an extreme (with a breakdown, each row's application
        // holds both of its extremes), sorted.
        let mut used = vec![false; self.apps.len()];
        for row in &self.rows {
            used[row.min_at.0 as usize] = true;
            used[row.max_at.0 as usize] = true;
        }
        let mut sorted: Vec<u32> = (0..self.apps.len() as u32)
            .filter(|&a| used[a as usize])
            .collect();
        sorted.sort_unstable_by(|&a, &b| self.apps[a as usize].cmp(&self.apps[b as usize]));
        let mut to_out = vec![0u32; self.apps.len()];
        for (new, &old) in sorted.iter().enumerate() {
            to_out[old as usize] = new as u32;
        }
        let same =
            self.sorted.keys == self.keys && self.sorted.slots == self.slots && self.sorted.apps == self.apps;
        if !same {
            let order = &mut self.sorted.order;
            order.clear();
            order.extend(0..self.rows.len() as u32);
            // With one application (the usual leaf) its rows sort by key alone.
            if self.by_app && sorted.len() > 1 {
                order.sort_unstable_by_key(|&r| {
                    (to_out[self.slots[r as usize] as usize], self.keys[r as usize])
                });
            } else {
                order.sort_unstable_by_key(|&r| self.keys[r as usize]);
            }
            self.sorted.keys.clone_from(&self.keys);
            self.sorted.slots.clone_from(&self.slots);
            self.sorted.apps.clone_from(&self.apps);
        }
        for &r in &self.sorted.order {
            if self.by_app {
                out.app.push(to_out[self.slots[r as usize] as usize]);
            }
            let row = &self.rows[r as usize];
            let held = |at: (u32, u32)| (to_out[at.0 as usize], at.1);
            let row = Row {
                min_at: held(row.min_at),
                max_at: held(row.max_at),
                ..*row
            };
            columns::push(out, self.keys[r as usize], &row);
            if self.sketch.is_some() {
                sketch_columns::push(out, &self.sketches[r as usize].view());
            }
        }
        if let Some(spec) = &self.sketch
            && !self.rows.is_empty()
        {
            out.sketch_accuracy = spec.accuracy();
        }
        out.apps
            .extend(sorted.iter().map(|&a| self.apps[a as usize].clone()));
        out.raw_bytes = raw_bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::StatsMap;
    use canopy_filter_proto::v1::RankRef;
    use proptest::prelude::*;

    proptest! {
        /// Folding gives, bit for bit, the columns of the same values added to a StatsMap, whatever the keys,
        /// their order per rank, the ties and the applications.
        #[test]
        fn folding_is_adding_to_a_stats_map(
            ranks in prop::collection::vec(
                (0usize..3, 0u32..50, prop::collection::vec((0u64..8, 1i32..4, -4i32..4), 0..24)),
                0..12,
            )
        ) {
            let apps = ["b", "a", "c"];
            let mut fold = Fold::default();
            // Twice: the second round reuses the buffers of the first.
            for _ in 0..2 {
                fold.clear();
                let mut map = StatsMap::new();
                for (app, rank, values) in &ranks {
                    let mut at = fold.rank(apps[*app], *rank);
                    let holder = RankRef { app: apps[*app].into(), rank: *rank };
                    for &(id, metric, v) in values {
                        let v = f64::from(v) * 0.5;
                        fold.add(&mut at, (id, metric), v);
                        map.add((id, metric), v, &holder);
                    }
                }
                let (mut folded, mut expected) = (StatsColumns::default(), StatsColumns::default());
                fold.to_columns(9, &mut folded);
                columns::from_map(&map, 9, &mut expected);
                prop_assert!(columns::check(&folded).is_ok());
                prop_assert_eq!(&folded, &expected);
            }
        }
    }

    proptest! {
        /// Broken down by application, folding gives, bit for bit, each application's own StatsMap, the
        /// applications in name order, each row naming its application.
        #[test]
        fn folding_by_app_is_a_stats_map_per_application(
            ranks in prop::collection::vec(
                (0usize..3, 0u32..50, prop::collection::vec((0u64..8, 1i32..4, -4i32..4), 0..24)),
                0..12,
            )
        ) {
            let apps = ["b", "a", "c"];
            let mut fold = Fold::default().by_app(true);
            for _ in 0..2 {
                fold.clear();
                let mut maps: std::collections::BTreeMap<&str, StatsMap> = Default::default();
                for (app, rank, values) in &ranks {
                    let mut at = fold.rank(apps[*app], *rank);
                    let holder = RankRef { app: apps[*app].into(), rank: *rank };
                    let map = maps.entry(apps[*app]).or_default();
                    for &(id, metric, v) in values {
                        let v = f64::from(v) * 0.5;
                        fold.add(&mut at, (id, metric), v);
                        map.add((id, metric), v, &holder);
                    }
                }
                let mut folded = StatsColumns::default();
                fold.to_columns(9, &mut folded);
                prop_assert!(columns::check(&folded).is_ok());
                prop_assert!(columns::check_breakdown(&folded, true).is_ok());
                prop_assert_eq!(folded.app.len(), folded.id.len());
                let expected = per_app_stats(&maps);
                prop_assert_eq!(columns::to_stats(&folded), expected);
            }
        }
    }

    /// Each application's summaries, in name order, each row naming its application ("" for none).
    fn per_app_stats(
        maps: &std::collections::BTreeMap<&str, StatsMap>,
    ) -> Vec<canopy_filter_proto::v1::EventStats> {
        maps.iter()
            .flat_map(|(app, m)| {
                m.to_final_stats().into_iter().map(|mut s| {
                    s.app = app.to_string();
                    s
                })
            })
            .collect()
    }

    /// One round: each rank's application, number, and values (id, metric, value).
    type Ranks = Vec<(usize, u32, Vec<(u64, i32, i32)>)>;

    proptest! {
        /// A fold kept from round to round gives each round, bit for bit, the summaries of that round's values
        /// added to StatsMaps (one per application when broken down), whether the round has the keys, order and
        /// applications of the one before or not.
        #[test]
        fn a_kept_fold_gives_each_round_its_own_summaries(
            rounds in prop::collection::vec(
                prop::collection::vec(
                    (0usize..3, 0u32..50, prop::collection::vec((0u64..8, 1i32..4, -4i32..4), 0..12)),
                    0..6,
                ),
                1..5,
            ),
            reassigned in prop::collection::vec(prop::collection::vec(0usize..3, 6), 0..4),
            by_app in any::<bool>(),
        ) {
            let apps = ["b", "a", "c"];
            let mut kept = Fold::default().by_app(by_app);
            // Each round, then the first round's ranks again with their values but other applications: the
            // same keys in the same order, their rows held by other applications.
            let again = reassigned.iter().map(|to| {
                rounds[0].iter().zip(to).map(|((_, rank, values), &app)| (app, *rank, values.clone())).collect()
            });
            let all: Vec<Ranks> = rounds.iter().cloned().chain(again).collect();
            for ranks in &all {
                kept.clear();
                let mut maps: std::collections::BTreeMap<&str, StatsMap> = Default::default();
                for (app, rank, values) in ranks {
                    let mut at = kept.rank(apps[*app], *rank);
                    let holder = RankRef { app: apps[*app].into(), rank: *rank };
                    let map = maps.entry(if by_app { apps[*app] } else { "" }).or_default();
                    for &(id, metric, v) in values {
                        kept.add(&mut at, (id, metric), f64::from(v));
                        map.add((id, metric), f64::from(v), &holder);
                    }
                }
                let mut folded = StatsColumns::default();
                kept.to_columns(1, &mut folded);
                let expected = per_app_stats(&maps);
                prop_assert_eq!(columns::to_stats(&folded), expected);
            }
        }
    }

    #[test]
    fn sketches_fill_their_columns_and_keep_their_bins_from_round_to_round() {
        let spec = Spec::new(0.01, 2048).unwrap();
        let mut fold = Fold::with_sketches(spec);
        let mut bins_at = Vec::new();
        for _ in 0..2 {
            fold.clear();
            for rank in 0..4 {
                let mut at = fold.rank("a", rank);
                fold.add(&mut at, (2, 1), f64::from(rank) * 10.0);
                fold.add(&mut at, (1, 1), -1.5);
            }
            bins_at.push(fold.sketches[0].view().pos.as_ptr());
            let mut out = StatsColumns::default();
            fold.to_columns(0, &mut out);
            assert!(sketch_columns::check(&out, Some(&spec)).is_ok());
            assert_eq!(out.sketch_accuracy, 0.01);
            // Key (1, 1) sorts first: four negative values; key (2, 1): a zero and three positives.
            assert_eq!((out.sketch_zero.clone(), out.sketch_neg_bins[0]), (vec![0, 1], 1));
            assert_eq!(out.sketch_counts[0], 4);
        }
        assert_eq!(bins_at[0], bins_at[1], "the second round reuses the first's bins");
    }

    #[test]
    fn ranks_of_two_applications_folded_in_turns_keep_their_own_rows() {
        let mut fold = Fold::default().by_app(true);
        let mut sim = fold.rank("sim", 0);
        let mut viz = fold.rank("viz", 0);
        for (id, v) in [(1, 1.0), (2, 2.0)] {
            fold.add(&mut sim, (id, 1), v);
            fold.add(&mut viz, (id, 1), v * 10.0);
        }
        let mut sim2 = fold.rank("sim", 1);
        fold.add(&mut sim2, (1, 1), 3.0);
        fold.add(&mut sim2, (2, 1), 4.0);
        let mut out = StatsColumns::default();
        fold.to_columns(0, &mut out);
        assert_eq!(out.apps, vec!["sim".to_string(), "viz".to_string()]);
        assert_eq!(out.app, vec![0, 0, 1, 1]);
        assert_eq!(out.count, vec![2, 2, 1, 1]);
        assert_eq!(out.mean, vec![2.0, 3.0, 10.0, 20.0]);
    }

    #[test]
    fn ranks_reporting_the_same_keys_in_the_same_order_skip_the_hash_map() {
        let mut fold = Fold::default();
        for rank in 0..3 {
            let mut at = fold.rank("a", rank);
            for id in 0..4 {
                fold.add(&mut at, (id, 1), f64::from(rank));
            }
        }
        assert_eq!(fold.index[0].len(), 4);
        let rows: Vec<u32> = fold.by_position.iter().map(|&(_, row)| row).collect();
        assert_eq!(rows, vec![0, 1, 2, 3]);
        let mut out = StatsColumns::default();
        fold.to_columns(0, &mut out);
        assert_eq!(out.count, vec![3; 4]);
        assert_eq!(out.max_rank, vec![2; 4]);
    }
}
