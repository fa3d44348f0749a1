//! FP8 parameters, in vLLM 0.33's registration order with its initial values: a linear layer's
//! (`Fp8LinearMethod.create_weights`, `CompressedTensorsW8A8Fp8`), fused experts'
//! (`Fp8MoEMethod`) and the kv-cache scales of `Fp8KVCacheMethod` (ModelOpt's is the same
//! `BaseKVCacheMethod`).

use crate::dtype::{Dtype, F32_MIN};
use crate::layout::{
    BlockScale, ExpertBlockScale, ExpertTensorScale, Experts, Geometry, TensorScale,
};
use crate::mapping::ExpertPart;
use crate::quant::cx::Weight;
use crate::quant::extra::{Extra, part_name, per_channel};

/// How an FP8 linear weight is scaled.
pub(crate) enum Scales {
    /// `weight_scale` per part.
    Tensor,
    /// `weight_scale` `[N, 1]`.
    Channel,
    /// Block scales under the name given.
    Block(&'static str, [u64; 2]),
}

/// `w` becomes F8_E4M3; its weight scale follows, then with static activations the input
/// scale. `None` (no scales) for a per-channel weight that is not a linear layer's.
pub(crate) fn linear(w: Weight<'_>, scales: Scales, static_input: bool) -> Option<Vec<Extra>> {
    let module = w.name.strip_suffix(".weight")?;
    *w.dtype = Dtype::F8E4M3;
    let of = Box::new(w.geometry.clone());
    let per_tensor = |name: &str| {
        let g = Geometry::TensorScale(TensorScale { of: of.clone() });
        Extra::required(format!("{module}.{name}"), g, Dtype::F32, F32_MIN)
    };
    let weight_scale = match scales {
        Scales::Tensor => per_tensor("weight_scale"),
        Scales::Channel => Extra::required(
            format!("{module}.weight_scale"),
            per_channel(w.geometry)?,
            Dtype::F32,
            F32_MIN,
        ),
        Scales::Block(name, block) => {
            let g = Geometry::BlockScale(BlockScale {
                of: of.clone(),
                block,
            });
            Extra::required(format!("{module}.{name}"), g, Dtype::F32, F32_MIN)
        }
    };
    let mut out = vec![weight_scale];
    if static_input {
        out.push(per_tensor("input_scale"));
    }
    Some(out)
}

/// A fused FP8 expert weight: F8_E4M3; after `w2_weight`, both weights' scales (vLLM
/// registers `w13_weight`, `w2_weight`, then the scales).
pub(crate) fn experts(
    w: Weight<'_>,
    block: Option<[u64; 2]>,
    static_activations: bool,
) -> Option<Vec<Extra>> {
    let Geometry::Experts(Experts {
        part,
        experts,
        intermediate,
        hidden,
    }) = *w.geometry
    else {
        return None;
    };
    *w.dtype = Dtype::F8E4M3;
    if part == ExpertPart::W13 {
        return None;
    }
    let base = w.name.strip_suffix("w2_weight")?;
    let scale = |part: ExpertPart, name: &str, geometry: Geometry| {
        let name = format!("{base}{}_{name}", part_name(part));
        Extra::required(name, geometry, Dtype::F32, 1.0)
    };
    let parts = [ExpertPart::W13, ExpertPart::W2];
    let mut out: Vec<Extra> = match block {
        Some(block) => parts
            .map(|part| {
                let g = Geometry::ExpertBlockScale(ExpertBlockScale {
                    part,
                    experts,
                    dims: [intermediate, hidden],
                    block,
                });
                scale(part, "weight_scale_inv", g)
            })
            .into(),
        None => parts
            .map(|part| {
                let g = Geometry::ExpertTensorScale(ExpertTensorScale {
                    part,
                    experts,
                    input: false,
                    global: false,
                });
                scale(part, "weight_scale", g)
            })
            .into(),
    };
    if static_activations {
        out.extend(parts.map(|part| {
            let g = Geometry::ExpertTensorScale(ExpertTensorScale {
                part,
                experts,
                input: true,
                global: false,
            });
            scale(part, "input_scale", g)
        }));
    }
    Some(out)
}

/// `Fp8KVCacheMethod`: `KVCacheScaleParameter`s, 0-d in the model dtype, -1 ("not loaded").
/// ModelOptKVCacheMethod is the same `BaseKVCacheMethod`, whatever `kv_cache_quant_algo` says.
pub(crate) fn kv_scales(attention: &str, model: Dtype) -> Vec<Extra> {
    ["q_scale", "k_scale", "v_scale", "prob_scale"]
        .map(|n| Extra::kv_scalar(attention, n, vec![], model, -1.0))
        .into()
}
