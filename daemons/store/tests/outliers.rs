//! The outliers filter's results as tables: a row per kept rank in its place, a row per weighing event, the
//! named views, the typed reader, and a result that does not decode refused.

mod common;

use canopy_proto::filters::v1::{Metric, Outlier, OutlierEvent, OutlierGroup, OutliersResult};
use canopy_store::{Select, Store, StoreReader, Table};
use prost::Message;
use rusqlite::Connection;

const TYPE: &str = "canopy.filters.v1.OutliersResult";

fn outlier(app: &str, rank: u32, score: f64, events: &[(u64, f64)]) -> Outlier {
    Outlier {
        app: app.into(),
        rank,
        score,
        events: events
            .iter()
            .map(|&(id, contribution)| OutlierEvent {
                id,
                value: 30.0,
                mean: 10.0,
                std: 4.0,
                contribution,
                metric: 0,
            })
            .collect(),
    }
}

#[test]
fn outliers_become_a_row_per_kept_rank_and_weighing_event() {
    let dir = tempfile::Builder::new()
        .prefix("canopy-store-outliers-")
        .tempdir()
        .unwrap();
    let mut store = Store::create(dir.path()).unwrap();
    store.put_names(&[(7, "solve".into())]).unwrap();
    // A class id above 2^63 reads back unsigned.
    let class = 0x9000_0000_0000_0001u64;
    let result = OutliersResult {
        groups: vec![
            OutlierGroup {
                class_id: 5,
                ranks: 40,
                keep: 2,
                top: vec![
                    outlier("sim", 6, 5.0, &[(7, 5.0)]),
                    outlier("sim", 1, 2.5, &[(7, 2.0), (u64::MAX, 0.5)]),
                ],
                ..Default::default()
            },
            OutlierGroup {
                class_id: class,
                ranks: 1,
                keep: 2,
                top: vec![outlier("post", 0, 0.0, &[])],
                ..Default::default()
            },
        ],
        within: "class".into(),
        weighted: false,
        metric: Metric::Exclusive as i32,
        events: "all".into(),
        raw_bytes: 4000,
        ..Default::default()
    };
    let bytes = result.encode_to_vec();
    store.write_filter_tables(4, 2, TYPE, &bytes, false).unwrap();
    // Scored over several metrics, each event names its own.
    let mut several = result.clone();
    several.metric = 0;
    several.metrics = vec![
        Metric::Calls as i32,
        Metric::Exclusive as i32,
        Metric::Counter as i32,
    ];
    several.groups.truncate(1);
    several.groups[0].top.truncate(1);
    several.groups[0].top[0].events[0].metric = Metric::Calls as i32;
    store
        .write_filter_tables(6, 2, TYPE, &several.encode_to_vec(), false)
        .unwrap();
    let err = store
        .write_filter_tables(4, 3, TYPE, &[0xff, 0xff], false)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("cannot decode the OutliersResult of stream 4 round 3: "),
        "{err}"
    );

    let r = StoreReader::open(store.path()).unwrap();
    let rows = r.outliers(Select::all().stream(4)).unwrap();
    let got: Vec<_> = rows
        .iter()
        .map(|o| {
            (
                o.round,
                o.class_id,
                o.position,
                o.app.as_str(),
                o.rank,
                o.score,
                o.group_ranks,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (2, 5, 0, "sim", 6, 5.0, 40),
            (2, 5, 1, "sim", 1, 2.5, 40),
            (2, class, 0, "post", 0, 0.0, 1),
        ]
    );
    let calls = r.outlier_events(Select::all().stream(6)).unwrap();
    assert_eq!(
        calls.iter().map(|e| (e.event_id, e.metric)).collect::<Vec<_>>(),
        [(7, Metric::Calls)]
    );
    let events = r.outlier_events(Select::all().stream(4)).unwrap();
    let got: Vec<_> = events
        .iter()
        .map(|e| (e.position, e.event_position, e.event_id, e.metric, e.contribution))
        .collect();
    assert_eq!(
        got,
        [
            (0, 0, 7, Metric::Exclusive, 5.0),
            (1, 0, 7, Metric::Exclusive, 2.0),
            (1, 1, u64::MAX, Metric::Exclusive, 0.5),
        ]
    );
    // Stream 4's three, and stream 6's one.
    assert_eq!(r.count(Table::Outliers).unwrap(), 4);
    assert_eq!(r.count(Table::OutlierEvents).unwrap(), 4);
    let reductions = r.reductions(Select::all().stream(4)).unwrap();
    assert_eq!(reductions.len(), 1, "the refused round left nothing");

    // As analysts read them: each event beside its rank, named, with its unit.
    let conn = Connection::open(store.path()).unwrap();
    let named: Vec<(String, u32, String, String, f64)> = conn
        .prepare(
            "SELECT app, rank, event, unit, contribution FROM outlier_events_named
             WHERE round = 2 ORDER BY class_id, position, event_position",
        )
        .unwrap()
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        named,
        [
            ("sim".into(), 6, "solve".into(), "us".into(), 5.0),
            // Stream 6's event, in calls.
            ("sim".into(), 6, "solve".into(), "calls".into(), 5.0),
            ("sim".into(), 1, "solve".into(), "us".into(), 2.0),
            ("sim".into(), 1, "ffffffffffffffff".into(), "us".into(), 0.5),
        ]
    );
    let hex: String = conn
        .query_row(
            "SELECT class_hex FROM outliers_named WHERE app = 'post'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(hex, "9000000000000001");
}
