//! One module per subcommand (inspect, plan, sizes, shard, load, deploy), the CLI and JSON, and the
//! documents' commands (docs).

mod cli;
mod deploy;
mod docs;
mod folders;
mod inspect;
mod json;
pub(crate) mod load;
mod plan;
mod schemas;
pub(crate) mod shard;
mod sizes;
