//! The weight-only integer group of `format: pack-quantized` (vLLM's `CompressedTensorsWNA16`
//! for linears, `CompressedTensorsWNA16MoEMethod` for experts): 4- or 8-bit integers packed
//! into int32 words, scaled per group of input columns or per output channel, with packed zero
//! points when asymmetric.

use serde_json::Value;

use super::super::cx::{Cx, Weight};
use super::super::extra::{Extra, part_name};
use super::super::linear::{LinearShape, Style};
use super::super::{QuantError, USE_UNQUANTIZED, field, refuse};
use crate::dtype::Dtype;
use crate::layout::{ExpertLastShard, Experts, Geometry, LastShard};
use crate::mapping::ExpertPart;
use crate::problem::Problem;

/// Packed integer weights (W4A16 / W8A16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wna16 {
    /// 4 or 8: `32 / bits` values per int32 word.
    pub bits: u64,
    /// The input columns one scale covers; `None` for the channel strategy (one scale per row).
    pub group: Option<u64>,
    /// No zero points when symmetric.
    pub symmetric: bool,
}

impl Wna16 {
    /// Values per packed int32 word.
    pub(crate) fn pack_factor(&self) -> u64 {
        32 / self.bits
    }

    pub(super) fn parse(group: &Value, at: &dyn Fn(&str) -> String) -> Result<Self, QuantError> {
        let w = super::weights_of(group, at)?;
        if group.get("input_activations").is_some_and(|a| !a.is_null()) {
            return Err(refuse(
                format!(
                    "compressed-tensors pack-quantized with {} set is not supported: wload writes weight-only (W4A16 / W8A16) integer schemes",
                    at("input_activations")
                ),
                &USE_UNQUANTIZED,
            ));
        }
        if field(w, "type") != "int" {
            return Err(refuse(
                format!(
                    "compressed-tensors pack-quantized weights of type {} are not supported (nvfp4-pack-quantized is its own format); wload writes int weights here",
                    field(w, "type")
                ),
                &USE_UNQUANTIZED,
            ));
        }
        let bits = match field(w, "num_bits").as_u64() {
            Some(b @ (4 | 8)) => b,
            Some(b @ 2..=7) => {
                return Err(refuse(
                    format!(
                        "compressed-tensors pack-quantized with num_bits = {b} is not supported by wload ({}): vLLM packs it, but wload writes 4- and 8-bit packed weights only",
                        at("weights.num_bits")
                    ),
                    &USE_UNQUANTIZED,
                ));
            }
            b => {
                return Err(refuse(
                    format!(
                        "Unsupported num_bits = {}. Supported num_bits = [2, 3, 4, 5, 6, 7, 8] ({})",
                        b.map_or("none".to_string(), |b| b.to_string()),
                        at("weights.num_bits")
                    ),
                    "quantization_config is malformed: pack-quantized weights have 2 to 8 bits",
                ));
            }
        };
        if field(w, "dynamic") == true {
            return Err(refuse(
                format!(
                    "compressed-tensors pack-quantized weights must be static ({} is dynamic): vLLM's WNA16 scheme takes static group or channel weights",
                    at("weights")
                ),
                &USE_UNQUANTIZED,
            ));
        }
        let group = match (
            field(w, "strategy").as_str(),
            field(w, "group_size").as_u64(),
        ) {
            (Some("group"), Some(g)) if g > 0 => Some(g),
            (Some("channel"), _) => None,
            (s, _) => {
                return Err(refuse(
                    format!(
                        "Pack-quantized format requires group quantization or channelwise quantization, but found no group size and strategy is not channelwise ({}: strategy {s:?}, group_size {})",
                        at("weights"),
                        field(w, "group_size")
                    ),
                    "quantization_config is malformed: give strategy \"group\" with a group_size, or \"channel\"",
                ));
            }
        };
        Ok(Wna16 {
            bits,
            group,
            symmetric: field(w, "symmetric") != false,
        })
    }

    /// `int4 group 32 symmetric (W4A16)`, for reports.
    pub(crate) fn describe(&self) -> String {
        let scales = match self.group {
            Some(g) => format!("group {g}"),
            None => "per-channel".to_string(),
        };
        let sym = if self.symmetric {
            "symmetric"
        } else {
            "asymmetric (zero points)"
        };
        format!("int{} {scales} {sym} (W{}A16)", self.bits, self.bits)
    }
}
// Parameters: vLLM's `CompressedTensorsWNA16.create_weights` (schemes/compressed_tensors_wNa16.py:
// 116–251) for a linear layer and `CompressedTensorsWNA16MoEMethod.create_weights`
// (compressed_tensors_moe_wna16.py:165–360) for fused experts, in their registration order.
// Every tensor is a slice of the checkpoint's, so the slicing engine moves the packed words; the
// geometry is the weight's with its sizes divided by the packing and group factors.

