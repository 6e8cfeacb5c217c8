//! The window of rounds in flight: the one back-pressure mechanism of a node.
//!
//! The node owns the [`Window`] and moves it as rounds close. Every producer that feeds the node rounds (the
//! transport reading a child, the agent's socket reading a rank, the simulated ranks) holds a [`WindowGate`] and
//! waits at it before it hands over a packet of a round at or above the limit. A waiting producer says which round
//! it waits for: when no round is open at the node, the node moves its window up to that round (a child rejoining
//! far ahead while no other child is delivering), so a wait never lasts for want of traffic.

use std::sync::Arc;

use tokio::sync::watch;

/// The node's side: sets the limit, hears what producers wait for.
#[derive(Debug)]
pub struct Window {
    limit: watch::Sender<u64>,
    wanted: watch::Receiver<u64>,
    /// Kept so that `wanted` never reports closed while the node lives.
    wanted_tx: Arc<watch::Sender<u64>>,
    max_in_flight: u64,
    /// A quarter of the window as it stands (from its floor to its limit), which the parent's credit may make
    /// much smaller than `max_in_flight`.
    step: u64,
    /// The highest wait the last move covered: a child waiting there has not heard the limit yet.
    answered: Option<u64>,
}

/// A producer's side: may a round be handed over yet?
#[derive(Debug, Clone)]
pub struct WindowGate {
    limit: watch::Receiver<u64>,
    wanted: Arc<watch::Sender<u64>>,
}

/// What the node knows when it moves its window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowState {
    /// The lowest round a group is open for.
    pub lowest_open: Option<u64>,
    /// The lowest round whose later phases the node still waits for (a multi-phase round stays in the window until
    /// this node sends up its last phase).
    pub lowest_awaited: Option<u64>,
    /// The highest round closed here.
    pub highest_closed: Option<u64>,
    /// At a leaf, the lowest round of a dump it holds: with no round open, the window moves up to it.
    pub lowest_held: Option<u64>,
    /// No limit at all: a leaf before collection starts holds its ranks' dumps itself, bounded per rank.
    pub unbounded: bool,
    /// Inputs wait in the node's queue: a round may be about to open, so a producer's wait cannot move the window
    /// yet (it would let a child far ahead in before the rounds already sent).
    pub inputs_pending: bool,
    /// The parent's credit: the window ends there if that is lower (never below the lowest round under way, which
    /// must be able to finish).
    pub credit: Option<u64>,
}

impl Window {
    /// A window of `max_in_flight` rounds (at least one), starting at round 0.
    pub fn new(max_in_flight: u64) -> (Window, WindowGate) {
        let max_in_flight = max_in_flight.max(1);
        let (limit_tx, limit_rx) = watch::channel(max_in_flight);
        let (wanted_tx, wanted_rx) = watch::channel(0);
        let wanted_tx = Arc::new(wanted_tx);
        let gate = WindowGate {
            limit: limit_rx,
            wanted: wanted_tx.clone(),
        };
        let window = Window {
            limit: limit_tx,
            wanted: wanted_rx,
            wanted_tx,
            max_in_flight,
            step: (max_in_flight / 4).max(1),
            answered: None,
        };
        (window, gate)
    }

    /// Another gate on the same window.
    pub fn gate(&self) -> WindowGate {
        WindowGate {
            limit: self.limit.subscribe(),
            wanted: self.wanted_tx.clone(),
        }
    }

    /// The current limit: rounds below it may be handed over.
    pub fn limit(&self) -> u64 {
        *self.limit.borrow()
    }

    /// The round a producer waits for, if the window (held down by the parent's credit) does not cover it.
    pub fn waiting_beyond(&self) -> Option<u64> {
        let wanted = *self.wanted.borrow();
        (wanted > 0 && wanted >= self.limit()).then_some(wanted)
    }

    /// What a child waits for (its Want): moves the window as a producer here waiting for `round` would.
    pub fn want(&self, round: u64) {
        raise(&self.wanted_tx, round);
    }

    /// How far the limit moves before the children hear a new credit: a quarter of the window as it stands. Not
    /// of `max_in_flight`: under a parent whose credit holds the window to a few rounds, the limit never gets a
    /// quarter of `max_in_flight` past what the children heard, and they would wait at their credit for ever.
    pub fn credit_step(&self) -> u64 {
        self.step
    }

    /// The highest round a producer (or a child, with its Want) waited for that the last move of the window
    /// covered. The children's credit may not cover it yet: the child waiting there must hear the new limit.
    pub fn answered(&self) -> Option<u64> {
        self.answered
    }

