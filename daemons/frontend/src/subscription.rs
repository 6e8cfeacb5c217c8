//! One subscriber's stream of rounds (`Subscribe`): the rounds the store holds from where it asked, then the live
//! ones as the root finalizes them, each round once, with the names it has not been sent yet and, after it fell
//! behind, how many rounds it missed.

use std::collections::HashSet;
use std::sync::Arc;

use canopy_core::node::RoundResult;
use canopy_proto::v1::{EventName, RoundUpdate, SyncMode};
use canopy_store::{StoreError, StoreReader};
use tokio::sync::{broadcast, mpsc, watch};
use tonic::Status;

use crate::state::State;

/// What a subscriber asked for: streams by id and by name (empty: any), from a round on (`None`: live rounds
/// only).
#[derive(Debug, Clone, Default)]
pub(crate) struct Wanted {
    pub ids: HashSet<u32>,
    pub names: HashSet<String>,
    pub from: Option<u64>,
}

impl Wanted {
    pub fn stream(&self, id: u32, name: &str) -> bool {
        (self.ids.is_empty() || self.ids.contains(&id))
            && (self.names.is_empty() || self.names.contains(name))
    }
}

/// The names one subscription has been sent, and how far it has read the root's.
pub(crate) struct SentNames {
    sent: HashSet<u64>,
    /// The store's names, sent with the first update.
    stored: Vec<(u64, String)>,
    next: usize,
}

impl SentNames {
    pub fn new(stored: Vec<(u64, String)>) -> Self {
        SentNames {
            sent: HashSet::new(),
            stored,
            next: 0,
        }
    }

    /// The names not sent yet.
    fn new_ones(&mut self, shared: &State) -> Vec<EventName> {
        let stored = std::mem::take(&mut self.stored)
            .into_iter()
            .map(|(id, name)| EventName { id, name });
        stored
            .chain(shared.names_since(&mut self.next))
            .filter(|n| self.sent.insert(n.id))
            .collect()
    }
}

/// What the store holds of the streams a subscriber wants, from `from_round` on, as updates in round order (a
/// round's streams by id, as the tree stored them), so a subscriber drawing round by round sees every stream from
/// the first; and the don't-wait streams among them, whose rounds come in pieces.
pub(crate) fn stored_updates(
    reader: &StoreReader,
    wanted: &Wanted,
    from_round: u64,
) -> Result<(Vec<RoundUpdate>, HashSet<u32>), StoreError> {
    let mut out = Vec::new();
    let mut dont_wait = HashSet::new();
    for s in reader.streams()?.into_iter() {
        if s.sync_mode == SyncMode::DontWait {
            dont_wait.insert(s.stream_id);
        }
        if !wanted.stream(s.stream_id, &s.name) {
            continue;
        }
        for r in reader.stored_rounds(&s, from_round)? {
            out.push(r.update(&s, true));
        }
    }
    out.sort_by_key(|u| (u.round, u.stream_id));
    Ok((out, dont_wait))
}

/// One subscriber's task: what it wants, what the store sent it already, the names it has.
pub(crate) struct Subscription {
    pub wanted: Wanted,
    /// Rounds of wait-for-all streams sent from the store: the same round arriving live is not sent again
    /// (a don't-wait stream's pieces are each their own update).
    pub seen: HashSet<(u32, u64)>,
    /// `None` when the subscriber did not ask for names.
    pub names: Option<SentNames>,
    pub shared: Arc<State>,
}

impl Subscription {
    /// Sends `stored`, then every live round the subscriber wants until the run ends (what is queued then still
    /// goes out) or the subscriber hangs up.
    pub async fn run(
        mut self,
        stored: Vec<RoundUpdate>,
        mut live: broadcast::Receiver<Arc<RoundResult>>,
        mut ended: watch::Receiver<bool>,
        tx: mpsc::Sender<Result<RoundUpdate, Status>>,
    ) {
        for u in stored {
            if !self.send(&tx, u).await {
                return;
            }
        }
        let mut missed = 0u64;
        loop {
            // The client hanging up ends the task even while its streams are quiet.
            let received = tokio::select! {
                _ = tx.closed() => return,
                r = live.recv() => r,
                _ = async { drop(ended.wait_for(|ended| *ended).await) } => {
                    // The run is over: what is queued still goes out, then the stream ends with OK.
                    loop {
                        match live.try_recv() {
                            Ok(r) => {
                                if !self.offer(&tx, &r, &mut missed).await {
                                    return;
                                }
                            }
                            Err(broadcast::error::TryRecvError::Lagged(n)) => missed += n,
                            Err(_) => return,
                        }
                    }
                }
            };
            match received {
                Ok(r) => {
                    if !self.offer(&tx, &r, &mut missed).await {
                        return;
                    }
                }
                // This subscriber fell behind: the tree did not wait; the next update says how much it missed.
                Err(broadcast::error::RecvError::Lagged(n)) => missed += n,
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Sends a live round if the subscriber wants it, with the rounds it missed before it. Returns false once the
    /// subscriber has hung up.
    async fn offer(
        &mut self,
        tx: &mpsc::Sender<Result<RoundUpdate, Status>>,
        r: &RoundResult,
        missed: &mut u64,
    ) -> bool {
        let Some(u) = self.update(r, *missed) else {
            return true;
        };
        *missed = 0;
        self.send(tx, u).await
    }

    /// The update of a live round, if the subscriber wants it.
    fn update(&self, r: &RoundResult, missed: u64) -> Option<RoundUpdate> {
        // `fromRound` holds for live rounds too: one in the future waits for its round.
        let wanted = self.wanted.stream(r.stream.stream_id, &r.stream.name)
            && self.wanted.from.is_none_or(|from| r.round >= from)
            && (r.late || !self.seen.contains(&(r.stream.stream_id, r.round)));
        wanted.then(|| RoundUpdate {
            missed,
            ..RoundUpdate::of(
                canopy_proto::StreamOf {
                    id: r.stream.stream_id,
                    name: &r.stream.name,
                    filter: &r.stream.filter,
                    result_type: &self.shared.result_type(r.stream.stream_id),
                },
                canopy_proto::RoundOf {
                    round: r.round,
                    phase: r.phase,
                    coverage: r.coverage.clone(),
                    payload: r.payload.clone(),
                    late: r.late,
                },
                false,
            )
        })
    }

    /// Sends an update with the names not sent yet. Returns false once the subscriber has hung up.
    async fn send(&mut self, tx: &mpsc::Sender<Result<RoundUpdate, Status>>, mut u: RoundUpdate) -> bool {
        if let Some(n) = &mut self.names {
            u.names = n.new_ones(&self.shared);
        }
        tx.send(Ok(u)).await.is_ok()
    }
}
