//! config.json / params.json → model dimensions, with `--hf-overrides` applied on top.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

pub(crate) mod aliases;
mod mistral;

pub(crate) use aliases::ConfigAlias;

/// `--config-format`, as vLLM spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ConfigFormat {
    /// params.json when the folder has `consolidated*.safetensors` and a params.json, else config.json.
    Auto,
    /// Hugging Face config.json.
    Hf,
    /// Mistral's params.json.
    Mistral,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON: {message}")]
    BadJson { path: PathBuf, message: String },
    #[error("{path}: expected a JSON object at the top level")]
    NotAnObject { path: PathBuf },
    #[error("{path}: field '{field}' is {found}, expected {expected}")]
    BadField {
        path: PathBuf,
        field: String,
        found: String,
        expected: &'static str,
    },
    #[error("{path}: required field '{field}'{} is missing{hint}", or_spelling(*.also))]
    MissingField {
        path: PathBuf,
        field: &'static str,
        /// transformers' other spelling of the field, when its config class has one.
        also: Option<&'static str>,
        hint: &'static str,
    },
    #[error("--hf-overrides: {message}")]
    BadOverrides { message: String },
}

/// ` (or 'alias')` for an error that names a field with two spellings.
pub(crate) fn or_spelling(also: Option<&str>) -> String {
    also.map(|a| format!(" (or '{a}')")).unwrap_or_default()
}

impl ConfigError {
    /// Errors in the user's `--hf-overrides` are usage errors; the rest are the checkpoint's.
    pub fn exit_status(&self) -> crate::exit::ExitStatus {
        use crate::exit::ExitStatus;
        match self {
            // A config past the small-file limit is the checkpoint's, as a malformed one is.
            ConfigError::Io { source, .. } if crate::small_file::is_too_large(source) => {
                ExitStatus::Checkpoint
            }
            ConfigError::Io { .. } => ExitStatus::Runtime,
            ConfigError::BadOverrides { .. } => ExitStatus::Usage,
            _ => ExitStatus::Checkpoint,
        }
    }
}

/// Model dimensions as vLLM reads them, plus the whole (overridden) config for mapping expressions.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ModelConfig {
    pub architectures: Vec<String>,
    pub model_type: Option<String>,
    pub num_hidden_layers: u64,
    pub hidden_size: u64,
    pub num_attention_heads: u64,
    pub num_key_value_heads: u64,
    /// `head_dim` as the config states it; `None` when absent (most families then use hidden/heads).
    pub head_dim: Option<u64>,
    pub intermediate_size: Option<u64>,
    pub moe_intermediate_size: Option<u64>,
    pub vocab_size: u64,
    /// Routed experts (`num_local_experts`, `num_experts` or `n_routed_experts`), if a MoE.
    pub num_experts: Option<u64>,
    /// As the config states it; `None` when absent (the family's default then applies).
    pub tie_word_embeddings: Option<bool>,
    /// `dtype` (transformers ≥ 4.56) or `torch_dtype`.
    pub dtype: Option<String>,
    /// `quantization_config.quant_method` (fp8, gptq, awq, ...), when the checkpoint is quantized.
    pub quantization: Option<String>,
    /// `quantization_config` as written (for [`crate::quant::Quantization::from_config`]).
    #[serde(skip)]
    pub quantization_config: Option<Value>,
    /// The text config after overrides (the top level, or `text_config` for multimodal wrappers),
    /// with both spellings of each aliased attribute holding the attribute's value.
    #[serde(skip)]
    pub raw: Map<String, Value>,
    /// A multimodal wrapper's `vision_config` (top level), which mapping expressions read as
    /// `vision_config.depth`; `None` for a text-only model.
    #[serde(skip)]
    pub vision_config: Option<Value>,
    /// The whole top level of config.json (after overrides), which mapping expressions read as
    /// `hf_config.…` (vLLM's `hf_config`): a multimodal wrapper's own fields
    /// (`multimodal_projector_bias`, `spatial_merge_size`, …) beside `text_config`.
    #[serde(skip)]
    pub hf_config: Value,
    /// transformers' attribute aliases of the text config's class, for naming both spellings.
    #[serde(skip)]
    pub aliases: &'static [ConfigAlias],
    /// The file's bytes as they were read and parsed: what `shard` writes to OUT, so that the
    /// config published is the one planned from, whatever the file holds by then.
    #[serde(skip)]
    pub file_bytes: std::sync::Arc<[u8]>,
    /// The `--hf-overrides` applied (as given): files planned with them must be served with them.
    #[serde(skip)]
    pub overrides: Option<Map<String, Value>>,
}

