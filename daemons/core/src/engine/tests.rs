//! The engine's rules, and a property test that coverage stays exact whatever the sources do.

use super::*;

fn full(n: u32) -> Coverage {
    Coverage {
        covered: n,
        expected: n,
        missing: vec![],
        apps: vec![],
        unreachable: vec![],
    }
}

fn arrival(src: &str, n: u32) -> Arrival {
    Arrival {
        source: src.into(),
        coverage: full(n),
        payload: Default::default(),
        first_dump_unix_ns: 0,
    }
}

fn engine(sources: &[(&str, u32)], mode: SyncMode) -> RoundEngine {
    let mut e = RoundEngine::new();
    for (s, n) in sources {
        e.add_source(s, *n);
    }
    e.open_stream(
        1,
        StreamSync {
            mode,
            timeout: Duration::from_millis(100),
        },
    );
    e
}

const K: GroupKey = GroupKey {
    stream: 1,
    round: 0,
    phase: 0,
};

#[test]
fn wait_for_all_closes_when_every_live_source_delivered() {
    let mut e = engine(&[("a", 16), ("b", 16)], SyncMode::WaitForAll);
    let now = Instant::now();
    assert!(matches!(
        e.accept(K, arrival("a", 16), now).unwrap(),
        Accepted::Pending
    ));
    let Accepted::Closed(c) = e.accept(K, arrival("b", 16), now).unwrap() else {
        panic!("not closed")
    };
    assert_eq!(c.coverage, full(32));
    assert!(!c.partial);
    assert!(!e.has_open_groups());
}

#[test]
fn the_rounds_a_source_delivered_are_known_closed_or_open_as_spans() {
    let mut e = engine(&[("a", 16), ("b", 16)], SyncMode::WaitForAll);
    let now = Instant::now();
    let key = |round| GroupKey { round, ..K };
    for round in [0, 1, 2, 4, 5] {
        e.accept(key(round), arrival("a", 16), now).unwrap();
    }
    for round in [0, 1, 3] {
        e.accept(key(round), arrival("b", 16), now).unwrap();
    }
    // Rounds 0 and 1 closed with both; 2, 4 and 5 are open with a only; 3 open with b only.
    assert_eq!(e.delivered_by("a", 1), [(0, 3), (4, 6)]);
    assert_eq!(e.delivered_by("b", 1), [(0, 2), (3, 4)]);
    assert!(e.delivered_by("a", 2).is_empty(), "another stream");
    assert!(e.groups_rounds(1));
    let mut d = engine(&[("a", 16)], SyncMode::DontWait);
    d.accept(K, arrival("a", 16), now).unwrap();
    assert!(
        !d.groups_rounds(1),
        "a stream that does not wait has no rounds to tell"
    );
}

#[test]
fn a_source_that_comes_back_after_its_nodes_were_adopted_answers_for_the_rest_from_its_return() {
    let mut e = engine(&[("relay", 40), ("agent-a", 0)], SyncMode::WaitForAll);
    // 32 of the relay's ranks were adopted by agent-a's side while the relay was still thought live.
    e.add_source("agent-a", 32);
    e.ranks_moved_away("relay", 32);
    assert_eq!(e.ranks_expected(), 40);
    // The relay still counts them until it hears: the same count again changes nothing.
    assert!(!e.set_ranks_below("relay", 40));
    assert_eq!(e.ranks_below("relay"), Some(8));
    e.set_source_state("relay", SourceState::Lost);
    // It comes back with its old count: the adopted ranks stay off, and what it held from before is stale.
    assert_eq!(e.rejoin_source("relay", 40, 7), 32);
    assert_eq!(e.ranks_below("relay"), Some(8));
    assert!(e.is_stale("relay", 6));
    assert!(!e.is_stale("relay", 7));
    assert!(!e.is_stale("agent-a", 0));
    // Then it hears, and reports the ranks it has: nothing more comes off.
    assert!(!e.set_ranks_below("relay", 8));
    assert_eq!(e.ranks_below("relay"), Some(8));
    // A child that grows later still counts.
    e.set_ranks_below("relay", 12);
    assert_eq!(e.ranks_expected(), 44);
    // A relay that heard its children leave before it came back reports none of them: still, what it held
    // from before is stale, as the adopted nodes sent those rounds again.
    let mut g = engine(&[("relay", 32), ("agent-a", 0)], SyncMode::WaitForAll);
    g.add_source("agent-a", 32);
    g.ranks_moved_away("relay", 32);
    g.set_source_state("relay", SourceState::Lost);
    assert_eq!(g.rejoin_source("relay", 0, 11), 32);
    assert_eq!(g.ranks_below("relay"), Some(0));
    assert!(g.is_stale("relay", 10));
    assert!(!g.is_stale("relay", 11));
    assert!(!g.set_ranks_below("relay", 0));
    assert_eq!(g.ranks_expected(), 32);
    // A lost source none of whose nodes moved comes back as before.
    let mut f = engine(&[("relay", 16)], SyncMode::WaitForAll);
    f.set_source_state("relay", SourceState::Lost);
    assert_eq!(f.rejoin_source("relay", 16, 3), 0);
    assert!(!f.is_stale("relay", 0));
}

