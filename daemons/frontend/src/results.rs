//! The standard filters' results as tables: `stats`, `histograms`, `classes` and `reductions`, decoded from
//! the result message a stream's filter declares (any plugin whose result type is one of the standard
//! messages gets the same tables). Other results stay as blobs in `results`.

use canopy_proto::filters::v1::{
    ClassResult, EventStats, Histogram, HistogramResult, Metric, RankRange, StatsResult,
};
use prost::Message;
use rusqlite::{Transaction, params};

/// The tables, created with the rest of the schema.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS stats (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    class_id INTEGER,
    id INTEGER NOT NULL,
    metric TEXT NOT NULL,
    count INTEGER NOT NULL,
    mean REAL,
    std REAL,
    min REAL,
    max REAL,
    min_app TEXT,
    min_rank INTEGER,
    max_app TEXT,
    max_rank INTEGER,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS stats_by_round ON stats (stream_id, round);
CREATE TABLE IF NOT EXISTS histograms (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    class_id INTEGER,
    id INTEGER NOT NULL,
    metric TEXT NOT NULL,
    bin INTEGER NOT NULL,
    lo REAL,
    hi REAL,
    count INTEGER NOT NULL,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS histograms_by_round ON histograms (stream_id, round);
CREATE TABLE IF NOT EXISTS classes (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    class_id INTEGER NOT NULL,
    size INTEGER NOT NULL,
    ranks TEXT NOT NULL,
    example_event TEXT,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS classes_by_round ON classes (stream_id, round);
CREATE TABLE IF NOT EXISTS reductions (
    stream_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    raw_bytes INTEGER NOT NULL,
    result_bytes INTEGER NOT NULL,
    reduction_factor REAL,
    classes INTEGER,
    late INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS reductions_by_round ON reductions (stream_id, round);
";

/// The result types that get tables.
pub fn is_tabulated(result_type: &str) -> bool {
    matches!(
        result_type,
        "canopy.filters.v1.StatsResult"
            | "canopy.filters.v1.HistogramResult"
            | "canopy.filters.v1.ClassResult"
    )
}

pub fn metric_word(m: i32) -> &'static str {
    match Metric::try_from(m).unwrap_or(Metric::Unspecified) {
        Metric::Calls => "calls",
        Metric::Inclusive => "inclusive",
        Metric::Exclusive => "exclusive",
        Metric::Counter => "counter",
        Metric::Unspecified => "unspecified",
    }
}

/// Writes the rows of one result; a payload that does not decode as its declared type is an error.
pub fn write(
    tx: &Transaction<'_>,
    stream_id: u32,
    round: u64,
    result_type: &str,
    payload: &[u8],
    late: bool,
) -> Result<(), String> {
    let round = i64::try_from(round).unwrap_or(i64::MAX);
    let late = i64::from(late);
    let sql = |e: rusqlite::Error| e.to_string();
    match result_type {
        "canopy.filters.v1.StatsResult" => {
            let r = StatsResult::decode(payload).map_err(|e| format!("not a StatsResult: {e}"))?;
            write_stats(tx, stream_id, round, None, &r.stats, late).map_err(sql)?;
            write_reduction(
                tx,
                stream_id,
                round,
                r.raw_bytes,
                payload.len() as u64,
                None,
                late,
            )
            .map_err(sql)
        }
        "canopy.filters.v1.HistogramResult" => {
            let r = HistogramResult::decode(payload).map_err(|e| format!("not a HistogramResult: {e}"))?;
            write_stats(tx, stream_id, round, None, &r.stats, late).map_err(sql)?;
            write_histograms(tx, stream_id, round, None, &r.histograms, late).map_err(sql)?;
            write_reduction(
                tx,
                stream_id,
                round,
                r.raw_bytes,
                payload.len() as u64,
                None,
                late,
            )
            .map_err(sql)
        }
        "canopy.filters.v1.ClassResult" => {
            let r = ClassResult::decode(payload).map_err(|e| format!("not a ClassResult: {e}"))?;
            for c in &r.classes {
                let class = Some(c.class_id as i64);
                tx.prepare_cached(
                    "INSERT INTO classes (stream_id, round, class_id, size, ranks, example_event, late)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .and_then(|mut st| {
                    st.execute(params![
                        stream_id,
                        round,
                        c.class_id as i64,
                        c.size,
                        ranges_text(&c.ranks),
                        c.example_event,
                        late
                    ])
                })
                .map_err(sql)?;
                write_stats(tx, stream_id, round, class, &c.stats, late).map_err(sql)?;
                write_histograms(tx, stream_id, round, class, &c.histograms, late).map_err(sql)?;
            }
            let classes = Some(r.classes.len() as i64);
            write_reduction(tx, stream_id, round, r.raw_bytes, r.result_bytes, classes, late).map_err(sql)
        }
        _ => Ok(()),
    }
}

/// Rank ranges as text: `app:0-7,9,12-15`, the app named once for each run of its ranges.
pub fn ranges_text(ranges: &[RankRange]) -> String {
    let mut out = String::new();
    let mut app: Option<&str> = None;
    for r in ranges {
        if !out.is_empty() {
            out.push(',');
        }
        if app != Some(r.app.as_str()) && !r.app.is_empty() {
            out.push_str(&r.app);
            out.push(':');
        }
        app = Some(r.app.as_str());
        if r.first == r.last {
            out.push_str(&r.first.to_string());
        } else {
            out.push_str(&format!("{}-{}", r.first, r.last));
        }
    }
    out
}

fn write_stats(
    tx: &Transaction<'_>,
    stream_id: u32,
    round: i64,
    class: Option<i64>,
    stats: &[EventStats],
    late: i64,
) -> rusqlite::Result<()> {
    let mut st = tx.prepare_cached(
        "INSERT INTO stats (stream_id, round, class_id, id, metric, count, mean, std, min, max,
                            min_app, min_rank, max_app, max_rank, late)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
    )?;
    for s in stats {
        let sum = s.summary.clone().unwrap_or_default();
        let (min_r, max_r) = (sum.min_rank.unwrap_or_default(), sum.max_rank.unwrap_or_default());
        st.execute(params![
            stream_id,
            round,
            class,
            s.id as i64,
            metric_word(s.metric),
            i64::try_from(sum.count).unwrap_or(i64::MAX),
            sum.mean,
            sum.std,
            sum.min,
            sum.max,
            min_r.app,
            min_r.rank,
            max_r.app,
            max_r.rank,
            late
        ])?;
    }
    Ok(())
}

