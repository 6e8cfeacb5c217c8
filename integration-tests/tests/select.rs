//! Metric selection on the workflow scenario (seed 004), end to end: a simulation (`lammps`, 32 ranks) feeds two
//! analyses (`bonds`, 2 ranks; `csym`, 1 rank) under a relay; three events drive each step's end-to-end latency.
//! Every step's latency as the tree measures it equals the scenario's ground truth; `canopy ctl select` names
//! every planted driver and at most two other metrics, predicts the latency at least as well as every metric
//! does, and applied, it cuts the bytes of results per round by more than half while every step is still
//! measured.

#![allow(
    clippy::disallowed_types,
    reason = "a synchronous test that waits on real processes by the wall clock; no tokio clock to pause"
)]

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use canopy_agent::sim::workflow;
use canopy_integration_tests::{
    Proc, Select, SimAgent, canopy_cli, reader, start_frontend, start_relay, wait_for,
};

const PERIOD_MS: u64 = 10;
/// The rounds the selection learns from.
const LEARN: u64 = 250;
const SEED: u64 = 11;

fn workflow_agent(
    dir: &Path,
    id: &str,
    parent: &str,
    app: &str,
    ranks: u32,
    offset: u32,
    total: u32,
) -> Proc {
    let seed = SEED.to_string();
    SimAgent {
        id,
        parents: parent,
        ranks,
        offset,
        total,
        period_ms: PERIOD_MS,
        rounds: 0,
    }
    .start_with(
        dir,
        &[
            "--app",
            app,
            "--simulate-scenario",
            "workflow",
            "--simulate-events",
            "40",
            "--seed",
            &seed,
        ],
    )
}

/// The run's stream of `filter`, once the store has it.
fn stream_of(store: &Path, filter: &str) -> Option<canopy_store::StreamRow> {
    reader(store)
        .streams()
        .unwrap()
        .into_iter()
        .find(|s| s.filter == filter)
}

fn last_round(store: &Path, filter: &str) -> Option<u64> {
    stream_of(store, filter)?.last_round
}

/// The store's event and counter names by id.
fn names_of(store: &Path) -> HashMap<u64, String> {
    reader(store).names().unwrap().into_iter().collect()
}

/// The bytes of results the front-end stores per round (every stream's), over the next `rounds` rounds.
fn bytes_per_round(store: &Path, rounds: u64) -> f64 {
    let start = last_round(store, "stats").unwrap() + 1;
    wait_for("rounds to weigh", Duration::from_secs(60), || {
        last_round(store, "stats").is_some_and(|r| r >= start + rounds)
            && last_round(store, "latency").is_some_and(|r| r >= start + rounds)
    });
    let bytes: u64 = reader(store)
        .rounds(Select::all().from_round(start))
        .unwrap()
        .iter()
        .filter(|r| r.round < start + rounds)
        .map(|r| r.result_bytes)
        .sum();
    bytes as f64 / rounds as f64
}

