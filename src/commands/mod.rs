//! The subcommands as the library runs them: each takes its options, drives the stages in order
//! (resolve → map → plan → execute) and returns a report for [`crate::report`] or `--json`.
//! Imports point down from here to the stages, never back.

pub(crate) mod error;
pub(crate) mod inspect;
pub(crate) mod load;
pub(crate) mod pipeline;
pub(crate) mod plan;
pub mod schema;
pub(crate) mod shard;
