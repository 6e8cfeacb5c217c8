//! The Kafka export against a real broker (tansu; see `canopy_integration_tests::kafka`): every stored round of
//! every stream is in its topic exactly once, keyed `RUN/STREAM/ROUND`, with the value a subscriber receives,
//! through a broker that stops answering, a relay killed, and a front-end killed and restarted on its store; a
//! send in doubt is read back rather than sent again; a wrong address is named at start and the run goes on.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "tests that wait on real processes by the wall clock"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use canopy_integration_tests::kafka::{Broker, Consumed};
use canopy_integration_tests::{
    Proc, RoundRow, SimAgent, canopy_cli, python_with, read_rounds, reader, start_frontend, start_relay,
    wait_for,
};
use canopy_proto::v1::RoundUpdate;
use nix::sys::signal::Signal;
use prost::Message;

const RANKS_PER_AGENT: u32 = 8;

fn agent(dir: &Path, n: u32, parents: &str, total: u32, rounds: u64) -> Proc {
    let id = format!("agent-{n}");
    SimAgent {
        id: &id,
        parents,
        ranks: RANKS_PER_AGENT,
        offset: n * RANKS_PER_AGENT,
        total,
        period_ms: 20,
        rounds,
    }
    .start(dir)
}

fn frontend_args<'a>(listen: &'a str, ranks: &'a str, brokers: &'a str) -> Vec<&'a str> {
    vec![
        "--listen",
        listen,
        "--streams",
        "stats,histogram",
        "--stream-timeout-ms",
        "1000",
        "--expect-ranks",
        ranks,
        "--exit-on-fin",
        "true",
        "--kafka-brokers",
        brokers,
    ]
}

