//! How mapping files compose (docs/mapping-format.md, "Composing files"): a file may extend a
//! shipped family, `use` the named parameter blocks of common.yaml (or of the files it extends),
//! and edit the lists it inherits by name. Each file is read on its own, so that its errors carry
//! its line numbers; the chain is folded from the root down; and the result is resolved into the
//! [`Mapping`] the planner reads, which knows nothing of blocks or edits.

mod edit;
mod per_layer;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::Value;

use self::edit::{Entry, Placed};
use self::per_layer::PerLayer;
use super::rules::{ExpertRule, MistralRemap, RegexRule, Rename, Rules, Stacked};
use super::{
    COMMON, Check, EMBEDDED, Expr, Mapping, MappingError, MissingHint, ParamSpec, Parameters,
    SkipModule, StageNeed,
};

/// `extends` chains deeper than this are refused (the shipped ones are at most three files deep);
/// it also stops a file that extends itself.
const MAX_DEPTH: usize = 8;

/// One mapping file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    #[serde(default)]
    extends: Option<String>,
    family: String,
    // Checked here for their type; read by people and, for `architectures`, by the selection
    // index (`select` reads the file's line, build.rs embeds it), not by composition.
    #[serde(default)]
    #[allow(dead_code)]
    description: String,
    #[serde(default)]
    #[allow(dead_code)]
    architectures: Vec<String>,
    #[serde(default)]
    defaults: IndexMap<String, Value>,
    #[serde(default)]
    derive: IndexMap<String, Expr>,
    #[serde(default)]
    checks: Vec<CheckEntry>,
    #[serde(default)]
    rules: RulesEdit,
    #[serde(default)]
    ignore_unexpected_suffixes: Option<Vec<String>>,
    dequantize_fp8: Option<Vec<String>>,
    skip_layer: Option<Expr>,
    skip_modules: Option<Vec<SkipModule>>,
    text_prefix: Option<String>,
    module_tree: Option<String>,
    encoder_tp_data: Option<bool>,
    stage_needs: Option<StageNeed>,
    missing_hints: Option<Vec<MissingHint>>,
    #[serde(default)]
    blocks: IndexMap<String, Vec<Entry>>,
    #[serde(default)]
    parameters: ParamsEdit,
}

/// common.yaml: the rules every family gets, and the blocks every file may use.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommonDoc {
    #[serde(default)]
    rules: Rules,
    #[serde(default)]
    blocks: IndexMap<String, Vec<Entry>>,
}

/// A file's `rules`: each kind it names replaces the inherited one whole, because their order is
/// vLLM's and a later rule sees what an earlier one rewrote.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesEdit {
    scope: Option<String>,
    mistral: Option<MistralRemap>,
    regex: Option<Vec<RegexRule>>,
    substr: Option<Vec<Rename>>,
    stacked: Option<Vec<Stacked>>,
    prefix: Option<Vec<Rename>>,
    suffix: Option<Vec<Rename>>,
    experts: Option<Vec<ExpertRule>>,
}

/// A check as written: a new one, one replacing the inherited check with the same `rule`, or
/// `{remove: RULE}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckEntry {
    rule: Option<Expr>,
    message: Option<String>,
    fix: Option<String>,
    remove: Option<String>,
    /// Whose limit the check is: vLLM's (the default: one of its asserts) or wload's own.
    #[serde(default)]
    by: super::CheckBy,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ParamsEdit {
    layers: Option<Expr>,
    #[serde(default)]
    tower: Vec<Entry>,
    #[serde(default)]
    head: Vec<Entry>,
    #[serde(default)]
    layer: Vec<Entry>,
    #[serde(default)]
    tail: Vec<Entry>,
}

