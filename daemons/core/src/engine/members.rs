//! Sets of sources as bits: each known source holds a small number for as long as it is known, and a set of
//! sources (those that delivered to a group, or took part in a round's phase 0) is a bit per number.
//!
//! A leaf with a thousand ranks remembers the participants of thousands of rounds; as sets of names that was
//! hundreds of megabytes, as bits it is 128 bytes a round.

use super::SourceId;

/// A source's number while it is known ([`Numbers`]).
pub(crate) type Number = u32;

/// Sources by number; numbers of forgotten sources are given again, once every set has let them go.
#[derive(Debug, Default)]
pub(crate) struct Numbers {
    names: Vec<Option<SourceId>>,
    free: Vec<Number>,
}

impl Numbers {
    /// A number for a source that has none, the lowest free one first so the sets stay short.
    pub(crate) fn give(&mut self, id: &str) -> Number {
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

    /// Takes back the number of a forgotten source: the caller has taken it out of every set.
    pub(crate) fn take_back(&mut self, n: Number) {
        self.names[n as usize] = None;
        self.free.push(n);
        // Lowest last, so `give` pops it first.
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// The source holding `n`.
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

    pub(crate) fn remove(&mut self, n: Number) {
        if let Some(w) = self.words.get_mut(n as usize / 64) {
            *w &= !(1u64 << (n % 64));
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
        /// The set holds what a `BTreeSet` holds, whatever the numbers and the order of inserts and removals.
        #[test]
        fn members_are_a_set_of_numbers(ops in prop::collection::vec((any::<bool>(), 0u32..300), 0..200)) {
            let mut bits = Members::default();
            let mut set = std::collections::BTreeSet::new();
            for (add, n) in ops {
                if add {
                    prop_assert_eq!(bits.insert(n), set.insert(n));
                } else {
                    bits.remove(n);
                    set.remove(&n);
                }
                prop_assert_eq!(bits.contains(n), set.contains(&n));
            }
            prop_assert_eq!(bits.iter().collect::<Vec<_>>(), set.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn numbers_are_given_again_lowest_first_once_taken_back() {
        let mut numbers = Numbers::default();
        let [a, b, c] = ["a", "b", "c"].map(|id| numbers.give(id));
        assert_eq!([a, b, c], [0, 1, 2]);
        numbers.take_back(c);
        numbers.take_back(a);
        assert_eq!(numbers.name(a), None);
        assert_eq!(numbers.give("d"), a);
        assert_eq!(numbers.give("e"), c);
        assert_eq!(numbers.give("f"), 3);
        assert_eq!(numbers.name(b), Some("b"));
        assert_eq!(numbers.name(a), Some("d"));
    }
}
