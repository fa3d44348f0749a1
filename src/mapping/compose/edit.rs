//! Parameter lists edited by name. An entry of a file's `head`, `layer` or `tail` list adds a
//! parameter or changes the inherited one of that name (`name:`), inserts a block (`use:`), or
//! removes a parameter or every parameter a block brought (`remove:`); `after:` and `before:` say
//! where new entries go.

use std::collections::HashMap;

use indexmap::IndexMap;
use serde::Deserialize;

use crate::mapping::limits::MAX_PARAMS_PER_LIST;
use crate::mapping::{Compute, Expr, Layout, ParamSpec, QuantRole, Tied};

/// One entry of a parameter list or block, as written; [`classify`] says which kind it is.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Entry {
    name: Option<String>,
    #[serde(rename = "use")]
    block: Option<String>,
    remove: Option<String>,
    after: Option<String>,
    before: Option<String>,
    #[serde(default)]
    with: IndexMap<String, String>,
    when: Option<Expr>,
    layout: Option<Layout>,
    dtype: Option<String>,
    buffer: Option<bool>,
    fill: Option<f64>,
    optional: Option<bool>,
    tied_to: Option<Tied>,
    pp_stage: Option<Expr>,
    quant: Option<QuantRole>,
    repeat: Option<Expr>,
    whole: Option<Expr>,
    compute: Option<Compute>,
}

/// A parameter in a list being composed, with the block that brought it, so that later files can
/// place entries around the block or remove it whole.
pub(super) struct Placed {
    pub(super) spec: ParamSpec,
    block: Option<String>,
}

enum Edit {
    Remove(String),
    Use {
        block: String,
        with: IndexMap<String, String>,
        when: Option<Expr>,
        at: Pos,
    },
    Param {
        entry: Box<Entry>,
        at: Pos,
    },
}

enum Pos {
    End,
    After(String),
    Before(String),
}

impl Entry {
    fn has_spec_fields(&self) -> bool {
        self.layout.is_some()
            || self.dtype.is_some()
            || self.buffer.is_some()
            || self.fill.is_some()
            || self.optional.is_some()
            || self.tied_to.is_some()
            || self.pp_stage.is_some()
            || self.quant.is_some()
            || self.repeat.is_some()
            || self.whole.is_some()
            || self.compute.is_some()
    }

    /// How messages name the entry.
    fn label(&self) -> String {
        match (&self.name, &self.block, &self.remove) {
            (Some(n), _, _) => n.clone(),
            (None, Some(b), _) => format!("use: {b}"),
            (None, None, Some(r)) => format!("remove: {r}"),
            _ => "an entry without `name`, `use` or `remove`".into(),
        }
    }

    /// A parameter written out in full.
    fn into_spec(self) -> Result<ParamSpec, String> {
        let name = self.name.ok_or("a parameter needs a `name`")?;
        let layout = self
            .layout
            .ok_or_else(|| format!("{name}: a new parameter needs a `layout`"))?;
        Ok(ParamSpec {
            name,
            when: self.when,
            layout,
            dtype: self.dtype.unwrap_or_else(|| "model".into()),
            buffer: self.buffer.unwrap_or(false),
            fill: self.fill,
            optional: self.optional.unwrap_or(false),
            tied_to: self.tied_to,
            pp_stage: self.pp_stage,
            quant: self.quant,
            repeat: self.repeat,
            whole: self.whole,
            compute: self.compute,
        })
    }

    /// Changes the fields this entry states, each replaced whole; the rest stay as inherited.
    fn override_spec(self, spec: &mut ParamSpec) {
        fn set<T>(slot: &mut T, v: Option<T>) {
            if let Some(v) = v {
                *slot = v;
            }
        }
        if self.when.is_some() {
            spec.when = self.when;
        }
        set(&mut spec.layout, self.layout);
        set(&mut spec.dtype, self.dtype);
        set(&mut spec.buffer, self.buffer);
        if self.fill.is_some() {
            spec.fill = self.fill;
        }
        set(&mut spec.optional, self.optional);
        if self.tied_to.is_some() {
            spec.tied_to = self.tied_to;
        }
        if self.pp_stage.is_some() {
            spec.pp_stage = self.pp_stage;
        }
        if self.quant.is_some() {
            spec.quant = self.quant;
        }
        if self.repeat.is_some() {
            spec.repeat = self.repeat;
        }
        if self.whole.is_some() {
            spec.whole = self.whole;
        }
        if self.compute.is_some() {
            spec.compute = self.compute;
        }
    }
}

