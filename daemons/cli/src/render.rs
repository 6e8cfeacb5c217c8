//! The text views of a stream's round: the tables `canopy streams`, `canopy ctl` and `canopy watch` print for
//! each known result (stats, histograms, classes, outliers, per-rank profiles, node samples), and the words
//! they share.

use std::collections::HashMap;

use canopy_proto::filters::known::KnownResult;
use canopy_proto::filters::v1::{EventStats, Metric, NodeSamples, OutliersResult};
use canopy_proto::v1::RoundUpdate;
use prost::Message;

use crate::watch::table::{label, several_apps};

pub(crate) fn metric_word(m: i32) -> String {
    if let Some(label) = canopy_wire::event_metrics::label(m) {
        return label;
    }
    match Metric::try_from(m).unwrap_or(Metric::Unspecified) {
        Metric::Calls => "calls",
        Metric::Inclusive => "incl",
        Metric::Exclusive => "excl",
        Metric::Counter => "counter",
        _ => "?",
    }
    .to_string()
}

pub(crate) fn name_of(names: &HashMap<u64, String>, id: u64) -> String {
    names.get(&id).cloned().unwrap_or_else(|| format!("{id:016x}"))
}

fn stats_table(stats: &[EventStats], names: &HashMap<u64, String>, top: usize) -> String {
    let mut rows: Vec<&EventStats> = stats
        .iter()
        .filter(|s| s.metric == Metric::Exclusive as i32)
        .collect();
    rows.sort_by(|a, b| {
        let (x, y) = (
            a.summary.as_ref().map_or(0.0, |s| s.mean),
            b.summary.as_ref().map_or(0.0, |s| s.mean),
        );
        y.total_cmp(&x)
    });
    let mut out = format!(
        "  {:<36} {:>6} {:>12} {:>12} {:>12} {:>12} {:>8}\n",
        "event (exclusive us)", "ranks", "mean", "min", "max", "std", "max@rank"
    );
    // Rows of several applications (the stats filter's by_app) name theirs: "app: event".
    let with_app = several_apps(stats);
    for s in rows.into_iter().take(top) {
        let sum = s.summary.clone().unwrap_or_default();
        let at = sum.max_rank.map(|r| r.rank.to_string()).unwrap_or_default();
        out.push_str(&format!(
            "  {:<36} {:>6} {:>12.1} {:>12.1} {:>12.1} {:>12.1} {:>8}\n",
            label(s, names, with_app),
            sum.count,
            sum.mean,
            sum.min,
            sum.max,
            sum.std,
            at
        ));
    }
    out.push_str(&event_metrics_table(stats, names, top));
    out
}

/// The per-event metrics (perf counters, heap, depth) of a stats result, if the ranks measure any: the `top`
/// largest means, each event with the metric's name and unit.
fn event_metrics_table(stats: &[EventStats], names: &HashMap<u64, String>, top: usize) -> String {
    use canopy_wire::event_metrics::{ALL, of_metric};
    let mut rows: Vec<(&EventStats, usize)> = stats
        .iter()
        .filter_map(|s| of_metric(s.metric).map(|(k, _)| (s, k)))
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    rows.sort_by(|(a, _), (b, _)| {
        let mean = |s: &EventStats| s.summary.as_ref().map_or(0.0, |s| s.mean);
        mean(b).total_cmp(&mean(a))
    });
    let mut out = format!(
        "  {:<28} {:<26} {:>6} {:>12} {:>12} {:>12}\n",
        "event (per-event metrics)", "metric (unit)", "ranks", "mean", "min", "max"
    );
    let with_app = several_apps(stats);
    for (s, k) in rows.into_iter().take(top) {
        let sum = s.summary.clone().unwrap_or_default();
        let metric = format!("{} ({})", metric_word(s.metric), ALL[k].unit);
        out.push_str(&format!(
            "  {:<28} {:<26} {:>6} {:>12.1} {:>12.1} {:>12.1}\n",
            label(s, names, with_app),
            metric,
            sum.count,
            sum.mean,
            sum.min,
            sum.max
        ));
    }
    out
}

