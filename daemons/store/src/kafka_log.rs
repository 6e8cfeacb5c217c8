//! [`KafkaLog`]: what a run published to Kafka, kept in its store. A round counts as published only once the
//! broker acknowledged it, with the offset it gave; a round that cannot be published is kept with the reason.
//! The publisher owns these two tables; the writer thread never touches them, so the publisher writes through
//! its own connection (SQLite serializes the two writers, each commit short).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::StoreError;
use crate::read::KAFKA_SINCE;
use crate::schema;
use crate::sql::{now_unix_ns, sat, unsigned};

/// One round the broker acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub stream_id: u32,
    pub round: u64,
    pub partition: i32,
    pub offset: i64,
}

/// Counts of a store's `kafka_rounds`, for the summary of a run's export.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KafkaCounts {
    /// Rounds stored.
    pub rounds: u64,
    /// Rounds the broker acknowledged.
    pub published: u64,
    /// Rounds given up on, each with its reason.
    pub failed: u64,
}

/// The store's record of its rounds in Kafka, open for writing.
#[derive(Debug)]
pub struct KafkaLog {
    conn: Connection,
    path: PathBuf,
}

impl KafkaLog {
    /// Opens the store at `path` for its Kafka tables. The store must be at schema version 21 or later (a
    /// front-end that writes it, or [`crate::Store::open`], brings it there).
    pub fn open(path: &Path) -> Result<KafkaLog, StoreError> {
        // The writer thread holds the lock for a round's commit: wait for it rather than fail.
        let (conn, _) = schema::open_beside_writer(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE,
            Duration::from_secs(10),
            KAFKA_SINCE,
        )?;
        Ok(KafkaLog {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// Records rounds the broker acknowledged on `topic`. A round already recorded keeps its first record;
    /// returns how many were new.
    pub fn published(&mut self, topic: &str, rounds: &[Published]) -> Result<u64, StoreError> {
        let now = now_unix_ns();
        self.in_transaction(|tx| {
            let mut st = tx.prepare_cached(
                "INSERT OR IGNORE INTO kafka_rounds (stream_id, round, topic, partition, offset, acked_unix_ns)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            let mut new = 0;
            for p in rounds {
                new += st.execute(params![p.stream_id, sat(p.round), topic, p.partition, p.offset, now])? as u64;
            }
            Ok(new)
        })
    }

    /// Records rounds that will not be published, with the reason (the broker refused them).
    pub fn failed(
        &mut self,
        topic: &str,
        stream_id: u32,
        rounds: &[u64],
        reason: &str,
    ) -> Result<(), StoreError> {
        let now = now_unix_ns();
        self.in_transaction(|tx| {
            let mut st = tx.prepare_cached(
                "INSERT OR IGNORE INTO kafka_rounds (stream_id, round, topic, failure, acked_unix_ns)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for round in rounds {
                st.execute(params![stream_id, sat(*round), topic, reason, now])?;
            }
            Ok(())
        })
    }

    /// Where this run's records on `topic` begin: the offset of the topic's end before its first one was sent.
    pub fn scan_from(&self, topic: &str) -> Result<Option<i64>, StoreError> {
        self.conn
            .prepare_cached("SELECT scan_from FROM kafka_topics WHERE topic = ?1")
            .and_then(|mut st| st.query_row([topic], |r| r.get(0)).optional())
            .map_err(self.sqlite())
    }

    /// Sets where this run's records on `topic` begin, unless it is known already (the first one stays).
    pub fn set_scan_from(&mut self, topic: &str, offset: i64) -> Result<(), StoreError> {
        self.conn
            .prepare_cached("INSERT OR IGNORE INTO kafka_topics (topic, scan_from) VALUES (?1, ?2)")
            .and_then(|mut st| st.execute(params![topic, offset]))
            .map(drop)
            .map_err(self.sqlite())
    }

    /// The highest offset acknowledged on `topic` for this run.
    pub fn last_offset(&self, topic: &str) -> Result<Option<i64>, StoreError> {
        self.conn
            .prepare_cached("SELECT MAX(offset) FROM kafka_rounds WHERE topic = ?1")
            .and_then(|mut st| st.query_row([topic], |r| r.get(0)))
            .map_err(self.sqlite())
    }

    /// Whether a round of a stream has its record (published or given up on).
    #[cfg(test)]
    fn is_recorded(&self, stream_id: u32, round: u64) -> Result<bool, StoreError> {
        self.conn
            .prepare_cached("SELECT 1 FROM kafka_rounds WHERE stream_id = ?1 AND round = ?2")
            .and_then(|mut st| {
                st.query_row(params![stream_id, sat(round)], |_| Ok(()))
                    .optional()
            })
            .map(|found| found.is_some())
            .map_err(self.sqlite())
    }

    /// The run's rounds, published and given up on.
    pub fn counts(&self) -> Result<KafkaCounts, StoreError> {
        self.conn
            .query_row(
                "SELECT (SELECT count(*) FROM rounds),
                        (SELECT count(*) FROM kafka_rounds WHERE offset IS NOT NULL),
                        (SELECT count(*) FROM kafka_rounds WHERE failure IS NOT NULL)",
                [],
                |r| {
                    Ok(KafkaCounts {
                        rounds: unsigned(r.get(0)?),
                        published: unsigned(r.get(1)?),
                        failed: unsigned(r.get(2)?),
                    })
                },
            )
            .map_err(self.sqlite())
    }

    /// Sets a `meta` fact (the export's state, for `canopy report` and operators).
    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        crate::sql::set_meta(&self.conn, key, value).map_err(self.sqlite())
    }

    fn in_transaction<T>(
        &mut self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let path = self.path.clone();
        let sqlite = |source| StoreError::Sqlite { path, source };
        let tx = self.conn.transaction().map_err(sqlite.clone())?;
        let out = f(&tx).map_err(sqlite.clone())?;
        tx.commit().map_err(sqlite)?;
        Ok(out)
    }

    fn sqlite(&self) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
        |source| StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Payload, RoundRecord, Store, StoreReader};

    fn round(round: u64) -> RoundRecord {
        RoundRecord {
            stream_id: 1,
            stream_name: "stats".into(),
            round,
            covered: 4,
            expected: 4,
            missing: vec![],
            first_dump_unix_ns: 0,
            closed_unix_ns: 1,
            apps: vec![],
            unreachable: vec![],
        }
    }

    #[test]
    fn a_round_stored_after_later_rounds_is_still_ahead_of_the_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::create(dir.path()).unwrap();
        let path = store.path().to_path_buf();
        for r in [5, 6] {
            store.write_round(&round(r), Payload::None).unwrap();
        }
        let reader = StoreReader::open(&path).unwrap();
        let rows = reader.unpublished_rounds(1, 0, 10).unwrap();
        assert_eq!(rows.iter().map(|(_, r)| *r).collect::<Vec<_>>(), [5, 6]);
        let mut log = KafkaLog::open(&path).unwrap();
        let p = |round, offset| Published {
            stream_id: 1,
            round,
            partition: 0,
            offset,
        };
        log.published("canopy.stats", &[p(5, 0), p(6, 1)]).unwrap();
        // Round 3 waited for its time-out (or the end of the run filled it in): stored after 5 and 6.
        store.write_round(&round(3), Payload::None).unwrap();
        let cursor = rows[0].0;
        let after = reader.unpublished_rounds(1, cursor, 10).unwrap();
        assert_eq!(after.iter().map(|(_, r)| *r).collect::<Vec<_>>(), [3]);
        assert_eq!(reader.count_unpublished(1, cursor).unwrap(), 1);
    }

    #[test]
    fn a_round_keeps_its_first_record_and_scan_from_its_first_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = Store::create(dir.path()).unwrap().path().to_path_buf();
        let mut log = KafkaLog::open(&path).unwrap();
        assert_eq!(log.scan_from("canopy.stats").unwrap(), None);
        log.set_scan_from("canopy.stats", 40).unwrap();
        log.set_scan_from("canopy.stats", 90).unwrap();
        assert_eq!(log.scan_from("canopy.stats").unwrap(), Some(40));
        let p = |round, offset| Published {
            stream_id: 1,
            round,
            partition: 0,
            offset,
        };
        assert_eq!(log.published("canopy.stats", &[p(0, 40), p(1, 41)]).unwrap(), 2);
        assert_eq!(
            log.published("canopy.stats", &[p(1, 77), p(2, 42)]).unwrap(),
            1,
            "round 1 was recorded at offset 41 already"
        );
        assert_eq!(log.last_offset("canopy.stats").unwrap(), Some(42));
        assert!(log.is_recorded(1, 1).unwrap());
        log.failed("canopy.stats", 1, &[3], "MessageTooLarge").unwrap();
        assert!(log.is_recorded(1, 3).unwrap());
        assert_eq!(
            log.last_offset("canopy.stats").unwrap(),
            Some(42),
            "a failed round has no offset"
        );
        let counts = log.counts().unwrap();
        assert_eq!((counts.published, counts.failed), (3, 1));
    }
}
