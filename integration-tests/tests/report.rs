//! `canopy report` and `canopy export` on a real run: `canopy up` with a stats, a histogram, a classify and a
//! node stream, then the report (its HTML read as text and as headless Chromium's DOM, a screenshot taken, one
//! figure as PNG) and the exports (CSV and Parquet read back and compared with the store, and with pandas when
//! it is installed); and the errors of bad input.
//!
//! The Chromium part needs chromium, which `.ci/run` installs and says so with CANOPY_CHROMIUM_TEST=1: then a
//! missing chromium fails the test. Elsewhere it prints why it cannot run and the rest of the test goes on.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use canopy_integration_tests::{
    assert_figures_drawn, bin_dir, browser_dom, polyline_points, python_with, reader, svg_figures,
};
use canopy_store::{Select, StoreReader, Word};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;

fn canopy(args: &[&str]) -> Output {
    Command::new(bin_dir().join("canopy"))
        .args(args)
        .output()
        .expect("canopy runs")
}

fn ok(args: &[&str]) -> String {
    let out = canopy(args);
    assert!(
        out.status.success(),
        "canopy {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `canopy ARGS` fails with a message holding every one of `words`.
fn fails(args: &[&str], words: &[&str]) {
    let out = canopy(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "canopy {args:?} succeeded");
    for w in words {
        assert!(stderr.contains(w), "canopy {args:?}: {w:?} not in {stderr}");
    }
}

/// A short run of 16 simulated Uintah ranks on two agents with four streams, classified by their level-1
/// patches (three classes); returns its directory (`canopy up --out`).
fn run(dir: &Path) -> PathBuf {
    let out_dir = dir.join("out");
    let out_s = out_dir.to_str().unwrap();
    ok(&[
        "up",
        "--scenario",
        "uintah",
        "--ranks",
        "16",
        "--agents",
        "2",
        "--rounds",
        "40",
        "--period-ms",
        "25",
        "--filters",
        "stats,histogram,classify,nodes",
        "--filter-params",
        r#"classify={"scheme":"pattern","pattern":"^Patch 1 ->"}"#,
        "--quiet",
        "--insecure",
        "--out",
        out_s,
    ]);
    out_dir
}

#[test]
fn a_real_run_reports_and_exports_what_its_store_holds() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = run(dir.path());
    let store = reader(&out_dir.join("latest.sqlite"));
    let streams: Vec<String> = store.streams().unwrap().into_iter().map(|s| s.name).collect();
    assert_eq!(streams, ["stats", "histogram", "classify", "nodes"]);

    let html = report(dir.path(), &out_dir);
    chromium(dir.path(), &html);
    png(dir.path(), &out_dir);
    let parquet_dir = export(dir.path(), &out_dir, "parquet");
    parquet_matches(&store, &parquet_dir);
    let csv_dir = export(dir.path(), &out_dir, "csv");
    csv_matches(&store, &csv_dir);
    pandas(&parquet_dir, &csv_dir, &store);
    documented_snippets(&parquet_dir, &csv_dir, &store);
}

/// docs/report.md's pandas snippet and DuckDB queries run unchanged (but for the paths of the run) on this
/// run's exports, and find its rows.
fn documented_snippets(parquet_dir: &Path, csv_dir: &Path, store: &StoreReader) {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/report.md")).unwrap();
    let block = |lang: &str| {
        doc.split(&format!("```{lang}\n"))
            .nth(1)
            .and_then(|b| b.split("```").next())
            .unwrap_or_else(|| panic!("docs/report.md has no {lang} block"))
            .replace(
                "canopy-out/run-1764000000-4242-parquet",
                parquet_dir.to_str().unwrap(),
            )
            .replace("canopy-out/run-1764000000-4242-csv", csv_dir.to_str().unwrap())
    };
    let events = store
        .stats(Select::all())
        .unwrap()
        .iter()
        .filter(|r| r.metric.word() == "exclusive" && r.class_id.is_none())
        .map(|r| r.id)
        .collect::<BTreeSet<u64>>()
        .len();
    let late = read_rounds_of(store)
        .iter()
        .filter(|r| r.covered < r.expected)
        .count();
    if let Some(python) = python_with(&["pandas", "pyarrow"]) {
        let script = block("python") + "\nprint(len(top), len(rounds), rounds.latency_ms.notna().all())\n";
        let out = Command::new(&python).args(["-c", &script]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{} {} True", events.min(8), read_rounds_of(store).len())
        );
    }
    if let Some(python) = python_with(&["duckdb"]) {
        let queries: Vec<String> = block("sql")
            .split(';')
            .map(str::trim)
            .filter(|q| {
                !q.lines()
                    .all(|l| l.trim().is_empty() || l.trim().starts_with("--"))
            })
            .map(str::to_string)
            .collect();
        assert_eq!(queries.len(), 2, "{queries:?}");
        let script =
            format!("import duckdb\nfor q in {queries:?}:\n    print(len(duckdb.sql(q).fetchall()))\n");
        let out = Command::new(&python).args(["-c", &script]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .collect::<Vec<_>>(),
            [events.min(8).to_string(), late.to_string()]
        );
    }
}

fn read_rounds_of(store: &StoreReader) -> Vec<canopy_store::RoundRow> {
    store.rounds(Select::all()).unwrap()
}

fn report(dir: &Path, out_dir: &Path) -> PathBuf {
    let page = dir.join("report.html");
    let said = ok(&[
        "report",
        out_dir.to_str().unwrap(),
        "-o",
        page.to_str().unwrap(),
        "--top",
        "5",
    ]);
    assert!(said.contains("report.html"), "{said}");
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: no script, nothing fetched; the only URL is the SVG namespace.
    assert!(!html.contains("<script"), "a script in the page");
    assert!(!html.contains("src="), "something fetched");
    let urls = html.matches("http").count();
    assert_eq!(
        urls,
        html.matches("http://www.w3.org/").count(),
        "a URL in the page"
    );
    // The summary: the tree by role, the ranks, the streams.
    for fact in [
        "<th>tree</th><td>2 agents, 1 frontend</td>",
        "<th>ranks</th><td>16</td>",
        "<th>streams</th><td>4</td>",
    ] {
        assert!(html.contains(fact), "{fact} not in the summary");
    }
    let figs = svg_figures(&html);
    for stream in ["stats", "histogram", "classify", "nodes"] {
        let svg = &figs[&format!("coverage:{stream}")];
        // Covered ranks as a band and the expected ranks as a line, a point per round.
        assert!(
            polyline_points(svg).contains(&40),
            "coverage:{stream}: {:?}",
            polyline_points(svg)
        );
    }
    // Stats: five events, each a mean line over its band, named; round 0 (the start-up) left out, so 39 rounds.
    let stats = &figs["stats:stats"];
    assert_eq!(
        polyline_points(stats).iter().filter(|n| **n == 39).count(),
        5,
        "{:?}",
        polyline_points(stats)
    );
    assert!(html.contains("<th>start-up</th><td>round 0 left out of the figure</td>"));
    assert!(stats.matches("<polygon").count() >= 5);
    assert!(stats.contains("exclusive time per rank (µs)"));
    let store = reader(&out_dir.join("latest.sqlite"));
    let names: HashMap<u64, String> = store.names().unwrap().into_iter().collect();
    let stats_rows = store.stats(Select::all().stream(1)).unwrap();
    let mut totals: HashMap<u64, f64> = HashMap::new();
    for r in stats_rows
        .iter()
        .filter(|r| r.metric.word() == "exclusive" && r.class_id.is_none() && r.round > 0)
    {
        *totals.entry(r.id).or_default() += r.mean.unwrap_or(0.0);
    }
    let top = totals
        .iter()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(id, _)| &names[id])
        .unwrap();
    assert!(
        stats.contains(&format!(">\n{}\n</text>", top.replace('>', "&gt;"))),
        "the top event {top} is not named"
    );
    // Histograms: a heat map per top event, a cell per bin and round (10 bins, 40 rounds).
    let heat: Vec<&String> = figs
        .iter()
        .filter(|(k, _)| k.starts_with("histogram:histogram:"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(heat.len(), 5, "{:?}", figs.keys());
    for svg in heat {
        assert!(
            svg.matches("<rect").count() >= 400,
            "{}",
            svg.matches("<rect").count()
        );
    }
    // Classes: a layer per class over the 40 rounds, each as the store has it.
    let classes = &figs["classes:classify"];
    let layers = store
        .classes(Select::all().stream(3))
        .unwrap()
        .iter()
        .map(|c| c.class_id)
        .collect::<BTreeSet<_>>()
        .len();
    assert!(layers > 1, "{layers} classes");
    let lines = polyline_points(classes);
    assert_eq!(lines.iter().filter(|n| **n == 40).count(), layers, "{lines:?}");
    assert!(classes.contains("ranks"));
    // Nodes: a line per agent's node.
    for part in ["cpu", "memory"] {
        let svg = &figs[&format!("nodes:nodes:{part}")];
        assert!(!polyline_points(svg).is_empty(), "nodes:nodes:{part}");
    }
    page
}

/// Why the Chromium check cannot run here, if it cannot; with CANOPY_CHROMIUM_TEST set, a missing chromium
/// fails instead.
fn chromium(dir: &Path, page: &Path) {
    let Some(dom) = browser_dom(page) else {
        return;
    };
    // The browser parsed every figure as SVG with its data over the 40 rounds.
    let figs = assert_figures_drawn(&dom, 40);
    assert!(figs.len() >= 4 + 1 + 5 + 1 + 2, "{figs:?}");
    assert_eq!(
        polyline_points(&svg_figures(&dom)["stats:stats"])
            .iter()
            .filter(|n| **n == 39)
            .count(),
        5
    );
    // Time per round, over the rounds after the first.
    assert!(polyline_points(&svg_figures(&dom)["iterations:stats"]).contains(&39));
    assert!(dom.contains("<section id=\"stats-1\""), "no stats section");
    for kind in ["histogram-2", "classes-3", "nodes-4", "coverage"] {
        assert!(
            dom.contains(&format!("<section id=\"{kind}\"")),
            "no {kind} section"
        );
    }
    let url = format!("file://{}", page.display());
    let headless = ["--headless", "--no-sandbox", "--disable-gpu"];
    let shot = dir.join("report.png");
    let out = Command::new("chromium")
        .args(headless)
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1200,900")
        .arg("--hide-scrollbars")
        .arg(&url)
        .output()
        .expect("chromium runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&shot).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
    // A blank page compresses to a few KB; the summary and the first figures do not.
    assert!(bytes.len() > 40_000, "screenshot of {} bytes", bytes.len());
    if let Some(keep) = std::env::var_os("CANOPY_REPORT_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }
}

fn png(dir: &Path, out_dir: &Path) {
    let path = dir.join("stats.png");
    let said = ok(&[
        "report",
        out_dir.to_str().unwrap(),
        "--format",
        "png",
        "--figure",
        "stats:stats",
        "-o",
        path.to_str().unwrap(),
    ]);
    assert!(said.contains("stats.png"), "{said}");
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
    assert!(bytes.len() > 10_000, "{} bytes", bytes.len());
    let run = out_dir.to_str().unwrap();
    fails(
        &["report", run, "--format", "png", "--figure", "stats:nope"],
        &[
            "no figure \"stats:nope\"",
            "stats:stats",
            "coverage:classify",
            "classes:classify",
        ],
    );
    fails(&["report", run, "--format", "png"], &["--figure", "stats:stats"]);
}

fn export(dir: &Path, out_dir: &Path, format: &str) -> PathBuf {
    let to = dir.join(format);
    let said = ok(&[
        "export",
        out_dir.to_str().unwrap(),
        "--format",
        format,
        // -o, as for the report (--out is kept too).
        "-o",
        to.to_str().unwrap(),
    ]);
    for table in [
        "streams",
        "rounds",
        "stats",
        "histograms",
        "classes",
        "reductions",
        "node_samples",
        "nodes",
    ] {
        assert!(to.join(format!("{table}.{format}")).is_file(), "{table}: {said}");
    }
    // A table the run has no rows in is left out.
    assert!(!to.join(format!("utilization.{format}")).exists(), "{said}");
    to
}

/// The rows of a Parquet file, each as its fields by column name.
fn parquet_rows(path: &Path) -> Vec<HashMap<String, Field>> {
    let file = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
    file.get_row_iter(None)
        .unwrap()
        .map(|r| {
            r.unwrap()
                .get_column_iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .collect()
}

fn long(f: &Field) -> i64 {
    match f {
        Field::Long(v) => *v,
        other => panic!("not an INT64: {other:?}"),
    }
}

fn string(f: &Field) -> String {
    match f {
        Field::Str(v) => v.clone(),
        other => panic!("not a string: {other:?}"),
    }
}

fn double(f: &Field) -> Option<f64> {
    match f {
        Field::Double(v) => Some(*v),
        Field::Null => None,
        other => panic!("not a DOUBLE: {other:?}"),
    }
}

fn parquet_matches(store: &StoreReader, dir: &Path) {
    let names: HashMap<u64, String> = store.names().unwrap().into_iter().collect();
    let streams: HashMap<u32, String> = store
        .streams()
        .unwrap()
        .into_iter()
        .map(|s| (s.stream_id, s.name))
        .collect();
    let stats = store.stats(Select::all()).unwrap();
    let rows = parquet_rows(&dir.join("stats.parquet"));
    assert_eq!(rows.len(), stats.len());
    for (row, want) in rows.iter().zip(&stats) {
        assert_eq!(long(&row["round"]), want.round as i64);
        assert_eq!(long(&row["event_id"]), want.id as i64);
        assert_eq!(string(&row["event"]), names[&want.id]);
        assert_eq!(string(&row["metric"]), want.metric.word());
        assert_eq!(string(&row["stream"]), streams[&want.stream_id]);
        assert_eq!(double(&row["mean"]), want.mean);
        assert_eq!(double(&row["max"]), want.max);
        assert_eq!(long(&row["count_ranks"]), want.count as i64);
        assert_eq!(
            (!matches!(row["app"], Field::Null)).then(|| string(&row["app"])),
            want.app
        );
    }
    // The unit column speaks the store's `units` words.
    assert!(rows.iter().any(|r| string(&r["unit"]) == "us"));
    let bins = store.histograms(Select::all()).unwrap();
    let rows = parquet_rows(&dir.join("histograms.parquet"));
    assert_eq!(rows.len(), bins.len());
    for (row, want) in rows.iter().zip(&bins) {
        assert_eq!(
            (long(&row["round"]), long(&row["bin"]), long(&row["count_ranks"])),
            (want.round as i64, i64::from(want.bin), want.count as i64)
        );
        assert_eq!(string(&row["event"]), names[&want.id]);
        assert_eq!((double(&row["lo"]), double(&row["hi"])), (want.lo, want.hi));
    }
    let classes = store.classes(Select::all()).unwrap();
    let rows = parquet_rows(&dir.join("classes.parquet"));
    assert_eq!(rows.len(), classes.len());
    for (row, want) in rows.iter().zip(&classes) {
        assert_eq!(long(&row["class_id"]), want.class_id as i64);
        assert_eq!(long(&row["size_ranks"]), want.size as i64);
        assert_eq!(string(&row["ranks"]), want.ranks);
    }
    let rounds = store.rounds(Select::all()).unwrap();
    let rows = parquet_rows(&dir.join("rounds.parquet"));
    assert_eq!(rows.len(), rounds.len());
    for (row, want) in rows.iter().zip(&rounds) {
        assert_eq!(string(&row["stream"]), want.stream);
        assert_eq!(long(&row["covered_ranks"]), i64::from(want.covered));
        assert_eq!(long(&row["expected_ranks"]), i64::from(want.expected));
        assert_eq!(long(&row["missing_lost_ranks"]), 0);
    }
    let samples = store.node_samples(Select::all()).unwrap();
    let rows = parquet_rows(&dir.join("node_samples.parquet"));
    assert_eq!(rows.len(), samples.len());
    let hosts: BTreeSet<String> = rows.iter().map(|r| string(&r["node_id"])).collect();
    assert_eq!(hosts.len(), 2, "{hosts:?}");
}

fn csv_matches(store: &StoreReader, dir: &Path) {
    let names: HashMap<u64, String> = store.names().unwrap().into_iter().collect();
    let stats = store.stats(Select::all()).unwrap();
    let mut csv = csv::Reader::from_path(dir.join("stats.csv")).unwrap();
    let header: Vec<String> = csv.headers().unwrap().iter().map(str::to_string).collect();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let (round, event_id, event, mean, std) = (
        col("round"),
        col("event_id"),
        col("event"),
        col("mean"),
        col("std"),
    );
    let records: Vec<csv::StringRecord> = csv.records().map(Result::unwrap).collect();
    assert_eq!(records.len(), stats.len());
    for (rec, want) in records.iter().zip(&stats) {
        assert_eq!(rec[round].parse::<u64>().unwrap(), want.round);
        assert_eq!(rec[event_id].parse::<i64>().unwrap(), want.id as i64);
        assert_eq!(rec[event], names[&want.id]);
        // Floats are written in a form that reads back to the same value.
        assert_eq!(rec[mean].parse::<f64>().ok(), want.mean);
        assert_eq!(rec[std].parse::<f64>().ok(), want.std);
    }
    let rounds = store.rounds(Select::all()).unwrap();
    let mut csv = csv::Reader::from_path(dir.join("rounds.csv")).unwrap();
    let header = csv.headers().unwrap().clone();
    for reason in ["late", "lost", "stopped", "dropped", "absent"] {
        let name = format!("missing_{reason}_ranks");
        assert!(header.iter().any(|h| h == name), "{name}");
    }
    assert_eq!(csv.records().count(), rounds.len());
}

/// pandas reads both exports with the store's rows and names, when pandas and pyarrow are installed.
fn pandas(parquet_dir: &Path, csv_dir: &Path, store: &StoreReader) {
    let Some(python) = python_with(&["pandas", "pyarrow"]) else {
        return;
    };
    let script = format!(
        "import pandas as pd\n\
         p = pd.read_parquet({:?})\n\
         c = pd.read_csv({:?})\n\
         assert list(p.columns) == list(c.columns), (list(p.columns), list(c.columns))\n\
         assert str(p['mean'].dtype) == 'float64' and str(p['round'].dtype) == 'int64', p.dtypes\n\
         assert (p['event'] == c['event']).all()\n\
         print(len(p), len(c), p.loc[p['metric'] == 'exclusive', 'event'].nunique())\n",
        parquet_dir.join("stats.parquet"),
        csv_dir.join("stats.csv")
    );
    let out = Command::new(&python).args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stats = store.stats(Select::all()).unwrap();
    let events: BTreeSet<u64> = stats
        .iter()
        .filter(|r| r.metric.word() == "exclusive")
        .map(|r| r.id)
        .collect();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{} {} {}", stats.len(), stats.len(), events.len())
    );
}

#[test]
fn bad_input_is_refused_with_the_thing_and_the_choices_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-run.sqlite");
    let missing = missing.to_str().unwrap();
    for cmd in [&["report", missing][..], &["export", missing, "--format", "csv"]] {
        fails(cmd, &[missing, "does not exist", "latest.sqlite"]);
    }
    let text = dir.path().join("notes.sqlite");
    std::fs::write(&text, "these are not rounds\n".repeat(100)).unwrap();
    let text = text.to_str().unwrap();
    for cmd in [&["report", text][..], &["export", text, "--format", "parquet"]] {
        fails(cmd, &[text, "is not a Canopy run store"]);
    }
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    fails(&["report", empty.to_str().unwrap()], &["holds no Canopy run"]);
    fails(
        &["export", text, "--format", "csv", "--table", "stats,bogus"],
        &[
            "unknown table \"bogus\"",
            "stats, stats_quantiles, histograms, classes",
            "node_samples",
        ],
    );
    fails(&["export", text, "--format", "xml"], &["xml", "csv", "parquet"]);
    fails(
        &["report", text, "--figure", "stats:x"],
        &["--figure", "--format png"],
    );
}

#[test]
fn a_utilization_run_reports_each_activity_share_and_exports_its_names() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    ok(&[
        "up",
        "--scenario",
        "namd",
        "--ranks",
        "8",
        "--agents",
        "2",
        "--rounds",
        "8",
        "--period-ms",
        "100",
        "--filters",
        "utilization",
        "--quiet",
        "--insecure",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let page = dir.path().join("util.html");
    ok(&["report", out_dir.to_str().unwrap(), "-o", page.to_str().unwrap()]);
    let html = std::fs::read_to_string(&page).unwrap();
    let svg = &svg_figures(&html)["utilization:utilization"];
    if let Some(dom) = browser_dom(&page) {
        assert_figures_drawn(&dom, 8);
    }
    // A layer per activity (at most eight, and the rest), each a line over the 8 rounds.
    let layers = polyline_points(svg).into_iter().filter(|n| *n == 8).count();
    let store = reader(&out_dir.join("latest.sqlite"));
    let rows = store.utilization(Select::all()).unwrap();
    let activities: BTreeSet<u64> = rows.iter().map(|r| r.activity_id).collect();
    assert_eq!(layers, activities.len().min(9), "{activities:?}");
    assert!(svg.contains("share of the round (%)"));
    let names: HashMap<u64, String> = store.names().unwrap().into_iter().collect();
    let busiest = rows.iter().max_by_key(|r| r.share).unwrap().activity_id;
    let name = names.get(&busiest).map_or("other", String::as_str);
    assert!(
        svg.contains(&format!(">\n{name}\n</text>")),
        "{name} is not named"
    );

    let csv_dir = dir.path().join("csv");
    ok(&[
        "export",
        out_dir.to_str().unwrap(),
        "--format",
        "csv",
        "--table",
        "utilization",
        "--out",
        csv_dir.to_str().unwrap(),
    ]);
    let files: Vec<_> = std::fs::read_dir(&csv_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(files, ["utilization.csv"], "only the table asked for");
    let mut csv = csv::Reader::from_path(csv_dir.join("utilization.csv")).unwrap();
    let records: Vec<csv::StringRecord> = csv.records().map(Result::unwrap).collect();
    assert_eq!(records.len(), rows.len());
    for (rec, want) in records.iter().zip(&rows) {
        // activity, share_of_250, share_pct
        let want_name = names.get(&want.activity_id).map_or("other", String::as_str);
        assert_eq!(&rec[6], want_name);
        assert_eq!(rec[7].parse::<u32>().unwrap(), want.share);
        assert_eq!(rec[8].parse::<f64>().unwrap(), f64::from(want.share) / 2.5);
    }
}

#[test]
fn a_run_without_rounds_reports_an_empty_page_and_names_no_figures() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    drop(canopy_store::Store::create(&runs).unwrap());
    let page = dir.path().join("empty.html");
    ok(&["report", runs.to_str().unwrap(), "-o", page.to_str().unwrap()]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("<th>rounds</th><td>0 stored, 0 at full coverage</td>"),
        "{html}"
    );
    assert!(html.contains("Nothing to draw"), "{html}");
    fails(
        &[
            "report",
            runs.to_str().unwrap(),
            "--format",
            "png",
            "--figure",
            "stats:x",
        ],
        &["no figure \"stats:x\"", "none (the run stored no rounds)"],
    );
    let out = dir.path().join("parquet");
    ok(&[
        "export",
        runs.to_str().unwrap(),
        "--format",
        "parquet",
        "--out",
        out.to_str().unwrap(),
    ]);
    // streams and rounds always, empty but with their columns.
    let rounds = SerializedFileReader::new(File::open(out.join("rounds.parquet")).unwrap()).unwrap();
    assert_eq!(rounds.metadata().file_metadata().num_rows(), 0);
    let columns = rounds.metadata().file_metadata().schema_descr().num_columns();
    assert_eq!(columns, 5 + 11 + 7, "round columns");
    assert!(out.join("streams.parquet").is_file());
}

#[test]
fn coverage_shows_each_missing_reason_as_the_rounds_table_counts_it() {
    use canopy_proto::v1::{MissingReason, StreamSpec, SyncMode};
    use canopy_store::{Payload, RoundRecord, StreamState};

    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let mut store = canopy_store::Store::create(&runs).unwrap();
    let spec = StreamSpec {
        stream_id: 1,
        name: "lossy".into(),
        filter: "passthrough".into(),
        params: String::new(),
        sync_mode: SyncMode::WaitForAll as i32,
        timeout_ms: 100,
        ranks: String::new(),
        stages: Vec::new(),
        first_round: Some(0),
    };
    store.put_stream(&spec, StreamState::Open, None, None).unwrap();
    // 16 ranks; from round 10 on an agent of 4 ranks is lost, and in rounds 20..25 two more are late.
    for round in 0..30u64 {
        let mut missing = Vec::new();
        if round >= 10 {
            missing.push((MissingReason::Lost, 4));
        }
        if (20..25).contains(&round) {
            missing.push((MissingReason::Late, 2));
        }
        let absent: u32 = missing.iter().map(|(_, n)| n).sum();
        let rec = RoundRecord {
            stream_id: 1,
            stream_name: "lossy".into(),
            round,
            covered: 16 - absent,
            expected: 16,
            missing,
            first_dump_unix_ns: 0,
            closed_unix_ns: 0,
            apps: vec![],
            unreachable: vec![],
        };
        store.write_round(&rec, Payload::None).unwrap();
    }
    drop(store);
    let page = dir.path().join("lossy.html");
    ok(&["report", runs.to_str().unwrap(), "-o", page.to_str().unwrap()]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("30 rounds, 10 at full coverage; missing ranks: late: 10, lost: 80"),
        "{html}"
    );
    let svg = &svg_figures(&html)["coverage:lossy"];
    // Covered, lost, late: a layer each, stacked to the expected line, all named.
    for layer in ["covered", "missing: lost", "missing: late", "expected"] {
        assert!(svg.contains(&format!(">\n{layer}\n</text>")), "{layer}");
    }
    assert_eq!(
        polyline_points(svg).iter().filter(|n| **n == 30).count(),
        4,
        "{:?}",
        polyline_points(svg)
    );
    let out = dir.path().join("csv");
    ok(&[
        "export",
        runs.to_str().unwrap(),
        "--format",
        "csv",
        "--table",
        "rounds",
        "--out",
        out.to_str().unwrap(),
    ]);
    let mut csv = csv::Reader::from_path(out.join("rounds.csv")).unwrap();
    let header = csv.headers().unwrap().clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let (lost, late, reason) = (
        col("missing_lost_ranks"),
        col("missing_late_ranks"),
        col("missing_reason"),
    );
    let rows: Vec<csv::StringRecord> = csv.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 30);
    assert_eq!((&rows[0][lost], &rows[0][reason]), ("0", ""));
    assert_eq!((&rows[22][lost], &rows[22][late]), ("4", "2"));
    assert_eq!(&rows[22][reason], "lost: 4, late: 2");
}
