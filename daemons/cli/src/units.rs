//! Numbers for people: byte rates with binary units, durations as h:mm:ss.

use std::time::Duration;

/// A byte count with a binary unit: `512 B`, `1.5 KiB`, `12.0 MiB`, `1.2 GiB`.
pub fn bytes(n: u64) -> String {
    let rate = bytes_per_second(n as f64);
    rate.trim_end_matches("/s").to_string()
}

/// A byte rate with a binary unit: `512 B/s`, `1.5 KiB/s`, `12.0 MiB/s`, `1.2 GiB/s`.
pub fn bytes_per_second(rate: f64) -> String {
    const UNITS: [&str; 4] = ["KiB/s", "MiB/s", "GiB/s", "TiB/s"];
    if rate < 1024.0 {
        return format!("{rate:.0} B/s");
    }
    let mut v = rate / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

/// Elapsed time as `m:ss`, or `h:mm:ss` from an hour on.
pub fn elapsed(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_rates_take_the_largest_binary_unit_below_1024() {
        assert_eq!(bytes_per_second(0.0), "0 B/s");
        assert_eq!(bytes_per_second(1023.0), "1023 B/s");
        assert_eq!(bytes_per_second(1024.0), "1.0 KiB/s");
        assert_eq!(bytes_per_second(1536.0), "1.5 KiB/s");
        assert_eq!(bytes_per_second(12.0 * 1024.0 * 1024.0), "12.0 MiB/s");
        assert_eq!(bytes_per_second(1.25 * 1024.0 * 1024.0 * 1024.0), "1.2 GiB/s");
    }

    #[test]
    fn byte_counts_take_the_same_units() {
        assert_eq!(bytes(100), "100 B");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
    }

    #[test]
    fn elapsed_time_reads_as_minutes_and_seconds_or_hours() {
        assert_eq!(elapsed(Duration::from_secs(5)), "0:05");
        assert_eq!(elapsed(Duration::from_secs(83)), "1:23");
        assert_eq!(elapsed(Duration::from_secs(3723)), "1:02:03");
    }
}
