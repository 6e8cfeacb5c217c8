use super::screens::Screens;
use super::*;
use canopy_proto::filters::v1::{EventStats, Metric, StatsResult, Summary, UtilizationResult};
use canopy_proto::v1::Coverage;
use prost::Message;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use utilization::tests::result;

fn any<M: Message>(type_name: &str, m: &M) -> prost_types::Any {
    prost_types::Any {
        type_url: format!("type.googleapis.com/canopy.filters.v1.{type_name}"),
        value: m.encode_to_vec(),
    }
}

fn update(stream: &str, round: u64, r: &UtilizationResult) -> RoundUpdate {
    RoundUpdate {
        stream: stream.into(),
        filter: "utilization".into(),
        round,
        result: Some(any("UtilizationResult", r)),
        ..Default::default()
    }
}

fn stats_update(round: u64) -> RoundUpdate {
    let row = |id, metric: Metric, mean| EventStats {
        id,
        metric: metric as i32,
        summary: Some(Summary {
            count: 8,
            mean,
            ..Default::default()
        }),
        quantiles: Vec::new(),
        app: String::new(),
    };
    let r = StatsResult {
        stats: vec![
            row(1, Metric::Exclusive, 100.0 + round as f64),
            row(2, Metric::Exclusive, 50.0),
            row(1, Metric::Inclusive, 400.0),
            row(1, Metric::Calls, 3.0),
        ],
        raw_bytes: 0,
    };
    RoundUpdate {
        stream: "a-stats".into(),
        filter: "stats".into(),
        round,
        coverage: Some(Coverage {
            covered: 8,
            expected: 8,
            ..Default::default()
        }),
        result: Some(any("StatsResult", &r)),
        ..Default::default()
    }
}

fn screen(s: &Screens, names: &HashMap<u64, String>, w: u16, h: u16) -> Vec<String> {
    let mut buf = Buffer::empty(Rect::new(0, 0, w, h));
    s.render(buf.area, &mut buf, names, s.header.started);
    (0..h)
        .map(|y| (0..w).map(|x| buf[(x, y)].symbol()).collect::<String>())
        .collect()
}

#[test]
fn a_utilization_stream_is_shown_first_and_tab_cycles_the_streams() {
    let mut s = Screens::new("127.0.0.1:7400", 5);
    let names = HashMap::new();
    s.update(&stats_update(0), &names);
    assert_eq!(s.shown.as_deref(), Some("a-stats"));
    let r = result(1_700_000_000_000, 1000, &[(7, "MPI_Allreduce", 100)]);
    s.update(&update("util", 3, &r), &names);
    assert_eq!(s.shown.as_deref(), Some("util"));
    s.cycle(false);
    assert_eq!(s.shown.as_deref(), Some("a-stats"));
    s.cycle(false);
    assert_eq!(s.shown.as_deref(), Some("util"));
    // Another update of the table stream does not take the screen.
    s.update(&stats_update(1), &names);
    assert_eq!(s.shown.as_deref(), Some("util"));
    let lines = screen(&s, &names, 80, 24);
    assert!(lines[0].contains("util: round 3"), "{}", lines.join("\n"));
    assert!(
        lines[3].starts_with("util [utilization] round 3"),
        "{}",
        lines.join("\n")
    );
    s.act(Action::Previous);
    let lines = screen(&s, &names, 80, 24);
    assert!(lines[0].contains("a-stats: round 1"), "{}", lines.join("\n"));
}

#[test]
fn a_stats_stream_shows_names_a_metric_that_m_cycles_and_sparklines_within_80x24() {
    let names: HashMap<u64, String> = [(1, "MPI_Allreduce".to_string()), (2, "compute".to_string())].into();
    let mut s = Screens::new("127.0.0.1:7400", 10);
    for round in 0..5 {
        s.update(&stats_update(round), &names);
    }
    for (w, h) in [(80u16, 24u16), (200, 60)] {
        let lines = screen(&s, &names, w, h);
        let all = lines.join("\n");
        assert!(
            lines[0].contains("a-stats: round 4") && lines[0].contains("coverage 8/8"),
            "{all}"
        );
        assert!(lines[2].contains("a-stats [stats]"), "{all}");
        assert!(lines[3].starts_with("event (exclusive us)"), "{all}");
        assert!(
            lines[4].starts_with("MPI_Allreduce") && lines[4].contains("104.0"),
            "{all}"
        );
        assert!(
            all.contains("mean (exclusive us) over the last 60 rounds"),
            "{all}"
        );
        assert!(!all.contains("0000000000000001"), "{all}");
        // Rising means: the sparkline ends in a full block.
        let spark = lines
            .iter()
            .find(|l| l.starts_with("MPI_Allreduce") && l.contains('█'))
            .expect(&all);
        assert!(spark.trim_end().ends_with('█'), "{spark}");
    }
    s.act(Action::Metric);
    let lines = screen(&s, &names, 80, 24);
    assert!(
        lines[3].starts_with("event (inclusive us)"),
        "{}",
        lines.join("\n")
    );
    s.act(Action::Metric);
    s.act(Action::Metric);
    assert_eq!(s.metric_shown(), Metric::Exclusive as i32);
    s.act(Action::Sort);
    let lines = screen(&s, &names, 200, 60);
    assert!(lines[3].contains("max↓"), "{}", lines.join("\n"));
    // Many streams: the shown one stays on the stream line.
    let mut many = Screens::new("127.0.0.1:7400", 10);
    for k in 0..12 {
        let mut u = stats_update(1);
        u.stream = format!("stream-{k:02}");
        many.update(&u, &names);
    }
    for _ in 0..11 {
        many.act(Action::Next);
    }
    let lines = screen(&many, &names, 80, 24);
    assert!(
        lines[2].starts_with('…') && lines[2].contains("stream-11 [stats]"),
        "{}",
        lines[2]
    );
    s.act(Action::Help);
    let lines = screen(&s, &names, 80, 24);
    assert!(lines[3].starts_with("Tab/→ next stream"), "{}", lines.join("\n"));
}
