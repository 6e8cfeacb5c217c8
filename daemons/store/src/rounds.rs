//! The `rounds` table: one row per (stream, round) with its coverage, the pieces of a don't-wait round
//! added up in it.

use std::sync::OnceLock;

use canopy_proto::v1::MissingReason;
use rusqlite::{OptionalExtension, Transaction, params};

use crate::rows::{LateArrival, RoundAppRow, RoundRow};
use crate::schema::SCHEMA_VERSION;
use crate::sql::sat;
use crate::table_row::{TableRow, select_list};
use crate::words::{REASONS, Word, reason_index};

/// What the root knows about one closed round (or one piece of a don't-wait round).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoundRecord {
    pub stream_id: u32,
    pub stream_name: String,
    pub round: u64,
    pub covered: u32,
    pub expected: u32,
    pub missing: Vec<(MissingReason, u32)>,
    /// 0 when unknown.
    pub first_dump_unix_ns: u64,
    /// 0 when unknown.
    pub closed_unix_ns: u64,
    /// Each application's part of the coverage, as far as the tree could tell (`round_apps`).
    pub apps: Vec<AppRecord>,
    /// The nodes that were unreachable when the round closed, with their ranks (some of the ranks counted
    /// unreachable, or all of them).
    pub unreachable: Vec<(String, u32)>,
}

impl RoundRecord {
    /// A round as the root closed it, with its `coverage` as the tree sent it: the one conversion from the tree's
    /// coverage to what the store writes (the writer stamps `closed_unix_ns`).
    pub fn of(
        stream_id: u32,
        stream_name: &str,
        round: u64,
        coverage: &canopy_proto::v1::Coverage,
        first_dump_unix_ns: u64,
    ) -> RoundRecord {
        RoundRecord {
            stream_id,
            stream_name: stream_name.to_string(),
            round,
            covered: coverage.covered,
            expected: coverage.expected,
            missing: coverage.missing.iter().map(|m| (m.reason(), m.ranks)).collect(),
            first_dump_unix_ns,
            closed_unix_ns: 0,
            apps: coverage
                .apps
                .iter()
                .map(|a| AppRecord {
                    app: a.app.clone(),
                    covered: a.covered,
                    expected: a.expected,
                    missing: a.missing.iter().map(|m| (m.reason(), m.ranks)).collect(),
                })
                .collect(),
            unreachable: coverage
                .unreachable
                .iter()
                .map(|u| (u.node.clone(), u.ranks))
                .collect(),
        }
    }
}

/// One application's part of a round's coverage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppRecord {
    pub app: String,
    pub covered: u32,
    pub expected: u32,
    pub missing: Vec<(MissingReason, u32)>,
}

/// Ranks missing from a round, per reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MissingCounts([u32; REASONS]);

impl MissingCounts {
    /// Ranks missing for `reason`.
    pub fn get(&self, reason: MissingReason) -> u32 {
        self.0[reason_index(reason)]
    }

    /// The reasons with ranks, in the proto's order.
    pub fn iter(&self) -> impl Iterator<Item = (MissingReason, u32)> + '_ {
        MissingReason::WORDS
            .iter()
            .map(|(r, _)| (*r, self.get(*r)))
            .filter(|(_, n)| *n > 0)
    }

    /// Ranks missing for any reason.
    pub fn total(&self) -> u64 {
        self.0.iter().map(|n| u64::from(*n)).sum()
    }

    pub(crate) fn set(&mut self, reason: MissingReason, ranks: u32) {
        self.0[reason_index(reason)] = ranks;
    }
}

/// The schema version that added `reason`'s column to `rounds` (and to `round_apps`, where it came later than
/// the table itself).
pub(crate) fn column_since(reason: MissingReason) -> u32 {
    match reason {
        MissingReason::Dropped => 2,
        MissingReason::Absent => 4,
        MissingReason::StoreFailed => 19,
        MissingReason::Unreachable => 20,
        _ => 1,
    }
}

/// The most nodes a round's row names unreachable (as many as one coverage names).
const MAX_NODES_NAMED: usize = 16;

