//! Every daemon's metrics endpoint (`--metrics-listen`), scraped from real processes: OpenMetrics text that
//! parses, series labelled with the node, counters that agree with the run's store, and `/health`.

use std::collections::HashMap;
use std::time::Duration;

use canopy_integration_tests::{
    Proc, frontend_ready, http_get, reader, start_frontend, unused_addr, wait_for, wait_ready_file,
};
use canopy_proto::v1::MissingReason;
use canopy_store::{Select, Table};

/// `GET path` on `addr`: the status code and the body; a scrape of `/metrics` is OpenMetrics text.
fn get(addr: &str, path: &str) -> (u16, String) {
    let (code, head, body) = http_get(addr, path);
    assert!(
        code != 200 || path != "/metrics" || head.contains("application/openmetrics-text"),
        "{head}"
    );
    (code, body)
}

/// The samples of an OpenMetrics text exposition, by series (`name{labels}`), after checking its grammar: every
/// sample belongs to a family declared by `# TYPE` before it, names and labels are well formed, values are
/// numbers, and the text ends with `# EOF`.
fn parse(text: &str) -> HashMap<String, f64> {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = HashMap::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "{text}");
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !n.starts_with(|c: char| c.is_ascii_digit())
    };
    for line in &lines[..lines.len() - 1] {
        if let Some(meta) = line.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let (kind, name, rest) = (parts.next().unwrap(), parts.next().unwrap(), parts.next());
            assert!(name_ok(name), "{line}");
            match kind {
                "TYPE" => {
                    let t = rest.unwrap();
                    assert!(["counter", "gauge", "info", "unknown"].contains(&t), "{line}");
                    types.insert(name.to_string(), t.to_string());
                }
                "HELP" | "UNIT" => {}
                _ => panic!("unknown metadata: {line}"),
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
        let value: f64 = value.parse().unwrap_or_else(|e| panic!("{line}: {e}"));
        let name = series.split('{').next().unwrap();
        assert!(name_ok(name), "{line}");
        let labels = &series[name.len()..];
        if !labels.is_empty() {
            let inner = labels
                .strip_prefix('{')
                .and_then(|l| l.strip_suffix('}'))
                .unwrap_or_else(|| panic!("{line}"));
            for pair in inner.split(',') {
                let (k, v) = pair.split_once('=').unwrap_or_else(|| panic!("{line}"));
                assert!(name_ok(k) && v.starts_with('"') && v.ends_with('"'), "{line}");
            }
        }
        let family = name.strip_suffix("_total").unwrap_or(name);
        let t = types
            .get(family)
            .or_else(|| types.get(name))
            .unwrap_or_else(|| panic!("no TYPE before {line}"));
        if t == "counter" {
            assert!(
                name.ends_with("_total"),
                "a counter's sample ends in _total: {line}"
            );
        }
        samples.insert(series.to_string(), value);
    }
    samples
}

/// The value of `name` labelled with `node`.
fn value(samples: &HashMap<String, f64>, name: &str, node: &str, role: &str) -> f64 {
    let key = format!("{name}{{node=\"{node}\",role=\"{role}\"}}");
    *samples
        .get(&key)
        .unwrap_or_else(|| panic!("{key} not in {:#?}", samples.keys()))
}

