//! The SDK switching between dump-count rounds and time rounds as the tree's `time_rounds` option changes, in
//! a process of its own against a stand-in agent on a Unix socket: with the option, the rank's own dumps do
//! nothing and the period thread dumps the windows of the tree's clock from the window under way; without it,
//! the rank's dumps are its rounds again.

#![allow(
    clippy::disallowed_types,
    reason = "a synchronous test process; no tokio clock to pause"
)]

use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use canopy_wire::v1::{
    AgentMessage, Options, RankControl, RankDump, RankMessage, agent_message, rank_message,
};
use canopy_wire::{encode_frame, read_frame};

fn send(conn: &mut UnixStream, options: Options, start_unix_ns: u64) {
    use std::io::Write;
    let msg = AgentMessage {
        msg: Some(agent_message::Msg::Control(RankControl {
            collecting: true,
            options: Some(options),
            start_unix_ns,
            first_round: 0,
            ..Default::default()
        })),
    };
    let mut out = Vec::new();
    encode_frame(&msg, &mut out);
    conn.write_all(&out).unwrap();
}

fn next_dump(conn: &mut UnixStream, buf: &mut Vec<u8>) -> RankDump {
    loop {
        match read_frame::<RankMessage>(conn, buf)
            .expect("a frame from the rank")
            .msg
        {
            Some(rank_message::Msg::Dump(d)) => return d,
            _ => continue,
        }
    }
}

fn unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

#[allow(
    clippy::disallowed_methods,
    reason = "a synchronous test process waiting for the SDK's threads"
)]
fn pause(d: Duration) {
    std::thread::sleep(d);
}

#[test]
fn the_time_rounds_option_switches_a_rank_to_its_period_thread_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let mut config = canopy_sdk::Config::from_env("time-rounds-test", Some(0), Some(1)).unwrap();
    config.socket = path;
    config.period = None;
    canopy_sdk::init_with(config).unwrap();
    let (mut conn, _) = listener.accept().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    match read_frame::<RankMessage>(&mut conn, &mut buf).unwrap().msg {
        Some(rank_message::Msg::Hello(h)) => assert_eq!(h.next_round, 0),
        other => panic!("expected a hello, got {other:?}"),
    }

    // Dump-count rounds: each dump the rank takes is its next round.
    send(&mut conn, Options::default(), 0);
    pause(Duration::from_millis(100));
    canopy_sdk::dump().unwrap();
    canopy_sdk::dump().unwrap();
    assert_eq!(next_dump(&mut conn, &mut buf).round, 0);
    assert_eq!(next_dump(&mut conn, &mut buf).round, 1);

    // Time rounds (the default period of one second, as options set none) on a clock that started 30.5 s ago:
    // the rank begins at the window under way (30), not at its next dump-count round (2) nor at the window that
    // ended before it had the clock, and its own dumps add nothing between the period thread's.
    const SECOND: u64 = 1_000_000_000;
    let start = unix_ns() - 30 * SECOND - SECOND / 2;
    let on = Options {
        time_rounds: Some(true),
        ..Default::default()
    };
    send(&mut conn, on, start);
    pause(Duration::from_millis(50));
    // The dump that applies the control, and more: none is a round.
    for _ in 0..5 {
        canopy_sdk::dump().unwrap();
    }
    let first = next_dump(&mut conn, &mut buf);
    assert_eq!(first.round, 30);
    // Dumped at the end of its window.
    assert!(first.dump_unix_ns >= start + 31 * SECOND);
    canopy_sdk::dump().unwrap();
    let second = next_dump(&mut conn, &mut buf);
    assert_eq!(second.round, 31, "one round per window, none from dump()");
    assert!(second.dump_unix_ns >= start + 32 * SECOND);

    // Dump-count rounds again, well before the next window ends: the rank's dumps are its rounds, from the one
    // after its last window, and the period thread dumps no more windows.
    send(
        &mut conn,
        Options {
            time_rounds: Some(false),
            ..Default::default()
        },
        start,
    );
    pause(Duration::from_millis(50));
    canopy_sdk::dump().unwrap();
    canopy_sdk::dump().unwrap();
    let a = next_dump(&mut conn, &mut buf);
    let b = next_dump(&mut conn, &mut buf);
    assert_eq!((a.round, b.round), (32, 33));
    assert!(b.dump_unix_ns - a.dump_unix_ns < SECOND / 10, "{a:?} {b:?}");
    // Past the end of the window that was under way: had the period thread dumped it, it would come first.
    pause(Duration::from_millis(1200));
    let asked = unix_ns();
    canopy_sdk::dump().unwrap();
    let c = next_dump(&mut conn, &mut buf);
    assert_eq!(c.round, 34);
    assert!(
        c.dump_unix_ns >= asked,
        "a window dumped by the period thread: {c:?}"
    );
}
