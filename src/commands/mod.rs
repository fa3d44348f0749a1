//! The subcommands as the library runs them: each takes its options, drives the stages in order
//! (resolve → map → plan → execute) and returns a report for [`crate::report`] or `--json`.
//! Imports point down from here to the stages, never back.

pub mod error;
pub mod inspect;
pub mod load;
pub mod pipeline;
pub mod plan;
pub mod schema;
pub mod shard;
