//! One module per subcommand (inspect, plan, sizes, shard, load, deploy), the CLI and JSON.

mod cli;
mod deploy;
mod folders;
mod inspect;
mod json;
pub(crate) mod load;
mod plan;
mod schemas;
pub(crate) mod shard;
mod sizes;
