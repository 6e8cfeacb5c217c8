//! Canopy's wire protocol: the `canopy.v1` messages and (with the `grpc` feature, on by default) the `Tree` and
//! `Frontend` services, generated at build time.

#![forbid(unsafe_code)]
#![allow(clippy::all, clippy::pedantic)]

/// The `canopy.v1` package.
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/canopy.v1.rs"));
    pub use canopy_wire::v1::{
        AppOptions, CounterSample, EventName, EventSample, Options, ProfileBatch, RankProfile, TraceEvent,
        TraceKind,
    };
}

/// The results and packets of the standard filters (`canopy.filters.v1`): canopy-filter-proto's types, so
/// the daemons and the plugins share one type each.
pub use canopy_filter_proto as filters;

pub mod coverage;
mod update;
pub use update::{RoundOf, StreamOf};

/// The version a node states in its Hello; a parent refuses a child that speaks another one.
pub const PROTOCOL_VERSION: u32 = 1;

/// The most ranks one node may answer for (2^24): a Hello, NodeEvent or packet that counts more is refused, so no
/// count from the wire can overflow a sum of them.
pub const MAX_RANKS: u32 = 1 << 24;

/// The longest application name (in bytes) a rank may give and a node may name in its coverage: a name is
/// carried in every round's coverage, so it must stay small.
pub const MAX_APP_NAME: usize = 128;

/// Largest message either side of a Canopy gRPC connection accepts: a passthrough round of thousands of ranks
/// is several megabytes.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

/// The encoded `FileDescriptorSet` of every Canopy proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/canopy_descriptor.bin"));

pub use canopy_wire::event_id;

/// A stream's state, as the root reports it and the run store records it (canopy-store keeps its words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamState {
    Open,
    Closed,
    Failed,
}

impl StreamState {
    /// Whether the stream has ended (closed by a user, or failed).
    pub fn is_ended(self) -> bool {
        matches!(self, StreamState::Closed | StreamState::Failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_id_is_xxh3_of_the_name() {
        // Reference value of XXH3_64bits("MPI_Allreduce") with seed 0, from the xxHash reference implementation.
        assert_eq!(
            event_id("MPI_Allreduce"),
            xxhash_rust::xxh3::xxh3_64(b"MPI_Allreduce")
        );
        assert_ne!(event_id("MPI_Allreduce"), event_id("MPI_Allreduce "));
        assert_eq!(event_id(""), 0x2d06_8005_38d3_94c2);
    }

    #[test]
    fn descriptor_set_names_the_tree_service() {
        let fds: prost_types::FileDescriptorSet = prost::Message::decode(FILE_DESCRIPTOR_SET).unwrap();
        let tree = fds
            .file
            .iter()
            .find(|f| f.name() == "canopy/v1/tree.proto")
            .unwrap();
        assert_eq!(tree.service[0].name(), "Tree");
    }

    #[test]
    fn descriptor_set_carries_the_plugins_copy_of_their_files() {
        // The front-end registers this set and adds a plugin's files only under names it does not hold yet:
        // the files a standard plugin exports must be here, and the same.
        let ours: prost_types::FileDescriptorSet = prost::Message::decode(FILE_DESCRIPTOR_SET).unwrap();
        let theirs: prost_types::FileDescriptorSet =
            prost::Message::decode(filters::FILE_DESCRIPTOR_SET).unwrap();
        assert!(!theirs.file.is_empty());
        for f in &theirs.file {
            assert_eq!(
                ours.file.iter().find(|o| o.name() == f.name()),
                Some(f),
                "{}",
                f.name()
            );
        }
    }
}
