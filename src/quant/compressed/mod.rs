//! `quant_method: compressed-tensors`: the one config group read as vLLM reads it, dispatched on
//! `format` to its scheme — FP8 (`fp8.rs`), packed INT4/INT8 weight-only (`wna16.rs`), INT8
//! W8A8 (`int8.rs`), NVFP4 (`nvfp4.rs`) — the optional `kv_cache_scheme` (`kv_cache.rs`), and the `ignore` list,
//! whose `re:` entries are Python regexes.

mod fp8;
mod int8;
mod kv_cache;
mod method;
mod nvfp4;
mod wna16;

use serde_json::Value;

pub(crate) use fp8::{Fp8Scheme, WeightStrategy};
pub(crate) use int8::Int8;
pub(crate) use kv_cache::KvCacheStrategy;
pub(crate) use nvfp4::Nvfp4;
pub(crate) use wna16::Wna16;

use super::{QuantError, USE_UNQUANTIZED, field, refuse, string_list};

#[derive(Debug, Clone)]
pub(crate) struct Compressed {
    pub scheme: Scheme,
    /// `kv_cache_scheme`: how the Attention layers' k/v/q scales are laid out; `None` without
    /// one (the scales are then `[1]` ones, loaded when the checkpoint has them).
    pub kv_cache: Option<KvCacheStrategy>,
    /// `ignore`: module names, or `re:` regexes, kept unquantized (as written, for reports).
    pub ignore: Vec<String>,
    /// The `re:` entries, compiled once (matched at the start of the name, as Python's
    /// `re.match`), for every linear layer's lookup.
    pub(in crate::quant) ignore_patterns: Vec<fancy_regex::Regex>,
}

/// The scheme of the config group, by `format`.
#[derive(Debug, Clone)]
pub(crate) enum Scheme {
    /// `float-quantized`: `CompressedTensorsW8A8Fp8`.
    Fp8(Fp8Scheme),
    /// `pack-quantized`: `CompressedTensorsWNA16` (W4A16 / W8A16).
    Wna16(Wna16),
    /// `int-quantized`: `CompressedTensorsW8A8Int8`.
    Int8(Int8),
    /// `nvfp4-pack-quantized`: `CompressedTensorsW4A4Fp4` (W4A4 / W4A16).
    Nvfp4(Nvfp4),
}

