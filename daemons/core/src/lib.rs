//! Canopy's daemon core: configuration, telemetry, topology, the tree transport, the round engine, the filter
//! interface and the node runtime shared by the front-end, relays and agents.

// Unsafe code is confined to the plugin host, which calls into loaded libraries through the C ABI.
#![deny(unsafe_code)]

pub mod config;
pub mod daemon;
pub mod engine;
pub mod filter;
pub mod node;
pub mod notify;
pub use canopy_wire::options;
#[allow(unsafe_code)]
pub mod plugin;
pub mod ranks;
pub mod shutdown;
pub mod telemetry;
pub mod topology;
pub mod transport;
