//! Canopy's daemon core: the tree transport, the round engine, the filter interface and the node runtime shared
//! by the front-end, relays and agents.

#![forbid(unsafe_code)]

pub mod coverage;
pub mod engine;
pub use canopy_filter_host::{filter, plugin};
pub mod node;
pub use canopy_wire::options;
pub mod ranks;
pub mod transport;
pub mod window;
