//! Declarative model mappings: one YAML file per model family (`mappings/*.yaml`, embedded in the
//! binary), saying how checkpoint names become vLLM parameters and what each parameter looks like.
//! The format is documented in docs/mapping-format.md.

pub mod expr;
pub mod rules;

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::Value;

pub use expr::Expr;

/// The mapping files shipped in the binary, by file name.
pub const EMBEDDED: &[(&str, &str)] = &[
    ("llama.yaml", include_str!("../../mappings/llama.yaml")),
    ("mistral.yaml", include_str!("../../mappings/mistral.yaml")),
    ("qwen2.yaml", include_str!("../../mappings/qwen2.yaml")),
    ("qwen3.yaml", include_str!("../../mappings/qwen3.yaml")),
    ("gemma2.yaml", include_str!("../../mappings/gemma2.yaml")),
    ("phi3.yaml", include_str!("../../mappings/phi3.yaml")),
    ("mixtral.yaml", include_str!("../../mappings/mixtral.yaml")),
    (
        "qwen3_moe.yaml",
        include_str!("../../mappings/qwen3_moe.yaml"),
    ),
];

/// Rules every family gets (vLLM's AutoWeightsLoader adds them to every mapper).
pub const COMMON: &str = include_str!("../../mappings/common.yaml");

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mapping {
    /// Family whose file this one starts from: maps merge key by key, lists and values replace.
    #[serde(default)]
    pub extends: Option<String>,
    /// Short name, e.g. `llama`.
    pub family: String,
    #[serde(default)]
    pub description: String,
    /// config.json `architectures[0]` values this mapping serves.
    pub architectures: Vec<String>,
    /// Config values used when config.json lacks them (the transformers config class defaults).
    #[serde(default)]
    pub defaults: IndexMap<String, Value>,
    /// Derived values, in order; each may use config fields and the entries before it.
    #[serde(default)]
    pub derive: IndexMap<String, Expr>,
    /// Conditions vLLM enforces for a given `tp` (and `ep`), with the message and fix to print.
    #[serde(default)]
    pub checks: Vec<Check>,
    #[serde(default)]
    pub rules: rules::Rules,
    /// Checkpoint names with these suffixes are skipped silently when nothing maps them
    /// (vLLM's unexpected-suffix ignore list; `.bias` is always in it).
    #[serde(default)]
    pub ignore_unexpected_suffixes: Vec<String>,
    pub parameters: Parameters,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    pub rule: Expr,
    pub message: String,
    #[serde(default)]
    pub fix: Option<String>,
}

/// vLLM's parameters in state_dict order: the ones before the decoder layers, those of layer `{i}`
/// (repeated `layers` times), and the ones after.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parameters {
    #[serde(default = "default_layers")]
    pub layers: Expr,
    #[serde(default)]
    pub head: Vec<ParamSpec>,
    #[serde(default)]
    pub layer: Vec<ParamSpec>,
    #[serde(default)]
    pub tail: Vec<ParamSpec>,
}

fn default_layers() -> Expr {
    Expr::parse("num_hidden_layers").expect("valid expression")
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamSpec {
    /// vLLM name; `{i}` is the layer index.
    pub name: String,
    /// Present only when this holds (e.g. `qkv_bias`, `i in mlp_only_layers`).
    #[serde(default)]
    pub when: Option<Expr>,
    pub layout: Layout,
    /// `model` (the resolved model dtype) or a safetensors dtype such as `F32`.
    #[serde(default = "model_dtype")]
    pub dtype: String,
    /// Filled with `fill` and never read from the checkpoint (persistent buffers).
    #[serde(default)]
    pub buffer: bool,
    /// Value for buffers, and for `optional` parameters the checkpoint lacks.
    #[serde(default)]
    pub fill: Option<f64>,
    /// A checkpoint without this tensor is fine (it is filled with `fill`, default 0).
    #[serde(default)]
    pub optional: bool,
    /// This parameter is the same tensor as another when the condition holds (tied embeddings):
    /// vLLM keeps one key, the lexicographically smaller, at the first one's place.
    #[serde(default)]
    pub tied_to: Option<Tied>,
}

fn model_dtype() -> String {
    "model".into()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tied {
    pub param: String,
    pub when: Expr,
}

/// How a parameter is split across tensor-parallel ranks (vllm-spec.md §4–§5).
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Layout {
    /// Full copy on every rank.
    Replicated { shape: Vec<Expr> },
    /// Split along dim 0.
    Column { shape: Vec<Expr> },
    /// Split along dim 1.
    Row { shape: Vec<Expr> },
    /// Several column-parallel outputs stacked on dim 0, each split by tp (gate_up_proj).
    MergedColumn {
        sizes: Vec<Expr>,
        #[serde(default)]
        inner: Vec<Expr>,
    },
    /// q, k, v heads stacked on dim 0; kv heads replicated when tp ≥ kv heads.
    Qkv {
        heads: Expr,
        kv_heads: Expr,
        head_dim: Expr,
        #[serde(default)]
        inner: Vec<Expr>,
    },
    /// Vocabulary rows padded to a multiple of `padding` (64) and split by tp; padding rows are zero.
    Vocab {
        vocab: Expr,
        #[serde(default)]
        inner: Vec<Expr>,
        #[serde(default = "default_vocab_padding")]
        padding: u64,
    },
    /// Fused routed experts: `w13` = [E_loc, 2·I_p, H] from w1 (gate) and w3 (up), or `w2` =
    /// [E_loc, H, I_p]; split by tp, or by expert with expert parallelism.
    Experts {
        part: ExpertPart,
        experts: Expr,
        intermediate: Expr,
        hidden: Expr,
    },
}

fn default_vocab_padding() -> u64 {
    64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpertPart {
    W13,
    W2,
}

#[derive(Debug, thiserror::Error)]
pub enum MappingError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: invalid mapping: {message}")]
    Invalid { file: String, message: String },
    #[error(
        "no mapping for architecture '{arch}' (known: {known}); pass one with --mapping FILE (see docs/mapping-format.md)"
    )]
    UnknownArchitecture { arch: String, known: String },
    #[error(
        "config.json has no 'architectures'; add it, pass --hf-overrides '{{\"architectures\": [\"LlamaForCausalLM\"]}}', or choose a mapping with --mapping FILE"
    )]
    NoArchitecture,
}

