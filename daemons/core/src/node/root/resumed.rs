//! A root restarted on its store waits for the ranks its run expected: an engine source stands for the ranks not
//! attached again, so every round waits for them to its time-out (counting them late) instead of closing as whole
//! with part of the tree still away. Each child that comes back takes its ranks off it; past the wait, the ranks
//! still away count as lost, as a lost child's would.

use tokio::time::Instant;

use super::{AWAITED_SOURCE, Awaited, Root};
use crate::node::*;

impl<U: Up> Node<U, Root> {
    /// At the start of a continued run: the ranks its earlier root expected are awaited.
    pub(super) fn await_resumed_ranks(&mut self) {
        let root = &mut self.position;
        let ranks = root.opts.resume_ranks;
        if ranks == 0 {
            return;
        }
        tracing::info!(
            ranks,
            wait_ms = root.opts.resume_wait.as_millis() as u64,
            "continuing a run: its rounds wait for the ranks it expected to come back"
        );
        root.awaited = Some(Awaited {
            run_ranks: ranks,
            missing: ranks,
            until: Instant::now() + root.opts.resume_wait,
            given_up: false,
        });
        self.engine.add_source(AWAITED_SOURCE, ranks);
        // As reported: a lower count later takes ranks off it.
        self.engine.set_ranks_below(AWAITED_SOURCE, ranks);
    }

    /// Takes the ranks attached now (`expected`, the awaited ones included) off the awaited ones; returns the
    /// ranks attached, without the awaited.
    pub(super) async fn awaited_ranks_back(&mut self, expected: u32) -> u32 {
        let Some(awaited) = &mut self.position.awaited else {
            return expected;
        };
        let attached = expected.saturating_sub(awaited.missing);
        let missing = awaited.run_ranks.saturating_sub(attached);
        if missing >= awaited.missing {
            return attached;
        }
        awaited.missing = missing;
        if missing > 0 {
            tracing::info!(back = attached, missing, "ranks of the continued run came back");
            self.engine.set_ranks_below(AWAITED_SOURCE, missing);
            return attached;
        }
        tracing::info!(ranks = attached, "every rank the continued run expected is back");
        self.position.awaited = None;
        let closed = self.engine.withdraw_source(AWAITED_SOURCE);
        self.on_closed_all(closed).await;
        attached
    }

    /// The wait is over: the ranks still away count as lost in the rounds from now on (a child that brings them
    /// back later still takes them off).
    pub(super) async fn give_up_awaited_ranks(&mut self) {
        let Some(awaited) = &mut self.position.awaited else {
            return;
        };
        awaited.given_up = true;
        tracing::warn!(
            missing = awaited.missing,
            "ranks of the continued run did not come back in time: rounds count them lost until they do"
        );
        let closed = self.engine.set_source_state(AWAITED_SOURCE, SourceState::Lost);
        self.on_closed_all(closed).await;
    }
}
