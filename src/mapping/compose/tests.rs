//! Composition: edits by name, blocks, checks and header fields, as a file's author meets them.

use super::resolve;
use crate::mapping::{Mapping, embedded};

fn names(list: &[crate::mapping::ParamSpec]) -> Vec<&str> {
    list.iter().map(|s| s.name.as_str()).collect()
}

fn layer(m: &Mapping) -> Vec<&str> {
    names(&m.parameters.layer)
}

fn llama() -> Mapping {
    embedded()
        .into_iter()
        .find(|m| m.family == "llama")
        .unwrap()
}

pub(super) fn child(body: &str) -> Result<Mapping, String> {
    let text = format!("extends: llama\nfamily: t\narchitectures: [T]\n{body}");
    resolve("t.yaml", &text).map_err(|e| e.to_string())
}

const SCALE: &str = "model.layers.{i}.self_attn.attn._prob_scale";

#[test]
fn a_new_parameter_goes_after_its_anchor_and_entries_keep_their_order() {
    let m = child(
        "parameters:\n  layer:\n    - {name: a, after: attention_scales, layout: {kind: replicated, shape: []}}\n    - {name: b, after: attention_scales, layout: {kind: replicated, shape: []}}\n    - {name: c, before: dense_mlp, layout: {kind: replicated, shape: []}}\n    - {name: z, layout: {kind: replicated, shape: []}}\n",
    )
    .unwrap();
    let l = layer(&m);
    let at = l.iter().position(|n| *n == SCALE).unwrap();
    assert_eq!(&l[at + 1..at + 4], ["a", "b", "c"]);
    assert_eq!(l[at + 4], "model.layers.{i}.mlp.gate_up_proj.weight");
    assert_eq!(l.last(), Some(&"z"));
    assert_eq!(l.len(), layer(&llama()).len() + 4);
}

#[test]
fn a_named_entry_changes_only_the_fields_it_states_and_stays_in_place() {
    let m = child(
        "parameters:\n  layer:\n    - {name: \"model.layers.{i}.mlp.down_proj.weight\", when: \"i > 0\"}\n",
    )
    .unwrap();
    assert_eq!(layer(&m), layer(&llama()));
    let down = m
        .parameters
        .layer
        .iter()
        .find(|s| s.name.ends_with("down_proj.weight"))
        .unwrap();
    assert_eq!(down.when.as_ref().unwrap().src(), "i > 0");
    assert!(matches!(down.layout, crate::mapping::Layout::Row(_)));
}

#[test]
fn a_moved_entry_goes_where_it_says() {
    let m = child(
        "parameters:\n  layer:\n    - {name: \"model.layers.{i}.input_layernorm.weight\", before: attention}\n",
    )
    .unwrap();
    assert_eq!(layer(&m)[0], "model.layers.{i}.input_layernorm.weight");
    assert_eq!(layer(&m).len(), layer(&llama()).len());
}

#[test]
fn remove_takes_a_parameter_or_a_whole_block() {
    let m = child(
        "parameters:\n  layer:\n    - remove: dense_mlp\n  tail:\n    - remove: lm_head.weight\n",
    )
    .unwrap();
    assert!(!layer(&m).iter().any(|n| n.contains(".mlp.")));
    assert_eq!(layer(&m).len(), layer(&llama()).len() - 4);
    assert_eq!(names(&m.parameters.tail), ["model.norm.weight"]);
}

#[test]
fn checks_are_inherited_replaced_by_rule_and_removed() {
    let parent = llama();
    let heads = parent.checks[0].rule.src().to_string();
    let kv = parent.checks[1].rule.src().to_string();
    let m = child(&format!(
        "checks:\n  - {{rule: \"{heads}\", message: other words}}\n  - {{rule: \"tp < 9\", message: small}}\n"
    ))
    .unwrap();
    let rules: Vec<&str> = m.checks.iter().map(|c| c.rule.src()).collect();
    assert_eq!(rules, [heads.as_str(), kv.as_str(), "tp < 9"]);
    assert_eq!(m.checks[0].message, "other words");
    let m = child(&format!("checks:\n  - remove: \"{kv}\"\n")).unwrap();
    assert_eq!(m.checks.len(), 1);
    let e = child("checks:\n  - remove: \"tp > 1\"\n").unwrap_err();
    assert!(
        e.contains("tp > 1") && e.contains("no inherited check"),
        "{e}"
    );
}

#[test]
fn a_block_fills_its_placeholders_and_adds_its_when() {
    let m = child(
        "parameters:\n  layer:\n    - remove: dense_mlp\n    - {use: routed_experts, with: {moe: feed}, when: \"i > 0\", after: attention_scales}\n",
    )
    .unwrap();
    let gate = m
        .parameters
        .layer
        .iter()
        .find(|s| s.name == "model.layers.{i}.feed.gate.weight")
        .unwrap();
    assert_eq!(gate.when.as_ref().unwrap().src(), "i > 0");
    // The block's own `when` and the entry's both hold.
    let m = child(
        "parameters:\n  layer:\n    - remove: dense_mlp\n    - {use: dense_mlp, when: \"i > 0\"}\n",
    )
    .unwrap();
    let bias = m
        .parameters
        .layer
        .iter()
        .find(|s| s.name.ends_with("down_proj.bias"))
        .unwrap();
    assert_eq!(bias.when.as_ref().unwrap().src(), "(i > 0) && (mlp_bias)");
}

#[test]
fn mistakes_in_edits_are_named() {
    let cases = [
        (
            "parameters:\n  layer:\n    - remove: nothing_here\n",
            "nothing_here",
        ),
        (
            "parameters:\n  layer:\n    - {use: no_such_block}\n",
            "no block named 'no_such_block'",
        ),
        (
            "parameters:\n  layer:\n    - {use: routed_experts}\n",
            "`{moe}` is not filled in",
        ),
        (
            "parameters:\n  layer:\n    - {use: attention_scales, with: {x: y}}\n",
            "no `{x}`",
        ),
        (
            "parameters:\n  layer:\n    - {use: attention}\n",
            "already in the list",
        ),
        (
            "parameters:\n  layer:\n    - {name: a, use: attention}\n",
            "exactly one",
        ),
        (
            "parameters:\n  layer:\n    - {remove: a, after: b}\n",
            "stands alone",
        ),
        (
            "parameters:\n  layer:\n    - {name: a, layout: {kind: replicated, shape: []}, after: nowhere}\n",
            "'nowhere'",
        ),
        (
            "parameters:\n  layer:\n    - {name: a}\n",
            "needs a `layout`",
        ),
        (
            "parameters:\n  layer:\n    - {use: attention_scales, layout: {kind: replicated, shape: []}}\n",
            "takes only",
        ),
        ("blocks:\n  a.b: []\n", "block name"),
        (
            "parameters:\n  head:\n    - {name: \"x.{i}\", layout: {kind: replicated, shape: []}}\n",
            "only means something in `layer`",
        ),
    ];
    for (body, says) in cases {
        let e = child(body).expect_err(body);
        assert!(e.contains("t.yaml") && e.contains(says), "{body}\n→ {e}");
    }
    let e = resolve("t.yaml", "extends: nonexistent\nfamily: t\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("nonexistent") && e.contains("llama"), "{e}");
}