/// Counts of one round row, kept in u64 so that summing pieces cannot overflow before saturation.
#[derive(Debug, Default)]
struct Tally {
    covered: u64,
    expected: u64,
    missing: [u64; REASONS],
    result_bytes: u64,
    pieces: u64,
    first_dump_unix_ns: Option<u64>,
    closed_unix_ns: Option<u64>,
    /// The unreachable nodes and their ranks, sorted by node.
    unreachable: Vec<(String, u64)>,
}

impl Tally {
    fn of_app(rec: &AppRecord) -> Tally {
        let mut t = Tally {
            covered: rec.covered.into(),
            expected: rec.expected.into(),
            pieces: 1,
            ..Tally::default()
        };
        for (reason, ranks) in &rec.missing {
            t.missing[reason_index(*reason)] += u64::from(*ranks);
        }
        t
    }

    /// A stored round's row, to add a later piece to.
    fn of_row(row: &RoundRow) -> Tally {
        let mut t = Tally {
            covered: row.covered.into(),
            expected: row.expected.into(),
            result_bytes: row.result_bytes,
            pieces: row.pieces.into(),
            first_dump_unix_ns: row.first_dump_unix_ns,
            closed_unix_ns: row.closed_unix_ns,
            ..Tally::default()
        };
        t.read_nodes(row.unreachable_nodes.as_deref());
        t.read_missing(&row.missing);
        t
    }

    /// A stored application's row, to add a later piece to.
    fn of_app_row(row: &RoundAppRow) -> Tally {
        let mut t = Tally {
            covered: row.covered.into(),
            expected: row.expected.into(),
            ..Tally::default()
        };
        t.read_missing(&row.missing);
        t
    }

    fn read_missing(&mut self, missing: &MissingCounts) {
        for (reason, _) in MissingReason::WORDS {
            self.missing[reason_index(*reason)] = missing.get(*reason).into();
        }
    }

    fn missing_counts(&self) -> MissingCounts {
        let mut counts = MissingCounts::default();
        for (reason, _) in MissingReason::WORDS {
            counts.set(*reason, count32(self.missing[reason_index(*reason)]));
        }
        counts
    }

    fn of(rec: &RoundRecord, result_bytes: usize) -> Tally {
        let mut t = Tally {
            covered: rec.covered.into(),
            expected: rec.expected.into(),
            result_bytes: result_bytes as u64,
            pieces: 1,
            first_dump_unix_ns: (rec.first_dump_unix_ns > 0).then_some(rec.first_dump_unix_ns),
            closed_unix_ns: (rec.closed_unix_ns > 0).then_some(rec.closed_unix_ns),
            ..Tally::default()
        };
        for (node, ranks) in &rec.unreachable {
            t.add_unreachable(node, u64::from(*ranks));
        }
        for (reason, ranks) in &rec.missing {
            t.missing[reason_index(*reason)] += u64::from(*ranks);
        }
        t
    }

    /// Adds a later piece of one application's part of a round: the pieces of a don't-wait round cover different
    /// ranks, and no node counts an application's ranks as not waited for, so every count adds up.
    fn add(&mut self, piece: &Tally) {
        self.covered += piece.covered;
        self.expected += piece.expected;
        for (mine, theirs) in self.missing.iter_mut().zip(&piece.missing) {
            *mine += theirs;
        }
    }

    /// Adds a later piece of the same round. Ranks not waited for are whatever no piece has accounted for yet:
    /// summing each piece's own "not waited" count would count a rank again after it arrived. Returns how many
    /// ranks the pieces account for beyond `expected`, which only inconsistent callers produce.
    fn merge(&mut self, piece: Tally) -> u64 {
        let not_waited = reason_index(MissingReason::NotWaited);
        self.covered += piece.covered;
        self.expected = self.expected.max(piece.expected);
        for (i, ranks) in piece.missing.iter().enumerate() {
            self.missing[i] += ranks;
        }
        let accounted = self.covered
            + self
                .missing
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != not_waited)
                .map(|(_, r)| r)
                .sum::<u64>();
        self.missing[not_waited] = self.expected.saturating_sub(accounted);
        self.result_bytes += piece.result_bytes;
        self.pieces += piece.pieces;
        self.first_dump_unix_ns = match (self.first_dump_unix_ns, piece.first_dump_unix_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.closed_unix_ns = self.closed_unix_ns.max(piece.closed_unix_ns);
        for (node, ranks) in &piece.unreachable {
            self.add_unreachable(node, *ranks);
        }
        accounted.saturating_sub(self.expected)
    }

