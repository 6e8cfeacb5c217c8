//! What every Canopy daemon's thin `main` shares: layered configuration (defaults, TOML, environment, flags
//! derived from the config struct), the daemon main itself (exit codes, `validate`, signals, forced exit),
//! tracing setup, systemd notification, the ready file, and the small network helpers (listeners, the host's name).

#![forbid(unsafe_code)]

pub mod auth;
pub mod common;
pub mod config;
pub mod daemon;
pub mod exporter;
pub mod memory;
pub mod net;
pub mod notify;
pub mod outdir;
pub mod ready;
pub mod shutdown;
pub mod telemetry;
pub mod tls;
pub mod tls_hint;
