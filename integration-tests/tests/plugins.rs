//! Filter plugins in running trees: a C filter built after the daemons started, and broken plugins, each
//! failing its stream with the node and the reason while every daemon and every other stream lives on.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::collections::HashMap;

use canopy_integration_tests::{
    Select, StoreReader, StreamState, Table, TreeBuilder, TreeSandbox, assert_eventually, reader,
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
    // Created everywhere, then a leaf panics in its first round: the agent names itself.
    let why = failure_of(&tree, "panics", "faulty", r#"{"fault": "panic_upstream"}"#).await;
    assert!(
        why.starts_with("node agent:") && why.contains("filter panicked: faulty: told to panic in upstream"),
        "{why}"
    );
    // The leaves emit bytes the relays cannot read: the relay that got them names itself.
    let why = failure_of(&tree, "garbage", "faulty", r#"{"fault": "garbage"}"#).await;
    assert!(
        why.starts_with("node relay:") && why.contains("packet from below does not decode"),
        "{why}"
    );
    let why = failure_of(
        &tree,
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