    fn add_unreachable(&mut self, node: &str, ranks: u64) {
        match self.unreachable.binary_search_by(|(n, _)| n.as_str().cmp(node)) {
            Ok(i) => self.unreachable[i].1 += ranks,
            Err(i) => self.unreachable.insert(i, (node.to_string(), ranks)),
        }
    }

    /// `relay0=16, agent:3=8`: the `unreachable_nodes` column, most ranks first.
    fn nodes_text(&self) -> Option<String> {
        let mut nodes: Vec<&(String, u64)> = self.unreachable.iter().collect();
        nodes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        // The pieces of a round may name more nodes between them than one coverage does: the most ranks first.
        let text: Vec<String> = nodes
            .iter()
            .take(MAX_NODES_NAMED)
            .map(|(n, r)| format!("{n}={r}"))
            .collect();
        (!text.is_empty()).then(|| text.join(", "))
    }

    /// Reads the `unreachable_nodes` column back.
    fn read_nodes(&mut self, text: Option<&str>) {
        for part in text.iter().flat_map(|t| t.split(", ")) {
            if let Some((node, ranks)) = part.rsplit_once('=')
                && let Ok(ranks) = ranks.parse()
            {
                self.add_unreachable(node, ranks);
            }
        }
    }

    /// "lost: 16, late: 2": the largest counts first, since they explain most of the gap.
    fn reason_text(&self) -> Option<String> {
        let mut parts: Vec<(u64, MissingReason)> = MissingReason::WORDS
            .iter()
            .map(|(r, _)| (self.missing[reason_index(*r)], *r))
            .filter(|(n, _)| *n > 0)
            .collect();
        if parts.is_empty() {
            return None;
        }
        parts.sort_by(|a, b| b.0.cmp(&a.0).then((a.1 as i32).cmp(&(b.1 as i32))));
        let nodes = self.nodes_text();
        let text = parts
            .iter()
            .map(|(ranks, reason)| match (reason, &nodes) {
                (MissingReason::Unreachable, Some(nodes)) => format!("{}: {ranks} ({nodes})", reason.word()),
                _ => format!("{}: {ranks}", reason.word()),
            })
            .collect::<Vec<_>>()
            .join(", ");
        Some(text)
    }
}

/// Upserts the row of `rec` (a later piece adds to it). Returns how many ranks the merged pieces account for
/// beyond `expected` (0 when consistent).
pub(crate) fn upsert(tx: &Transaction<'_>, rec: &RoundRecord, result_bytes: usize) -> rusqlite::Result<u64> {
    static SELECT: OnceLock<String> = OnceLock::new();
    let select = SELECT.get_or_init(|| {
        format!(
            "SELECT {} FROM rounds WHERE stream_id = ?1 AND round = ?2",
            select_list(RoundRow::columns(), SCHEMA_VERSION)
        )
    });
    let mut tally = Tally::of(rec, result_bytes);
    let mut excess = 0;
    let existing = tx
        .prepare_cached(select)?
        .query_row(params![rec.stream_id, sat(rec.round)], RoundRow::read)
        .optional()?;
    if let Some(old) = existing {
        let mut old = Tally::of_row(&old);
        excess = old.merge(tally);
        tally = old;
    }
    let row = RoundRow {
        stream_id: rec.stream_id,
        stream: rec.stream_name.clone(),
        round: rec.round,
        covered: count32(tally.covered),
        expected: count32(tally.expected),
        missing: tally.missing_counts(),
        missing_reason: tally.reason_text(),
        unreachable_nodes: tally.nodes_text(),
        late_ranks: 0,
        result_bytes: tally.result_bytes,
        pieces: count32(tally.pieces),
        first_dump_unix_ns: tally.first_dump_unix_ns,
        closed_unix_ns: tally.closed_unix_ns,
    };
    write(tx, &row)?;
    for app in &rec.apps {
        upsert_app(tx, rec.stream_id, rec.round, app)?;
    }
    Ok(excess)
}

