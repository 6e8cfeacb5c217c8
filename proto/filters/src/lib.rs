//! The results and packets of Canopy's standard filters (`canopy.filters.v1`) and the descriptors a filter
//! plugin exports, generated with prost alone so that a plugin links no gRPC stack. `canopy-proto` re-exports
//! this crate as `canopy_proto::filters`.

#![forbid(unsafe_code)]

/// The `canopy.filters.v1` package.
#[allow(clippy::all, clippy::pedantic)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/canopy.filters.v1.rs"));
}

/// The encoded `FileDescriptorSet` of every message a standard filter takes or returns: canopy/filters/v1 and
/// canopy/v1/profile.proto (the `ProfileBatch` a leaf's inputs are, whose Rust types are canopy-wire's). A
/// plugin whose result is one of these returns it from `descriptors()`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/canopy_filters_descriptor.bin"));

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn descriptor_set_defines_the_standard_results_and_the_profile_batch() {
        let fds = prost_types::FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).unwrap();
        let defines = |pkg: &str, name: &str| {
            fds.file
                .iter()
                .any(|f| f.package() == pkg && f.message_type.iter().any(|m| m.name() == name))
        };
        for name in ["StatsResult", "HistogramResult", "ClassResult", "RankCount"] {
            assert!(defines("canopy.filters.v1", name), "{name}");
        }
        assert!(defines("canopy.v1", "ProfileBatch"));
    }

    #[test]
    fn messages_round_trip() {
        let r = v1::RankCount { ranks: 3, bytes: 7 };
        assert_eq!(v1::RankCount::decode(r.encode_to_vec().as_slice()).unwrap(), r);
    }
}
