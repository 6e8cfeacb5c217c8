//! The leaf's ranks: every rank, simulated or on the agent's socket, is a rank source that reaches the node as
//! the same [`RankEvent`]s. Before collection starts the leaf holds each rank's dumps (bounded per rank; streams
//! may not be open yet), and releases them in round order, as the window allows, once it starts.

use std::collections::{BTreeMap, HashMap};

use canopy_proto::v1::control;
use tokio::sync::mpsc;

use super::input::RankEvent;
use super::samples::{NodeSampler, NodeSamplesAtLeaf};

/// How a leaf is set up.
#[derive(Debug)]
pub struct LeafOptions {
    /// Where control from the tree goes to reach the ranks (the agent's socket and the simulated ranks).
    pub control: mpsc::Sender<control::Action>,
    /// Dumps held per rank until collection starts; beyond it the oldest are dropped and counted.
    pub hold_dumps: usize,
    /// The most bytes of dumps the leaf holds for all its ranks (a share of the agent's memory budget): held
    /// before the start, where past it the oldest go; and in the rounds open after it, where past it a rank's
    /// dump is refused. Either way the rank-round counts as dropped.
    pub hold_bytes: usize,
    /// The node's samplers, which feed the streams of the `nodes` filter (none: those streams name the node and
    /// its ranks, and measure nothing).
    pub sampler: Option<Box<dyn NodeSampler>>,
}

/// The position of a held event: by round, then by arrival. A rank's detach goes after every held round.
type HeldKey = (u64, u64);

pub(crate) struct Leaf {
    pub(crate) options: LeafOptions,
    /// Collection has started: dumps go to the engine (once the hold is empty and the window allows).
    started: bool,
    held: BTreeMap<HeldKey, RankEvent>,
    /// A drain came before the start: nothing is held any more.
    drained: bool,
    /// Held dumps per rank source.
    held_dumps: HashMap<String, usize>,
    /// The bytes of the held dumps.
    held_bytes: usize,
    /// After the start: the bytes of the dumps fed into each round still open, and their sum.
    open_bytes: BTreeMap<u64, usize>,
    open_total: usize,
    /// Dumps refused for want of room in the open rounds.
    refused: u64,
    seq: u64,
    /// How many attaches announced each application size (a rank that re-attaches counts again; a rank that left
    /// before its first dump takes its one back): the largest with any is what the leaf announces.
    announced: BTreeMap<u32, u64>,
    /// Told to shut down: the leaf leaves once its Fin is sent.
    pub(crate) exit_after_fin: bool,
    /// The node's own samples, the input of its node streams.
    pub(crate) samples: NodeSamplesAtLeaf,
    /// The window of rounds in force (`canopy ctl window`): a rank's dump of a round outside it counts as
    /// stopped, whatever the rank made of the window itself.
    pub(crate) window: Option<(u64, u64)>,
    /// The highest round a rank dumped here (`None`: none yet).
    pub(crate) highest_dumped: Option<u64>,
    /// Streams opened while the ranks dumped, waiting for their first round, and their dumps kept meanwhile.
    pub(crate) waiting: super::first_round::Waiting,
    /// When the leaf's Fin may go once its ranks have finished.
    pub(crate) fin_pace: super::fin_pace::FinPace,
}

/// What the leaf makes of a rank's event.
#[derive(Debug, PartialEq)]
pub(crate) enum Placed {
    /// Apply it now.
    Now(RankEvent),
    /// Held; `dropped` older dumps were dropped to make room (count them).
    Held { dropped: u64 },
}

impl Leaf {
    /// Whether the window of rounds in force leaves `round` out.
    pub(crate) fn outside_window(&self, round: u64) -> bool {
        self.window
            .is_some_and(|(from, to)| !(from..=to).contains(&round))
    }

