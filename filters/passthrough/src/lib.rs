//! The passthrough filter (MRNet's null filter): raw per-rank profiles travel to the front-end unchanged.
//! Concatenated encodings of `ProfileBatch` messages are themselves one, so merging is appending bytes; each
//! input is checked to be a batch first, and one that is not is rejected (its ranks count as malformed). The
//! rest is the SDK's defaults: packets from above go on down, and the root's packet is stored as it is.

#![forbid(unsafe_code)]

use canopy_filter_sdk::{Emit, Filter, Level, export_filter};
use canopy_wire::v1::ProfileBatch;
use prost::Message;

#[derive(Debug)]
pub struct Passthrough;

impl Filter for Passthrough {
    const NAME: &'static str = "passthrough";
    const RESULT_TYPE: &'static str = "canopy.v1.ProfileBatch";

    fn create(params: &str, _level: Level) -> Result<Self, String> {
        let p = params.trim();
        if p.is_empty() || p == "{}" || p == "null" {
            return Ok(Passthrough);
        }
        match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(p) {
            Ok(m) if m.is_empty() => Ok(Passthrough),
            Ok(m) => Err(format!(
                "takes no parameters, got {}",
                m.keys().cloned().collect::<Vec<_>>().join(", ")
            )),
            Err(e) => Err(format!("parameters are not a JSON object: {e}")),
        }
    }

    fn upstream(
        &mut self,
        _round: u64,
        phase: u32,
        inputs: &[&[u8]],
        out: &mut dyn Emit,
    ) -> Result<(), String> {
        let mut merged = Vec::with_capacity(inputs.iter().map(|i| i.len()).sum());
        for (i, input) in inputs.iter().enumerate() {
            match ProfileBatch::decode(*input) {
                Ok(_) => merged.extend_from_slice(input),
                Err(e) => out.reject(i, &format!("not a profile batch: {e}")),
            }
        }
        out.up(phase, &merged);
        Ok(())
    }
}

export_filter!(Passthrough);

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_wire::v1::RankProfile;

    #[derive(Default)]
    struct Collect {
        up: Vec<Vec<u8>>,
        rejected: Vec<(usize, String)>,
    }

    impl Emit for Collect {
        fn up(&mut self, _phase: u32, payload: &[u8]) {
            self.up.push(payload.to_vec());
        }
        fn down(&mut self, _phase: u32, _payload: &[u8]) {}
        fn reject(&mut self, index: usize, reason: &str) {
            self.rejected.push((index, reason.to_string()));
        }
    }

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
    fn concatenates_batches_and_rejects_garbage() {
        let mut f = Passthrough::create("", Level::Relay).unwrap();
        let mut out = Collect::default();
        f.upstream(
            3,
            0,
            &[&batch(&[0, 1]), &[0xff, 0xff, 0xff], &batch(&[2])],
            &mut out,
        )
        .unwrap();
        assert_eq!(out.rejected.len(), 1);
        assert_eq!(out.rejected[0].0, 1);
        let merged = ProfileBatch::decode(out.up[0].as_slice()).unwrap();
        assert_eq!(
            merged.profiles.iter().map(|p| p.rank).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }

    /// Step marks travel with their profiles, so a brute force over passthrough sees every one.
    #[test]
    fn step_marks_pass_through() {
        let marked = ProfileBatch {
            profiles: vec![RankProfile {
                app: "sim".into(),
                marks: vec![canopy_wire::v1::StepMark {
                    key_id: 3,
                    step: 7,
                    stop: true,
                    unix_ns: 11,
                }],
                marks_lost: 2,
                ..Default::default()
            }],
        };
        let mut f = Passthrough::create("", Level::Relay).unwrap();
        let mut out = Collect::default();
        f.upstream(0, 0, &[&batch(&[0]), &marked.encode_to_vec()], &mut out)
            .unwrap();
        let merged = ProfileBatch::decode(out.up[0].as_slice()).unwrap();
        assert_eq!(merged.profiles[1], marked.profiles[0]);
    }

    #[test]
    fn parameters_are_refused_by_name() {
        assert_eq!(
            Passthrough::create("{\"bins\": 3}", Level::Root).unwrap_err(),
            "takes no parameters, got bins"
        );
        assert!(Passthrough::create("{}", Level::Root).is_ok());
        assert!(
            Passthrough::create("[1]", Level::Root)
                .unwrap_err()
                .starts_with("parameters are not a JSON object")
        );
    }
}
