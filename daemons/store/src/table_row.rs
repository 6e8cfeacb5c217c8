//! A table's row, defined once: [`table_row!`] declares a row type with each field's column, and from that one
//! list come the writer's insert or upsert ([`TableRow::insert`], [`TableRow::upsert`]), the reader's select and
//! its typed read ([`StoreReader::table_rows`](crate::StoreReader)), and the export's columns
//! ([`TableRow::cells`]). A column's `since` is the schema version that added it: an older store reads it as NULL.
//! The migrations stay frozen SQL (`schema/`); a test checks every definition here against the tables they build.

use canopy_proto::filters::v1::Metric;
use canopy_proto::v1::{NodeKind, NodeState, SyncMode};
use rusqlite::Row;
use rusqlite::types::{ToSqlOutput, ValueRef};

use crate::read::Table;
use crate::sql::{id_of, unsigned};
use crate::words::{StreamState, Word};

/// What a column holds, as the export and the reader see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An unsigned count or time, a rank, a place.
    Int,
    /// A 64-bit id (a class), its bits as a signed integer.
    Id,
    /// The id of a name in `names` (an event, a counter, an activity, a latency key): exported with the name
    /// beside it.
    Event,
    /// The stream's id: exported with the stream's name beside it.
    Stream,
    Float,
    Text,
    /// 0 or 1 (`late`).
    Flag,
    /// A metric, stored as its word: exported with its unit beside it.
    Metric,
    /// Bytes (an encoded result): not exported.
    Blob,
}

/// One column of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// Its name in the table.
    pub name: &'static str,
    /// Its name in an export, with its unit where it has one (`count_ranks` for `count`).
    pub export: &'static str,
    pub kind: Kind,
    /// Whether it may hold NULL.
    pub nullable: bool,
    /// The schema version that added it to its table (1 when it came with the table's first version).
    pub since: u32,
    /// What an upsert does to it when its row's key is already stored.
    pub update: Update,
}

/// What an upsert ([`TableRow::upsert`]) does to a column of a row already stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    /// Takes the new value.
    Set,
    /// Keeps the stored value (a time first seen, a count another statement keeps).
    Keep,
    /// Takes the new value unless it is NULL (what a later event does not know, an earlier one said).
    Fill,
    /// This SQL expression over `excluded.column` and `table.column`.
    Sql(&'static str),
}

impl Column {
    /// A column read and written through codec `C` as a field of type `T`.
    pub const fn of<C: Codec<T>, T>(name: &'static str) -> Column {
        Column {
            name,
            export: name,
            kind: C::KIND,
            nullable: C::NULLABLE,
            since: 1,
            update: Update::Set,
        }
    }
}

/// One value of a row, for an export.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    /// An integer, an id's bits or a flag.
    Int(Option<i64>),
    Float(Option<f64>),
    Text(Option<&'a str>),
    Metric(Metric),
    Blob(&'a [u8]),
}

/// A value binds as the column's stored form: a metric as its word.
impl rusqlite::ToSql for Value<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Value::Int(Some(v)) => ValueRef::Integer(v),
            Value::Float(Some(v)) => ValueRef::Real(v),
            Value::Text(Some(v)) => ValueRef::Text(v.as_bytes()),
            Value::Metric(m) => ValueRef::Text(m.word().as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
            Value::Int(None) | Value::Float(None) | Value::Text(None) => ValueRef::Null,
        }))
    }
}