    /// A leaf of the node `node_id` on `hostname` (its node streams name both).
    pub(crate) fn new(mut options: LeafOptions, node_id: String, hostname: String) -> Self {
        let samples = NodeSamplesAtLeaf::new(options.sampler.take(), node_id, hostname);
        Self {
            options,
            samples,
            started: false,
            held: BTreeMap::new(),
            drained: false,
            held_dumps: HashMap::new(),
            held_bytes: 0,
            open_bytes: BTreeMap::new(),
            open_total: 0,
            refused: 0,
            seq: 0,
            announced: BTreeMap::new(),
            exit_after_fin: false,
            window: None,
            highest_dumped: None,
            waiting: Default::default(),
            fin_pace: Default::default(),
        }
    }

    /// The largest application size the leaf's ranks announced (those that left before their first dump aside).
    pub(crate) fn announced(&self) -> u32 {
        self.announced.keys().next_back().copied().unwrap_or(0)
    }

    pub(crate) fn started(&self) -> bool {
        self.started
    }

    pub(crate) fn start(&mut self) {
        self.started = true;
    }

    /// Whether events are held that the engine has not seen yet.
    pub(crate) fn holds(&self) -> bool {
        !self.held.is_empty()
    }

    /// The lowest round of a held dump: with no round open, the window moves up to it, so a backlog that starts far
    /// ahead (ranks that re-attached to a restarted agent) is not held forever.
    pub(crate) fn lowest_held(&self) -> Option<u64> {
        self.held.keys().map(|(round, _)| *round).find(|r| *r != u64::MAX)
    }

    /// Places one event. What only describes the ranks (names, drop counts) applies now, and so does an attach
    /// before the start (the root counts the ranks to start). Dumps and gaps are held before the start, in round
    /// order, and after it while older ones are still held (a dump after the start was admitted by the window, so
    /// it takes its place by round). A detach before the start waits behind the rank's held rounds; after it,
    /// attaches and detaches apply at once.
    pub(crate) fn place(&mut self, ev: RankEvent) -> Placed {
        match &ev {
            RankEvent::Attached { announced, .. } if *announced > 0 => {
                *self.announced.entry(*announced).or_default() += 1;
            }
            RankEvent::Left { announced, .. } => {
                if let Some(n) = self.announced.get_mut(announced) {
                    *n -= 1;
                    if *n == 0 {
                        self.announced.remove(announced);
                    }
                }
            }
            _ => {}
        }
        let at = match &ev {
            // A rank that left before its first dump has nothing held: it is forgotten at once.
            RankEvent::Names(_) | RankEvent::DumpsDropped(_) | RankEvent::Left { .. } => {
                return Placed::Now(ev);
            }
            _ if (self.started || self.drained) && self.held.is_empty() => return Placed::Now(ev),
            RankEvent::Attached { source, .. } if !self.started => {
                // A rank that vanished before the start and came back is not lost.
                self.held.retain(|_, held| {
                    !matches!(held, RankEvent::Detached { source: s, finished_end: None } if s == source)
                });
                return Placed::Now(ev);
            }
            // After the start an attach or a detach applies at once: a finished rank's later rounds must not
            // wait for it behind held rounds that wait for those very rounds to close.
            RankEvent::Attached { .. } | RankEvent::Detached { .. } if self.started => {
                return Placed::Now(ev);
            }
            RankEvent::Round { round, .. } => *round,
            RankEvent::RoundsDropped { from, .. } => *from,
            RankEvent::Attached { .. } | RankEvent::Detached { .. } => u64::MAX,
        };
        let mut dropped = 0;
        if let RankEvent::Round { source, .. } = &ev {
            let source = source.clone();
            let count = self.held_dumps.entry(source.clone()).or_default();
            *count += 1;
            if *count > self.options.hold_dumps {
                *count -= 1;
                dropped = self.drop_oldest(&source);
            }
        }
        self.held_bytes += dump_bytes(&ev);
        self.seq += 1;
        self.held.insert((at, self.seq), ev);
        // Past the byte bound, the oldest held dumps go, whichever ranks they are from.
        while self.held_bytes > self.options.hold_bytes {
            let oldest = self.held.values().find_map(|ev| match ev {
                RankEvent::Round { source, .. } => Some(source.clone()),
                _ => None,
            });
            let Some(source) = oldest else { break };
            if let Some(n) = self.held_dumps.get_mut(&source) {
                *n = n.saturating_sub(1);
            }
            dropped += self.drop_oldest(&source);
        }
        Placed::Held { dropped }
    }

