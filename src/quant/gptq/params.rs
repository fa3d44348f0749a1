//! GPTQ and AWQ parameters: the packed int32 weights, zero points and group scales that
//! `AutoGPTQLinearMethod`, `AutoAWQMarlinLinearMethod` (and the AWQ Triton fallback, same
//! parameters), `AutoGPTQMoEMethod` and `AutoAWQMoEMethod` create (vLLM 0.33
//! `layers/quantization/auto_gptq.py:322–600`, `auto_awq.py:418–644`), in their order. The
//! layer's `weight` parameter becomes the packed `qweight` (name, dtype and geometry change); the
//! others follow it. Both store the input dim first, so the output parts are on dim 1
//! ([`LinearShape::cols_last`]) and the experts' intermediate is on `w13`'s last dim
//! ([`Geometry::PackedExperts`]).

use crate::dtype::Dtype;
use crate::layout::{Experts, Geometry, PackedExperts};
use crate::mapping::ExpertPart;
use crate::problem::Problem;
use crate::quant::cx::{Cx, Weight};
use crate::quant::extra::Extra;
use crate::quant::linear::LinearShape;

/// What the two methods share: bits (8 / bits values per int32), the group size (`None`:
/// channelwise, GPTQ only), and which of them it is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IntScheme {
    pub(crate) gptq: bool,
    pub(crate) bits: u64,
    pub(crate) group: Option<u64>,
}

impl IntScheme {
    fn pack(self) -> u64 {
        32 / self.bits
    }

    fn method(self) -> &'static str {
        if self.gptq { "GPTQ" } else { "AWQ" }
    }
}

fn extra(name: String, geometry: Geometry, dtype: Dtype) -> Extra {
    Extra::required(name, geometry, dtype, 0.0)
}

/// A quantized linear layer's `weight` `p` becomes `qweight`; its zero points and scales
/// follow (GPTQ: `qweight`, `scales`, `qzeros`; AWQ: `qweight`, `qzeros`, `scales`).
pub(crate) fn linear(s: IntScheme, p: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
    let module = p.name.strip_suffix(".weight")?.to_string();
    let Some(l) = LinearShape::of(p.geometry) else {
        problem(
            cx,
            s,
            &module,
            "its weight is not a 2-D linear weight".into(),
            None,
        );
        return None;
    };
    let pack = s.pack();
    let tp = cx.tp;
    let k_r = l.k_local(tp);
    let g = s.group.unwrap_or(l.k);
    if !l.k.is_multiple_of(g) || !k_r.is_multiple_of(pack) {
        let msg = format!(
            "its input size per rank ({k_r} of {}) must be a multiple of {pack} (int32 words of {}-bit values) and of the group size {g}",
            l.k, s.bits
        );
        problem(
            cx,
            s,
            &module,
            msg,
            Some("choose a --tp that divides the layer evenly"),
        );
    }
    if g < l.k && !k_r.is_multiple_of(g) {
        let msg = format!(
            "in_features per partition {k_r} is not divisible by group_size = {g}. (vLLM's choose_mp_linear_kernel finds no kernel: the classic \"input_size_per_partition is not divisible by group_size\")"
        );
        let fix = "choose a --tp for which the layer's input size divided by tp is a multiple of the group size";
        problem(cx, s, &module, msg, Some(fix));
    }
    if !l.out_divisible_by(pack) {
        let msg = format!(
            "its output parts ({} in all) are not multiples of {pack}: {} packs them {pack} to an int32",
            l.n(),
            if s.gptq {
                "qzeros"
            } else {
                "qweight and qzeros"
            }
        );
        problem(cx, s, &module, msg, None);
    }
    // Laid out even when refused above, so that the checkpoint's tensors still find their
    // parameters and the refusal is the one problem reported.
    // `marlin_repeat_scales_on_all_ranks`: channelwise scales of a row-parallel layer whole.
    let groups = l.k / g;
    let grouped = |out_div| match s.group {
        None => l.cols_last_whole_on_row(groups, out_div),
        Some(_) => l.cols_last(groups, out_div),
    };
    let model = cx.model_dtype;
    let scales = extra(format!("{module}.scales"), grouped(1), model);
    let qzeros = extra(format!("{module}.qzeros"), grouped(pack), Dtype::I32);
    *p.name = format!("{module}.qweight");
    *p.dtype = Dtype::I32;
    if s.gptq {
        *p.geometry = l.cols_last(l.k / pack, 1);
        Some(vec![scales, qzeros])
    } else {
        *p.geometry = l.cols_last(l.k, pack);
        Some(vec![qzeros, scales])
    }
}

