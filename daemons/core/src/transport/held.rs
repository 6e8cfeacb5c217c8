//! What a child sent that waits for its parent's window.
//!
//! A round opens at a node with its first phase. A first-phase packet of a round at or above the window waits
//! here; packets of rounds inside the window pass at once, and so does every later phase of a round and every
//! late packet, since neither opens a round (a later phase answers a packet the node sent down, so the node
//! admitted its round already, even if its window has moved below it since). Anything other than a packet keeps
//! its place behind the packets that wait before it.
//!
//! The queue is bounded: past [`HELD_PER_CHILD`] messages or [`HELD_BYTES_PER_CHILD`] of payload, the child's
//! stream is not read until the window moves (back pressure).

use std::collections::VecDeque;

use canopy_proto::v1::{Envelope, up_message::Msg};

use crate::window::WindowGate;

/// Messages, and payload bytes, a child may have waiting above the window before its stream stops being read.
pub(crate) const HELD_PER_CHILD: usize = 1024;
pub(crate) const HELD_BYTES_PER_CHILD: usize = 64 * 1024 * 1024;

/// One child's messages waiting for the window, in the order the child sent them.
#[derive(Debug, Default)]
pub(crate) struct Held {
    msgs: VecDeque<Msg>,
    bytes: usize,
}

/// Whether the window lets a packet through now.
pub(crate) fn admitted(env: &Envelope, window: &WindowGate) -> bool {
    admitted_below(env, window.limit())
}

/// [`admitted`] against a limit read once, for a scan of many packets.
fn admitted_below(env: &Envelope, limit: u64) -> bool {
    env.late || env.phase > 0 || env.round < limit
}

fn size(msg: &Msg) -> usize {
    match msg {
        Msg::Envelope(env) => env.payload.len(),
        _ => 0,
    }
}

impl Held {
    pub(crate) fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// Whether the child's stream may be read further.
    pub(crate) fn has_room(&self) -> bool {
        self.msgs.len() < HELD_PER_CHILD && self.bytes < HELD_BYTES_PER_CHILD
    }

    /// Whether a message just read goes to the node at once rather than waiting here.
    pub(crate) fn passes(&self, msg: &Msg, window: &WindowGate) -> bool {
        match msg {
            Msg::Envelope(env) => admitted(env, window),
            _ => self.msgs.is_empty(),
        }
    }

    /// Keeps a message that may not pass yet.
    pub(crate) fn hold(&mut self, mut msg: Msg) {
        // A payload read off the wire is a slice of the buffer it arrived in, and would keep all of that buffer
        // while it waits here: it is given an allocation of its own, so the bound counts what is kept.
        if let Msg::Envelope(env) = &mut msg {
            env.payload = bytes::Bytes::copy_from_slice(&env.payload);
        }
        self.bytes += size(&msg);
        self.msgs.push_back(msg);
    }

    /// Takes out, in order, every held packet the window now admits, and every other message that no waiting
    /// packet precedes.
    pub(crate) fn release(&mut self, window: &WindowGate) -> Vec<Msg> {
        let mut out = Vec::new();
        let limit = window.limit();
        let goes = |msg: &Msg| match msg {
            Msg::Envelope(env) => admitted_below(env, limit),
            _ => true,
        };
        // Usually the window moved to the first packet held: take what goes from the front, and scan (and move)
        // the rest only if a packet further back goes too.
        while self.msgs.front().is_some_and(goes) {
            let msg = self.msgs.pop_front().expect("a front message");
            self.bytes -= size(&msg);
            out.push(msg);
        }
        let later = self
            .msgs
            .iter()
            .any(|m| matches!(m, Msg::Envelope(env) if admitted_below(env, limit)));
        if !later {
            return out;
        }
        let mut kept = VecDeque::new();
        for msg in self.msgs.drain(..) {
            let goes = match &msg {
                Msg::Envelope(env) => admitted_below(env, limit),
                _ => kept.is_empty(),
            };
            if goes {
                self.bytes -= size(&msg);
                out.push(msg);
            } else {
                kept.push_back(msg);
            }
        }
        self.msgs = kept;
        out
    }

    /// The round of the first packet still waiting: the one the node is told about, so that with no round open
    /// it moves its window there.
    pub(crate) fn first_round(&self) -> Option<u64> {
        self.msgs.iter().find_map(|m| match m {
            Msg::Envelope(env) => Some(env.round),
            _ => None,
        })
    }