#[test]
fn a_child_whose_link_ended_is_unreachable_and_named_until_the_hold_then_lost() {
    let mut e = engine(&[("relay0", 16), ("relay1", 16)], SyncMode::WaitForAll);
    let t0 = Instant::now();
    e.accept(K, arrival("relay1", 16), t0).unwrap();
    let closed = e.set_source_state("relay0", SourceState::Unreachable { since: t0 });
    let [c] = closed.as_slice() else {
        panic!("round 0 closes once relay0 is cut off: {closed:?}")
    };
    assert!(c.coverage.is_exact());
    assert_eq!(c.coverage.missing_for(MissingReason::Unreachable), 16);
    assert_eq!(c.coverage.missing_for(MissingReason::Lost), 0);
    let named: Vec<(&str, u32)> = c
        .coverage
        .unreachable
        .iter()
        .map(|u| (u.node.as_str(), u.ranks))
        .collect();
    assert_eq!(named, [("relay0", 16)]);
    // Within the hold it stays unreachable; past it, its ranks count as lost and it is not named.
    assert_eq!(e.next_give_up(), Some(t0 + UNREACHABLE_HOLD));
    assert!(
        e.give_up_unreachable(t0 + UNREACHABLE_HOLD - Duration::from_secs(1))
            .is_empty()
    );
    assert_eq!(e.give_up_unreachable(t0 + UNREACHABLE_HOLD), ["relay0"]);
    assert_eq!(e.next_give_up(), None);
    let next = GroupKey { round: 1, ..K };
    let Accepted::Closed(c) = e.accept(next, arrival("relay1", 16), t0).unwrap() else {
        panic!("round 1 waits for relay1 alone")
    };
    assert_eq!(c.coverage.missing_for(MissingReason::Lost), 16);
    assert!(c.coverage.unreachable.is_empty());
    // Back within the hold, a child is expected again as it was.
    let mut f = engine(&[("relay0", 8)], SyncMode::WaitForAll);
    f.set_source_state("relay0", SourceState::Unreachable { since: t0 });
    assert_eq!(f.rejoin_source("relay0", 8, 3), 0);
    assert_eq!(f.source_state("relay0"), Some(SourceState::Live));
}

/// `n` ranks covered, split among applications as `apps` says.
fn of_apps(apps: &[(&str, u32)]) -> Coverage {
    let mut c = Coverage::default();
    for (app, n) in apps {
        for _ in 0..*n {
            c.add(&Coverage::full(app));
        }
    }
    c
}

#[test]
fn a_lost_sources_ranks_count_in_the_applications_its_last_packet_named() {
    let mut e = engine(
        &[("relay-a", 4), ("relay-b", 2), ("relay-c", 1)],
        SyncMode::WaitForAll,
    );
    let now = Instant::now();
    let from = |src: &str, apps: &[(&str, u32)]| Arrival {
        source: src.into(),
        coverage: of_apps(apps),
        payload: Default::default(),
        first_dump_unix_ns: 0,
    };
    e.accept(K, from("relay-a", &[("sim", 3), ("analysis", 1)]), now)
        .unwrap();
    e.accept(K, from("relay-b", &[("analysis", 2)]), now).unwrap();
    // relay-c never delivers: its application is not known.
    let closed = e.set_source_state("relay-c", SourceState::Lost);
    assert_eq!(closed.len(), 1);
    let next = GroupKey { round: 1, ..K };
    e.accept(next, from("relay-a", &[("sim", 3), ("analysis", 1)]), now)
        .unwrap();
    let closed = e.set_source_state("relay-b", SourceState::Lost);
    let [c] = closed.as_slice() else {
        panic!("round 1 closes once relay-b is lost: {closed:?}")
    };
    let cov = &c.coverage;
    assert!(cov.is_exact());
    assert_eq!(
        (cov.covered, cov.expected, cov.missing_for(MissingReason::Lost)),
        (4, 7, 3)
    );
    let apps: Vec<(&str, u32, u32)> = cov
        .apps
        .iter()
        .map(|a| (a.app.as_str(), a.covered, a.expected))
        .collect();
    // relay-b's two analysis ranks count lost in analysis; relay-c's rank in the whole only.
    assert_eq!(apps, [("analysis", 1, 3), ("sim", 3, 3)]);
    assert_eq!(cov.check_child(7), Ok(()));
}

#[test]
fn a_source_that_answers_for_no_ranks_is_not_waited_for_until_it_has_some() {
    let mut e = engine(&[("relay-a", 16), ("relay-b", 0)], SyncMode::WaitForAll);
    let now = Instant::now();
    assert_eq!(e.live_sources(), 1, "nothing to deliver or finish under relay-b");
    let Accepted::Closed(c) = e.accept(K, arrival("relay-a", 16), now).unwrap() else {
        panic!("round 0 waited for a source with no ranks")
    };
    assert_eq!(c.coverage, full(16));
    // Children attach below relay-b: from now on it is waited for.
    e.set_ranks_below("relay-b", 8);
    assert_eq!(e.live_sources(), 2);
    let k1 = GroupKey { round: 1, ..K };
    assert!(matches!(
        e.accept(k1, arrival("relay-a", 16), now).unwrap(),
        Accepted::Pending
    ));
    assert!(matches!(
        e.accept(k1, arrival("relay-b", 8), now).unwrap(),
        Accepted::Closed(_)
    ));
}

#[test]
fn the_lowest_unclosed_round_is_below_any_gap_whatever_order_rounds_closed_in() {
    let mut e = engine(&[("a", 1)], SyncMode::WaitForAll);
    let now = Instant::now();
    assert_eq!(e.lowest_unclosed_round(), Some(0));
    for round in [0, 1, 3, 4] {
        e.accept(GroupKey { round, ..K }, arrival("a", 1), now).unwrap();
    }
    // Round 2 never opened here: nothing above it is released.
    assert_eq!(e.lowest_unclosed_round(), Some(2));
    e.accept(GroupKey { round: 2, ..K }, arrival("a", 1), now)
        .unwrap();
    assert_eq!(e.lowest_unclosed_round(), Some(5));
    let mut d = engine(&[("a", 1)], SyncMode::DontWait);
    d.accept(K, arrival("a", 1), now).unwrap();
    assert_eq!(
        d.lowest_unclosed_round(),
        None,
        "a stream that does not wait has no rounds to close"
    );
}

/// The lowest round not closed, kept as rounds close, against the rounds closed counted one by one: any order,
/// gaps, and past the rounds remembered exactly (where the horizon moves up under it).
#[test]
fn closed_rounds_know_their_lowest_gap_in_any_order_and_past_the_memory() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for _ in 0..20 {
        let total = 1 + next(2 * CLOSED_MEMORY as u64);
        let mut rounds: Vec<u64> = (0..total).filter(|_| next(50) != 0).collect();
        for i in (1..rounds.len()).rev() {
            let j = next(i as u64 + 1) as usize;
            // Mostly in order, as rounds close, with some shuffling.
            if i - j < 64 {
                rounds.swap(i, j);
            }
        }
        let mut closed = ClosedRounds::default();
        for (n, &r) in rounds.iter().enumerate() {
            closed.insert(r);
            if n % 97 == 0 || n + 1 == rounds.len() {
                let mut gap = closed.horizon;
                while closed.contains(gap) {
                    gap += 1;
                }
                assert_eq!(
                    closed.contiguous,
                    gap,
                    "after {} of {} rounds",
                    n + 1,
                    rounds.len()
                );
            }
        }
    }
}