impl MappingError {
    pub fn is_usage(&self) -> bool {
        matches!(self, MappingError::Io { .. } | MappingError::Invalid { .. })
    }
}

/// Parses one mapping file's text (following `extends`) and merges the common rules into it.
pub fn parse(file: &str, text: &str) -> Result<Mapping, MappingError> {
    let invalid = |message: String| MappingError::Invalid {
        file: file.to_string(),
        message,
    };
    let value = resolve_extends(file, text, 0)?;
    let mut m: Mapping = if value.get("extends").is_some() {
        serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?
    } else {
        // Straight from the text, for error messages with line numbers.
        from_yaml(text).map_err(|e| invalid(e.to_string()))?
    };
    let common: rules::Rules = from_yaml(COMMON).map_err(|e| MappingError::Invalid {
        file: "common.yaml".into(),
        message: e.to_string(),
    })?;
    m.rules.merge_common(common);
    m.rules.compile().map_err(|message| MappingError::Invalid {
        file: file.to_string(),
        message,
    })?;
    Ok(m)
}

/// The file's YAML as a value, with its `extends` chain merged underneath it.
fn resolve_extends(file: &str, text: &str, depth: usize) -> Result<Value, MappingError> {
    let invalid = |message: String| MappingError::Invalid {
        file: file.to_string(),
        message,
    };
    let mut value: Value = from_yaml(text).map_err(|e| invalid(e.to_string()))?;
    let Some(parent) = value
        .get("extends")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return Ok(value);
    };
    if depth > 8 {
        return Err(invalid("`extends` chain is too deep (a cycle?)".into()));
    }
    let (pfile, ptext) = EMBEDDED
        .iter()
        .find(|(f, _)| f.trim_end_matches(".yaml") == parent)
        .ok_or_else(|| invalid(format!("extends unknown family '{parent}'")))?;
    let mut base = resolve_extends(pfile, ptext, depth + 1)?;
    if let Value::Object(b) = &mut base {
        b.remove("extends");
    }
    merge(&mut base, std::mem::take(&mut value));
    Ok(base)
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
    serde_saphyr::from_str_with_options(text, options)
}

/// Objects merge key by key; anything else replaces.
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Every embedded mapping, parsed.
pub fn embedded() -> Vec<Mapping> {
    EMBEDDED
        .iter()
        .map(|(f, t)| parse(f, t).unwrap_or_else(|e| panic!("embedded mapping is invalid: {e}")))
        .collect()
}

/// The mapping for a model: `--mapping FILE` if given, else the embedded one that lists the config's
/// first architecture.
pub fn select(file: Option<&Path>, arch: Option<&str>) -> Result<Mapping, MappingError> {
    if let Some(path) = file {
        let text = crate::small_file::read_to_string(path).map_err(|source| MappingError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        return parse(&path.display().to_string(), &text);
    }
    let arch = arch.ok_or(MappingError::NoArchitecture)?;
    // Only the chosen file is parsed in full: finding it needs just each file's architectures.
    if let Some((file, text)) = EMBEDDED
        .iter()
        .find(|(_, text)| declared_architectures(text).iter().any(|a| a == arch))
    {
        return parse(file, text);
    }
    let mut known: Vec<String> = EMBEDDED
        .iter()
        .flat_map(|(_, text)| declared_architectures(text))
        .collect();
    known.sort();
    known.dedup();
    Err(MappingError::UnknownArchitecture {
        arch: arch.to_string(),
        known: known.join(", "),
    })
}

/// The `architectures: [...]` line of a mapping file, read without parsing the rest.
fn declared_architectures(text: &str) -> Vec<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("architectures:"))
        .and_then(|v| serde_saphyr::from_str::<Vec<String>>(v.trim()).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn embedded_mappings_parse() {
        let all = super::embedded();
        assert_eq!(all.len(), super::EMBEDDED.len());
    }

    /// `select` finds files by their one-line `architectures:`; it must agree with the full parse,
    /// and no architecture may be claimed twice.
    #[test]
    fn architecture_lines_match_the_full_parse() {
        let mut seen = std::collections::HashSet::new();
        for ((file, text), m) in super::EMBEDDED.iter().zip(super::embedded()) {
            assert_eq!(
                super::declared_architectures(text),
                m.architectures,
                "{file}"
            );
            for a in &m.architectures {
                assert!(seen.insert(a.clone()), "{a} is claimed by two mappings");
            }
        }
    }
}
