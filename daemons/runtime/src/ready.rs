//! The ready file: what a daemon tells the launcher that started it on port 0, once it serves.
//!
//! One format for every daemon, written and read here only: `key=value` lines (`addr=`, `store=`, `metrics=`),
//! written to a temporary file and renamed, so a reader sees the whole file or none. Keys a reader does not know
//! are skipped: a newer daemon may tell more.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// What a serving daemon tells its launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// The bound address of the tree port (children attach here; at the front-end, clients too).
    pub addr: SocketAddr,
    /// The front-end's SQLite store.
    pub store: Option<PathBuf>,
    /// The metrics and health endpoint, when one is served.
    pub metrics: Option<SocketAddr>,
}

/// A ready file that is there but cannot be read as one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("ready file {path}: {message}")]
pub struct ReadyError {
    pub path: String,
    pub message: String,
}

impl Ready {
    /// A daemon serving on `addr`, telling nothing else yet.
    pub fn serving(addr: SocketAddr) -> Self {
        Self {
            addr,
            store: None,
            metrics: None,
        }
    }

    /// The file's text.
    pub fn to_text(&self) -> String {
        let mut text = format!("addr={}\n", self.addr);
        if let Some(store) = &self.store {
            text.push_str(&format!("store={}\n", store.display()));
        }
        if let Some(metrics) = &self.metrics {
            text.push_str(&format!("metrics={metrics}\n"));
        }
        text
    }

    /// Reads a ready file's text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ReadyError> {
        let error = |message: String| ReadyError {
            path: origin.to_string(),
            message,
        };
        let addr_of = |key: &str, value: &str| {
            value
                .parse::<SocketAddr>()
                .map_err(|e| error(format!("`{key}={value}` is not an address: {e}")))
        };
        let (mut addr, mut store, mut metrics) = (None, None, None);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Some((key, value)) = line.split_once('=') else {
                return Err(error(format!("`{line}` is not a key=value line")));
            };
            match key {
                "addr" => addr = Some(addr_of(key, value)?),
                "store" => store = Some(PathBuf::from(value)),
                "metrics" => metrics = Some(addr_of(key, value)?),
                _ => {}
            }
        }
        Ok(Self {
            addr: addr.ok_or_else(|| error("no addr= line".into()))?,
            store,
            metrics,
        })
    }

    /// Writes the file at `path`, whole: a reader never sees part of it.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, self.to_text())?;
        std::fs::rename(tmp, path)
    }

    /// The ready file at `path`, or `None` while there is none (the daemon is not serving yet).
    pub fn read(path: &Path) -> Result<Option<Self>, ReadyError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text, &path.display().to_string()).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ReadyError {
                path: path.display().to_string(),
                message: e.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_file_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fe.ready");
        assert_eq!(Ready::read(&path), Ok(None));
        let ready = Ready {
            addr: "127.0.0.1:7400".parse().unwrap(),
            store: Some("/tmp/out/run 1.sqlite".into()),
            metrics: Some("127.0.0.1:9100".parse().unwrap()),
        };
        ready.write(&path).unwrap();
        assert_eq!(Ready::read(&path), Ok(Some(ready)));
        assert!(!path.with_extension("tmp").exists());
        let relay = Ready::serving("[::1]:7401".parse().unwrap());
        relay.write(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "addr=[::1]:7401\n");
        assert_eq!(Ready::read(&path), Ok(Some(relay)));
    }

    #[test]
    fn keys_it_does_not_know_are_skipped_and_a_bad_file_is_named() {
        let ready = Ready::parse("addr=10.0.0.1:7401\nzone=b\n\n", "x").unwrap();
        assert_eq!(ready, Ready::serving("10.0.0.1:7401".parse().unwrap()));
        assert_eq!(
            Ready::parse("store=/s\n", "r.ready").unwrap_err().to_string(),
            "ready file r.ready: no addr= line"
        );
        assert_eq!(
            Ready::parse("addr=host:1\n", "r.ready").unwrap_err().to_string(),
            "ready file r.ready: `addr=host:1` is not an address: invalid socket address syntax"
        );
        assert_eq!(
            Ready::parse("127.0.0.1:1\n", "r.ready").unwrap_err().to_string(),
            "ready file r.ready: `127.0.0.1:1` is not a key=value line"
        );
    }
}
