//! Filter plugins in running trees: a C filter built after the daemons started, and broken plugins, each
//! failing its stream with the node and the reason while every daemon and every other stream lives on.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::collections::HashMap;

use canopy_integration_tests::{
    Proc, Select, StoreReader, StreamState, Table, TreeBuilder, TreeSandbox, assert_eventually, canopy_cli,
    plugin_dir, reader, start_frontend, wait_for,
};
use canopy_proto::v1::{StreamSpec, SyncMode};
use prost::Message;

/// Compiles C source into `dir/libcanopy_filter_<name>.so` with the system's `cc`, against canopy_filter.h.
fn build_c_filter(dir: &Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../filters/abi/include");
    let out = dir.join(format!("libcanopy_filter_{name}.so"));
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .expect("cc runs");
    assert!(status.success(), "cc failed on {}", src.display());
    out
}

fn spec(name: &str, filter: &str, params: &str) -> StreamSpec {
    StreamSpec {
        stream_id: 0,
        name: name.into(),
        filter: filter.into(),
        params: params.into(),
        sync_mode: SyncMode::WaitForAll as i32,
        timeout_ms: 1000,
        ranks: String::new(),
        stages: Vec::new(),
        first_round: None,
    }
}

fn stream_state(store: &Path, name: &str) -> Option<(Option<StreamState>, Option<String>)> {
    let stream = StoreReader::open(store).ok()?.stream_named(name).ok()??;
    Some((stream.state, stream.failure))
}

fn rounds_of(store: &Path, select: Select) -> u64 {
    reader(store).count_where(Table::Rounds, select).unwrap()
}

async fn start(extra: Vec<PathBuf>) -> TreeSandbox {
    TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 32,
        rounds: 0,
        period_ms: 20,
        extra_filter_dirs: extra,
        ..TreeBuilder::default()
    }
    .start()
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_c_filter_built_after_the_tree_started_loads_into_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut tree = start(vec![dir.path().to_path_buf()]).await;
    let store = tree.store.clone();
    assert_eventually!(
        reader(&store).count(Table::Rounds).unwrap() >= 3,
        Duration::from_secs(20),
        "no rounds"
    );
    // Built now: after every daemon, relays included, is already running.
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../filters/examples/c/rankcount.c"),
    )
    .unwrap();
    build_c_filter(dir.path(), "rankcount", &source);
    assert!(tree.root.open_stream(spec("count", "rankcount", "")).await);
    assert_eventually!(
        reader(&store)
            .rounds(Select::all())
            .unwrap()
            .iter()
            .filter(|r| r.stream == "count")
            .count()
            >= 5,
        Duration::from_secs(20),
        "the C filter's stream delivered nothing: {:?}",
        stream_state(&store, "count")
    );
    tree.shutdown("frontend:0");
    tree.wait_frontend(Duration::from_secs(10)).await.unwrap();
    let stored = reader(&store);
    let covered: HashMap<(u32, u64), u32> = stored
        .rounds(Select::all())
        .unwrap()
        .iter()
        .filter(|d| d.stream == "count")
        .map(|d| ((d.stream_id, d.round), d.covered))
        .collect();
    let rows: Vec<(Vec<u8>, u32)> = stored
        .results(Select::all())
        .unwrap()
        .into_iter()
        .filter_map(|r| Some((r.payload, *covered.get(&(r.stream_id, r.round))?)))
        .collect();
    assert!(rows.len() >= 5);
    for (payload, covered) in rows {
        let count = canopy_proto::filters::v1::RankCount::decode(payload.as_slice()).unwrap();
        // Every rank the round covers was counted once, through two levels of relays.
        assert_eq!(count.ranks, u64::from(covered));
        assert!(count.bytes > 0);
    }
}

const NO_ENTRY: &str = r#"
int canopy_filter_something_else(void) { return 1; }
"#;

const OLD_ABI: &str = r#"
#include "canopy_filter.h"
static const canopy_filter_vtable VTABLE = { .abi_version = 999u, .name = "oldabi", .phases = 1 };
const canopy_filter_vtable *canopy_filter_entry(void) { return &VTABLE; }
"#;

