//! NVFP4's parameters, as vLLM 0.33 creates them before post-processing, in its two spellings:
//! ModelOpt's (`ModelOptLinearMethod` with `KNvfp4Static` / `KNvfp4Dynamic`,
//! `layers/quantization/modelopt.py:2018–2134, 2532–2557`; `ModelOptNvFp4FusedMoE.create_weights`,
//! l.912–1037) and compressed-tensors' `nvfp4-pack-quantized` (`CompressedTensorsW4A4Fp4`,
//! `schemes/compressed_tensors_w4a4_nvfp4.py:38–93`; `CompressedTensorsW4A4Nvfp4MoEMethod`,
//! `compressed_tensors_moe_w4a4_nvfp4.py:74–185`). Both make a linear layer's packed weight, block
//! scales and per-part global scales, and the fused experts' likewise, in the same order: only
//! the names, W4A16's input scale and the experts' input scales under EP differ ([`Nvfp4Names`]).

use super::cx::{Cx, Weight};
use super::extra::{Extra, part_name};
use super::linear::LinearShape;
use super::moe_backend::{MoeBackend, names};
use crate::dtype::Dtype;
use crate::layout::{ExpertTensorScale, Experts, Geometry, TensorScale};
use crate::mapping::ExpertPart;
use crate::problem::Problem;

/// FP4 values per byte.
const PER_BYTE: u64 = 2;

/// The input width a rank's NVFP4 weight must be a multiple of (`KNvfp4Static.create_weights`).
const K_MULTIPLE: u64 = 16;

/// What one NVFP4 spelling calls its parameters, and where the two differ.
pub(crate) struct Nvfp4Names {
    /// For messages: `ModelOpt NVFP4`.
    pub(crate) method: &'static str,
    /// Appended to the weight's name (`weight` → `weight_packed`, `w13_weight` → `w13_weight_packed`).
    pub(crate) packed_suffix: &'static str,
    /// The F32 global weight scale per part.
    pub(crate) global: &'static str,
    /// The F32 input scale per part.
    pub(crate) input: &'static str,
    /// A W4A16 linear still registers a NaN input scale (ModelOpt's `_DropInputScale`).
    pub(crate) a16_input: bool,
    /// Under EP the experts' input scales are allocated for all experts on FlashInfer backends
    /// (ModelOpt's `use_global_sf` sizing, so `--moe-backend` decides); compressed-tensors
    /// sizes them for the rank's own on every backend.
    pub(crate) backend_input_scales: bool,
    /// vLLM's words when a rank's input is not a multiple of 16.
    pub(crate) k16_refusal: &'static str,
    /// Where a quantized layer vLLM cannot lay out can be left unquantized.
    pub(crate) exclude_fix: &'static str,
}

/// One NVFP4 config as the planner needs it: its names, W4A4 or W4A16, and the group size.
#[derive(Clone, Copy)]
pub(crate) struct Nvfp4Method {
    names: &'static Nvfp4Names,
    activations: bool,
    group: u64,
}

impl Nvfp4Method {
    pub(super) fn new(names: &'static Nvfp4Names, activations: bool, group: u64) -> Self {
        Nvfp4Method {
            names,
            activations,
            group,
        }
    }
}

