//! The coverage tables' rows, `rounds` and `round_apps`, declared by hand: their missing counts are one field
//! over a column per reason (`missing_lost`, ...; `missing_lost_ranks` in an export), each from the schema
//! version that added it.

use std::sync::OnceLock;

use canopy_proto::v1::MissingReason;
use rusqlite::Row;

use crate::Table;
use crate::rounds::{MissingCounts, column_since};
use crate::table_row::{Codec, Column, Plain, TableRow, Update, Value, next, statements};
use crate::words::{Word, missing_column};

/// One row of `rounds`: a round's coverage, the pieces of a don't-wait round added up in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundRow {
    pub stream_id: u32,
    pub stream: String,
    pub round: u64,
    pub covered: u32,
    pub expected: u32,
    pub missing: MissingCounts,
    /// A summary of the non-zero reasons, largest first (`lost: 16, late: 2`).
    pub missing_reason: Option<String>,
    /// The nodes behind the ranks counted unreachable, most ranks first (`relay0=16, agent:3=8`).
    pub unreachable_nodes: Option<String>,
    /// Ranks whose packets reached the root after the round was stored.
    pub late_ranks: u32,
    pub result_bytes: u64,
    pub pieces: u32,
    pub first_dump_unix_ns: Option<u64>,
    pub closed_unix_ns: Option<u64>,
}

impl RoundRow {
    /// Every expected rank is covered.
    pub fn is_full(&self) -> bool {
        self.covered == self.expected
    }
}

/// One application's part of a round's coverage (`round_apps`).
#[derive(Debug, Clone, PartialEq)]
pub struct RoundAppRow {
    pub stream_id: u32,
    pub round: u64,
    pub app: String,
    pub covered: u32,
    pub expected: u32,
    pub missing: MissingCounts,
    /// A summary of the non-zero reasons, largest first (`sampled_out: 3`).
    pub missing_reason: Option<String>,
}

/// A column read and written as a field of type `T`, named `export` in an export.
fn column<T>(name: &'static str, export: &'static str) -> Column
where
    Plain: Codec<T>,
{
    Column {
        export,
        ..Column::of::<Plain, T>(name)
    }
}

/// Each reason with its column and that column's name in an export, in the order the tables hold them: the
/// first version put `missing_unspecified` after `missing_not_waited`; the others are in the proto's order, as
/// the versions added them.
fn reasons() -> &'static [(MissingReason, String, String)] {
    static REASONS: OnceLock<Vec<(MissingReason, String, String)>> = OnceLock::new();
    REASONS.get_or_init(|| {
        let mut reasons: Vec<MissingReason> = MissingReason::WORDS
            .iter()
            .map(|(r, _)| *r)
            .filter(|r| *r != MissingReason::Unspecified)
            .collect();
        let at = reasons
            .iter()
            .position(|r| *r == MissingReason::NotWaited)
            .map_or(reasons.len(), |i| i + 1);
        reasons.insert(at, MissingReason::Unspecified);
        reasons
            .into_iter()
            .map(|r| (r, missing_column(r), format!("missing_{}_ranks", r.word())))
            .collect()
    })
}

/// The missing counts' columns, a reason each.
fn missing_columns() -> impl Iterator<Item = Column> {
    reasons().iter().map(|(reason, name, export)| Column {
        since: column_since(*reason),
        ..column::<u32>(name, export)
    })
}

fn read_missing(r: &Row<'_>, at: &mut usize) -> rusqlite::Result<MissingCounts> {
    let mut missing = MissingCounts::default();
    for (reason, ..) in reasons() {
        missing.set(*reason, <Plain as Codec<u32>>::read(r, next(at))?);
    }
    Ok(missing)
}

fn missing_cells(missing: &MissingCounts, out: &mut Vec<Value<'_>>) {
    for (reason, ..) in reasons() {
        out.push(Value::Int(Some(i64::from(missing.get(*reason)))));
    }
}