    /// Completes when a producer starts waiting for a round beyond any it waited for before.
    pub async fn waited(&mut self) {
        if self.wanted.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Moves the window: it starts at the lowest round still under way here; with none, after the last closed
    /// round, or at the highest round a producer waits for.
    pub fn update(&mut self, s: WindowState) -> u64 {
        let (limit, floor) = if s.unbounded {
            (u64::MAX, None)
        } else {
            let under_way = match (s.lowest_open, s.lowest_awaited) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (Some(floor), None) | (None, Some(floor)) => Some(floor),
                (None, None) => None,
            };
            let floor = under_way.unwrap_or_else(|| {
                let wanted = *self.wanted.borrow_and_update();
                s.highest_closed
                    .map_or(0, |h| h + 1)
                    .max(if s.inputs_pending { 0 } else { wanted })
                    .max(s.lowest_held.unwrap_or(0))
            });
            let own = floor.saturating_add(self.max_in_flight);
            let limit = match s.credit {
                Some(credit) => own.min(credit.max(under_way.map_or(0, |r| r + 1))),
                None => own,
            };
            (limit, Some(floor))
        };
        self.step = match floor {
            Some(floor) => limit.saturating_sub(floor) / 4,
            None => self.max_in_flight / 4,
        }
        .max(1);
        // A wait the window now covers is over: forget it (quietly), so it cannot move the window again later,
        // and say which it was, so a child that waits there hears the limit.
        let mut answered = None;
        self.wanted_tx.send_if_modified(|w| {
            if *w < limit {
                answered = (*w > 0).then_some(*w);
                *w = 0;
            }
            false
        });
        self.answered = answered;
        self.limit.send_if_modified(|w| {
            let changed = *w != limit;
            *w = limit;
            changed
        });
        limit
    }
}

impl WindowGate {
    /// Whether a packet of `round` may be handed over now.
    pub fn admits(&self, round: u64) -> bool {
        round < self.limit()
    }

    /// The current limit: rounds below it may be handed over.
    pub fn limit(&self) -> u64 {
        *self.limit.borrow()
    }

    /// Waits until `round` is inside the window; false once the node has ended.
    pub async fn admit(&mut self, round: u64) -> bool {
        loop {
            if round < *self.limit.borrow_and_update() {
                return true;
            }
            self.want(round);
            if self.limit.changed().await.is_err() {
                return false;
            }
        }
    }

    /// Tells the node that a packet of `round` waits.
    pub fn want(&self, round: u64) {
        raise(&self.wanted, round);
    }

    /// Waits until the window moves and returns its new limit; `None` once the node has ended.
    pub async fn moved(&mut self) -> Option<u64> {
        self.limit.changed().await.ok()?;
        Some(*self.limit.borrow_and_update())
    }
}

/// Records a wait for `round` if it is beyond any recorded (which wakes the node).
fn raise(wanted: &watch::Sender<u64>, round: u64) {
    wanted.send_if_modified(|w| {
        let more = round > *w;
        if more {
            *w = round;
        }
        more
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_gate_waits_until_the_window_reaches_its_round() {
        let (mut window, mut gate) = Window::new(4);
        assert!(gate.admits(3));
        assert!(!gate.admits(4));
        let waiter = tokio::spawn(async move { gate.admit(6).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        window.update(WindowState {
            lowest_open: Some(3),
            ..Default::default()
        });
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn with_no_round_open_the_window_moves_to_what_a_producer_waits_for() {
        let (mut window, mut gate) = Window::new(2);
        let waiter = tokio::spawn(async move { gate.admit(100).await });
        window.waited().await;
        // A round open here keeps the window where it is.
        let limit = window.update(WindowState {
            lowest_open: Some(0),
            ..Default::default()
        });
        assert_eq!(limit, 2);
        let limit = window.update(WindowState {
            highest_closed: Some(0),
            ..Default::default()
        });
        assert_eq!(limit, 102);
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn the_credit_step_is_a_quarter_of_the_window_the_parents_credit_leaves() {
        let (mut window, gate) = Window::new(64);
        assert_eq!(window.credit_step(), 16);
        let limit = window.update(WindowState {
            highest_closed: Some(3),
            credit: Some(8),
            ..Default::default()
        });
        assert_eq!((limit, window.credit_step()), (8, 1));
        let limit = window.update(WindowState {
            highest_closed: Some(3),
            credit: Some(100),
            ..Default::default()
        });
        assert_eq!((limit, window.credit_step()), (68, 16));
        // A wait the window covers now is reported once, as answered.
        gate.want(70);
        let limit = window.update(WindowState {
            lowest_open: Some(10),
            credit: Some(100),
            ..Default::default()
        });
        assert_eq!((limit, window.answered()), (74, Some(70)));
        window.update(WindowState {
            highest_closed: Some(9),
            credit: Some(100),
            ..Default::default()
        });
        assert_eq!(window.answered(), None);
    }

    #[tokio::test]
    async fn an_unbounded_window_admits_everything_and_a_dropped_node_releases_waiters() {
        let (mut window, mut gate) = Window::new(1);
        window.update(WindowState {
            unbounded: true,
            ..Default::default()
        });
        assert!(gate.admits(u64::MAX - 1));
        window.update(WindowState::default());
        let waiter = tokio::spawn(async move { gate.admit(10).await });
        tokio::task::yield_now().await;
        drop(window);
        assert!(!waiter.await.unwrap());
    }
}