/// A file with everything it extends folded in; blocks already expanded.
struct Composed {
    defaults: IndexMap<String, Value>,
    derive: IndexMap<String, Expr>,
    checks: Vec<Check>,
    rules: Rules,
    ignore_unexpected_suffixes: Vec<String>,
    dequantize_fp8: Vec<String>,
    skip_layer: Option<Expr>,
    skip_modules: Vec<SkipModule>,
    text_prefix: String,
    module_tree: Option<String>,
    encoder_tp_data: bool,
    stage_needs: Option<StageNeed>,
    missing_hints: Vec<MissingHint>,
    blocks: IndexMap<String, Vec<ParamSpec>>,
    layers: Expr,
    tower: Vec<Placed>,
    head: Vec<Placed>,
    layer: Vec<Placed>,
    tail: Vec<Placed>,
}

/// Parses `text` (the file `file`) with everything it extends and uses.
pub(super) fn resolve(file: &str, text: &str) -> Result<Mapping, MappingError> {
    let common: CommonDoc = from_yaml(COMMON).map_err(|e| invalid("common.yaml", e))?;
    let doc: FileDoc = from_yaml(text).map_err(|e| invalid(file, e))?;
    let header = Header {
        family: doc.family.clone(),
    };
    let root = Composed::root(common.blocks).map_err(|e| invalid("common.yaml", e))?;
    compose(file, doc, root, 0)?
        .finish(header, common.rules)
        .map_err(|e| invalid(file, e))
}

/// What a file says about itself, never inherited: a file that extends Llama is not Llama.
struct Header {
    family: String,
}

fn invalid(file: &str, message: impl ToString) -> MappingError {
    MappingError::Invalid {
        file: file.to_string(),
        message: message.to_string(),
    }
}

/// `doc` applied over the chain it extends, which starts from `root`.
fn compose(
    file: &str,
    doc: FileDoc,
    root: Composed,
    depth: usize,
) -> Result<Composed, MappingError> {
    let base = match &doc.extends {
        None => root,
        Some(_) if depth >= MAX_DEPTH => {
            return Err(invalid(
                file,
                format!("`extends` chain is deeper than {MAX_DEPTH} files (a cycle?)"),
            ));
        }
        Some(parent) => {
            let Some((pfile, ptext)) = EMBEDDED
                .iter()
                .find(|(f, _)| f.strip_suffix(".yaml") == Some(parent.as_str()))
            else {
                let known: Vec<&str> = EMBEDDED
                    .iter()
                    .filter_map(|(f, _)| f.strip_suffix(".yaml"))
                    .collect();
                return Err(invalid(
                    file,
                    format!(
                        "extends unknown family '{parent}' (shipped: {})",
                        known.join(", ")
                    ),
                ));
            };
            let pdoc: FileDoc = from_yaml(ptext).map_err(|e| invalid(pfile, e))?;
            compose(pfile, pdoc, root, depth + 1)?
        }
    };
    base.apply(doc).map_err(|e| invalid(file, e))
}

impl Composed {
    fn root(blocks: IndexMap<String, Vec<Entry>>) -> Result<Composed, String> {
        let mut c = Composed {
            defaults: IndexMap::new(),
            derive: IndexMap::new(),
            checks: Vec::new(),
            rules: Rules::default(),
            ignore_unexpected_suffixes: Vec::new(),
            dequantize_fp8: Vec::new(),
            skip_layer: None,
            skip_modules: Vec::new(),
            text_prefix: String::new(),
            module_tree: None,
            encoder_tp_data: true,
            tower: Vec::new(),
            stage_needs: None,
            missing_hints: Vec::new(),
            blocks: IndexMap::new(),
            layers: super::default_layers(),
            head: Vec::new(),
            layer: Vec::new(),
            tail: Vec::new(),
        };
        c.define_blocks(blocks)?;
        Ok(c)
    }