/// How a field of type `T` is read from its column and shown to an export.
pub trait Codec<T> {
    const KIND: Kind;
    const NULLABLE: bool;
    fn read(r: &Row<'_>, i: usize) -> rusqlite::Result<T>;
    fn value(v: &T) -> Value<'_>;
}

/// A field whose type says how it is stored: numbers, text, flags, metrics.
pub struct Plain;
/// A 64-bit id stored as its bits.
pub struct Id;
/// A name's id (see [`Kind::Event`]).
pub struct Event;
/// The stream's id (see [`Kind::Stream`]).
pub struct Stream;

/// Saturates, as the writer does ([`crate::sql::sat`]).
fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A count read back: NULL as 0 (as `COALESCE(column, 0)`), a value past `u32` as its largest.
fn count32(v: Option<i64>) -> u32 {
    u32::try_from(v.unwrap_or(0).max(0)).unwrap_or(u32::MAX)
}

macro_rules! plain {
    ($t:ty, $kind:ident, $null:literal, |$r:ident, $i:ident| $read:expr, |$v:ident| $value:expr) => {
        impl Codec<$t> for Plain {
            const KIND: Kind = Kind::$kind;
            const NULLABLE: bool = $null;
            fn read($r: &Row<'_>, $i: usize) -> rusqlite::Result<$t> {
                $read
            }
            fn value($v: &$t) -> Value<'_> {
                $value
            }
        }
    };
}

plain!(u32, Int, false, |r, i| r.get(i).map(count32), |v| Value::Int(
    Some(i64::from(*v))
));
plain!(
    u64,
    Int,
    false,
    |r, i| Ok(unsigned(r.get::<_, Option<i64>>(i)?.unwrap_or(0))),
    |v| Value::Int(Some(int(*v)))
);
plain!(Option<u32>, Int, true, |r, i| r.get(i), |v| Value::Int(
    v.map(i64::from)
));
plain!(
    Option<u64>,
    Int,
    true,
    |r, i| Ok(r.get::<_, Option<i64>>(i)?.map(unsigned)),
    |v| Value::Int(v.map(int))
);
plain!(f64, Float, false, |r, i| r.get(i), |v| Value::Float(Some(*v)));
plain!(Option<f64>, Float, true, |r, i| r.get(i), |v| Value::Float(*v));
plain!(bool, Flag, false, |r, i| r.get(i), |v| Value::Int(Some(
    i64::from(*v)
)));
// A text column that is NULL reads as empty, as `COALESCE(column, '')` would.
plain!(
    String,
    Text,
    false,
    |r, i| Ok(r.get::<_, Option<String>>(i)?.unwrap_or_default()),
    |v| Value::Text(Some(v.as_str()))
);
plain!(Option<String>, Text, true, |r, i| r.get(i), |v| Value::Text(
    v.as_deref()
));
plain!(
    Metric,
    Metric,
    false,
    |r, i| Ok(r
        .get::<_, Option<String>>(i)?
        .and_then(|w| Metric::from_word(&w))
        .unwrap_or(Metric::Unspecified)),
    |v| Value::Metric(*v)
);
plain!(
    Vec<u8>,
    Blob,
    false,
    |r, i| Ok(r.get::<_, Option<Vec<u8>>>(i)?.unwrap_or_default()),
    |v| Value::Blob(v)
);

/// An enumeration stored as its word; a word this version does not know (or NULL) reads as `$unknown`.
macro_rules! word {
    ($t:ty, $unknown:expr) => {
        plain!(
            $t,
            Text,
            false,
            |r, i| Ok(r
                .get::<_, Option<String>>(i)?
                .and_then(|w| <$t>::from_word(&w))
                .unwrap_or($unknown)),
            |v| Value::Text(Some(v.word()))
        );
    };
}

word!(NodeKind, NodeKind::Unspecified);
word!(NodeState, NodeState::Unspecified);
word!(SyncMode, SyncMode::WaitForAll);
plain!(
    Option<StreamState>,
    Text,
    true,
    |r, i| Ok(r
        .get::<_, Option<String>>(i)?
        .and_then(|w| StreamState::from_word(&w))),
    |v| Value::Text(v.map(|s| s.word()))
);

