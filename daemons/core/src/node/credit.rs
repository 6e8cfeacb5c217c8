//! Flow control by rounds between a node and its neighbours: the credit it hears from its parent (which caps its
//! window), the credit it gives its children (its window's limit, sent again each time it has moved a quarter of
//! the window), and the Want it sends up when its own producers wait beyond the parent's credit.

/// A node's side of the credit exchange. Its methods return what to send; the node sends it.
#[derive(Debug, Default)]
pub(crate) struct Credit {
    /// The parent's last credit: rounds below it may go up.
    from_parent: Option<u64>,
    /// The last credit sent down.
    given: Option<u64>,
    /// The last round asked for with a Want since the parent's last credit.
    wanted: u64,
    /// The root's watermark as the parent passed it on: every round below it closed at the root.
    closed_below: u64,
}

impl Credit {
    /// The cap on this node's window.
    pub(crate) fn cap(&self) -> Option<u64> {
        self.from_parent
    }

    /// The root's watermark as heard from the parent (0: none yet), passed on to the children with the credit.
    pub(crate) fn closed_below(&self) -> u64 {
        self.closed_below
    }

    /// The parent's credit arrived, with the root's watermark. A producer still waiting beyond it asks again:
    /// the parent forgets a Want once its window covers it, so a window that covered it and fell back (or a
    /// parent that restarted, or an adopter) may no longer know it, and a Want sent only once would leave the
    /// producer waiting for ever.
    pub(crate) fn heard(&mut self, below: u64, closed_below: u64) {
        self.from_parent = Some(below);
        self.closed_below = self.closed_below.max(closed_below);
        self.wanted = 0;
    }

    /// The credit to give the children after the window moved to `limit`, if they should hear it now: when it
    /// moved back, `step` rounds on, or past a round `answered` that a child waits at beyond the last credit.
    /// (A child hears the limit when it attaches, so the first needs no broadcast.)
    pub(crate) fn give(&mut self, limit: u64, step: u64, answered: Option<u64>) -> Option<u64> {
        let due = match self.given {
            None => {
                self.given = Some(limit);
                false
            }
            Some(given) => {
                limit < given
                    || limit >= given.saturating_add(step)
                    || answered.is_some_and(|round| round >= given && round < limit)
            }
        };
        if due {
            self.given = Some(limit);
        }
        due.then_some(limit)
    }

    /// The Want to send up for a producer waiting at `waiting` beyond the window, unless it was sent already.
    pub(crate) fn want(&mut self, waiting: Option<u64>) -> Option<u64> {
        let round = waiting?;
        if self.from_parent.is_none() || round <= self.wanted {
            return None;
        }
        self.wanted = round;
        Some(round)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_hear_the_credit_every_step_and_whenever_it_falls() {
        let mut c = Credit::default();
        assert_eq!(
            c.give(64, 16, None),
            None,
            "children hear the first limit as they attach"
        );
        assert_eq!(c.give(70, 16, None), None);
        assert_eq!(c.give(79, 16, None), None);
        assert_eq!(c.give(80, 16, None), Some(80));
        assert_eq!(
            c.give(40, 16, None),
            Some(40),
            "a window that moved back is told at once"
        );
    }

    #[test]
    fn a_child_waiting_beyond_its_credit_hears_the_limit_that_covers_it() {
        let mut c = Credit::default();
        assert_eq!(c.give(64, 16, None), None);
        assert_eq!(c.give(66, 16, Some(63)), None, "its credit covers it");
        assert_eq!(c.give(66, 16, Some(64)), Some(66));
        assert_eq!(c.give(67, 16, Some(66)), Some(67));
        assert_eq!(c.give(68, 16, Some(68)), None, "the limit does not cover it");
    }

    #[test]
    fn a_want_goes_up_once_per_round_and_again_after_the_credit_moves() {
        let mut c = Credit::default();
        assert_eq!(c.want(Some(100)), None, "the root has no parent to ask");
        c.heard(64, 0);
        assert_eq!(c.cap(), Some(64));
        assert_eq!(c.want(None), None);
        assert_eq!(c.want(Some(100)), Some(100));
        assert_eq!(c.want(Some(100)), None);
        assert_eq!(c.want(Some(90)), None);
        assert_eq!(c.want(Some(120)), Some(120));
        c.heard(200, 0);
        assert_eq!(c.want(Some(230)), Some(230));
    }

    #[test]
    fn a_want_goes_up_again_after_a_credit_that_does_not_cover_it() {
        let mut c = Credit::default();
        c.heard(64, 0);
        assert_eq!(c.want(Some(100)), Some(100));
        // The parent's window covered round 100 for a moment (so it forgot the Want) and fell back: its credit
        // is below 100 again, and the producer still waits there.
        c.heard(60, 0);
        assert_eq!(c.want(Some(100)), Some(100), "the Want is not sent again");
        assert_eq!(c.want(Some(100)), None);
        // A new parent (a restart, an adopter) hears it too.
        c.heard(70, 0);
        assert_eq!(c.want(Some(100)), Some(100));
    }
}