/// A node stream's round: a line per node (the first `top`), CPU shares in percent, memory used, and network and
/// disk traffic in MB/s over the sample's interval; `-` where the node's agent did not sample.
/// A passthrough round as its ranks: each rank's exclusive time in the round as a bar, its calls, and the event
/// it spent most in; the ranks with the most time first, `top` rows, the rank with the least always last (the
/// spread between the two is the imbalance), each row within 80 columns.
fn ranks_table(b: &canopy_proto::v1::ProfileBatch, names: &HashMap<u64, String>, top: usize) -> String {
    struct Rank<'a> {
        who: String,
        us: f64,
        calls: u64,
        heaviest: Option<&'a canopy_proto::v1::EventSample>,
    }
    let several = b.profiles.iter().any(|p| p.app != b.profiles[0].app);
    let mut ranks: Vec<Rank<'_>> = b
        .profiles
        .iter()
        .map(|p| Rank {
            who: match several {
                true => format!("{}:{}", p.app, p.rank),
                false => p.rank.to_string(),
            },
            us: p.events.iter().map(|e| e.excl_us).sum(),
            calls: p.events.iter().map(|e| e.calls).sum(),
            heaviest: p.events.iter().max_by(|a, b| a.excl_us.total_cmp(&b.excl_us)),
        })
        .collect();
    ranks.sort_by(|a, b| b.us.total_cmp(&a.us).then_with(|| a.who.cmp(&b.who)));
    if ranks.len() > top.max(2) {
        let least = ranks.pop().expect("more than two ranks");
        ranks.truncate(top.max(2) - 1);
        ranks.push(least);
    }
    let most = ranks.first().map_or(0.0, |r| r.us).max(f64::MIN_POSITIVE);
    let mut out = format!("  {} ranks; exclusive time in the round\n", b.profiles.len());
    out.push_str("     rank    time ms                          calls  most in\n");
    for r in &ranks {
        let width = ((r.us / most) * 24.0).round() as usize;
        let event = r.heaviest.map(|e| name_of(names, e.event_id)).unwrap_or_default();
        let mut line = format!(
            "  {:>7} {:>10.3} {:<24} {:>6}  {event}",
            r.who,
            r.us / 1e3,
            "█".repeat(width),
            r.calls
        );
        if line.chars().count() > 79 {
            line = line.chars().take(78).collect::<String>() + "…";
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The events of an outlier that weigh most in its score, most first: `MPI_Wait +4.1σ`.
fn drivers(o: &canopy_proto::filters::v1::Outlier, names: &HashMap<u64, String>, n: usize) -> String {
    let mut events: Vec<_> = o.events.iter().collect();
    events.sort_by(|a, b| b.contribution.total_cmp(&a.contribution));
    events
        .iter()
        .take(n)
        .map(|e| {
            let sigmas = if e.std > 0.0 {
                (e.value - e.mean) / e.std
            } else {
                0.0
            };
            // Time is what an event means unless it names another metric.
            let name = name_of(names, e.id);
            if e.metric == 0 || e.metric == Metric::Exclusive as i32 {
                format!("{name} {sigmas:+.1}σ")
            } else {
                format!("{name} {} {sigmas:+.1}σ", metric_word(e.metric))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The outliers stream's latest round as a table: per group of ranks scored together, its top ranks by score
/// with the events that drive each, at most `top` rows a group, each row within 80 columns.
fn outliers_table(r: &OutliersResult, names: &HashMap<u64, String>, top: usize) -> String {
    let metrics = match r.metrics.as_slice() {
        [] => metric_word(r.metric),
        several => several
            .iter()
            .map(|m| metric_word(*m))
            .collect::<Vec<_>>()
            .join("+"),
    };
    // A window's statistic is the median unless it says "sum" (results without one summed).
    let metrics = match (r.window, r.window_stat.as_str()) {
        (0 | 1, _) => metrics,
        (n, "median") => format!("{metrics}, median of {n} rounds"),
        (n, _) => format!("{metrics} summed over {n} rounds"),
    };
    // Distances count beyond the margin (results without one counted them whole).
    let metrics = match r.margin {
        m if m > 0.0 => format!("{metrics}, beyond {m}σ"),
        _ => metrics,
    };
    let events = if r.events.is_empty() {
        "all"
    } else {
        r.events.as_str()
    };
    let within = if r.within.is_empty() {
        "all"
    } else {
        r.within.as_str()
    };
    let how = format!("  scored over {metrics}");
    let whom = format!("({events} events), within {within}");
    // One line where it fits in 80 columns, else two.
    let mut out = if how.chars().count() + 1 + whom.chars().count() < 80 {
        format!("{how} {whom}\n")
    } else {
        format!("{how}\n    {whom}\n")
    };
    for g in &r.groups {
        let who = match (g.app.as_str(), g.example_event.as_str()) {
            ("", "") => "all ranks".to_string(),
            (app, "") => app.to_string(),
            ("", ex) => format!("class of {ex}"),
            (app, ex) => format!("{app}, class of {ex}"),
        };
        let mut head = format!("  {who}: {} ranks, top {}", g.ranks, g.top.len());
        if head.chars().count() > 79 {
            head = head.chars().take(78).collect::<String>() + "…";
        }
        out.push_str(&head);
        out.push('\n');
        out.push_str("    rank   score  driven by\n");
        for o in g.top.iter().take(top) {
            let mut line = format!("    {:>4} {:>7.2}  {}", o.rank, o.score, drivers(o, names, 3));
            if line.chars().count() > 79 {
                line = line.chars().take(78).collect::<String>() + "…";
            }
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

fn nodes_table(r: &NodeSamples, top: usize) -> String {
    let mut out = format!(
        "  {:<20} {:<14} {:>5} {:>5} {:>5} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8} {:>6}\n",
        "node",
        "ranks",
        "usr%",
        "sys%",
        "idle%",
        "stl%",
        "mem GiB",
        "rx MB/s",
        "tx MB/s",
        "rd MB/s",
        "wr MB/s",
        "load1"
    );
    let dash = || "-".to_string();
    for n in r.nodes.iter().take(top) {
        let seconds = n.interval_ns as f64 / 1e9;
        let rate = |bytes: u64| {
            if seconds > 0.0 {
                format!("{:.2}", bytes as f64 / seconds / 1e6)
            } else {
                dash()
            }
        };
        let pct = |share: f64| format!("{:.1}", 100.0 * share);
        let (usr, sys, idle, steal) = n.cpu.map_or_else(
            || (dash(), dash(), dash(), dash()),
            |c| {
                (
                    pct(c.user_share + c.nice_share),
                    pct(c.system_share + c.irq_share),
                    pct(c.idle_share + c.iowait_share),
                    pct(c.steal_share),
                )
            },
        );
        let mem = n.memory.map_or_else(dash, |m| {
            format!("{:.2}", m.used_bytes as f64 / (1u64 << 30) as f64)
        });
        let (rx, tx) = n
            .network
            .map_or_else(|| (dash(), dash()), |x| (rate(x.rx_bytes), rate(x.tx_bytes)));
        let (rd, wr) = n
            .disk
            .map_or_else(|| (dash(), dash()), |d| (rate(d.read_bytes), rate(d.write_bytes)));
        let load = n.load.map_or_else(dash, |l| format!("{:.2}", l.load_1m));
        out.push_str(&format!(
            "  {:<20} {:<14} {usr:>5} {sys:>5} {idle:>5} {steal:>5} {mem:>9} {rx:>8} {tx:>8} {rd:>8} {wr:>8} {load:>6}\n",
            n.node_id,
            Some(canopy_store::ranges_text(&n.ranks)).filter(|r| !r.is_empty()).unwrap_or_else(dash),
        ));
    }
    if r.nodes.len() > top {
        out.push_str(&format!("  ... {} more nodes\n", r.nodes.len() - top));
    }
    out
}

/// One update of a stream that is not a utilization stream, as a text table.
pub(crate) fn render(u: &RoundUpdate, names: &HashMap<u64, String>, top: usize) -> String {
    let cov = u.coverage.clone().unwrap_or_default();
    let missed = if u.missed > 0 {
        format!("  (missed {} updates)", u.missed)
    } else {
        String::new()
    };
    let mut out = format!(
        "{} [{}] round {}  coverage {}/{}{missed}\n",
        u.stream, u.filter, u.round, cov.covered, cov.expected
    );
    let payload = u.result.as_ref().map(|a| a.value.as_slice()).unwrap_or_default();
    let type_url = u.result.as_ref().map(|a| a.type_url.as_str()).unwrap_or_default();
    match KnownResult::decode(type_url, payload) {
        Ok(KnownResult::Stats(r)) => out.push_str(&stats_table(&r.stats, names, top)),
        Ok(KnownResult::Histogram(r)) => {
            out.push_str(&stats_table(&r.stats, names, top.min(3)));
            let mut hists: Vec<_> = r
                .histograms
                .iter()
                .filter(|h| h.metric == Metric::Exclusive as i32)
                .collect();
            hists.sort_by_key(|h| std::cmp::Reverse(h.hi.to_bits()));
            for h in hists.into_iter().take(top.min(3)) {
                let name = if h.app.is_empty() {
                    name_of(names, h.id)
                } else {
                    format!("{}: {}", h.app, name_of(names, h.id))
                };
                out.push_str(&format!(
                    "  {name} ({}, {:.1}..{:.1} us)\n",
                    metric_word(h.metric),
                    h.lo,
                    h.hi
                ));
                let most = h.counts.iter().copied().max().unwrap_or(1).max(1);
                for (b, c) in h.counts.iter().enumerate() {
                    let bar = "#".repeat((*c as usize * 40).div_ceil(most as usize));
                    out.push_str(&format!("    bin {b:>2} {c:>6} {bar}\n"));
                }
            }
        }
        Ok(KnownResult::Classes(r)) => {
            out.push_str(&format!(
                "  {} classes, reduction factor {:.2} ({} B of profiles -> {} B)\n",
                r.classes.len(),
                r.reduction_factor,
                r.raw_bytes,
                r.result_bytes
            ));
            for c in r.classes.iter().take(top) {
                let ranks = c.ranks.iter().map(|g| {
                    if g.first == g.last {
                        g.first.to_string()
                    } else {
                        format!("{}-{}", g.first, g.last)
                    }
                });
                out.push_str(&format!(
                    "  class {:016x}  {:>5} ranks  {}  e.g. {}\n",
                    c.class_id,
                    c.size,
                    ranks.collect::<Vec<_>>().join(","),
                    c.example_event
                ));
            }
        }
        Ok(KnownResult::Nodes(r)) => out.push_str(&nodes_table(&r, top)),
        Ok(KnownResult::Profiles) => {
            if let Ok(b) = canopy_proto::v1::ProfileBatch::decode(payload) {
                out.push_str(&ranks_table(&b, names, top));
            }
        }
        Ok(KnownResult::Outliers(r)) => out.push_str(&outliers_table(&r, names, top)),
        // A type this command does not draw, or a known type whose bytes do not decode, shows as bytes.
        _ => out.push_str(&format!(
            "  {} bytes of {}\n",
            payload.len(),
            type_url.rsplit('/').next().unwrap_or("")
        )),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::filters::v1::RankRange;

    #[test]
    fn a_passthrough_round_is_a_table_of_ranks_with_the_most_time_first_and_the_least_last() {
        use canopy_proto::v1::{EventSample, ProfileBatch, RankProfile};
        let profile = |rank: u32, us: f64| RankProfile {
            app: "lulesh".into(),
            rank,
            events: vec![
                EventSample {
                    event_id: 1,
                    calls: 10,
                    excl_us: us,
                    ..Default::default()
                },
                EventSample {
                    event_id: 2,
                    calls: 1,
                    excl_us: 1.0,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let b = ProfileBatch {
            profiles: (0..6).map(|r| profile(r, 1000.0 * f64::from(r + 1))).collect(),
        };
        let names: HashMap<u64, String> = [(1, "MPI_Wait".to_string())].into();
        let text = ranks_table(&b, &names, 3);
        let rows: Vec<&str> = text.lines().skip(2).collect();
        assert_eq!(rows.len(), 3, "{text}");
        // Rank 5 has the most, then 4; rank 0, the least, stays as the last row.
        assert!(
            rows[0]
                .trim_start()
                .starts_with("5      6.001 ████████████████████████"),
            "{text}"
        );
        assert!(rows[0].ends_with("11  MPI_Wait"), "{text}");
        assert!(rows[1].trim_start().starts_with("4 "), "{text}");
        assert!(rows[2].trim_start().starts_with("0      1.001 ████ "), "{text}");
        assert!(text.lines().all(|l| l.chars().count() < 80), "{text}");
    }

    #[test]
    fn the_outliers_stream_is_a_table_of_ranks_scores_and_the_events_that_drive_them() {
        use canopy_proto::filters::v1::{Outlier, OutlierEvent, OutlierGroup};
        let event = |id, value, contribution| OutlierEvent {
            id,
            value,
            mean: 10.0,
            std: 2.0,
            contribution,
            metric: 0,
        };
        let r = OutliersResult {
            groups: vec![OutlierGroup {
                ranks: 64,
                keep: 2,
                top: vec![
                    Outlier {
                        app: "lulesh".into(),
                        rank: 17,
                        score: 5.5,
                        events: vec![event(1, 12.0, 1.0), event(2, 19.0, 4.5)],
                    },
                    Outlier {
                        app: "lulesh".into(),
                        rank: 3,
                        score: 2.0,
                        events: vec![event(1, 6.0, 2.0)],
                    },
                ],
                app: "lulesh".into(),
                ..Default::default()
            }],
            within: "all".into(),
            metric: Metric::Exclusive as i32,
            ..Default::default()
        };
        let names: HashMap<u64, String> =
            [(1, "MPI_Allreduce".to_string()), (2, "MPI_Wait".to_string())].into();
        let text = outliers_table(&r, &names, 8);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "  lulesh: 64 ranks, top 2", "{text}");
        assert_eq!(
            lines[3], "      17    5.50  MPI_Wait +4.5σ, MPI_Allreduce +1.0σ",
            "{text}"
        );
        assert_eq!(lines[4], "       3    2.00  MPI_Allreduce -2.0σ", "{text}");
        assert!(text.lines().all(|l| l.chars().count() < 80));
        // One row a group with --top 1.
        assert_eq!(outliers_table(&r, &names, 1).lines().count(), 4);
        // Scored over every metric and a window: the header says so, and an event not in time names its metric.
        let mut all = r.clone();
        all.metric = 0;
        all.metrics = vec![
            Metric::Calls as i32,
            Metric::Exclusive as i32,
            Metric::Counter as i32,
        ];
        all.window = 3;
        all.window_stat = "median".to_string();
        all.groups[0].top[0].events[0].metric = Metric::Calls as i32;
        all.groups[0].top[0].events[1].metric = Metric::Exclusive as i32;
        let text = outliers_table(&all, &names, 8);
        assert!(
            text.starts_with("  scored over calls+excl+counter, median of 3 rounds (all events)"),
            "{text}"
        );
        all.window_stat = "sum".to_string();
        assert!(
            outliers_table(&all, &names, 8)
                .starts_with("  scored over calls+excl+counter summed over 3 rounds (all events)"),
            "{text}"
        );
        all.margin = 1.0;
        let text = outliers_table(&all, &names, 8);
        assert!(
            text.starts_with(
                "  scored over calls+excl+counter summed over 3 rounds, beyond 1σ\n    (all events), within all\n"
            ),
            "{text}"
        );
        assert!(text.lines().all(|l| l.chars().count() < 80), "{text}");
        assert!(
            text.contains("17    5.50  MPI_Wait +4.5σ, MPI_Allreduce calls +1.0σ"),
            "{text}"
        );
    }
    use canopy_proto::filters::v1::Summary;
    use canopy_proto::filters::v1::{CpuSample, MemorySample, NetworkSample, NodeSample};
    fn row(id: u64, metric: Metric, mean: f64) -> EventStats {
        EventStats {
            id,
            metric: metric as i32,
            summary: Some(Summary {
                count: 4,
                mean,
                min: mean - 1.0,
                max: mean + 1.0,
                ..Default::default()
            }),
            quantiles: Vec::new(),
            app: String::new(),
        }
    }

    #[test]
    fn a_stats_table_of_several_applications_names_each_rows_application() {
        let names: HashMap<u64, String> = [(1, "touch".to_string())].into();
        let of = |app: &str, mean| EventStats {
            app: app.into(),
            ..row(1, Metric::Exclusive, mean)
        };
        let table = stats_table(&[of("sim", 900.0), of("viz", 30.0)], &names, 10);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[1].contains("sim: touch") && lines[1].contains("900.0"),
            "{table}"
        );
        assert!(
            lines[2].contains("viz: touch") && lines[2].contains("30.0"),
            "{table}"
        );
        // One application alone: the events' names, as over every application.
        let one = stats_table(&[of("sim", 900.0)], &names, 10);
        assert!(
            one.lines().nth(1).unwrap().trim_start().starts_with("touch "),
            "{one}"
        );
    }

    #[test]
    fn a_stats_table_shows_per_event_metrics_by_name_and_unit() {
        let names: HashMap<u64, String> = [(1, "touch".to_string()), (2, "nap".to_string())].into();
        let stats = [
            row(1, Metric::Exclusive, 900.0),
            row(1, Metric::PageFaultsExclusive, 1500.0),
            row(2, Metric::ContextSwitchesInclusive, 4.0),
            row(2, Metric::DepthAtEntry, 2.0),
        ];
        let table = stats_table(&stats, &names, 10);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[1].contains("touch") && lines[1].contains("900.0"),
            "{table}"
        );
        assert!(lines[2].contains("event (per-event metrics)"), "{table}");
        assert!(
            lines[3].contains("touch") && lines[3].contains("page-faults excl (faults)"),
            "{table}"
        );
        assert!(lines[4].contains("nap") && lines[4].contains("context-switches incl (switches)"));
        assert!(
            lines[5].contains("nap") && lines[5].contains("depth (frames)"),
            "{table}"
        );
        assert_eq!(lines.len(), 6);
        // Without per-event metrics the table is time alone.
        assert_eq!(stats_table(&stats[..1], &names, 10).lines().count(), 2);
    }

    /// A node stream's round reads as a line per node: its ranks, CPU shares in percent, memory, rates over the
    /// interval, and `-` for what its agent did not sample.
    #[test]
    fn a_node_streams_round_is_a_line_per_node() {
        let sampled = NodeSample {
            node_id: "agent@n001".into(),
            ranks: vec![RankRange {
                app: "sim".into(),
                first: 0,
                last: 63,
            }],
            interval_ns: 2_000_000_000,
            cpu: Some(CpuSample {
                cpus: 64,
                user_share: 0.75,
                system_share: 0.05,
                idle_share: 0.2,
                ..Default::default()
            }),
            memory: Some(MemorySample {
                used_bytes: 3 << 30,
                ..Default::default()
            }),
            network: Some(NetworkSample {
                rx_bytes: 8_000_000,
                tx_bytes: 2_000_000,
                interfaces: 1,
            }),
            ..Default::default()
        };
        let bare = NodeSample {
            node_id: "agent@n002".into(),
            ..Default::default()
        };
        let result = NodeSamples {
            nodes: vec![sampled, bare.clone(), bare],
        };
        let update = RoundUpdate {
            stream: "nodes".into(),
            filter: "nodes".into(),
            round: 4,
            result: Some(prost_types::Any {
                type_url: "type.googleapis.com/canopy.filters.v1.NodeSamples".into(),
                value: result.encode_to_vec(),
            }),
            ..Default::default()
        };
        let text = render(&update, &HashMap::new(), 2);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(lines[0].starts_with("nodes [nodes] round 4"), "{text}");
        let cells: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "agent@n001",
                "sim:0-63",
                "75.0",
                "5.0",
                "20.0",
                "0.0",
                "3.00",
                "4.00",
                "1.00",
                "-",
                "-",
                "-"
            ]
        );
        let cells: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(cells[0], "agent@n002");
        assert!(cells[1..].iter().all(|c| *c == "-"), "{text}");
        assert_eq!(lines[4].trim(), "... 1 more nodes");
    }
}
