//! compressed-tensors `pack-quantized` parameters (W4A16 / W8A16): vLLM's
//! `CompressedTensorsWNA16.create_weights` (schemes/compressed_tensors_wNa16.py:116–251) for a
//! linear layer and `CompressedTensorsWNA16MoEMethod.create_weights`
//! (compressed_tensors_moe_wna16.py:165–360) for fused experts, in their registration order.
//! Every tensor is a slice of the checkpoint's, so the slicing engine moves the packed words;
//! the geometry is the weight's with its sizes divided by the packing and group factors.

use super::super::Planner;
use super::super::params::Param;
use super::Extra;
use super::linear::{LinearShape, Style};
use crate::dtype::Dtype;
use crate::layout::{ExpertLastShard, Experts, Geometry, LastShard};
use crate::mapping::ExpertPart;
use crate::problem::Problem;
use crate::quant::compressed::Wna16;

impl<'m> Planner<'m> {
    /// `p` (a linear layer's `weight`) becomes `weight_packed` I32 `[N_r, K_r·bits/32]`, then
    /// `weight_scale`, `weight_shape` and, when asymmetric, `weight_zero_point`.
    pub(super) fn wna16_linear(
        &mut self,
        w: &Wna16,
        p: &mut Param<'m>,
        module: &str,
    ) -> Option<Vec<Extra>> {
        let Some(l) = LinearShape::of(&p.geometry) else {
            self.wna16_problem(p, format!("{module}: pack-quantized weights need a 2-D linear weight, but vLLM's layout here is {:?}", p.geometry), "list the module in quantization_config.ignore");
            return None;
        };
        let pf = w.pack_factor();
        let (k, tp) = (l.k, self.opts.tp);
        if !k.is_multiple_of(pf) || w.group.is_some_and(|g| !k.is_multiple_of(g)) {
            self.wna16_problem(
                p,
                format!(
                    "{module}: input size {k} is not a whole number of packed words ({pf} values) and groups ({:?})",
                    w.group
                ),
                "check config.json's dimensions against the checkpoint's quantization_config",
            );
            return None;
        }
        // Refused, but the parameters are still made: the checkpoint's tensors then find
        // theirs, and the refusal is the one problem reported for the layer.
        let whole_groups = match w.group {
            Some(g) => self.group_divides(p, module, l.k_local(tp), g, k, l.style == Style::Row),
            None => true,
        };
        if !w.symmetric && !l.out_divisible_by(pf) {
            self.wna16_problem(
                p,
                format!(
                    "{module}: asymmetric zero points are packed {pf} per int32 on the output dim, but an output part of this layer is not a multiple of {pf}"
                ),
                "use a symmetric checkpoint, or list the module in quantization_config.ignore",
            );
            return None;
        }
        let of = p.geometry.clone();
        p.name = format!("{module}.weight_packed");
        p.dtype = Dtype::I32;
        p.geometry = l.rows_first(1, k / pf);
        // Channel scales and zero points are whole on a row-parallel layer
        // (`marlin_repeat_scales_on_all_ranks`); group ones split with the input.
        let (scale, zero_point) = match w.group {
            // Refused already: kept whole, so that the split is not reported a second time.
            Some(g) if !whole_groups => (
                l.rows_first_whole_on_row(1, k / g),
                l.rows_first_whole_on_row(pf, k / g),
            ),
            Some(g) => (l.rows_first(1, k / g), l.rows_first(pf, k / g)),
            None => (
                l.rows_first_whole_on_row(1, 1),
                l.rows_first_whole_on_row(pf, 1),
            ),
        };
        let name = |s: &str| format!("{module}.{s}");
        let mut out = vec![
            Extra::required(name("weight_scale"), scale, self.model_dtype, 1.0),
            // Every shard copies its own global shape whole: the fused layer keeps the last.
            Extra::required(
                name("weight_shape"),
                Geometry::LastShard(LastShard {
                    of: Box::new(of),
                    shape: vec![2],
                }),
                Dtype::I64,
                0.0,
            ),
        ];
        if !w.symmetric {
            out.push(Extra::required(
                name("weight_zero_point"),
                zero_point,
                Dtype::I32,
                0.0,
            ));
        }
        Some(out)
    }

    /// vLLM's `verify_group_size_divides_partition` (distributed/utils.py:137): a rank's input
    /// columns must be whole groups, else a problem (and `false`).
    fn group_divides(
        &mut self,
        p: &Param<'m>,
        layer: &str,
        local: u64,
        g: u64,
        k: u64,
        split: bool,
    ) -> bool {
        if local.is_multiple_of(g) {
            return true;
        }
        let fits: Vec<String> = (0..=6)
            .map(|e| 1u64 << e)
            .filter(|t| !split || (k.is_multiple_of(*t) && (k / t).is_multiple_of(g)))
            .map(|t| t.to_string())
            .collect();
        self.wna16_problem(
            p,
            format!(
                "Weight input_size_per_partition={local} for layer '{layer}' is not divisible by group_size={g}. This happens when tensor_parallel_size splits the layer input into shards that are not a whole number of quant groups (input size {k} over tp {})",
                self.opts.tp
            ),
            &format!(
                "use a --tp that splits {k} columns into whole groups of {g} (tp {})",
                fits.join(", ")
            ),
        );
        false
    }

    fn wna16_problem(&mut self, p: &Param<'m>, message: String, fix: &str) {
        self.problems.push(Problem {
            message,
            fix: Some(fix.into()),
            parameter: Some(p.name.clone()),
            ..Default::default()
        });
    }

