//! A deliberately broken filter for the host's tests: it fails in the way its `fault` parameter says
//! (`panic_create`, `panic_upstream`, `panic_finalize`, `error_upstream`, `garbage`), or is slow where it says
//! (`slow_relay`: a relay's call for round `round` takes `delay_ms` more), and otherwise passes profiles through.
//! Built with the workspace, never installed.

#![forbid(unsafe_code)]

use canopy_filter_sdk::{Emit, Filter, Level, export_filter};
use canopy_wire::v1::ProfileBatch;
use prost::Message;

pub struct Faulty {
    fault: String,
    level: Level,
    /// `slow_relay`: the round whose relay call is slow, and by how much.
    slow_round: u64,
    delay: std::time::Duration,
}

impl Filter for Faulty {
    const NAME: &'static str = "faulty";
    const RESULT_TYPE: &'static str = "canopy.v1.ProfileBatch";

    fn create(params: &str, level: Level) -> Result<Self, String> {
        let v: serde_json::Value = serde_json::from_str(params).map_err(|e| format!("params: {e}"))?;
        let fault = v
            .get("fault")
            .and_then(|f| f.as_str())
            .unwrap_or("none")
            .to_string();
        if fault == "panic_create" {
            panic!("faulty: told to panic in create");
        }
        let number = |key: &str| v.get(key).and_then(|n| n.as_u64()).unwrap_or(0);
        Ok(Faulty {
            fault,
            level,
            slow_round: number("round"),
            delay: std::time::Duration::from_millis(number("delay_ms")),
        })
    }

    fn upstream(
        &mut self,
        round: u64,
        phase: u32,
        inputs: &[&[u8]],
        out: &mut dyn Emit,
    ) -> Result<(), String> {
        match self.fault.as_str() {
            "panic_upstream" => panic!("faulty: told to panic in upstream"),
            "error_upstream" => return Err("told to fail in upstream".into()),
            // The leaf emits bytes no level above can read.
            "garbage" if self.level == Level::Leaf => {
                out.up(phase, &[0xff, 0xff, 0xff, 0x01]);
                return Ok(());
            }
            // Slow, not stuck: within the node's filter-call time-out, the call then goes on as usual.
            "slow_relay" if self.level == Level::Relay && round == self.slow_round => {
                #[allow(
                    clippy::disallowed_methods,
                    reason = "a filter call runs on the host's filter thread: the sleep is the slow call"
                )]
                std::thread::sleep(self.delay);
            }
            _ => {}
        }
        let mut merged = Vec::new();
        for input in inputs {
            ProfileBatch::decode(*input).map_err(|e| format!("packet from below does not decode: {e}"))?;
            merged.extend_from_slice(input);
        }
        out.up(phase, &merged);
        Ok(())
    }

    fn finalize(&mut self, _round: u64, _phase: u32, packet: &[u8]) -> Result<Vec<u8>, String> {
        if self.fault == "panic_finalize" {
            panic!("faulty: told to panic in finalize");
        }
        Ok(packet.to_vec())
    }
}

export_filter!(Faulty);
