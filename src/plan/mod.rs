//! Plan: for every tensor-parallel rank, the tensors vLLM holds (name, dtype, shape, in state_dict
//! order) and, for each, the pieces that fill it. Pure arithmetic on headers; every problem is found
//! here, before any tensor data is read, and all of them are reported at once.

pub mod layout;

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use serde::Serialize;
use serde_json::Value;

use crate::checkpoint::{Checkpoint, TensorInfo};
use crate::config::ModelConfig;
use crate::dtype::Dtype;
use crate::mapping::rules::{Outcome, ShardId};
use crate::mapping::{Expr, Layout, Mapping, ParamSpec};
use layout::{Block, Geometry, Rank, SlotKey};

/// The most layers a config may claim. Every layer's parameters are built before the checkpoint
/// is compared with them (about 6 KB a layer for Llama): a billion from a typo or a hostile
/// config must be refused, not abort on a failed allocation. Real models have a few hundred.
pub const MAX_LAYERS: u64 = 100_000;

/// Bumped when a field of the plan JSON changes meaning or disappears.
pub const SCHEMA_VERSION: u32 = 1;

/// `wload plan --json`: the plan plus where it came from.
#[derive(Debug, Serialize)]
pub struct PlanReport {
    pub schema_version: u32,
    pub wload_version: &'static str,
    pub source: String,
    pub timings: crate::Timings,
    #[serde(flatten)]
    pub plan: Plan,
}

/// `--json` when planning is refused: every problem, complete, while the terminal gets a summary.
#[derive(Debug, Serialize)]
pub struct ProblemsReport<'a> {
    pub schema_version: u32,
    pub wload_version: &'static str,
    pub exit_status: u8,
    pub problem_count: usize,
    pub problems: &'a [Problem],
}

impl<'a> ProblemsReport<'a> {
    /// The report for an error that is a list of problems; `None` for any other error.
    pub fn of(e: &'a crate::Error) -> Option<ProblemsReport<'a>> {
        match e {
            crate::Error::Plan(PlanError::Invalid(ps)) => Some(ProblemsReport {
                schema_version: SCHEMA_VERSION,
                wload_version: env!("CARGO_PKG_VERSION"),
                exit_status: e.exit_status() as u8,
                problem_count: ps.len(),
                problems: ps,
            }),
            _ => None,
        }
    }
}

/// `--dtype`, as vLLM spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DtypeChoice {
    /// The config's dtype; float32 becomes bfloat16 (as vLLM on GPUs that support it).
    Auto,
    Bfloat16,
    Float16,
    Float32,
}

#[derive(Debug, Clone)]
pub struct PlanOptions {
    pub tp: u64,
    pub expert_parallel: bool,
    pub dtype: DtypeChoice,
    /// Only the per-rank names, dtypes and shapes matter (checking a pre-sharded folder): a
    /// parameter the checkpoint does not fill is not a problem.
    pub shapes_only: bool,
}

/// One thing wrong with the checkpoint for this model and TP size, with the likely fix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Problem {
    pub message: String,
    pub fix: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Mapping(#[from] crate::mapping::MappingError),
    #[error("{}", crate::report::ProblemList(.0))]
    Invalid(Vec<Problem>),
    #[error("--tp must be at least 1")]
    BadTp,
}

/// A checkpoint tensor some piece reads.
#[derive(Debug, Clone, Serialize)]
pub struct SourceTensor {
    pub name: String,
    pub file: String,
    #[serde(skip)]
    pub file_index: usize,
    /// Absolute byte offset of the tensor's data in its file.
    pub offset: u64,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
}

/// How a piece of a rank's tensor is filled.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Piece {
    /// A strided block move from a source tensor (elements), converting dtype when they differ.
    Copy {
        /// Index into [`Plan::sources`].
        source: usize,
        /// Human description of the slice (`rows [64, 128)`).
        region: String,
        rows: u64,
        row: u64,
        src_start: u64,
        src_stride: u64,
        dst_start: u64,
        dst_stride: u64,
    },
    /// `count` elements from `dst_start` set to `value`.
    Fill {
        dst_start: u64,
        count: u64,
        value: f64,
    },
}

