//! The skeleton of a filter of one phase whose every level sends one packet up: a leaf builds it from its ranks'
//! profiles, a relay and the root by merging their children's, and nothing comes down. A filter implements
//! [`OnePhase`] and calls [`one_phase_calls!`] inside its `impl Filter`; its `finalize` stays its own.

use canopy_filter_sdk::{Emit, Filter, Level, one_phase};
use prost::Message;

/// What a one-phase filter does at each level.
pub trait OnePhase: Filter {
    type Packet: Message;

    fn level(&self) -> Level;

    /// At a leaf: builds the round's packet from its ranks' profiles.
    fn leaf(&mut self, inputs: &[&[u8]], out: &mut dyn Emit);

    /// At a relay or the root: builds the round's packet by merging the children's.
    fn merge(&mut self, inputs: &[&[u8]], out: &mut dyn Emit);

    /// The packet just built, and the buffer (kept between rounds) its bytes are encoded into.
    fn packet(&mut self) -> (&Self::Packet, &mut Vec<u8>);

    /// Appends the packet's bytes to `into`: prost's encoding, unless the filter has a faster way to the same
    /// bytes.
    fn encode(packet: &Self::Packet, into: &mut Vec<u8>) {
        packet.encode_raw(into);
    }
}

/// Inside an `impl Filter for F` where `F: OnePhase`: its `upstream` and `downstream`.
#[macro_export]
macro_rules! one_phase_calls {
    () => {
        fn upstream(
            &mut self,
            _round: u64,
            phase: u32,
            inputs: &[&[u8]],
            out: &mut dyn canopy_filter_sdk::Emit,
        ) -> Result<(), String> {
            $crate::one_phase::upstream(self, phase, inputs, out)
        }

        fn downstream(
            &mut self,
            _round: u64,
            phase: u32,
            _packet: &[u8],
            _out: &mut dyn canopy_filter_sdk::Emit,
        ) -> Result<(), String> {
            canopy_filter_sdk::nothing_down(Self::NAME, phase)
        }
    };
}

/// [`Filter::upstream`] of a one-phase filter: the level's packet, encoded and sent up.
pub fn upstream<F: OnePhase>(
    f: &mut F,
    phase: u32,
    inputs: &[&[u8]],
    out: &mut dyn Emit,
) -> Result<(), String> {
    one_phase(F::NAME, phase)?;
    match f.level() {
        Level::Leaf => f.leaf(inputs, out),
        Level::Relay | Level::Root => f.merge(inputs, out),
    }
    let (packet, encoded) = f.packet();
    encoded.clear();
    F::encode(packet, encoded);
    out.up(0, encoded);
    Ok(())
}
