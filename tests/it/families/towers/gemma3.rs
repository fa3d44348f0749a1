//! Gemma 3's SigLIP tower (`vision_tower.vision_model.*`) and projector, on the golden fixture
//! (vision hidden 64, 4 heads, MLP 128, 2 layers): the rules rebuild real vLLM's TP 2 ranks,
//! then hold at TP 4 (one head a rank); `--mm-encoder-tp-mode data` falls back to the split
//! tower with vLLM's warning; vision heads TP does not divide are refused in vLLM's words.

use tempfile::TempDir;

use super::{
    Cut, Rule, assert_data_mode_falls_back, assert_tower_then_text, layer_rules, rule, sharded,
};
use crate::support::*;

const CASE: &str = "gemma3_mm";
const LM: &str = "--language-model-only";

/// SiglipVisionModel then Gemma3MultiModalProjector, in registration order.
fn rules() -> Vec<Rule> {
    let v = |n: &str| format!("vision_tower.vision_model.{n}");
    let one = |n: &str| vec![v(n)];
    let mut t = vec![
        rule(
            v("embeddings.patch_embedding.weight"),
            Cut::Whole,
            &one("embeddings.patch_embedding.weight"),
        ),
        rule(
            v("embeddings.patch_embedding.bias"),
            Cut::Whole,
            &one("embeddings.patch_embedding.bias"),
        ),
        rule(
            v("embeddings.position_embedding.weight"),
            Cut::Whole,
            &one("embeddings.position_embedding.weight"),
        ),
    ];
    for j in 0..2 {
        let l = |n: &str| v(&format!("encoder.layers.{j}.{n}"));
        let rest = [
            ("self_attn.out_proj.weight", Cut::Cols),
            ("self_attn.out_proj.bias", Cut::Whole),
            ("layer_norm1.weight", Cut::Whole),
            ("layer_norm1.bias", Cut::Whole),
            ("mlp.fc1.weight", Cut::Rows),
            ("mlp.fc1.bias", Cut::Rows),
            ("mlp.fc2.weight", Cut::Cols),
            ("mlp.fc2.bias", Cut::Whole),
            ("layer_norm2.weight", Cut::Whole),
            ("layer_norm2.bias", Cut::Whole),
        ];
        layer_rules(&mut t, l, &rest);
    }
    for n in ["post_layernorm.weight", "post_layernorm.bias"] {
        t.push(rule(v(n), Cut::Whole, &one(n)));
    }
    for n in ["mm_input_projection_weight", "mm_soft_emb_norm.weight"] {
        let p = format!("multi_modal_projector.{n}");
        t.push(rule(p.clone(), Cut::Whole, &[p]));
    }
    t
}

/// The table, with the text model wload writes with `--language-model-only`, is real vLLM's
/// TP 2 state: the rules the other tests hold wload to are vLLM's.
#[test]
fn the_rules_rebuild_vllms_tp2_ranks() {
    let (src, tmp) = (fixture(CASE), TempDir::new().unwrap());
    let text = sharded(&src, tmp.path(), "lm", 2, &[LM]);
    let c = checkpoint_tensors(&src);
    for r in 0..2 {
        let mut want = rank_tensors(&text, r);
        want.extend(super::tower_rank(&c, &rules(), r as usize, 2, false));
        assert_matches_vllm_rank(&want, CASE, 2, r);
    }
}

/// TP 4: one vision head a rank (text kv heads replicated); every tower tensor by the rules.
#[test]
fn tp4_holds_one_vision_head_a_rank() {
    let (src, tmp) = (fixture(CASE), TempDir::new().unwrap());
    assert_tower_then_text(&src, tmp.path(), &rules(), (4, false));
    let out = tmp.path().join("tp4-false");
    let qkv = &rank_tensors(&out, 3)["vision_tower.vision_model.encoder.layers.0.self_attn.qkv_proj.weight"];
    assert_eq!(qkv.shape, [48, 64], "q, k, v of one head of 16");
}

/// Gemma 3 has no data mode: the split tower, with vLLM's warning.
#[test]
fn data_mode_falls_back_to_the_split_tower_with_vllms_warning() {
    let (src, tmp) = (fixture(CASE), TempDir::new().unwrap());
    let weights = sharded(&src, tmp.path(), "weights", 2, &[]);
    assert_data_mode_falls_back(&src, &weights, tmp.path());
}

/// Vision heads TP does not divide (2 heads at TP 4; the text's 4 heads would do): refused in
/// vLLM's words (`AssertionError: 2 is not divisible by 4`, spec §13.1c), with the sizes that
/// work and `--language-model-only`; `--mm-encoder-tp-mode data` does not help (vLLM falls back
/// and fails the same way); `sizes` agrees.
#[test]
fn vision_heads_tp_does_not_divide_are_refused_in_vllms_words() {
    let src = fixture(CASE);
    let two = r#"{"vision_config": {"num_attention_heads": 2}}"#;
    let over = ["--hf-overrides", two];
    let base = ["plan", s(&src), "--tp", "4"];
    let refused = run(&[&base[..], &over].concat());
    let text = assert_refusal_text(
        &refused,
        3,
        &[
            "AssertionError: 2 is not divisible by 4",
            "choose a --tp that divides 2, or pass --language-model-only",
            "TP sizes that work: 1, 2",
        ],
    );
    let fix = text
        .lines()
        .find(|l| l.trim_start().starts_with("fix:"))
        .unwrap();
    assert!(
        !fix.contains("--mm-encoder-tp-mode"),
        "no data mode to suggest: {fix}"
    );
    let data = run(&[&base[..], &over, &["--mm-encoder-tp-mode", "data"]].concat());
    assert_refused(
        &data,
        3,
        &[
            "AssertionError: 2 is not divisible by 4",
            "falls back to weights",
        ],
    );
    let ok = run(&[&base[..], &over, &[LM]].concat());
    assert!(ok.status.success(), "{}", context(&ok));
    let sizes = wload_json(&[&["sizes", s(&src), "--max-tp", "8", "--json"][..], &over].concat());
    assert_eq!(sizes["accepted_tp"], serde_json::json!([1, 2]), "{sizes:#}");
}

/// `inspect` counts the tower as mapped: split over TP, whole nowhere (no data mode).
#[test]
fn inspect_says_the_tower_is_split_and_has_no_data_mode() {
    let src = fixture(CASE);
    let json = wload_json(&["inspect", s(&src), "--json"]);
    let t = &json["vision_tower"];
    assert_eq!(t["mapped"], true, "{t:#}");
    assert_eq!(t["tensors"], 39, "{t:#}");
    let text = stdout(&run(&["inspect", s(&src)]));
    let line = text.lines().find(|l| l.contains("vision tower")).unwrap();
    assert!(line.contains("split over --tp"), "{line}");
    assert!(line.contains("no --mm-encoder-tp-mode data"), "{line}");
}
