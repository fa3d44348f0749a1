//! The integration tests, as one test binary: linking the crate once instead of once per file
//! saves most of a test build's time. One module per area; `support` holds what they share (how
//! to run the binary, how a refusal looks, the golden fixtures, an independent safetensors
//! reader and writer).
//!
//! Run one area with `cargo test --test it <module>::` (for example `cargo test --test it shard::`).

mod support;

mod cli;
mod errors;
mod fuzz;
mod hub;
mod inspect;
mod load;
mod mappings;
mod mistral;
mod out_safety;
mod plan;
mod plan_errors;
mod shard;
mod tied;