    /// One file's contents over what it inherits.
    fn apply(mut self, doc: FileDoc) -> Result<Composed, String> {
        // IndexMap::insert keeps an inherited key where it was: derived values keep their order.
        self.defaults.extend(doc.defaults);
        self.derive.extend(doc.derive);
        self.edit_checks(doc.checks)?;
        doc.rules.apply(&mut self.rules);
        if let Some(s) = doc.ignore_unexpected_suffixes {
            self.ignore_unexpected_suffixes = s;
        }
        if let Some(d) = doc.dequantize_fp8 {
            self.dequantize_fp8 = d;
        }
        if doc.skip_layer.is_some() {
            self.skip_layer = doc.skip_layer;
        }
        if let Some(m) = doc.skip_modules {
            self.skip_modules = m;
        }
        if let Some(t) = doc.text_prefix {
            self.text_prefix = t;
        }
        if doc.module_tree.is_some() {
            self.module_tree = doc.module_tree;
        }
        if let Some(d) = doc.encoder_tp_data {
            self.encoder_tp_data = d;
        }
        if doc.stage_needs.is_some() {
            self.stage_needs = doc.stage_needs;
        }
        if let Some(h) = doc.missing_hints {
            self.missing_hints = h;
        }
        self.define_blocks(doc.blocks)?;
        let p = doc.parameters;
        if let Some(l) = p.layers {
            self.layers = l;
        }
        edit::apply(&mut self.tower, p.tower, "tower", &self.blocks)?;
        edit::apply(&mut self.head, p.head, "head", &self.blocks)?;
        edit::apply(&mut self.layer, p.layer, "layer", &self.blocks)?;
        edit::apply(&mut self.tail, p.tail, "tail", &self.blocks)?;
        Ok(self)
    }

    fn define_blocks(&mut self, blocks: IndexMap<String, Vec<Entry>>) -> Result<(), String> {
        for (name, entries) in blocks {
            let specs = edit::define_block(&name, entries)?;
            self.blocks.insert(name, specs);
        }
        Ok(())
    }

    fn edit_checks(&mut self, entries: Vec<CheckEntry>) -> Result<(), String> {
        for e in entries {
            match e {
                CheckEntry {
                    remove: Some(rule),
                    rule: None,
                    message: None,
                    fix: None,
                    ..
                } => {
                    let before = self.checks.len();
                    self.checks.retain(|c| c.rule.src() != rule);
                    if self.checks.len() == before {
                        return Err(format!(
                            "checks: `remove: {rule}`: no inherited check has that rule"
                        ));
                    }
                }
                CheckEntry {
                    remove: None,
                    rule: Some(rule),
                    message: Some(message),
                    fix,
                    by,
                } => {
                    let check = Check {
                        rule,
                        message,
                        fix,
                        by,
                    };
                    match self
                        .checks
                        .iter_mut()
                        .find(|c| c.rule.src() == check.rule.src())
                    {
                        Some(old) => *old = check,
                        None => self.checks.push(check),
                    }
                }
                _ => {
                    return Err(
                        "checks: each entry is `{rule, message, fix, by}` or `{remove: RULE}`"
                            .into(),
                    );
                }
            }
        }
        Ok(())
    }