#[test]
fn dropped_rounds_do_not_wait_for_the_rank_and_count_it_dropped() {
    let mut e = engine(&[("a", 1), ("b", 1), ("c", 1)], SyncMode::WaitForAll);
    let now = Instant::now();
    let at = |round| GroupKey { round, ..K };
    // Round 3 is open, waiting for b; b then reports that it dropped rounds 3 to 5.
    e.accept(at(3), arrival("a", 1), now).unwrap();
    e.accept(at(3), arrival("c", 1), now).unwrap();
    let closed = e.drop_rounds("b", 3, 6);
    assert_eq!(closed.len(), 1, "round 3 closes at once");
    let c = &closed[0];
    assert_eq!((c.key.round, c.coverage.covered, c.coverage.expected), (3, 2, 3));
    assert_eq!(c.coverage.missing_for(MissingReason::Dropped), 1);
    assert!(c.coverage.is_exact());
    assert!(!c.partial, "nothing was late");
    // Round 4 opens later and does not wait for b either.
    e.accept(at(4), arrival("a", 1), now).unwrap();
    let Accepted::Closed(c) = e.accept(at(4), arrival("c", 1), now).unwrap() else {
        panic!("round 4 waited for a dropped rank")
    };
    assert_eq!(c.coverage.missing_for(MissingReason::Dropped), 1);
    // Round 6, after the span, waits for b again.
    e.accept(at(6), arrival("a", 1), now).unwrap();
    assert!(matches!(
        e.accept(at(6), arrival("c", 1), now).unwrap(),
        Accepted::Pending
    ));
    // A span of a source that then finishes still counts as dropped, not as late.
    e.drop_rounds("b", 6, 7);
    assert!(!e.has_open_groups());
    let closed = e.set_source_state("b", SourceState::Finished { end: 7 });
    assert!(closed.is_empty());
}

#[test]
fn time_out_closes_partial_with_late_ranks_and_a_late_packet_is_returned() {
    let mut e = engine(&[("a", 16), ("b", 16)], SyncMode::WaitForAll);
    let now = Instant::now();
    e.accept(K, arrival("a", 16), now).unwrap();
    assert!(e.expire(now + Duration::from_millis(50)).is_empty());
    let closed = e.expire(now + Duration::from_millis(100));
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].coverage.covered, 16);
    assert_eq!(closed[0].coverage.missing_for(MissingReason::Late), 16);
    assert!(closed[0].partial);
    assert!(matches!(
        e.accept(K, arrival("b", 16), now).unwrap(),
        Accepted::Late(_)
    ));
    assert_eq!(e.stats().late_ranks, 16);
}

/// b is silent while a delivers rounds 0 to 3, which close at their time-out with b's ranks late; b sends round 1
/// late, then finishes with its rounds ending at 1. Rounds 2 and 3 never had b's ranks: they are recounted as
/// stopped, once; round 0 (b's rounds include it) and round 1 (b's data came late) are left as they are.
#[test]
fn a_source_that_finishes_before_rounds_that_counted_it_late_is_recounted_stopped_there() {
    let mut e = engine(&[("a", 4), ("b", 16)], SyncMode::WaitForAll);
    let b_apps = vec![("lulesh".to_string(), 12), ("amg".to_string(), 4)];
    e.set_composition("b", b_apps.clone());
    let t0 = Instant::now();
    let at = |round| GroupKey { round, ..K };
    for round in 0..4 {
        e.accept(at(round), arrival("a", 4), t0).unwrap();
    }
    let closed = e.expire(t0 + Duration::from_millis(100));
    assert_eq!(closed.len(), 4);
    assert!(
        closed
            .iter()
            .all(|c| c.coverage.missing_for(MissingReason::Late) == 16)
    );
    assert!(matches!(
        e.accept(at(1), arrival("b", 16), t0).unwrap(),
        Accepted::Late(_)
    ));
    e.set_source_state("b", SourceState::Finished { end: 1 });
    let recounts = e.finished_before("b", 1);
    let rounds: Vec<(u64, MissingReason, u32)> =
        recounts.iter().map(|r| (r.round, r.counted, r.ranks)).collect();
    assert_eq!(
        rounds,
        [(2, MissingReason::Late, 16), (3, MissingReason::Late, 16)]
    );
    assert!(
        recounts
            .iter()
            .all(|r| r.stream == 1 && r.source == "b" && r.apps == b_apps),
        "{recounts:?}"
    );
    assert!(
        e.finished_before("b", 1).is_empty(),
        "each round is recounted once"
    );
    assert!(e.finished_before("a", 0).is_empty(), "a was in every round");
}

#[test]
fn a_source_behind_but_delivering_is_waited_for_past_the_time_out() {
    let mut e = engine(&[("a", 1), ("b", 1)], SyncMode::WaitForAll);
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let at = |round| GroupKey { round, ..K };
    // a runs ahead; b is behind, delivering older rounds every 60 ms.
    for round in 0..4 {
        e.accept(at(round), arrival("a", 1), t0).unwrap();
    }
    for round in 0..3 {
        let now = t0 + ms(60 * (round + 1));
        let Accepted::Closed(c) = e.accept(at(round), arrival("b", 1), now).unwrap() else {
            panic!("round {round} did not close when b delivered it");
        };
        assert!(!c.partial, "round {round}");
        assert!(e.expire(now).is_empty(), "b was heard just now: round 3 waits");
    }
    // b falls silent after round 2 (heard last at 180 ms): round 3 closes a time-out later, without it.
    assert!(e.expire(t0 + ms(279)).is_empty());
    let closed = e.expire(t0 + ms(280));
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].key.round, 3);
    assert_eq!(closed[0].coverage.missing_for(MissingReason::Late), 1);
    assert!(closed[0].partial);
}

