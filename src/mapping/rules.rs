//! Name rules: checkpoint tensor name → vLLM parameter name (+ shard id, expert id), applied in the
//! fixed order of vLLM's `WeightsMapper._map_name_with_shard` (vLLM 0.33 `model_executor/models/utils.py`, `WeightsMapper`).

use std::sync::OnceLock;

use indexmap::IndexMap;
use regex::{Regex, RegexSet};
use serde::{Deserialize, Serialize};

use super::Expr;
use super::limits::{self, NameTooLong};
pub(crate) use crate::layout::ShardId;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    /// Rules apply only to names under this prefix, and see them without it (vLLM attaches most
    /// mappers to the inner `model` module: scope `model.`).
    #[serde(default)]
    pub scope: String,
    /// Mistral-native names (`layers.0.attention.wq.weight`), remapped before anything else.
    #[serde(default)]
    pub mistral: Option<MistralRemap>,
    #[serde(default)]
    pub regex: Vec<RegexRule>,
    #[serde(default)]
    pub substr: Vec<Rename>,
    #[serde(default)]
    pub stacked: Vec<Stacked>,
    #[serde(default)]
    pub prefix: Vec<Rename>,
    #[serde(default)]
    pub suffix: Vec<Rename>,
    /// Per-expert checkpoint tensors → fused expert parameters (the MoE runner's expert mapping),
    /// applied after the rules above.
    #[serde(default)]
    pub experts: Vec<ExpertRule>,
    /// The regexes, compiled when a name first needs them ([`Rules::regexes`]).
    #[serde(skip)]
    compiled: OnceLock<Compiled>,
    /// The expert rules as literal matchers, when every pattern is `literal(\\d+)literal`.
    #[serde(skip)]
    literal_experts: Option<Vec<LiteralExpert>>,
    /// Every substring and stacked rule's `from`, as literals: one pass says that none of them
    /// occurs, which holds for nearly every per-expert name.
    #[serde(skip)]
    any_literal: Option<Literals>,
    /// The same literals, substring rules' first, for finding which rule fires first
    /// (overlapping search: one literal may hold another, `.gate_proj` in `._layer.gate_proj`).
    #[serde(skip)]
    literal_rules: Option<aho_corasick::AhoCorasick>,
    /// When every regex rule is anchored at the end of the name: the endings one of which a
    /// name needs for any of them to match (`.k_scale`, `.g_idx`, …). Comparing endings is
    /// much cheaper than running the regexes over each of 90,000 names.
    #[serde(skip)]
    regex_endings: Option<Endings>,
    /// Each expert rule's shard id, parsed once.
    #[serde(skip)]
    expert_shards: Vec<ShardId>,
}

/// The rules' regexes, compiled. Compiling is what a mapping costs most to prepare (2 ms for a
/// quantized model's 13 rules, twice as long as reading its YAML), and most checkpoints never need
/// it: their names' endings and literal expert patterns answer first.
#[derive(Debug, Clone)]
struct Compiled {
    regex: Vec<Regex>,
    experts: Vec<Regex>,
    /// All regex rules at once, then all expert rules: most names that get this far match none,
    /// and one pass over the name says so. `None` when a set exceeds the regex engine's size
    /// limit although its members do not: each rule is then tried in turn.
    any_regex: Option<RegexSet>,
    any_expert: Option<RegexSet>,
}

