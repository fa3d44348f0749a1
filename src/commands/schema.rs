//! The version of every `--json` document, in one table: each is bumped when a field of its
//! document changes meaning or disappears (docs/json.md and the document's own page). Here, the
//! lowest layer that writes one: the commands build the reports that carry the field, and
//! `report::json` adds it to the documents whose reports do not.

/// `wload inspect --json` (docs/inspect-json.md): of a checkpoint, one safetensors file, a
/// pre-sharded folder, or a folder without a config. Adding fields does not bump a version.
pub const INSPECT: u32 = 1;
/// `wload plan --json` (docs/plan-json.md).
pub const PLAN: u32 = 1;
/// `wload sizes --json` (docs/sizes-json.md).
pub const SIZES: u32 = 1;
/// `wload shard --json` (docs/shard-json.md).
pub const SHARD: u32 = 1;
/// `wload load --json` (docs/load-json.md).
pub const LOAD: u32 = 1;
/// The error document of every command: the same as the plan's refusal document's, which it
/// extends.
pub const ERROR: u32 = PLAN;
