//! All tracing setup: the daemons' log output, and a quiet subscriber for tests.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// The role of the node this process runs (`frontend`, `relay`, `agent`), named on every log line of a daemon.
static ROLE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
/// The node's id, named on every log line once it is known.
static NODE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Names the node on every log line from now on, in a daemon's process (it runs one node; its id may be known
/// only once it listens, as a relay's default id has its port). A process that runs several nodes (a test, the
/// in-process benchmarks) names none.
pub fn set_node(role: &str, id: &str) {
    if ROLE.get().is_some_and(|r| r == role) {
        let _ = NODE.set(id.to_string());
    }
}

/// A daemon's logs: as [`init`], each line naming the daemon's `role` from the start, and its node `id` (when
/// the configuration gives one; empty: once [`set_node`] says which).
pub fn init_daemon(role: &str, id: &str, format: LogFormat, default_level: &str) {
    let _ = ROLE.set(role.to_string());
    if !id.is_empty() {
        set_node(role, id);
    }
    init(format, default_level);
}

/// A text line's format, after the node's name.
struct Named<F>(F);

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for Named<F>
where
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        match (ROLE.get(), NODE.get()) {
            (Some(role), Some(id)) => write!(writer, "[{role} {id}] ")?,
            (Some(role), None) => write!(writer, "[{role}] ")?,
            _ => {}
        }
        self.0.format_event(ctx, writer, event)
    }
}

/// A JSON line's format, with the node's `role` and `node` (its id) as its first fields.
struct NamedJson<F>(F);

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for NamedJson<F>
where
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let Some(role) = ROLE.get() else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(
            ctx,
            tracing_subscriber::fmt::format::Writer::new(&mut line),
            event,
        )?;
        let Some(rest) = line.strip_prefix('{') else {
            return writer.write_str(&line);
        };
        let field = |v: &str| serde_json::to_string(v).map_err(|_| std::fmt::Error);
        write!(writer, "{{\"role\":{},", field(role)?)?;
        if let Some(id) = NODE.get() {
            write!(writer, "\"node\":{},", field(id)?)?;
        }
        writer.write_str(rest)
    }
}

/// Installs the global subscriber. `CANOPY_LOG` (or `RUST_LOG`) overrides `default_level`; one that does not
/// parse is reported, and `default_level` used.
pub fn init(format: LogFormat, default_level: &str) {
    let mut refused = None;
    let mut parsed = |var: &str| {
        let value = std::env::var(var).ok()?;
        match EnvFilter::try_new(&value) {
            Ok(f) => Some(f),
            Err(e) => {
                refused.get_or_insert(format!(
                    "{var}={value:?} is not a log filter ({e}); logging at {default_level}"
                ));
                None
            }
        }
    };
    let filter = parsed("CANOPY_LOG")
        .or_else(|| parsed("RUST_LOG"))
        .unwrap_or_else(|| EnvFilter::new(default_level));
    // Colours only on a terminal: a log file or the journal gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .event_format(Named(tracing_subscriber::fmt::format()))
            .try_init(),
        LogFormat::Json => {
            let json = tracing_subscriber::fmt::format()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false);
            builder.event_format(NamedJson(json)).try_init()
        }
    };
    if let Some(refused) = refused {
        // Once: in the log where warnings show (the default), else on stderr as it is.
        if tracing::enabled!(tracing::Level::WARN) {
            tracing::warn!("{refused}");
        } else {
            eprintln!("{refused}");
        }
    }
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