/// An NVFP4 linear weight: U8 `[N_r, K_r/2]`, then the global scale F32 `[parts]`,
/// `weight_scale` F8_E4M3 `[N_r, K_r/g]` (NaN until loaded) and the input scale F32 `[parts]`.
pub(crate) fn linear(m: Nvfp4Method, p: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
    let module = p.name.strip_suffix(".weight")?.to_string();
    let module = module.as_str();
    let Some(shape) = LinearShape::of(p.geometry) else {
        cx.problems.push(Problem {
            message: format!(
                "{module}: {} quantizes this layer, but wload has no 2-D linear layout for its weight ({:?})",
                m.names.method, p.geometry
            ),
            fix: Some(m.names.exclude_fix.into()),
            parameter: Some(p.name.to_string()),
            ..Default::default()
        });
        return None;
    };
    let k_local = shape.k_local(cx.tp);
    for (multiple, why) in [
        (K_MULTIPLE, m.names.k16_refusal),
        (
            m.group,
            "the input size per partition is not a multiple of the NVFP4 group size",
        ),
    ] {
        if !k_local.is_multiple_of(multiple) {
            cx.problems.push(Problem {
                message: format!(
                    "{module}: {why} (input size {} per rank at tp {}: {k_local}, not a multiple of {multiple})",
                    shape.k, cx.tp
                ),
                fix: Some("use a TP size that leaves each rank a multiple of 16 input features".into()),
                parameter: Some(p.name.to_string()),
                ..Default::default()
            });
            return None;
        }
    }
    let of = Box::new(p.geometry.clone());
    p.name.push_str(m.names.packed_suffix);
    *p.dtype = Dtype::U8;
    *p.geometry = shape.rows_first(1, shape.k / PER_BYTE);
    let per_part = |name: &str| {
        let g = Geometry::TensorScale(TensorScale { of: of.clone() });
        Extra::required(format!("{module}.{name}"), g, Dtype::F32, 0.0)
    };
    let mut out = vec![
        per_part(m.names.global),
        Extra::required(
            format!("{module}.weight_scale"),
            shape.rows_first(1, shape.k / m.group),
            Dtype::F8E4M3,
            f64::NAN,
        ),
    ];
    if m.activations {
        out.push(per_part(m.names.input));
    } else if m.names.a16_input {
        // `_DropInputScale`: W4A16 registers a NaN `input_scale` that older exports fill.
        out.push(Extra {
            fill: f64::NAN,
            optional: true,
            ..per_part(m.names.input)
        });
    }
    Some(out)
}

/// Whether vLLM takes `--moe-backend b` for NVFP4 experts (`map_nvfp4_backend`,
/// `fused_moe/oracle/nvfp4.py:163-186`), in its words when not (the planner asks before any parameter).
pub(crate) fn moe_backend(b: MoeBackend) -> Result<(), (String, String)> {
    if b.nvfp4_global_input_scales().is_some() {
        return Ok(());
    }
    let expected: Vec<String> = MoeBackend::nvfp4()
        .map(|b| format!("'{}'", b.as_str()))
        .collect();
    Err((
        format!(
            "--moe-backend {0}: moe_backend='{0}' is not supported for NvFP4 MoE. Expected one of [{1}].",
            b.as_str(),
            expected.join(", ")
        ),
        "name the NVFP4 MoE backend vllm serve will use (marlin on H100/H200, flashinfer_trtllm on Blackwell), or leave out --moe-backend".into(),
    ))
}

/// A fused NVFP4 expert weight: U8 with two FP4 values a byte; after `w2`'s, the experts'
/// block scales (F8_E4M3), global weight scales and input scales (F32), in vLLM's
/// registration order. ModelOpt's input scales under expert parallelism are shaped by the MoE
/// backend (`use_global_sf`, modelopt.py:1008–1026): every expert's on a FlashInfer backend,
/// the rank's own on the others; without `--moe-backend` that is refused.
pub(crate) fn experts(m: Nvfp4Method, p: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
    let Geometry::Experts(Experts {
        part,
        experts,
        intermediate,
        hidden,
    }) = *p.geometry
    else {
        return None;
    };
    let g = m.group;
    let packed = |over: u64| match part {
        // w13 `[E, 2I, H/over]`; w2 `[E, H, I/over]`: the input dim is the last.
        ExpertPart::W13 => Geometry::Experts(Experts {
            part,
            experts,
            intermediate,
            hidden: hidden / over,
        }),
        ExpertPart::W2 => Geometry::Experts(Experts {
            part,
            experts,
            intermediate: intermediate / over,
            hidden,
        }),
    };
    let local_in = match part {
        ExpertPart::W13 => hidden,
        ExpertPart::W2 if cx.ep => intermediate,
        ExpertPart::W2 => intermediate / cx.tp.max(1),
    };
    if !local_in.is_multiple_of(g) {
        cx.problems.push(Problem {
            message: format!(
                "{}: NVFP4 experts need each rank's input size to be a multiple of the group size {g}; it is {local_in} at tp {}",
                p.name, cx.tp
            ),
            fix: Some("use a TP size that divides the experts' intermediate size into multiples of the group size, or enable expert parallelism".into()),
            parameter: Some(p.name.to_string()),
            ..Default::default()
        });
        return None;
    }
    let base = p
        .name
        .strip_suffix("w13_weight")
        .or(p.name.strip_suffix("w2_weight"))?;
    let base = base.to_string();
    p.name.push_str(m.names.packed_suffix);
    *p.dtype = Dtype::U8;
    *p.geometry = packed(PER_BYTE);
    let global_inputs = match (cx.ep && m.names.backend_input_scales, cx.moe_backend) {
        (false, _) => false,
        // A backend vLLM refuses for NVFP4 is refused already (`moe_backend` below).
        (true, Some(b)) => b.nvfp4_global_input_scales().unwrap_or(false),
        (true, None) => {
            if part == ExpertPart::W13 {
                cx.problems.push(backend_needed(p.name, experts));
            }
            // Planned on as the rank's own, so that the refusal is the one problem reported.
            false
        }
    };
    let scale_geometry = packed(g);
    if part == ExpertPart::W13 {
        // vLLM registers both weights first, then every scale; w13's block scale is
        // produced after w2_weight below, so remember its geometry there.
        return None;
    }
    // The destructured sizes are w2's unpacked ones, which are w13's too.
    Some(expert_scales(
        m,
        &base,
        [experts, intermediate, hidden],
        (scale_geometry, global_inputs),
    ))
}

