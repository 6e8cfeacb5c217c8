//! The standard results, told apart in one place: by the full protobuf name a stream declares for its results
//! (`canopy.filters.v1.StatsResult`, with or without the `type.googleapis.com/` of an `Any`), never by a suffix,
//! so a third-party plugin's `x.StatsResult` is not taken for the built-in one. The store, the views and the
//! report match on [`Known`] or decode with [`KnownResult::decode`].

use prost::{Message, Name};

use crate::v1;

/// The full name of the profiles a `passthrough` stream returns (a leaf's input; its Rust types are
/// canopy-wire's).
pub const PROFILE_BATCH: &str = "canopy.v1.ProfileBatch";

/// A result type Canopy knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Known {
    Stats,
    Histogram,
    Classes,
    Utilization,
    Nodes,
    Outliers,
    Kmeans,
    Latency,
    /// `canopy.v1.ProfileBatch`: each rank's own profile.
    Profiles,
}

impl Known {
    /// Every known type.
    pub const ALL: [Known; 9] = [
        Known::Stats,
        Known::Histogram,
        Known::Classes,
        Known::Utilization,
        Known::Nodes,
        Known::Outliers,
        Known::Kmeans,
        Known::Latency,
        Known::Profiles,
    ];

    /// The known type named `type_name` exactly (an `Any`'s `type.googleapis.com/` prefix allowed); `None` for
    /// any other.
    pub fn of(type_name: &str) -> Option<Known> {
        let name = type_name
            .strip_prefix("type.googleapis.com/")
            .unwrap_or(type_name);
        if name == PROFILE_BATCH {
            return Some(Known::Profiles);
        }
        let short = name.strip_prefix(v1::StatsResult::PACKAGE)?.strip_prefix('.')?;
        Known::ALL
            .into_iter()
            .find(|k| *k != Known::Profiles && k.short_name() == short)
    }

    /// The message's name within its package.
    fn short_name(self) -> &'static str {
        match self {
            Known::Stats => v1::StatsResult::NAME,
            Known::Histogram => v1::HistogramResult::NAME,
            Known::Classes => v1::ClassResult::NAME,
            Known::Utilization => v1::UtilizationResult::NAME,
            Known::Nodes => v1::NodeSamples::NAME,
            Known::Outliers => v1::OutliersResult::NAME,
            Known::Kmeans => v1::KmeansResult::NAME,
            Known::Latency => v1::LatencyResult::NAME,
            Known::Profiles => "ProfileBatch",
        }
    }

    /// Its full protobuf name.
    pub fn type_name(self) -> String {
        match self {
            Known::Profiles => PROFILE_BATCH.to_string(),
            k => format!("{}.{}", v1::StatsResult::PACKAGE, k.short_name()),
        }
    }
}

/// A result decoded as the type its stream declared.
#[derive(Debug, Clone, PartialEq)]
pub enum KnownResult {
    Stats(v1::StatsResult),
    Histogram(v1::HistogramResult),
    Classes(v1::ClassResult),
    Utilization(v1::UtilizationResult),
    Nodes(v1::NodeSamples),
    Outliers(v1::OutliersResult),
    Kmeans(v1::KmeansResult),
    Latency(v1::LatencyResult),
    /// A `canopy.v1.ProfileBatch`, left to canopy-wire's types to decode.
    Profiles,
    /// A type Canopy does not know (a third-party plugin's own).
    Other,
}

impl KnownResult {
    /// Decodes `bytes` as the result type named `type_name`; a type not known is [`KnownResult::Other`], bytes
    /// that are not its type an error.
    pub fn decode(type_name: &str, bytes: &[u8]) -> Result<KnownResult, prost::DecodeError> {
        Ok(match Known::of(type_name) {
            None => KnownResult::Other,
            Some(Known::Profiles) => KnownResult::Profiles,
            Some(Known::Stats) => KnownResult::Stats(Message::decode(bytes)?),
            Some(Known::Histogram) => KnownResult::Histogram(Message::decode(bytes)?),
            Some(Known::Classes) => KnownResult::Classes(Message::decode(bytes)?),
            Some(Known::Utilization) => KnownResult::Utilization(Message::decode(bytes)?),
            Some(Known::Nodes) => KnownResult::Nodes(Message::decode(bytes)?),
            Some(Known::Outliers) => KnownResult::Outliers(Message::decode(bytes)?),
            Some(Known::Kmeans) => KnownResult::Kmeans(Message::decode(bytes)?),
            Some(Known::Latency) => KnownResult::Latency(Message::decode(bytes)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_type_is_known_by_its_full_name_only() {
        for k in Known::ALL {
            assert_eq!(Known::of(&k.type_name()), Some(k), "{k:?}");
            assert_eq!(
                Known::of(&format!("type.googleapis.com/{}", k.type_name())),
                Some(k)
            );
        }
        assert_eq!(Known::Stats.type_name(), "canopy.filters.v1.StatsResult");
        assert_eq!(
            Known::of("x.StatsResult"),
            None,
            "a third party's message of the same name"
        );
        assert_eq!(Known::of("canopy.filters.v1.StatsResultX"), None);
        assert_eq!(
            Known::of("canopy.filters.v1.RankCount"),
            None,
            "a packet, not a result"
        );
        assert_eq!(Known::of("StatsResult"), None);
    }

    #[test]
    fn results_decode_as_their_declared_type() {
        let stats = v1::StatsResult {
            raw_bytes: 7,
            ..Default::default()
        };
        let bytes = stats.encode_to_vec();
        assert_eq!(
            KnownResult::decode("canopy.filters.v1.StatsResult", &bytes).unwrap(),
            KnownResult::Stats(stats)
        );
        assert_eq!(
            KnownResult::decode("acme.v1.StatsResult", &bytes).unwrap(),
            KnownResult::Other
        );
        assert!(KnownResult::decode("canopy.filters.v1.StatsResult", &[0xff, 0xff]).is_err());
    }
}
