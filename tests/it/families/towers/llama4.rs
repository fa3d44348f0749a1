//! Llama 4's vision model (`vision_model.*`) and projector on the golden fixture (vision hidden
//! 64, 4 heads, MLP 128, one layer; adapter 128 → 128; text hidden 128): split over TP like a
//! text layer (no rotary permutation, unlike the text model's q/k), the unfold patch embedding
//! by rows; with `--mm-encoder-tp-mode data` the vision model whole on every rank (q/k/v
//! concatenated) but the projector still split by rows (spec §13.1b).

use tempfile::TempDir;

use super::{Cut, Rule, assert_tower_then_text, layer_rules, rule};
use crate::support::*;

const CASE: &str = "llama4";
const DATA: [&str; 2] = ["--mm-encoder-tp-mode", "data"];

/// Llama4VisionModel (its own parameters, then patch_embedding, the norms, the encoder and the
/// adapter) then Llama4MultiModalProjector.
fn rules() -> Vec<Rule> {
    let v = |n: &str| format!("vision_model.{n}");
    let mut t: Vec<Rule> = [
        ("class_embedding", Cut::Whole),
        ("positional_embedding_vlm", Cut::Whole),
        ("patch_embedding.linear.weight", Cut::Rows),
        ("layernorm_pre.weight", Cut::Whole),
        ("layernorm_pre.bias", Cut::Whole),
        ("layernorm_post.weight", Cut::Whole),
        ("layernorm_post.bias", Cut::Whole),
    ]
    .into_iter()
    .map(|(n, c)| rule(v(n), c, &[v(n)]))
    .collect();
    let l = |n: &str| v(&format!("model.layers.0.{n}"));
    let rest = [
        ("self_attn.o_proj.weight", Cut::Cols),
        ("self_attn.o_proj.bias", Cut::Whole),
        ("mlp.fc1.weight", Cut::Rows),
        ("mlp.fc1.bias", Cut::Rows),
        ("mlp.fc2.weight", Cut::Cols),
        ("mlp.fc2.bias", Cut::Whole),
        ("input_layernorm.weight", Cut::Whole),
        ("input_layernorm.bias", Cut::Whole),
        ("post_attention_layernorm.weight", Cut::Whole),
        ("post_attention_layernorm.bias", Cut::Whole),
    ];
    layer_rules(&mut t, l, &rest);
    for (n, c) in [
        ("vision_adapter.mlp.fc1.weight", Cut::Rows),
        ("vision_adapter.mlp.fc2.weight", Cut::Cols),
    ] {
        t.push(rule(v(n), c, &[v(n)]));
    }
    let p = "multi_modal_projector.linear_1.weight".to_string();
    t.push(rule(p.clone(), Cut::RowsAlways, &[p]));
    t
}

/// TP 2 and 4 (one vision head a rank): every tower tensor by the rules, the text model as
/// with `--language-model-only`.
#[test]
fn the_vision_model_splits_like_a_text_layer() {
    let (src, tmp) = (fixture(CASE), TempDir::new().unwrap());
    for tp in [2u64, 4] {
        assert_tower_then_text(&src, tmp.path(), &rules(), (tp, false));
    }
}

/// Data mode at TP 2 and TP 8 (more ranks than vision heads: accepted, the vision model being
/// whole): the vision model whole, q/k/v concatenated; the projector's rows split; recorded.
#[test]
fn data_mode_holds_the_vision_model_whole_but_splits_the_projector() {
    let (src, tmp) = (fixture(CASE), TempDir::new().unwrap());
    for tp in [2u64, 8] {
        assert_tower_then_text(&src, tmp.path(), &rules(), (tp, true));
        let out = tmp.path().join(format!("tp{tp}-true"));
        let proj = &rank_tensors(&out, 0)["multi_modal_projector.linear_1.weight"];
        assert_eq!(proj.shape, [128 / tp, 128], "tp{tp}: the projector split");
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("wload.json")).unwrap()).unwrap();
        assert_eq!(m["mm_encoder_tp_mode"], "data");
    }
}

/// TP 8 splits 4 vision heads: refused in vLLM's words (its bare assert, quoted), with the
/// sizes that work and both flags that help; `sizes` agrees in each mode.
#[test]
fn vision_heads_tp_does_not_divide_are_refused_unless_the_vision_model_is_whole() {
    let src = fixture(CASE);
    let refused = run(&["plan", s(&src), "--tp", "8"]);
    assert_refusal_text(
        &refused,
        3,
        &[
            "AssertionError (mllama4.py:255 `assert self.num_heads % self.tp_size == 0`)",
            "the vision model's 4 heads",
            "pass --mm-encoder-tp-mode data",
            "--language-model-only",
            "TP sizes that work: 1, 2, 4",
        ],
    );
    let weights = wload_json(&["sizes", s(&src), "--max-tp", "8", "--json"]);
    assert_eq!(weights["accepted_tp"], serde_json::json!([1, 2, 4]));
    let data = wload_json(&[&["sizes", s(&src), "--max-tp", "8", "--json"][..], &DATA].concat());
    assert_eq!(data["accepted_tp"], serde_json::json!([1, 2, 4, 8]));
    // The tower is no longer wload's limit: `inspect` counts it as mapped.
    let json = wload_json(&["inspect", s(&src), "--json"]);
    assert_eq!(json["vision_tower"]["mapped"], true);
    assert_eq!(json["vision_tower"]["data_mode"], true);
}
