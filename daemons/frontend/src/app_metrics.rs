//! The application's results as Prometheus series, for a center's dashboards: each open stream's latest round,
//! its coverage, and for a stats or histogram stream the top events' mean, min, max and quantiles across the
//! ranks. Low cardinality by construction: a series per stream, event, application and statistic of the top
//! `metrics_top_events` events, never one per rank.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};

use canopy_core::node::RoundResult;
use canopy_proto::filters::known::Known;
use canopy_proto::filters::v1::{EventStats, HistogramResult, Metric, StatsResult};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prost::Message;

/// One stream's latest round as the series show it.
#[derive(Debug, Clone, Default, PartialEq)]
struct Latest {
    round: u64,
    covered: u32,
    expected: u32,
    /// A stats or histogram round's result as it was committed, read for its top events at a scrape: decoding
    /// every round as it is committed cost the store writer's thread a third of its work on a round of 301
    /// events, for series a scrape reads every few seconds.
    result: Option<(Known, Arc<[u8]>)>,
}

/// One of the top events' statistics: (application, event id, metric, statistic, value).
type EventSeries = (String, u64, Metric, &'static str, f64);

impl Latest {
    /// The top events of its time metric, `top` per application; none if its result does not decode.
    fn events(&self, top: usize) -> Vec<EventSeries> {
        let Some((known, bytes)) = &self.result else {
            return Vec::new();
        };
        let stats = match known {
            Known::Stats => StatsResult::decode(&bytes[..]).map(|s| s.stats),
            Known::Histogram => HistogramResult::decode(&bytes[..]).map(|h| h.stats),
            _ => return Vec::new(),
        };
        stats.map(|s| top_events(&s, top)).unwrap_or_default()
    }
}

/// The latest round of every stream, kept as results are committed.
#[derive(Debug, Default)]
pub struct AppMetrics {
    /// Events per stream (and application) the series show; 0: coverage and rounds only.
    top: usize,
    /// By stream id (two streams may share a name), with the stream's name.
    latest: Mutex<BTreeMap<u32, (String, Latest)>>,
}

impl AppMetrics {
    pub fn new(top: usize) -> AppMetrics {
        AppMetrics {
            top,
            latest: Mutex::default(),
        }
    }

    /// Takes a committed result: its stream's latest round, unless it is older or late.
    pub fn note(&self, r: &RoundResult, result_type: &str) {
        if r.late {
            return;
        }
        let mut latest = self.latest.lock().expect("latest rounds");
        let (name, entry) = latest
            .entry(r.stream.stream_id)
            .or_insert_with(|| (r.stream.name.clone(), Latest::default()));
        if r.round < entry.round {
            return;
        }
        name.clone_from(&r.stream.name);
        let result = match Known::of(result_type) {
            Some(known @ (Known::Stats | Known::Histogram)) if self.top > 0 => {
                Some((known, Arc::from(r.payload.as_slice())))
            }
            _ => None,
        };
        *entry = Latest {
            round: r.round,
            covered: r.coverage.covered,
            expected: r.coverage.expected,
            result,
        };
    }

    /// A stream that closed or failed: its series go, rather than stay at their last values on a dashboard.
    pub fn forget(&self, stream_id: u32) {
        self.latest.lock().expect("latest rounds").remove(&stream_id);
    }

    /// The collector that renders the series at each scrape, naming events with `names`.
    pub fn collector(
        self: &Arc<Self>,
        names: impl Fn() -> HashMap<u64, String> + Send + Sync + 'static,
    ) -> Box<dyn Collector> {
        Box::new(AppCollector {
            metrics: self.clone(),
            names: Box::new(names),
        })
    }
}

/// The statistics a series names in its `stat` label, with their values.
fn statistics(e: &EventStats) -> Vec<(&'static str, f64)> {
    let Some(s) = &e.summary else {
        return Vec::new();
    };
    let mut out = vec![("mean", s.mean), ("min", s.min), ("max", s.max)];
    for q in &e.quantiles {
        let word = match q.q {
            q if (q - 0.5).abs() < 1e-9 => "p50",
            q if (q - 0.9).abs() < 1e-9 => "p90",
            q if (q - 0.99).abs() < 1e-9 => "p99",
            _ => continue,
        };
        out.push((word, q.value));
    }
    out
}

/// The `top` events of each application with the largest mean of the stream's time metric (exclusive time, else
/// inclusive), each with its statistics.
fn top_events(stats: &[EventStats], top: usize) -> Vec<EventSeries> {
    let metric = [Metric::Exclusive, Metric::Inclusive]
        .into_iter()
        .find(|m| stats.iter().any(|e| e.metric == *m as i32));
    let Some(metric) = metric else {
        return Vec::new();
    };
    let mut by_app: BTreeMap<&str, Vec<&EventStats>> = BTreeMap::new();
    for e in stats.iter().filter(|e| e.metric == metric as i32) {
        by_app.entry(e.app.as_str()).or_default().push(e);
    }
    let mut out = Vec::new();
    for (app, mut events) in by_app {
        let mean = |e: &EventStats| e.summary.as_ref().map_or(0.0, |s| s.mean);
        events.sort_by(|a, b| mean(b).total_cmp(&mean(a)).then(a.id.cmp(&b.id)));
        for e in events.into_iter().take(top) {
            for (stat, value) in statistics(e) {
                out.push((app.to_string(), e.id, metric, stat, value));
            }
        }
    }
    out
}

struct AppCollector {
    metrics: Arc<AppMetrics>,
    names: Box<dyn Fn() -> HashMap<u64, String> + Send + Sync>,
}

impl fmt::Debug for AppCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppCollector").finish()
    }
}