/// The refusal of ModelOpt NVFP4 experts under EP without `--moe-backend`, naming the flag and
/// the backends on either side.
fn backend_needed(weight: &str, experts: u64) -> Problem {
    let side = |global: bool| {
        names(MoeBackend::nvfp4().filter(|b| b.nvfp4_global_input_scales() == Some(global)))
    };
    Problem {
        message: format!(
            "{weight}: NVFP4 experts under expert parallelism have input scales whose shape depends on vLLM's MoE backend: it allocates them for all {experts} experts on the FlashInfer backends (Blackwell's default) and for the rank's own experts on the others (MARLIN is H100/H200's default)"
        ),
        fix: Some(format!(
            "pass --moe-backend with the backend vllm serve will use: every expert's input scales for {}; the rank's own for {} (marlin on H100/H200); or shard without --enable-expert-parallel, whose files are the same for every backend",
            side(true),
            side(false)
        )),
        parameter: Some(weight.to_string()),
        ..Default::default()
    }
}

/// The experts' scales after `w2`'s weight: both block scales (w2's geometry given), then the
/// global scales and the input scales of w13 and w2 (every expert's on every rank when
/// `global_inputs`).
fn expert_scales(
    m: Nvfp4Method,
    base: &str,
    [experts, intermediate, hidden]: [u64; 3],
    (w2_scale, global_inputs): (Geometry, bool),
) -> Vec<Extra> {
    let w13_scale = Geometry::Experts(Experts {
        part: ExpertPart::W13,
        experts,
        intermediate,
        hidden: hidden / m.group,
    });
    let named = |part: ExpertPart, suffix: &str| format!("{base}{}_{suffix}", part_name(part));
    let per_expert = |part: ExpertPart, global: bool| {
        Geometry::ExpertTensorScale(ExpertTensorScale {
            part,
            experts,
            input: false,
            global,
        })
    };
    let block = |part: ExpertPart, geometry: Geometry| {
        Extra::required(
            named(part, "weight_scale"),
            geometry,
            Dtype::F8E4M3,
            f64::NAN,
        )
    };
    let mut out = vec![
        block(ExpertPart::W13, w13_scale),
        block(ExpertPart::W2, w2_scale),
    ];
    for suffix in [m.names.global, m.names.input] {
        for part in [ExpertPart::W13, ExpertPart::W2] {
            // W4A16 experts register input scales too; no checkpoint fills them.
            let input = suffix == m.names.input;
            let optional = input && !m.activations;
            let geometry = per_expert(part, input && global_inputs);
            out.push(Extra {
                optional,
                fill: if optional { f64::NAN } else { 0.0 },
                ..Extra::required(named(part, suffix), geometry, Dtype::F32, 0.0)
            });
        }
    }
    out
}
