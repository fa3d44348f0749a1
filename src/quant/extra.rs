//! The parameters a method adds beside a weight, and the shapes several methods share.

use crate::dtype::Dtype;
use crate::layout::{Column, Geometry, MambaSplit, MergedColumn, Qkv, Replicated, Row};
use crate::mapping::ExpertPart;

/// A parameter a quantization method adds: name, geometry, dtype, initial value, and whether
/// the checkpoint may leave it out.
pub struct Extra {
    pub name: String,
    pub geometry: Geometry,
    pub dtype: Dtype,
    pub fill: f64,
    pub optional: bool,
    /// Never read from the checkpoint (vLLM's loader ignores it): always `fill`.
    pub buffer: bool,
}

impl Extra {
    /// A parameter the checkpoint must fill.
    pub(crate) fn required(name: String, geometry: Geometry, dtype: Dtype, fill: f64) -> Extra {
        Extra {
            name,
            geometry,
            dtype,
            fill,
            optional: false,
            buffer: false,
        }
    }
}

/// `w13` or `w2`, as parameter names start.
pub(crate) fn part_name(part: ExpertPart) -> &'static str {
    match part {
        ExpertPart::W13 => "w13",
        ExpertPart::W2 => "w2",
    }
}

/// The experts module of a fused expert weight (`model.layers.1.mlp.experts` of
/// `model.layers.1.mlp.experts.routed_experts.w13_weight`).
pub(crate) fn experts_module(weight: &str) -> Option<&str> {
    weight.split_once(".routed_experts.").map(|(m, _)| m)
}

/// Per-channel scales (`ChannelQuantScaleParameter`, `[out, 1]`): sliced like the weight's rows;
/// a row-parallel layer keeps them whole.
pub(crate) fn per_channel(weight: &Geometry) -> Option<Geometry> {
    Some(match weight {
        Geometry::Qkv(Qkv {
            heads,
            kv_heads,
            head_dim,
            ..
        }) => Geometry::Qkv(Qkv {
            heads: *heads,
            kv_heads: *kv_heads,
            head_dim: *head_dim,
            inner: vec![1],
        }),
        Geometry::MergedColumn(MergedColumn {
            sizes, disable_tp, ..
        }) => Geometry::MergedColumn(MergedColumn {
            sizes: sizes.clone(),
            inner: vec![1],
            disable_tp: *disable_tp,
        }),
        Geometry::Column(Column { shape }) => Geometry::Column(Column {
            shape: vec![*shape.first()?, 1],
        }),
        // Mamba2's in_proj: vLLM installs the mamba-v2 loader on `weight_scale` too
        // (mamba_mixer2.py:444–467), so its rows follow the weight's parts.
        Geometry::MambaSplit(m) => Geometry::MambaSplit(MambaSplit {
            inner: vec![1],
            ..m.clone()
        }),
        Geometry::Row(Row { shape }) | Geometry::Replicated(Replicated { shape }) => {
            Geometry::Replicated(Replicated {
                shape: vec![*shape.first()?, 1],
            })
        }
        _ => return None,
    })
}

impl Extra {
    /// A kv-cache scale or zero point of the Attention layer `attention`: whole on every rank,
    /// and the checkpoint may leave it out.
    pub(crate) fn kv_scalar(
        attention: &str,
        name: &str,
        shape: Vec<u64>,
        dtype: Dtype,
        fill: f64,
    ) -> Extra {
        Extra {
            name: format!("{attention}.{name}"),
            geometry: Geometry::Replicated(Replicated { shape }),
            dtype,
            fill,
            optional: true,
            buffer: false,
        }
    }
}