/// Reads the config the resolution picked and applies `overrides` (vLLM's `--hf-overrides` semantics:
/// top-level keys replace; an object given for a nested `*_config` merges into it recursively).
pub fn load(
    root: &Path,
    file: &str,
    format: ConfigFormat,
    overrides: Option<&Map<String, Value>>,
) -> Result<ModelConfig, ConfigError> {
    let path = root.join(file);
    // Bytes, not a string: a file that is not UTF-8 is a malformed config (exit 3), not an I/O
    // failure, and serde_json names the line and column of the first bad byte.
    let bytes = crate::small_file::read(&path).map_err(|source| ConfigError::Io {
        path: path.clone(),
        source,
    })?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| ConfigError::BadJson {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let Value::Object(mut map) = v else {
        return Err(ConfigError::NotAnObject { path });
    };
    if format == ConfigFormat::Mistral {
        map = mistral::to_hf(map, root);
    }
    // In transformers' order: the config class resolves the file's aliases, vLLM then applies
    // `--hf-overrides` with setattr (which follows the aliases), and reads either spelling.
    each_config(&mut map, aliases::resolve);
    if let Some(o) = overrides {
        apply_overrides(&mut map, o);
    }
    each_config(&mut map, aliases::mirror);
    let aliases = aliases::for_map(text_config(&map));
    let config = from_map(&path, map).map_err(|e| match e {
        // A bad value the user supplied is a usage error about the flag, not the file.
        ConfigError::BadField {
            field,
            found,
            expected,
            ..
        } if overrides.is_some_and(|o| {
            o.contains_key(&field)
                || aliases::other_spelling(aliases, &field).is_some_and(|a| o.contains_key(a))
        }) =>
        {
            ConfigError::BadOverrides {
                message: format!("'{field}' is {found}, expected {expected}"),
            }
        }
        e => e,
    })?;
    let mut config = ModelConfig {
        file_bytes: bytes.into(),
        overrides: overrides.filter(|o| !o.is_empty()).cloned(),
        ..config
    };
    if config.quantization_config.is_none() && format == ConfigFormat::Hf {
        config.quantization_config = separate_quant_config(root)?;
        config.quantization = config
            .quantization_config
            .as_ref()
            .map(|_| "modelopt".into());
    }
    Ok(config)
}

/// The file ModelOpt ≤ 0.29 writes its quantization config to, beside config.json.
pub(crate) const HF_QUANT_CONFIG: &str = "hf_quant_config.json";

/// `hf_quant_config.json`'s object, which vLLM takes as the quantization config when config.json
/// has none (`transformers_utils/config.py:951–962`); `None` without the file.
fn separate_quant_config(root: &Path) -> Result<Option<Value>, ConfigError> {
    let path = root.join(HF_QUANT_CONFIG);
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = crate::small_file::read(&path).map_err(|source| ConfigError::Io {
        path: path.clone(),
        source,
    })?;
    match serde_json::from_slice(&bytes) {
        Ok(v @ Value::Object(_)) => Ok(Some(v)),
        Ok(_) => Err(ConfigError::NotAnObject { path }),
        Err(e) => Err(ConfigError::BadJson {
            path,
            message: e.to_string(),
        }),
    }
}

/// The config object that holds the language model's dimensions (vLLM's get_hf_text_config):
/// `text_config` for multimodal wrappers, else the top level.
fn text_config(top: &Map<String, Value>) -> &Map<String, Value> {
    match top.get("text_config") {
        Some(Value::Object(t)) => t,
        _ => top,
    }
}

/// `f` on the top-level config and on `text_config`, each with its own class's aliases.
fn each_config(map: &mut Map<String, Value>, f: fn(&mut Map<String, Value>, &[ConfigAlias])) {
    f(map, aliases::for_map(map));
    if let Some(Value::Object(t)) = map.get_mut("text_config") {
        f(t, aliases::for_map(t));
    }
}

/// Parses `--hf-overrides` text: a JSON object.
pub fn parse_overrides(s: &str) -> Result<Map<String, Value>, ConfigError> {
    match serde_json::from_str::<Value>(s) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(ConfigError::BadOverrides {
            message: format!(
                "expected a JSON object like '{{\"num_hidden_layers\": 2}}', got {other}"
            ),
        }),
        Err(e) => Err(ConfigError::BadOverrides {
            message: format!("not valid JSON: {e}"),
        }),
    }
}

fn apply_overrides(map: &mut Map<String, Value>, overrides: &Map<String, Value>) {
    let table = aliases::for_map(map);
    for (k, v) in overrides {
        // An alias written by the user lands on its attribute, as vLLM's setattr does.
        let k = aliases::attribute_of(table, k);
        match (map.get_mut(k), v) {
            (Some(Value::Object(existing)), Value::Object(sub)) if k.ends_with("_config") => {
                apply_overrides(existing, sub)
            }
            _ => {
                map.insert(k.to_string(), v.clone());
            }
        }
    }
}