macro_rules! ids {
    ($codec:ident, $kind:ident) => {
        impl Codec<u64> for $codec {
            const KIND: Kind = Kind::$kind;
            const NULLABLE: bool = false;
            fn read(r: &Row<'_>, i: usize) -> rusqlite::Result<u64> {
                r.get(i).map(id_of)
            }
            fn value(v: &u64) -> Value<'_> {
                Value::Int(Some(*v as i64))
            }
        }

        impl Codec<Option<u64>> for $codec {
            const KIND: Kind = Kind::$kind;
            const NULLABLE: bool = true;
            fn read(r: &Row<'_>, i: usize) -> rusqlite::Result<Option<u64>> {
                Ok(r.get::<_, Option<i64>>(i)?.map(id_of))
            }
            fn value(v: &Option<u64>) -> Value<'_> {
                Value::Int(v.map(|v| v as i64))
            }
        }
    };
}

ids!(Id, Id);
ids!(Event, Event);

impl Codec<u32> for Stream {
    const KIND: Kind = Kind::Stream;
    const NULLABLE: bool = false;
    fn read(r: &Row<'_>, i: usize) -> rusqlite::Result<u32> {
        r.get(i)
    }
    fn value(v: &u32) -> Value<'_> {
        Value::Int(Some(i64::from(*v)))
    }
}

/// A row type of one table, declared with [`table_row!`] (or by hand where a field spans several columns).
pub trait TableRow: Sized {
    /// Its table.
    const TABLE: Table;
    /// The order of a read's rows (`ORDER BY`).
    const ORDER: &'static str;
    /// The columns that name a row, for an upsert (none: rows are only inserted).
    const KEY: &'static [&'static str] = &[];
    /// Its columns, in the order of the row's fields (and of an export's columns).
    fn columns() -> &'static [Column];
    /// A row from a select of [`TableRow::columns`] in their order.
    fn read(r: &Row<'_>) -> rusqlite::Result<Self>;
    /// Appends the row's values, one per column in [`TableRow::columns`]' order.
    fn cells<'a>(&'a self, out: &mut Vec<Value<'a>>);
    /// `INSERT INTO table (every column) VALUES (?1, ...)`: a writer binds the values in the columns' order.
    fn insert() -> &'static str;
    /// The insert as an upsert on [`TableRow::KEY`], each column updated as its [`Update`] says.
    fn upsert() -> &'static str;
}

/// The upsert of every column on `key`, numbered in their order.
pub(crate) fn upsert_sql(table: Table, columns: &[Column], key: &[&str]) -> String {
    let updates: Vec<String> = columns
        .iter()
        .filter(|c| !key.contains(&c.name))
        .filter_map(|c| match c.update {
            Update::Set => Some(format!("{0} = excluded.{0}", c.name)),
            Update::Keep => None,
            Update::Fill => Some(format!(
                "{0} = coalesce(excluded.{0}, {1}.{0})",
                c.name,
                table.name()
            )),
            Update::Sql(expr) => Some(format!("{} = {expr}", c.name)),
        })
        .collect();
    format!(
        "{} ON CONFLICT ({}) DO UPDATE SET {}",
        insert_sql(table, columns),
        key.join(", "),
        updates.join(", ")
    )
}

/// The insert of every column, its values numbered in the columns' order. The columns are listed in the table's
/// own order (those a later version added after the others, as `ALTER TABLE` put them), so SQLite lays each
/// value into the record where it goes without moving it.
pub(crate) fn insert_sql(table: Table, columns: &[Column]) -> String {
    let order = stored_order(table, columns);
    let names: Vec<&str> = order.iter().map(|&i| columns[i].name).collect();
    let params: Vec<String> = order.iter().map(|&i| format!("?{}", i + 1)).collect();
    format!(
        "INSERT INTO {} ({}) VALUES ({})",
        table.name(),
        names.join(", "),
        params.join(", ")
    )
}

/// The columns' indexes in the table's own order: by the version that added each to the table (the table's own
/// for those it was made with), in their order within one.
pub(crate) fn stored_order(table: Table, columns: &[Column]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..columns.len()).collect();
    order.sort_by_key(|&i| columns[i].since.max(table.since()));
    order
}

