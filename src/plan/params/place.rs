//! Where a parameter spec is instantiated (once, at a layer, or as one instance of a repeated
//! head or tail module), and the `whole:` override (vLLM's `disable_tp=True`).

use super::at_layer;
use crate::mapping::ParamSpec;
use crate::mapping::expr::Scope;
use crate::problem::Problem;

/// Where a spec is instantiated: once (head, tail), at layer `i`, or as instance `j` of a
/// repeated head or tail module.
#[derive(Debug, Clone, Copy)]
pub(super) enum At {
    Once,
    Layer(u64),
    Repeat(u64),
}

impl At {
    pub(super) fn layer(self) -> Option<u64> {
        match self {
            At::Layer(i) => Some(i),
            _ => None,
        }
    }

    /// `name` with `{i}` (a layer) or `{j}` (a repeated module) filled in.
    pub(super) fn name(self, name: &str) -> String {
        match self {
            At::Repeat(j) => name.replace("{j}", &j.to_string()),
            _ => at_layer(name, self.layer()),
        }
    }
}

/// Whether `spec` (instantiated as `name`) is whole on every rank (`whole:`), or the problem
/// that it cannot be evaluated.
pub(super) fn whole(
    spec: &ParamSpec,
    name: &str,
    scope: &dyn Scope,
    env: &crate::model::env::Env,
) -> Result<bool, Box<Problem>> {
    let Some(w) = &spec.whole else {
        return Ok(false);
    };
    w.eval_bool(scope).map_err(|err| {
        Box::new(Problem {
            message: format!("{name}: cannot evaluate `whole: {w}`: {err}"),
            fix: err.missing_variable().map(|_| env.fix_for(&err, "")),
            parameter: Some(name.to_string()),
            ..Default::default()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Column, Geometry, MergedColumn, Qkv, Replicated, Row};

    /// `whole:` (`Geometry::whole`) turns each split layout into the whole tensor on every rank, a fused qkv keeping
    /// its stored `[q; k; v]` rows; `{j}` names the instance of a repeated module.
    #[test]
    fn whole_layouts_hold_the_whole_tensor_and_repeats_are_named_by_instance() {
        let qkv = Geometry::Qkv(Qkv {
            heads: 4,
            kv_heads: 4,
            head_dim: 16,
            inner: vec![64],
        });
        // MergedColumn with disable_tp: every shard whole on every rank (its own geometry tests
        // in layout/ cover the ranks).
        assert_eq!(
            qkv.whole(),
            Geometry::MergedColumn(MergedColumn {
                sizes: vec![64, 64, 64],
                inner: vec![64],
                disable_tp: true,
            })
        );
        for g in [
            Geometry::Column(Column { shape: vec![8, 4] }),
            Geometry::Row(Row { shape: vec![8, 4] }),
        ] {
            assert_eq!(
                g.whole(),
                Geometry::Replicated(Replicated { shape: vec![8, 4] })
            );
        }
        assert_eq!(
            At::Repeat(3).name("visual.blocks.{j}.x"),
            "visual.blocks.3.x"
        );
        assert_eq!(At::Layer(2).name("m.layers.{i}.x"), "m.layers.2.x");
        assert_eq!(At::Once.name("m.norm"), "m.norm");
    }
}