/// What kind of entry `e` is, refusing mixtures (`name` with `use`, `remove` with anything).
fn classify(mut e: Entry) -> Result<Edit, String> {
    let label = e.label();
    let kinds = [e.name.is_some(), e.block.is_some(), e.remove.is_some()];
    if kinds.iter().filter(|k| **k).count() != 1 {
        return Err(format!(
            "{label}: each entry is a parameter (`name`), a block (`use`) or a removal (`remove`), exactly one of them"
        ));
    }
    let at = match (e.after.take(), e.before.take()) {
        (Some(_), Some(_)) => return Err(format!("{label}: `after` and `before` together")),
        (Some(a), None) => Pos::After(a),
        (None, Some(b)) => Pos::Before(b),
        (None, None) => Pos::End,
    };
    if let Some(r) = e.remove.take() {
        if !matches!(at, Pos::End) || !e.with.is_empty() || e.when.is_some() || e.has_spec_fields()
        {
            return Err(format!("{label}: `remove` stands alone"));
        }
        return Ok(Edit::Remove(r));
    }
    if let Some(block) = e.block.take() {
        if e.has_spec_fields() {
            return Err(format!(
                "{label}: a `use` entry takes only `with`, `when`, `after` or `before`; change a parameter of the block with its own `name:` entry"
            ));
        }
        return Ok(Edit::Use {
            block,
            with: e.with,
            when: e.when,
            at,
        });
    }
    if !e.with.is_empty() {
        return Err(format!("{label}: `with` goes with `use`"));
    }
    Ok(Edit::Param {
        entry: Box::new(e),
        at,
    })
}

/// A block's entries: parameters written out in full, nothing else.
pub(super) fn define_block(name: &str, entries: Vec<Entry>) -> Result<Vec<ParamSpec>, String> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "blocks: '{name}': a block name is letters, digits and `_` (so it never reads as a parameter name)"
        ));
    }
    within_limit(entries.len(), &format!("blocks: {name}"))?;
    entries
        .into_iter()
        .map(|e| match classify(e)? {
            Edit::Param {
                entry,
                at: Pos::End,
            } => entry.into_spec(),
            _ => Err(format!(
                "blocks: {name}: a block lists parameters (`name` and `layout`), without `use`, `remove`, `after` or `before`"
            )),
        })
        .map(|r| r.map_err(|e| format!("blocks: {name}: {e}")))
        .collect()
}

/// Applies a file's entries for one list (`section`) to the inherited `list`.
pub(super) fn apply(
    list: &mut Vec<Placed>,
    entries: Vec<Entry>,
    section: &str,
    blocks: &IndexMap<String, Vec<ParamSpec>>,
) -> Result<(), String> {
    // Entries placed after the same anchor keep the order they are written in: the last one
    // placed there is where the next one goes.
    let mut last_after: HashMap<String, String> = HashMap::new();
    for e in entries {
        let label = e.label();
        let context = |m: String| format!("parameters.{section}: {label}: {m}");
        match classify(e).map_err(|m| format!("parameters.{section}: {m}"))? {
            Edit::Remove(what) => remove(list, &what).map_err(context)?,
            Edit::Use {
                block,
                with,
                when,
                at,
            } => {
                let items = expand(blocks, &block, &with, when.as_ref()).map_err(context)?;
                within_limit(list.len() + items.len(), &format!("parameters.{section}"))?;
                if let Some(dup) = items
                    .iter()
                    .find(|p| index_of(list, &p.spec.name).is_some())
                {
                    return Err(context(format!(
                        "{} is already in the list; remove it first, or change it by name",
                        dup.spec.name
                    )));
                }
                insert(list, items, &at, &mut last_after).map_err(context)?;
            }
            Edit::Param { entry, at } => {
                let name = entry.name.clone().unwrap_or_default();
                match index_of(list, &name) {
                    Some(i) => {
                        let mut placed = list.remove(i);
                        entry.override_spec(&mut placed.spec);
                        // Unmoved unless it says where to: put it back first.
                        let at = match at {
                            Pos::End => {
                                list.insert(i, placed);
                                continue;
                            }
                            at => at,
                        };
                        insert(list, vec![placed], &at, &mut last_after).map_err(context)?;
                    }
                    None => {
                        within_limit(list.len() + 1, &format!("parameters.{section}"))?;
                        let placed = Placed {
                            spec: entry.into_spec().map_err(context)?,
                            block: None,
                        };
                        insert(list, vec![placed], &at, &mut last_after).map_err(context)?;
                    }
                }
            }
        }
    }
    check_placeholders(list).map_err(|m| format!("parameters.{section}: {m}"))
}

/// A list of `len` parameters is within [`MAX_PARAMS_PER_LIST`]: each is instantiated for every
/// layer, and `use` of a large block with many `with` values multiplies a few lines into millions.
fn within_limit(len: usize, place: &str) -> Result<(), String> {
    if len > MAX_PARAMS_PER_LIST {
        return Err(format!(
            "{place}: more than {MAX_PARAMS_PER_LIST} parameters, the most a list may \
             hold (vLLM's largest layers have about 60)"
        ));
    }
    Ok(())
}