    /// Takes the next message in the order the child sent it (once the child has left, everything it sent still
    /// goes to the node, as the window allows).
    pub(crate) fn pop(&mut self) -> Option<Msg> {
        let msg = self.msgs.pop_front()?;
        self.bytes -= size(&msg);
        Some(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::{Window, WindowState};
    use canopy_proto::v1::Fin;

    fn packet(round: u64, phase: u32) -> Msg {
        Msg::Envelope(Envelope {
            round,
            phase,
            payload: vec![0; 10].into(),
            ..Default::default()
        })
    }

    fn fin() -> Msg {
        Msg::Fin(Fin::default())
    }

    fn rounds(msgs: &[Msg]) -> Vec<(u64, u32)> {
        msgs.iter()
            .map(|m| match m {
                Msg::Envelope(e) => (e.round, e.phase),
                _ => (u64::MAX, u32::MAX),
            })
            .collect()
    }

    /// A window of 4 whose floor is at `floor`.
    fn window_at(floor: u64) -> (Window, WindowGate) {
        let (mut window, gate) = Window::new(4);
        window.update(WindowState {
            lowest_open: Some(floor),
            ..Default::default()
        });
        (window, gate)
    }

    #[test]
    fn a_later_phase_passes_even_when_the_window_has_moved_below_its_round() {
        // Round 10 was admitted while the window stood higher; a lower round opened since, so the window is
        // [2, 6): the answer for round 10 must still reach the node, or round 10 would never finish.
        let (_window, gate) = window_at(2);
        let held = Held::default();
        assert!(!held.passes(&packet(10, 0), &gate));
        assert!(held.passes(&packet(10, 2), &gate));
        let late = Msg::Envelope(Envelope {
            round: 10,
            late: true,
            ..Default::default()
        });
        assert!(held.passes(&late, &gate));
    }

    #[test]
    fn release_lets_through_every_admitted_packet_but_keeps_other_messages_behind_waiting_ones() {
        let (mut window, gate) = window_at(0);
        let mut held = Held::default();
        for msg in [packet(9, 0), fin(), packet(5, 0), packet(3, 0)] {
            assert!(!held.passes(&msg, &gate) || matches!(msg, Msg::Envelope(ref e) if e.round < 4));
            held.hold(msg);
        }
        assert_eq!(held.first_round(), Some(9));
        window.update(WindowState {
            lowest_open: Some(2),
            ..Default::default()
        });
        // [2, 6): rounds 5 and 3 go although round 9, sent before them, waits; the Fin stays behind round 9.
        assert_eq!(rounds(&held.release(&gate)), vec![(5, 0), (3, 0)]);
        assert_eq!(held.first_round(), Some(9));
        assert!(
            !held.passes(&fin(), &gate),
            "anything else waits behind held packets"
        );
        window.update(WindowState {
            lowest_open: Some(8),
            ..Default::default()
        });
        assert_eq!(rounds(&held.release(&gate)), vec![(9, 0), (u64::MAX, u32::MAX)]);
        assert!(held.is_empty());
        assert_eq!(held.bytes, 0);
    }

    #[test]
    fn the_queue_is_bounded_by_count_and_by_bytes() {
        let mut held = Held::default();
        for round in 0..HELD_PER_CHILD as u64 {
            assert!(held.has_room());
            held.hold(packet(round + 100, 0));
        }
        assert!(!held.has_room());
        assert!(held.pop().is_some());
        assert!(held.has_room());
        let mut big = Held::default();
        big.hold(Msg::Envelope(Envelope {
            payload: vec![0; HELD_BYTES_PER_CHILD].into(),
            ..Default::default()
        }));
        assert!(!big.has_room());
    }

    #[test]
    fn a_held_payload_keeps_none_of_the_buffer_it_was_read_into() {
        // A small payload read with a large message in the same buffer: held, it must not keep that buffer
        // alive, or the bound on held bytes would count 16 bytes while 1 MiB stays allocated.
        let buffer = bytes::Bytes::from(vec![7u8; 1 << 20]);
        let payload = buffer.slice(1000..1016);
        let mut held = Held::default();
        held.hold(Msg::Envelope(Envelope {
            round: 100,
            payload,
            ..Default::default()
        }));
        assert_eq!(held.bytes, 16);
        let Some(Msg::Envelope(env)) = held.pop() else {
            panic!("the held packet is gone");
        };
        assert_eq!(env.payload.as_ref(), &[7u8; 16]);
        let inside = buffer.as_ptr_range();
        assert!(
            !inside.contains(&env.payload.as_ptr()),
            "the held payload still points into the buffer it was read into"
        );
        drop(buffer);
        assert_eq!(env.payload.as_ref(), &[7u8; 16]);
    }
}
