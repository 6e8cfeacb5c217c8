//! Passthrough results: each encoded `ProfileBatch` kept whole in `profile_batches` (what a replay sends, byte
//! for byte), and taken apart into `samples` (rank x event) and `counters` (rank x counter) rows for queries.

use canopy_proto::filters::v1::Metric;
use canopy_wire::event_metrics::{self, Side};
use canopy_wire::options::metric;
use canopy_wire::v1::{ProfileBatch, TraceKind};
use rusqlite::{Connection, Transaction, params};

use crate::rows::{CounterRow, EventMetricRow, SampleRow, TraceRow};
use crate::sql::{id_bits, sat};
use crate::table_row::TableRow;
use crate::words::Word;

/// The result type of a stream whose results are rank profiles (the passthrough filter's).
pub const PROFILE_BATCH_TYPE: &str = "canopy.v1.ProfileBatch";

/// Writes one batch: its bytes as they came, and its rows.
pub(crate) fn write(
    tx: &Transaction<'_>,
    stream_id: u32,
    round: u64,
    bytes: &[u8],
    batch: &ProfileBatch,
    late: bool,
) -> rusqlite::Result<()> {
    let round = sat(round);
    tx.prepare_cached("INSERT INTO profile_batches (stream_id, round, batch, late) VALUES (?1, ?2, ?3, ?4)")?
        .execute(params![stream_id, round, bytes, late])?;
    // Each insert binds its row's values in the order of its row type's columns (crate::rows).
    let mut sample = tx.prepare_cached(SampleRow::insert())?;
    let mut counter = tx.prepare_cached(CounterRow::insert())?;
    let mut event_metric = tx.prepare_cached(EventMetricRow::insert())?;
    let mut trace = tx.prepare_cached(TraceRow::insert())?;
    for p in &batch.profiles {
        let dump = (p.dump_unix_ns > 0).then(|| sat(p.dump_unix_ns));
        for t in &p.trace {
            let kind = TraceKind::try_from(t.kind).unwrap_or_default();
            let (id, send) = match kind {
                TraceKind::Begin | TraceKind::End => (Some(id_bits(t.id)), false),
                TraceKind::Send => (None, true),
                _ => (None, false),
            };
            trace.execute(params![
                stream_id,
                round,
                p.app,
                p.rank,
                t.thread,
                sat(t.unix_ns),
                trace_word(kind),
                id,
                send.then_some(t.peer),
                send.then(|| sat(t.bytes)),
                late
            ])?;
        }
        if p.trace_lost > 0 {
            tx.prepare_cached(
                "INSERT INTO trace_lost (stream_id, round, app, rank, lost) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![stream_id, round, p.app, p.rank, sat(p.trace_lost)])?;
        }
        // A metric the rank's options left out is stored as NULL, not as a zero it never measured.
        let has = |bit: u32| metric::reports(p.metrics, bit);
        let (calls, incl, excl) = (has(metric::CALLS), has(metric::INCLUSIVE), has(metric::EXCLUSIVE));
        for e in &p.events {
            sample.execute(params![
                stream_id,
                round,
                p.app,
                p.rank,
                id_bits(e.event_id),
                calls.then(|| sat(e.calls)),
                calls.then(|| sat(e.subrs)),
                incl.then_some(e.incl_us),
                excl.then_some(e.excl_us),
                calls.then(|| sat(e.calls_total)),
                calls.then(|| sat(e.subrs_total)),
                incl.then_some(e.incl_total_us),
                excl.then_some(e.excl_total_us),
                dump,
                late,
            ])?;
            // Its per-event metrics, matched with the profile's list by position; a metric this version does
            // not know, or one the options left out, is not stored.
            for (k, m) in p.event_metrics.iter().enumerate() {
                let Some((_, side)) = event_metrics::of_metric(*m as i32) else {
                    continue;
                };
                let reported = match side {
                    Side::Inclusive => incl,
                    Side::Exclusive => excl,
                    Side::AtEntry => true,
                };
                let word = Metric::try_from(*m as i32).map(Word::word);
                if let (true, Ok(word)) = (reported, word) {
                    event_metric.execute(params![
                        stream_id,
                        round,
                        p.app,
                        p.rank,
                        id_bits(e.event_id),
                        word,
                        e.metrics.get(k),
                        e.metrics_total.get(k),
                        late
                    ])?;
                }
            }
        }
        for c in &p.counters {
            counter.execute(params![
                stream_id,
                round,
                p.app,
                p.rank,
                id_bits(c.counter_id),
                c.value,
                c.total,
                dump,
                late
            ])?;
        }
    }
    Ok(())
}

/// The word the `trace` table keeps for a kind of event.
pub fn trace_word(kind: TraceKind) -> &'static str {
    match kind {
        TraceKind::Begin => "begin",
        TraceKind::End => "end",
        TraceKind::Send => "send",
        TraceKind::IdleBegin => "idle_begin",
        TraceKind::IdleEnd => "idle_end",
        TraceKind::Unspecified => "unknown",
    }
}

/// The batches a round was closed with (late ones left out), in the order they were stored, as one encoded
/// `ProfileBatch`: a wait-for-all round has one batch, returned as it was stored; a don't-wait round has one
/// per piece, and the encodings of messages with only repeated fields concatenate into the encoding of their
/// merge. `None` if the store has no batch of the round (it was stored before schema version 3, say).
pub(crate) fn read(conn: &Connection, stream_id: u32, round: u64) -> rusqlite::Result<Option<Vec<u8>>> {
    let mut st = conn.prepare_cached(
        "SELECT batch FROM profile_batches WHERE stream_id = ?1 AND round = ?2 AND late = 0 ORDER BY rowid",
    )?;
    let mut rows = st.query(params![stream_id, sat(round)])?;
    let mut out: Option<Vec<u8>> = None;
    while let Some(row) = rows.next()? {
        let piece: Vec<u8> = row.get(0)?;
        match &mut out {
            None => out = Some(piece),
            Some(bytes) => bytes.extend_from_slice(&piece),
        }
    }
    Ok(out)
}