#[test]
fn a_source_that_delivered_is_not_what_a_group_waits_on() {
    // a is heard all the time, but the round has a's packet; b, which it lacks, was never heard.
    let mut e = engine(&[("a", 1), ("b", 1)], SyncMode::WaitForAll);
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    e.accept(K, arrival("a", 1), t0).unwrap();
    e.accept(GroupKey { round: 1, ..K }, arrival("a", 1), t0 + ms(90))
        .unwrap();
    let closed = e.expire(t0 + ms(100));
    assert_eq!(closed.len(), 1, "round 0 waits on b alone, silent all along");
    assert_eq!(closed[0].key.round, 0);
    assert_eq!(e.next_deadline(), Some(t0 + ms(190)));
}
#[test]
fn a_restarted_source_that_answers_for_fewer_ranks_counts_the_others_lost() {
    let mut e = engine(&[("relay", 16), ("b", 4)], SyncMode::WaitForAll);
    // The relay comes back knowing only one of its two agents.
    e.add_source("relay", 8);
    e.set_ranks_below("relay", 8);
    assert_eq!(e.ranks_expected(), 20);
    let now = Instant::now();
    e.accept(K, arrival("b", 4), now).unwrap();
    let Accepted::Closed(c) = e.accept(K, arrival("relay", 8), now).unwrap() else {
        panic!("not closed")
    };
    assert_eq!((c.coverage.covered, c.coverage.expected), (12, 20));
    assert_eq!(c.coverage.missing_for(MissingReason::Lost), 8);
    assert!(c.coverage.is_exact());
}

#[test]
fn a_source_forgotten_before_its_first_packet_counts_lost_in_the_open_rounds_only() {
    let mut e = engine(&[("a", 1), ("b", 1)], SyncMode::WaitForAll);
    for i in 0..1000 {
        e.add_source(&format!("forged{i}"), 1);
        e.set_source_state(&format!("forged{i}"), SourceState::Lost);
    }
    let now = Instant::now();
    e.accept(K, arrival("a", 1), now).unwrap();
    // Round 0 is open when the forged ranks leave: it was opened expecting them, so it counts them lost.
    for i in 0..1000 {
        assert!(e.forget_source(&format!("forged{i}")).is_empty());
    }
    assert_eq!(e.ranks_expected(), 2);
    let Accepted::Closed(c) = e.accept(K, arrival("b", 1), now).unwrap() else {
        panic!("not closed")
    };
    assert_eq!((c.coverage.covered, c.coverage.expected), (2, 1002));
    assert_eq!(c.coverage.missing_for(MissingReason::Lost), 1000);
    assert!(c.coverage.is_exact());
    // Every later round expects the two real ranks only.
    let k1 = GroupKey { round: 1, ..K };
    e.accept(k1, arrival("a", 1), now).unwrap();
    let Accepted::Closed(c) = e.accept(k1, arrival("b", 1), now).unwrap() else {
        panic!("not closed")
    };
    assert_eq!(c.coverage, full(2));
}

#[test]
fn a_forgotten_live_source_no_longer_holds_the_round_it_was_waited_for_in() {
    let mut e = engine(&[("a", 1), ("silent", 1)], SyncMode::WaitForAll);
    let now = Instant::now();
    assert!(matches!(
        e.accept(K, arrival("a", 1), now).unwrap(),
        Accepted::Pending
    ));
    let closed = e.forget_source("silent");
    assert_eq!(closed.len(), 1, "round 0 waited only for the rank that left");
    assert_eq!((closed[0].coverage.covered, closed[0].coverage.expected), (1, 2));
    assert_eq!(closed[0].coverage.missing_for(MissingReason::Lost), 1);
    assert!(!closed[0].partial);
}

#[test]
fn a_child_reporting_fewer_ranks_than_it_last_did_answers_for_as_many_fewer() {
    let mut e = engine(&[("relay", 16), ("b", 4)], SyncMode::WaitForAll);
    e.set_ranks_below("relay", 1016);
    assert_eq!(e.ranks_expected(), 1020);
    // 1000 ranks below the relay left before their first dump.
    assert!(e.set_ranks_below("relay", 16));
    assert_eq!(e.ranks_expected(), 20);
    // A packet of a round that opened before they left still counts them: within what the relay ever had.
    assert_eq!(e.ranks_ceiling("relay"), Some(1016));
    // A restarted relay that knows 8 of its 16 ranks still answers for 16; when one of its 8 leaves before its
    // first dump it answers for 15, and the 7 still missing count as lost.
    e.add_source("relay", 8);
    assert_eq!(e.ranks_expected(), 20);
    assert!(e.set_ranks_below("relay", 7));
    assert_eq!(e.ranks_expected(), 19);
    assert!(!e.set_ranks_below("relay", 15), "growth is not a shrink");
    assert_eq!(e.ranks_below("relay"), Some(15));
}

#[test]
fn a_lost_source_is_not_waited_for_and_its_ranks_count_as_lost() {
    let mut e = engine(&[("a", 16), ("b", 16)], SyncMode::WaitForAll);
    let now = Instant::now();
    e.accept(K, arrival("a", 16), now).unwrap();
    let closed = e.set_source_state("b", SourceState::Lost);
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].coverage.missing_for(MissingReason::Lost), 16);
    assert_eq!(closed[0].coverage.expected, 32);
    let next = GroupKey { round: 1, ..K };
    let Accepted::Closed(c) = e.accept(next, arrival("a", 16), now).unwrap() else {
        panic!()
    };
    assert_eq!((c.coverage.covered, c.coverage.expected), (16, 32));
}

#[test]
fn duplicate_and_unknown_packets_are_errors() {
    let mut e = engine(&[("a", 1), ("b", 1)], SyncMode::WaitForAll);
    let now = Instant::now();
    e.accept(K, arrival("a", 1), now).unwrap();
    assert!(matches!(
        e.accept(K, arrival("a", 1), now),
        Err(EngineError::Duplicate { .. })
    ));
    assert_eq!(
        e.accept(K, arrival("z", 1), now).unwrap_err(),
        EngineError::UnknownSource("z".into())
    );
    let other = GroupKey { stream: 9, ..K };
    assert_eq!(
        e.accept(other, arrival("a", 1), now).unwrap_err(),
        EngineError::UnknownStream(9)
    );
}

