//! Canopy's daemon core: the tree transport, the round engine, the filter interface and the node runtime shared
//! by the front-end, relays and agents.

#![forbid(unsafe_code)]

pub mod assembly;
pub mod engine;
pub mod metrics;
pub use canopy_filter_host::{filter, plugin};
pub mod node;
pub mod run;
pub use canopy_wire::options;
pub use canopy_wire::ranks;
pub mod transport;
pub mod window;

/// The log target of the latency account: at debug level (`CANOPY_LOG=canopy::latency=debug,info`) every node
/// logs where each round is, as wall-clock times in ns with the first dump the packet or round stands for: a
/// child's packet read from its stream (`packet read`) and handled (`packet in`), the round closed and filtered
/// (`round closed`), and the packet handed to the parent's stream (`packet out`). `canopy-bench latency` reads
/// them back, hop by hop, from the round's first dump anywhere in the tree.
pub const LATENCY: &str = "canopy::latency";
