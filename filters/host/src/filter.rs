//! The host's side of a stream's filter: one instance per stream per node. Filters are plugins (see `plugin`); the node
//! runtime sees them only through this trait.
//!
//! A filter instance lives on one node for one stream. The engine hands it each closed group's payloads
//! (`upstream`) and each packet coming down from the parent (`downstream`); either call may emit packets up and
//! down. At the root, every packet a filter emits upward is a result and goes through `finalize`.

/// Where in the tree a filter instance runs; a filter may behave differently at the leaf or the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// The leaf agent: inputs are single-rank profiles.
    Leaf,
    Relay,
    Root,
}

/// One packet a filter emits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub phase: u32,
    pub payload: Vec<u8>,
}

/// What one call into a filter produced.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Output {
    pub up: Vec<Packet>,
    pub down: Vec<Packet>,
    /// Inputs the filter could not read, by index, with the reason; their ranks are counted as malformed.
    pub rejected: Vec<(usize, String)>,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FilterError {
    #[error("unknown filter {name:?} ({}available: {available})", .suggestion.as_ref().map(|s| format!("did you mean {s:?}? ")).unwrap_or_default())]
    Unknown {
        name: String,
        available: String,
        /// The available filter whose name is closest, when the name looks like a slip of it.
        suggestion: Option<String>,
    },
    #[error("filter {filter}: bad parameters: {reason}")]
    BadParams { filter: String, reason: String },
    #[error("filter {filter} failed: {reason}")]
    Failed { filter: String, reason: String },
    /// A native crash inside the call, caught: the instance is abandoned and never called again.
    #[error("filter {filter}: {call} crashed with {} (signal {signal}) in {}", crate::guard::signal_name(*.signal), .plugin.display())]
    Crashed {
        filter: String,
        call: String,
        signal: i32,
        plugin: std::path::PathBuf,
    },
    #[error("filter {name}: cannot load {path}: {reason}")]
    Load {
        name: String,
        path: std::path::PathBuf,
        reason: String,
    },
}

/// The calls a filter answers. `Send + Sync` so the node's task can hold it across awaits on any worker.
pub trait FilterInstance: Send + Sync {
    fn upstream(&mut self, round: u64, phase: u32, inputs: &[&[u8]]) -> Result<Output, FilterError>;
    fn downstream(&mut self, round: u64, phase: u32, packet: &[u8]) -> Result<Output, FilterError>;
    /// At the root: turns a packet the filter emitted upward into the stored result.
    fn finalize(&mut self, round: u64, phase: u32, payload: &[u8]) -> Result<Vec<u8>, FilterError>;
    /// Event and counter names as the node learns them (a classification by name needs them at the leaf).
    fn names(&mut self, _names: &[(u64, String)]) {}
    /// Phases of a round: a round is done at a node when it sends up a packet of phase `phases() - 1`.
    fn phases(&self) -> u32 {
        1
    }
}

/// Creates filter instances by name.
pub trait FilterFactory: Send + Sync {
    fn create(&self, name: &str, params: &str, level: Level) -> Result<Box<dyn FilterInstance>, FilterError>;
    fn names(&self) -> Vec<String>;
}