#[test]
fn dont_wait_passes_each_packet_at_once() {
    let mut e = engine(&[("a", 4), ("b", 4)], SyncMode::DontWait);
    let now = Instant::now();
    let Accepted::Closed(c) = e
        .accept(GroupKey { round: 9, ..K }, arrival("a", 4), now)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!((c.coverage.covered, c.coverage.expected), (4, 8));
    assert_eq!(c.coverage.missing_for(MissingReason::NotWaited), 4);
    assert!(matches!(
        e.accept(K, arrival("a", 4), now).unwrap(),
        Accepted::Closed(_)
    ));
    assert!(matches!(
        e.accept(K, arrival("b", 4), now).unwrap(),
        Accepted::Closed(_)
    ));
    assert!(!e.has_open_groups());
}

#[test]
fn later_phases_wait_only_for_the_sources_of_phase_0() {
    let mut e = engine(&[("a", 4), ("b", 4), ("c", 4)], SyncMode::WaitForAll);
    let now = Instant::now();
    e.accept(K, arrival("a", 4), now).unwrap();
    e.accept(K, arrival("b", 4), now).unwrap();
    // c misses phase 0: the round closes by time-out without it.
    let closed = e.expire(now + Duration::from_millis(100));
    assert_eq!(closed[0].coverage.missing_for(MissingReason::Late), 4);
    assert_eq!(e.participants(1, 0).unwrap().len(), 2);
    // Phase 2 closes as soon as a and b deliver; c's phase 2 is late, not merged.
    let p2 = GroupKey { phase: 2, ..K };
    assert!(matches!(
        e.accept(p2, arrival("c", 4), now).unwrap(),
        Accepted::Late(_)
    ));
    assert!(matches!(
        e.accept(p2, arrival("a", 4), now).unwrap(),
        Accepted::Pending
    ));
    let Accepted::Closed(c) = e.accept(p2, arrival("b", 4), now).unwrap() else {
        panic!("not closed")
    };
    assert_eq!((c.coverage.covered, c.coverage.expected), (8, 12));
    assert_eq!(c.coverage.missing_for(MissingReason::Late), 4);
    // A participant lost between the phases is not waited for.
    let p2r1 = GroupKey {
        phase: 0,
        round: 1,
        ..K
    };
    for s in ["a", "b", "c"] {
        e.accept(p2r1, arrival(s, 4), now).unwrap();
    }
    let p2r1 = GroupKey { phase: 2, ..p2r1 };
    e.accept(p2r1, arrival("a", 4), now).unwrap();
    e.set_source_state("c", SourceState::Lost);
    let Accepted::Closed(c) = e.accept(p2r1, arrival("b", 4), now).unwrap() else {
        panic!("not closed")
    };
    assert_eq!(c.coverage.missing_for(MissingReason::Lost), 4);
}

#[test]
fn a_later_phase_cannot_open_a_round() {
    let mut e = engine(&[("a", 4)], SyncMode::WaitForAll);
    let now = Instant::now();
    let p2 = GroupKey { phase: 2, ..K };
    let err = e.accept(p2, arrival("a", 4), now).unwrap_err();
    assert_eq!(
        err.to_string(),
        "source a sent phase 2 of round 0 of stream 1, but the round's phase 0 did not close here: a later phase \
         answers a packet this node sent down"
    );
    assert!(!e.has_open_groups(), "nothing waits on a round nobody opened");
    // Once phase 0 has closed, the same packet is the round's answer.
    assert!(matches!(
        e.accept(K, arrival("a", 4), now).unwrap(),
        Accepted::Closed(_)
    ));
    assert!(matches!(
        e.accept(p2, arrival("a", 4), now).unwrap(),
        Accepted::Closed(_)
    ));
}

#[test]
fn uncover_moves_ranks_to_a_reason() {
    let mut c = full(10);
    let part = Coverage {
        covered: 4,
        expected: 4,
        ..Default::default()
    };
    c.uncover_input(MissingReason::Malformed, &part);
    assert_eq!(c.covered, 6);
    assert_eq!(c.missing_for(MissingReason::Malformed), 4);
    assert!(c.is_exact());
}

mod props {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Fate {
        OnTime,
        Late,
        Lost,
        /// Finished after round `end - 1`: still waited for (and late, as it sends nothing) below `end`.
        Finished(u64),
        /// Stopped by collection control from round `end`: as finished, but counted stopped, not finished.
        Stopped(u64),
        /// Attached at round `from` (a rank that came back): on time from there, not waited for below.
        JoinsAt(u64),
        /// On time, but dropped its rounds [from, end) and says so when round `from` would have come.
        Drops(u64, u64),
    }

    impl Fate {
        fn delivers(&self, round: u64) -> bool {
            match self {
                Fate::OnTime => true,
                Fate::JoinsAt(from) => round >= *from,
                Fate::Drops(from, end) => round < *from || round >= *end,
                _ => false,
            }
        }
    }

    fn fate() -> impl Strategy<Value = Fate> {
        prop_oneof![
            4 => Just(Fate::OnTime),
            1 => Just(Fate::Late),
            1 => Just(Fate::Lost),
            1 => (0u64..7).prop_map(Fate::Finished),
            1 => (0u64..7).prop_map(Fate::Stopped),
            1 => (0u64..7).prop_map(Fate::JoinsAt),
            1 => (0u64..7, 1u64..4).prop_map(|(from, n)| Fate::Drops(from, from + n)),
        ]
    }

