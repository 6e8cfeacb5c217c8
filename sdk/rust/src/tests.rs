use super::Clock;

#[test]
fn time_rounds_follow_the_tree_clock_and_skip_to_the_latest_ended_window() {
    let c = Clock {
        start: 1000,
        first: 5,
        period_ns: 100,
    };
    // Round 5 is [1000, 1100): due at 1100, under way before.
    assert_eq!(c.due(1050, 0), (5, 1000, 1100));
    assert_eq!(c.current(1050, 0), (5, 1000, 1100));
    assert_eq!(c.due(1100, 5), (5, 1000, 1100));
    assert_eq!(c.due(1120, 6), (6, 1100, 1200));
    // Round 6 ended at 1200 and 7 at 1300: a rank that wakes at 1310 dumps 7; 6 is left out (a gap).
    assert_eq!(c.due(1310, 6), (7, 1200, 1300));
    assert_eq!(c.due(1810, 6), (12, 1700, 1800));
    // Finalize: the window under way, partial.
    assert_eq!(c.current(1310, 6), (8, 1300, 1400));
}