    /// The resolved mapping: blocks and edits gone, per-layer values written into the `layer`
    /// parameters that read them, the common rules merged in.
    fn finish(self, header: Header, common: Rules) -> Result<Mapping, String> {
        let (derive, per_layer) = PerLayer::split(self.derive)?;
        let refuse = |place: &str, e: &Expr| match per_layer.read_by(e) {
            Some(v) => Err(format!(
                "{place}: `{e}` reads {v}, which depends on the layer index; only `layer` parameters may"
            )),
            None => Ok(()),
        };
        refuse("parameters.layers", &self.layers)?;
        for c in &self.checks {
            refuse("checks", &c.rule)?;
        }
        for p in self.rules.mistral.iter().flat_map(|m| &m.permute) {
            refuse(&format!("rules.mistral.permute {}", p.token), &p.heads)?;
        }
        let unplace = |list: Vec<Placed>| list.into_iter().map(|p| p.spec).collect::<Vec<_>>();
        // The language model's names get `text_prefix` (a multimodal wrapper's
        // `language_model.`); the tower's, built before it, are written whole.
        let prefix = self.text_prefix;
        let prefixed = |list: Vec<Placed>| {
            let mut specs = unplace(list);
            if !prefix.is_empty() {
                for s in &mut specs {
                    s.name.insert_str(0, &prefix);
                    if let Some(t) = &mut s.tied_to {
                        t.param.insert_str(0, &prefix);
                    }
                }
            }
            specs
        };
        let mut head = unplace(self.tower);
        head.extend(prefixed(self.head));
        let mut tail = prefixed(self.tail);
        for spec in head.iter_mut().chain(tail.iter_mut()) {
            if spec.name.contains("{i}") {
                return Err(format!(
                    "{}: `{{i}}` (the layer index) only means something in `layer` parameters",
                    spec.name
                ));
            }
            let name = spec.name.clone();
            spec.rewrite_exprs(&mut |e| refuse(&name, e).map(|_| e.clone()))?;
        }
        let mut layer = prefixed(self.layer);
        for spec in &mut layer {
            per_layer
                .write_into(spec)
                .map_err(|e| format!("parameters.layer: {}: {e}", spec.name))?;
        }
        let mut rules = self.rules;
        rules.merge_common(common);
        rules.compile()?;
        Ok(Mapping {
            family: header.family,
            defaults: self.defaults,
            derive,
            checks: self.checks,
            rules,
            ignore_unexpected_suffixes: self.ignore_unexpected_suffixes,
            dequantize_fp8: self.dequantize_fp8,
            skip_layer: self.skip_layer,
            skip_modules: self.skip_modules,
            module_tree: self.module_tree,
            encoder_tp_data: self.encoder_tp_data,
            stage_needs: self
                .stage_needs
                .map(|mut n| {
                    n.layer = per_layer
                        .written(&n.layer)
                        .map_err(|e| format!("stage_needs: {e}"))?;
                    Ok::<_, String>(n)
                })
                .transpose()?,
            missing_hints: (self.missing_hints.into_iter())
                .map(|mut h| {
                    h.when = per_layer
                        .written(&h.when)
                        .map_err(|e| format!("missing_hints: {e}"))?;
                    Ok::<_, String>(h)
                })
                .collect::<Result<_, _>>()?,
            parameters: Parameters {
                layers: self.layers,
                head,
                layer,
                tail,
            },
        })
    }
}

impl RulesEdit {
    fn apply(self, r: &mut Rules) {
        fn set<T>(slot: &mut T, v: Option<T>) {
            if let Some(v) = v {
                *slot = v;
            }
        }
        set(&mut r.scope, self.scope);
        if self.mistral.is_some() {
            r.mistral = self.mistral;
        }
        set(&mut r.regex, self.regex);
        set(&mut r.substr, self.substr);
        set(&mut r.stacked, self.stacked);
        set(&mut r.prefix, self.prefix);
        set(&mut r.suffix, self.suffix);
        set(&mut r.experts, self.experts);
    }
}

/// A mapping file is a few thousand YAML events at most; these budgets are ten times that, and far
/// below serde_saphyr's defaults (a million events), under which an alias bomb in a `--mapping`
/// file ("billion laughs") takes seconds before it is refused. Within them it fails in milliseconds.
fn from_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = 50_000;
    budget.max_nodes = 20_000;
    budget.max_aliases = 1_000;
    budget.max_anchors = 1_000;
    budget.max_recorded_anchor_events = 10_000;
    budget.max_recorded_anchor_bytes = 4 << 20;
    budget.max_total_scalar_bytes = 4 << 20;
    budget.max_merge_keys = 1_000;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    // The whole document is walked under the budget first, whatever its keys: typed reading stops
    // at the first unknown key, and a bomb must be refused as one, not by accident.
    serde_saphyr::from_str_with_options::<serde::de::IgnoredAny>(text, options.clone())?;
    serde_saphyr::from_str_with_options(text, options)
}

#[cfg(test)]
pub(super) mod tests;
