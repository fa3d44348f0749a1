//! A parameter's filled slots: which checkpoint tensor fills each (shard id, expert id) slot.
//! A fused expert parameter of a large MoE has hundreds of slots per shard id, looked up for
//! every expert on every rank, so they are kept per shard id in a table indexed by expert id
//! rather than hashed (90,000 slots in a DeepSeek-V3 checkpoint).

use std::collections::HashMap;

use crate::layout::types::SlotKey;
use crate::mapping::rules::ShardId;

/// The checkpoint tensor that fills one slot of a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Feed {
    /// Index into the plan's sources.
    pub source: usize,
    /// Rotary permutation over this many heads (Mistral-native q/k), when the mapping asks for
    /// one and its head count evaluates.
    pub rotary_heads: Option<u64>,
    /// The scale (index into the plan's sources) an FP8 tensor is dequantized with while it
    /// fills the slot (the mapping's `dequantize_fp8`).
    pub dequant: Option<usize>,
}

#[derive(Debug, Default)]
pub(super) struct Fed {
    /// Expert ids below this (the parameter's experts) may be kept in a table. A checkpoint may
    /// name any id; one past the model's experts (which vLLM skips) must not grow the table.
    table_experts: u64,
    shards: Vec<Shard>,
}

/// How far past its end a table grows for one id: ids come nearly in order, and a lone large id
/// (a config and a checkpoint can claim any) goes to [`Shard::other`] instead of a table of
/// that size.
const TABLE_STEP: usize = 4096;

/// The slots of one shard id.
#[derive(Debug)]
struct Shard {
    id: Option<ShardId>,
    /// The slot without an expert id.
    plain: Option<Feed>,
    /// By expert id, below `Fed::table_experts`, grown by at most [`TABLE_STEP`] at a time.
    experts: Vec<Option<Feed>>,
    /// Any other expert id.
    other: HashMap<u64, Feed>,
}

impl Shard {
    /// An id may sit in `other` although the table has since grown past it.
    fn expert(&self, e: u64) -> Option<&Feed> {
        let in_table = usize::try_from(e).ok().and_then(|i| self.experts.get(i));
        match in_table {
            Some(Some(feed)) => Some(feed),
            _ if self.other.is_empty() => None,
            _ => self.other.get(&e),
        }
    }
}

impl Fed {
    /// The slots of a parameter with `experts` experts (`None`: not a fused expert parameter).
    pub(super) fn new(experts: Option<u64>) -> Fed {
        Fed {
            // Bounded as well by what a table may cost: a config can claim any count.
            table_experts: experts.unwrap_or(0),
            shards: Vec::new(),
        }
    }

    pub(super) fn get(&self, (shard, expert): &SlotKey) -> Option<&Feed> {
        let s = self.shard(shard)?;
        match *expert {
            None => s.plain.as_ref(),
            Some(e) => s.expert(e),
        }
    }

    /// The slot of `shard` for expert `e`.
    pub(super) fn expert(&self, shard: &Option<ShardId>, e: u64) -> Option<&Feed> {
        self.shard(shard)?.expert(e)
    }

    /// The slots of `shard` by expert, found once for a walk over many experts.
    pub(super) fn experts_of(&self, shard: &Option<ShardId>) -> Option<ExpertSlots<'_>> {
        Some(ExpertSlots {
            shard: self.shard(shard)?,
        })
    }

    pub(super) fn contains_key(&self, key: &SlotKey) -> bool {
        self.get(key).is_some()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| {
            s.plain.is_none() && s.other.is_empty() && s.experts.iter().all(Option::is_none)
        })
    }

    /// Fills `key` unless it is filled already; then says by what. One lookup of the shard id
    /// for both (the assign phase fills 90,000 slots of a DeepSeek-V3 checkpoint in turn).
    pub(super) fn fill(&mut self, (shard, expert): SlotKey, feed: Feed) -> Result<(), Feed> {
        let k = self.shard_index(shard);
        let s = &self.shards[k];
        let filled = match expert {
            None => s.plain,
            Some(e) => s.expert(e).copied(),
        };
        match filled {
            Some(prev) => Err(prev),
            None => {
                self.put(k, expert, feed);
                Ok(())
            }
        }
    }

    /// The index of `shard`'s slots, added if it has none yet.
    fn shard_index(&mut self, shard: Option<ShardId>) -> usize {
        match self.shards.iter().position(|s| s.id == shard) {
            Some(k) => k,
            None => {
                self.shards.push(Shard {
                    id: shard,
                    plain: None,
                    experts: Vec::new(),
                    other: HashMap::new(),
                });
                self.shards.len() - 1
            }
        }
    }

    /// Fills the slot of expert `expert` (none: the plain slot) of shard `k`.
    fn put(&mut self, k: usize, expert: Option<u64>, feed: Feed) {
        let table_experts = self.table_experts;
        let s = &mut self.shards[k];
        match expert {
            None => s.plain = Some(feed),
            Some(e)
                if e < table_experts
                    && usize::try_from(e).is_ok_and(|i| i < s.experts.len() + TABLE_STEP) =>
            {
                let i = e as usize;
                if s.experts.len() <= i {
                    s.experts.resize(i + 1, None);
                }
                s.experts[i] = Some(feed);
                if !s.other.is_empty() {
                    s.other.remove(&e);
                }
            }
            Some(e) => {
                s.other.insert(e, feed);
            }
        }
    }

    fn shard(&self, id: &Option<ShardId>) -> Option<&Shard> {
        self.shards.iter().find(|s| s.id == *id)
    }
}

