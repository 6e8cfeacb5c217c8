//! The filter interface every stream's filter implements, and the built-in `passthrough` filter.
//!
//! A filter instance lives on one node for one stream. The engine hands it each closed group's payloads
//! (`upstream`) and each packet coming down from the parent (`downstream`); either call may emit packets up and
//! down. At the root, every packet a filter emits upward is a result and goes through `finalize`.

use std::collections::HashMap;

use prost::Message;

use canopy_proto::v1::ProfileBatch;

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
    #[error("unknown filter {name:?} (available: {available})")]
    Unknown { name: String, available: String },
    #[error("filter {filter}: bad parameters: {reason}")]
    BadParams { filter: String, reason: String },
    #[error("filter {filter} failed: {reason}")]
    Failed { filter: String, reason: String },
}

/// The calls a filter answers. `Send + Sync` so the node's task can hold it across awaits on any worker.
pub trait Filter: Send + Sync {
    fn upstream(&mut self, round: u64, phase: u32, inputs: &[&[u8]]) -> Result<Output, FilterError>;
    fn downstream(&mut self, round: u64, phase: u32, packet: &[u8]) -> Result<Output, FilterError>;
    /// At the root: turns a packet the filter emitted upward into the stored result.
    fn finalize(&mut self, round: u64, phase: u32, payload: &[u8]) -> Result<Vec<u8>, FilterError>;
}

/// Creates filter instances by name.
pub trait FilterFactory: Send + Sync {
    fn create(&self, name: &str, params: &str, level: Level) -> Result<Box<dyn Filter>, FilterError>;
    fn names(&self) -> Vec<String>;
}

/// The filters built into the daemons.
#[derive(Debug, Default, Clone)]
pub struct BuiltinFilters;

impl FilterFactory for BuiltinFilters {
    fn create(&self, name: &str, params: &str, _level: Level) -> Result<Box<dyn Filter>, FilterError> {
        match name {
            "passthrough" => {
                check_no_params(name, params)?;
                Ok(Box::new(Passthrough))
            }
            _ => Err(FilterError::Unknown {
                name: name.to_string(),
                available: self.names().join(", "),
            }),
        }
    }

    fn names(&self) -> Vec<String> {
        vec!["passthrough".to_string()]
    }
}

fn check_no_params(filter: &str, params: &str) -> Result<(), FilterError> {
    let p = params.trim();
    if p.is_empty() || p == "{}" || p == "null" {
        return Ok(());
    }
    match serde_json::from_str::<HashMap<String, serde_json::Value>>(p) {
        Ok(m) if m.is_empty() => Ok(()),
        Ok(m) => Err(FilterError::BadParams {
            filter: filter.to_string(),
            reason: format!(
                "takes no parameters, got {}",
                m.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        }),
        Err(e) => Err(FilterError::BadParams {
            filter: filter.to_string(),
            reason: format!("not JSON: {e}"),
        }),
    }
}

/// MRNet's null filter: carries raw per-rank profiles up unchanged. Each input is checked to be a
/// `ProfileBatch`; concatenated encodings of batches are a batch, so merging is appending bytes.
#[derive(Debug, Default)]
pub struct Passthrough;

impl Filter for Passthrough {
    fn upstream(&mut self, _round: u64, phase: u32, inputs: &[&[u8]]) -> Result<Output, FilterError> {
        let mut out = Output::default();
        let mut merged = Vec::with_capacity(inputs.iter().map(|i| i.len()).sum());
        for (i, input) in inputs.iter().enumerate() {
            match ProfileBatch::decode(*input) {
                Ok(_) => merged.extend_from_slice(input),
                Err(e) => out.rejected.push((i, format!("not a profile batch: {e}"))),
            }
        }
        out.up.push(Packet {
            phase,
            payload: merged,
        });
        Ok(out)
    }

    fn downstream(&mut self, _round: u64, phase: u32, packet: &[u8]) -> Result<Output, FilterError> {
        Ok(Output {
            down: vec![Packet {
                phase,
                payload: packet.to_vec(),
            }],
            ..Output::default()
        })
    }

    fn finalize(&mut self, _round: u64, _phase: u32, payload: &[u8]) -> Result<Vec<u8>, FilterError> {
        Ok(payload.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::v1::RankProfile;

    fn batch(ranks: &[u32]) -> Vec<u8> {
        ProfileBatch {
            profiles: ranks
                .iter()
                .map(|r| RankProfile {
                    rank: *r,
                    ..Default::default()
                })
                .collect(),
        }
        .encode_to_vec()
    }

    #[test]
    fn passthrough_concatenates_batches_and_rejects_garbage() {
        let mut f = BuiltinFilters.create("passthrough", "", Level::Relay).unwrap();
        let a = batch(&[0, 1]);
        let b = batch(&[2]);
        let junk = vec![0xff, 0xff, 0xff];
        let out = f.upstream(3, 0, &[&a, &junk, &b]).unwrap();
        assert_eq!(out.rejected.len(), 1);
        assert_eq!(out.rejected[0].0, 1);
        let merged = ProfileBatch::decode(out.up[0].payload.as_slice()).unwrap();
        assert_eq!(
            merged.profiles.iter().map(|p| p.rank).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }

    #[test]
    fn unknown_filters_and_bad_params_are_named() {
        let err = BuiltinFilters.create("nope", "", Level::Root).err().unwrap();
        assert_eq!(
            err.to_string(),
            "unknown filter \"nope\" (available: passthrough)"
        );
        let err = BuiltinFilters
            .create("passthrough", "{\"bins\": 3}", Level::Root)
            .err()
            .unwrap();
        assert_eq!(
            err.to_string(),
            "filter passthrough: bad parameters: takes no parameters, got bins"
        );
        assert!(BuiltinFilters.create("passthrough", "{}", Level::Root).is_ok());
    }
}
