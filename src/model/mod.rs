//! What a family's mapping makes of one config, before and apart from planning: the name rules in
//! effect for this model (`rules_for`), the variables its expressions see (`env.rs`), and its
//! structure as `inspect` and `sizes` describe it (`structure.rs`). Both `map` and `plan` read
//! these, so they live below both.

pub mod env;
pub mod structure;

use crate::config::ModelConfig;
use crate::mapping::Mapping;
use crate::quant::Quantization;
use env::{Env, Parallel};

/// `mapping`'s name rules for this model: the stacked rules whose `when` holds for `config` (with
/// `parallel`'s `tp`, `pp`, `ep`), and the rules its quantization adds (kv-cache scale renames).
/// What `map::map` must apply before the planner. A condition that cannot be evaluated keeps its
/// rule and a scheme that does not parse adds none: the planner then reports why.
pub fn rules_for(mapping: &Mapping, config: &ModelConfig, parallel: Parallel) -> Mapping {
    let quant = Quantization::for_model(
        config.quantization_config.as_ref(),
        config.model_type.as_deref(),
    )
    .ok()
    .flatten();
    let mut m = match &quant {
        Some(q) => q.with_name_rules(mapping),
        None => mapping.clone(),
    };
    if m.rules.stacked.iter().any(|r| r.when.is_some()) {
        let (env, _) = Env::new(mapping, config, parallel, None);
        m.rules.retain_stacked(|r| {
            r.when
                .as_ref()
                .is_none_or(|w| w.eval_bool(&env.scope(None)).unwrap_or(true))
        });
    }
    m
}
