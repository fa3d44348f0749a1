//! The `experts` kind: vLLM's fused MoE weights from per-expert tensors (or one stacked tensor a
//! layer), split over the ranks or spread whole with expert parallelism (vLLM 0.33
//! `layers/fused_moe/`), and the shard ids every per-expert kind takes.

use serde::Deserialize;

use super::dense::whole_slot;
use super::types::{ExpertPart, RankLayout, Shape, Slice, SlotKey, name, not_divisible};
use super::{Dim, Eval, Kind, Rank, ShardId, size};

/// Fused routed experts: `w13` = [E_loc, 2·I_p, H] from w1 (gate) and w3 (up), or `w2` =
/// [E_loc, H, I_p]; split by tp, or by expert with expert parallelism.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experts<D = u64> {
    pub part: ExpertPart,
    pub experts: D,
    pub intermediate: D,
    pub hidden: D,
}

impl<D> Experts<D> {
    pub(super) fn try_map<E, X>(&self, f: &mut Eval<D, E, X>) -> Result<Experts<E>, X> {
        Ok(Experts {
            part: self.part,
            experts: f(&self.experts, Dim::Experts)?,
            intermediate: f(&self.intermediate, Dim::Size)?,
            hidden: f(&self.hidden, Dim::Size)?,
        })
    }
}

impl Kind for Experts {
    fn check(&self, r: Rank) -> Vec<String> {
        if r.ep {
            return vec![];
        }
        not_divisible("expert intermediate size", self.intermediate, r.tp)
            .into_iter()
            .collect()
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        expected_source(
            self.part,
            [self.experts, self.intermediate, self.hidden],
            shard,
        )
    }

    fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        (self.part.slots(self.experts), Some((None, None)))
    }

    fn rank_layout(&self, r: Rank, fused: bool) -> RankLayout {
        let Experts {
            part,
            experts,
            intermediate,
            hidden,
        } = *self;
        if fused {
            stacked_experts(part, experts, intermediate, hidden, r)
        } else {
            expert_blocks(part, experts, intermediate, hidden, r)
        }
    }

    fn expert_count(&self) -> Option<u64> {
        Some(self.experts)
    }

    fn fits(&self) -> Result<(), Vec<u64>> {
        size::experts(self.experts, self.intermediate, self.hidden)
    }

    #[cfg(test)]
    fn samples() -> Vec<super::Geometry> {
        [(ExpertPart::W13, 4), (ExpertPart::W2, 5)]
            .map(|(part, experts)| {
                Experts {
                    part,
                    experts,
                    intermediate: 16,
                    hidden: 4,
                }
                .into()
            })
            .to_vec()
    }
}

/// Whether `shard` is an id that fills one expert of `part` (no shard id: a stacked tensor),
/// for the kinds that take the experts' shard ids.
pub(super) fn check_shard(part: ExpertPart, shard: Option<&ShardId>) -> Result<(), String> {
    expected_source(part, [0, 0, 0], shard).map(drop)
}

