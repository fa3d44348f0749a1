//! What a method plans with: the run's layout and model dtype, where its refusals go, and the
//! weight it is given. All a method reads of the planner, so that a method lives in `quant/`
//! and the planner only drives it.

use crate::dtype::Dtype;
use crate::layout::Geometry;
use crate::problem::Problems;
use crate::quant::moe_backend::MoeBackend;

/// The context of one planned parameter.
pub struct Cx<'a> {
    /// `--tp`.
    pub tp: u64,
    /// `--enable-expert-parallel`.
    pub ep: bool,
    /// `--moe-backend`.
    pub moe_backend: Option<MoeBackend>,
    /// The dtype vLLM builds the model in.
    pub model_dtype: Dtype,
    /// Every refusal found; a method adds its own.
    pub problems: &'a mut Problems,
    /// The query and kv head counts of the qkv layer beside the Attention layer named (a
    /// per-head kv-cache scale is cut by them); `None` when it has none.
    pub qkv_heads: &'a dyn Fn(&str) -> Option<(u64, u64)>,
}

/// The weight a method is given, which it may rename, retype and lay out anew (GPTQ's
/// `weight` becomes `qweight`, I32, input-major).
pub struct Weight<'p> {
    pub name: &'p mut String,
    pub geometry: &'p mut Geometry,
    pub dtype: &'p mut Dtype,
}