/// A fused expert weight: `w13_weight` becomes `w13_qweight`; after `w2_weight` (become
/// `w2_qweight`) come both parts' scales, zero points and, for GPTQ, the zero biases it
/// always creates. Refused where vLLM would switch to `MoeWNA16` (other parameters).
pub(crate) fn experts(s: IntScheme, p: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
    let (module, _) = p.name.split_once(".routed_experts.")?;
    let module = module.to_string();
    let Geometry::Experts(Experts {
        part,
        experts,
        intermediate: i,
        hidden: h,
    }) = *p.geometry
    else {
        return None;
    };
    if part == ExpertPart::W13 {
        // A problem when false; laid out all the same (see `int_linear`).
        marlin_moe_supported(cx, s, &module, i, h);
    }
    let pack = s.pack();
    let packed = |part, dims: Vec<u64>, split| {
        Geometry::PackedExperts(PackedExperts {
            part,
            experts,
            dims,
            split,
        })
    };
    let base = p.name.strip_suffix(part_weight(part))?.to_string();
    *p.dtype = Dtype::I32;
    let (w13, w2) = if s.gptq {
        ([h / pack, i], [i / pack, h])
    } else {
        ([h, i / pack], [i, h / pack])
    };
    let (name, dims) = match part {
        ExpertPart::W13 => ("w13_qweight", w13),
        ExpertPart::W2 => ("w2_qweight", w2),
    };
    *p.name = format!("{base}{name}");
    *p.geometry = packed(part, dims.to_vec(), true);
    if part == ExpertPart::W13 {
        return None;
    }
    let model = cx.model_dtype;
    let at = |n: &str| format!("{base}{n}");
    // Channelwise: one group; w2's scales and zero points are copied whole.
    let (g13, g2, split2) = match s.group {
        Some(g) => (h / g, i / g, true),
        None => (1, 1, false),
    };
    let mut out = vec![
        extra(
            at("w13_scales"),
            packed(ExpertPart::W13, vec![g13, i], true),
            model,
        ),
        extra(
            at("w2_scales"),
            packed(ExpertPart::W2, vec![g2, h], split2),
            model,
        ),
        extra(
            at("w13_qzeros"),
            packed(ExpertPart::W13, vec![g13, i / pack], true),
            Dtype::I32,
        ),
        extra(
            at("w2_qzeros"),
            packed(ExpertPart::W2, vec![g2, h / pack], split2),
            Dtype::I32,
        ),
    ];
    if s.gptq {
        // `torch.zeros`, and a checkpoint may ship them.
        let bias = |name: &str, part, dims, split| Extra {
            optional: true,
            ..extra(at(name), packed(part, dims, split), model)
        };
        out.push(bias("w13_bias", ExpertPart::W13, vec![i], true));
        out.push(bias("w2_bias", ExpertPart::W2, vec![h], false));
    }
    Some(out)
}

/// `check_moe_marlin_supports_layer(allow_tile_padding=True)`: hidden size a multiple of
/// 128, a rank's intermediate size a multiple of the group, group -1, 32, 64 or 128; a
/// problem when not.
fn marlin_moe_supported(cx: &mut Cx<'_>, s: IntScheme, module: &str, i: u64, h: u64) {
    let tp = if cx.ep { 1 } else { cx.tp };
    let i_r = i / tp;
    let g = s.group;
    let shape = h.is_multiple_of(128) && g.is_none_or(|g| i_r.is_multiple_of(g));
    let sizes = matches!(g, None | Some(32 | 64 | 128));
    if shape && sizes {
        return;
    }
    let kernel = if s.gptq {
        "GPTQMoeMarlin"
    } else {
        "AutoAWQMoEMarlin"
    };
    let gs = g.map_or("-1".into(), |g| g.to_string());
    cx.problems.push(Problem {
        message: format!(
            "Layer '{module}' is not supported by {kernel}. Falling back to Moe WNA16 kernels. (check_moe_marlin_supports_layer: hidden size {h} must be a multiple of 128 and the intermediate size per rank {i_r} a multiple of the group size {gs}, which must be -1, 32, 64 or 128.) MoeWNA16 creates other parameters, which wload does not write"
        ),
        fix: Some(format!(
            "choose a --tp for which {i} / tp is a multiple of {gs}, or pass --enable-expert-parallel (whole experts)"
        )),
        parameter: Some(format!("{module}.routed_experts")),
        ..Default::default()
    });
}

fn problem(cx: &mut Cx<'_>, s: IntScheme, module: &str, why: String, fix: Option<&str>) {
    cx.problems.push(Problem {
        message: format!(
            "{module}: {} linear layer at tp {}: {why}",
            s.method(),
            cx.tp
        ),
        fix: fix.map(str::to_string),
        parameter: Some(format!("{module}.qweight")),
        ..Default::default()
    });
}

fn part_weight(part: ExpertPart) -> &'static str {
    match part {
        ExpertPart::W13 => "w13_weight",
        ExpertPart::W2 => "w2_weight",
    }
}