fn index_of(list: &[Placed], name: &str) -> Option<usize> {
    list.iter().position(|p| p.spec.name == name)
}

/// Where the parameter or the block `anchor` sits in the list: `[first, last + 1)`.
fn span(list: &[Placed], anchor: &str) -> Result<(usize, usize), String> {
    if let Some(i) = index_of(list, anchor) {
        return Ok((i, i + 1));
    }
    let mut tagged = list
        .iter()
        .enumerate()
        .filter(|(_, p)| p.block.as_deref() == Some(anchor))
        .map(|(i, _)| i);
    let first = tagged
        .next()
        .ok_or_else(|| format!("no parameter or block named '{anchor}' in the list"))?;
    let last = tagged.next_back().unwrap_or(first);
    Ok((first, last + 1))
}

fn insert(
    list: &mut Vec<Placed>,
    items: Vec<Placed>,
    at: &Pos,
    last_after: &mut HashMap<String, String>,
) -> Result<(), String> {
    let index = match at {
        Pos::End => list.len(),
        Pos::Before(anchor) => span(list, anchor)?.0,
        Pos::After(anchor) => match last_after.get(anchor).and_then(|n| index_of(list, n)) {
            Some(i) => i + 1,
            None => span(list, anchor)?.1,
        },
    };
    if let (Pos::After(anchor), Some(last)) = (at, items.last()) {
        last_after.insert(anchor.clone(), last.spec.name.clone());
    }
    list.splice(index..index, items);
    Ok(())
}

fn remove(list: &mut Vec<Placed>, what: &str) -> Result<(), String> {
    let before = list.len();
    list.retain(|p| p.spec.name != what);
    if list.len() == before {
        list.retain(|p| p.block.as_deref() != Some(what));
    }
    if list.len() == before {
        return Err(format!("no parameter or block named '{what}' in the list"));
    }
    Ok(())
}

/// The block's parameters, with `with` written into their names and `when` added to theirs.
fn expand(
    blocks: &IndexMap<String, Vec<ParamSpec>>,
    block: &str,
    with: &IndexMap<String, String>,
    when: Option<&Expr>,
) -> Result<Vec<Placed>, String> {
    let specs = blocks.get(block).ok_or_else(|| {
        let known: Vec<&str> = blocks.keys().map(String::as_str).collect();
        format!("no block named '{block}' (blocks: {})", known.join(", "))
    })?;
    for key in with.keys() {
        let hole = format!("{{{key}}}");
        let used = specs.iter().any(|s| {
            s.name.contains(&hole) || s.tied_to.as_ref().is_some_and(|t| t.param.contains(&hole))
        });
        if key == "i" || !used {
            return Err(format!(
                "`with: {{{key}: …}}`: the block's names have no `{hole}` to fill"
            ));
        }
    }
    let fill = |s: &str| {
        with.iter()
            .fold(s.to_string(), |s, (k, v)| s.replace(&format!("{{{k}}}"), v))
    };
    specs
        .iter()
        .map(|s| {
            let mut s = s.clone();
            s.name = fill(&s.name);
            if let Some(t) = &mut s.tied_to {
                t.param = fill(&t.param);
            }
            if let Some(w) = when {
                s.when = Some(match &s.when {
                    None => w.clone(),
                    Some(own) => Expr::parse(&format!("({}) && ({})", w.src(), own.src()))
                        .map_err(|e| format!("`when: {w}` with {}'s own `{own}`: {e}", s.name))?,
                });
            }
            Ok(Placed {
                spec: s,
                block: Some(block.to_string()),
            })
        })
        .collect()
}

/// `{i}` (a layer) and, in a `repeat` parameter, `{j}` are the only placeholders left for the
/// planner; any other is a `with:` that was not given.
fn check_placeholders(list: &[Placed]) -> Result<(), String> {
    for p in list {
        let names = std::iter::once(&p.spec.name).chain(p.spec.tied_to.as_ref().map(|t| &t.param));
        for name in names {
            let mut rest = name.as_str();
            while let Some(open) = rest.find('{') {
                let Some(len) = rest[open..].find('}') else {
                    break;
                };
                let hole = &rest[open..=open + len];
                if hole != "{i}" && !(hole == "{j}" && p.spec.repeat.is_some()) {
                    let fix = match &p.block {
                        Some(b) => format!("give it with `use: {b}, with: {{…}}`"),
                        None => "only `{i}` (the layer index) is filled in".into(),
                    };
                    return Err(format!("{name}: `{hole}` is not filled in; {fix}"));
                }
                rest = &rest[open + len + 1..];
            }
        }
    }
    Ok(())
}