/// Fused expert weights: every expert's intermediate split over the ranks, or with expert
/// parallelism whole experts spread over them.
fn expert_blocks(
    part: ExpertPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> RankLayout {
    let share = r.experts(experts);
    let ip = share.of(intermediate);
    let e_loc = share.count();
    let (from, to) = (share.rank * ip, (share.rank + 1) * ip);
    let local = share.local;
    let first = Some(local.start);
    match part {
        ExpertPart::W13 => {
            let slices = ["w1", "w3"]
                .iter()
                .enumerate()
                .map(|(h, s)| Slice {
                    slot: (name(s), first),
                    src_shape: vec![intermediate, hidden],
                    dim: 0,
                    from,
                    to,
                    dst_shape: vec![2 * ip, hidden],
                    dst_at: h as u64 * ip,
                    dst_base: 0,
                })
                .collect();
            RankLayout::per_expert(vec![e_loc, 2 * ip, hidden], local, 2 * ip * hidden, slices)
        }
        ExpertPart::W2 => {
            let slice = Slice {
                slot: (name("w2"), first),
                src_shape: vec![hidden, intermediate],
                dim: 1,
                from,
                to,
                dst_shape: vec![hidden, ip],
                dst_at: 0,
                dst_base: 0,
            };
            RankLayout::per_expert(vec![e_loc, hidden, ip], local, hidden * ip, vec![slice])
        }
    }
}

/// The checkpoint shape a fused expert parameter's shard expects: one expert's `w1`/`w3`
/// `[I, H]` or `w2` `[H, I]`, or, without a shard id, one stacked tensor for every expert
/// ([`stacked_experts`]).
fn expected_source(
    part: ExpertPart,
    [experts, intermediate, hidden]: [u64; 3],
    shard: Option<&ShardId>,
) -> Result<Shape, String> {
    let shape = |s: &[u64]| Ok(Shape::from_slice(s));
    match (part, shard.map(|s| s.text()).as_deref()) {
        (ExpertPart::W13, Some("w1" | "w3")) => shape(&[intermediate, hidden]),
        (ExpertPart::W13, None) => shape(&[experts, 2 * intermediate, hidden]),
        (ExpertPart::W2, Some("w2")) => shape(&[hidden, intermediate]),
        (ExpertPart::W2, None) => shape(&[experts, hidden, intermediate]),
        (_, s) => Err(format!(
            "shard_id must be ['w1','w2','w3'] matching the parameter, got {}",
            s.unwrap_or("none")
        )),
    }
}

/// Fused expert weights from one stacked tensor a layer, stored as vLLM holds them: `w13` from
/// `gate_up_proj` `[E, 2I, H]` (per expert gate rows then up rows), `w2` from `down_proj`
/// `[E, H, I]` (transformers 5's fused Qwen3.5 experts). vLLM's `RoutedExperts.load_weights`
/// chunks the tensor in halves on dim 1 and loads every expert as if it came alone
/// (`fused_moe/routed_experts.py:1004–1075`), so the rank's tensor is the per-expert layout's:
/// `[gate_r; up_r]` / columns `I_r·rank…` of every expert, or whole experts with expert
/// parallelism (one run of the tensor's leading rows).
fn stacked_experts(
    part: ExpertPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> RankLayout {
    let (i, h) = (intermediate, hidden);
    if r.ep {
        let local = r.experts(experts).local;
        let n = local.end - local.start;
        let per = 2 * i * h / if part == ExpertPart::W13 { 1 } else { 2 };
        let shape = match part {
            ExpertPart::W13 => vec![n, 2 * i, h],
            ExpertPart::W2 => vec![n, h, i],
        };
        let slice = whole_slot(vec![experts, per], 0, local.start, local.end, vec![n, per]);
        return RankLayout::new(shape, vec![slice], Vec::new());
    }
    let ip = i / r.tp;
    let (from, e) = (r.rank * ip, experts);
    let slices = match part {
        ExpertPart::W13 => [0, 1]
            .map(|half| Slice {
                slot: (None, None),
                src_shape: vec![e, 2 * i, h],
                dim: 1,
                from: half * i + from,
                to: half * i + from + ip,
                dst_shape: vec![e, 2 * ip, h],
                dst_at: half * ip,
                dst_base: 0,
            })
            .to_vec(),
        ExpertPart::W2 => vec![whole_slot(
            vec![e, h, i],
            2,
            from,
            from + ip,
            vec![e, h, ip],
        )],
    };
    let shape = slices[0].dst_shape.clone();
    RankLayout::new(shape, slices, Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Geometry;

    /// vLLM's linear expert map: extra experts go to the first ranks.
    #[test]
    fn extra_experts_go_to_the_first_ranks() {
        let local = |n, tp, rank| Rank { tp, rank, ep: true }.experts(n).local;
        assert_eq!(local(5, 2, 0), 0..3);
        assert_eq!(local(5, 2, 1), 3..5);
        assert_eq!(local(8, 8, 7), 7..8);
    }

    /// A fused 3-D expert tensor (`gate_up_proj` `[E, 2I, H]`, `down_proj` `[E, H, I]`) loads,
    /// over TP 1–16 with and without expert parallelism, exactly what the per-expert tensors
    /// load: vLLM's `RoutedExperts.load_weights` chunks it in halves on dim 1 and hands each
    /// expert to the per-expert loader (routed_experts.py:1004–1075).
    #[test]
    fn stacked_experts_load_what_per_expert_tensors_load_over_tp_1_to_16() {
        let (e, i, h) = (5u64, 16u64, 3u64);
        for part in [ExpertPart::W13, ExpertPart::W2] {
            let g = Geometry::Experts(Experts {
                part,
                experts: e,
                intermediate: i,
                hidden: h,
            });
            for tp in 1..=16u64 {
                for ep in [false, true] {
                    if !ep && !i.is_multiple_of(tp) {
                        continue;
                    }
                    for rank in 0..tp {
                        let r = Rank { tp, rank, ep };
                        let per = element_sources(&g.rank_layout(r, false));
                        let fused = element_sources(&g.rank_layout(r, true));
                        // Per expert (shard, e, row-major index in [I, H] or [H, I]) in the
                        // stacked tensor's terms.
                        let want: Vec<u64> = per
                            .iter()
                            .map(|(shard, ex, idx)| {
                                let half = u64::from(shard == "w3");
                                let per_expert =
                                    if part == ExpertPart::W13 { 2 } else { 1 } * i * h;
                                ex * per_expert + half * i * h + idx
                            })
                            .collect();
                        let got: Vec<u64> = fused.iter().map(|(_, _, idx)| *idx).collect();
                        assert_eq!(got, want, "{part:?} tp{tp} r{rank} ep{ep}");
                    }
                }
            }
        }
    }

    /// Each element of a rank tensor: the slot's shard id, expert id (0 for a stacked tensor)
    /// and source element index.
    fn element_sources(l: &RankLayout) -> Vec<(String, u64, u64)> {
        let n = l.shape.iter().product::<u64>() as usize;
        let mut out = vec![None; n];
        for s in l.all_slices() {
            let b = s.block();
            let shard = s.slot.0.as_ref().map_or(String::new(), |x| x.to_string());
            for k in 0..b.rows {
                for x in 0..b.row {
                    let d = (b.dst_start + k * b.dst_stride + x) as usize;
                    assert!(out[d].is_none(), "element {d} twice");
                    out[d] = Some((
                        shard.clone(),
                        s.slot.1.unwrap_or(0),
                        b.src_start + k * b.src_stride + x,
                    ));
                }
            }
        }
        out.into_iter().map(|x| x.expect("filled")).collect()
    }
}