/// The round's row counted `ranks` of `source` as `counted` (late, or unreachable) though the source finished
/// before the round: they move to `stopped`, and the row's reason and unreachable nodes say so; so do the
/// applications' rows, by `apps` (the source's ranks by application, as the round split them; empty: not split).
/// Returns whether the round has a row.
pub(crate) fn recount_stopped(
    tx: &Transaction<'_>,
    stream_id: u32,
    round: u64,
    counted: MissingReason,
    ranks: u32,
    source: &str,
    apps: &[(String, u32)],
) -> rusqlite::Result<bool> {
    static SELECT: OnceLock<String> = OnceLock::new();
    let select = SELECT.get_or_init(|| {
        format!(
            "SELECT {} FROM rounds WHERE stream_id = ?1 AND round = ?2",
            select_list(RoundRow::columns(), SCHEMA_VERSION)
        )
    });
    let Some(old) = tx
        .prepare_cached(select)?
        .query_row(params![stream_id, sat(round)], RoundRow::read)
        .optional()?
    else {
        return Ok(false);
    };
    let mut tally = Tally::of_row(&old);
    let from = reason_index(counted);
    let moved = u64::from(ranks).min(tally.missing[from]);
    tally.missing[from] -= moved;
    tally.missing[reason_index(MissingReason::Stopped)] += moved;
    if counted == MissingReason::Unreachable
        && let Ok(i) = tally
            .unreachable
            .binary_search_by(|(n, _)| n.as_str().cmp(source))
    {
        tally.unreachable[i].1 = tally.unreachable[i].1.saturating_sub(moved);
        if tally.unreachable[i].1 == 0 {
            tally.unreachable.remove(i);
        }
    }
    let row = RoundRow {
        missing: tally.missing_counts(),
        missing_reason: tally.reason_text(),
        unreachable_nodes: tally.nodes_text(),
        ..old
    };
    write(tx, &row)?;
    static SELECT_APP: OnceLock<String> = OnceLock::new();
    let select_app = SELECT_APP.get_or_init(|| {
        format!(
            "SELECT {} FROM round_apps WHERE stream_id = ?1 AND round = ?2 AND app = ?3",
            select_list(RoundAppRow::columns(), SCHEMA_VERSION)
        )
    });
    for (app, ranks) in apps {
        let Some(old) = tx
            .prepare_cached(select_app)?
            .query_row(params![stream_id, sat(round), app], RoundAppRow::read)
            .optional()?
        else {
            continue;
        };
        let mut tally = Tally::of_app_row(&old);
        let moved = u64::from(*ranks).min(tally.missing[from]);
        tally.missing[from] -= moved;
        tally.missing[reason_index(MissingReason::Stopped)] += moved;
        let row = RoundAppRow {
            missing: tally.missing_counts(),
            missing_reason: tally.reason_text(),
            ..old
        };
        write(tx, &row)?;
    }
    Ok(true)
}

/// Upserts the `round_apps` row of one application of a round, as [`upsert`] does the round's.
fn upsert_app(tx: &Transaction<'_>, stream_id: u32, round: u64, rec: &AppRecord) -> rusqlite::Result<()> {
    static SELECT: OnceLock<String> = OnceLock::new();
    let select = SELECT.get_or_init(|| {
        format!(
            "SELECT {} FROM round_apps WHERE stream_id = ?1 AND round = ?2 AND app = ?3",
            select_list(RoundAppRow::columns(), SCHEMA_VERSION)
        )
    });
    let mut tally = Tally::of_app(rec);
    let existing = tx
        .prepare_cached(select)?
        .query_row(params![stream_id, sat(round), rec.app], RoundAppRow::read)
        .optional()?;
    if let Some(old) = existing {
        let mut old = Tally::of_app_row(&old);
        old.add(&tally);
        tally = old;
    }
    let row = RoundAppRow {
        stream_id,
        round,
        app: rec.app.clone(),
        covered: count32(tally.covered),
        expected: count32(tally.expected),
        missing: tally.missing_counts(),
        missing_reason: tally.reason_text(),
    };
    write(tx, &row)
}