    /// After the start: whether a dump of `bytes` fits beside the dumps of the rounds open now (`lowest_open` and
    /// above; none open: none), if so it is counted in `round` until that round closes. What was counted for
    /// rounds below `lowest_open` is let go first, whether or not a round took it (a dump no stream took, a
    /// failed stream's rounds), so nothing stays counted once its round is past.
    pub(crate) fn admit_open(&mut self, lowest_open: Option<u64>, round: u64, bytes: usize) -> bool {
        self.rounds_closed_below(lowest_open);
        if bytes > 0 && self.open_total + bytes > self.options.hold_bytes {
            return false;
        }
        *self.open_bytes.entry(round).or_default() += bytes;
        self.open_total += bytes;
        true
    }

    /// Counts a dump refused by [`Leaf::admit_open`]; how many were, in all.
    pub(crate) fn refused_for_memory(&mut self) -> u64 {
        self.refused += 1;
        self.refused
    }

    /// The rounds below `lowest_open` (every round, with `None`) have closed: their dumps are not held any more.
    pub(crate) fn rounds_closed_below(&mut self, lowest_open: Option<u64>) {
        let kept = match lowest_open {
            Some(round) => self.open_bytes.split_off(&round),
            None => BTreeMap::new(),
        };
        let freed: usize = std::mem::replace(&mut self.open_bytes, kept).values().sum();
        self.open_total -= freed;
    }

    /// Drops a rank's oldest held dump; its round still stops waiting for the rank, which counts as dropped there.
    fn drop_oldest(&mut self, source: &str) -> u64 {
        let oldest = self.held.iter().find_map(|(key, ev)| match ev {
            RankEvent::Round { source: s, round, .. } if s == source => Some((*key, *round)),
            _ => None,
        });
        let Some((key, round)) = oldest else { return 0 };
        if let Some(ev) = self.held.remove(&key) {
            self.held_bytes -= dump_bytes(&ev);
        }
        tracing::warn!(
            hold_dumps = self.options.hold_dumps,
            hold_bytes = self.options.hold_bytes,
            round,
            "{source}: its oldest held dump is dropped (held_dumps for one rank, or the agent's share of \
             memory_budget_mb for all, is reached)"
        );
        // Dropped rounds next to each other make one span (the engine remembers a bounded number of spans).
        let adjacent = self.held.values_mut().find_map(|ev| match ev {
            RankEvent::RoundsDropped { source: s, end, .. } if s == source && *end == round => Some(end),
            _ => None,
        });
        match adjacent {
            Some(end) => *end = round + 1,
            None => {
                self.held.insert(
                    key,
                    RankEvent::RoundsDropped {
                        source: source.to_string(),
                        from: round,
                        end: round + 1,
                    },
                );
            }
        }
        1
    }

    /// Once started (or drained): the held events of rounds below `limit`, in round order (attaches and detaches
    /// once every round before them is out).
    pub(crate) fn release(&mut self, limit: u64) -> Vec<RankEvent> {
        let mut out = Vec::new();
        if !self.started && !self.drained {
            return out;
        }
        while let Some(entry) = self.held.first_entry() {
            let (round, _) = *entry.key();
            if round >= limit && round != u64::MAX {
                return out;
            }
            let ev = entry.remove();
            self.held_bytes -= dump_bytes(&ev);
            if let RankEvent::Round { source, .. } = &ev
                && let Some(n) = self.held_dumps.get_mut(source)
            {
                *n = n.saturating_sub(1);
            }
            out.push(ev);
        }
        out
    }