    proptest! {
        /// Any arrival order, any mix of late, lost and finished sources, sources that are themselves
        /// partial: every closed round accounts for every expected rank exactly once, and the covered count
        /// equals the ranks that arrived on time.
        #[test]
        fn coverage_sums_stay_exact(
            sources in proptest::collection::vec((1u32..50, fate(), 0u32..5), 1..12),
            rounds in 1u64..6,
            order_seed in any::<u64>(),
        ) {
            let mut e = RoundEngine::new();
            for (i, (n, f, _)) in sources.iter().enumerate() {
                match f {
                    Fate::JoinsAt(from) => e.add_source_from(&format!("s{i}"), *n, *from),
                    _ => e.add_source(&format!("s{i}"), *n),
                }
            }
            e.open_stream(7, StreamSync { mode: SyncMode::WaitForAll, timeout: Duration::from_millis(10) });
            let total: u32 = sources.iter().map(|(n, _, _)| n).sum();
            let t0 = Instant::now();
            let mut events: Vec<(u64, usize)> = Vec::new();
            for r in 0..rounds {
                for i in 0..sources.len() {
                    events.push((r, i));
                }
            }
            // A deterministic shuffle from the seed.
            let mut x = order_seed | 1;
            for i in (1..events.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                events.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let mut closed = Vec::new();
            let mut late_packets = Vec::new();
            let mut on_time_expected = vec![0u32; rounds as usize];
            for (i, (_, f, _)) in sources.iter().enumerate() {
                match f {
                    Fate::Lost => closed.extend(e.set_source_state(&format!("s{i}"), SourceState::Lost)),
                    Fate::Finished(end) => {
                        closed.extend(e.set_source_state(&format!("s{i}"), SourceState::Finished { end: *end }))
                    }
                    Fate::Stopped(end) => {
                        closed.extend(e.set_source_state(&format!("s{i}"), SourceState::Stopped { end: *end }))
                    }
                    _ => {}
                }
            }
            for (r, i) in &events {
                let (n, f, dropped) = &sources[*i];
                if let Fate::Drops(from, end) = f
                    && r == from
                {
                    closed.extend(e.drop_rounds(&format!("s{i}"), *from, *end));
                }
                if !f.delivers(*r) {
                    continue;
                }
                let covered = n - dropped.min(n);
                let mut cov = Coverage { covered, expected: *n, missing: vec![], apps: vec![], unreachable: vec![]  };
                cov.add_missing(MissingReason::SampledOut, *n - covered);
                on_time_expected[*r as usize] += covered;
                let key = GroupKey { stream: 7, round: *r, phase: 0 };
                let a = Arrival { source: format!("s{i}"), coverage: cov, payload: Default::default(), first_dump_unix_ns: 0 };
                match e.accept(key, a, t0).unwrap() {
                    Accepted::Closed(c) => closed.push(c),
                    Accepted::Late(a) => late_packets.push(a),
                    Accepted::Pending => {}
                    Accepted::Again => prop_assert!(false, "each source sends each round once"),
                }
            }
            closed.extend(e.expire(t0 + Duration::from_millis(10)));
            // Late sources deliver after the time-out: once a round has opened, their packets come back late.
            let opened = |r: u64| sources.iter().any(|(_, f, _)| f.delivers(r));
            for r in (0..rounds).filter(|r| opened(*r)) {
                for (i, (n, f, _)) in sources.iter().enumerate() {
                    if matches!(f, Fate::Late) {
                        let key = GroupKey { stream: 7, round: r, phase: 0 };
                        let a = Arrival { source: format!("s{i}"), coverage: full(*n), payload: Default::default(), first_dump_unix_ns: 0 };
                        let late = matches!(e.accept(key, a, t0).unwrap(), Accepted::Late(_));
                        prop_assert!(late);
                    }
                }
            }
            prop_assert!(late_packets.is_empty());
            prop_assert_eq!(closed.len() as u64, (0..rounds).filter(|r| opened(*r)).count() as u64);
            for c in &closed {
                prop_assert!(c.coverage.is_exact(), "{:?}", c.coverage);
                prop_assert_eq!(c.coverage.expected, total);
                prop_assert_eq!(c.coverage.covered, on_time_expected[c.key.round as usize]);
                let r = c.key.round;
                // A source that joined later counts as lost in the rounds before it.
                let lost: u32 = sources
                    .iter()
                    .filter(|s| matches!(s.1, Fate::Lost) || matches!(s.1, Fate::JoinsAt(from) if r < from))
                    .map(|s| s.0)
                    .sum();
                // A finished (or stopped) source is still waited for in rounds below its end: it sends
                // nothing, so late.
                let late: u32 = sources
                    .iter()
                    .filter(|s| {
                        matches!(s.1, Fate::Late)
                            || matches!(s.1, Fate::Finished(end) | Fate::Stopped(end) if r < end)
                    })
                    .map(|s| s.0)
                    .sum();
                let fin: u32 = sources
                    .iter()
                    .filter(|s| matches!(s.1, Fate::Finished(end) | Fate::Stopped(end) if r >= end))
                    .map(|s| s.0)
                    .sum();
                prop_assert_eq!(c.coverage.missing_for(MissingReason::Lost), lost);
                prop_assert_eq!(c.coverage.missing_for(MissingReason::Late), late);
                prop_assert_eq!(c.coverage.missing_for(MissingReason::Stopped), fin);
                let dropped: u32 = sources
                    .iter()
                    .filter(|s| matches!(s.1, Fate::Drops(from, end) if from <= r && r < end))
                    .map(|s| s.0)
                    .sum();
                prop_assert_eq!(c.coverage.missing_for(MissingReason::Dropped), dropped);
                // Only a late source leaves a round partial: a dropped round is known to be complete.
                prop_assert_eq!(c.partial, late > 0);
            }
        }
    }
}

#[test]
fn a_round_counts_once_closed_whatever_its_streams_and_phases() {
    let mut e = engine(&[("a", 4)], SyncMode::WaitForAll);
    let sync = StreamSync {
        mode: SyncMode::WaitForAll,
        timeout: Duration::from_millis(100),
    };
    e.open_stream(2, sync);
    let now = Instant::now();
    for round in 0..3 {
        for (stream, phase) in [(1, 0), (2, 0), (2, 1), (2, 2)] {
            let key = GroupKey { stream, round, phase };
            assert!(matches!(
                e.accept(key, arrival("a", 4), now).unwrap(),
                Accepted::Closed(_)
            ));
        }
    }
    // Rounds may close out of order: round 5 before round 4, and each still once.
    for round in [5, 4] {
        for stream in [1, 2] {
            let key = GroupKey {
                stream,
                round,
                phase: 0,
            };
            e.accept(key, arrival("a", 4), now).unwrap();
        }
    }
    assert_eq!(e.stats().closed, 5);
    assert_eq!(e.stats().partial, 0);
    // Round 6 closes by time-out without b in both streams: one round, two streams' rounds partial.
    e.add_source("b", 4);
    for stream in [1, 2] {
        let key = GroupKey {
            stream,
            round: 6,
            phase: 0,
        };
        assert!(matches!(
            e.accept(key, arrival("a", 4), now).unwrap(),
            Accepted::Pending
        ));
    }
    assert_eq!(e.expire(now + Duration::from_secs(1)).len(), 2);
    assert_eq!((e.stats().closed, e.stats().partial), (6, 2));
}

/// A forgotten source's number goes to the next new source, and nothing it took part in passes to the new one:
/// not the rounds it delivered, not the later phases of a round it made, not the open groups it delivered to.
#[test]
fn a_new_source_does_not_inherit_what_a_forgotten_one_took_part_in() {
    let mut e = engine(&[("a", 4), ("b", 4)], SyncMode::WaitForAll);
    let now = Instant::now();
    e.accept(K, arrival("a", 4), now).unwrap();
    e.accept(K, arrival("b", 4), now).unwrap();
    let r1 = GroupKey { round: 1, ..K };
    e.accept(r1, arrival("a", 4), now).unwrap();
    assert_eq!(e.participants(1, 0).unwrap(), ["a", "b"]);
    // a leaves and c comes: a's number stays a's, since the sets still hold it.
    e.forget_source("a");
    e.add_source("c", 4);
    assert_eq!(e.participants(1, 0).unwrap(), ["a", "b"]);
    assert_eq!(e.delivered_by("a", 1), [(0, 2)]);
    assert!(e.delivered_by("c", 1).is_empty());
    assert_eq!(e.delivered_by("b", 1), [(0, 1)]);
    // c did not make round 0, so its phase 2 is late; b's alone closes it.
    let p2 = GroupKey { phase: 2, ..K };
    assert!(matches!(
        e.accept(p2, arrival("c", 4), now).unwrap(),
        Accepted::Late(_)
    ));
    assert!(matches!(
        e.accept(p2, arrival("b", 4), now).unwrap(),
        Accepted::Closed(_)
    ));
    // Round 1 was open with a's packet: c's own packet is not a duplicate, and the round waits for b.
    assert!(matches!(
        e.accept(r1, arrival("c", 4), now).unwrap(),
        Accepted::Pending
    ));
    let Accepted::Closed(c) = e.accept(r1, arrival("b", 4), now).unwrap() else {
        panic!("not closed")
    };
    assert_eq!(c.inputs.len(), 3);
}

#[test]
fn a_source_forgotten_and_back_under_its_name_keeps_what_it_delivered() {
    let mut e = engine(&[("a", 4), ("b", 4)], SyncMode::WaitForAll);
    let now = Instant::now();
    e.accept(K, arrival("a", 4), now).unwrap();
    // a is adopted elsewhere, then re-attaches while round 0 is still open.
    e.forget_source("a");
    e.add_source("a", 4);
    // Its packet is still in the round: b closes it, and a resend is a duplicate.
    assert!(matches!(
        e.accept(K, arrival("a", 4), now),
        Err(EngineError::Duplicate { .. })
    ));
    let Accepted::Closed(c) = e.accept(K, arrival("b", 4), now).unwrap() else {
        panic!("not closed")
    };
    assert_eq!(c.inputs.len(), 2);
    assert_eq!(c.coverage.expected, 8);
    assert_eq!(c.coverage.covered, 8);
    // The round's later phases wait for it, and it is named among those the round's later packets go to.
    assert_eq!(e.participants(1, 0).unwrap(), ["a", "b"]);
    assert_eq!(e.delivered_by("a", 1), [(0, 1)]);
    let p2 = GroupKey { phase: 2, ..K };
    assert!(matches!(
        e.accept(p2, arrival("b", 4), now).unwrap(),
        Accepted::Pending
    ));
    assert!(matches!(
        e.accept(p2, arrival("a", 4), now).unwrap(),
        Accepted::Closed(_)
    ));
}

#[test]
fn numbers_of_sources_forgotten_before_they_delivered_are_given_again() {
    let mut e = engine(&[("keep", 4)], SyncMode::WaitForAll);
    let now = Instant::now();
    // Many ranks come and hang up before their first dump; one delivers, then leaves.
    e.add_source("gone", 4);
    e.accept(K, arrival("gone", 4), now).unwrap();
    e.forget_source("gone");
    for i in 0..1000 {
        let id = format!("r{i}");
        e.add_source(&id, 4);
        e.forget_source(&id);
    }
    // Numbers stay few: each new source takes a freed one.
    e.add_source("new", 4);
    assert!(e.numbers.name(200).is_none());
    // The one that delivered keeps its number while round 0 holds it, and gets it back.
    e.add_source("gone", 4);
    assert!(matches!(
        e.accept(K, arrival("gone", 4), now),
        Err(EngineError::Duplicate { .. })
    ));
}

/// A source forgotten before it delivered to an open round counts there as left; back under its name while the
/// round is open, it counts as itself: covered if it delivers, late if not, never twice.
#[test]
fn a_source_forgotten_before_it_delivered_and_back_counts_once_in_the_open_rounds() {
    let mut e = engine(&[("a", 4), ("b", 4), ("c", 4)], SyncMode::WaitForAll);
    let now = Instant::now();
    let (r1, r2) = (GroupKey { round: 1, ..K }, GroupKey { round: 2, ..K });
    e.accept(K, arrival("b", 4), now).unwrap();
    e.accept(r1, arrival("b", 4), now).unwrap();
    // a leaves (its ranks count as lost in rounds 0 and 1), and comes back under its name while they wait for c.
    assert!(e.forget_source("a").is_empty(), "the rounds still wait for c");
    e.add_source("a", 4);
    // Round 0: a delivers, c does not: 12 ranks expected, 8 covered, c's 4 late, none lost.
    assert!(matches!(
        e.accept(K, arrival("a", 4), now).unwrap(),
        Accepted::Pending
    ));
    // Round 2 opens after a's return: it never counted a as left, and closes whole.
    e.accept(r2, arrival("a", 4), now).unwrap();
    e.accept(r2, arrival("b", 4), now).unwrap();
    let Accepted::Closed(c2) = e.accept(r2, arrival("c", 4), now).unwrap() else {
        panic!("round 2 waits")
    };
    assert_eq!((c2.coverage.expected, c2.coverage.covered), (12, 12));
    let closed = e.expire(now + Duration::from_secs(1));
    assert_eq!(closed.len(), 2);
    let coverage_of = |key: GroupKey| &closed.iter().find(|c| c.key == key).expect("timed out").coverage;
    // Round 0: a's 4 covered, c's 4 late; round 1: neither delivered, each of their ranks late once.
    for (key, covered, late) in [(K, 8, 4), (r1, 4, 8)] {
        let c = coverage_of(key);
        assert_eq!((c.expected, c.covered), (12, covered), "{key:?}");
        assert_eq!(c.missing_for(MissingReason::Late), late, "{key:?}");
        assert_eq!(c.missing_for(MissingReason::Lost), 0, "{key:?}");
    }
}

/// A sweep of retired numbers keeps those that only closed rounds' participants hold: a new source does not
/// take part in rounds a forgotten one made.
#[test]
fn a_sweep_keeps_the_numbers_only_closed_rounds_hold() {
    let mut e = engine(&[("a", 4), ("b", 4)], SyncMode::WaitForAll);
    let now = Instant::now();
    e.accept(K, arrival("a", 4), now).unwrap();
    assert!(matches!(
        e.accept(K, arrival("b", 4), now).unwrap(),
        Accepted::Closed(_)
    ));
    // a leaves once round 0 closed; enough others come and go for sweeps to run.
    e.forget_source("a");
    for i in 0..1000 {
        let id = format!("r{i}");
        e.add_source(&id, 1);
        e.forget_source(&id);
    }
    assert_eq!(
        e.numbers.retired("a"),
        Some(0),
        "round 0's participants still hold a's number"
    );
    e.add_source("new", 4);
    assert_eq!(e.participants(1, 0).unwrap(), ["a", "b"]);
    assert!(e.delivered_by("new", 1).is_empty());
    // The later phases of round 0 wait for a and b, not for the newcomer.
    let p2 = GroupKey { phase: 2, ..K };
    assert!(matches!(
        e.accept(p2, arrival("new", 4), now).unwrap(),
        Accepted::Late(_)
    ));
}

/// A relay's child forgotten with 4 ranks that re-attaches answering for none yet (its own children not back)
/// still has its 4 ranks counted once in the rounds open since, as lost; once it answers for them again, they
/// count as its own, late. Forgotten a second time, they count once more as lost, not twice.
#[test]
fn a_source_back_with_fewer_ranks_leaves_the_rest_lost_once() {
    let now = Instant::now();
    let covered_expected_lost = |c: &Closed| {
        (
            c.coverage.covered,
            c.coverage.expected,
            c.coverage.missing_for(MissingReason::Lost),
        )
    };
    // Back with none: 4 lost.
    let mut e = engine(&[("a", 4), ("b", 4)], SyncMode::WaitForAll);
    e.accept(K, arrival("b", 4), now).unwrap();
    e.add_source("c", 4);
    e.forget_source("a");
    e.add_source("a", 0);
    let closed = e.expire(now + Duration::from_secs(1));
    assert_eq!(covered_expected_lost(&closed[0]), (4, 12, 4));
    // Back with none, then with its 4 again: they count as its own (late, as c's), not lost.
    let mut e = engine(&[("a", 4), ("b", 4), ("c", 4)], SyncMode::WaitForAll);
    e.accept(K, arrival("b", 4), now).unwrap();
    e.forget_source("a");
    e.add_source("a", 0);
    e.set_ranks_below("a", 4);
    let closed = e.expire(now + Duration::from_secs(1));
    assert_eq!(covered_expected_lost(&closed[0]), (4, 12, 0));
    assert_eq!(closed[0].coverage.missing_for(MissingReason::Late), 8);
    // Forgotten, back, forgotten again before delivering: its ranks count once, as lost.
    let mut e = engine(&[("a", 4), ("b", 4), ("c", 4)], SyncMode::WaitForAll);
    e.accept(K, arrival("b", 4), now).unwrap();
    e.forget_source("a");
    e.add_source("a", 4);
    e.forget_source("a");
    let Accepted::Closed(c) = e.accept(K, arrival("c", 4), now).unwrap() else {
        panic!("round 0 waits")
    };
    assert_eq!(covered_expected_lost(&c), (8, 12, 4));
    // Forgotten, back, delivered, forgotten again: its packet counts it, nothing is lost.
    let mut e = engine(&[("a", 4), ("b", 4), ("c", 4)], SyncMode::WaitForAll);
    e.accept(K, arrival("b", 4), now).unwrap();
    e.forget_source("a");
    e.add_source("a", 4);
    e.accept(K, arrival("a", 4), now).unwrap();
    e.forget_source("a");
    let Accepted::Closed(c) = e.accept(K, arrival("c", 4), now).unwrap() else {
        panic!("round 0 waits")
    };
    assert_eq!(covered_expected_lost(&c), (12, 12, 0));
}

#[test]
fn a_late_packet_sent_again_counts_once_and_so_does_one_whose_source_delivered_in_time() {
    let mut e = RoundEngine::new();
    e.add_source("a", 2);
    e.add_source("b", 2);
    e.open_stream(
        7,
        StreamSync {
            mode: SyncMode::WaitForAll,
            timeout: Duration::from_millis(5),
        },
    );
    let t0 = Instant::now();
    let key = GroupKey {
        stream: 7,
        round: 0,
        phase: 0,
    };
    let packet = |source: &str| Arrival {
        source: source.into(),
        coverage: full(2),
        payload: Default::default(),
        first_dump_unix_ns: 0,
    };
    assert!(matches!(
        e.accept(key, packet("a"), t0).unwrap(),
        Accepted::Pending
    ));
    let closed = e.expire(t0 + Duration::from_millis(10));
    assert_eq!(closed.len(), 1);
    // b's packet comes late, then again (a resend after its link broke): once late, then a copy.
    assert!(matches!(
        e.accept(key, packet("b"), t0).unwrap(),
        Accepted::Late(_)
    ));
    assert!(matches!(e.accept(key, packet("b"), t0).unwrap(), Accepted::Again));
    // a's resend of what it delivered in time is a copy too.
    assert!(matches!(e.accept(key, packet("a"), t0).unwrap(), Accepted::Again));
}
