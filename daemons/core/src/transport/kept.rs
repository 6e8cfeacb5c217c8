//! What a node sent up that may still be needed: every packet for a round the root has not closed yet, so a
//! node whose parent dies can send again what the parent never passed on.
//!
//! Packets are kept per session (one attachment to a parent), numbered in the order they were sent. The root's
//! watermark (`Credit.closed_below`, passed down by every node) releases the current session's packets of the
//! rounds it has closed, among those the parent has read (`Credit.taken`): a packet still on its way when its round
//! closed without it stays, so a broken link cannot lose it. When the parent is
//! lost, its session's packets stay until the adopter says which rounds the lost node delivered
//! ([`Kept::resend`]): the others are sent again, the rest forgotten. Nothing waits unbounded: a session that no
//! adopter answers for is forgotten after [`OLD_SESSION_HOLD`], and the whole store holds at most
//! [`MAX_KEPT_BYTES`] (the oldest packets go first, and are counted).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use canopy_proto::v1::{Envelope, Resend};
use tokio::time::Instant;

/// The most payload bytes kept per link. A window of rounds of a leaf's or a relay's packets is far below it.
pub const MAX_KEPT_BYTES: usize = 64 << 20;

/// How long a lost parent's packets wait for the next parent's [`Resend`] (an adopter's, or the same parent's
/// once the node is back with it): a partition of minutes loses nothing.
pub const OLD_SESSION_HOLD: Duration = Duration::from_secs(300);

struct KeptPacket {
    session: u64,
    /// Its place among the session's packets, from 0.
    seq: u64,
    env: Envelope,
}

/// The packets one link keeps.
pub(crate) struct Kept {
    packets: VecDeque<KeptPacket>,
    bytes: usize,
    max_bytes: usize,
    /// Sessions that ended, and when: their packets wait for a [`Resend`] until [`OLD_SESSION_HOLD`] later.
    ended: HashMap<u64, Instant>,
    /// Packets forgotten before they were released (the byte bound, or a lost parent no adopter answered for).
    pub(crate) evicted: u64,
    /// The session packets are being numbered for, and the next number.
    numbering: (u64, u64),
}

impl Default for Kept {
    fn default() -> Self {
        Self::with_bound(MAX_KEPT_BYTES)
    }
}

impl Kept {
    pub(crate) fn with_bound(max_bytes: usize) -> Self {
        Self {
            packets: VecDeque::new(),
            bytes: 0,
            max_bytes,
            ended: HashMap::new(),
            evicted: 0,
            numbering: (0, 0),
        }
    }

    /// Keeps a packet sent up in `session`.
    pub(crate) fn keep(&mut self, session: u64, env: Envelope) {
        if self.numbering.0 != session {
            self.numbering = (session, 0);
        }
        let seq = self.numbering.1;
        self.numbering.1 += 1;
        self.bytes += env.payload.len();
        self.packets.push_back(KeptPacket { session, seq, env });
        while self.bytes > self.max_bytes {
            let Some(p) = self.packets.pop_front() else { break };
            self.bytes -= p.env.payload.len();
            self.evicted += 1;
            if self.evicted.is_power_of_two() {
                tracing::warn!(
                    evicted = self.evicted,
                    max_bytes = self.max_bytes,
                    "packets sent up forgotten before the root closed their rounds: a parent lost now may lose them"
                );
            }
        }
    }

    /// The root closed every round below `closed_below`, and the parent had read the first `taken - 1` packets of
    /// the session (`taken` 0: a parent that does not say): `session`'s packets of those rounds that the parent
    /// read are no longer needed.
    pub(crate) fn release(&mut self, session: u64, closed_below: u64, taken: u64) {
        let read = match taken {
            0 => u64::MAX,
            n => n - 1,
        };
        let bytes = &mut self.bytes;
        self.packets.retain(|p| {
            let keep = p.session != session || p.env.round >= closed_below || p.seq >= read;
            if !keep {
                *bytes -= p.env.payload.len();
            }
            keep
        });
    }

    /// `session` ended (its parent was lost): its packets wait for an adopter's word. Sessions that ended longer
    /// than [`OLD_SESSION_HOLD`] ago are forgotten.
    pub(crate) fn session_ended(&mut self, session: u64, now: Instant) {
        self.ended.insert(session, now);
        let expired: Vec<u64> = self
            .ended
            .iter()
            .filter(|(_, at)| now.duration_since(**at) > OLD_SESSION_HOLD)
            .map(|(s, _)| *s)
            .collect();
        for s in expired {
            self.ended.remove(&s);
            self.forget(|p| p.session == s, true);
        }
    }