#[derive(Debug, Clone, Serialize)]
pub struct OutTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub bytes: u64,
    pub pieces: Vec<Piece>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RankPlan {
    pub rank: u64,
    pub bytes: u64,
    pub tensors: Vec<OutTensor>,
}

/// The tie between lm_head and the embedding is decided by data: the config says tied but the
/// checkpoint ships an lm_head, so vLLM builds them untied and re-ties them if equal.
#[derive(Debug, Clone, Serialize)]
pub struct Retie {
    pub keep: String,
    pub drop: String,
    pub compare: [String; 2],
}

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub family: String,
    pub architecture: String,
    pub tp: u64,
    pub expert_parallel: bool,
    pub dtype: Dtype,
    pub sources: Vec<SourceTensor>,
    pub ranks: Vec<RankPlan>,
    /// Whether lm_head and the embedding are one tensor in the output (config.json must say so).
    pub tie_word_embeddings: bool,
    pub retie: Option<Retie>,
    /// Checkpoint tensors dropped by a rule or skipped as vLLM skips them.
    pub skipped: Vec<Skipped>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub tensor: String,
    pub reason: String,
}

impl Piece {
    pub fn block(&self) -> Option<Block> {
        match *self {
            Piece::Copy {
                rows,
                row,
                src_start,
                src_stride,
                dst_start,
                dst_stride,
                ..
            } => Some(Block {
                rows,
                row,
                src_start,
                src_stride,
                dst_start,
                dst_stride,
            }),
            Piece::Fill { .. } => None,
        }
    }
}

/// vLLM's dtype for `--dtype` and the config (config/model.py:2423–2465).
pub fn resolve_dtype(choice: DtypeChoice, config: &ModelConfig) -> Dtype {
    match choice {
        DtypeChoice::Bfloat16 => Dtype::Bf16,
        DtypeChoice::Float16 => Dtype::F16,
        DtypeChoice::Float32 => Dtype::F32,
        DtypeChoice::Auto => match config.dtype.as_deref() {
            Some("float16" | "half" | "torch.float16") => Dtype::F16,
            // bfloat16 stays; float32 (and a missing dtype, which means float32) is downcast.
            _ => Dtype::Bf16,
        },
    }
}

/// Variables visible to mapping expressions: derived values, then defaults-filled config, then
/// `tp`, `ep` and (inside layers) `i`.
struct Env {
    vars: HashMap<String, Value>,
}

impl Env {
    fn scope<'a>(&'a self, i: Option<u64>) -> impl Fn(&str) -> Option<Value> + 'a {
        move |k: &str| match (k, i) {
            ("i", Some(i)) => Some(Value::from(i)),
            _ => self.vars.get(k).cloned(),
        }
    }

    /// `{field}` in a message replaced by its value.
    fn fill(&self, template: &str) -> String {
        let mut out = String::new();
        let mut rest = template;
        while let Some(a) = rest.find('{') {
            out.push_str(&rest[..a]);
            let Some(b) = rest[a..].find('}') else {
                break;
            };
            let key = &rest[a + 1..a + b];
            match self.vars.get(key) {
                Some(Value::String(s)) => out.push_str(s),
                Some(v) => out.push_str(&v.to_string()),
                None => out.push_str(&rest[a..=a + b]),
            }
            rest = &rest[a + b + 1..];
        }
        out.push_str(rest);
        out
    }
}

/// Problems in the order found, each once. A checkpoint with tens of thousands of layers can
/// yield hundreds of thousands of problems, so "seen before?" is a hash lookup, not a scan: the
/// table holds indices into the list rather than a second copy of every message.
#[derive(Default)]
struct Problems {
    list: Vec<Problem>,
    seen: HashTable<usize>,
    hasher: foldhash::fast::FixedState,
}

