//! What is wrong with a checkpoint, for this model and layout: the refusal record every stage
//! fills ([`Problem`]), a set of them in the order found ([`Problems`]), and how a list of them is
//! shown on a terminal ([`ProblemList`]). A leaf, so that checkpoint headers, pre-sharded folders
//! and the planner describe a refusal the same way without importing each other.

use std::hash::BuildHasher;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use serde::Serialize;

mod list;

pub(crate) use list::ProblemList;

/// One thing wrong with the checkpoint for this model and TP size, with the likely fix, and what
/// it is about as fields, which `--json` prints (docs/json.md). They are set where the problem is
/// found, so that no reader has to parse `message`; each is `None` (and left out of the JSON)
/// when the problem is not about one, as `..Problem::default()` leaves them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, schemars::JsonSchema)]
pub struct Problem {
    pub message: String,
    /// `null` when there is no likely fix to suggest.
    pub fix: Option<String>,
    /// The weight file (as the checkpoint names it) holding `tensor`, or the file at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The checkpoint tensor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor: Option<String>,
    /// The vLLM parameter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameter: Option<String>,
    /// The checkpoint tensor's shape, when the problem is that it does not fit (or its size).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
    /// The shape the parameter needs instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_shape: Option<Vec<u64>>,
    /// The mapping rules that renamed `tensor` to `parameter`, as messages describe them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

/// Problems in the order found, each once. A checkpoint with tens of thousands of layers can
/// yield hundreds of thousands of problems, so "seen before?" is a hash lookup, not a scan: the
/// table holds indices into the list rather than a second copy of every message.
#[derive(Default)]
pub struct Problems {
    pub list: Vec<Problem>,
    seen: HashTable<usize>,
    hasher: foldhash::fast::FixedState,
}

impl Problems {
    pub(crate) fn push(&mut self, p: Problem) {
        let Problems { list, seen, hasher } = self;
        let hash = hasher.hash_one(&p);
        match seen.entry(hash, |&i| list[i] == p, |&i| hasher.hash_one(&list[i])) {
            Entry::Occupied(_) => {}
            Entry::Vacant(v) => {
                v.insert(list.len());
                list.push(p);
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}