/// `p` (a linear layer's `weight`) becomes `weight_packed` I32 `[N_r, K_r·bits/32]`, then
/// `weight_scale`, `weight_shape` and, when asymmetric, `weight_zero_point`.
pub(super) fn linear(w: &Wna16, p: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
    let module = p.name.strip_suffix(".weight")?.to_string();
    let module = module.as_str();
    let Some(l) = LinearShape::of(p.geometry) else {
        problem(
            cx,
            p.name,
            format!(
                "{module}: pack-quantized weights need a 2-D linear weight, but vLLM's layout here is {:?}",
                p.geometry
            ),
            "list the module in quantization_config.ignore",
        );
        return None;
    };
    let pf = w.pack_factor();
    let (k, tp) = (l.k, cx.tp);
    if !k.is_multiple_of(pf) || w.group.is_some_and(|g| !k.is_multiple_of(g)) {
        problem(
            cx,
            p.name,
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
        Some(g) => group_divides(
            cx,
            p.name,
            module,
            [l.k_local(tp), g, k],
            l.style == Style::Row,
        ),
        None => true,
    };
    if !w.symmetric && !l.out_divisible_by(pf) {
        problem(
            cx,
            p.name,
            format!(
                "{module}: asymmetric zero points are packed {pf} per int32 on the output dim, but an output part of this layer is not a multiple of {pf}"
            ),
            "use a symmetric checkpoint, or list the module in quantization_config.ignore",
        );
        return None;
    }
    let of = p.geometry.clone();
    *p.name = format!("{module}.weight_packed");
    *p.dtype = Dtype::I32;
    *p.geometry = l.rows_first(1, k / pf);
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
        Extra::required(name("weight_scale"), scale, cx.model_dtype, 1.0),
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
    cx: &mut Cx<'_>,
    parameter: &str,
    layer: &str,
    [local, g, k]: [u64; 3],
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
    problem(
        cx,
        parameter,
        format!(
            "Weight input_size_per_partition={local} for layer '{layer}' is not divisible by group_size={g}. This happens when tensor_parallel_size splits the layer input into shards that are not a whole number of quant groups (input size {k} over tp {})",
            cx.tp
        ),
        &format!(
            "use a --tp that splits {k} columns into whole groups of {g} (tp {})",
            fits.join(", ")
        ),
    );
    false
}

fn problem(cx: &mut Cx<'_>, parameter: &str, message: String, fix: &str) {
    cx.problems.push(Problem {
        message,
        fix: Some(fix.into()),
        parameter: Some(parameter.to_string()),
        ..Default::default()
    });
}

/// A fused expert weight of a pack-quantized MoE: `w13_weight_packed`
/// `[E_l, 2·I_r, H/pf]`, `w2_weight_packed` `[E_l, H, I_r/pf]`; after `w2`, the scales
/// (model dtype), the zero points when asymmetric, and `w2_weight_shape`,
/// `w13_weight_shape` `[E_l, 2]` in the model dtype (vLLM's registration order).
pub(super) fn experts(
    w: &Wna16,
    p: Weight<'_>,
    cx: &mut Cx<'_>,
    module: &str,
    quantized: bool,
) -> Option<Vec<Extra>> {
    let Geometry::Experts(Experts {
        part,
        experts,
        intermediate: i,
        hidden: h,
    }) = *p.geometry
    else {
        return None;
    };
    if !quantized {
        return None;
    }
    let pf = w.pack_factor();
    let (tp, ep) = (cx.tp, cx.ep);
    let i_r = if ep { i } else { i / tp.max(1) };
    // A refusal is reported once (problems are kept once each); a channel-strategy layer
    // has no parameters wload could make, a misfit one still gets them so that the
    // checkpoint's tensors find theirs.
    if !experts_fit(cx, module, (i, h, i_r), w) && w.group.is_none() {
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
    *p.dtype = Dtype::I32;
    *p.name = format!("{}_packed", p.name);
    *p.geometry = match part {
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
    let model = cx.model_dtype;
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
        let n = format!("{}_weight_shape", part_name(part));
        out.push(Extra::required(name(&n), shape, model, 0.0));
    }
    Some(out)
}

/// vLLM's MoE checks (compressed_tensors_moe_wna16.py:236–283): whole groups in H and in a
/// rank's intermediate part, whole packed zero-point words. `false` with the problem.
fn experts_fit(cx: &mut Cx<'_>, module: &str, (i, h, i_r): (u64, u64, u64), w: &Wna16) -> bool {
    let pf = w.pack_factor();
    let tp = cx.tp;
    let fix_tp = "use a compatible TP size or enable expert parallelism (--enable-expert-parallel)";
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
            cx.problems.push(Problem {
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
