//! One module per subcommand (inspect, plan, sizes, shard, load, deploy), the CLI and JSON.

mod cli;
mod deploy;
mod inspect;
mod json;
mod load;
mod plan;
mod shard;
mod sizes;
