//! The report's opening: the run at a glance (tree, ranks, rounds, streams, duration, coverage) from `meta`,
//! `nodes`, `streams` and `rounds`, and a row per stream.

use std::collections::BTreeMap;

use canopy_store::{Select, StoreReader, Word};

/// The run at a glance.
#[derive(Debug, Default)]
pub struct Summary {
    pub facts: Vec<(String, String)>,
    /// Per stream: name, filter, state, rounds, rounds at full coverage, late packets.
    pub streams: Vec<[String; 6]>,
}

pub fn summary(reader: &StoreReader) -> anyhow::Result<Summary> {
    let totals = reader.summary()?;
    let rounds = reader.rounds(Select::all())?;
    let nodes = reader.nodes()?;
    let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &nodes {
        *by_kind.entry(n.kind.word()).or_default() += 1;
    }
    let tree = if by_kind.is_empty() {
        "no nodes recorded".to_string()
    } else {
        by_kind
            .iter()
            .map(|(kind, n)| plural(*n, kind))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ranks = rounds.iter().map(|r| r.expected).max().unwrap_or(0);
    let started = reader
        .meta("started_unix_ns")?
        .and_then(|v| v.parse::<u64>().ok());
    let ended = reader
        .meta("ended_unix_ns")?
        .and_then(|v| v.parse::<u64>().ok())
        .or_else(|| rounds.iter().filter_map(|r| r.closed_unix_ns).max());
    let mut facts = vec![
        (
            "run".to_string(),
            // Through a `latest.sqlite` link, the run file it names.
            std::fs::canonicalize(reader.path())
                .unwrap_or_else(|_| reader.path().to_path_buf())
                .display()
                .to_string(),
        ),
        ("tree".to_string(), tree),
        ("ranks".to_string(), ranks.to_string()),
        (
            "rounds".to_string(),
            format!(
                "{} stored, {} at full coverage",
                totals.rounds, totals.full_rounds
            ),
        ),
        ("streams".to_string(), reader.streams()?.len().to_string()),
    ];
    if let Some(start) = started {
        facts.push(("started".to_string(), utc(start)));
    }
    if let (Some(start), Some(end)) = (started, ended)
        && end >= start
    {
        facts.push((
            "duration".to_string(),
            format!("{:.1} s", (end - start) as f64 / 1e9),
        ));
    }
    facts.push((
        "coverage".to_string(),
        format!(
            "{:.1}% of rank-rounds ({} of {})",
            totals.coverage_pct(),
            totals.covered,
            totals.expected
        ),
    ));
    facts.push(("late packets".to_string(), totals.late_packets.to_string()));
    facts.push(("result bytes".to_string(), totals.result_bytes.to_string()));
    let streams = reader
        .streams()?
        .into_iter()
        .map(|s| {
            [
                s.name,
                s.filter,
                s.state.map_or("unknown", |st| st.word()).to_string(),
                s.rounds.to_string(),
                s.full_rounds.to_string(),
                s.late_packets.to_string(),
            ]
        })
        .collect();
    Ok(Summary { facts, streams })
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// A Unix time in nanoseconds as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil, for days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_times_read_as_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000_000_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_999_999_000_000_000), "2026-11-30 00:53:19 UTC");
    }

    #[test]
    fn counts_of_nodes_take_plurals() {
        assert_eq!(plural(1, "relay"), "1 relay");
        assert_eq!(plural(4, "agent"), "4 agents");
    }
}
