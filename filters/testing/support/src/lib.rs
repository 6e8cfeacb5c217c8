//! Test support for Canopy's filters, for dev-dependencies only: an in-process tree that drives a filter
//! through the whole protocol ([`simulate`]), random shapes, arrival orders and profiles drawn from a seed
//! ([`Rng`], [`Case`]), and direct computations over all ranks at once to compare results with
//! ([`reference`]).

#![forbid(unsafe_code)]

mod data;
pub mod plugin;
pub mod reference;
mod rng;
mod sim;

pub use data::{
    Case, DataSpec, edge_value, encode_one, one_event_profile, one_event_profile_in, random_profiles,
};
pub use rng::Rng;
pub use sim::{Collect, Outcome, Rejected, Run, Tree, simulate};