impl Compressed {
    pub(super) fn parse(qc: &Value) -> Result<Compressed, QuantError> {
        if qc.get("transform_config").is_some_and(|v| !v.is_null()) {
            return Err(refuse(
                "compressed-tensors with a transform_config (rotations) is not supported".into(),
                &USE_UNQUANTIZED,
            ));
        }
        let kv_cache = KvCacheStrategy::parse(qc)?;
        let (gname, group) = Self::single_group(qc)?;
        let at = |k: &str| format!("config_groups.{gname}.{k}");
        check_actorder(group, &at)?;
        let format = qc.get("format").and_then(Value::as_str).unwrap_or("");
        let scheme = match format {
            "float-quantized" => Scheme::Fp8(Fp8Scheme::parse(group, &at)?),
            "pack-quantized" => Scheme::Wna16(Wna16::parse(group, &at)?),
            "int-quantized" => Scheme::Int8(Int8::parse(group, &at)?),
            "nvfp4-pack-quantized" => Scheme::Nvfp4(Nvfp4::parse(group, &at)?),
            _ => {
                return Err(refuse(
                    format!(
                        "compressed-tensors format \"{format}\" is not supported: wload writes float-quantized (FP8), pack-quantized (W4A16 / W8A16), int-quantized (W8A8 INT8) and nvfp4-pack-quantized (NVFP4) compressed-tensors checkpoints"
                    ),
                    &USE_UNQUANTIZED,
                ));
            }
        };
        let ignore = match qc.get("ignore") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => string_list(v, "ignore")?,
        };
        let ignore_patterns = ignore
            .iter()
            .filter_map(|l| l.strip_prefix("re:"))
            .map(python_regex)
            .collect::<Result<_, _>>()?;
        Ok(Compressed {
            scheme,
            kv_cache,
            ignore,
            ignore_patterns,
        })
    }

    /// Whether activations are scaled statically (an `input_scale` per layer); `None` for a
    /// weight-only scheme.
    pub(crate) fn static_input(&self) -> Option<bool> {
        match &self.scheme {
            Scheme::Fp8(f) => Some(f.static_activations),
            Scheme::Int8(i) => Some(i.static_input),
            // NVFP4 activations get group scales at run time, from a static global scale.
            Scheme::Nvfp4(n) => n.activations.then_some(false),
            Scheme::Wna16(_) => None,
        }
    }

    /// One line for reports: the scheme and the KV cache's scales.
    pub(crate) fn describe_scheme(&self) -> String {
        let scheme = match &self.scheme {
            Scheme::Fp8(f) => match f.weights {
                WeightStrategy::Tensor => "FP8 per-tensor weights".to_string(),
                WeightStrategy::Channel => "FP8 per-channel weights".to_string(),
                WeightStrategy::Block([n, k]) => format!("FP8 block {n}×{k} weights"),
            },
            Scheme::Wna16(w) => w.describe(),
            Scheme::Int8(i) => i.describe(),
            Scheme::Nvfp4(n) => n.describe(),
        };
        match self.kv_cache {
            None => scheme,
            Some(KvCacheStrategy::Tensor) => format!("{scheme}, FP8 KV cache per tensor"),
            Some(KvCacheStrategy::AttnHead) => format!("{scheme}, FP8 KV cache per kv head"),
        }
    }

    /// Whether `name` is left unquantized; `Err` when an `ignore` pattern cannot decide within
    /// [`IGNORE_BACKTRACK_LIMIT`] (then neither answer would be safe to write).
    pub(super) fn ignores(&self, name: &str) -> Result<bool, (String, &'static str)> {
        if self.ignore.iter().any(|l| l == name) {
            return Ok(true);
        }
        for r in &self.ignore_patterns {
            match r.is_match(name) {
                Ok(true) => return Ok(true),
                Ok(false) => {}
                Err(e) => {
                    let p = r.as_str();
                    let p = p.strip_prefix("^(?:").and_then(|p| p.strip_suffix(')'));
                    return Err((
                        format!(
                            "quantization_config.ignore entry `re:{}` cannot be matched \
                             against {name} within {IGNORE_BACKTRACK_LIMIT} backtracking \
                             steps ({e})",
                            p.unwrap_or(r.as_str())
                        ),
                        "simplify the pattern (nested repetitions such as `(a+)+` \
                         backtrack exponentially)",
                    ));
                }
            }
        }
        Ok(false)
    }

    /// The one config group, targeting `Linear`, with its name.
    fn single_group(qc: &Value) -> Result<(&String, &Value), QuantError> {
        let groups = qc
            .get("config_groups")
            .and_then(Value::as_object)
            .filter(|g| !g.is_empty())
            .ok_or_else(|| {
                refuse(
                    "compressed-tensors quantization_config has no config_groups".into(),
                    "the checkpoint's quantization_config is incomplete",
                )
            })?;
        if groups.len() > 1 {
            return Err(refuse(
                format!(
                    "compressed-tensors with {} config_groups (mixed schemes) is not supported; wload handles one group",
                    groups.len()
                ),
                &USE_UNQUANTIZED,
            ));
        }
        let (gname, group) = groups.iter().next().expect("one group");
        let targets = group
            .get("targets")
            .map(|t| string_list(t, &format!("config_groups.{gname}.targets")))
            .transpose()?
            .unwrap_or_default();
        if targets != ["Linear"] {
            return Err(refuse(
                format!(
                    "compressed-tensors config_groups.{gname}.targets = {targets:?} is not supported; wload handles [\"Linear\"]"
                ),
                &USE_UNQUANTIZED,
            ));
        }
        Ok((gname, group))
    }
}