/// Writes a row over the one of the same key.
fn write<R: TableRow>(tx: &Transaction<'_>, row: &R) -> rusqlite::Result<()> {
    let mut cells = Vec::with_capacity(R::columns().len());
    row.cells(&mut cells);
    tx.prepare_cached(R::upsert())?
        .execute(rusqlite::params_from_iter(cells))
        .map(drop)
}

/// A count as a row holds it: past `u32`, its largest.
fn count32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The round's row counts every late packet stored for it so far (some came before the row was written).
pub(crate) fn count_late_arrivals(tx: &Transaction<'_>, stream_id: u32, round: u64) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "UPDATE rounds SET late_ranks = (SELECT coalesce(sum(ranks), 0) FROM late_arrivals
                                         WHERE stream_id = ?1 AND round = ?2)
         WHERE stream_id = ?1 AND round = ?2",
    )?
    .execute(params![stream_id, sat(round)])?;
    Ok(())
}

/// A packet that reached the root after its round had closed: one `late_arrivals` row, and the round row's
/// `late_ranks` grows by `ranks`. Returns whether the round has a row.
pub(crate) fn add_late(
    tx: &Transaction<'_>,
    stream_id: u32,
    round: u64,
    ranks: u32,
    bytes: u64,
    now: i64,
) -> rusqlite::Result<bool> {
    tx.prepare_cached(LateArrival::insert())?.execute(params![
        stream_id,
        sat(round),
        ranks,
        sat(bytes),
        now
    ])?;
    let updated = tx
        .prepare_cached("UPDATE rounds SET late_ranks = late_ranks + ?3 WHERE stream_id = ?1 AND round = ?2")?
        .execute(params![stream_id, sat(round), ranks])?;
    Ok(updated > 0)
}

/// The most rows [`fill_dropped_rounds`] writes for one gap: a round number far past its neighbours is a fault
/// of its own, not dumps every rank dropped.
const MAX_GAP_ROWS: u64 = 1 << 20;

/// Writes a row for every round of a stream, between its first and its last stored, that has none: a round no
/// rank delivered reaches no node, so every rank dropped its dump (the application ran ahead of what the tree
/// took, or its agent was not there yet). Each such round expects what the next stored round expected, all of
/// them counted `dropped`. Returns the rows written.
pub(crate) fn fill_dropped_rounds(tx: &Transaction<'_>) -> rusqlite::Result<u64> {
    let gaps: Vec<(u32, String, u64, u64, u32)> = tx
        .prepare(
            "SELECT stream_id, stream_name, prev, round, expected FROM (
                 SELECT stream_id, COALESCE(stream_name, '') AS stream_name, round, expected,
                        LAG(round) OVER (PARTITION BY stream_id ORDER BY round) AS prev
                 FROM rounds)
             WHERE prev IS NOT NULL AND round > prev + 1",
        )?
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                crate::sql::unsigned(r.get(2)?),
                crate::sql::unsigned(r.get(3)?),
                r.get(4)?,
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut written = 0;
    for (stream_id, stream_name, prev, next, expected) in gaps {
        if next - prev - 1 > MAX_GAP_ROWS {
            tracing::warn!(
                stream_id,
                from = prev + 1,
                to = next - 1,
                "a gap of rounds too long to fill: left as it is"
            );
            continue;
        }
        for round in prev + 1..next {
            let record = RoundRecord {
                stream_id,
                stream_name: stream_name.clone(),
                round,
                covered: 0,
                expected,
                missing: vec![(MissingReason::Dropped, expected)],
                ..Default::default()
            };
            upsert(tx, &record, 0)?;
            written += 1;
        }
    }
    Ok(written)
}
