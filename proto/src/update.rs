//! A round as a Subscribe client receives it ([`RoundUpdate`]), built the one way whether the round comes live
//! from the root or is replayed from the store, so the two cannot drift apart.

use crate::v1::{Coverage, RoundUpdate};

/// The stream a round belongs to, as an update names it.
#[derive(Debug, Clone, Copy)]
pub struct StreamOf<'a> {
    pub id: u32,
    pub name: &'a str,
    pub filter: &'a str,
    /// The full name of the stream's result type (`canopy.filters.v1.StatsResult`); empty if unknown.
    pub result_type: &'a str,
}

/// One round (or one piece of a don't-wait round) and its coverage.
#[derive(Debug, Clone)]
pub struct RoundOf {
    pub round: u64,
    pub phase: u32,
    pub coverage: Coverage,
    /// The stream's final result (a passthrough round's `ProfileBatch`), encoded.
    pub payload: Vec<u8>,
    /// Data that arrived after its round was closed.
    pub late: bool,
}

impl RoundUpdate {
    /// The update of `round` of `stream`: its result typed as the stream's result type. `replayed` says it was
    /// read from the store rather than sent live. Nothing missed, no names: the subscription adds those.
    pub fn of(stream: StreamOf<'_>, round: RoundOf, replayed: bool) -> RoundUpdate {
        RoundUpdate {
            stream_id: stream.id,
            stream: stream.name.to_string(),
            filter: stream.filter.to_string(),
            round: round.round,
            phase: round.phase,
            coverage: Some(round.coverage),
            result: Some(prost_types::Any {
                type_url: format!("type.googleapis.com/{}", stream.result_type),
                value: round.payload,
            }),
            late: round.late,
            missed: 0,
            replayed,
            names: Vec::new(),
        }
    }
}
