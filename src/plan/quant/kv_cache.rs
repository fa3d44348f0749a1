//! `kv_cache_scheme` with the `attn_head` strategy (`CompressedTensorsKVCacheMethod`,
//! compressed_tensors.py:1144–1226): `k_scale`, `v_scale`, `q_scale` F32 `[n_kv]` per rank —
//! the rank's kv heads, q reduced by amax over each query group first — and `[n_kv]` zero
//! points in the model dtype that the loader never fills from the checkpoint.

use super::super::Planner;
use super::super::params::Params;
use super::Extra;
use crate::dtype::Dtype;
use crate::layout::{Geometry, KvHeadScale, KvScale, Qkv, Replicated};
use crate::problem::Problem;

impl Planner<'_> {
    pub(super) fn kv_head_scales(
        &mut self,
        module: &str,
        params: &Params<'_>,
    ) -> Option<Vec<Extra>> {
        // The heads are the attention's qkv layer's: the sibling weight with that layout.
        let parent = module.rsplit_once('.').map_or("", |(m, _)| m);
        let heads = params.list.iter().rev().find_map(|p| match p.geometry {
            Geometry::Qkv(Qkv {
                heads, kv_heads, ..
            }) if p.name.starts_with(parent) && p.name[parent.len()..].starts_with('.') => {
                Some((heads, kv_heads))
            }
            _ => None,
        });
        let Some((heads, kv_heads)) = heads.filter(|(h, kv)| *kv > 0 && h.is_multiple_of(*kv))
        else {
            self.problems.push(Problem {
                message: format!(
                    "{module}: kv_cache_scheme strategy attn_head needs the layer's query and kv head counts (a QKVParallelLinear with whole query groups per kv head), and this attention has none"
                ),
                fix: Some("use a checkpoint with a per-tensor kv_cache_scheme".into()),
                parameter: Some(format!("{module}.k_scale")),
                ..Default::default()
            });
            return None;
        };
        let n = if self.opts.tp >= kv_heads {
            1
        } else {
            kv_heads / self.opts.tp
        };
        let scale = |s: &str, which| Extra {
            name: format!("{module}.{s}"),
            geometry: Geometry::KvHeadScale(KvHeadScale {
                heads,
                kv_heads,
                which,
            }),
            dtype: Dtype::F32,
            fill: 1.0,
            optional: true,
            buffer: false,
        };
        let zero = |s: &str| Extra {
            name: format!("{module}.{s}"),
            geometry: Geometry::Replicated(Replicated { shape: vec![n] }),
            dtype: self.model_dtype,
            fill: 0.0,
            optional: true,
            buffer: true,
        };
        Some(vec![
            scale("k_scale", KvScale::K),
            scale("v_scale", KvScale::V),
            scale("q_scale", KvScale::Q),
            zero("k_zero_point"),
            zero("v_zero_point"),
            zero("q_zero_point"),
        ])
    }
}
