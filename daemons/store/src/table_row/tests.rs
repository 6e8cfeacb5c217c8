use rusqlite::Connection;

use super::*;
use crate::rows::*;
use crate::schema::{self, SCHEMA_VERSION};
use crate::words::Word;

/// The columns of `table` in a new store migrated to `version`.
fn columns_at(version: u32, table: &str) -> Vec<String> {
    let mut conn = Connection::open_in_memory().unwrap();
    schema::migrate_to(&mut conn, version).unwrap();
    let mut st = conn.prepare("SELECT name FROM pragma_table_info(?1)").unwrap();
    st.query_map([table], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// A row type's columns against the frozen migrations: each is in its table from its `since` on and not
/// before, and the table itself from the version the reader expects it.
fn matches_the_schema<R: TableRow>() {
    let table = R::TABLE.name();
    assert!(
        !R::columns().is_empty() && columns_at(R::TABLE.since() - 1, table).is_empty(),
        "{table} exists before version {}",
        R::TABLE.since()
    );
    let latest = columns_at(SCHEMA_VERSION, table);
    for c in R::columns() {
        assert!(
            latest.iter().any(|n| n == c.name),
            "{table}.{} is not in the schema",
            c.name
        );
        let since = c.since.max(R::TABLE.since());
        assert!(
            columns_at(since, table).iter().any(|n| n == c.name),
            "{table}.{} is not there at version {since}",
            c.name
        );
        if c.since > R::TABLE.since() {
            assert!(
                !columns_at(c.since - 1, table).iter().any(|n| n == c.name),
                "{table}.{} is already there at version {}: its since is wrong",
                c.name,
                c.since - 1
            );
        }
    }
    let mut exports: Vec<&str> = R::columns().iter().map(|c| c.export).collect();
    exports.sort_unstable();
    exports.dedup();
    assert_eq!(
        exports.len(),
        R::columns().len(),
        "{table}: two columns export under one name"
    );
    // The insert lists the columns in the table's own order.
    let stored: Vec<&String> = latest
        .iter()
        .filter(|n| R::columns().iter().any(|c| c.name == n.as_str()))
        .collect();
    let listed: Vec<&str> = stored_order(R::TABLE, R::columns())
        .into_iter()
        .map(|i| R::columns()[i].name)
        .collect();
    assert_eq!(
        stored, listed,
        "{table}: the insert's columns against the table's order"
    );
    // The insert binds one parameter per column and prepares against the table.
    let mut conn = Connection::open_in_memory().unwrap();
    schema::migrate(&mut conn).unwrap();
    let st = conn.prepare(R::insert()).unwrap();
    assert_eq!(st.parameter_count(), R::columns().len(), "{table}");
}

#[test]
fn every_row_type_matches_the_tables_the_migrations_build() {
    matches_the_schema::<SampleRow>();
    matches_the_schema::<TraceRow>();
    matches_the_schema::<UtilizationRow>();
    matches_the_schema::<OutlierRow>();
    matches_the_schema::<OutlierEventRow>();
    matches_the_schema::<NodeSampleRow>();
    matches_the_schema::<NodeRanksRow>();
    matches_the_schema::<CounterRow>();
    matches_the_schema::<EventMetricRow>();
    matches_the_schema::<ResultRow>();
    matches_the_schema::<QuantileRow>();
    matches_the_schema::<StatRow>();
    matches_the_schema::<HistogramRow>();
    matches_the_schema::<ClassRow>();
    matches_the_schema::<ClusterRow>();
    matches_the_schema::<LatencyRow>();
    matches_the_schema::<LatencyAppRow>();
    matches_the_schema::<ReductionRow>();
    matches_the_schema::<RoundRow>();
    matches_the_schema::<RoundAppRow>();
    matches_the_schema::<StreamRow>();
    matches_the_schema::<NodeRow>();
    matches_the_schema::<LateArrival>();
}

/// An upsert names each column once and prepares against its table; the words its SQL spells are the words a
/// writer binds.
#[test]
fn upserts_prepare_and_spell_the_stored_words() {
    let mut conn = Connection::open_in_memory().unwrap();
    schema::migrate(&mut conn).unwrap();
    for sql in [
        RoundRow::upsert(),
        RoundAppRow::upsert(),
        StreamRow::upsert(),
        NodeRow::upsert(),
    ] {
        conn.prepare(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    assert!(NodeRow::upsert().contains(&format!("'{}'", canopy_proto::v1::NodeKind::Unspecified.word())));
    assert!(
        !RoundRow::upsert().contains("late_ranks = "),
        "late_ranks is add_late's to keep"
    );
    assert!(!StreamRow::upsert().contains("opened_unix_ns = "));
}

#[test]
fn a_column_reads_back_as_its_field_and_shows_its_value() {
    let mut conn = Connection::open_in_memory().unwrap();
    schema::migrate(&mut conn).unwrap();
    conn.execute(
        StatRow::insert(),
        rusqlite::params![
            3,
            7,
            None::<i64>,
            "lulesh",
            -1i64,
            "exclusive",
            16,
            1.5,
            None::<f64>,
            0.5,
            2.5,
            "lulesh",
            0,
            None::<String>,
            15,
            1
        ],
    )
    .unwrap();
    let sql = format!(
        "SELECT {} FROM stats",
        select_list(StatRow::columns(), SCHEMA_VERSION)
    );
    let row = conn.query_row(&sql, [], StatRow::read).unwrap();
    assert_eq!((row.stream_id, row.round, row.class_id), (3, 7, None));
    assert_eq!((row.id, row.metric, row.count), (u64::MAX, Metric::Exclusive, 16));
    assert_eq!(
        (row.app.as_deref(), row.max_app.as_deref(), row.late),
        (Some("lulesh"), None, true)
    );
    let mut cells = Vec::new();
    row.cells(&mut cells);
    assert_eq!(cells.len(), StatRow::columns().len());
    assert_eq!(cells[4], Value::Int(Some(-1)), "an id's bits, as stored");
    assert_eq!(cells[5], Value::Metric(Metric::Exclusive));
    assert_eq!(cells[8], Value::Float(None));
    // A store from before `stats.app` reads it as NULL.
    assert!(select_list(StatRow::columns(), 14).starts_with("stream_id, round, class_id, NULL, id"));
}
