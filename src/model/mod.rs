//! What a family's mapping makes of one config, before and apart from planning: the config with
//! its quantization method parsed once ([`Model`]), the name rules in effect for this model
//! (`rules_for`), the variables its expressions see (`env.rs`), and its structure as `inspect`
//! and `sizes` describe it (`structure.rs`). Both `map` and `plan` read these, so they live below
//! both. DeepSeek-V4 is recognised here and refused with what it is (`deepseek_v4.rs`: its state
//! is platform-specific, and wload has no verified reference for it).

pub(crate) mod deepseek_v4;
pub(crate) mod env;
pub(crate) mod structure;

use crate::config::ModelConfig;
use crate::mapping::Mapping;
use crate::quant::{QuantError, Quantization};
use env::{Env, Parallel};

/// One model's config and its `quantization_config` read once, for every command and stage
/// (name rules, planning at each layout `sizes` checks, `inspect`).
pub struct Model<'c> {
    pub config: &'c ModelConfig,
    /// The quantization method; `None` unquantized; `Err` a scheme wload refuses (the planner
    /// reports it, `inspect` describes it).
    pub quant: Result<Option<Quantization>, QuantError>,
}

impl<'c> Model<'c> {
    /// `config` with its quantization method parsed (for a model of its `model_type`).
    pub fn new(config: &'c ModelConfig) -> Model<'c> {
        let quant = Quantization::for_model(
            config.quantization_config.as_ref(),
            config.model_type.as_deref(),
        );
        Model { config, quant }
    }

    /// The method, if the checkpoint has one wload writes.
    pub(crate) fn quantization(&self) -> Option<&Quantization> {
        self.quant.as_ref().ok().and_then(Option::as_ref)
    }
}

/// `mapping`'s name rules for `model`: the stacked rules whose `when` holds for its config (with
/// `parallel`'s `tp`, `pp`, `ep`), and the rules its quantization adds (kv-cache scale renames).
/// What `map::map` must apply before the planner. A condition that cannot be evaluated keeps its
/// rule and a scheme that does not parse adds none: the planner then reports why.
pub(crate) fn rules_for(mapping: &Mapping, model: &Model, parallel: Parallel) -> Mapping {
    let config = model.config;
    let mut m = match model.quantization() {
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