impl Collector for AppCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> fmt::Result {
        let latest = self.metrics.latest.lock().expect("latest rounds").clone();
        let kind = ConstGauge::new(0i64).metric_type();
        let mut family =
            enc.encode_descriptor("app_round", "Each stream's latest round stored", None, kind)?;
        for (stream, l) in latest.values() {
            let stream = label(stream);
            ConstGauge::new(l.round as i64).encode(family.encode_family(&[("stream", stream.as_str())])?)?;
        }
        let mut family = enc.encode_descriptor(
            "app_coverage_ranks",
            "Ranks of each stream's latest round: covered, and expected",
            None,
            kind,
        )?;
        for (stream, l) in latest.values() {
            let stream = label(stream);
            for (state, n) in [("covered", l.covered), ("expected", l.expected)] {
                ConstGauge::new(i64::from(n))
                    .encode(family.encode_family(&[("stream", stream.as_str()), ("ranks", state)])?)?;
            }
        }
        let events: Vec<(&str, Vec<EventSeries>)> = latest
            .values()
            .map(|(stream, l)| (stream.as_str(), l.events(self.metrics.top)))
            .collect();
        if events.iter().all(|(_, e)| e.is_empty()) {
            return Ok(());
        }
        let names = (self.names)();
        let mut family = enc.encode_descriptor(
            "app_event",
            "The top events of each stats or histogram stream's latest round, across the ranks (stat: mean, min, \
             max, p50, p90, p99), in the metric's unit (microseconds for time)",
            None,
            ConstGauge::new(0.0f64).metric_type(),
        )?;
        for (stream, series) in &events {
            for (app, id, metric, stat, value) in series {
                let event = names.get(id).map_or_else(|| format!("{id:#018x}"), |n| label(n));
                let labels = [
                    ("stream", label(stream)),
                    ("app", label(app)),
                    ("event", event),
                    ("metric", metric_word(*metric).to_string()),
                    ("stat", stat.to_string()),
                ];
                ConstGauge::new(*value).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// A label value as the text format needs it: backslash, double quote and newline escaped (the encoder writes
/// values as they are, and one event name with a quote would break every series of the scrape).
fn label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn metric_word(m: Metric) -> &'static str {
    match m {
        Metric::Exclusive => "exclusive",
        Metric::Inclusive => "inclusive",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::filters::v1::{Quantile, StatsResult, Summary};
    use canopy_proto::v1::{Coverage, StreamSpec};
    use prost::Message;

    fn event(app: &str, id: u64, mean: f64) -> EventStats {
        EventStats {
            id,
            metric: Metric::Exclusive as i32,
            summary: Some(Summary {
                count: 8,
                mean,
                min: mean / 2.0,
                max: mean * 2.0,
                ..Default::default()
            }),
            quantiles: vec![Quantile { q: 0.5, value: mean }],
            app: app.into(),
        }
    }

    /// A registry serving `m`'s series, its events named by `names`.
    fn registry_of(
        m: &Arc<AppMetrics>,
        names: impl Fn() -> HashMap<u64, String> + Send + Sync + 'static,
    ) -> prometheus_client::registry::Registry {
        let mut registry = prometheus_client::registry::Registry::with_prefix("canopy");
        registry.register_collector(m.collector(names));
        registry
    }

    /// What a scrape of `registry` reads.
    fn scrape(registry: &prometheus_client::registry::Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    fn result(round: u64, stats: Vec<EventStats>, late: bool) -> RoundResult {
        RoundResult {
            stream: StreamSpec {
                name: "stats".into(),
                ..Default::default()
            },
            round,
            phase: 0,
            coverage: Coverage {
                covered: 7,
                expected: 8,
                ..Default::default()
            },
            first_dump_unix_ns: 0,
            payload: StatsResult {
                stats,
                ..Default::default()
            }
            .encode_to_vec(),
            late,
        }
    }

    #[test]
    fn the_latest_round_of_a_stream_renders_its_top_events_per_application_and_its_coverage() {
        let m = Arc::new(AppMetrics::new(2));
        let stats = vec![
            event("lulesh", 1, 50.0),
            event("lulesh", 2, 900.0),
            event("lulesh", 3, 10.0),
            event("viz", 1, 5.0),
        ];
        m.note(&result(4, stats, false), "canopy.filters.v1.StatsResult");
        // An older round, or a late one, does not replace it.
        m.note(
            &result(3, vec![event("lulesh", 9, 1e9)], false),
            "canopy.filters.v1.StatsResult",
        );
        m.note(
            &result(5, vec![event("lulesh", 9, 1e9)], true),
            "canopy.filters.v1.StatsResult",
        );
        let names = || HashMap::from([(1, "MPI_Allreduce".to_string()), (2, "MPI_Wait".to_string())]);
        let registry = registry_of(&m, names);
        let text = scrape(&registry);
        assert!(text.contains("canopy_app_round{stream=\"stats\"} 4"), "{text}");
        assert!(
            text.contains("canopy_app_coverage_ranks{stream=\"stats\",ranks=\"covered\"} 7"),
            "{text}"
        );
        assert!(
            text.contains(
                "canopy_app_event{stream=\"stats\",app=\"lulesh\",event=\"MPI_Wait\",metric=\"exclusive\",stat=\"max\"} 1800.0"
            ),
            "{text}"
        );
        // Two events of lulesh and viz's one, four statistics each: no more series than that.
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("canopy_app_event{"))
                .count(),
            3 * 4,
            "{text}"
        );
        assert!(!text.contains("event=\"0x0000000000000003\""), "{text}");
        assert!(text.contains("app=\"viz\",event=\"MPI_Allreduce\""), "{text}");
    }

    #[test]
    fn label_values_are_escaped_and_a_closed_stream_is_forgotten() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        let m = Arc::new(AppMetrics::new(1));
        m.note(
            &result(1, vec![event("x\"y", 1, 1.0)], false),
            "canopy.filters.v1.StatsResult",
        );
        let names = || HashMap::from([(1, "MPI_\"odd\"".to_string())]);
        let registry = registry_of(&m, names);
        let text = scrape(&registry);
        assert!(
            text.contains("app=\"x\\\"y\",event=\"MPI_\\\"odd\\\"\""),
            "{text}"
        );
        m.forget(0);
        let text = scrape(&registry);
        assert!(!text.contains("canopy_app_round{"), "{text}");
    }

    #[test]
    fn a_round_keeps_its_result_only_for_the_top_events_of_a_stats_or_histogram_stream() {
        let kept = |top: usize, result_type: &str| {
            let m = AppMetrics::new(top);
            m.note(&result(1, vec![event("a", 1, 1.0)], false), result_type);
            let latest = m.latest.lock().unwrap();
            latest
                .values()
                .map(|(_, l)| l.result.is_some())
                .collect::<Vec<_>>()
        };
        assert_eq!(kept(3, "canopy.filters.v1.StatsResult"), [true]);
        assert_eq!(kept(3, "canopy.filters.v1.HistogramResult"), [true]);
        // A passthrough round (every rank's profile) is not copied, nor anything with no top events asked for.
        assert_eq!(kept(3, "canopy.v1.ProfileBatch"), [false]);
        assert_eq!(kept(3, "example.Custom"), [false]);
        assert_eq!(kept(0, "canopy.filters.v1.StatsResult"), [false]);
    }

    #[test]
    fn a_result_that_does_not_decode_serves_its_round_without_events() {
        let m = Arc::new(AppMetrics::new(2));
        let mut r = result(6, Vec::new(), false);
        r.payload = vec![0xff, 0xff, 0xff];
        m.note(&r, "canopy.filters.v1.StatsResult");
        let registry = registry_of(&m, HashMap::new);
        let text = scrape(&registry);
        assert!(text.contains("canopy_app_round{stream=\"stats\"} 6"), "{text}");
        assert!(!text.contains("canopy_app_event"), "{text}");
    }

    #[test]
    fn with_no_top_events_only_rounds_and_coverage_are_served() {
        let m = Arc::new(AppMetrics::new(0));
        m.note(
            &result(1, vec![event("a", 1, 1.0)], false),
            "canopy.filters.v1.StatsResult",
        );
        let registry = registry_of(&m, HashMap::new);
        let text = scrape(&registry);
        assert!(text.contains("canopy_app_round"), "{text}");
        assert!(!text.contains("canopy_app_event"), "{text}");
    }
}