impl Problems {
    fn push(&mut self, p: Problem) {
        let Problems { list, seen, hasher } = self;
        let hash = hasher.hash_one(&p);
        match seen.entry(hash, |&i| list[i] == p, |&i| hasher.hash_one(&list[i])) {
            Entry::Occupied(_) => {}
            Entry::Vacant(v) => {
                v.insert(list.len());
                list.push(p);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// A parameter instance: one spec at one layer index, with its geometry evaluated.
struct Param<'m> {
    name: String,
    spec: &'m ParamSpec,
    geometry: Geometry,
    dtype: Dtype,
    /// Index of the parameter this one is the same tensor as (tied embeddings).
    alias_of: Option<usize>,
}

/// Builds the plan for `opts.tp` ranks, or every problem found.
pub fn plan(
    mapping: &Mapping,
    config: &ModelConfig,
    ckpt: &Checkpoint,
    opts: &PlanOptions,
) -> Result<Plan, PlanError> {
    if opts.tp == 0 {
        return Err(PlanError::BadTp);
    }
    let mut problems = Problems::default();
    if let Some(q) = &config.quantization {
        // Quantized layers have other parameters (scales, packed weights) and post-processing:
        // planning them as unquantized would be wrong, so say so up front.
        problems.push(Problem {
            message: format!(
                "the checkpoint is quantized (quantization_config.quant_method = \"{q}\"); wload plans unquantized checkpoints only for now"
            ),
            fix: Some("use the unquantized checkpoint".into()),
        });
        return Err(PlanError::Invalid(problems.list));
    }
    let model_dtype = resolve_dtype(opts.dtype, config);
    let arch = config.architecture().unwrap_or(&mapping.family).to_string();

    // Expression environment.
    let mut vars: HashMap<String, Value> = config.raw.clone().into_iter().collect();
    for (k, v) in &mapping.defaults {
        match vars.get(k) {
            None | Some(Value::Null) => {
                vars.insert(k.clone(), v.clone());
            }
            _ => {}
        }
    }
    vars.insert("tp".into(), Value::from(opts.tp));
    vars.insert("ep".into(), Value::Bool(opts.expert_parallel));
    let mut env = Env { vars };
    for (k, e) in &mapping.derive {
        let value = e.eval(&env.scope(None));
        match value {
            Ok(v) => {
                env.vars.insert(k.clone(), v);
            }
            Err(err) => problems.push(Problem {
                message: format!("cannot compute {k} = `{e}`: {err}"),
                fix: Some("add the field to config.json or pass it with --hf-overrides".into()),
            }),
        }
    }
    let mut geometry_ok = problems.is_empty();
    for c in &mapping.checks {
        match c.rule.eval_bool(&env.scope(None)) {
            Ok(true) => {}
            Ok(false) => {
                geometry_ok = false;
                problems.push(Problem {
                    message: format!("{} (vLLM requires `{}`)", env.fill(&c.message), c.rule),
                    fix: c.fix.as_ref().map(|f| env.fill(f)),
                });
            }
            Err(err) => {
                geometry_ok = false;
                problems.push(Problem {
                    message: format!("cannot check `{}`: {err}", c.rule),
                    fix: Some("add the field to config.json or pass it with --hf-overrides".into()),
                });
            }
        }
    }

    // Expand the parameter list.
    let layers = match mapping.parameters.layers.eval_u64(&env.scope(None)) {
        Ok(n) => n,
        Err(err) => {
            problems.push(Problem {
                message: format!("cannot count layers `{}`: {err}", mapping.parameters.layers),
                fix: None,
            });
            0
        }
    };
    if layers > MAX_LAYERS {
        problems.push(Problem {
            message: format!(
                "the config gives {layers} layers (`{}`); wload plans at most {MAX_LAYERS}",
                mapping.parameters.layers
            ),
            fix: Some("check num_hidden_layers in config.json or --hf-overrides".into()),
        });
        return Err(PlanError::Invalid(problems.list));
    }
    let mut params: Vec<Param> = Vec::new();
    // Where each name first appears, for `tied_to`: indices into `params`, found through their
    // names, so that no name is copied (a config can claim hundreds of thousands of parameters).
    let mut first_index: HashTable<usize> = HashTable::new();
    let name_hasher = foldhash::fast::FixedState::default();
    let mut retie = None;
    let specs = mapping
        .parameters
        .head
        .iter()
        .map(|s| (s, None))
        .chain((0..layers).flat_map(|i| mapping.parameters.layer.iter().map(move |s| (s, Some(i)))))
        .chain(mapping.parameters.tail.iter().map(|s| (s, None)));
    for (spec, i) in specs {
        let scope = env.scope(i);
        if let Some(w) = &spec.when {
            match w.eval_bool(&scope) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(err) => {
                    problems.push(Problem {
                        message: format!("{}: cannot evaluate `when: {w}`: {err}", spec.name),
                        fix: None,
                    });
                    continue;
                }
            }
        }
        let name = match i {
            Some(i) => spec.name.replace("{i}", &i.to_string()),
            None => spec.name.clone(),
        };
        let geometry = match evaluate_layout(&spec.layout, &scope) {
            Ok(g) => g,
            Err(err) => {
                problems.push(Problem {
                    message: format!("{name}: {err}"),
                    fix: Some("check config.json, or pass the field with --hf-overrides".into()),
                });
                continue;
            }
        };
        let dtype = if spec.dtype == "model" {
            model_dtype
        } else {
            match spec.dtype.parse::<Dtype>() {
                Ok(d) => d,
                Err(()) => {
                    problems.push(Problem {
                        message: format!("{name}: unknown dtype '{}' in the mapping", spec.dtype),
                        fix: None,
                    });
                    continue;
                }
            }
        };
        let mut alias_of = None;
        if let Some(t) = &spec.tied_to {
            let other = match i {
                Some(i) => t.param.replace("{i}", &i.to_string()),
                None => t.param.clone(),
            };
            match t.when.eval_bool(&scope) {
                // The checkpoint ships this tensor too: vLLM builds the two untied, loads both and
                // re-ties them only if they are equal (config/model.py:1255–1281).
                Ok(true) if ckpt.get(&name).is_some() => {
                    retie = Some(Retie {
                        keep: name.clone().min(other.clone()),
                        drop: name.clone().max(other.clone()),
                        compare: [other, name.clone()],
                    });
                }
                Ok(true) => {
                    alias_of = first_index
                        .find(name_hasher.hash_one(&other), |&j| params[j].name == other)
                        .copied();
                    if alias_of.is_none() {
                        problems.push(Problem {
                            message: format!("{name}: tied_to names '{other}', which is not a parameter before it"),
                            fix: Some("fix the mapping file".into()),
                        });
                    }
                }
                Ok(false) => {}
                Err(err) => problems.push(Problem {
                    message: format!("{name}: cannot evaluate `tied_to.when: {}`: {err}", t.when),
                    fix: None,
                }),
            }
        }
        if let Entry::Vacant(v) = first_index.entry(
            name_hasher.hash_one(&name),
            |&j| params[j].name == name,
            |&j| name_hasher.hash_one(&params[j].name),
        ) {
            v.insert(params.len());
        }
        params.push(Param {
            name,
            spec,
            geometry,
            dtype,
            alias_of,
        });
    }
    let by_name: HashMap<&str, usize> = params
        .iter()
        .enumerate()
        .map(|(i, p)| (p.name.as_str(), i))
        .collect();

    // Map every checkpoint tensor (the copies vLLM keeps) onto a parameter slot.
    let mut sources: Vec<SourceTensor> = Vec::new();
    let mut fed: Vec<HashMap<SlotKey, (usize, Option<String>)>> =
        vec![HashMap::new(); params.len()];
    let mut skipped = Vec::new();
    let mut present: HashSet<(usize, SlotKey)> = HashSet::new();
    let mut ignore: Vec<&str> = vec![".bias"];
    ignore.extend(
        mapping
            .ignore_unexpected_suffixes
            .iter()
            .map(String::as_str),
    );
    for t in ckpt.all_tensors().filter(|t| ckpt.is_effective(t)) {
        let file = &ckpt.files[t.file].name;
        let mapped = match mapping.rules.apply(&t.name) {
            Outcome::Dropped { rule } => {
                skipped.push(Skipped {
                    tensor: t.name.clone(),
                    reason: format!("dropped by {rule}"),
                });
                continue;
            }
            Outcome::Mapped(m) => m,
        };
        let via = if mapped.trace.is_empty() {
            String::new()
        } else {
            format!(" (via {})", mapped.trace.join(", "))
        };
        let Some(&pi) = by_name.get(mapped.target.as_str()) else {
            if let Some(sfx) = ignore.iter().find(|s| mapped.target.ends_with(**s)) {
                skipped.push(Skipped {
                    tensor: t.name.clone(),
                    reason: format!(
                        "no parameter '{}'; vLLM ignores unexpected '{sfx}' names",
                        mapped.target
                    ),
                });
                continue;
            }
            let what = if mapped.target == t.name {
                String::new()
            } else {
                format!(" → '{}'{via}", mapped.target)
            };
            problems.push(Problem {
                message: format!(
                    "{file}: tensor '{}'{what} matches no parameter of {arch} (mapping '{}')",
                    t.name, mapping.family
                ),
                fix: Some(
                    "rename the tensor, add a rule with --mapping FILE, or check that config.json names the right architecture"
                        .into(),
                ),
            });
            continue;
        };
        let p = &params[pi];
        let shard = mapped.shard.clone();
        // Present but unusable: reported once below, never again as "missing".
        present.insert((pi, (shard.clone(), mapped.expert)));
        let expected = match p.geometry.expected_source(shard.as_ref()) {
            Ok(s) => s,
            Err(err) => {
                problems.push(Problem {
                    message: format!("{file}: tensor '{}' → '{}'{via}: {err}", t.name, p.name),
                    fix: Some("fix the mapping rule's shard id (--mapping FILE)".into()),
                });
                continue;
            }
        };
        let scalar_ok = expected.is_empty() && t.shape.iter().product::<u64>() == 1;
        if t.shape != expected && !scalar_ok {
            problems.push(Problem {
                message: format!(
                    "{file}: tensor '{}' has shape {:?}, but '{}'{}{via} expects {:?}",
                    t.name,
                    t.shape,
                    p.name,
                    shard.as_ref().map_or(String::new(), |s| format!(" shard {s}")),
                    expected
                ),
                fix: Some(
                    "check config.json's dimensions (override with --hf-overrides) or that the checkpoint matches this model"
                        .into(),
                ),
            });
            continue;
        }
        if !convertible(t.dtype, p.dtype) {
            problems.push(Problem {
                message: format!(
                    "{file}: tensor '{}' is {}, which cannot be converted to {} for '{}'",
                    t.name, t.dtype, p.dtype, p.name
                ),
                fix: Some("this checkpoint needs a quantization-aware mapping".into()),
            });
            continue;
        }
        let key: SlotKey = (shard.clone(), mapped.expert);
        if let Some((prev, _)) = fed[pi].get(&key) {
            problems.push(Problem {
                message: format!(
                    "'{}'{}: filled twice, by '{}' and '{}'",
                    p.name,
                    shard
                        .as_ref()
                        .map_or(String::new(), |s| format!(" shard {s}")),
                    sources[*prev].name,
                    t.name
                ),
                fix: Some("remove one of the two tensors from the checkpoint".into()),
            });
            continue;
        }
        sources.push(source_of(t, file));
        fed[pi].insert(key, (sources.len() - 1, mapped.permute_heads.clone()));
    }

    // Every parameter must be filled (buffers and optional ones get their value).
    let mut fused = vec![false; params.len()];
    for (pi, p) in params.iter().enumerate() {
        if p.spec.buffer || p.alias_of.is_some() {
            if p.alias_of.is_some() && !fed[pi].is_empty() {
                problems.push(Problem {
                    message: format!(
                        "'{}' is tied to another parameter but the checkpoint fills it",
                        p.name
                    ),
                    fix: None,
                });
            }
            continue;
        }
        let (split, whole) = p.geometry.required();
        let has_whole = whole.as_ref().is_some_and(|w| fed[pi].contains_key(w));
        let has_split = split.iter().any(|k| fed[pi].contains_key(k));
        if has_whole && has_split {
            problems.push(Problem {
                message: format!(
                    "'{}' is filled both by a fused tensor and by separate shards",
                    p.name
                ),
                fix: Some("keep either the fused tensor or the separate ones".into()),
            });
            continue;
        }
        fused[pi] = has_whole;
        if has_whole || p.spec.optional || opts.shapes_only {
            continue;
        }
        if whole.is_some_and(|w| present.contains(&(pi, w))) {
            continue;
        }
        let missing: Vec<String> = split
            .iter()
            .filter(|k| !fed[pi].contains_key(*k) && !present.contains(&(pi, (*k).clone())))
            .map(|(s, e)| slot_name(s, e))
            .collect();
        if !missing.is_empty() {
            let what = if missing.len() == 1 && missing[0].is_empty() {
                String::new()
            } else {
                format!(" (missing {})", summarize(&missing))
            };
            problems.push(Problem {
                message: format!("parameter '{}' has nothing in the checkpoint to fill it{what}", p.name),
                fix: Some(
                    "the checkpoint lacks this tensor or names it differently: check the names with `wload inspect`, or adjust the rules with --mapping FILE"
                        .into(),
                ),
            });
        }
    }

    if geometry_ok {
        for r in 0..opts.tp {
            let rank = Rank {
                tp: opts.tp,
                rank: r,
                ep: opts.expert_parallel,
            };
            for p in &params {
                for msg in p.geometry.check(rank) {
                    problems.push(Problem {
                        message: format!("{}: {msg}", p.name),
                        fix: Some(format!("choose another --tp (now {})", opts.tp)),
                    });
                }
            }
        }
    }
    if !problems.is_empty() {
        return Err(PlanError::Invalid(problems.list));
    }

    // Per-rank tensors, in state_dict order; tied pairs become one key, the smaller name, at the
    // first one's place (ShardedStateLoader._filter_subtensors).
    let alias_name: HashMap<usize, String> = params
        .iter()
        .filter_map(|p| {
            p.alias_of
                .map(|a| (a, params[a].name.clone().min(p.name.clone())))
        })
        .collect();
    let mut ranks = Vec::with_capacity(opts.tp as usize);
    for r in 0..opts.tp {
        let rank = Rank {
            tp: opts.tp,
            rank: r,
            ep: opts.expert_parallel,
        };
        let mut tensors = Vec::new();
        for (pi, p) in params.iter().enumerate() {
            if p.alias_of.is_some() {
                continue;
            }
            let l = p.geometry.rank_layout(rank, fused[pi]);
            let numel: u64 = l.shape.iter().product();
            if numel == 0 {
                continue; // vLLM drops empty tensors (an EP rank without experts)
            }
            let mut pieces = Vec::new();
            if p.spec.buffer {
                pieces.push(Piece::Fill {
                    dst_start: 0,
                    count: numel,
                    value: p.spec.fill.unwrap_or(0.0),
                });
            } else {
                for take in &l.takes {
                    match fed[pi].get(&take.slot) {
                        Some((si, permute)) => {
                            let heads = permute
                                .as_ref()
                                .and_then(|h| Expr::parse(h).ok()?.eval_u64(&env.scope(None)).ok());
                            push_copies(&mut pieces, *si, take, heads, &sources[*si].shape);
                        }
                        None => {
                            let b = take.block();
                            for k in 0..b.rows {
                                pieces.push(Piece::Fill {
                                    dst_start: b.dst_start + k * b.dst_stride,
                                    count: b.row,
                                    value: p.spec.fill.unwrap_or(0.0),
                                });
                            }
                        }
                    }
                }
                for &(at, count) in &l.zeros {
                    pieces.push(Piece::Fill {
                        dst_start: at,
                        count,
                        value: 0.0,
                    });
                }
            }
            let bytes = p.dtype.byte_size(numel).unwrap_or(0);
            tensors.push(OutTensor {
                name: alias_name
                    .get(&pi)
                    .cloned()
                    .unwrap_or_else(|| p.name.clone()),
                dtype: p.dtype,
                shape: l.shape,
                bytes,
                pieces,
            });
        }
        ranks.push(RankPlan {
            rank: r,
            bytes: tensors.iter().map(|t| t.bytes).sum(),
            tensors,
        });
    }

    Ok(Plan {
        family: mapping.family.clone(),
        architecture: arch,
        tp: opts.tp,
        expert_parallel: opts.expert_parallel,
        dtype: model_dtype,
        sources,
        ranks,
        tie_word_embeddings: env
            .vars
            .get("tie_word_embeddings")
            .is_some_and(|v| v == &Value::Bool(true))
            && retie.is_none(),
        retie,
        skipped,
    })
}

/// Copies for one take; with a rotary permutation (Mistral-native q/k) each head's even rows go
/// to its first half and odd rows to its second half.
fn push_copies(
    out: &mut Vec<Piece>,
    source: usize,
    take: &layout::Take,
    heads: Option<u64>,
    src_shape: &[u64],
) {
    let b = take.block();
    let region = take.region();
    match heads {
        Some(h) if take.dim == 0 && h > 0 && src_shape[0].is_multiple_of(h) => {
            let hd = src_shape[0] / h;
            let inner: u64 = src_shape[1..].iter().product();
            let mut dst = b.dst_start;
            let mut row = take.from;
            while row < take.to {
                let head_start = row / hd * hd;
                for half in 0..2 {
                    out.push(Piece::Copy {
                        source,
                        region: format!("{region}, rotary permuted"),
                        rows: hd / 2,
                        row: inner,
                        src_start: (head_start + half) * inner,
                        src_stride: 2 * inner,
                        dst_start: dst + half * (hd / 2) * inner,
                        dst_stride: inner,
                    });
                }
                dst += hd * inner;
                row = head_start + hd;
            }
        }
        _ => out.push(Piece::Copy {
            source,
            region,
            rows: b.rows,
            row: b.row,
            src_start: b.src_start,
            src_stride: b.src_stride,
            dst_start: b.dst_start,
            dst_stride: b.dst_stride,
        }),
    }
}

fn source_of(t: &TensorInfo, file: &str) -> SourceTensor {
    SourceTensor {
        name: t.name.clone(),
        file: file.to_string(),
        file_index: t.file,
        offset: t.offset,
        dtype: t.dtype,
        shape: t.shape.clone(),
    }
}

/// Whether vLLM's `copy_` into a parameter of `to` accepts a tensor of `from` (float types only).
pub fn convertible(from: Dtype, to: Dtype) -> bool {
    let float = |d| matches!(d, Dtype::F16 | Dtype::Bf16 | Dtype::F32 | Dtype::F64);
    from == to || (float(from) && float(to))
}

fn slot_name(s: &Option<ShardId>, e: &Option<u64>) -> String {
    match (s, e) {
        (Some(s), Some(e)) => format!("expert {e} {s}"),
        (Some(s), None) => format!("shard {s}"),
        (None, Some(e)) => format!("expert {e}"),
        (None, None) => String::new(),
    }
}

fn summarize(items: &[String]) -> String {
    if items.len() <= 4 {
        items.join(", ")
    } else {
        format!("{}, … {} in all", items[..3].join(", "), items.len())
    }
}

fn evaluate_layout(
    l: &Layout,
    scope: &dyn crate::mapping::expr::Scope,
) -> Result<Geometry, String> {
    let one = |e: &Expr| e.eval_u64(scope).map_err(|err| format!("`{e}`: {err}"));
    let many = |v: &[Expr]| v.iter().map(one).collect::<Result<Vec<_>, _>>();
    Ok(match l {
        Layout::Replicated { shape } => Geometry::Replicated {
            shape: many(shape)?,
        },
        Layout::Column { shape } => Geometry::Column {
            shape: many(shape)?,
        },
        Layout::Row { shape } => {
            let shape = many(shape)?;
            if shape.len() != 2 {
                return Err("a row-parallel parameter needs a 2-D shape".into());
            }
            Geometry::Row { shape }
        }
        Layout::MergedColumn { sizes, inner } => Geometry::MergedColumn {
            sizes: many(sizes)?,
            inner: many(inner)?,
        },
        Layout::Qkv {
            heads,
            kv_heads,
            head_dim,
            inner,
        } => Geometry::Qkv {
            heads: one(heads)?,
            kv_heads: one(kv_heads)?,
            head_dim: one(head_dim)?,
            inner: many(inner)?,
        },
        Layout::Vocab {
            vocab,
            inner,
            padding,
        } => Geometry::Vocab {
            vocab: one(vocab)?,
            inner: many(inner)?,
            padding: (*padding).max(1),
        },
        Layout::Experts {
            part,
            experts,
            intermediate,
            hidden,
        } => Geometry::Experts {
            part: *part,
            experts: one(experts)?,
            intermediate: one(intermediate)?,
            hidden: one(hidden)?,
        },
    })
}
