//! Mistral 3's Pixtral tower (`vision_tower.*`) and projector, on a generated checkpoint in
//! transformers ≥ 4.52's names (vision hidden 8, 2 heads of 4, MLP 16, 2 layers; projector
//! biases on; the tiny Llama text model): q/k/v and gate/up fused and split, o_proj and
//! down_proj by columns; the projector's norm and patch merger whole, linear_1 by rows (bias
//! too), linear_2 by columns with its bias whole (spec §13.1). Mistral 3 has no data mode.

use serde_json::{Value, json};
use tempfile::TempDir;

use super::{Cut, Rule, assert_data_mode_falls_back, assert_tower_then_text, rule};
use crate::support::*;

const LM: &str = "--language-model-only";

/// The tower's and projector's checkpoint tensors (vLLM's names after the wrapper's mapper
/// strips `model.`), in a file order of their own.
fn tower_specs() -> Vec<(String, Vec<u64>)> {
    let mut t: Vec<(String, Vec<u64>)> = vec![
        ("vision_tower.patch_conv.weight".into(), vec![8, 3, 2, 2]),
        ("vision_tower.ln_pre.weight".into(), vec![8]),
    ];
    for j in 0..2 {
        let l = |n: &str| format!("vision_tower.transformer.layers.{j}.{n}");
        for (n, sh) in [
            ("attention_norm.weight", vec![8]),
            ("attention.q_proj.weight", vec![8, 8]),
            ("attention.k_proj.weight", vec![8, 8]),
            ("attention.v_proj.weight", vec![8, 8]),
            ("attention.o_proj.weight", vec![8, 8]),
            ("feed_forward.gate_proj.weight", vec![16, 8]),
            ("feed_forward.up_proj.weight", vec![16, 8]),
            ("feed_forward.down_proj.weight", vec![8, 16]),
            ("ffn_norm.weight", vec![8]),
        ] {
            t.push((l(n), sh));
        }
    }
    for (n, sh) in [
        ("norm.weight", vec![8]),
        ("patch_merger.merging_layer.weight", vec![8, 32]),
        ("linear_1.weight", vec![8, 8]),
        ("linear_1.bias", vec![8]),
        ("linear_2.weight", vec![8, 8]),
        ("linear_2.bias", vec![8]),
    ] {
        t.push((format!("multi_modal_projector.{n}"), sh));
    }
    t
}

/// A Mistral3ForConditionalGeneration checkpoint: the tower and the tiny Llama text model, all
/// under transformers ≥ 4.52's `model.` names, every tensor distinct BF16.
fn checkpoint(config_edit: impl FnOnce(&mut Value)) -> TempDir {
    let mut text = tiny_config();
    let t = text.as_object_mut().unwrap();
    t.remove("architectures");
    t.remove("dtype");
    t.insert("model_type".into(), json!("mistral"));
    let mut config = json!({
        "architectures": ["Mistral3ForConditionalGeneration"],
        "model_type": "mistral3",
        "text_config": text,
        "vision_config": {"model_type": "pixtral", "hidden_size": 8, "num_attention_heads": 2,
            "intermediate_size": 16, "num_hidden_layers": 2, "patch_size": 2, "image_size": 8},
        "multimodal_projector_bias": true,
        "spatial_merge_size": 2,
        "vision_feature_layer": -1,
        "dtype": "bfloat16"
    });
    config_edit(&mut config);
    let text = tiny_llama_specs(1).into_iter().map(|(n, sh)| {
        let n = match n.strip_prefix("model.") {
            Some(rest) => format!("model.language_model.{rest}"),
            None => n,
        };
        (n, sh.to_vec())
    });
    let tower = tower_specs()
        .into_iter()
        .map(|(n, sh)| (format!("model.{n}"), sh));
    let tensors: Tensors = tower
        .chain(text)
        .enumerate()
        .map(|(k, (n, sh))| {
            let shape: Vec<usize> = sh.iter().map(|&d| d as usize).collect();
            let data = bf16_data(k as u64, shape.iter().product());
            (n, Held::new("BF16", &shape, data))
        })
        .collect();
    write_checkpoint(&config, &tensors)
}

