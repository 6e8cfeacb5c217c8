//! The results and packets of Canopy's standard filters (`canopy.filters.v1`) and the descriptors a filter
//! plugin exports, generated with prost alone so that a plugin links no gRPC stack. `canopy-proto` re-exports
//! this crate as `canopy_proto::filters`.

#![forbid(unsafe_code)]

/// The `canopy.filters.v1` package.
#[allow(clippy::all, clippy::pedantic)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/canopy.filters.v1.rs"));
}

pub mod known;

/// The encoded `FileDescriptorSet` of every message a standard filter takes or returns: canopy/filters/v1 and
/// canopy/v1/profile.proto (the `ProfileBatch` a leaf's inputs are, whose Rust types are canopy-wire's). A
/// plugin whose result is one of these returns it from `descriptors()`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/canopy_filters_descriptor.bin"));

impl v1::BinRanges {
    /// The range of `id`: (lo, hi). `None` when the ranges do not hold it, or when their columns differ in
    /// length or their ids are not sorted (a lookup is a binary search).
    pub fn get(&self, id: u64) -> Option<(f64, f64)> {
        if self.lo.len() != self.id.len() || self.hi.len() != self.id.len() {
            return None;
        }
        let i = self.id.binary_search(&id).ok()?;
        Some((self.lo[i], self.hi[i]))
    }
}

impl v1::ClassResult {
    /// The histograms of one of this result's classes as `Histogram` messages, in the class's order of events:
    /// each with the result's metric, the result's range for its event and its `bins` counts. An error names
    /// what does not fit: counts that are not `bins` per event, or an event without a range.
    pub fn histograms_of(&self, class: &v1::Class) -> Result<Vec<v1::Histogram>, String> {
        let bins = self.bins as usize;
        if bins == 0 || class.counts.len() != class.events.len() * bins {
            return Err(format!(
                "class {:#018x} has {} counts for {} events of {} bins",
                class.class_id,
                class.counts.len(),
                class.events.len(),
                self.bins
            ));
        }
        let none = v1::BinRanges::default();
        let ranges = self.ranges.as_ref().unwrap_or(&none);
        class
            .events
            .iter()
            .zip(class.counts.chunks(bins))
            .map(|(&id, counts)| {
                let (lo, hi) = ranges.get(id).ok_or_else(|| {
                    format!(
                        "class {:#018x}: event {id:#018x} has no range in the result",
                        class.class_id
                    )
                })?;
                Ok(v1::Histogram {
                    id,
                    metric: self.metric,
                    lo,
                    hi,
                    counts: counts.to_vec(),
                    app: String::new(),
                })
            })
            .collect()
    }
}

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
        for name in [
            "StatsResult",
            "HistogramResult",
            "ClassResult",
            "RankCount",
            "UtilizationResult",
            "NodeSamples",
            "LatencyResult",
        ] {
            assert!(defines("canopy.filters.v1", name), "{name}");
        }
        assert!(defines("canopy.v1", "ProfileBatch"));
    }

    #[test]
    fn a_class_reads_as_histograms_with_the_results_ranges() {
        let result = v1::ClassResult {
            bins: 2,
            metric: v1::Metric::Exclusive as i32,
            ranges: Some(v1::BinRanges {
                id: vec![3, 9],
                lo: vec![0.0, 5.0],
                hi: vec![1.0, 7.0],
            }),
            ..Default::default()
        };
        let class = v1::Class {
            class_id: 1,
            events: vec![9],
            counts: vec![4, 1],
            ..Default::default()
        };
        assert_eq!(
            result.histograms_of(&class).unwrap(),
            vec![v1::Histogram {
                id: 9,
                metric: v1::Metric::Exclusive as i32,
                lo: 5.0,
                hi: 7.0,
                counts: vec![4, 1],
                app: String::new(),
            }]
        );
        let short = v1::Class {
            counts: vec![4],
            ..class.clone()
        };
        assert_eq!(
            result.histograms_of(&short).unwrap_err(),
            "class 0x0000000000000001 has 1 counts for 1 events of 2 bins"
        );
        let unknown = v1::Class {
            events: vec![4],
            ..class
        };
        assert_eq!(
            result.histograms_of(&unknown).unwrap_err(),
            "class 0x0000000000000001: event 0x0000000000000004 has no range in the result"
        );
    }

    #[test]
    fn messages_round_trip() {
        let r = v1::RankCount { ranks: 3, bytes: 7 };
        assert_eq!(v1::RankCount::decode(r.encode_to_vec().as_slice()).unwrap(), r);
    }
}
