//! ModelOpt NVFP4's parameters, as vLLM 0.33 creates them before post-processing: a linear
//! layer's packed weight, block scales and per-part global scales (`ModelOptLinearMethod` with
//! `KNvfp4Static` / `KNvfp4Dynamic`, `layers/quantization/modelopt.py:2018–2134, 2532–2557`), and
//! the fused experts' (`ModelOptNvFp4FusedMoE.create_weights`, l.912–1037).

use super::super::Planner;
use super::super::layout::Geometry;
use super::super::params::Param;
use super::linear::LinearShape;
use super::{Extra, part_name};
use crate::dtype::Dtype;
use crate::mapping::ExpertPart;
use crate::problem::Problem;
use crate::quant::modelopt::ModelOptNvFp4;

/// FP4 values per byte.
const PER_BYTE: u64 = 2;

/// The input width a rank's NVFP4 weight must be a multiple of (`KNvfp4Static.create_weights`).
const K_MULTIPLE: u64 = 16;

impl<'m> Planner<'m> {
    /// An NVFP4 linear weight: U8 `[N_r, K_r/2]`, then `weight_scale_2` F32 `[parts]`,
    /// `weight_scale` F8_E4M3 `[N_r, K_r/g]` (NaN until loaded) and `input_scale` F32 `[parts]`.
    pub(super) fn nvfp4_linear(
        &mut self,
        m: &ModelOptNvFp4,
        module: &str,
        p: &mut Param<'m>,
    ) -> Option<Vec<Extra>> {
        let Some(shape) = LinearShape::of(&p.geometry) else {
            self.problems.push(Problem {
                message: format!(
                    "{module}: ModelOpt NVFP4 quantizes this layer, but wload has no 2-D linear layout for its weight ({:?})",
                    p.geometry
                ),
                fix: Some("list the module in exclude_modules if the checkpoint stores it unquantized".into()),
                parameter: Some(p.name.clone()),
                ..Default::default()
            });
            return None;
        };
        let k_local = shape.k_local(self.opts.tp);
        for (multiple, why) in [
            (
                K_MULTIPLE,
                "Unsupported model when in features size is not multiple of 16",
            ),
            (
                m.group_size,
                "the input size per partition is not a multiple of the NVFP4 group size",
            ),
        ] {
            if !k_local.is_multiple_of(multiple) {
                self.problems.push(Problem {
                    message: format!(
                        "{module}: {why} (input size {} per rank at tp {}: {k_local}, not a multiple of {multiple})",
                        shape.k, self.opts.tp
                    ),
                    fix: Some("use a TP size that leaves each rank a multiple of 16 input features".into()),
                    parameter: Some(p.name.clone()),
                    ..Default::default()
                });
                return None;
            }
        }
        let of = Box::new(p.geometry.clone());
        p.dtype = Dtype::U8;
        p.geometry = shape.rows_first(1, shape.k / PER_BYTE);
        let per_part = |name: &str| {
            let g = Geometry::TensorScale { of: of.clone() };
            Extra::required(format!("{module}.{name}"), g, Dtype::F32, 0.0)
        };
        let mut out = vec![
            per_part("weight_scale_2"),
            Extra::required(
                format!("{module}.weight_scale"),
                shape.rows_first(1, shape.k / m.group_size),
                Dtype::F8E4M3,
                f64::NAN,
            ),
        ];
        out.push(if m.activations {
            per_part("input_scale")
        } else {
            // `_DropInputScale`: W4A16 registers a NaN `input_scale` that older exports fill.
            Extra {
                fill: f64::NAN,
                optional: true,
                ..per_part("input_scale")
            }
        });
        Some(out)
    }

    /// A fused NVFP4 expert weight: U8 with two FP4 values a byte; after `w2_weight`, the
    /// experts' block scales (F8_E4M3), global weight scales and input scales (F32), in vLLM's
    /// registration order. Tensor parallel only: under expert parallelism the input scales'
    /// shape depends on the backend (`use_global_sf`, modelopt.py:1008–1026).
    pub(super) fn nvfp4_experts(
        &mut self,
        m: &ModelOptNvFp4,
        p: &mut Param<'m>,
    ) -> Option<Vec<Extra>> {
        let Geometry::Experts {
            part,
            experts,
            intermediate,
            hidden,
        } = p.geometry
        else {
            return None;
        };
        let g = m.group_size;
        let packed = |over: u64| match part {
            // w13 `[E, 2I, H/over]`; w2 `[E, H, I/over]`: the input dim is the last.
            ExpertPart::W13 => Geometry::Experts {
                part,
                experts,
                intermediate,
                hidden: hidden / over,
            },
            ExpertPart::W2 => Geometry::Experts {
                part,
                experts,
                intermediate: intermediate / over,
                hidden,
            },
        };
        let local_in = match part {
            ExpertPart::W13 => hidden,
            ExpertPart::W2 => intermediate / self.opts.tp.max(1),
        };
        if !local_in.is_multiple_of(g) {
            self.problems.push(Problem {
                message: format!(
                    "{}: NVFP4 experts need each rank's input size to be a multiple of the group size {g}; it is {local_in} at tp {}",
                    p.name, self.opts.tp
                ),
                fix: Some("use a TP size that divides the experts' intermediate size into multiples of the group size, or enable expert parallelism".into()),
                parameter: Some(p.name.clone()),
                ..Default::default()
            });
            return None;
        }
        p.dtype = Dtype::U8;
        p.geometry = packed(PER_BYTE);
        if self.opts.expert_parallel {
            if part == ExpertPart::W13 {
                self.problems.push(Problem {
                    message: format!(
                        "{}: NVFP4 experts under expert parallelism have input scales whose shape depends on the GPU: vLLM allocates them for all {experts} experts on FlashInfer backends (Blackwell's default) and for the rank's own experts on MARLIN (H100/H200's), so no one file loads on both",
                        p.name
                    ),
                    fix: Some("shard without --enable-expert-parallel: with tensor parallelism every rank holds every expert and the files are the same for every backend".into()),
                    parameter: Some(p.name.clone()),
                    ..Default::default()
                });
            }
            return None;
        }
        let scale_geometry = packed(g);
        if part == ExpertPart::W13 {
            // vLLM registers both weights first, then every scale; w13's block scale is
            // produced after w2_weight below, so remember its geometry there.
            return None;
        }
        let base = p.name.strip_suffix("w2_weight")?.to_string();
        // The destructured sizes are w2's unpacked ones, which are w13's too.
        let w13_scale = Geometry::Experts {
            part: ExpertPart::W13,
            experts,
            intermediate,
            hidden: hidden / g,
        };
        let named = |part: ExpertPart, suffix: &str| format!("{base}{}_{suffix}", part_name(part));
        let per_expert = |part: ExpertPart| Geometry::ExpertTensorScale {
            part,
            experts,
            input: false,
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
            block(ExpertPart::W2, scale_geometry),
        ];
        for suffix in ["weight_scale_2", "input_scale"] {
            for part in [ExpertPart::W13, ExpertPart::W2] {
                let optional = suffix == "input_scale" && !m.activations;
                out.push(Extra {
                    optional,
                    fill: if optional { f64::NAN } else { 0.0 },
                    ..Extra::required(named(part, suffix), per_expert(part), Dtype::F32, 0.0)
                });
            }
        }
        Some(out)
    }
}