#[test]
fn every_daemon_serves_metrics_that_agree_with_the_store() {
    const ROUNDS: u64 = 12;
    let dir = tempfile::tempdir().unwrap();
    let (mut fe, fe_addr, store) = start_frontend(
        dir.path(),
        &[
            "--expect-ranks",
            "16",
            "--streams",
            "stats,histogram",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let fe_metrics = frontend_ready(dir.path())
        .metrics
        .expect("a metrics address in the front-end's ready file")
        .to_string();
    let relay_metrics = unused_addr();
    let ready = dir.path().join("relay.ready");
    let mut relay = Proc::start(
        dir.path(),
        "canopy-relay",
        "relay-0",
        &[
            "--node-id",
            "relay-0",
            "--parent",
            &fe_addr,
            "--listen",
            "127.0.0.1:0",
            "--ready-file",
            ready.to_str().unwrap(),
            "--metrics-listen",
            &relay_metrics,
        ],
    );
    let relay_addr = wait_ready_file(&ready, &mut relay).addr.to_string();
    let agent_metrics = [unused_addr(), unused_addr()];
    let rounds = ROUNDS.to_string();
    let _agents: Vec<Proc> = (0..2)
        .map(|i| {
            let (id, offset) = (format!("agent-{i}"), (8 * i).to_string());
            Proc::start(
                dir.path(),
                "canopy-agent",
                &id,
                &[
                    "--node-id",
                    &id,
                    "--parent",
                    &relay_addr,
                    "--socket",
                    "none",
                    "--simulate-ranks",
                    "8",
                    "--rank-offset",
                    &offset,
                    "--total-ranks",
                    "16",
                    "--simulate-period-ms",
                    "20",
                    "--rounds",
                    &rounds,
                    "--metrics-listen",
                    &agent_metrics[i],
                ],
            )
        })
        .collect();

    // While the tree runs: every endpoint parses and says the node serves.
    wait_for("the agents' endpoints", Duration::from_secs(20), || {
        agent_metrics
            .iter()
            .all(|a| std::net::TcpStream::connect(a).is_ok())
    });
    for (addr, node, role) in [
        (fe_metrics.as_str(), "frontend", "frontend"),
        (relay_metrics.as_str(), "relay-0", "relay"),
        (agent_metrics[0].as_str(), "agent-0", "agent"),
        (agent_metrics[1].as_str(), "agent-1", "agent"),
    ] {
        let (code, body) = get(addr, "/health");
        assert_eq!((code, body.as_str()), (200, "serving\n"), "{node}");
        let samples = parse(&get(addr, "/metrics").1);
        assert_eq!(value(&samples, "canopy_finished", node, role), 0.0, "{node}");
    }

    // Once the store holds every round, each node's counters reach the same figure at the next status tick.
    // Two streams, one of two phases: each round is a `rounds` row per stream, and counts once at every node.
    wait_for("every round stored", Duration::from_secs(30), || {
        reader(&store).count(Table::Rounds).unwrap_or(0) == 2 * ROUNDS
    });
    let rows = reader(&store).count_where(Table::Rounds, Select::all()).unwrap();
    assert_eq!(rows, 2 * ROUNDS);
    let stored = ROUNDS;
    let full = reader(&store)
        .rounds(Select::all())
        .unwrap()
        .iter()
        .filter(|r| r.covered == 16)
        .count() as f64;
    let scrape = |addr: &str| parse(&get(addr, "/metrics").1);
    wait_for("the root's status tick", Duration::from_secs(5), || {
        value(
            &scrape(&fe_metrics),
            "canopy_rounds_closed_total",
            "frontend",
            "frontend",
        ) == stored as f64
    });
    let fe_samples = scrape(&fe_metrics);
    assert_eq!(
        value(&fe_samples, "canopy_rounds_partial_total", "frontend", "frontend"),
        rows as f64 - full
    );
    assert_eq!(
        value(&fe_samples, "canopy_ranks_below", "frontend", "frontend"),
        16.0
    );
    assert_eq!(
        value(&fe_samples, "canopy_malformed_total", "frontend", "frontend"),
        0.0
    );
    assert!(value(&fe_samples, "canopy_received_bytes_total", "frontend", "frontend") > 0.0);
    assert!(
        fe_samples
            .keys()
            .any(|k| k.starts_with("canopy_filter_calls_total{")
                && k.contains("stream=\"1\"")
                && k.contains("stream_name=\"stats\""))
    );
    // Rank-rounds covered and missing by reason, as the store's rows count them.
    let stored_rows = reader(&store).rounds(Select::all()).unwrap();
    let covered: u64 = stored_rows.iter().map(|r| u64::from(r.covered)).sum();
    assert_eq!(
        value(
            &fe_samples,
            "canopy_rank_rounds_covered_total",
            "frontend",
            "frontend"
        ),
        covered as f64
    );
    for reason in [MissingReason::Late, MissingReason::Lost, MissingReason::Stopped] {
        let word = reason
            .as_str_name()
            .trim_start_matches("MISSING_REASON_")
            .to_ascii_lowercase();
        let key = format!(
            "canopy_rank_rounds_missing_total{{node=\"frontend\",role=\"frontend\",reason=\"{word}\"}}"
        );
        let missing: u64 = stored_rows.iter().map(|r| u64::from(r.missing.get(reason))).sum();
        assert_eq!(fe_samples.get(&key), Some(&(missing as f64)), "{key}");
    }

    // The application's series: each stream's latest round and coverage, and the top events of the stats
    // stream's latest round as the store holds them.
    let last = ROUNDS - 1;
    for stream in ["stats", "histogram"] {
        let key = format!("canopy_app_round{{node=\"frontend\",role=\"frontend\",stream=\"{stream}\"}}");
        assert_eq!(fe_samples.get(&key), Some(&(last as f64)), "{key}");
    }
    let key =
        "canopy_app_coverage_ranks{node=\"frontend\",role=\"frontend\",stream=\"stats\",ranks=\"expected\"}";
    assert_eq!(fe_samples.get(key), Some(&16.0), "{key}");
    let names: HashMap<u64, String> = reader(&store).names().unwrap().into_iter().collect();
    let rows = reader(&store)
        .stats(Select::all().stream(1).from_round(last))
        .unwrap();
    let top = rows
        .iter()
        .filter(|r| r.round == last && r.class_id.is_none() && !r.late)
        .filter(|r| r.metric == canopy_proto::filters::v1::Metric::Exclusive)
        .max_by(|a, b| a.mean.unwrap_or(0.0).total_cmp(&b.mean.unwrap_or(0.0)))
        .expect("the last round's stats");
    for (stat, stored) in [("mean", top.mean), ("min", top.min), ("max", top.max)] {
        let key = format!(
            "canopy_app_event{{node=\"frontend\",role=\"frontend\",stream=\"stats\",app=\"{}\",event=\"{}\",\
             metric=\"exclusive\",stat=\"{stat}\"}}",
            top.app.clone().unwrap_or_default(),
            names[&top.id]
        );
        let served = fe_samples.get(&key).unwrap_or_else(|| panic!("{key} not served"));
        assert!(
            (served - stored.unwrap()).abs() <= 1e-9 * served.abs().max(1.0),
            "{key}: {served} against {stored:?}"
        );
    }
    // Low cardinality: at most 10 events per stream and application, a few statistics each.
    let series = fe_samples
        .keys()
        .filter(|k| k.starts_with("canopy_app_event{"))
        .count();
    assert!(series > 0 && series <= 2 * 10 * 6, "{series} application series");

    wait_for("the relay's status tick", Duration::from_secs(5), || {
        value(
            &scrape(&relay_metrics),
            "canopy_rounds_closed_total",
            "relay-0",
            "relay",
        ) == stored as f64
    });
    let relay_samples = scrape(&relay_metrics);
    assert_eq!(
        value(&relay_samples, "canopy_ranks_below", "relay-0", "relay"),
        16.0
    );
    assert_eq!(
        value(&relay_samples, "canopy_late_arrivals_total", "relay-0", "relay"),
        0.0
    );
    let sent = value(&relay_samples, "canopy_sent_bytes_total", "relay-0", "relay");
    assert!(sent > 0.0);
    // A short run can end before an agent's first status tick after its ranks came: its figures are those of its
    // next tick.
    wait_for("the agents' status ticks", Duration::from_secs(5), || {
        agent_metrics.iter().enumerate().all(|(i, addr)| {
            value(
                &scrape(addr),
                "canopy_ranks_below",
                &format!("agent-{i}"),
                "agent",
            ) == 8.0
        })
    });
    for (i, addr) in agent_metrics.iter().enumerate() {
        let node = format!("agent-{i}");
        let samples = scrape(addr);
        assert_eq!(value(&samples, "canopy_ranks_below", &node, "agent"), 8.0);
        assert_eq!(
            value(&samples, "canopy_rank_dumps_dropped_total", &node, "agent"),
            0.0
        );
        assert!(value(&samples, "canopy_status_ticks_total", &node, "agent") >= 1.0);
    }
    fe.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(fe.wait_timeout(Duration::from_secs(15)).is_some());
}

#[test]
fn a_metrics_address_that_is_not_one_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for (bin, extra) in [
        ("canopy-frontend", &["--listen", "127.0.0.1:0"][..]),
        ("canopy-relay", &["--listen", "127.0.0.1:0"][..]),
        ("canopy-agent", &["--socket", "none", "--simulate-ranks", "1"][..]),
    ] {
        let mut args = vec!["validate"];
        args.extend(extra);
        args.extend(["--metrics-listen", "localhost-9100"]);
        let out = std::process::Command::new(canopy_integration_tests::bin_dir().join(bin))
            .args(&args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{bin}: {stderr}");
        assert!(
            stderr.contains("metrics-listen") && stderr.contains("\"localhost-9100\" is not an address"),
            "{bin}: {stderr}"
        );
    }
}
