//! Sets of sources as bits: each source holds a small number while it is known, and after it is forgotten for as
//! long as a set may hold it; a set of sources (those that delivered to a group, or took part in a round's phase
//! 0) is a bit per number.
//!
//! A leaf with a thousand ranks remembers the participants of thousands of rounds; as sets of names that was
//! hundreds of megabytes, as bits it is 128 bytes a round.

use std::collections::HashMap;

use super::SourceId;

/// A source's number while it is known ([`Numbers`]).
pub(crate) type Number = u32;

/// Sources by number. A forgotten source keeps its number, retired under its name: sets may still hold it, and a
/// source that returns under that name (a relay's child that re-attaches) takes it back, with what it did before.
/// A retired number is given to another source only once no set holds it ([`Numbers::sweep`]).
#[derive(Debug)]
pub(crate) struct Numbers {
    names: Vec<Option<SourceId>>,
    retired: HashMap<SourceId, Number>,
    free: Vec<Number>,
    /// How many retired numbers call for a sweep.
    sweep_at: usize,
}

/// The fewest retired numbers that call for a sweep.
const SWEEP_AT_LEAST: usize = 64;

impl Default for Numbers {
    fn default() -> Self {
        Self {
            names: Vec::new(),
            retired: HashMap::new(),
            free: Vec::new(),
            sweep_at: SWEEP_AT_LEAST,
        }
    }
}

impl Numbers {
    /// A number for a source that has none: the one it held if it was forgotten and no sweep has freed it, else
    /// the lowest free one, so the sets stay short.
    pub(crate) fn give(&mut self, id: &str) -> Number {
        if let Some(n) = self.retired.remove(id) {
            return n;
        }
        match self.free.pop() {
            Some(n) => {
                self.names[n as usize] = Some(id.to_string());
                n
            }
            None => {
                self.names.push(Some(id.to_string()));
                (self.names.len() - 1) as Number
            }
        }
    }

    /// Retires the number of a forgotten source; whether enough are retired that a sweep is due.
    pub(crate) fn retire(&mut self, n: Number) -> bool {
        if let Some(Some(id)) = self.names.get(n as usize) {
            self.retired.insert(id.clone(), n);
        }
        self.retired.len() >= self.sweep_at
    }

    /// Frees the retired numbers that no set holds: `held` is the union of every set.
    pub(crate) fn sweep(&mut self, held: &Members) {
        let names = &mut self.names;
        let free = &mut self.free;
        self.retired.retain(|_, n| {
            let keep = held.contains(*n);
            if !keep {
                names[*n as usize] = None;
                free.push(*n);
            }
            keep
        });
        // Lowest last, so `give` pops it first.
        self.free.sort_unstable_by(|a, b| b.cmp(a));
        self.sweep_at = SWEEP_AT_LEAST.max(2 * self.retired.len());
    }

    /// The number a forgotten source held, while it is retired.
    pub(crate) fn retired(&self, id: &str) -> Option<Number> {
        self.retired.get(id).copied()
    }

    /// The source holding `n`, known or forgotten.
    pub(crate) fn name(&self, n: Number) -> Option<&str> {
        self.names.get(n as usize).and_then(|s| s.as_deref())
    }
}

/// A set of sources by number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Members {
    words: Vec<u64>,
}

impl Members {
    /// Adds `n`; whether it was not in the set.
    pub(crate) fn insert(&mut self, n: Number) -> bool {
        let (word, bit) = (n as usize / 64, 1u64 << (n % 64));
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        let new = self.words[word] & bit == 0;
        self.words[word] |= bit;
        new
    }

    pub(crate) fn contains(&self, n: Number) -> bool {
        self.words
            .get(n as usize / 64)
            .is_some_and(|w| w & (1u64 << (n % 64)) != 0)
    }

    /// Adds every member of `other`.
    pub(crate) fn union_with(&mut self, other: &Members) {
        if other.words.len() > self.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (w, o) in self.words.iter_mut().zip(&other.words) {
            *w |= o;
        }
    }

    /// The numbers in the set, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Number> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            let mut rest = w;
            std::iter::from_fn(move || {
                (rest != 0).then(|| {
                    let bit = rest.trailing_zeros();
                    rest &= rest - 1;
                    (i * 64) as Number + bit
                })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Two sets and their union hold what `BTreeSet`s hold, whatever the numbers and their order.
        #[test]
        fn members_are_a_set_of_numbers(ops in prop::collection::vec((any::<bool>(), 0u32..300), 0..200)) {
            let (mut bits, mut other) = (Members::default(), Members::default());
            let (mut set, mut other_set) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
            for (first, n) in ops {
                if first {
                    prop_assert_eq!(bits.insert(n), set.insert(n));
                } else {
                    prop_assert_eq!(other.insert(n), other_set.insert(n));
                }
                prop_assert_eq!(bits.contains(n), set.contains(&n));
            }
            bits.union_with(&other);
            set.extend(other_set);
            prop_assert_eq!(bits.iter().collect::<Vec<_>>(), set.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_retired_number_returns_to_its_name_and_is_given_again_only_once_no_set_holds_it() {
        let mut numbers = Numbers::default();
        let [a, b, c] = ["a", "b", "c"].map(|id| numbers.give(id));
        assert_eq!([a, b, c], [0, 1, 2]);
        assert!(!numbers.retire(a));
        assert!(!numbers.retire(c));
        // Retired numbers keep their names and are not given to others.
        assert_eq!(numbers.name(a), Some("a"));
        assert_eq!(numbers.give("d"), 3);
        // A returning name takes its number back.
        assert_eq!(numbers.give("a"), a);
        assert_eq!(numbers.retired("a"), None);
        assert!(!numbers.retire(a));
        // A sweep frees what no set holds, lowest first.
        let mut held = Members::default();
        held.insert(c);
        numbers.sweep(&held);
        assert_eq!(numbers.name(a), None);
        assert_eq!(numbers.retired("c"), Some(c));
        assert_eq!(numbers.give("e"), a);
        assert_eq!(numbers.give("f"), 4);
        numbers.sweep(&Members::default());
        assert_eq!(numbers.give("g"), c);
        assert_eq!(numbers.name(b), Some("b"));
    }

    #[test]
    fn a_sweep_is_due_once_retired_numbers_pile_up() {
        let mut numbers = Numbers::default();
        let all: Vec<Number> = (0..200).map(|i| numbers.give(&format!("r{i}"))).collect();
        let due = all.iter().position(|n| numbers.retire(*n));
        assert_eq!(due, Some(SWEEP_AT_LEAST - 1));
        // Those still held raise the next threshold, so sweeps stay rare.
        let mut held = Members::default();
        all[..SWEEP_AT_LEAST].iter().for_each(|n| {
            held.insert(*n);
        });
        numbers.sweep(&held);
        assert_eq!(numbers.sweep_at, 2 * SWEEP_AT_LEAST);
    }
}