/// One shard id's slots by expert ([`Fed::experts_of`]).
pub(super) struct ExpertSlots<'f> {
    shard: &'f Shard,
}

impl ExpertSlots<'_> {
    /// The slot of expert `e`, as [`Fed::expert`].
    pub(super) fn get(&self, e: u64) -> Option<&Feed> {
        self.shard.expert(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(source: usize) -> Feed {
        Feed {
            source,
            rotary_heads: None,
            dequant: None,
        }
    }

    /// A checkpoint may name an expert past the model's (vLLM skips it): the table must not
    /// grow to its id, and every slot is still found.
    #[test]
    fn an_expert_id_past_the_models_experts_stays_out_of_the_table() {
        let w1 = || Some(ShardId::named("w1"));
        let mut fed = Fed::new(Some(4));
        assert!(fed.is_empty());
        fed.fill((w1(), Some(1)), feed(7)).expect("an empty slot");
        fed.fill((w1(), Some(u64::MAX / 2)), feed(8))
            .expect("an empty slot");
        fed.fill((None, None), feed(9)).expect("an empty slot");
        assert_eq!(fed.shards.len(), 2);
        assert_eq!(fed.shards[0].experts.len(), 2);
        assert_eq!(fed.expert(&w1(), 1).map(|f| f.source), Some(7));
        let w1_slots = fed.experts_of(&w1()).expect("w1 has slots");
        assert_eq!(w1_slots.get(1).map(|f| f.source), Some(7));
        assert_eq!(w1_slots.get(u64::MAX / 2).map(|f| f.source), Some(8));
        assert!(w1_slots.get(2).is_none());
        assert!(fed.experts_of(&Some(ShardId::named("w3"))).is_none());
        assert!(fed.expert(&w1(), 0).is_none());
        assert_eq!(
            fed.get(&(w1(), Some(u64::MAX / 2))).map(|f| f.source),
            Some(8)
        );
        assert_eq!(fed.get(&(None, None)).map(|f| f.source), Some(9));
        assert!(!fed.contains_key(&(None, Some(1))));
        assert!(!fed.contains_key(&(Some(ShardId::named("w3")), Some(1))));
        assert!(!fed.is_empty());
    }

    /// A config may claim any number of experts and a checkpoint name any id below it: the table
    /// grows with the ids present, not to the largest.
    #[test]
    fn a_lone_large_expert_id_does_not_grow_the_table() {
        let w2 = || Some(ShardId::named("w2"));
        let mut fed = Fed::new(Some(u64::MAX));
        fed.fill((w2(), Some(0)), feed(1)).expect("an empty slot");
        fed.fill((w2(), Some(1 << 40)), feed(2))
            .expect("an empty slot");
        fed.fill((w2(), Some(5)), feed(3)).expect("an empty slot");
        assert_eq!(fed.shards[0].experts.len(), 6);
        assert_eq!(fed.expert(&w2(), 1 << 40).map(|f| f.source), Some(2));
        assert_eq!(fed.expert(&w2(), 5).map(|f| f.source), Some(3));
        assert!(fed.expert(&w2(), 3).is_none());
        assert!(fed.expert(&w2(), 1 << 20).is_none());
        // An id kept aside is still found once the table has grown past it.
        let aside = TABLE_STEP as u64 + 100;
        fed.fill((w2(), Some(aside)), feed(4))
            .expect("an empty slot");
        assert!(fed.shards[0].other.contains_key(&aside));
        for e in (6..aside + 10).filter(|&e| e != aside) {
            fed.fill((w2(), Some(e)), feed(5)).expect("an empty slot");
        }
        assert!(fed.shards[0].experts.len() as u64 > aside);
        assert_eq!(fed.expert(&w2(), aside).map(|f| f.source), Some(4));
        assert_eq!(fed.get(&(w2(), Some(aside))).map(|f| f.source), Some(4));
    }

    #[test]
    fn a_parameter_without_experts_keeps_its_slots_by_shard_id() {
        let mut fed = Fed::new(None);
        fed.fill((Some(ShardId::named("q")), None), feed(1))
            .expect("an empty slot");
        fed.fill((Some(ShardId::Index(1)), None), feed(2))
            .expect("an empty slot");
        fed.fill((Some(ShardId::Index(1)), Some(3)), feed(3))
            .expect("an empty slot");
        assert_eq!(
            fed.get(&(Some(ShardId::named("q")), None))
                .map(|f| f.source),
            Some(1)
        );
        assert_eq!(
            fed.get(&(Some(ShardId::Index(1)), None)).map(|f| f.source),
            Some(2)
        );
        assert_eq!(
            fed.expert(&Some(ShardId::Index(1)), 3).map(|f| f.source),
            Some(3)
        );
        assert!(fed.get(&(Some(ShardId::named("k")), None)).is_none());
        // A slot filled twice keeps its first feed and names it.
        assert_eq!(
            fed.fill((Some(ShardId::named("q")), None), feed(9)),
            Err(feed(1))
        );
        assert_eq!(
            fed.fill((Some(ShardId::Index(1)), Some(3)), feed(9)),
            Err(feed(3))
        );
        assert_eq!(
            fed.get(&(Some(ShardId::named("q")), None))
                .map(|f| f.source),
            Some(1)
        );
    }
}