/// The group's `weights`, which every scheme needs.
fn weights_of<'g>(group: &'g Value, at: &dyn Fn(&str) -> String) -> Result<&'g Value, QuantError> {
    group
        .get("weights")
        .filter(|w| !w.is_null())
        .ok_or_else(|| {
            refuse(
                format!("compressed-tensors {} is missing", at("weights")),
                &USE_UNQUANTIZED,
            )
        })
}

/// vLLM refuses group and dynamic activation ordering for every scheme
/// (compressed_tensors.py:336–344).
fn check_actorder(group: &Value, at: &dyn Fn(&str) -> String) -> Result<(), QuantError> {
    let order = group.get("weights").map(|w| field(w, "actorder"));
    match order.as_ref().and_then(Value::as_str) {
        Some(a @ ("group" | "dynamic")) => Err(refuse(
            format!(
                "Compressed-tensors group/dynamic activation ordering (actorder='{a}') is no longer supported ({}). Use a checkpoint with static/weight activation ordering or without activation ordering.",
                at("weights.actorder")
            ),
            "re-quantize with actorder \"static\" (or \"weight\") or without activation ordering",
        )),
        _ => Ok(()),
    }
}

/// How many backtracking steps one match of an `ignore` pattern may take. Module names are short:
/// a real pattern (`.*self_attn.*`) takes hundreds; a pattern that backtracks exponentially is
/// refused when it hits this, in milliseconds, instead of running for hours.
pub(crate) const IGNORE_BACKTRACK_LIMIT: usize = 100_000;