    /// A fused expert weight of a pack-quantized MoE: `w13_weight_packed`
    /// `[E_l, 2·I_r, H/pf]`, `w2_weight_packed` `[E_l, H, I_r/pf]`; after `w2`, the scales
    /// (model dtype), the zero points when asymmetric, and `w2_weight_shape`,
    /// `w13_weight_shape` `[E_l, 2]` in the model dtype (vLLM's registration order).
    pub(super) fn wna16_experts(
        &mut self,
        w: &Wna16,
        q: &crate::quant::Quantization,
        p: &mut Param<'m>,
        module: &str,
    ) -> Option<Vec<Extra>> {
        let Geometry::Experts(Experts {
            part,
            experts,
            intermediate: i,
            hidden: h,
        }) = p.geometry
        else {
            return None;
        };
        if !q.experts_quantized(module) {
            return None;
        }
        let pf = w.pack_factor();
        let (tp, ep) = (self.opts.tp, self.opts.expert_parallel);
        let i_r = if ep { i } else { i / tp.max(1) };
        // A refusal is reported once (problems are kept once each); a channel-strategy layer
        // has no parameters wload could make, a misfit one still gets them so that the
        // checkpoint's tensors find theirs.
        if !self.wna16_experts_fit(module, (i, h, i_r), w) && w.group.is_none() {
            return None;
        }
        let experts_of = |part, intermediate, hidden| {
            Geometry::Experts(Experts {
                part,
                experts,
                intermediate,
                hidden,
            })
        };
        let base = p.name.rsplit_once('.').map(|(b, _)| b.to_string())?;
        p.dtype = Dtype::I32;
        p.name = format!("{}_packed", p.name);
        p.geometry = match part {
            ExpertPart::W13 => experts_of(part, i, h / pf),
            ExpertPart::W2 => experts_of(part, i / pf, h),
        };
        if part == ExpertPart::W13 {
            return None;
        }
        // The group strategy only (checked with the sizes): groups along the input, H for w13
        // and I for w2.
        let g = w.group?;
        let name = |s: &str| format!("{base}.{s}");
        let (w13, w2) = (ExpertPart::W13, ExpertPart::W2);
        let model = self.model_dtype;
        let mut out = vec![
            Extra::required(
                name("w13_weight_scale"),
                experts_of(w13, i, h / g),
                model,
                1.0,
            ),
            Extra::required(
                name("w2_weight_scale"),
                experts_of(w2, i / g, h),
                model,
                1.0,
            ),
        ];
        if !w.symmetric {
            out.push(Extra::required(
                name("w13_weight_zero_point"),
                experts_of(w13, i / pf, h / g),
                Dtype::I32,
                0.0,
            ));
            out.push(Extra::required(
                name("w2_weight_zero_point"),
                experts_of(w2, i / g, h / pf),
                Dtype::I32,
                0.0,
            ));
        }
        for part in [w2, w13] {
            let shape = Geometry::ExpertLastShard(ExpertLastShard {
                part,
                experts,
                width: 2,
            });
            let n = format!("{}_weight_shape", super::part_name(part));
            out.push(Extra::required(name(&n), shape, model, 0.0));
        }
        Some(out)
    }

    /// vLLM's MoE checks (compressed_tensors_moe_wna16.py:236–283): whole groups in H and in a
    /// rank's intermediate part, whole packed zero-point words. `false` with the problem.
    fn wna16_experts_fit(&mut self, module: &str, (i, h, i_r): (u64, u64, u64), w: &Wna16) -> bool {
        let pf = w.pack_factor();
        let tp = self.opts.tp;
        let fix_tp =
            "use a compatible TP size or enable expert parallelism (--enable-expert-parallel)";
        let bad = if w.group.is_none() {
            Some((
                format!(
                    "{module}: pack-quantized experts with the channel strategy are not supported by wload (vLLM runs them on Marlin only, with per-channel scales loaded whole)"
                ),
                "use a group-quantized (strategy \"group\") checkpoint, or list the experts in quantization_config.ignore",
            ))
        } else if !h.is_multiple_of(pf) || !i.is_multiple_of(pf) || !i_r.is_multiple_of(pf) {
            Some((
                format!(
                    "{module}: expert sizes (hidden {h}, intermediate {i}, {i_r} per rank at tp {tp}) are not whole packed words of {pf} values"
                ),
                fix_tp,
            ))
        } else if let Some(g) = w.group.filter(|g| !h.is_multiple_of(*g)) {
            Some((
                format!(
                    "{module}: CompressedTensors WNA16 MoE requires hidden_size ({h}) to be divisible by group_size ({g})."
                ),
                "the checkpoint does not match config.json's hidden_size",
            ))
        } else {
            w.group.filter(|g| !i_r.is_multiple_of(*g)).map(|g| {
                (
                    format!(
                        "{module}: CompressedTensors WNA16 MoE with static group scales requires the MoE intermediate size per tensor-parallel partition ({i_r}) to be divisible by group_size ({g}). Scale groups would otherwise cross TP shard boundaries; use a compatible TP size or enable expert parallelism."
                    ),
                    fix_tp,
                )
            })
        };
        match bad {
            Some((message, fix)) => {
                // Named by the experts module, so that w13 and w2 report it once.
                self.problems.push(Problem {
                    message,
                    fix: Some(fix.into()),
                    parameter: Some(module.to_string()),
                    ..Default::default()
                });
                false
            }
            None => true,
        }
    }
}
