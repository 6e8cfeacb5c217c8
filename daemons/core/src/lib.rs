//! Canopy's daemon core: configuration, telemetry, topology, the tree transport, the round engine, the filter
//! interface and the node runtime shared by the front-end, relays and agents.

#![forbid(unsafe_code)]

pub mod config;
pub mod coverage;
pub mod daemon;
pub mod engine;
pub use canopy_filter_host::{filter, plugin};
pub mod node;
pub mod notify;
pub use canopy_wire::options;
pub mod ranks;
pub mod shutdown;
pub mod telemetry;
pub mod transport;
pub mod window;