/// A compressed-tensors `ignore` entry's `re:` pattern, compiled as vLLM matches it:
/// `regex.match(pattern, name)` (config_utils.py `is_equal_or_regex_match`), anchored at the
/// start of the name only, so `re:model\.layers\.0\.self_attn` ignores every module under
/// that attention and `re:model\.layers\.1` every module of layers 1, 10, 11, ….
/// Python's lookahead, lookbehind and backreferences are beyond the regex crate: fancy-regex
/// has them, and hands the rest of a pattern to the regex crate.
fn python_regex(re: &str) -> Result<fancy_regex::Regex, QuantError> {
    fancy_regex::RegexBuilder::new(&format!("^(?:{re})"))
        .backtrack_limit(IGNORE_BACKTRACK_LIMIT)
        .delegate_size_limit(crate::mapping::limits::REGEX_SIZE)
        .delegate_dfa_size_limit(crate::mapping::limits::REGEX_DFA_SIZE)
        .build()
        .map_err(|e| {
            refuse(
                format!(
                    "quantization_config.ignore entry `re:{re}` is not a valid Python regex \
                     (or one wload cannot run within its limits): {e}"
                ),
                "quantization_config is malformed: fix the pattern as Python's `re` reads it",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::super::{QuantError, Quantization};
    use serde_json::{Value, json};

    fn q(v: Value) -> Result<Option<Quantization>, QuantError> {
        Quantization::from_config(Some(&v))
    }

    fn compressed(ignore: Value) -> Result<Option<Quantization>, QuantError> {
        q(json!({
            "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ignore,
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"type": "float", "num_bits": 8, "strategy": "tensor",
                            "symmetric": true, "dynamic": false},
                "input_activations": {"type": "float", "num_bits": 8, "strategy": "tensor",
                                      "symmetric": true, "dynamic": false}}}
        }))
    }

    /// vLLM matches `ignore` patterns with Python's `re`: lookaround and backreferences are
    /// valid there and must be here; a pattern Python refuses too is named as not a Python regex.
    #[test]
    fn ignore_patterns_are_python_regexes() {
        let got = compressed(json!([
            r"re:.*self_attn\.(?!q_proj).*",
            r"re:.*(?<=mlp\.)down_proj",
            r"re:model\.layers\.(\d)\.\1.*",
        ]))
        .expect("a valid config")
        .expect("quantized");
        let quantized = |m: &str| got.linear_quantized(m, &[]).expect("decided");
        assert!(quantized("model.layers.0.self_attn.q_proj"));
        assert!(!quantized("model.layers.0.self_attn.o_proj"));
        assert!(!quantized("model.layers.0.mlp.down_proj"));
        assert!(quantized("model.layers.0.mlp.up_proj"));
        assert!(!quantized("model.layers.3.3_x"));
        for bad in ["re:(?<x>a", "re:a)", "re:*"] {
            let e = compressed(json!([bad])).expect_err("refused").to_string();
            assert!(
                e.contains("not a valid Python regex") && e.contains(bad),
                "{e}"
            );
        }
    }

    /// vLLM matches `re:` entries with `regex.match`: at the start of the name, not the whole
    /// name and not anywhere in it.
    #[test]
    fn ignore_patterns_match_at_the_start_like_re_match() {
        let got = compressed(json!([r"re:model\.layers\.1", r"re:mlp"]))
            .expect("a valid config")
            .expect("quantized");
        let quantized = |m: &str| got.linear_quantized(m, &[]).expect("decided");
        assert!(!quantized("model.layers.1.self_attn.o_proj"));
        assert!(!quantized("model.layers.10.mlp.down_proj"));
        assert!(quantized("model.layers.2.mlp.down_proj"));
    }

    /// A pattern that backtracks exponentially is stopped at the limit and reported, naming
    /// the pattern, never run for hours or taken as "no match".
    #[test]
    fn a_catastrophic_ignore_pattern_is_refused_not_run_forever() {
        let got = compressed(json!([r"re:(a|aa)+\1b"]))
            .expect("a valid regex")
            .expect("quantized");
        let t = std::time::Instant::now();
        let e = got
            .linear_quantized(&"a".repeat(64), &[])
            .expect_err("undecidable within the limit");
        assert!(t.elapsed().as_secs() < 5, "{:?}", t.elapsed());
        assert!(
            e.0.contains("backtracking steps") && e.0.contains("(a|aa)+"),
            "{e:?}"
        );
    }

    /// The golden cases' configs read as vLLM reads them, and described for `inspect`.
    #[test]
    fn integer_and_kv_cache_schemes_are_read_and_described() {
        let golden = |case: &str| -> Value {
            let p = format!(
                "{}/tests/data/golden/fixtures/{case}/config.json",
                env!("CARGO_MANIFEST_DIR")
            );
            let c: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
            c["quantization_config"].clone()
        };
        for (case, want) in [
            (
                "llama_gqa_w4a16",
                "compressed-tensors: int4 group 32 symmetric (W4A16), weight-only, 1 module pattern(s) left unquantized",
            ),
            (
                "llama_gqa_ct_w8a8_int8",
                "compressed-tensors: INT8 per-channel weights, dynamic per-token int8 activations, dynamic activations, 1 module pattern(s) left unquantized",
            ),
            (
                "llama_kv2_ct_fp8_kv_head",
                "compressed-tensors: FP8 per-channel weights, FP8 KV cache per kv head, dynamic activations, 1 module pattern(s) left unquantized",
            ),
        ] {
            let got = q(golden(case)).expect(case).expect("quantized");
            assert_eq!(got.describe(), want);
        }
        let mut asym = golden("llama_gqa_w4a16");
        asym["config_groups"]["group_0"]["weights"]["symmetric"] = json!(false);
        asym["config_groups"]["group_0"]["weights"]["strategy"] = json!("channel");
        asym["config_groups"]["group_0"]["weights"]["num_bits"] = json!(8);
        let got = q(asym).unwrap().unwrap();
        assert!(
            got.describe()
                .contains("int8 per-channel asymmetric (zero points) (W8A16)"),
            "{}",
            got.describe()
        );
    }
}