/// Opens a stream on a running tree and waits for it to be marked failed; returns the reason.
async fn failure_of(tree: &TreeSandbox, name: &str, filter: &str, params: &str) -> String {
    assert!(tree.root.open_stream(spec(name, filter, params)).await);
    let store = tree.store.clone();
    assert_eventually!(
        stream_state(&store, name).is_some_and(|(state, _)| state == Some(StreamState::Failed)),
        Duration::from_secs(20),
        "stream {name} was not marked failed: {:?}",
        stream_state(&store, name)
    );
    stream_state(&store, name).unwrap().1.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_plugins_fail_their_stream_with_the_node_and_the_reason_and_the_tree_lives_on() {
    let dir = tempfile::tempdir().unwrap();
    build_c_filter(dir.path(), "noentry", NO_ENTRY);
    build_c_filter(dir.path(), "oldabi", OLD_ABI);
    let mut tree = start(vec![dir.path().to_path_buf()]).await;
    let store = tree.store.clone();
    assert_eventually!(
        reader(&store).count(Table::Rounds).unwrap() >= 3,
        Duration::from_secs(20),
        "no rounds"
    );

    let why = failure_of(&tree, "unknown", "nosuch", "").await;
    assert!(
        why.starts_with("node frontend:0: unknown filter \"nosuch\" (available: "),
        "{why}"
    );
    let why = failure_of(&tree, "noentry", "noentry", "").await;
    assert!(
        why.contains("node frontend:0") && why.contains("no canopy_filter_entry symbol: not a Canopy filter"),
        "{why}"
    );
    let why = failure_of(&tree, "oldabi", "oldabi", "").await;
    assert!(
        why.contains("ABI version 999 but this daemon speaks version 2"),
        "{why}"
    );
    let why = failure_of(&tree, "badparams", "passthrough", r#"{"bins": 4}"#).await;
    assert!(
        why.contains("filter passthrough: bad parameters: takes no parameters, got bins"),
        "{why}"
    );
    let why = failure_of(
        &tree,
        "panics-at-create",
        "faulty",
        r#"{"fault": "panic_create"}"#,
    )
    .await;
    assert!(
        why.contains("filter panicked: faulty: told to panic in create"),
        "{why}"
    );
    faults_fail_only_their_streams(&mut tree).await;
}

/// In a tree of 32 ranks whose stream 1 is healthy: a leaf that panics in its first round, leaves that emit
/// bytes the relays cannot read, and a root that panics in finalize each fail their own stream, naming the node;
/// every daemon lives on, stream 1 covering every rank round after round, and the front-end drains cleanly.
async fn faults_fail_only_their_streams(tree: &mut TreeSandbox) {
    let store = tree.store.clone();
    // Created everywhere, then a leaf panics in its first round: the agent names itself.
    let why = failure_of(tree, "panics", "faulty", r#"{"fault": "panic_upstream"}"#).await;
    assert!(
        why.starts_with("node agent:") && why.contains("filter panicked: faulty: told to panic in upstream"),
        "{why}"
    );
    // The leaves emit bytes the relays cannot read: the relay that got them names itself.
    let why = failure_of(tree, "garbage", "faulty", r#"{"fault": "garbage"}"#).await;
    assert!(
        why.starts_with("node relay:") && why.contains("packet from below does not decode"),
        "{why}"
    );
    let why = failure_of(
        tree,
        "panics-at-finalize",
        "faulty",
        r#"{"fault": "panic_finalize"}"#,
    )
    .await;
    assert!(
        why.starts_with("node frontend:0") && why.contains("told to panic in finalize"),
        "{why}"
    );

    // Every daemon lived: the first stream still covers every rank, round after round.
    let before = rounds_of(&store, Select::all().stream(1));
    assert_eventually!(
        rounds_of(&store, Select::all().stream(1)) >= before + 10,
        Duration::from_secs(20),
        "the healthy stream stopped"
    );
    let later = reader(&store)
        .rounds(Select::all().stream(1).from_round(before + 1))
        .unwrap();
    assert_eq!(later.iter().filter(|r| r.covered != 32).count(), 0);
    assert_eq!(
        reader(&store).stream(1).unwrap().and_then(|s| s.state),
        Some(StreamState::Open)
    );
    tree.shutdown("frontend:0");
    tree.wait_frontend(Duration::from_secs(10))
        .await
        .expect("the front-end drains and exits cleanly");
}

/// A plugin named in `inline_filters` runs on each node's own task, and its faults still fail only its stream:
/// a panic at a leaf, bytes a relay cannot read, a panic at the root's finalize.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_faulty_plugin_run_inline_fails_only_its_stream_and_the_tree_lives_on() {
    let mut tree = TreeBuilder {
        agents: 4,
        fanout: 2,
        ranks: 32,
        rounds: 0,
        period_ms: 20,
        inline_filters: vec!["passthrough".into(), "faulty".into()],
        ..TreeBuilder::default()
    }
    .start()
    .await;
    let store = tree.store.clone();
    assert_eventually!(
        reader(&store).count(Table::Rounds).unwrap() >= 3,
        Duration::from_secs(20),
        "no rounds"
    );
    // The healthy stream, inline too, still covers every rank, round after round.
    faults_fail_only_their_streams(&mut tree).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_phase_filter_refuses_a_dont_wait_stream() {
    let tree = start(vec![]).await;
    let mut s = spec("hist-nowait", "histogram", "");
    s.sync_mode = SyncMode::DontWait as i32;
    assert!(tree.root.open_stream(s).await);
    let store = tree.store.clone();
    assert_eventually!(
        stream_state(&store, "hist-nowait").is_some_and(|(state, _)| state == Some(StreamState::Failed)),
        Duration::from_secs(10),
        "not failed"
    );
    let why = stream_state(&store, "hist-nowait").unwrap().1.unwrap();
    assert!(
        why.contains("filter histogram has 3 phases and runs only in wait_for_all streams"),
        "{why}"
    );
    // The front-end's own validation says the same before anything starts.
    let out = std::process::Command::new(canopy_integration_tests::bin_dir().join("canopy-frontend"))
        .args([
            "validate",
            "--streams",
            "stats,histogram",
            "--sync-mode",
            "dont_wait",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("filter histogram has 3 phases"));
}

/// rankcount (filters/examples/c) renamed, with a fault hooked in front of one call at one level.
fn faulty_rankcount(name: &str, call: &str, level: &str, fault: &str) -> String {
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../filters/examples/c/rankcount.c"),
    )
    .unwrap();
    let (entry, params, args) = match call {
        "upstream" => (
            "static int rc_upstream(",
            "const canopy_bytes *inputs, size_t n, const canopy_emitter *out",
            "inputs, n, out",
        ),
        "finalize" => (
            "static int rc_finalize(",
            "canopy_bytes packet, const canopy_emitter *out",
            "packet, out",
        ),
        other => panic!("no hook for {other}"),
    };
    let hook = format!(
        "static volatile int *volatile nowhere;\n\
         static void fault(uint32_t level) {{ if (level == {level}) {{ {fault} }} }}\n\
         static int hooked_{call}(void *inst, uint64_t round, uint32_t phase, {params});\n\
         {entry}void *inst, uint64_t round, uint32_t phase, {params}) {{\n\
             fault(((struct rankcount *)inst)->level);\n\
             return hooked_{call}(inst, round, phase, {args});\n\
         }}\n\
         static int hooked_{call}("
    );
    format!("#include <unistd.h>\n{source}")
        .replacen(entry, &hook, 1)
        .replace("\"rankcount\"", &format!("\"{name}\""))
}

/// A daemon process of the contained tree, with the filter path and the call time-out every node gets.
fn contained(dir: &Path, bin: &str, label: &str, args: &[&str], filters: &[&str]) -> Proc {
    let args: Vec<&str> = args.iter().chain(filters).copied().collect();
    Proc::start(dir, bin, label, &args)
}

/// A relay of the contained tree, once it serves; returns it with its address.
fn contained_relay(dir: &Path, id: &str, parent: &str, filters: &[&str]) -> (Proc, String) {
    canopy_integration_tests::start_relay_with(dir, id, parent, "127.0.0.1:0", filters)
}

/// Real daemons, each its own process, with C plugins built here: one whose upstream loops for ever at the relays,
/// one that writes through NULL in upstream at the leaves, one that aborts in finalize at the root. Each is opened
/// beside a stats stream; each fails its stream alone, with the node and the reason, within the call time-out and
/// a second; stats loses no round and covers every rank in each; no daemon dies.
#[test]
#[allow(
    clippy::disallowed_types,
    reason = "a synchronous test of real processes, timed by the wall clock"
)]
fn c_plugins_that_hang_segfault_or_abort_in_real_daemons_fail_only_their_stream_and_stats_loses_no_round() {
    use std::time::Instant;
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("filters");
    std::fs::create_dir(&plugins).unwrap();
    let hang = "for (;;) { usleep(100000); }";
    let faults = [
        ("spins", "upstream", "CANOPY_LEVEL_RELAY", hang),
        ("segv", "upstream", "CANOPY_LEVEL_LEAF", "*nowhere = 1;"),
        ("aborts", "finalize", "CANOPY_LEVEL_ROOT", "abort();"),
    ];
    for (name, call, level, fault) in faults {
        build_c_filter(&plugins, name, &faulty_rankcount(name, call, level, fault));
    }
    let timeout = Duration::from_millis(1500);
    let path = format!("{}:{}", plugin_dir().display(), plugins.display());
    let timeout_ms = timeout.as_millis().to_string();
    let filters = [
        "--filter-path",
        path.as_str(),
        "--filter-call-timeout-ms",
        timeout_ms.as_str(),
    ];
    let fe_args: Vec<&str> = ["--streams", "stats", "--expect-ranks", "32"]
        .into_iter()
        .chain(filters)
        .collect();
    let (mut fe, addr, store) = start_frontend(dir.path(), &fe_args);
    let mut daemons = Vec::new();
    let mut relays = Vec::new();
    for r in 0..2 {
        let (relay, relay_addr) = contained_relay(dir.path(), &format!("relay:{r}"), &addr, &filters);
        daemons.push(relay);
        relays.push(relay_addr);
    }
    for a in 0..4u32 {
        let (id, offset) = (format!("agent:{a}"), (a * 8).to_string());
        let args = [
            "--node-id",
            &id,
            "--parent",
            &relays[a as usize / 2],
            "--socket",
            "none",
            "--simulate-ranks",
            "8",
            "--rank-offset",
            &offset,
            "--simulate-period-ms",
            "20",
        ];
        daemons.push(contained(dir.path(), "canopy-agent", &id, &args, &filters));
    }
    let stats = || rounds_of(&store, Select::all().stream(1));
    wait_for("stats rounds", Duration::from_secs(30), || stats() >= 3);
    let before = reader(&store)
        .rounds(Select::all().stream(1))
        .unwrap()
        .iter()
        .map(|r| r.round)
        .max()
        .unwrap();

    let expected = [
        ("spins", "node relay:", "filter spins: upstream call stuck for"),
        (
            "segv",
            "node agent:",
            "filter segv: upstream crashed with SIGSEGV (signal 11) in ",
        ),
        (
            "aborts",
            "node frontend",
            "filter aborts: finalize crashed with SIGABRT (signal 6) in ",
        ),
    ];
    for (name, node, reason) in expected {
        let opened = Instant::now();
        canopy_cli(&["streams", "open", name, "--name", name, "--frontend", &addr]);
        let failed = || stream_state(&store, name).is_some_and(|(s, _)| s == Some(StreamState::Failed));
        wait_for(&format!("stream {name} failed"), Duration::from_secs(30), failed);
        let took = opened.elapsed();
        let why = stream_state(&store, name).unwrap().1.unwrap_or_default();
        eprintln!("{name}: failed {took:?} after its open: {why}");
        assert!(why.starts_with(node) && why.contains(reason), "{name}: {why}");
        if name != "spins" {
            // The signal and the plugin that raised it.
            assert!(why.contains(&format!("libcanopy_filter_{name}.so")), "{why}");
        }
        assert!(
            took <= timeout + Duration::from_secs(1),
            "{name} failed after {took:?}: {why}"
        );
    }

    // No daemon died, and stats lost no round: every round from before the faults on is stored, whole.
    for d in daemons.iter_mut().chain([&mut fe]) {
        assert!(
            d.child.try_wait().unwrap().is_none(),
            "{} died:\n{}",
            d.name,
            d.log_text()
        );
    }
    let after = stats();
    wait_for("10 more stats rounds", Duration::from_secs(20), || {
        stats() >= after + 10
    });
    let rounds = reader(&store)
        .rounds(Select::all().stream(1).from_round(before))
        .unwrap();
    // The newest few may still be on their way.
    let last = rounds.iter().map(|r| r.round).max().unwrap() - 5;
    let rounds: Vec<_> = rounds.into_iter().filter(|r| r.round <= last).collect();
    let numbers: std::collections::BTreeSet<u64> = rounds.iter().map(|r| r.round).collect();
    assert_eq!(numbers.len() as u64, last - before + 1, "stats rounds missing");
    let partial: Vec<_> = rounds.iter().filter(|r| r.covered != 32).collect();
    assert!(partial.is_empty(), "stats rounds not whole: {partial:?}");
    assert_eq!(
        reader(&store).stream(1).unwrap().and_then(|s| s.state),
        Some(StreamState::Open)
    );
    // The front-end drains the tree and exits cleanly, the relay's stuck thread still running.
    fe.signal(nix::sys::signal::Signal::SIGTERM);
    let status = fe.wait_timeout(Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "front-end: {status:?}\n{}",
        fe.log_text()
    );
}

/// A relay whose one worker is held by an inline filter call that never returns still answers signals: the
/// watch names the call in its log, the first SIGTERM cannot drain it, and the second ends the process at once.
#[test]
fn a_relay_held_by_an_inline_call_that_never_returns_still_exits_on_a_second_signal() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("filters");
    std::fs::create_dir(&plugins).unwrap();
    let hang = "for (;;) { usleep(100000); }";
    build_c_filter(
        &plugins,
        "spins",
        &faulty_rankcount("spins", "upstream", "CANOPY_LEVEL_RELAY", hang),
    );
    let path = format!("{}:{}", plugin_dir().display(), plugins.display());
    let filters = ["--filter-path", path.as_str(), "--filter-call-timeout-ms", "300"];
    let fe_args: Vec<&str> = ["--streams", "spins"].into_iter().chain(filters).collect();
    let (mut fe, addr, _store) = start_frontend(dir.path(), &fe_args);
    let relay_args: Vec<&str> = filters
        .into_iter()
        .chain(["--inline-filters", "stats,spins"])
        .collect();
    let (mut relay, relay_addr) =
        canopy_integration_tests::start_relay_with(dir.path(), "relay:0", &addr, "127.0.0.1:0", &relay_args);
    let mut agent = canopy_integration_tests::SimAgent {
        id: "agent:0",
        parents: &relay_addr,
        ranks: 4,
        offset: 0,
        total: 4,
        period_ms: 20,
        rounds: 0,
    }
    .start_with(dir.path(), &filters);
    wait_for(
        "the inline call to be reported held",
        Duration::from_secs(30),
        || {
            relay
                .log_text()
                .contains("filter spins: upstream call running inline for")
        },
    );
    relay.signal(nix::sys::signal::Signal::SIGTERM);
    // Taken (two signals sent before the first is taken would be one).
    wait_for("the first signal taken", Duration::from_secs(10), || {
        relay.log_text().contains("terminated: shutting down")
    });
    assert!(
        relay.wait_timeout(Duration::from_millis(500)).is_none(),
        "the relay drained past a call that never returns:\n{}",
        relay.log_text()
    );
    relay.signal(nix::sys::signal::Signal::SIGTERM);
    let status = relay.wait_timeout(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| !s.success()),
        "relay: {status:?}\n{}",
        relay.log_text()
    );
    assert!(
        relay
            .log_text()
            .contains("canopy-relay: exiting at once: a second signal"),
        "{}",
        relay.log_text()
    );
    for p in [&mut agent, &mut fe] {
        p.signal(nix::sys::signal::Signal::SIGKILL);
    }
}