/// PixtralHFVisionModel then Mistral3MultiModalProjector, in registration order; the sources
/// are the checkpoint's names.
fn rules() -> Vec<Rule> {
    let m = |n: &str| format!("model.{n}");
    let mut t = vec![
        rule(
            "vision_tower.patch_conv.weight",
            Cut::Whole,
            &[m("vision_tower.patch_conv.weight")],
        ),
        rule(
            "vision_tower.ln_pre.weight",
            Cut::Whole,
            &[m("vision_tower.ln_pre.weight")],
        ),
    ];
    for j in 0..2 {
        let l = |n: &str| format!("vision_tower.transformer.layers.{j}.{n}");
        let src = |n: &str| m(&l(n));
        let qkv = ["q", "k", "v"].map(|x| src(&format!("attention.{x}_proj.weight")));
        let gate_up = ["gate", "up"].map(|x| src(&format!("feed_forward.{x}_proj.weight")));
        t.extend([
            rule(
                l("attention_norm.weight"),
                Cut::Whole,
                &[src("attention_norm.weight")],
            ),
            rule(l("attention.qkv_proj.weight"), Cut::Qkv, &qkv),
            rule(
                l("attention.o_proj.weight"),
                Cut::Cols,
                &[src("attention.o_proj.weight")],
            ),
            rule(l("feed_forward.gate_up_proj.weight"), Cut::Rows, &gate_up),
            rule(
                l("feed_forward.down_proj.weight"),
                Cut::Cols,
                &[src("feed_forward.down_proj.weight")],
            ),
            rule(l("ffn_norm.weight"), Cut::Whole, &[src("ffn_norm.weight")]),
        ]);
    }
    for (n, c) in [
        ("norm.weight", Cut::Whole),
        ("patch_merger.merging_layer.weight", Cut::Whole),
        ("linear_1.weight", Cut::Rows),
        ("linear_1.bias", Cut::Rows),
        ("linear_2.weight", Cut::Cols),
        ("linear_2.bias", Cut::Whole),
    ] {
        let p = format!("multi_modal_projector.{n}");
        t.push(rule(p.clone(), c, &[m(&p)]));
    }
    t
}

/// TP 2: every tower tensor by the rules, the text model as with `--language-model-only`; the
/// `--mm-encoder-tp-mode data` fallback.
#[test]
fn the_pixtral_tower_splits_like_a_text_layer_and_has_no_data_mode() {
    let src = checkpoint(|_| {});
    let tmp = TempDir::new().unwrap();
    assert_tower_then_text(src.path(), tmp.path(), &rules(), (2, false));
    assert_data_mode_falls_back(src.path(), &tmp.path().join("tp2-false"), tmp.path());
}

/// The 2 vision heads at TP 4: vLLM's assertion; a `vision_feature_layer` that leaves out
/// layers (vLLM builds fewer and skips the others' tensors) is refused as wload's limit.
#[test]
fn what_the_mapping_cannot_serve_is_refused_with_the_flag_that_helps() {
    let src = checkpoint(|_| {});
    let refused = run(&["plan", s(src.path()), "--tp", "4"]);
    assert_refused(
        &refused,
        3,
        &["AssertionError: 2 is not divisible by 4", LM],
    );
    let short = checkpoint(|c| c["vision_feature_layer"] = json!(-2));
    let refused = run(&["plan", s(short.path()), "--tp", "2"]);
    assert_refusal_text(
        &refused,
        3,
        &[
            "vision_feature_layer -2: vLLM builds 1 of the Pixtral tower's 2 layers",
            "(wload's limit, not vLLM's)",
            "pass --language-model-only",
        ],
    );
    let ok = run(&["plan", s(short.path()), "--tp", "2", LM]);
    assert!(ok.status.success(), "{}", context(&ok));
}