fn selected(response: &serde_json::Value) -> Vec<(String, String, String)> {
    response["ranking"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["selected"] == true)
        .map(|c| {
            (
                c["app"].as_str().unwrap().to_string(),
                c["event"].as_str().unwrap().to_string(),
                c["metric"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn selection_names_the_planted_drivers_predicts_as_well_and_applied_halves_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (_fe, fe_addr, store) = start_frontend(
        dir.path(),
        &["--streams", "stats,latency", "--expect-ranks", "35"],
    );
    let (_relay, relay_addr) = start_relay(dir.path(), "relay", &fe_addr, "127.0.0.1:0");
    let _agents = [
        workflow_agent(dir.path(), "sim-0", &relay_addr, "lammps", 16, 0, 32),
        workflow_agent(dir.path(), "sim-1", &relay_addr, "lammps", 16, 16, 32),
        workflow_agent(dir.path(), "bonds", &relay_addr, "bonds", 2, 0, 2),
        workflow_agent(dir.path(), "csym", &fe_addr, "csym", 1, 0, 1),
    ];
    wait_for("the rounds to learn from", Duration::from_secs(90), || {
        last_round(&store, "latency").is_some_and(|r| r >= LEARN + 5)
            && last_round(&store, "stats").is_some_and(|r| r >= LEARN + 5)
    });
    let before = bytes_per_round(&store, 40);

    // The tree's latency of every step is the scenario's ground truth; of it, the drivers' times as the stats
    // stream holds them (each driver is the same at every rank of its application) leave the transfer, which no
    // metric shows.
    let r = reader(&store);
    let names = names_of(&store);
    let latency_stream = stream_of(&store, "latency").unwrap();
    let stats_stream = stream_of(&store, "stats").unwrap();
    let steps = r.latency(Select::all().stream(latency_stream.stream_id)).unwrap();
    let stats = r.stats(Select::all().stream(stats_stream.stream_id)).unwrap();
    let mut checked = 0;
    for step in steps.iter().filter(|s| s.round <= LEARN) {
        assert_eq!(
            (step.start_app.as_str(), step.stop_app.as_str()),
            ("lammps", "csym"),
            "{step:?}"
        );
        assert_eq!(step.step, step.round, "{step:?}");
        let driver_us: f64 = ["bonds_read_input", "csym_read_input", "csym_compute_send"]
            .iter()
            .map(|d| {
                stats
                    .iter()
                    .find(|s| {
                        s.round == step.round
                            && names.get(&s.id).map(String::as_str) == Some(d)
                            && s.metric == canopy_proto::filters::v1::Metric::Exclusive
                    })
                    .and_then(|s| s.mean)
                    .unwrap_or_else(|| panic!("no {d} in round {}", step.round))
            })
            .sum();
        let truth_ns = workflow::latency_ns(SEED, step.step) as f64;
        let err = (step.latency_ns as f64 - truth_ns).abs() / truth_ns;
        assert!(
            err < 0.01,
            "step {}: {} ns against {truth_ns} ns",
            step.step,
            step.latency_ns
        );
        let transfer_us = step.latency_ns as f64 / 1000.0 - driver_us;
        assert!(
            (1600.0..=2400.0).contains(&transfer_us),
            "step {}: {transfer_us} us beside the drivers",
            step.step
        );
        checked += 1;
    }
    assert!(
        checked as u64 >= LEARN - 10,
        "only {checked} steps measured in {LEARN} rounds"
    );

    // The selection names every driver and at most two other metrics, and predicts at least as well as all.
    let text = canopy_cli(&[
        "ctl",
        "select",
        "--frontend",
        &fe_addr,
        "--rounds",
        &LEARN.to_string(),
    ]);
    eprintln!("{text}");
    let json: serde_json::Value = serde_json::from_str(&canopy_cli(&[
        "ctl",
        "select",
        "--frontend",
        &fe_addr,
        "--rounds",
        &LEARN.to_string(),
        "--apply",
        "--json",
    ]))
    .unwrap();
    let chosen = selected(&json);
    for (app, driver) in [
        ("bonds", "bonds_read_input"),
        ("csym", "csym_read_input"),
        ("csym", "csym_compute_send"),
    ] {
        assert!(
            chosen.iter().any(|(a, e, _)| a == app && e == driver),
            "{app}: {driver} not chosen: {chosen:?}"
        );
    }
    let others = chosen
        .iter()
        .filter(|(_, e, _)| {
            !["bonds_read_input", "csym_read_input", "csym_compute_send"].contains(&e.as_str())
        })
        .count();
    assert!(
        others <= 2,
        "more than two metrics beside the drivers: {chosen:?}"
    );
    let error = |k: &str| json[k].as_f64().unwrap_or(0.0);
    assert!(
        error("errorSelected") <= error("errorAll"),
        "the chosen predict worse than all: {json}"
    );
    assert!(json["observations"].as_u64().unwrap() >= LEARN - 10, "{json}");
    assert_eq!(json["applied"].as_array().unwrap().len(), 3, "{json}");

    // Applied: from the ranks' next dump on, far fewer bytes reach the front-end, and the steps go on.
    // Rounds still in flight as it was applied carry the rest: weigh from the first round without the simulation.
    let applied_at = last_round(&store, "stats").unwrap();
    wait_for("the options in force", Duration::from_secs(30), || {
        let rows = reader(&store)
            .stats(
                Select::all()
                    .stream(stats_stream.stream_id)
                    .from_round(applied_at),
            )
            .unwrap();
        let mut lammps_in = std::collections::BTreeMap::<u64, bool>::new();
        for s in &rows {
            *lammps_in.entry(s.round).or_default() |= s.app.as_deref() == Some("lammps");
        }
        lammps_in.values().any(|with| !with)
    });
    let after = bytes_per_round(&store, 40);
    eprintln!(
        "result bytes per round: {before:.0} before, {after:.0} after ({:.1}% less)",
        100.0 * (1.0 - after / before)
    );
    assert!(
        after <= 0.5 * before,
        "{after} bytes per round after, {before} before"
    );
    let late = last_round(&store, "latency").unwrap();
    let recent = |stream: u32, rounds: u64| {
        Select::all()
            .stream(stream)
            .from_round(late.saturating_sub(rounds))
    };
    let steps = reader(&store)
        .latency(recent(latency_stream.stream_id, 10))
        .unwrap();
    assert!(
        steps.len() >= 5,
        "steps stopped being measured after the selection: {steps:?}"
    );
    let kept = reader(&store).stats(recent(stats_stream.stream_id, 5)).unwrap();
    assert!(
        kept.iter().all(|s| s.app.as_deref() != Some("lammps")
            && names
                .get(&s.id)
                .is_some_and(|n| chosen.iter().any(|(_, e, _)| e == n))),
        "metrics not chosen are still reported"
    );
}

/// The (application, event) pairs a logged selection chose, from its `chosen=` field.
fn chosen_in(line: &str) -> Vec<(String, String)> {
    let chosen = line
        .split_once("chosen=")
        .and_then(|(_, rest)| rest.split_once(" observations="))
        .map(|(chosen, _)| chosen)
        .unwrap_or_else(|| panic!("no chosen field in {line}"));
    chosen
        .split(", ")
        .map(|c| {
            let (app, rest) = c.split_once(": ").unwrap();
            let (event, _metric) = rest.rsplit_once(' ').unwrap();
            (app.to_string(), event.to_string())
        })
        .collect()
}

/// With `select_every_rounds` and `select_apply`, the front-end selects by itself and narrows collection to what
/// it chose; at the next tick it widens collection again, and selects anew from the rounds after.
#[test]
#[allow(
    clippy::disallowed_methods,
    reason = "a synchronous poll of other processes' store and log; no runtime worker is blocked"
)]
fn a_selection_on_a_timer_applies_itself_and_widens_to_learn_again() {
    let dir = tempfile::tempdir().unwrap();
    let (fe, fe_addr, store) = start_frontend(
        dir.path(),
        &[
            "--streams",
            "stats,latency",
            "--expect-ranks",
            "6",
            "--select-every-rounds",
            "220",
            "--select-rounds",
            "200",
            "--select-apply",
            "true",
        ],
    );
    let _agents = [
        workflow_agent(dir.path(), "sim", &fe_addr, "lammps", 4, 0, 4),
        workflow_agent(dir.path(), "bonds", &fe_addr, "bonds", 1, 0, 1),
        workflow_agent(dir.path(), "csym", &fe_addr, "csym", 1, 0, 1),
    ];
    // Each stored round's (application, event) pairs.
    let reported = |from: u64| {
        let r = reader(&store);
        let names = names_of(&store);
        let stats = stream_of(&store, "stats").unwrap();
        let mut by_round: std::collections::BTreeMap<u64, std::collections::BTreeSet<(String, String)>> =
            Default::default();
        for s in r
            .stats(Select::all().stream(stats.stream_id).from_round(from))
            .unwrap()
        {
            by_round.entry(s.round).or_default().insert((
                s.app.unwrap_or_default(),
                names.get(&s.id).cloned().unwrap_or_default(),
            ));
        }
        by_round
    };
    let lines = |what: &str| -> Vec<String> {
        fe.log_text()
            .lines()
            .filter(|l| l.contains(what))
            .map(str::to_string)
            .collect()
    };
    // On a time-out, what the front-end said of its selections.
    let waiting = |what: &str, mut cond: Box<dyn FnMut() -> bool + '_>| {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while !cond() {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}; the front-end said:\n{}",
                lines("metric selection").join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    waiting(
        "the selection on its timer",
        Box::new(|| !lines("metric selection trigger").is_empty()),
    );
    let first = lines("metric selection trigger")[0].clone();
    assert!(
        first.contains("trigger=Timer") && first.contains("applied=true"),
        "{first}"
    );
    let chosen = chosen_in(&first);
    assert!(
        chosen.contains(&("bonds".into(), "bonds_read_input".into())),
        "{first}"
    );
    // From some round on, only what was chosen is reported (rounds in flight as it was applied still carry the
    // rest), and the simulation reports nothing unless something of it was chosen.
    let narrowed =
        |pairs: &std::collections::BTreeSet<(String, String)>| pairs.iter().all(|p| chosen.contains(p));
    waiting(
        "a round under the selection",
        Box::new(|| reported(0).values().any(&narrowed)),
    );
    // The next tick widens collection again: the simulation's events come back.
    waiting(
        "collection widened",
        Box::new(|| !lines("collection widened to learn again").is_empty()),
    );
    let widened_at = last_round(&store, "stats").unwrap();
    waiting(
        "the simulation reporting again",
        Box::new(|| {
            reported(widened_at)
                .values()
                .any(|pairs| pairs.iter().any(|(app, _)| app == "lammps") && !narrowed(pairs))
        }),
    );
    // 200 rounds later it selects again, from what came after the widening.
    wait_for(
        "the selection after the widening",
        Duration::from_secs(60),
        || lines("metric selection trigger").len() >= 2,
    );
    let second = lines("metric selection trigger")[1].clone();
    assert!(
        second.contains("trigger=Relearn") && second.contains("applied=true"),
        "{second}"
    );
}

#[test]
fn selection_refuses_clearly_without_the_streams_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let (_fe, fe_addr, _store) = start_frontend(dir.path(), &["--streams", "stats"]);
    let out = canopy_integration_tests::canopy_command()
        .args(["ctl", "select", "--frontend", &fe_addr])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("FailedPrecondition: metric selection: no latency stream: open one (canopy streams open latency) or name it"),
        "{err}"
    );
}