fn from_map(path: &Path, top: Map<String, Value>) -> Result<ModelConfig, ConfigError> {
    let architectures = architectures(path, &top)?;
    let top_dtype = top
        .get("dtype")
        .or_else(|| top.get("torch_dtype"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let raw = text_config(&top).clone();
    let aliases = aliases::for_map(&raw);
    let f = Fields {
        path,
        map: &raw,
        aliases,
    };
    let hidden_size = f.req("hidden_size")?;
    let num_attention_heads = f.req("num_attention_heads")?;
    let num_experts = match f.opt("num_local_experts")? {
        Some(n) => Some(n),
        None => match f.opt("num_experts")? {
            Some(n) => Some(n),
            None => f.opt("n_routed_experts")?,
        },
    };
    let dtype = raw
        .get("dtype")
        .or_else(|| raw.get("torch_dtype"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .or(top_dtype);
    let tie_word_embeddings = tie_word_embeddings(path, &top, &raw)?;
    // vLLM reads compressed-tensors' older `compression_config` when there is no
    // quantization_config (model_arch_config_convertor.py:241–245).
    let quantization_config = ["quantization_config", "compression_config"]
        .iter()
        .find_map(|k| top.get(*k).or(raw.get(*k)).filter(|v| !v.is_null()))
        .cloned();
    Ok(ModelConfig {
        architectures,
        model_type: raw
            .get("model_type")
            .or(top.get("model_type"))
            .and_then(Value::as_str)
            .map(str::to_string),
        num_hidden_layers: f.req("num_hidden_layers")?,
        hidden_size,
        num_attention_heads,
        num_key_value_heads: f.opt("num_key_value_heads")?.unwrap_or(num_attention_heads),
        head_dim: f.opt("head_dim")?,
        intermediate_size: f.opt("intermediate_size")?,
        moe_intermediate_size: f.opt("moe_intermediate_size")?,
        vocab_size: f.req("vocab_size")?,
        num_experts,
        tie_word_embeddings,
        quantization: quantization_config.as_ref().map(|q| {
            q.get("quant_method")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string()
        }),
        quantization_config,
        dtype,
        vision_config: top.get("vision_config").filter(|v| v.is_object()).cloned(),
        hf_config: Value::Object(top.clone()),
        raw,
        aliases,
        file_bytes: Default::default(),
        overrides: None,
    })
}

/// `architectures`: a list of strings, or none.
fn architectures(path: &Path, top: &Map<String, Value>) -> Result<Vec<String>, ConfigError> {
    Ok(match top.get("architectures") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ConfigError::BadField {
                        path: path.to_path_buf(),
                        field: "architectures".into(),
                        found: x.to_string(),
                        expected: "a list of strings",
                    })
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ConfigError::BadField {
                path: path.to_path_buf(),
                field: "architectures".into(),
                found: other.to_string(),
                expected: "a list of strings",
            });
        }
    })
}

/// `tie_word_embeddings` as stated (the top level first), or `None`.
fn tie_word_embeddings(
    path: &Path,
    top: &Map<String, Value>,
    raw: &Map<String, Value>,
) -> Result<Option<bool>, ConfigError> {
    match top
        .get("tie_word_embeddings")
        .or(raw.get("tie_word_embeddings"))
    {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(ConfigError::BadField {
            path: path.to_path_buf(),
            field: "tie_word_embeddings".into(),
            found: other.to_string(),
            expected: "true or false",
        }),
    }
}

struct Fields<'a> {
    path: &'a Path,
    map: &'a Map<String, Value>,
    aliases: &'static [ConfigAlias],
}

impl Fields<'_> {
    fn opt(&self, field: &'static str) -> Result<Option<u64>, ConfigError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| ConfigError::BadField {
                path: self.path.to_path_buf(),
                field: field.to_string(),
                found: v.to_string(),
                expected: "a non-negative integer",
            }),
        }
    }

    fn req(&self, field: &'static str) -> Result<u64, ConfigError> {
        self.opt(field)?.ok_or_else(|| ConfigError::MissingField {
            path: self.path.to_path_buf(),
            field,
            also: aliases::other_spelling(self.aliases, field),
            hint: "; add it, or pass it with --hf-overrides",
        })
    }
}

impl ModelConfig {
    /// The first listed architecture, which is the one vLLM builds.
    pub fn architecture(&self) -> Option<&str> {
        self.architectures.first().map(String::as_str)
    }
}
