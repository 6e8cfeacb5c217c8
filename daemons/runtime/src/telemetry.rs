//! All tracing setup: the daemons' log output, and a quiet subscriber for tests.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. `RUST_LOG` (or `CANOPY_LOG`) overrides `default_level`.
pub fn init(format: LogFormat, default_level: &str) {
    let filter = std::env::var("CANOPY_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new(default_level));
    // Colours only on a terminal: a log file or the journal gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}

/// For tests: logs to the test harness's captured output, `warn` unless `RUST_LOG` says otherwise.
pub fn trace_init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// A log line that may repeat without end (a refusal, a failed accept), let through at most once a second so a
/// flood cannot fill the disk or drown the other lines.
#[derive(Debug, Default)]
pub struct EverySecond {
    last: Option<tokio::time::Instant>,
    held: u64,
}

impl EverySecond {
    /// One more occurrence: `Some(held)` when it is to be logged now, with how many were held back since the
    /// last line that went through; `None` when it is held back.
    pub fn pass(&mut self) -> Option<u64> {
        let now = tokio::time::Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < std::time::Duration::from_secs(1))
        {
            self.held += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }
}

#[cfg(test)]
mod every_second_tests {
    use super::EverySecond;

    #[tokio::test(start_paused = true)]
    async fn one_line_a_second_with_the_count_held_back() {
        let mut log = EverySecond::default();
        assert_eq!(log.pass(), Some(0));
        assert_eq!(log.pass(), None);
        assert_eq!(log.pass(), None);
        tokio::time::advance(std::time::Duration::from_millis(1001)).await;
        assert_eq!(log.pass(), Some(2));
        assert_eq!(log.pass(), None);
    }
}