/// Asserts that each topic holds every stored round of its stream once, and nothing else: keys `RUN/STREAM/ROUND`,
/// values that decode as the round's `RoundUpdate` with its stored coverage, headers naming the types.
fn assert_exactly_once(broker: &Broker, store: &Path, streams: &[&str]) {
    let run = reader(store).meta("run_id").unwrap().expect("run id");
    let rows = read_rounds(store);
    for stream in streams {
        let stored: BTreeMap<u64, &RoundRow> = rows
            .iter()
            .filter(|r| r.stream == *stream)
            .map(|r| (r.round, r))
            .collect();
        assert!(
            stored.len() >= 100,
            "{stream}: only {} rounds stored",
            stored.len()
        );
        let records = broker.records(&format!("canopy.{stream}"));
        let mut seen: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
        for Consumed {
            offset,
            key,
            value,
            headers,
        } in &records
        {
            let (r, s, round) =
                canopy_kafka::parse_key(key.as_bytes()).unwrap_or_else(|| panic!("key {key:?}"));
            assert_eq!(
                (r, s),
                (run.as_str(), *stream),
                "a record of another run or stream: {key}"
            );
            seen.entry(round).or_default().push(*offset);
            let update = RoundUpdate::decode(value.as_slice()).expect("the value is a RoundUpdate");
            assert_eq!((update.stream.as_str(), update.round), (*stream, round));
            let row = stored
                .get(&round)
                .unwrap_or_else(|| panic!("{key} is in Kafka but not in the store"));
            let coverage = update.coverage.expect("coverage");
            assert_eq!(
                (coverage.covered, coverage.expected),
                (row.covered, row.expected),
                "{key}'s coverage"
            );
            assert_eq!(headers["canopy-value-type"], b"canopy.v1.RoundUpdate");
            assert!(
                update.result.is_some_and(|a| a
                    .type_url
                    .ends_with(std::str::from_utf8(&headers["canopy-result-type"]).unwrap())),
                "{key}: the result's type is the header's"
            );
        }
        let twice: Vec<_> = seen.iter().filter(|(_, o)| o.len() > 1).collect();
        assert!(
            twice.is_empty(),
            "{stream}: rounds published more than once (round, offsets): {twice:?}"
        );
        let missing: Vec<_> = stored.keys().filter(|r| !seen.contains_key(r)).collect();
        assert!(
            missing.is_empty(),
            "{stream}: stored rounds not in Kafka: {missing:?}"
        );
    }
    let log = rusqlite::Connection::open(store).unwrap();
    let unpublished: i64 = log
        .query_row(
            "SELECT count(*) FROM rounds r WHERE NOT EXISTS
             (SELECT 1 FROM kafka_rounds k WHERE k.stream_id = r.stream_id AND k.round = r.round AND k.offset IS NOT NULL)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(unpublished, 0, "rounds the store does not record as acknowledged");
    let state: String = log
        .query_row("SELECT value FROM meta WHERE key = 'kafka_export'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(state, "done");
}

/// Waits up to `secs` for the front-end to end with its run, and asserts it ended well.
fn ends_with_the_run(fe: &mut Proc, secs: u64) {
    let status = fe
        .wait_timeout(Duration::from_secs(secs))
        .expect("the front-end ends with the run");
    assert!(status.success(), "front-end: {status}\n{}", fe.log_text());
}

fn stored_rounds(store: &Path) -> usize {
    std::fs::metadata(store).map_or(0, |_| read_rounds(store).len())
}

#[test]
fn every_stored_round_is_published_once_through_a_stopped_broker_and_a_killed_relay() {
    let dir = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(dir.path(), "kafka::stopped_broker_and_killed_relay") else {
        return;
    };
    let listen = canopy_integration_tests::unused_addr();
    let mut args = frontend_args(&listen, "32", &broker.addr);
    args.extend(["--metrics-listen", "127.0.0.1:0"]);
    let (mut fe, _, store) = start_frontend(dir.path(), &args);
    let metrics = canopy_integration_tests::frontend_ready(dir.path())
        .metrics
        .expect("a metrics address in the front-end's ready file")
        .to_string();
    let (_relay0, addr0) = start_relay(dir.path(), "relay-0", &listen, "127.0.0.1:0");
    let (relay1, addr1) = start_relay(dir.path(), "relay-1", &listen, "127.0.0.1:0");
    let up0 = format!("{addr0},{listen}");
    let up1 = format!("{addr1},{listen}");
    let _agents: Vec<Proc> = (0..4)
        .map(|n| agent(dir.path(), n, if n < 2 { &up0 } else { &up1 }, 32, 1000))
        .collect();
    wait_for("100 rounds stored", Duration::from_secs(60), || {
        stored_rounds(&store) >= 200
    });
    // Longer than a request's time-out: the send under way is given up while the broker holds it, unread, and
    // appends it once it runs again. Reading the topic back finds it, so it is not sent twice.
    broker.pause();
    std::thread::sleep(Duration::from_secs(2));
    relay1.signal(Signal::SIGKILL);
    std::thread::sleep(Duration::from_millis(9500));
    // Past the request's time-out: the metrics say the brokers are away and the rounds wait.
    let scraped = scrape(&metrics);
    assert_eq!(scraped.get("canopy_kafka_up"), Some(&0.0), "{scraped:?}");
    assert!(scraped["canopy_kafka_rounds_pending"] > 100.0, "{scraped:?}");
    assert!(scraped["canopy_kafka_rounds_published"] > 100.0, "{scraped:?}");
    std::thread::sleep(Duration::from_millis(500));
    broker.resume();
    ends_with_the_run(&mut fe, 120);
    let log = fe.log_text();
    assert!(
        log.contains("cannot publish to Kafka"),
        "the stopped broker was not noticed:\n{log}"
    );
    assert!(
        log.contains("answer again"),
        "the broker's return was not logged:\n{log}"
    );
    for line in log.lines().filter(|l| l.contains("canopy_kafka")) {
        eprintln!("{line}");
    }
    assert_exactly_once(&broker, &store, &["stats", "histogram"]);
}

#[test]
fn a_frontend_killed_and_restarted_on_its_store_publishes_each_round_once() {
    let dir = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(dir.path(), "kafka::frontend_restarted") else {
        return;
    };
    let listen = canopy_integration_tests::unused_addr();
    let args = frontend_args(&listen, "16", &broker.addr);
    let (fe, _, store) = start_frontend(dir.path(), &args);
    let _agents: Vec<Proc> = (0..2).map(|n| agent(dir.path(), n, &listen, 16, 500)).collect();
    wait_for("rounds stored", Duration::from_secs(60), || {
        stored_rounds(&store) >= 200
    });
    fe.signal(Signal::SIGKILL);
    drop(fe);
    let _ = std::fs::remove_file(dir.path().join("frontend.ready"));
    let (mut fe, _, again) = start_frontend(dir.path(), &args);
    assert_eq!(again, store, "the restarted front-end continues the run's store");
    ends_with_the_run(&mut fe, 120);
    assert_exactly_once(&broker, &store, &["stats", "histogram"]);
}

/// The metrics endpoint's samples by name (each series here is the front-end's one: its labels are left out).
fn scrape(addr: &str) -> BTreeMap<String, f64> {
    let (_, _, out) = canopy_integration_tests::http_get(addr, "/metrics");
    out.lines()
        .filter(|l| l.starts_with("canopy_kafka_"))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let name = series.split('{').next()?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// A finished run, without Kafka: a front-end and one agent of 8 ranks for `rounds` rounds.
fn finished_run(dir: &Path, extra: &[&str], rounds: u64) -> (std::path::PathBuf, String) {
    let mut args = vec![
        "--streams",
        "stats",
        "--expect-ranks",
        "8",
        "--exit-on-fin",
        "true",
    ];
    args.extend_from_slice(extra);
    let (mut fe, addr, store) = start_frontend(dir, &args);
    let _agent = agent(dir, 0, &addr, 8, rounds);
    ends_with_the_run(&mut fe, 60);
    (store, fe.log_text())
}

#[test]
fn export_publishes_a_finished_run_once_and_reads_back_what_is_there_already() {
    let dir = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(dir.path(), "kafka::export_command") else {
        return;
    };
    let (store, _) = finished_run(dir.path(), &[], 60);
    let rounds = read_rounds(&store).len();
    let path = store.to_str().unwrap();
    let first = canopy_cli(&["export", path, "--kafka-brokers", &broker.addr]);
    assert!(
        first.contains(&format!("{rounds} published now; 0 already there")),
        "{first}"
    );
    // The store forgets what it published, as a crash between the broker's answer and the store's commit would:
    // reading the topic back finds every round, and nothing is sent again.
    rusqlite::Connection::open(&store)
        .unwrap()
        .execute("DELETE FROM kafka_rounds", [])
        .unwrap();
    let again = canopy_cli(&["export", path, "--kafka-brokers", &broker.addr]);
    assert!(
        again.contains(&format!(
            "0 published now; {rounds} already there (0 recorded in the store, {rounds} found in the topics)"
        )),
        "{again}"
    );
    consume_as_docs_say(dir.path(), &broker, rounds);
    let third = canopy_cli(&["export", path, "--kafka-brokers", &broker.addr]);
    assert!(
        third.contains(&format!(
            "0 published now; {rounds} already there ({rounds} recorded"
        )),
        "{third}"
    );
    let records = broker.records("canopy.stats");
    assert_eq!(records.len(), rounds, "one record per round in the topic");
    let keys: BTreeSet<&str> = records.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys.len(), rounds);
}

/// docs/kafka.md's consumer, as written there, reads every round of the topic with its coverage and typed result.
fn consume_as_docs_say(dir: &Path, broker: &Broker, rounds: usize) {
    let Some(python) = python_with(&["kafka", "google.protobuf"]) else {
        return;
    };
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/kafka.md")).unwrap();
    let script = doc
        .split("```python\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("docs/kafka.md has a python block");
    let descriptors = dir.join("canopy.desc");
    canopy_cli(&["descriptors", "-o", descriptors.to_str().unwrap()]);
    let script = script
        .replace("\"localhost:9092\"", &format!("{:?}", broker.addr))
        .replace("\"canopy.desc\"", &format!("{:?}", descriptors.to_str().unwrap()));
    let out = std::process::Command::new(&python)
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), rounds, "{stdout}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains(" stats round ") && l.contains("/8 ranks") && l.ends_with("StatsResult")),
        "{stdout}"
    );
}

#[test]
fn a_wrong_broker_address_is_named_at_start_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let nowhere = canopy_integration_tests::unused_addr();
    let (store, log) = finished_run(
        dir.path(),
        &["--kafka-brokers", &nowhere, "--kafka-drain-ms", "1000"],
        40,
    );
    assert!(
        log.contains("cannot reach the Kafka brokers") && log.contains(&nowhere),
        "the start does not name the brokers it cannot reach:\n{log}"
    );
    let rows = read_rounds(&store);
    assert!(
        rows.len() >= 40 && rows.iter().all(RoundRow::is_full),
        "the run went on: {} rounds",
        rows.len()
    );
    let state = reader(&store).meta("kafka_export").unwrap().unwrap_or_default();
    assert!(
        state.starts_with(&format!("incomplete: {} rounds not published", rows.len())),
        "the store does not say the export failed: {state:?}"
    );
    assert!(
        log.contains("canopy export"),
        "the log does not say how to publish them later:\n{log}"
    );
    // Published later, once a broker is there.
    let Some(broker) = Broker::start(dir.path(), "kafka::wrong_address (publishing later)") else {
        return;
    };
    let out = canopy_cli(&["export", store.to_str().unwrap(), "--kafka-brokers", &broker.addr]);
    assert!(out.contains(&format!("{} published now", rows.len())), "{out}");
}