/// The select list of `columns` in a store of schema `version`: NULL for a column added after it.
pub(crate) fn select_list(columns: &[Column], version: u32) -> String {
    columns
        .iter()
        .map(|c| if c.since <= version { c.name } else { "NULL" })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The next column's index in a row being read.
pub(crate) fn next(at: &mut usize) -> usize {
    *at += 1;
    *at - 1
}

macro_rules! codec {
    () => {
        $crate::table_row::Plain
    };
    ($codec:ident) => {
        $crate::table_row::$codec
    };
}

/// Declares a row type of a table: the columns that name a row when it is upserted (`key ["node_id"]`), each
/// field with its column (`= "name"`), its codec when the field's type does not say it (`as Id`, `as Event`,
/// `as Stream`), and what differs from the defaults (`{ export: "count_ranks", since: 15, update: Update::Keep }`).
/// Fields after `and` are the reader's own, filled from other tables.
macro_rules! table_row {
    (
        $(#[$meta:meta])*
        pub struct $name:ident in $table:ident order $order:literal $(key [$($key_column:literal),+])? {
            $(
                $(#[$fmeta:meta])*
                pub $field:ident : $fty:ty = $col:literal $(as $codec:ident)? $({ $($key:ident : $val:expr),* $(,)? })?
            ),* $(,)?
        }
        $(and {
            $(
                $(#[$xmeta:meta])*
                pub $xfield:ident : $xty:ty
            ),* $(,)?
        })?
    ) => {
        $(#[$meta])*
        pub struct $name {
            $(
                $(#[$fmeta])*
                pub $field: $fty,
            )*
            $($(
                $(#[$xmeta])*
                pub $xfield: $xty,
            )*)?
        }

        impl $crate::table_row::TableRow for $name {
            const TABLE: $crate::Table = $crate::Table::$table;
            const ORDER: &'static str = $order;
            const KEY: &'static [&'static str] = &[$($($key_column),+)?];

            fn columns() -> &'static [$crate::table_row::Column] {
                const COLUMNS: &[$crate::table_row::Column] = &[
                    $(
                        $crate::table_row::Column {
                            $($($key: $val,)*)?
                            ..$crate::table_row::Column::of::<$crate::table_row::codec!($($codec)?), $fty>($col)
                        },
                    )*
                ];
                COLUMNS
            }

            fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
                let mut at = 0;
                Ok($name {
                    $(
                        $field: <$crate::table_row::codec!($($codec)?) as $crate::table_row::Codec<$fty>>::read(
                            r,
                            $crate::table_row::next(&mut at),
                        )?,
                    )*
                    $($($xfield: Default::default(),)*)?
                })
            }

            fn cells<'a>(&'a self, out: &mut Vec<$crate::table_row::Value<'a>>) {
                $(
                    out.push(<$crate::table_row::codec!($($codec)?) as $crate::table_row::Codec<$fty>>::value(&self.$field));
                )*
            }

            $crate::table_row::statements!();
        }
    };
}

/// A row type's [`TableRow::insert`] and [`TableRow::upsert`], each built once from its columns.
macro_rules! statements {
    () => {
        fn insert() -> &'static str {
            static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
            SQL.get_or_init(|| {
                $crate::table_row::insert_sql(
                    <Self as $crate::table_row::TableRow>::TABLE,
                    <Self as $crate::table_row::TableRow>::columns(),
                )
            })
        }

        fn upsert() -> &'static str {
            static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
            SQL.get_or_init(|| {
                $crate::table_row::upsert_sql(
                    <Self as $crate::table_row::TableRow>::TABLE,
                    <Self as $crate::table_row::TableRow>::columns(),
                    <Self as $crate::table_row::TableRow>::KEY,
                )
            })
        }
    };
}

pub(crate) use {codec, statements, table_row};

#[cfg(test)]
mod tests;
