//! Partial rounds in the log, at most one line per interval: the first partial round is told at once, then what
//! came after it is summed up (rounds, the streams and rounds they span, the rank-rounds missing by reason) once
//! the interval has passed, and the remainder when the run's store is flushed. A relay down for a minute is a
//! handful of lines, not a line per round; the `rounds` table keeps every round's own figures.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::rounds::RoundRecord;
use crate::words::{REASONS, Word, reason_index};
use canopy_proto::v1::MissingReason;

/// How often partial rounds are summed up in the log.
pub(crate) const PARTIAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
struct Pending {
    rounds: u64,
    /// Per stream, the first and last partial round.
    streams: BTreeMap<String, (u64, u64)>,
    missing: [u64; REASONS],
}

/// The partial rounds not told yet, and when the log last told of them.
#[derive(Debug)]
pub(crate) struct PartialLog {
    interval: Duration,
    told: Option<Instant>,
    pending: Pending,
}

impl PartialLog {
    pub(crate) fn new(interval: Duration) -> Self {
        PartialLog {
            interval,
            told: None,
            pending: Pending::default(),
        }
    }

    /// Takes a stored round (partial or not) at `now`; returns the line to log, if one is due.
    pub(crate) fn record(&mut self, now: Instant, record: &RoundRecord) -> Option<String> {
        if record.covered < record.expected {
            if self.told.is_none() {
                self.told = Some(now);
                return Some(format!(
                    "partial round: stream {} round {}, {} of {} ranks ({}); further partial rounds are summed up \
                     every {} s",
                    record.stream_name,
                    record.round,
                    record.covered,
                    record.expected,
                    missing_text(record.missing.iter().map(|&(r, n)| (r, u64::from(n)))),
                    self.interval.as_secs()
                ));
            }
            let p = &mut self.pending;
            p.rounds += 1;
            let span = p
                .streams
                .entry(record.stream_name.clone())
                .or_insert((record.round, record.round));
            span.0 = span.0.min(record.round);
            span.1 = span.1.max(record.round);
            for &(reason, ranks) in &record.missing {
                p.missing[reason_index(reason)] += u64::from(ranks);
            }
        }
        let due = self.told.is_some_and(|t| now.duration_since(t) >= self.interval);
        if due && self.pending.rounds > 0 {
            self.told = Some(now);
            return self.take();
        }
        None
    }

    /// The partial rounds not told yet, as one line (at the end of the run).
    pub(crate) fn flush(&mut self) -> Option<String> {
        self.take()
    }

    fn take(&mut self) -> Option<String> {
        let p = std::mem::take(&mut self.pending);
        if p.rounds == 0 {
            return None;
        }
        let spans: Vec<String> = p
            .streams
            .iter()
            .map(|(s, (a, b))| {
                if a == b {
                    format!("{s} {a}")
                } else {
                    format!("{s} {a}-{b}")
                }
            })
            .collect();
        let missing = <MissingReason as Word>::WORDS
            .iter()
            .map(|&(r, _)| (r, p.missing[reason_index(r)]));
        Some(format!(
            "{} more partial round{} (rounds {}); rank-rounds missing: {}",
            p.rounds,
            if p.rounds == 1 { "" } else { "s" },
            spans.join(", "),
            missing_text(missing)
        ))
    }
}

/// `lost: 8, late: 2`, the reasons with any ranks, largest first.
fn missing_text(missing: impl Iterator<Item = (MissingReason, u64)>) -> String {
    let mut m: Vec<(MissingReason, u64)> = missing.filter(|&(_, n)| n > 0).collect();
    m.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    let parts: Vec<String> = m.iter().map(|(r, n)| format!("{}: {n}", r.word())).collect();
    if parts.is_empty() {
        "no reason recorded".into()
    } else {
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partial(stream: &str, round: u64, lost: u32) -> RoundRecord {
        RoundRecord {
            stream_id: 1,
            stream_name: stream.into(),
            round,
            covered: 16 - lost,
            expected: 16,
            missing: vec![(MissingReason::Lost, lost)],
            first_dump_unix_ns: 0,
            closed_unix_ns: 0,
            apps: vec![],
            unreachable: vec![],
        }
    }

    #[test]
    fn a_partial_round_a_second_is_a_line_per_interval() {
        let t0 = Instant::now();
        let mut log = PartialLog::new(Duration::from_secs(10));
        let mut lines = Vec::new();
        // 45 s of a relay down: a partial round of each of two streams every second.
        for s in 0..45u64 {
            let now = t0 + Duration::from_secs(s);
            for stream in ["stats", "histogram"] {
                lines.extend(log.record(now, &partial(stream, s, 8)));
            }
        }
        lines.extend(log.flush());
        assert_eq!(lines.len(), 6, "{lines:#?}");
        assert_eq!(
            lines[0],
            "partial round: stream stats round 0, 8 of 16 ranks (lost: 8); further partial rounds are summed up \
             every 10 s"
        );
        assert_eq!(
            lines[1],
            "20 more partial rounds (rounds histogram 0-9, stats 1-10); rank-rounds missing: lost: 160"
        );
        // Every partial round is counted once, in one line or another.
        let counted: u64 = 1 + lines[1..]
            .iter()
            .map(|l| l.split(' ').next().unwrap().parse::<u64>().unwrap())
            .sum::<u64>();
        assert_eq!(counted, 90);
        assert_eq!(log.flush(), None);
    }

    #[test]
    fn full_rounds_say_nothing_and_a_lone_partial_round_is_told_at_once() {
        let t0 = Instant::now();
        let mut log = PartialLog::new(Duration::from_secs(10));
        let mut full = partial("stats", 0, 0);
        full.missing.clear();
        assert_eq!(log.record(t0, &full), None);
        let line = log.record(t0, &partial("stats", 1, 3)).unwrap();
        assert!(
            line.starts_with("partial round: stream stats round 1, 13 of 16 ranks (lost: 3)"),
            "{line}"
        );
        assert_eq!(log.record(t0 + Duration::from_secs(60), &full), None);
        assert_eq!(log.flush(), None);
    }
}
