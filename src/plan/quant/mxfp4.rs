//! gpt-oss MXFP4 (`GptOssMxfp4MoEMethod.create_weights`, `quantization/mxfp4.py:200–292`): a
//! routed experts layer becomes six zero-initialised parameters in this order: `w13_weight` U8
//! `[E, 2·I_p, H/2]`, `w13_weight_scale` U8 `[E, 2·I_p, H/32]`, `w2_weight` U8
//! `[E, H, I_p/2]`, `w2_weight_scale` U8 `[E, H, I_p/32]`, then the biases in BF16 whatever the
//! model dtype. The mapping's four bf16 expert parameters stand for the layer: its first brings
//! all six, and the planner leaves out the mapping's others (`params.rs`).
//!
//! `I_p`, `H_p`: the real slice (no `--moe-backend`), or the padding of the backend named.

use super::Extra;
use crate::dtype::Dtype;
use crate::layout::mxfp4::{Mxfp4Dims, Mxfp4Part};
use crate::layout::{Geometry, GptOssExperts, Mxfp4Experts};
use crate::mapping::GptOssPart;
use crate::plan::Planner;
use crate::plan::params::Param;

impl<'m> Planner<'m> {
    /// `p`, the layer's `w13_weight`, made MXFP4; the layer's other five parameters after it.
    /// `None` for the mapping's other expert parameters, which the first brought already.
    pub(super) fn mxfp4_experts(&mut self, p: &mut Param<'m>) -> Option<Vec<Extra>> {
        let Geometry::GptOssExperts(GptOssExperts {
            part: GptOssPart::W13Weight,
            experts,
            intermediate,
            hidden,
        }) = p.geometry
        else {
            return None;
        };
        let base = p.name.strip_suffix("w13_weight")?.to_string();
        let dims = Mxfp4Dims {
            experts,
            intermediate,
            hidden,
            align: self.opts.moe_backend.map_or([1, 1], |b| b.alignment()),
        };
        let geometry = |part| Geometry::Mxfp4Experts(Mxfp4Experts { part, dims });
        p.geometry = geometry(Mxfp4Part::W13Weight);
        p.dtype = Dtype::U8;
        let extras = Mxfp4Part::ALL[1..].iter().map(|&part| {
            let dtype = match part {
                Mxfp4Part::W13Bias | Mxfp4Part::W2Bias => Dtype::Bf16,
                _ => Dtype::U8,
            };
            Extra::required(
                format!("{base}{}", part.param()),
                geometry(part),
                dtype,
                0.0,
            )
        });
        Some(extras.collect())
    }
}
