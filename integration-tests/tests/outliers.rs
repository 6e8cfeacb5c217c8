//! The outliers filter in a real tree: `canopy up` over four agents under two relays, with two ranks planted three
//! times slower; every round the planted ranks are the top two outliers, per functional class too, and `canopy
//! report` and `canopy export` show them. Then real processes on a loaded node, scored with the defaults.

use std::path::Path;
use std::process::{Command, Output};

use canopy_integration_tests::{
    Select, assert_figure_drawn, bin_dir, browser_dom, build_c_program, ids_named, reader, start_frontend,
    start_socket_agent, wait_socket,
};
use canopy_proto::filters::v1::Metric;

/// The tests of this file one at a time: the loaded node's test measures what sixteen ranks do to two cores,
/// not what another test's tree adds.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn canopy(args: &[&str]) -> Output {
    Command::new(bin_dir().join("canopy"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = canopy(args);
    assert!(
        out.status.success(),
        "canopy {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn up(out_dir: &Path) {
    ok(&[
        "up",
        "--ranks",
        "32",
        "--agents",
        "4",
        "--fanout",
        "2",
        "--rounds",
        "6",
        "--period-ms",
        "20",
        "--plant",
        "5,22:3",
        "--filters",
        "outliers,classify",
        "--filter-params",
        r#"outliers={"k": 2}"#,
        "--quiet",
        "--insecure",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
}

#[test]
fn the_planted_slow_ranks_are_the_top_outliers_of_a_real_tree() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    up(&out_dir);
    let store = reader(&out_dir.join("latest.sqlite"));
    let streams = store.streams().unwrap();
    let outliers = streams.iter().find(|s| s.filter == "outliers").unwrap();
    let rows = store.outliers(Select::all().stream(outliers.stream_id)).unwrap();
    let rounds: std::collections::BTreeSet<u64> = rows.iter().map(|r| r.round).collect();
    assert_eq!(rounds.len(), 6, "{rows:#?}");
    for round in rounds {
        let top: Vec<_> = rows.iter().filter(|r| r.round == round).collect();
        let mut ranks: Vec<u32> = top.iter().map(|r| r.rank).collect();
        ranks.sort();
        assert_eq!(ranks, [5, 22], "round {round}: {top:#?}");
        assert!(
            top.iter()
                .all(|r| r.class_id == top[0].class_id && r.group_ranks == 32 && !r.late)
        );
        assert!(top[0].score >= top[1].score && top[1].score > 0.0);
    }
    // The events that weigh most in their scores are computation, which the plant slowed down.
    let names: std::collections::HashMap<u64, String> = store.names().unwrap().into_iter().collect();
    let events = store
        .outlier_events(Select::all().stream(outliers.stream_id))
        .unwrap();
    assert!(!events.is_empty());
    let first = events.iter().find(|e| e.event_position == 0).unwrap();
    assert!(first.value > first.mean && first.contribution > 0.0, "{first:?}");
    assert!(names.contains_key(&first.event_id), "{first:?}");

    // The report draws the section and its figure; the export writes both tables.
    let run = out_dir.to_str().unwrap();
    let page = dir.path().join("report.html");
    ok(&["report", run, "-o", page.to_str().unwrap()]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("Outliers: outliers"), "no outliers section");
    assert!(html.contains("scores of the top 2 ranks per round"));
    if let Some(dom) = browser_dom(&page) {
        assert_figure_drawn(&dom, "outliers:outliers", 6);
    }
    let png = dir.path().join("outliers.png");
    ok(&[
        "report",
        run,
        "--format",
        "png",
        "--figure",
        "outliers:outliers",
        "-o",
        png.to_str().unwrap(),
    ]);
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
    let csv_dir = dir.path().join("csv");
    ok(&[
        "export",
        run,
        "--format",
        "csv",
        "--table",
        "outliers,outlier_events",
        "--out",
        csv_dir.to_str().unwrap(),
    ]);
    let table = std::fs::read_to_string(csv_dir.join("outliers.csv")).unwrap();
    let mut lines = table.lines();
    assert_eq!(
        lines.next().unwrap(),
        "stream_id,stream,round,class_id,position,app,rank,score_std_devs,group_ranks,late"
    );
    assert_eq!(lines.count(), 12);
    let events = std::fs::read_to_string(csv_dir.join("outlier_events.csv")).unwrap();
    assert!(
        events
            .lines()
            .next()
            .unwrap()
            .contains("event,metric,unit,value,mean,std,contribution_std_devs")
    );
}

/// Each simulated application with ranks 5 and 40 of 64 planted three times slower, as README shows it: with its
/// defaults (`k` apart), `outliers` keeps the planted ranks as its top two in every round. In Uintah 97% of a
/// rank's time is in level-0 patch tasks of its own, and its boundary ranks send more bytes than the others:
/// when an event one rank reports took a share of the weight, and every distance within a deviation counted, the
/// bytes counter's ordinary spread put ranks 20, 1, 44 and 39 on top instead.
#[test]
fn with_its_defaults_outliers_finds_ranks_planted_slow_in_every_simulated_application() {
    let _serial = one_at_a_time();
    for scenario in ["flash", "uintah", "namd"] {
        let dir = tempfile::tempdir().unwrap();
        let out_dir = dir.path().join("out");
        ok(&[
            "up",
            "--scenario",
            scenario,
            "--ranks",
            "64",
            "--agents",
            "4",
            "--rounds",
            "10",
            "--period-ms",
            "20",
            "--plant",
            "5,40:3",
            "--filters",
            "outliers",
            "--filter-params",
            r#"outliers={"k": 2}"#,
            "--quiet",
            "--insecure",
            "--out",
            out_dir.to_str().unwrap(),
        ]);
        let rows = reader(&out_dir.join("latest.sqlite"))
            .outliers(Select::all())
            .unwrap();
        let rounds: std::collections::BTreeSet<u64> = rows.iter().map(|r| r.round).collect();
        assert_eq!(rounds.len(), 10, "{scenario}: {rows:#?}");
        for round in rounds {
            let mut top: Vec<u32> = rows.iter().filter(|r| r.round == round).map(|r| r.rank).collect();
            top.sort();
            assert_eq!(top, [5, 40], "{scenario}, round {round}");
        }
    }
}

/// With `within: class`, ranks are scored against their functional class: the planted ranks report the same
/// events as the others, so they are their class's top two.
#[test]
fn within_class_the_planted_ranks_top_their_class() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    ok(&[
        "up",
        "--ranks",
        "16",
        "--agents",
        "4",
        "--fanout",
        "2",
        "--rounds",
        "4",
        "--period-ms",
        "20",
        "--plant",
        "3,12:4",
        "--filters",
        "outliers",
        "--filter-params",
        r#"outliers={"k": 2, "within": "class"}"#,
        "--quiet",
        "--insecure",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let store = reader(&out_dir.join("latest.sqlite"));
    let rows = store.outliers(Select::all()).unwrap();
    assert!(!rows.is_empty());
    for round in 0..4 {
        let class_of = |rank: u32| {
            rows.iter()
                .find(|r| r.round == round && r.rank == rank)
                .map(|r| r.class_id)
        };
        for planted in [3, 12] {
            let class = class_of(planted)
                .unwrap_or_else(|| panic!("round {round}: rank {planted} not kept: {rows:#?}"));
            assert_ne!(class, 0);
            let top: Vec<u32> = rows
                .iter()
                .filter(|r| r.round == round && r.class_id == class && r.position == 0)
                .map(|r| r.rank)
                .collect();
            assert!(matches!(top[..], [3 | 12]), "round {round}: {top:?}");
        }
    }
}

/// Sixteen real processes on the machine's two cores, two of them (ranks 5 and 12) planted three times slower in
/// their main computation, beside small events whose times are mostly the machine's noise; 40 rounds, one every
/// 120 ms. The front-end opens `streams` (with `params`, each `NAME=JSON`) with every other key at its default.
/// Returns the run's store once the run has ended.
fn loaded_node(dir: &Path, streams: &str, params: &[&str]) -> std::path::PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("c/imbalance.c");
    let exe = build_c_program(dir, &source, "imbalance", false);
    let mut flags = vec!["--streams", streams, "--exit-on-fin", "true"];
    for p in params {
        flags.extend(["--stream-params", p]);
    }
    let (mut fe, addr, store) = start_frontend(dir, &flags);
    let socket = dir.join("agent.sock");
    let mut agent = start_socket_agent(dir, "agent-0", &addr, &socket);
    wait_socket(&socket, &mut agent);
    let rounds = LOADED_ROUNDS.to_string();
    let mut ranks: Vec<std::process::Child> = (0..LOADED_RANKS)
        .map(|r| {
            let factor = if PLANTED.contains(&r) { "3" } else { "1" };
            let log = std::fs::File::create(dir.join(format!("rank{r}.log"))).unwrap();
            Command::new(&exe)
                // 40 rounds, one every 120 ms; about 3.5 ms of computation a round (10 ms planted): together
                // about half of one of the two cores. A normal rank preempted once for a time slice in its
                // computation still takes less than a planted one.
                .args([rounds.as_str(), "120000", "2000", factor])
                .env("CANOPY_AGENT_SOCKET", &socket)
                .env("CANOPY_RANK", r.to_string())
                .env("CANOPY_NRANKS", LOADED_RANKS.to_string())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap()
        })
        .collect();
    for (r, child) in ranks.iter_mut().enumerate() {
        let status = child.wait().unwrap();
        let log = std::fs::read_to_string(dir.join(format!("rank{r}.log"))).unwrap_or_default();
        assert!(status.success(), "rank {r}: {status}\n{log}");
    }
    assert!(
        fe.wait_timeout(std::time::Duration::from_secs(30))
            .is_some_and(|s| s.success()),
        "the front-end did not finish:\n{}",
        fe.log_text()
    );
    store
}

const LOADED_RANKS: u32 = 16;
const LOADED_ROUNDS: usize = 40;
const PLANTED: [u32; 2] = [5, 12];

/// The rounds of 40 whose top two outliers are the planted ranks, and the others with their top two.
fn planted_top_two(store: &Path) -> (usize, Vec<(u64, Vec<u32>)>) {
    let rows = reader(store).outliers(Select::all()).unwrap();
    let mut found = 0;
    let mut missed = Vec::new();
    for round in 0..LOADED_ROUNDS as u64 {
        let mut top: Vec<u32> = rows
            .iter()
            .filter(|o| o.round == round && o.position < 2)
            .map(|o| o.rank)
            .collect();
        top.sort();
        if top == PLANTED {
            found += 1;
        } else {
            missed.push((round, top));
        }
    }
    (found, missed)
}

/// On the loaded node, with its defaults (every metric, each event weighted by its share, each rank's median over
/// a window of five rounds), `outliers` keeps the planted ranks as its top two in at least 90% of the rounds.
/// Scored the old way (unweighted, exclusive time alone, round by round), the noise of the sixteen 1 us copies
/// every rank makes outranks them: 1 to 3 rounds of 40.
#[test]
fn with_its_defaults_outliers_finds_planted_ranks_among_noisy_processes_on_a_loaded_node() {
    let _serial = one_at_a_time();
    const ROUNDS: usize = LOADED_ROUNDS;
    let dir = tempfile::tempdir().unwrap();
    let store = loaded_node(dir.path(), "outliers", &[r#"outliers={"k": 2}"#]);
    let rows = reader(&store).outliers(Select::all()).unwrap();
    let (found, missed) = planted_top_two(&store);
    eprintln!("planted ranks the top two in {found} of {ROUNDS} rounds; the others: {missed:?}");
    if std::env::var("DEBUG_OUTLIERS").is_ok() {
        let events = reader(&store).outlier_events(Select::all()).unwrap();
        let names: std::collections::HashMap<u64, String> =
            reader(&store).names().unwrap().into_iter().collect();
        for (round, _) in &missed {
            for o in rows.iter().filter(|o| o.round == *round) {
                let ev: Vec<String> = events
                    .iter()
                    .filter(|e| e.round == *round && e.position == o.position)
                    .map(|e| {
                        format!(
                            "{} {:?} v={:.1} m={:.1} s={:.2} c={:.3}",
                            names.get(&e.event_id).cloned().unwrap_or_default(),
                            e.metric,
                            e.value,
                            e.mean,
                            e.std,
                            e.contribution
                        )
                    })
                    .collect();
                eprintln!(
                    "round {round} pos {} rank {} score {:.3} ranks {}: {ev:?}",
                    o.position, o.rank, o.score, o.group_ranks
                );
            }
        }
    }
    assert!(
        found * 10 >= ROUNDS * 9,
        "the planted ranks were the top two in {found} of {ROUNDS} rounds; the others: {missed:?}"
    );
    // The scores are over time and calls, and the events that weigh most are the computation's time.
    let events = reader(&store).outlier_events(Select::all()).unwrap();
    let compute = ids_named(&store, "compute");
    let first: Vec<_> = events
        .iter()
        .filter(|e| e.event_position == 0 && e.position < 2)
        .collect();
    let timed = first
        .iter()
        .filter(|e| compute.contains(&e.event_id) && e.metric == Metric::Exclusive)
        .count();
    assert!(timed * 10 >= first.len() * 9, "{first:#?}");
}

/// Other work in bursts beside the ranks: `threads` threads, each spinning for 150 ms, then sleeping from 0 to
/// 990 ms (a pseudo-random draw of its own), until dropped. A rank preempted by a burst is slow in a round or two,
/// not in all of them.
struct Bursts {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Bursts {
    #[allow(clippy::disallowed_types, clippy::disallowed_methods)] // plain threads on the wall clock, no runtime
    fn start(threads: u64) -> Bursts {
        use std::sync::atomic::Ordering;
        use std::time::{Duration, Instant};
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..threads)
            .map(|t| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut draw = 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(t + 1);
                    while !stop.load(Ordering::Relaxed) {
                        let burst = Instant::now();
                        while burst.elapsed() < Duration::from_millis(150) {
                            std::hint::spin_loop();
                        }
                        draw = draw
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        std::thread::sleep(Duration::from_millis((draw >> 33) % 100 * 10));
                    }
                })
            })
            .collect();
        Bursts { stop, threads }
    }
}

impl Drop for Bursts {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The loaded node with four threads of other work in bursts beside the ranks: scored over its default window of
/// five rounds, `outliers` still keeps the planted ranks as its top two in at least 90% of the rounds, where
/// round by round (`"window": 1`) a normal rank caught by a burst outranks one of them in 4 to 15 rounds of 40
/// (`CANOPY_BURSTS_PARAMS='outliers={"k": 2, "window": 1}'` runs it so).
#[test]
fn with_its_default_window_outliers_finds_planted_ranks_through_bursts_of_other_work() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let params = std::env::var("CANOPY_BURSTS_PARAMS").unwrap_or_else(|_| r#"outliers={"k": 2}"#.to_string());
    let store = {
        let _bursts = Bursts::start(4);
        loaded_node(dir.path(), "outliers", &[params.as_str()])
    };
    let (found, missed) = planted_top_two(&store);
    eprintln!(
        "through bursts, planted ranks the top two in {found} of {LOADED_ROUNDS} rounds; the others: {missed:?}"
    );
    assert!(
        found * 10 >= LOADED_ROUNDS * 9,
        "through bursts, the planted ranks were the top two in {found} of {LOADED_ROUNDS} rounds; the others: \
         {missed:?}"
    );
}

/// The same loaded node clustered by `kmeans` with its defaults (k = 3 over every event's exclusive time): the
/// planted ranks are out of the bulk, the cluster of most ranks, in at least 90% of the rounds. They are not
/// always in clusters of their own: a normal rank the machine slowed in a round (preempted in its computation)
/// may share their cluster in that round, which is the fit of that round's data; the test prints how often. And
/// the front-end's default stream time-out (1 s) holds there: every round of the run is stored whole, none late.
#[test]
fn with_its_defaults_kmeans_sets_the_planted_ranks_apart_on_a_loaded_node() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let store = loaded_node(dir.path(), "kmeans", &[]);
    let clusters = reader(&store).clusters(Select::all()).unwrap();
    let (mut apart, mut alone) = (0, 0);
    let mut missed = Vec::new();
    for round in 0..LOADED_ROUNDS as u64 {
        let members: Vec<Vec<u32>> = clusters
            .iter()
            .filter(|c| c.round == round && c.size > 0)
            .map(|c| ranks_of(&c.ranks))
            .collect();
        let planted = |m: &Vec<u32>| m.iter().any(|r| PLANTED.contains(r));
        let bulk = members.iter().max_by_key(|m| m.len());
        if bulk.is_some_and(|b| b.len() > LOADED_RANKS as usize / 2 && !planted(b)) {
            apart += 1;
        } else {
            missed.push((round, members.clone()));
        }
        let with_planted: Vec<&Vec<u32>> = members.iter().filter(|m| planted(m)).collect();
        if with_planted.iter().all(|m| m.iter().all(|r| PLANTED.contains(r))) {
            alone += 1;
        }
    }
    eprintln!(
        "planted ranks out of the bulk in {apart} of {LOADED_ROUNDS} rounds, in clusters of their own in {alone}; \
         the others: {missed:?}"
    );
    assert!(
        apart * 10 >= LOADED_ROUNDS * 9,
        "the planted ranks were out of the bulk in {apart} of {LOADED_ROUNDS} rounds; the others: {missed:?}"
    );
    let rounds = canopy_integration_tests::read_rounds(&store);
    assert_eq!(rounds.len(), LOADED_ROUNDS, "{rounds:#?}");
    let short: Vec<_> = rounds
        .iter()
        .filter(|r| !r.is_full() || r.late_ranks > 0)
        .collect();
    assert!(short.is_empty(), "rounds not whole on time: {short:#?}");
}

/// The ranks of a stored cluster's compact ranges (`app:0-3,7`), sorted.
fn ranks_of(ranges: &str) -> Vec<u32> {
    let mut ranks: Vec<u32> = ranges
        .split(';')
        .filter_map(|part| part.rsplit_once(':').map(|(_, list)| list))
        .flat_map(|list| list.split(','))
        .filter(|r| !r.is_empty())
        .flat_map(|r| match r.split_once('-') {
            Some((a, b)) => a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap(),
            None => r.parse::<u32>().unwrap()..=r.parse::<u32>().unwrap(),
        })
        .collect();
    ranks.sort();
    ranks
}