    /// The adopter's answer: the packets of earlier sessions for rounds the lost node did not deliver (of the
    /// streams the adopter names), in the order they were first sent; every packet of an earlier session is
    /// forgotten (the ones returned are kept again as they are sent in the current session).
    pub(crate) fn resend(&mut self, current: u64, resend: &Resend) -> Vec<Envelope> {
        let delivered: HashMap<u32, &[canopy_proto::v1::RoundSpan]> = resend
            .streams
            .iter()
            .map(|s| (s.stream_id, s.delivered.as_slice()))
            .collect();
        let mut again = Vec::new();
        let bytes = &mut self.bytes;
        self.packets.retain(|p| {
            if p.session == current {
                return true;
            }
            let wanted = delivered
                .get(&p.env.stream_id)
                .is_some_and(|spans| !spans.iter().any(|s| s.from <= p.env.round && p.env.round < s.end));
            tracing::debug!(
                session = p.session,
                stream = p.env.stream_id,
                round = p.env.round,
                phase = p.env.phase,
                wanted,
                "kept packet of an earlier session"
            );
            *bytes -= p.env.payload.len();
            if wanted {
                again.push(p.env.clone());
            }
            false
        });
        self.ended.clear();
        again
    }

    fn forget(&mut self, which: impl Fn(&KeptPacket) -> bool, count: bool) {
        let bytes = &mut self.bytes;
        let mut n = 0;
        self.packets.retain(|p| {
            let drop = which(p);
            if drop {
                *bytes -= p.env.payload.len();
                n += 1;
            }
            !drop
        });
        if count {
            self.evicted += n;
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.packets.len()
    }

    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::v1::{RoundSpan, StreamRounds};

    fn env(stream: u32, round: u64, len: usize) -> Envelope {
        Envelope {
            stream_id: stream,
            round,
            payload: vec![0; len].into(),
            ..Default::default()
        }
    }

    fn rounds(v: &[Envelope]) -> Vec<(u32, u64)> {
        v.iter().map(|e| (e.stream_id, e.round)).collect()
    }

    #[test]
    fn the_watermark_releases_only_the_current_sessions_closed_rounds() {
        let mut k = Kept::default();
        for r in 0..4 {
            k.keep(1, env(1, r, 10));
        }
        k.session_ended(1, Instant::now());
        for r in 4..8 {
            k.keep(2, env(1, r, 10));
        }
        k.release(2, 6, 0);
        assert_eq!(
            k.len(),
            6,
            "rounds 4 and 5 of session 2 released; session 1 waits for its adopter"
        );
        assert_eq!(k.bytes(), 60);
    }

    #[test]
    fn a_packet_the_parent_has_not_read_stays_though_its_round_closed() {
        let mut k = Kept::default();
        // Rounds 0 to 3 sent in session 1, then round 1 again, late (its first copy went with a broken link).
        for r in [0, 1, 2, 3, 1] {
            k.keep(1, env(1, r, 10));
        }
        // Every round below 4 closed at the root, which had read the first three packets (taken = 3 + 1).
        k.release(1, 4, 4);
        assert_eq!(
            k.len(),
            2,
            "round 3 and the late round 1 are still on their way: they stay"
        );
        // Once the parent has read them, they go.
        k.release(1, 4, 6);
        assert_eq!((k.len(), k.bytes()), (0, 0));
        // A new session numbers its packets from 0 again.
        k.keep(2, env(1, 5, 10));
        k.release(2, 6, 1);
        assert_eq!(k.len(), 1, "none of session 2's packets read yet");
        k.release(2, 6, 2);
        assert_eq!(k.len(), 0);
    }

    #[test]
    fn an_adopter_gets_again_what_the_lost_node_did_not_deliver_and_nothing_twice() {
        let mut k = Kept::default();
        for r in 0..6 {
            k.keep(1, env(1, r, 1));
            k.keep(1, env(2, r, 1));
        }
        k.keep(2, env(1, 6, 1));
        let resend = Resend {
            lost: "relay".into(),
            streams: vec![StreamRounds {
                stream_id: 1,
                delivered: vec![RoundSpan { from: 0, end: 2 }, RoundSpan { from: 3, end: 4 }],
            }],
        };
        let again = k.resend(2, &resend);
        // Stream 2 is not run by the adopter: nothing of it goes again.
        assert_eq!(rounds(&again), [(1, 2), (1, 4), (1, 5)]);
        assert_eq!(k.len(), 1, "only the current session's packet is left");
        assert!(
            k.resend(2, &resend).is_empty(),
            "a second answer sends nothing again"
        );
    }

    #[test]
    fn the_bound_forgets_the_oldest_and_counts_them() {
        let mut k = Kept::with_bound(100);
        for r in 0..15 {
            k.keep(1, env(1, r, 10));
        }
        assert_eq!((k.len(), k.bytes(), k.evicted), (10, 100, 5));
    }

    #[test]
    fn a_lost_parent_no_adopter_answers_for_is_forgotten_in_time() {
        let mut k = Kept::default();
        let t0 = Instant::now();
        k.keep(1, env(1, 0, 10));
        k.session_ended(1, t0);
        k.keep(2, env(1, 1, 10));
        k.session_ended(2, t0 + OLD_SESSION_HOLD + Duration::from_secs(1));
        assert_eq!(k.len(), 1);
        assert_eq!(k.evicted, 1);
    }
}