    /// A drain before the start: collection will not start, so the held dumps are dropped (the count is
    /// returned) and the detaches are released at once, so the leaf can finish; what comes after applies at once.
    pub(crate) fn drain(&mut self) -> u64 {
        if self.started || self.drained {
            return 0;
        }
        self.drained = true;
        let mut dropped = 0;
        self.held.retain(|_, ev| match ev {
            RankEvent::Round { .. } => {
                dropped += 1;
                false
            }
            RankEvent::Detached { .. } => true,
            _ => false,
        });
        self.held_dumps.clear();
        self.held_bytes = 0;
        if dropped > 0 {
            tracing::warn!(
                dumps = dropped,
                "drained before collection started: the held dumps are dropped"
            );
        }
        dropped
    }
}

/// The bytes of a rank's profile an event holds.
fn dump_bytes(ev: &RankEvent) -> usize {
    match ev {
        RankEvent::Round {
            profile: Ok(bytes), ..
        } => bytes.len(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::v1::MissingReason;

    fn leaf(hold: usize) -> Leaf {
        let (tx, _rx) = mpsc::channel(1);
        Leaf::new(
            LeafOptions {
                control: tx,
                hold_dumps: hold,
                hold_bytes: usize::MAX,
                sampler: None,
            },
            "agent".into(),
            "host".into(),
        )
    }

    fn dump(source: &str, round: u64) -> RankEvent {
        RankEvent::Round {
            source: source.into(),
            rank: 0,
            round,
            dump_unix_ns: 0,
            profile: Err(MissingReason::SampledOut),
        }
    }

    fn rounds(evs: &[RankEvent]) -> Vec<(String, u64)> {
        evs.iter()
            .map(|e| match e {
                RankEvent::Round { source, round, .. } => (source.clone(), *round),
                RankEvent::RoundsDropped { source, from, .. } => (format!("drop {source}"), *from),
                RankEvent::Detached { source, .. } => (format!("detach {source}"), u64::MAX),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    #[test]
    fn held_dumps_come_out_round_by_round_and_a_detach_after_them() {
        let mut l = leaf(10);
        for r in 0..3 {
            assert_eq!(l.place(dump("a", r)), Placed::Held { dropped: 0 });
        }
        l.place(RankEvent::Detached {
            source: "a".into(),
            finished_end: Some(3),
        });
        for r in 0..3 {
            l.place(dump("b", r));
        }
        assert!(l.release(100).is_empty(), "nothing leaves before the start");
        l.start();
        let first = l.release(2);
        assert_eq!(
            rounds(&first),
            vec![("a".into(), 0), ("b".into(), 0), ("a".into(), 1), ("b".into(), 1)]
        );
        // A dump after the start (admitted by the window) takes its place by round among those still held.
        assert_eq!(l.place(dump("b", 3)), Placed::Held { dropped: 0 });
        let rest = l.release(10);
        assert_eq!(
            rounds(&rest),
            vec![
                ("a".into(), 2),
                ("b".into(), 2),
                ("b".into(), 3),
                ("detach a".into(), u64::MAX)
            ]
        );
        assert!(!l.holds());
        assert!(matches!(l.place(dump("b", 4)), Placed::Now(_)));
    }

    fn dump_of(source: &str, round: u64, bytes: usize) -> RankEvent {
        RankEvent::Round {
            source: source.into(),
            rank: 0,
            round,
            dump_unix_ns: 0,
            profile: Ok(bytes::Bytes::from(vec![0; bytes])),
        }
    }

    #[test]
    fn past_the_byte_bound_the_oldest_held_dumps_of_any_rank_become_dropped_rounds() {
        let mut l = leaf(100);
        l.options.hold_bytes = 1000;
        for r in 0..2 {
            assert_eq!(l.place(dump_of("a", r, 300)), Placed::Held { dropped: 0 });
            assert_eq!(
                l.place(dump_of("b", r, 300)),
                Placed::Held {
                    dropped: u64::from(r == 1)
                }
            );
        }
        // 1,200 bytes came, 900 stay: a's round 0 went first.
        assert_eq!(l.held_bytes, 900);
        assert_eq!(l.place(dump_of("c", 2, 1000)), Placed::Held { dropped: 3 });
        assert_eq!(l.held_bytes, 1000);
        l.start();
        let out = l.release(100);
        assert_eq!(
            rounds(&out),
            vec![("drop a".into(), 0), ("drop b".into(), 0), ("c".into(), 2)]
        );
        assert!(
            out[..2]
                .iter()
                .all(|ev| matches!(ev, RankEvent::RoundsDropped { from: 0, end: 2, .. })),
            "{out:?}"
        );
        assert_eq!(l.held_bytes, 0);
        // After the start the rounds open hold as much; a dump past it is refused until a round closes.
        assert!(l.admit_open(Some(3), 3, 600));
        assert!(l.admit_open(Some(3), 4, 400));
        assert!(!l.admit_open(Some(3), 4, 1));
        assert!(l.admit_open(Some(3), 4, 0), "an empty dump takes no room");
        // Round 3 closed: its bytes are free.
        assert!(l.admit_open(Some(4), 5, 600));
        assert!(!l.admit_open(Some(4), 5, 1));
        l.rounds_closed_below(None);
        assert!(l.admit_open(Some(6), 6, 1000));
        // A dump counted for a round that never opened (no stream took it) is let go once no round is open.
        assert!(!l.admit_open(Some(6), 7, 1));
        assert!(l.admit_open(None, 8, 1000));
    }

    #[test]
    fn past_the_hold_limit_the_oldest_dump_becomes_a_dropped_round() {
        let mut l = leaf(2);
        l.place(dump("a", 0));
        l.place(dump("a", 1));
        assert_eq!(l.place(dump("a", 2)), Placed::Held { dropped: 1 });
        assert_eq!(l.place(dump("a", 3)), Placed::Held { dropped: 1 });
        l.start();
        let out = l.release(100);
        assert_eq!(
            rounds(&out),
            vec![("drop a".into(), 0), ("a".into(), 2), ("a".into(), 3)]
        );
        assert!(
            matches!(&out[0], RankEvent::RoundsDropped { from: 0, end: 2, .. }),
            "adjacent drops make one span: {:?}",
            out[0]
        );
    }

    #[test]
    fn a_rank_that_comes_back_before_the_start_is_not_lost() {
        let mut l = leaf(10);
        l.place(dump("a", 0));
        l.place(RankEvent::Detached {
            source: "a".into(),
            finished_end: None,
        });
        let back = RankEvent::Attached {
            source: "a".into(),
            from: 1,
            announced: 4,
        };
        assert!(matches!(l.place(back), Placed::Now(_)));
        assert_eq!(l.announced(), 4);
        l.start();
        assert_eq!(rounds(&l.release(100)), vec![("a".into(), 0)]);
    }

    #[test]
    fn a_rank_that_left_before_its_first_dump_takes_back_its_announced_size() {
        let mut l = leaf(10);
        let attach = |source: &str, announced| RankEvent::Attached {
            source: source.into(),
            from: 0,
            announced,
        };
        l.place(attach("real", 8));
        l.place(attach("forged", 1 << 20));
        assert_eq!(l.announced(), 1 << 20);
        let left = RankEvent::Left {
            source: "forged".into(),
            announced: 1 << 20,
        };
        assert!(matches!(l.place(left), Placed::Now(RankEvent::Left { .. })));
        assert_eq!(l.announced(), 8, "the forged size no longer holds the start");
    }
}
