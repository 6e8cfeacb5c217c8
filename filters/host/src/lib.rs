//! Canopy's filter host: the node's side of a stream's filter ([`filter::FilterInstance`], created by a
//! [`filter::FilterFactory`]) and the loader of filter plugins through the C ABI ([`plugin`]). Every unsafe call a
//! daemon makes into a plugin is in this crate.

// Unsafe code is confined to the plugin loader, which calls into loaded libraries through the C ABI.
#![deny(unsafe_code)]

pub mod filter;
#[allow(unsafe_code)]
pub mod guard;
#[allow(unsafe_code)]
pub mod plugin;
