//! The integration tests, as one test binary: the crate and the test helpers are compiled and
//! linked once, not once per file. One module per area; `support` holds what they share (how
//! to run the binary, how a refusal looks, the golden fixtures, an independent safetensors
//! reader and writer).
//!
//! All tests share one process and run in parallel: give a child its environment and working
//! folder on its `Command` (`.env`, `.current_dir`), never through `std::env::set_var` or
//! `set_current_dir`; a test that waits for something bounds the wait and fails rather than exit
//! the process (see the fuzz harness's hang check).
//!
//! Run one area with `cargo test --test it <module>::` (for example `cargo test --test it shard::`).

mod support;

mod cli;
mod config_aliases;
mod config_defaults;
mod deepseek;
mod deploy;
mod errors;
mod fp8;
mod fuzz;
mod glm4_moe;
mod gpt_oss;
mod house;
mod hub;
mod inspect;
mod io;
mod json;
mod load;
mod mappings;
mod mistral;
mod out_safety;
mod plan;
mod plan_errors;
mod pp;
mod qwen2_moe;
mod safetensors_crate;
mod shard;
mod sizes;
mod source_changes;
mod terminal;
mod tied;
