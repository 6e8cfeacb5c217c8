//! How Canopy's values become SQLite's: unsigned ids and counts in signed integers, times of day.

use std::time::{SystemTime, UNIX_EPOCH};

/// SQLite integers are i64; ids keep their bits (readers cast back with [`id_of`]).
pub(crate) fn id_bits(id: u64) -> i64 {
    id as i64
}

/// An id read back from its stored bits.
pub(crate) fn id_of(bits: i64) -> u64 {
    bits as u64
}

/// Counts and timestamps never reach 2^63 in practice; saturating keeps a corrupt value visible as a maximum
/// instead of a negative number.
pub(crate) fn sat(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A count or time read back; a negative value (never written) reads as 0.
pub(crate) fn unsigned(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

pub(crate) fn now_unix_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub(crate) fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

/// Sets a `meta` fact, replacing its value.
pub(crate) fn set_meta(conn: &rusqlite::Connection, key: &str, value: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)")
        .and_then(|mut st| st.execute(rusqlite::params![key, value]))
        .map(drop)
}
