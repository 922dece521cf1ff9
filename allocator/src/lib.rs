//! placeholder
pub mod spec;