fn read<T>(r: &Row<'_>, at: &mut usize) -> rusqlite::Result<T>
where
    Plain: Codec<T>,
{
    <Plain as Codec<T>>::read(r, next(at))
}

fn cell<T>(v: &T) -> Value<'_>
where
    Plain: Codec<T>,
{
    <Plain as Codec<T>>::value(v)
}

impl TableRow for RoundRow {
    const TABLE: Table = Table::Rounds;
    const ORDER: &'static str = "stream_id, round";
    const KEY: &'static [&'static str] = &["stream_id", "round"];

    fn columns() -> &'static [Column] {
        static COLUMNS: OnceLock<Vec<Column>> = OnceLock::new();
        COLUMNS.get_or_init(|| {
            let mut columns = vec![
                column::<u32>("stream_id", "stream_id"),
                column::<String>("stream_name", "stream"),
                column::<u64>("round", "round"),
                column::<u32>("covered", "covered_ranks"),
                column::<u32>("expected", "expected_ranks"),
            ];
            columns.extend(missing_columns());
            columns.extend([
                column::<Option<String>>("missing_reason", "missing_reason"),
                Column {
                    since: 20,
                    ..column::<Option<String>>("unreachable_nodes", "unreachable_nodes")
                },
                // Late packets add to it in their own statement (`add_late`), so a later piece keeps it.
                Column {
                    update: Update::Keep,
                    ..column::<u32>("late_ranks", "late_ranks")
                },
                column::<u64>("result_bytes", "result_bytes"),
                column::<u32>("pieces", "pieces"),
                column::<Option<u64>>("first_dump_unix_ns", "first_dump_unix_ns"),
                column::<Option<u64>>("closed_unix_ns", "closed_unix_ns"),
            ]);
            columns
        })
    }

    fn read(r: &Row<'_>) -> rusqlite::Result<Self> {
        let at = &mut 0;
        Ok(RoundRow {
            stream_id: read(r, at)?,
            stream: read(r, at)?,
            round: read(r, at)?,
            covered: read(r, at)?,
            expected: read(r, at)?,
            missing: read_missing(r, at)?,
            missing_reason: read(r, at)?,
            unreachable_nodes: read(r, at)?,
            late_ranks: read(r, at)?,
            result_bytes: read(r, at)?,
            pieces: read(r, at)?,
            first_dump_unix_ns: read(r, at)?,
            closed_unix_ns: read(r, at)?,
        })
    }

    fn cells<'a>(&'a self, out: &mut Vec<Value<'a>>) {
        out.extend([
            cell(&self.stream_id),
            cell(&self.stream),
            cell(&self.round),
            cell(&self.covered),
            cell(&self.expected),
        ]);
        missing_cells(&self.missing, out);
        out.extend([
            cell(&self.missing_reason),
            cell(&self.unreachable_nodes),
            cell(&self.late_ranks),
            cell(&self.result_bytes),
            cell(&self.pieces),
            cell(&self.first_dump_unix_ns),
            cell(&self.closed_unix_ns),
        ]);
    }

    statements!();
}

impl TableRow for RoundAppRow {
    const TABLE: Table = Table::RoundApps;
    const ORDER: &'static str = "stream_id, round, app";
    const KEY: &'static [&'static str] = &["stream_id", "round", "app"];

    fn columns() -> &'static [Column] {
        static COLUMNS: OnceLock<Vec<Column>> = OnceLock::new();
        COLUMNS.get_or_init(|| {
            let mut columns = vec![
                column::<u32>("stream_id", "stream_id"),
                column::<u64>("round", "round"),
                column::<String>("app", "app"),
                column::<u32>("covered", "covered_ranks"),
                column::<u32>("expected", "expected_ranks"),
            ];
            columns.extend(missing_columns());
            columns.push(column::<Option<String>>("missing_reason", "missing_reason"));
            columns
        })
    }

    fn read(r: &Row<'_>) -> rusqlite::Result<Self> {
        let at = &mut 0;
        Ok(RoundAppRow {
            stream_id: read(r, at)?,
            round: read(r, at)?,
            app: read(r, at)?,
            covered: read(r, at)?,
            expected: read(r, at)?,
            missing: read_missing(r, at)?,
            missing_reason: read(r, at)?,
        })
    }

    fn cells<'a>(&'a self, out: &mut Vec<Value<'a>>) {
        out.extend([
            cell(&self.stream_id),
            cell(&self.round),
            cell(&self.app),
            cell(&self.covered),
            cell(&self.expected),
        ]);
        missing_cells(&self.missing, out);
        out.push(cell(&self.missing_reason));
    }

    statements!();
}