fn write_histograms(
    tx: &Transaction<'_>,
    stream_id: u32,
    round: i64,
    class: Option<i64>,
    histograms: &[Histogram],
    late: i64,
) -> rusqlite::Result<()> {
    let mut st = tx.prepare_cached(
        "INSERT INTO histograms (stream_id, round, class_id, id, metric, bin, lo, hi, count, late)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?;
    for h in histograms {
        let bins = h.counts.len().max(1) as f64;
        let width = (h.hi - h.lo) / bins;
        for (b, count) in h.counts.iter().enumerate() {
            let lo = h.lo + width * b as f64;
            let hi = if b + 1 == h.counts.len() {
                h.hi
            } else {
                h.lo + width * (b + 1) as f64
            };
            st.execute(params![
                stream_id,
                round,
                class,
                h.id as i64,
                metric_word(h.metric),
                b as i64,
                lo,
                hi,
                i64::try_from(*count).unwrap_or(i64::MAX),
                late
            ])?;
        }
    }
    Ok(())
}

fn write_reduction(
    tx: &Transaction<'_>,
    stream_id: u32,
    round: i64,
    raw_bytes: u64,
    result_bytes: u64,
    classes: Option<i64>,
    late: i64,
) -> rusqlite::Result<()> {
    let factor = if result_bytes == 0 {
        None
    } else {
        Some(raw_bytes as f64 / result_bytes as f64)
    };
    tx.prepare_cached(
        "INSERT INTO reductions (stream_id, round, raw_bytes, result_bytes, reduction_factor, classes, late)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        stream_id,
        round,
        i64::try_from(raw_bytes).unwrap_or(i64::MAX),
        i64::try_from(result_bytes).unwrap_or(i64::MAX),
        factor,
        classes,
        late
    ])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_read_as_text() {
        let r = |app: &str, first, last| RankRange {
            app: app.into(),
            first,
            last,
        };
        assert_eq!(ranges_text(&[r("", 0, 0), r("", 2, 9)]), "0,2-9");
        assert_eq!(ranges_text(&[r("lulesh", 4, 7)]), "lulesh:4-7");
        assert_eq!(
            ranges_text(&[r("a", 0, 7), r("a", 9, 9), r("b", 0, 1)]),
            "a:0-7,9,b:0-1"
        );
    }

    #[test]
    fn a_stats_result_becomes_rows_and_a_bad_one_is_refused() {
        use canopy_proto::filters::v1::{RankRef, Summary};
        let mut conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        let summary = Summary {
            count: 4,
            mean: 2.5,
            m2: 5.0,
            std: 1.118,
            min: 1.0,
            max: 4.0,
            min_rank: Some(RankRef {
                app: "a".into(),
                rank: 0,
            }),
            max_rank: Some(RankRef {
                app: "a".into(),
                rank: 3,
            }),
        };
        let r = StatsResult {
            stats: vec![EventStats {
                id: u64::MAX,
                metric: Metric::Exclusive as i32,
                summary: Some(summary),
            }],
            raw_bytes: 1000,
        };
        let tx = conn.transaction().unwrap();
        write(
            &tx,
            1,
            7,
            "canopy.filters.v1.StatsResult",
            &r.encode_to_vec(),
            false,
        )
        .unwrap();
        assert!(write(&tx, 1, 8, "canopy.filters.v1.StatsResult", &[0xff, 0xff], false).is_err());
        tx.commit().unwrap();
        let (id, metric, count, max_rank): (i64, String, i64, i64) = conn
            .query_row(
                "SELECT id, metric, count, max_rank FROM stats WHERE round = 7",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        assert_eq!(
            (id as u64, metric.as_str(), count, max_rank),
            (u64::MAX, "exclusive", 4, 3)
        );
        let factor: f64 = conn
            .query_row("SELECT reduction_factor FROM reductions", [], |r| r.get(0))
            .unwrap();
        assert!(factor > 1.0);
    }
}
