//! The keys every daemon has: its node's id, logs, threads, memory, metrics endpoint, filters and TLS files.
//!
//! Defined once here and flattened into each daemon's config struct (`#[serde(flatten, skip_deserializing)]`
//! and `#[command(flatten)]`), so a key is spelled, documented and checked in one place while the file, the
//! environment and the flags still name it flat (`[relay] worker_threads`, `CANOPY_RELAY_WORKER_THREADS`,
//! `--worker-threads`). [`crate::config::load`] reads this part from the same layers as the rest, so an error
//! in it names its key and source as precisely.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigIssue, LogFormat, check_addr};

/// The default filter-call time-out (`filter_call_timeout_ms`).
pub const DEFAULT_FILTER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The keys every daemon has.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, clap::Args)]
#[serde(default)]
pub struct CommonConfig {
    /// This node's id in the tree; unique among its parent's children. Default: `frontend` for the front-end,
    /// relay@HOST:PORT for a relay, agent@HOST for an agent.
    #[arg(long)]
    pub node_id: String,
    /// Serve Prometheus metrics (`/metrics`) and a health check (`/health`) over HTTP at this ip:port (port 0
    /// picks a free one). Empty: no endpoint. Plain HTTP and read-only: bind it to a management network.
    #[arg(long)]
    pub metrics_listen: String,
    /// Log lines as text or as one JSON object each.
    #[arg(long, value_enum)]
    pub log_format: LogFormat,
    /// Threads that run the daemon's tasks. One (the default) hands a message from task to task on the same
    /// thread, with no wake-up of another; more let a node with many children or clients use more cores.
    #[arg(long)]
    pub worker_threads: usize,
    /// The memory this daemon may use, in MiB: the buffers that grow with load (the copies of what it sent up,
    /// kept until the root has them; at the front-end, rounds its store could not write yet) each take a quarter
    /// at most, and a resident size past it is logged.
    #[arg(long)]
    pub memory_budget_mb: u64,
    /// Directories searched for filter plugins (libcanopy_filter_<name>.so), in order; colon-separated as a
    /// flag. Empty: the directory of the running executable, PREFIX/lib/canopy/filters and
    /// PREFIX/lib64/canopy/filters beside its bin/, then /usr/lib/canopy/filters and /usr/lib64/canopy/filters.
    #[arg(long, value_delimiter = ':')]
    pub filter_path: Vec<PathBuf>,
    /// Milliseconds one call into a contained filter may run before the watchdog fails its stream (and only it);
    /// an inline call past it is logged as holding the node.
    #[arg(long)]
    pub filter_call_timeout_ms: u64,
    /// Filters run inline, on the node's own task; every other one runs contained, on a thread per stream, where
    /// a hang fails only its stream. Inline saves a hand-off between threads per call, but a hang holds the node.
    /// Default: the filters Canopy ships. Comma-separated as a flag; empty: every filter contained.
    #[arg(long, value_delimiter = ',')]
    pub inline_filters: Vec<String>,
    /// PEM file of the CA every certificate of the tree chains to (`canopy certs` makes one).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// PEM file of this node's certificate (its names include canopy-node).
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM file of this node's private key (not readable by other users).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Plaintext instead of TLS: allowed on loopback addresses only.
    #[arg(long)]
    pub insecure: bool,
}

impl Default for CommonConfig {
    fn default() -> Self {
        Self {
            node_id: String::new(),
            metrics_listen: String::new(),
            log_format: LogFormat::Text,
            worker_threads: crate::daemon::DEFAULT_WORKER_THREADS,
            memory_budget_mb: crate::memory::DEFAULT_MEMORY_BUDGET_MB,
            filter_path: Vec::new(),
            filter_call_timeout_ms: DEFAULT_FILTER_CALL_TIMEOUT.as_millis() as u64,
            inline_filters: canopy_filter_host::plugin::BUNDLED_FILTERS
                .iter()
                .map(|f| f.to_string())
                .collect(),
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            insecure: false,
        }
    }
}

impl CommonConfig {
    /// The TLS keys, as the runtime checks and loads them.
    pub fn tls(&self) -> crate::tls::TlsFiles {
        crate::tls::TlsFiles {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            insecure: self.insecure,
        }
    }