impl Compiled {
    fn new(rules: &Rules) -> Result<Compiled, String> {
        let re = |p: &str| {
            regex::RegexBuilder::new(p)
                .size_limit(limits::REGEX_SIZE)
                .dfa_size_limit(limits::REGEX_DFA_SIZE)
                .build()
                .map_err(|e| match e {
                    regex::Error::CompiledTooBig(n) => format!(
                        "regex `{p}` compiles to more than {n} bytes, the limit for one rule; \
                         a name rule needs a few kilobytes: simplify it"
                    ),
                    e => format!("bad regex `{p}`: {e}"),
                })
        };
        let regex = (rules.regex.iter())
            .map(|r| re(&r.pattern))
            .collect::<Result<_, _>>()?;
        let experts = (rules.experts.iter())
            .map(|r| re(&r.pattern))
            .collect::<Result<_, _>>()?;
        // A set past the limit is only a missed shortcut: each rule is then tried in turn.
        let set = |patterns: Vec<&String>| {
            regex::RegexSetBuilder::new(patterns)
                .size_limit(limits::REGEX_SIZE)
                .dfa_size_limit(limits::REGEX_DFA_SIZE)
                .build()
                .ok()
        };
        Ok(Compiled {
            regex,
            experts,
            any_regex: set(rules.regex.iter().map(|r| &r.pattern).collect()),
            any_expert: set(rules.experts.iter().map(|r| &r.pattern).collect()),
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rename {
    pub from: String,
    /// `null` drops the tensor.
    pub to: Option<String>,
    /// (substr rules only) vLLM builds the module under `from` and registers it again under
    /// `to`, the name its sharded state keeps: a quantization config's ignore list names the
    /// module as built, so it is matched against `from` ([`Rules::built_module`]).
    #[serde(default)]
    pub alias: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegexRule {
    pub pattern: String,
    /// Python `re.sub` replacement (`\1` groups); `null` drops the tensor.
    pub replace: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stacked {
    pub from: String,
    pub to: String,
    pub shard: ShardId,
    /// The rotary interleaved → half-split row permutation, per head, with this many heads, for
    /// a checkpoint `.weight` this rule fires on (Llama 4 permutes HF q/k weights at load,
    /// llama4.py:805–844: the Mistral permutation on HF names).
    #[serde(default)]
    pub permute: Option<Expr>,
    /// Applies only to models for which this holds (over config fields, defaults and derived
    /// values): vLLM's loaders pick a stacking by model shape (DeepSeek fuses `q_a_proj` and
    /// `kv_a_proj_with_mqa` only with a `q_lora_rank`).
    #[serde(default)]
    pub when: Option<crate::mapping::Expr>,
    /// Fires only on names that start with this (after `scope`): a stacking that belongs to
    /// one module's `load_weights`, as Llama 4's text model permutes its q/k at load and its
    /// vision model does not (llama4.py:805–844, mllama4.py `_load_other_weights`).
    #[serde(default)]
    pub under: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertRule {
    /// Regex with one capture group, the global expert id: `experts\.(\d+)\.w1\.`.
    pub pattern: String,
    pub replace: String,
    /// `w1` (gate), `w3` (up) or `w2` (down).
    pub shard: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MistralRemap {
    /// Dotted-token renames (`wq: q_proj`), applied as vLLM's `maybe_remap_mistral` does.
    pub tokens: IndexMap<String, String>,
    /// Tokens whose `.weight` gets the rotary permutation from Mistral's interleaved layout.
    #[serde(default)]
    pub permute: Vec<Permute>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Permute {
    pub token: String,
    pub heads: Expr,
}

/// One rule that changed a name: its kind and index in the rules (text only when a message needs
/// it: a large checkpoint has a hundred thousand names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Step {
    /// Boxed: rare, and it would triple the size of every other step.
    Mistral(Box<MistralStep>),
    Regex(usize),
    Substr(usize),
    Stacked(usize),
    Prefix(usize),
    Suffix(usize),
    Expert {
        rule: usize,
        id: u64,
    },
}

/// A Mistral-native rename, whole names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub(crate) struct MistralStep {
    pub from: String,
    pub to: String,
}

/// The rules that changed a name, in order: rarely more than two, kept inline (one allocation
/// saved per checkpoint tensor). Two, because a VLM's expert names take a prefix rule and an
/// expert rule each (Qwen3.5-397B: 92,000 of them).
pub(crate) type Trace = smallvec::SmallVec<[Step; 2]>;

/// Where a checkpoint name ends up. `T` holds the parameter name: a `String`, or nothing when
/// [`Rules::apply_into`] wrote it into the caller's buffer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome<T = String> {
    Mapped(Mapped<T>),
    /// A rule with `null` dropped it.
    Dropped {
        rule: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Mapped<T = String> {
    pub target: T,
    pub shard: Option<ShardId>,
    pub expert: Option<u64>,
    /// Rotary permutation with this many heads (`heads` expression of the Permute rule).
    pub permute_heads: Option<String>,
    /// The rules that changed the name, in order, for messages ([`Rules::describe`]).
    pub trace: Trace,
}

impl Rules {
    /// vLLM's `mapper | REMOVE_UNUSED_ROTARY_EMBEDS_MAPPER`: dict merge, later entries win.
    pub(crate) fn merge_common(&mut self, common: Rules) {
        fn merge(dst: &mut Vec<Rename>, src: Vec<Rename>) {
            for r in src {
                dst.retain(|d| d.from != r.from);
                dst.push(r);
            }
        }
        merge(&mut self.substr, common.substr);
        merge(&mut self.prefix, common.prefix);
        merge(&mut self.suffix, common.suffix);
        for r in common.regex {
            self.regex.retain(|d| d.pattern != r.pattern);
            self.regex.push(r);
        }
    }

    /// Checks the rules and builds what matching them needs, except the regexes themselves,
    /// which are compiled when first needed ([`Rules::regexes`]). A pattern that does not parse,
    /// or an expert pattern without exactly one capture group, is refused here.
    pub(crate) fn compile(&mut self) -> Result<(), String> {
        self.check_limits()?;
        let parsed: Vec<regex_syntax::hir::Hir> = (self.regex.iter())
            .map(|r| parse_regex(&r.pattern))
            .collect::<Result<_, _>>()?;
        if let Some(r) = (self.prefix.iter().chain(&self.suffix)).find(|r| r.alias) {
            return Err(format!(
                "rule '{}' → {:?}: `alias` applies to substr rules only",
                r.from, r.to
            ));
        }
        for r in &self.experts {
            if parse_regex(&r.pattern)?
                .properties()
                .explicit_captures_len()
                != 1
            {
                return Err(format!(
                    "expert rule `{}` needs exactly one capture group (the expert id)",
                    r.pattern
                ));
            }
        }
        self.compiled = OnceLock::new();
        self.literal_experts = self
            .experts
            .iter()
            .map(|r| LiteralExpert::parse(&r.pattern))
            .collect();
        self.index_literals()?;
        self.regex_endings = required_endings(&parsed).map(Endings::new);
        self.expert_shards = (self.experts.iter())
            .map(|r| ShardId::named(&r.shard))
            .collect();
        Ok(())
    }

    /// The substring and stacked rules' literals, searched for at once; rebuilt whenever those
    /// rules change, since a literal's index names its rule.
    fn index_literals(&mut self) -> Result<(), String> {
        let literals =
            (self.substr.iter().map(|r| &r.from)).chain(self.stacked.iter().map(|r| &r.from));
        self.any_literal = Some(Literals::new(literals.clone())?);
        self.literal_rules = Some(
            aho_corasick::AhoCorasick::new(literals)
                .map_err(|e| format!("substring and stacked rules: {e}"))?,
        );
        Ok(())
    }

    /// Keeps the stacked rules `keep` says to (those whose `when` holds for the layout), and
    /// the literal index in step with them.
    pub(crate) fn retain_stacked(&mut self, keep: impl FnMut(&Stacked) -> bool) {
        self.stacked.retain(keep);
        if self.index_literals().is_err() {
            // Fewer literals than compiled before cannot fail; if it did, one search per rule.
            (self.any_literal, self.literal_rules) = (None, None);
        }
    }

    /// The rules' count and text within [`limits`]: each rule costs time on every checkpoint
    /// name, and its text bounds how much one application can add to a name.
    fn check_limits(&self) -> Result<(), String> {
        let regexes = self.regex.len() + self.experts.len();
        if regexes > limits::MAX_REGEX_RULES {
            return Err(format!(
                "{regexes} regex and expert rules; wload accepts at most {} (real mappings have a dozen)",
                limits::MAX_REGEX_RULES
            ));
        }
        let literal =
            self.substr.len() + self.stacked.len() + self.prefix.len() + self.suffix.len();
        if literal > limits::MAX_LITERAL_RULES {
            return Err(format!(
                "{literal} substr, stacked, prefix and suffix rules; wload accepts at most {} \
                 (real mappings have a few dozen)",
                limits::MAX_LITERAL_RULES
            ));
        }
        let renames = (self.substr.iter())
            .chain(&self.prefix)
            .chain(&self.suffix)
            .flat_map(|r| [Some(r.from.as_str()), r.to.as_deref()]);
        let texts = (self.regex.iter())
            .flat_map(|r| [Some(r.pattern.as_str()), r.replace.as_deref()])
            .chain(renames)
            .chain(
                self.stacked
                    .iter()
                    .flat_map(|r| [Some(r.from.as_str()), Some(r.to.as_str())]),
            )
            .chain(
                self.experts
                    .iter()
                    .flat_map(|r| [Some(r.pattern.as_str()), Some(r.replace.as_str())]),
            )
            .chain([Some(self.scope.as_str())])
            .flatten();
        let tokens = (self.mistral.iter()).flat_map(|m| m.tokens.iter().flat_map(|(k, v)| [k, v]));
        if let Some(t) = texts
            .chain(tokens.map(String::as_str))
            .find(|t| t.len() > limits::MAX_RULE_TEXT)
        {
            return Err(format!(
                "a rule's text `{}…` is {} bytes; wload accepts at most {} for a pattern, \
                 replacement or name part",
                t.chars().take(40).collect::<String>(),
                t.len(),
                limits::MAX_RULE_TEXT
            ));
        }
        if let Some(m) = &self.mistral
            && m.tokens.len() > limits::MAX_LITERAL_RULES
        {
            return Err(format!(
                "{} mistral token renames; wload accepts at most {}",
                m.tokens.len(),
                limits::MAX_LITERAL_RULES
            ));
        }
        Ok(())
    }

    /// The name under which vLLM builds the module the sharded state keeps as `module`: each
    /// `alias` substr rule turned back (`self_attn.mla_attn.o_proj` → `self_attn.o_proj`).
    pub(crate) fn built_module(&self, module: &str) -> String {
        let mut name = format!("{module}.");
        for r in self.substr.iter().filter(|r| r.alias) {
            if let Some(to) = r.to.as_deref()
                && let Some(at) = name.find(to)
            {
                name.replace_range(at..at + to.len(), &r.from);
            }
        }
        name.pop();
        name
    }

    /// Compiles the regexes now, so that a pattern the regex engine refuses (one past its size
    /// limit parses but does not compile) is reported while the mapping is read. wload's own
    /// mappings and quantization rules are compiled by its tests; a `--mapping` file is checked
    /// with this.
    pub(crate) fn check_regexes(&self) -> Result<(), String> {
        if self.compiled.get().is_none() {
            let _ = self.compiled.set(Compiled::new(self)?);
        }
        Ok(())
    }

    /// The compiled regexes, compiled on first use.
    fn regexes(&self) -> &Compiled {
        self.compiled.get_or_init(|| {
            Compiled::new(self).expect(
                "every regex was checked when the mapping was read (Rules::check_regexes; \
                 the shipped mappings and quantization rules in tests)",
            )
        })
    }

    /// Maps one checkpoint name; refused when the rules grow it past [`limits::MAX_NAME_GROWTH`].
    pub(crate) fn apply(&self, name: &str) -> Result<Outcome, NameTooLong> {
        let mut target = String::new();
        Ok(match self.apply_into(name, &mut target)? {
            Outcome::Mapped(m) => Outcome::Mapped(Mapped {
                target,
                shard: m.shard,
                expert: m.expert,
                permute_heads: m.permute_heads,
                trace: m.trace,
            }),
            Outcome::Dropped { rule } => Outcome::Dropped { rule },
        })
    }

    /// Maps one checkpoint name, writing the parameter name into `target` (cleared first): the
    /// map stage reuses one buffer per thread, and most of 90,000 names then allocate nothing
    /// (consecutive tensors of a fused expert parameter share its name).
    pub(crate) fn apply_into(
        &self,
        name: &str,
        target: &mut String,
    ) -> Result<Outcome<()>, NameTooLong> {
        target.clear();
        let limit = name.len().saturating_add(limits::MAX_NAME_GROWTH);
        let too_long = |rule: String| NameTooLong {
            tensor: name.to_string(),
            rule,
            limit,
        };
        let mut trace = Trace::new();
        let mut key = std::borrow::Cow::Borrowed(name);
        let mut permute_heads = None;
        if let Some(m) = &self.mistral {
            let (k, p) = m
                .remap(&key, limit)
                .ok_or_else(|| too_long("mistral names".into()))?;
            if k != key {
                trace.push(Step::Mistral(Box::new(MistralStep {
                    from: key.to_string(),
                    to: k.clone(),
                })));
            }
            key = k.into();
            permute_heads = p;
        }
        let Some(rest) = key.strip_prefix(self.scope.as_str()) else {
            target.push_str(&key);
            return Ok(Outcome::Mapped(Mapped {
                target: (),
                shard: None,
                expert: None,
                permute_heads,
                trace,
            }));
        };
        let mut shard = None;
        // The name is built in `target` (the caller's buffer): no allocation for the names
        // a prefix rule alone renames (every name of a VLM's text model).
        if self.untouched(rest) {
            target.push_str(&key);
        } else {
            target.push_str(rest);
            let inner_limit = limit.saturating_sub(self.scope.len());
            match self.rename(target, &mut shard, &mut trace, inner_limit) {
                Err(step) => return Err(too_long(self.describe(&step))),
                Ok(Some(dropped)) => return Ok(dropped),
                Ok(None) => {}
            }
            target.insert_str(0, &self.scope);
        }
        if name.ends_with(".weight")
            && let Some(p) = trace.iter().rev().find_map(|st| match st {
                Step::Stacked(k) => self.stacked[*k].permute.as_ref(),
                _ => None,
            })
        {
            permute_heads = Some(p.src().to_string());
        }
        // The expert rule's replacement spliced in where it matched.
        let expert = match self.expert(target) {
            Some(m) => {
                target.replace_range(m.whole, &self.experts[m.rule].replace);
                shard = Some(self.expert_shards[m.rule].clone());
                let step = Step::Expert {
                    rule: m.rule,
                    id: m.id,
                };
                if target.len() > limit {
                    return Err(too_long(self.describe(&step)));
                }
                trace.push(step);
                Some(m.id)
            }
            None => None,
        };
        Ok(Outcome::Mapped(Mapped {
            target: (),
            shard,
            expert,
            permute_heads,
            trace,
        }))
    }

    /// Whether no rename rule can fire on `inner` (then [`Rules::rename`] would leave it as it
    /// is): the common case, answered without copying the name.
    fn untouched(&self, inner: &str) -> bool {
        !self.prefix.iter().any(|r| inner.starts_with(&r.from))
            && !self.suffix.iter().any(|r| inner.ends_with(&r.from))
            && self
                .any_literal
                .as_ref()
                .is_some_and(|a| !a.is_match(inner))
            && !self.any_regex_matches(inner)
    }

    /// Whether some regex rule may match `inner` (false only when none does).
    fn any_regex_matches(&self, inner: &str) -> bool {
        if let Some(endings) = &self.regex_endings
            && !endings.any_ends(inner.as_bytes())
        {
            return false;
        }
        if self.regex.is_empty() {
            return false;
        }
        (self.regexes().any_regex.as_ref()).is_none_or(|s| s.is_match(inner))
    }

    /// A step of a name's trace, as messages show it.
    pub(crate) fn describe(&self, step: &Step) -> String {
        let to = |t: &Option<String>| t.clone().unwrap_or_else(|| "null".into());
        match step {
            Step::Mistral(m) => format!("mistral names: {} → {}", m.from, m.to),
            Step::Regex(k) => {
                let r = &self.regex[*k];
                format!("regex `{}` → `{}`", r.pattern, to(&r.replace))
            }
            Step::Substr(k) => {
                let r = &self.substr[*k];
                format!("substring '{}' → '{}'", r.from, to(&r.to))
            }
            Step::Stacked(k) => {
                let r = &self.stacked[*k];
                format!("stacked '{}' → '{}' shard {}", r.from, r.to, r.shard)
            }
            Step::Prefix(k) => {
                let r = &self.prefix[*k];
                format!("prefix '{}' → '{}'", r.from, to(&r.to))
            }
            Step::Suffix(k) => {
                let r = &self.suffix[*k];
                format!("suffix '{}' → '{}'", r.from, to(&r.to))
            }
            Step::Expert { rule, id } => {
                let r = &self.experts[*rule];
                format!(
                    "expert `{}` → '{}' expert {id} shard {}",
                    r.pattern, r.replace, r.shard
                )
            }
        }
    }

    /// vLLM's rename rules in their fixed order (regex, substring, stacked, prefix, suffix) on
    /// the name inside the scope; `Some` when a rule drops the tensor, `Err` with the step that
    /// made the name longer than `limit` bytes (checked after every rule, and within a regex
    /// rule after every match, so that no more than the limit is ever built).
    fn rename(
        &self,
        inner: &mut String,
        shard: &mut Option<ShardId>,
        trace: &mut Trace,
        limit: usize,
    ) -> Result<Option<Outcome<()>>, Step> {
        let check = |inner: &String, step: Step| {
            if inner.len() > limit {
                Err(step)
            } else {
                Ok(step)
            }
        };
        // A rule fires only on what the ones before it left; if none matches the name, none fires.
        let none = !self.any_regex_matches(inner);
        for (k, (r, re)) in self
            .regex
            .iter()
            .zip(&self.regexes().regex)
            .enumerate()
            .filter(|_| !none)
        {
            if re.is_match(inner) {
                let Some(rep) = &r.replace else {
                    return Ok(Some(Outcome::Dropped {
                        rule: format!("regex `{}` → null", r.pattern),
                    }));
                };
                *inner =
                    replace_bounded(re, inner, &python_repl(rep), limit).ok_or(Step::Regex(k))?;
                trace.push(Step::Regex(k));
            }
        }
        // Substring rules, then stacked ones, in order, each on what the ones before it left:
        // the first rule from `next` on whose literal occurs fires. One search over the name
        // finds it, rather than a search per rule (a VLM's text model: 90,000 names, each
        // renamed by its prefix, against Qwen3.5's 30 literals).
        let mut next = 0;
        while let Some(k) = self.first_literal_rule(inner, next) {
            next = k + 1;
            match k.checked_sub(self.substr.len()) {
                None => {
                    let r = &self.substr[k];
                    let Some(to) = &r.to else {
                        return Ok(Some(Outcome::Dropped {
                            rule: format!("substring '{}' → null", r.from),
                        }));
                    };
                    *inner = inner.replacen(&r.from, to, 1);
                    trace.push(check(inner, Step::Substr(k))?);
                }
                Some(k) => {
                    let r = &self.stacked[k];
                    if r.under
                        .as_ref()
                        .is_some_and(|u| !inner.starts_with(u.as_str()))
                    {
                        continue;
                    }
                    *inner = inner.replacen(&r.from, &r.to, 1);
                    *shard = Some(r.shard.clone());
                    trace.push(check(inner, Step::Stacked(k))?);
                }
            }
        }
        for (k, r) in self.prefix.iter().enumerate() {
            if inner.starts_with(&r.from) {
                let Some(to) = &r.to else {
                    return Ok(Some(Outcome::Dropped {
                        rule: format!("prefix '{}' → null", r.from),
                    }));
                };
                // In place: the prefix is where it was found, and most names have one.
                inner.replace_range(..r.from.len(), to);
                trace.push(check(inner, Step::Prefix(k))?);
            }
        }
        for (k, r) in self.suffix.iter().enumerate() {
            if inner.ends_with(&r.from) {
                let Some(to) = &r.to else {
                    return Ok(Some(Outcome::Dropped {
                        rule: format!("suffix '{}' → null", r.from),
                    }));
                };
                inner.truncate(inner.len() - r.from.len());
                inner.push_str(to);
                trace.push(check(inner, Step::Suffix(k))?);
            }
        }
        Ok(None)
    }

    /// The first substring or stacked rule (substring rules numbered first) at or after `next`
    /// whose literal occurs in `inner`.
    fn first_literal_rule(&self, inner: &str, next: usize) -> Option<usize> {
        if next == 0
            && self
                .any_literal
                .as_ref()
                .is_some_and(|a| !a.is_match(inner))
        {
            return None;
        }
        match &self.literal_rules {
            Some(ac) => (ac.find_overlapping_iter(inner))
                .map(|m| m.pattern().as_usize())
                .filter(|&k| k >= next)
                .min(),
            // Rules not yet prepared (a mapping built in a test): one search per rule.
            None => (self.substr.iter().map(|r| &r.from))
                .chain(self.stacked.iter().map(|r| &r.from))
                .enumerate()
                .skip(next)
                .find_map(|(k, from)| inner.contains(from.as_str()).then_some(k)),
        }
    }

    /// The first expert rule that matches `name`: where, its expert id and which rule.
    fn expert(&self, name: &str) -> Option<ExpertMatch> {
        if let Some(literal) = self.literal_experts.as_ref().filter(|_| name.is_ascii()) {
            return literal.iter().enumerate().find_map(|(rule, m)| {
                let (whole, id) = m.find(name)?;
                let id = id.parse::<u64>().ok()?;
                Some(ExpertMatch { whole, id, rule })
            });
        }
        // The rules that match, in order; the first whose id parses fires.
        if self.experts.is_empty() {
            return None;
        }
        let compiled = self.regexes();
        let matching: Vec<usize> = match &compiled.any_expert {
            Some(set) => set.matches(name).into_iter().collect(),
            None => (0..compiled.experts.len()).collect(),
        };
        matching.into_iter().find_map(|rule| {
            let c = compiled.experts[rule].captures(name)?;
            let id = c[1].parse::<u64>().ok()?;
            let whole = c.get(0).expect("group 0 always matches").range();
            Some(ExpertMatch { whole, id, rule })
        })
    }
}

/// Where an expert rule matched a name, the expert id it captured, and the rule's index.
struct ExpertMatch {
    whole: std::ops::Range<usize>,
    id: u64,
    rule: usize,
}

/// A set of literals, searched for at once: with the vectorised (Teddy) searcher where the CPU
/// has one, which is several times faster on short names than the automaton, else with the
/// automaton.
#[derive(Debug, Clone)]
enum Literals {
    Packed(aho_corasick::packed::Searcher),
    Automaton(aho_corasick::AhoCorasick),
}

impl Literals {
    fn new<'l>(literals: impl Iterator<Item = &'l String> + Clone) -> Result<Literals, String> {
        let packed = (literals.clone().all(|l| !l.is_empty()))
            .then(|| {
                aho_corasick::packed::Config::new()
                    .builder()
                    .extend(literals.clone())
                    .build()
            })
            .flatten();
        match packed {
            Some(p) => Ok(Literals::Packed(p)),
            None => aho_corasick::AhoCorasick::new(literals)
                .map(Literals::Automaton)
                .map_err(|e| format!("substring and stacked rules: {e}")),
        }
    }

    fn is_match(&self, haystack: &str) -> bool {
        match self {
            Literals::Packed(p) => p.find(haystack).is_some(),
            Literals::Automaton(a) => a.is_match(haystack),
        }
    }
}

/// Literal endings, by their last byte: most names end in a byte none of them does, and the
/// others are compared with the few that end in theirs.
#[derive(Debug, Clone, Default)]
struct Endings {
    by_last: Vec<Vec<Vec<u8>>>,
    /// The empty ending, which every name has.
    empty: bool,
}

impl Endings {
    fn new(list: Vec<Vec<u8>>) -> Endings {
        let mut e = Endings {
            by_last: vec![Vec::new(); 256],
            empty: false,
        };
        for l in list {
            match l.last() {
                Some(&b) => e.by_last[usize::from(b)].push(l),
                None => e.empty = true,
            }
        }
        e
    }

    fn any_ends(&self, name: &[u8]) -> bool {
        self.empty
            || name.last().is_some_and(|&b| {
                self.by_last[usize::from(b)]
                    .iter()
                    .any(|e| name.ends_with(e))
            })
    }
}

/// `p` parsed as the regex engine will parse it, or why it does not parse.
fn parse_regex(p: &str) -> Result<regex_syntax::hir::Hir, String> {
    regex_syntax::Parser::new()
        .parse(p)
        .map_err(|e| format!("bad regex `{p}`: {e}"))
}

/// The endings a name needs for any of the parsed patterns to match, when every one is anchored
/// at the end (`$`) and has a finite set of literal endings (regex-syntax's suffix extraction,
/// which the regex engine itself uses to pre-filter); `None` when a pattern has neither.
fn required_endings(patterns: &[regex_syntax::hir::Hir]) -> Option<Vec<Vec<u8>>> {
    use regex_syntax::hir::Look;
    use regex_syntax::hir::literal::{ExtractKind, Extractor};
    let mut endings = Vec::new();
    for hir in patterns {
        if !hir.properties().look_set_suffix().contains(Look::End) {
            return None;
        }
        let mut ex = Extractor::new();
        ex.kind(ExtractKind::Suffix);
        let seq = ex.extract(hir);
        endings.extend(seq.literals()?.iter().map(|l| l.as_bytes().to_vec()));
    }
    Some(endings)
}

/// An expert rule of the form `prefix(\d+)suffix` with literal ends (every rule wload ships),
/// matched without the regex engine: on an ASCII name, where `\d` is `[0-9]`, the regex's
/// leftmost match is the first occurrence of `prefix` followed by digits and then `suffix`; a
/// suffix that does not start with a digit leaves the greedy digit run no other choice.
#[derive(Debug, Clone)]
struct LiteralExpert {
    /// The prefix's searcher, built once: a `str::find` builds one per call, which cost more
    /// than the search on 90,000 short names.
    prefix: memchr::memmem::Finder<'static>,
    suffix: String,
}

impl LiteralExpert {
    /// `None` unless `pattern` is plain letters, digits, `_` and escaped dots around exactly one
    /// `(\d+)`, and the suffix does not start with a digit.
    fn parse(pattern: &str) -> Option<LiteralExpert> {
        let (prefix, suffix) = pattern.split_once(r"(\d+)")?;
        let unescape = |p: &str| -> Option<String> {
            let mut out = String::new();
            let mut chars = p.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' if chars.next()? == '.' => out.push('.'),
                    c if c.is_ascii_alphanumeric() || c == '_' => out.push(c),
                    _ => return None,
                }
            }
            Some(out)
        };
        let (prefix, suffix) = (unescape(prefix)?, unescape(suffix)?);
        if suffix.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        Some(LiteralExpert {
            prefix: memchr::memmem::Finder::new(prefix.as_bytes()).into_owned(),
            suffix,
        })
    }

    /// The whole match and the digits, in `name` (ASCII).
    fn find<'n>(&self, name: &'n str) -> Option<(std::ops::Range<usize>, &'n str)> {
        let bytes = name.as_bytes();
        let prefix_len = self.prefix.needle().len();
        let mut from = 0;
        while let Some(at) = self.prefix.find(bytes.get(from..)?) {
            let start = from + at;
            let digits_at = start + prefix_len;
            let run = bytes[digits_at..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            let end = digits_at + run;
            if run > 0 && bytes[end..].starts_with(self.suffix.as_bytes()) {
                return Some((start..end + self.suffix.len(), &name[digits_at..end]));
            }
            // An empty prefix matches everywhere: step over one character.
            from = start + 1;
        }
        None
    }
}

/// `re.sub(pattern, template, hay)`, or `None` as soon as the result is longer than `limit`
/// bytes: a rule such as `(.)` → `\1\1\1\1` must be refused before it builds a huge name, not
/// after.
fn replace_bounded(re: &Regex, hay: &str, template: &str, limit: usize) -> Option<String> {
    let mut out = String::new();
    let mut last = 0;
    for caps in re.captures_iter(hay) {
        let whole = caps.get(0)?;
        out.push_str(&hay[last..whole.start()]);
        caps.expand(template, &mut out);
        last = whole.end();
        if out.len() > limit {
            return None;
        }
    }
    out.push_str(&hay[last..]);
    (out.len() <= limit).then_some(out)
}

/// `\1` / `\g<name>` (Python) → `${1}` / `${name}` (regex crate).
fn python_repl(rep: &str) -> String {
    let mut out = String::new();
    let mut chars = rep.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek().is_some_and(char::is_ascii_digit) => {
                let mut n = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    n.push(*d);
                    chars.next();
                }
                out.push_str(&format!("${{{n}}}"));
            }
            '\\' if chars.peek() == Some(&'g') => {
                chars.next();
                if chars.peek() == Some(&'<') {
                    chars.next();
                    let n: String = chars.by_ref().take_while(|&c| c != '>').collect();
                    out.push_str(&format!("${{{n}}}"));
                }
            }
            '$' => out.push_str("$$"),
            c => out.push(c),
        }
    }
    out
}

impl MistralRemap {
    /// vLLM's `maybe_remap_mistral` (models/mistral.py): token-wise renames with `str.replace`
    /// semantics, and which permutation (if any) the tensor needs; `None` when the name grows
    /// past `limit` bytes (every occurrence is replaced, once per module of the name: a token
    /// that contains itself doubles a long name again and again).
    fn remap(&self, name: &str, limit: usize) -> Option<(String, Option<String>)> {
        let modules: Vec<&str> = name.split('.').collect();
        let last = modules.last().copied();
        let permute = self
            .permute
            .iter()
            .find(|p| modules.contains(&p.token.as_str()) && last == Some("weight"))
            .map(|p| p.heads.src().to_string());
        let mut out = name.to_string();
        for i in 0..modules.len() {
            let item = modules[i];
            let combined = modules.get(i + 1).map(|n| format!("{item}.{n}"));
            if let Some(c) = combined.as_deref()
                && let Some(to) = self.tokens.get(c)
            {
                out = out.replace(c, to);
            } else if let Some(to) = self.tokens.get(item)
                && !out.contains(to.as_str())
            {
                out = out.replace(item, to);
            }
            if out.len() > limit {
                return None;
            }
        }
        Some((out, permute))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(yaml: &str) -> Rules {
        let mut r: Rules = serde_saphyr::from_str(yaml).unwrap();
        r.compile().unwrap();
        r
    }

    #[test]
    fn stacked_rules_set_the_shard_and_later_ones_override() {
        let r = rules(
            "scope: model.\nstacked:\n  - {from: .q_proj, to: .qkv_proj, shard: q}\n  - {from: .gate_proj, to: .gate_up_proj, shard: 0}\n",
        );
        let Ok(Outcome::Mapped(m)) = r.apply("model.layers.0.self_attn.q_proj.weight") else {
            panic!()
        };
        assert_eq!(m.target, "model.layers.0.self_attn.qkv_proj.weight");
        assert_eq!(m.shard, Some(ShardId::Name("q".into())));
        let Ok(Outcome::Mapped(m)) = r.apply("model.layers.0.mlp.gate_proj.weight") else {
            panic!()
        };
        assert_eq!(m.shard, Some(ShardId::Index(0)));
        // Outside the scope nothing applies.
        let Ok(Outcome::Mapped(m)) = r.apply("lm_head.weight") else {
            panic!()
        };
        assert_eq!(m.target, "lm_head.weight");
    }

    /// A rule `under` a prefix leaves the other names to the rules after it: Llama 4 permutes
    /// its text model's q rows at load, never its vision model's.
    #[test]
    fn a_stacked_rule_under_a_prefix_fires_only_there() {
        let r = rules(
            "stacked:\n  - {from: .q_proj, to: .qkv_proj, shard: q, permute: heads, under: text.}\n  - {from: .q_proj, to: .qkv_proj, shard: q}\n",
        );
        let Ok(Outcome::Mapped(t)) = r.apply("text.layers.0.q_proj.weight") else {
            panic!()
        };
        assert_eq!(t.target, "text.layers.0.qkv_proj.weight");
        assert_eq!(t.permute_heads.as_deref(), Some("heads"));
        let Ok(Outcome::Mapped(v)) = r.apply("vision.layers.0.q_proj.weight") else {
            panic!()
        };
        assert_eq!(v.target, "vision.layers.0.qkv_proj.weight");
        assert_eq!(v.shard, Some(ShardId::Name("q".into())));
        assert_eq!(v.permute_heads, None);
    }

    #[test]
    fn null_drops_and_regex_uses_python_groups() {
        let r = rules(
            "regex:\n  - {pattern: '^a\\.(\\d+)\\.b$', replace: 'x.\\1.y'}\nsubstr:\n  - {from: rotary_emb.inv_freq, to: null}\n",
        );
        assert!(matches!(
            r.apply("l.rotary_emb.inv_freq"),
            Ok(Outcome::Dropped { .. })
        ));
        let Ok(Outcome::Mapped(m)) = r.apply("a.12.b") else {
            panic!()
        };
        assert_eq!(m.target, "x.12.y");
    }

    #[test]
    fn mistral_tokens_follow_vllm() {
        let r = rules(
            "mistral:\n  tokens: {layers: model.layers, attention: self_attn, wq: q_proj, norm: model.norm, attention_norm: input_layernorm, tok_embeddings: model.embed_tokens, output: lm_head}\n  permute:\n    - {token: wq, heads: num_attention_heads}\n",
        );
        let cases = [
            (
                "layers.0.attention.wq.weight",
                "model.layers.0.self_attn.q_proj.weight",
            ),
            (
                "layers.3.attention_norm.weight",
                "model.layers.3.input_layernorm.weight",
            ),
            ("norm.weight", "model.norm.weight"),
            ("tok_embeddings.weight", "model.embed_tokens.weight"),
            ("output.weight", "lm_head.weight"),
            (
                "model.layers.0.self_attn.q_proj.weight",
                "model.layers.0.self_attn.q_proj.weight",
            ),
            ("model.norm.weight", "model.norm.weight"),
        ];
        for (from, to) in cases {
            let Ok(Outcome::Mapped(m)) = r.apply(from) else {
                panic!()
            };
            assert_eq!(m.target, to, "{from}");
        }
        let Ok(Outcome::Mapped(m)) = r.apply("layers.0.attention.wq.weight") else {
            panic!()
        };
        assert_eq!(m.permute_heads.as_deref(), Some("num_attention_heads"));
    }

    #[test]
    fn experts_capture_the_id() {
        let r = rules(
            "experts:\n  - {pattern: 'experts\\.(\\d+)\\.w1\\.', replace: experts.routed_experts.w13_, shard: w1}\n",
        );
        let Ok(Outcome::Mapped(m)) = r.apply("model.layers.0.block_sparse_moe.experts.3.w1.weight")
        else {
            panic!()
        };
        assert_eq!(
            m.target,
            "model.layers.0.block_sparse_moe.experts.routed_experts.w13_weight"
        );
        assert_eq!(m.expert, Some(3));
        assert_eq!(m.shard, Some(ShardId::Name("w1".into())));
    }

    /// The literal matcher finds what the regex finds (match, id), on names built to trip it:
    /// overlapping prefixes, digit runs that stop short of the suffix, several candidates.
    /// The endings pre-filter may only rule out names no regex rule matches; the quantization
    /// rules (kv-cache scales, FP8's output scales) must take the fast path.
    #[test]
    fn a_name_without_a_required_ending_matches_no_regex_rule() {
        let fp8 = crate::quant::Quantization::from_config(Some(&serde_json::json!({
            "quant_method": "fp8", "activation_scheme": "static"
        })))
        .expect("fp8 config")
        .expect("quantized");
        let (quant, _) = fp8.name_rules();
        let quant: Vec<&str> = quant.regex.iter().map(|r| r.pattern.as_str()).collect();
        let endings_of = |patterns: &[&str]| {
            let parsed: Vec<_> = (patterns.iter())
                .map(|p| parse_regex(p).expect("parses"))
                .collect();
            required_endings(&parsed)
        };
        assert!(endings_of(&quant).is_some());
        let names = [
            "model.layers.0.self_attn.k_proj.k_scale",
            "model.layers.0.self_attn.attn.k_scale",
            "model.layers.0.self_attn.k_scale",
            "k_scale",
            ".k_scale",
            "attn.v_scale",
            "xattn.q_scale",
            "model.layers.1.self_attn.k_cache.scale",
            "model.layers.1.self_attn.q.scale",
            "model.layers.1.mixer.k_proj.k_scale",
            "model.layers.2.self_attn.v_proj.output_scale",
            "model.layers.2.self_attn.prob_output_scale",
            "model.layers.2.mlp.down_proj.g_idx",
            "model.layers.2.mlp.down_proj.g_idxx",
            "model.layers.3.mlp.experts.17.gate_proj.weight_scale_inv",
            "model.layers.3.self_attn.k_zero_point",
            "k_scale\n",
            "ä.k_scale",
            "",
        ];
        let extra = [r"foo$", r"(?i)\.BAR$", r"(a|bc)\.x$", r"z\.[0-9]$"];
        for patterns in [quant.clone(), [quant.clone(), extra.to_vec()].concat()] {
            let endings = Endings::new(endings_of(&patterns).expect("anchored"));
            let set = RegexSet::new(&patterns).expect("regexes");
            for n in names
                .iter()
                .copied()
                .chain(["a.foo", "x.bar", "bc.x", "z.7"])
            {
                if set.is_match(n) {
                    assert!(
                        endings.any_ends(n.as_bytes()),
                        "{n:?} matches but has none of the endings"
                    );
                }
            }
        }
        // Not anchored, or no literal ending: no pre-filter.
        assert!(endings_of(&[r"\.k_scale"]).is_none());
        assert!(endings_of(&[r"x.*$"]).is_none());
    }

    #[test]
    fn literal_expert_rules_match_as_the_regex_does() {
        let patterns = [
            r"experts\.(\d+)\.gate_proj\.",
            r"experts\.(\d+)\.",
            r"(\d+)\.w2",
            r"mlp\.experts\.(\d+)",
            r"ee(\d+)_x",
        ];
        let names = [
            "model.layers.3.mlp.experts.17.gate_proj.weight",
            "model.layers.3.mlp.experts.17.up_proj.weight",
            "experts.x.experts.5.gate_proj.experts.6.gate_proj.",
            "experts.12a.experts.34.gate_proj.",
            "experts..gate_proj.experts.007.gate_proj.w",
            "a.1.w2.b.22.w2",
            "eee12_x eee3_x",
            "mlp.experts.99999999999999999999999.w1",
            "experts.1.gate_proj",
            "",
        ];
        for p in patterns {
            let m = LiteralExpert::parse(p).expect("a literal pattern");
            let re = Regex::new(p).expect("regex");
            for n in names {
                let want = re
                    .captures(n)
                    .map(|c| (c.get(0).expect("whole").range(), c[1].to_string()));
                let got = m.find(n).map(|(r, d)| (r, d.to_string()));
                assert_eq!(got, want, "{p} on {n:?}");
            }
        }
        for p in [
            r"experts\.(\d+)\.(w1)",
            r"x(\d+)1",
            r"a.(\d+)",
            r"(?i)a(\d+)",
            r"a\d(\d+)",
        ] {
            assert!(LiteralExpert::parse(p).is_none(), "{p}");
        }
    }

    /// Rules that lengthen a name on every application are refused at the limit, naming the
    /// rule, whichever kind of rule does it; and a regex rule never builds more than the limit.
    #[test]
    fn rules_that_grow_names_are_stopped_at_the_limit() {
        let doubling = (0..20)
            .map(|_| "  - {pattern: '^(.*)$', replace: '\\1\\1'}\n")
            .collect::<String>();
        let cases = [
            (format!("regex:\n{doubling}"), "regex `^(.*)$`"),
            (
                format!(
                    "regex:\n  - {{pattern: '(.)', replace: '{}'}}\n",
                    "\\1".repeat(40)
                ),
                "regex `(.)`",
            ),
            (
                format!(
                    "suffix:\n{}",
                    (0..1000)
                        .map(|k| format!(
                            "  - {{from: 'x{k}', to: '{}x{}'}}\n",
                            "y".repeat(900),
                            k + 1
                        ))
                        .collect::<String>()
                ),
                "suffix 'x",
            ),
            (
                "mistral:\n  tokens: {'a.a': 'a.a.a.a'}\n".into(),
                "mistral names",
            ),
        ];
        let name = ["a"; 64].join(".") + ".x0";
        for (yaml, rule) in cases {
            let r = rules(&yaml);
            let t = std::time::Instant::now();
            let e = r.apply(&name).expect_err("refused");
            assert!(t.elapsed().as_secs() < 2, "{rule}: took {:?}", t.elapsed());
            assert_eq!(e.limit, name.len() + limits::MAX_NAME_GROWTH);
            assert!(e.rule.starts_with(rule), "{} is not {rule}", e.rule);
            assert!(e.to_string().contains("longer than"), "{e}");
        }
        // Ordinary renames are far inside the limit.
        let r = rules("regex:\n  - {pattern: '^(.*)$', replace: '\\1\\1'}\n");
        assert!(matches!(r.apply("ab"), Ok(Outcome::Mapped(m)) if m.target == "abab"));
    }

    #[test]
    fn too_many_or_too_long_rules_are_refused_naming_the_limit() {
        let many = (0..=limits::MAX_REGEX_RULES)
            .map(|k| format!("  - {{pattern: 'a{k}$', replace: b}}\n"))
            .collect::<String>();
        let mut r: Rules = serde_saphyr::from_str(&format!("regex:\n{many}")).unwrap();
        let e = r.compile().unwrap_err();
        assert!(e.contains("at most 256"), "{e}");
        let long = format!("substr:\n  - {{from: a, to: '{}'}}\n", "b".repeat(2000));
        let mut r: Rules = serde_saphyr::from_str(&long).unwrap();
        let e = r.compile().unwrap_err();
        assert!(
            e.contains("2000 bytes") && e.contains("at most 1024"),
            "{e}"
        );
        // A regex that compiles past the size limit is refused by name.
        let mut r: Rules =
            serde_saphyr::from_str("regex:\n  - {pattern: '\\w{1000}\\w{1000}', replace: b}\n")
                .unwrap();
        r.compile().unwrap();
        let e = r.check_regexes().unwrap_err();
        assert!(e.contains("the limit for one rule"), "{e}");
    }
}