#[test]
fn rounds_a_broker_refuses_are_recorded_with_its_reason_and_the_other_streams_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start_refusing(dir.path(), "kafka::refused", &["canopy.histogram"]) else {
        return;
    };
    let listen = canopy_integration_tests::unused_addr();
    let (mut fe, _, store) = start_frontend(dir.path(), &frontend_args(&listen, "8", &broker.addr));
    let _agent = agent(dir.path(), 0, &listen, 8, 120);
    ends_with_the_run(&mut fe, 60);
    let rows = read_rounds(&store);
    let histogram_rounds = rows.iter().filter(|r| r.stream == "histogram").count();
    let log = rusqlite::Connection::open(&store).unwrap();
    let (refused, reason): (i64, String) = log
        .query_row(
            "SELECT count(*), max(k.failure) FROM kafka_rounds k JOIN streams s USING (stream_id)
             WHERE s.name = 'histogram' AND k.offset IS NULL",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        refused as usize, histogram_rounds,
        "every histogram round recorded as refused"
    );
    assert!(
        reason.contains("InvalidRecord"),
        "the broker's reason is kept: {reason:?}"
    );
    assert!(broker.records("canopy.histogram").is_empty());
    let stats: Vec<&RoundRow> = rows.iter().filter(|r| r.stream == "stats").collect();
    let records = broker.records("canopy.stats");
    assert_eq!(records.len(), stats.len(), "the stats stream is published whole");
    assert!(
        fe.log_text().contains("the broker refused a round"),
        "the refusal is not logged"
    );
}

#[test]
fn canopy_up_publishes_its_run() {
    let dir = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::start(dir.path(), "kafka::canopy_up") else {
        return;
    };
    let out = dir.path().join("out");
    canopy_cli(&[
        "up",
        "--quiet",
        "--ranks",
        "8",
        "--agents",
        "2",
        "--fanout",
        "2",
        "--rounds",
        "30",
        "--period-ms",
        "10",
        "--out",
        out.to_str().unwrap(),
        "--kafka-brokers",
        &broker.addr,
    ]);
    let store = out.join("latest.sqlite");
    let rounds = read_rounds(&store).len();
    assert!(rounds >= 30, "{rounds} rounds stored");
    assert_eq!(
        broker.records("canopy.stats").len(),
        rounds,
        "each stored round published once"
    );
}
