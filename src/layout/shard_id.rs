//! The shard id: which slice of a stacked parameter a checkpoint tensor fills. The name rules
//! attach it to a checkpoint name and every layout kind says which ids it takes, so it is layout
//! vocabulary, kept here below the mapping that reads it from YAML.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Which slice of a stacked parameter a checkpoint tensor fills.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum ShardId {
    Index(u64),
    /// `q`, `k`, `v`, `w1`, …: borrowed when the planner names a slot (one per piece, millions
    /// for a large MoE), owned when read from a mapping file.
    Name(std::borrow::Cow<'static, str>),
    /// Several consecutive output shards of a merged column filled by one checkpoint tensor,
    /// cut at its own offsets (vLLM's tuple shard id: Qwen3.5's `in_proj_qkv` is `(0, 1, 2)` of
    /// `in_proj_qkvz`, qwen3_5.py:225–233; `linear.py` MergedColumnParallelLinear.weight_loader).
    Tuple(Vec<u64>),
}

impl ShardId {
    /// As messages and matches spell it, without allocating for a named shard (the planner asks
    /// once per checkpoint tensor).
    pub(crate) fn text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            ShardId::Name(n) => std::borrow::Cow::Borrowed(n),
            ShardId::Index(k) => std::borrow::Cow::Owned(k.to_string()),
            ShardId::Tuple(_) => std::borrow::Cow::Owned(self.to_string()),
        }
    }

    /// The shard named `s`, borrowed for the names wload's mappings use (cloning it, once per
    /// checkpoint tensor, then allocates nothing).
    pub(crate) fn named(s: &str) -> ShardId {
        const KNOWN: [&str; 6] = ["q", "k", "v", "w1", "w2", "w3"];
        match KNOWN.iter().find(|k| **k == s) {
            Some(k) => ShardId::Name(std::borrow::Cow::Borrowed(k)),
            None => ShardId::Name(s.to_string().into()),
        }
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShardId::Index(i) => write!(f, "{i}"),
            ShardId::Name(s) => f.write_str(s),
            ShardId::Tuple(ks) => {
                let parts: Vec<String> = ks.iter().map(u64::to_string).collect();
                write!(f, "({})", parts.join(", "))
            }
        }
    }
}
