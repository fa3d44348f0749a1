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
//! The modules are grouped by what they test: `commands` (one module per subcommand, the CLI and
//! the JSON documents), `families` (model families and their mappings), `formats` (quantized
//! tensors, pipeline parallelism, hub sources, safetensors, I/O) and `safety` (refusals, writes
//! outside OUT, changing sources, terminal escaping, fuzzing); `golden` has one module per golden
//! case, its checks' bodies living with their subcommand.
//!
//! Run one area with `cargo test --test it -- <area>::` (for example `cargo test --test it --
//! safety::` or `cargo test --test it -- commands::shard::`), one golden
//! case with `cargo test --test it -- golden::llama_gqa_tp2`.

// Tests may print what they measured; the rule is for the library.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod support;

mod commands;
mod families;
mod formats;
mod golden;
mod house;
mod safety;
mod snapshots;