    /// The filter-call time-out.
    pub fn filter_call_timeout(&self) -> Duration {
        Duration::from_millis(self.filter_call_timeout_ms)
    }

    /// What the types alone cannot check. The TLS files are checked by the daemon, which knows the addresses
    /// they must serve (`tls().check(addrs)`), after its own keys.
    pub fn check(&self) -> Result<(), ConfigIssue> {
        crate::daemon::check_worker_threads(self.worker_threads)?;
        crate::memory::check(self.memory_budget_mb)?;
        if !(10..=3_600_000).contains(&self.filter_call_timeout_ms) {
            return Err(ConfigIssue::new(
                "filter_call_timeout_ms",
                "must be between 10 and 3600000 (an hour)",
            ));
        }
        if !self.metrics_listen.is_empty() {
            check_addr("metrics_listen", &self.metrics_listen)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CheckConfig, load};

    /// A daemon's config as each daemon writes its own: its keys, and the common ones flattened in.
    #[derive(Debug, Default, Serialize, Deserialize, PartialEq, clap::Args)]
    #[serde(default)]
    struct Demo {
        #[serde(flatten, skip_deserializing)]
        #[command(flatten)]
        common: CommonConfig,
        #[arg(long)]
        ranks: u32,
    }

    impl CheckConfig for Demo {
        fn check(&self) -> Result<(), ConfigIssue> {
            self.common.check()
        }
        fn common_mut(&mut self) -> Option<&mut CommonConfig> {
            Some(&mut self.common)
        }
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    fn flags(args: &[&str]) -> figment::value::Dict {
        let matches = crate::daemon::command::<Demo>("canopy-demo", "a daemon")
            .try_get_matches_from(std::iter::once("demo").chain(args.iter().copied()))
            .unwrap();
        crate::config::flags_given::<Demo>(&matches).unwrap()
    }

    #[test]
    fn common_keys_read_flat_from_every_layer() {
        let f = file("[demo]\nranks = 4\nworker_threads = 2\nnode_id = \"n-1\"\ntls_ca = \"/ca.pem\"\n");
        let c: Demo = load("demo", Some(f.path()), &flags(&[])).unwrap();
        assert_eq!(c.ranks, 4);
        assert_eq!(c.common.worker_threads, 2);
        assert_eq!(c.common.node_id, "n-1");
        assert_eq!(c.common.tls_ca, Some(PathBuf::from("/ca.pem")));
        // Keys not given keep the daemon's defaults.
        assert_eq!(c.common.filter_call_timeout_ms, 10_000);
        let c: Demo = load(
            "demo",
            Some(f.path()),
            &flags(&["--worker-threads", "3", "--ranks", "5"]),
        )
        .unwrap();
        assert_eq!((c.common.worker_threads, c.ranks), (3, 5));
    }

    #[test]
    fn a_bad_common_key_is_named_as_its_source_writes_it() {
        let f = file("[demo]\nworker_threads = \"many\"\n");
        let e = load::<Demo, _>("demo", Some(f.path()), &flags(&[])).unwrap_err();
        assert_eq!(e.key, "demo.worker_threads");
        assert_eq!(e.source_name, format!("TOML file {}", f.path().display()));
        assert!(e.message.contains("expected usize"), "{e}");
        let e = load::<Demo, _>("demo", None, &flags(&["--filter-call-timeout-ms", "1"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bad config value for `--filter-call-timeout-ms` (from command-line flags): must be between 10 and \
             3600000 (an hour)"
        );
    }

    #[test]
    fn an_unknown_key_is_refused_with_the_common_keys_among_the_valid_ones() {
        let f = file("[demo]\nworker_thread = 2\n");
        let e = load::<Demo, _>("demo", Some(f.path()), &flags(&[])).unwrap_err();
        assert_eq!(e.key, "demo.worker_thread");
        assert!(
            e.message.starts_with(
                "unknown key worker_thread (did you mean worker_threads? valid keys of [demo]: "
            ),
            "{e}"
        );
        assert!(
            e.message.contains("ranks") && e.message.contains("tls_key"),
            "{e}"
        );
    }
}
