//! The outliers filter in a real tree: `canopy up` over four agents under two relays, with two ranks planted three
//! times slower; every round the planted ranks are the top two outliers, per functional class too, and `canopy
//! report` and `canopy export` show them.

use std::path::Path;
use std::process::{Command, Output};

use canopy_integration_tests::{Select, assert_figure_drawn, bin_dir, browser_dom, reader};

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
        r#"outliers={"k": 2, "weighted": true}"#,
        "--quiet",
        "--insecure",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
}

#[test]
fn the_planted_slow_ranks_are_the_top_outliers_of_a_real_tree() {
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

/// With `within: class`, ranks are scored against their functional class: the planted ranks report the same
/// events as the others, so they are their class's top two.
#[test]
fn within_class_the_planted_ranks_top_their_class() {
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
