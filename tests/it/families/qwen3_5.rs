//! The hybrid linear-attention families on the golden Qwen3.5-MoE fixture (spec §11.1): the
//! checkpoint's experts fused on disk load the same state as per expert; Qwen3-Next, built from
//! the same tensors (text config flattened, `in_proj_qkvz` / `in_proj_ba` fused, A_log F32),
//! holds contiguous row slices of the fused projections and everything else as Qwen3.5 does; the
//! dense Qwen3.5 text model; PP stage contents; expert parallelism; the vision tower's modes; and
//! vLLM's refusals.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::*;

const CASE: &str = "qwen3_5_moe";
const LM: &str = "--language-model-only";
const LAYERS: usize = 4;
const EXPERTS: usize = 4;

fn sharded(src: &Path, dir: &Path, name: &str, tp: u64, flags: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let mut all = vec!["-q"];
    all.extend_from_slice(flags);
    shard_ok(src, tp, &out, &all);
    out
}

fn held(dtype: &str, shape: &[u64], data: Vec<u8>) -> Held {
    Held {
        dtype: dtype.into(),
        shape: shape.to_vec(),
        data,
    }
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// The fixture's text config, flattened to the top level as a text-only config.json has it.
fn text_config(architecture: &str, model_type: &str) -> Value {
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(fixture(CASE).join("config.json")).unwrap()).unwrap();
    let mut text = cfg["text_config"].clone();
    text["architectures"] = json!([architecture]);
    text["model_type"] = json!(model_type);
    text["dtype"] = json!("bfloat16");
    text
}

/// The fixture's experts as transformers 5 stores them fused: `mlp.experts.gate_up_proj`
/// `[E, 2I, H]` (per expert `[gate; up]`) and `mlp.experts.down_proj` `[E, H, I]`.
fn fuse_experts(t: &mut Tensors, prefix: &str) {
    for i in 0..LAYERS {
        let p = format!("{prefix}layers.{i}.mlp.experts.");
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        for e in 0..EXPERTS {
            let take = |t: &mut Tensors, w: &str| t.remove(&format!("{p}{e}.{w}.weight")).unwrap();
            gate_up.extend(take(t, "gate_proj").data);
            gate_up.extend(take(t, "up_proj").data);
            down.extend(take(t, "down_proj").data);
        }
        t.insert(
            format!("{p}gate_up_proj"),
            held("BF16", &[4, 64, 128], gate_up),
        );
        t.insert(format!("{p}down_proj"), held("BF16", &[4, 128, 32], down));
    }
}

#[test]
fn fused_experts_on_disk_load_the_state_per_expert_tensors_load() {
    let tmp = TempDir::new().unwrap();
    let mut t = checkpoint_tensors(&fixture(CASE));
    fuse_experts(&mut t, "model.language_model.");
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(fixture(CASE).join("config.json")).unwrap()).unwrap();
    let fused = write_checkpoint(&cfg, &t);
    for flags in [&[LM][..], &[LM, "--enable-expert-parallel"][..]] {
        let name = flags.len().to_string();
        let a = sharded(&fixture(CASE), tmp.path(), &format!("a{name}"), 2, flags);
        let b = sharded(fused.path(), tmp.path(), &format!("b{name}"), 2, flags);
        for r in 0..2 {
            assert_eq!(
                rank_tensors(&a, r),
                rank_tensors(&b, r),
                "{flags:?} rank {r}"
            );
        }
    }
    // Both forms at once are refused: vLLM would load one over the other.
    let mut both = t.clone();
    let per_expert = checkpoint_tensors(&fixture(CASE));
    let w = "model.language_model.layers.0.mlp.experts.0.gate_proj.weight";
    both.insert(w.into(), per_expert[w].clone());
    let both = write_checkpoint(&cfg, &both);
    let refused = run(&["plan", s(both.path()), "--tp", "2", LM]);
    assert_refusal_text(
        &refused,
        3,
        &["filled both by a fused tensor and by separate shards"],
    );
}

/// Expert parallelism (tp2): whole experts placed linearly, [0, 1] and [2, 3]; everything else
/// as at tp2.
#[test]
fn expert_parallelism_places_whole_experts_and_changes_nothing_else() {
    let tmp = TempDir::new().unwrap();
    let tp = sharded(&fixture(CASE), tmp.path(), "tp", 2, &[LM]);
    let ep = sharded(
        &fixture(CASE),
        tmp.path(),
        "ep",
        2,
        &[LM, "--enable-expert-parallel"],
    );
    let ckpt = checkpoint_tensors(&fixture(CASE));
    for r in 0..2u64 {
        let (a, b) = (rank_tensors(&tp, r), rank_tensors(&ep, r));
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        for (name, t) in &b {
            if !name.contains("routed_experts") {
                assert!(t.data == a[name].data, "rank {r} {name}");
            }
        }
        let p = "model.language_model.layers.1.mlp.experts.";
        let mut w13 = Vec::new();
        for e in 2 * r..2 * r + 2 {
            w13.extend(ckpt[&format!("{p}{e}.gate_proj.weight")].data.clone());
            w13.extend(ckpt[&format!("{p}{e}.up_proj.weight")].data.clone());
        }
        let name = "language_model.model.layers.1.mlp.experts.routed_experts.w13_weight";
        assert_tensor(&b, name, "BF16", &[2, 64, 128], &w13, &format!("rank {r}"));
    }
}

/// `--pp 2` (tp1, 4 layers): stage 0 holds layers 0–1 and embed_tokens, stage 1 layers 2–3,
/// embed_tokens again (built on every stage, qwen3_5.py:251), the norm and lm_head.
#[test]
fn pipeline_stages_both_hold_the_embedding() {
    let tmp = TempDir::new().unwrap();
    let out = sharded(&fixture(CASE), tmp.path(), "pp", 1, &[LM, "--pp", "2"]);
    let (s0, s1) = (stage_tensors(&out, 0, 0), stage_tensors(&out, 1, 0));
    let layers = |t: &Tensors| -> std::collections::BTreeSet<String> {
        t.keys()
            .filter_map(|k| k.strip_prefix("language_model.model.layers."))
            .map(|k| k.split('.').next().unwrap().to_string())
            .collect()
    };
    assert_eq!(layers(&s0).into_iter().collect::<Vec<_>>(), ["0", "1"]);
    assert_eq!(layers(&s1).into_iter().collect::<Vec<_>>(), ["2", "3"]);
    let embed = "language_model.model.embed_tokens.weight";
    assert!(s0.contains_key(embed) && s1.contains_key(embed));
    for k in [
        "language_model.model.norm.weight",
        "language_model.lm_head.weight",
    ] {
        assert!(!s0.contains_key(k) && s1.contains_key(k), "{k}");
    }
    assert!(s1.contains_key("language_model.model.layers.3.self_attn.qkv_proj.weight"));
}

/// The tower as vLLM builds it by default (TP-split, Qwen3-VL's ViT), whole on every rank with
/// `--mm-encoder-tp-mode data`, absent with `--language-model-only`; the text the same in all.
#[test]
fn the_vision_tower_follows_the_multimodal_flags() {
    let tmp = TempDir::new().unwrap();
    let src = fixture(CASE);
    let weights = sharded(&src, tmp.path(), "w", 2, &[]);
    let data = sharded(&src, tmp.path(), "d", 2, &["--mm-encoder-tp-mode", "data"]);
    let lm = sharded(&src, tmp.path(), "lm", 2, &[LM]);
    let ckpt = checkpoint_tensors(&src);
    let vision = ckpt
        .keys()
        .filter(|k| k.starts_with("model.visual."))
        .count();
    for r in 0..2 {
        let (w, d, l) = (
            rank_tensors(&weights, r),
            rank_tensors(&data, r),
            rank_tensors(&lm, r),
        );
        let n = |t: &Tensors| t.keys().filter(|k| k.starts_with("visual.")).count();
        assert_eq!((n(&w), n(&d), n(&l)), (vision, vision, 0), "rank {r}");
        for (name, t) in &d {
            match name.strip_prefix("visual.") {
                Some(rest) => assert!(
                    t.data == ckpt[&format!("model.visual.{rest}")].data,
                    "{name}"
                ),
                None => assert!(t.data == l[name].data && t.data == w[name].data, "{name}"),
            }
        }
        let qkv = &w["visual.blocks.0.attn.qkv.weight"];
        assert_eq!(qkv.shape, [96, 64], "rank {r}: the ViT's heads split");
    }
    // The mtp.* tensors are dropped, as vLLM does (qwen3_5.py:478): listed as skipped by the
    // rule, never read.
    let plan = clean_plan_json(&src, &["--tp", "2"]);
    let mtp = skipped_tensors(&plan, "dropped by prefix 'mtp.'");
    assert_eq!(mtp, ["mtp.fc.weight", "mtp.norm.weight"], "{plan:#}");
    assert!(!plan["sources"].to_string().contains("mtp."), "{plan:#}");
}

/// Qwen3-Next from the same tensors: `model.*` names, `in_proj_qkvz` = [qkv; z] and
/// `in_proj_ba` = [b; a] fused on disk (the content of the k-head-group interleaving does not
/// matter to the loader: one output size, a contiguous row slice), A_log stored F32. Every other
/// tensor is held as Qwen3.5 holds it; both PP stages hold lm_head (qwen3_next.py:851).
#[test]
fn qwen3_next_holds_row_slices_of_its_fused_projections() {
    let tmp = TempDir::new().unwrap();
    let ckpt = checkpoint_tensors(&fixture(CASE));
    let mut t = Tensors::new();
    for (name, h) in &ckpt {
        if let Some(rest) = name.strip_prefix("model.language_model.") {
            t.insert(format!("model.{rest}"), h.clone());
        } else if name == "lm_head.weight" || name.starts_with("mtp.") {
            t.insert(name.clone(), h.clone());
        }
    }
    for i in 0..3 {
        let p = format!("model.layers.{i}.linear_attn.");
        let mut take = |w: &str| t.remove(&format!("{p}{w}")).unwrap().data;
        let qkvz = cat(&[&take("in_proj_qkv.weight"), &take("in_proj_z.weight")]);
        let ba = cat(&[&take("in_proj_b.weight"), &take("in_proj_a.weight")]);
        let a_log: Vec<u8> = take("A_log")
            .chunks(2)
            .flat_map(|b| [0, 0, b[0], b[1]])
            .collect();
        t.insert(
            format!("{p}in_proj_qkvz.weight"),
            held("BF16", &[384, 128], qkvz),
        );
        t.insert(
            format!("{p}in_proj_ba.weight"),
            held("BF16", &[16, 128], ba),
        );
        t.insert(format!("{p}A_log"), held("F32", &[8], a_log));
    }
    let next = write_checkpoint(&text_config("Qwen3NextForCausalLM", "qwen3_next"), &t);
    let q35 = sharded(&fixture(CASE), tmp.path(), "q35", 2, &[LM]);
    let out = sharded(next.path(), tmp.path(), "next", 2, &[]);
    for r in 0..2u64 {
        let (a, b) = (rank_tensors(&q35, r), rank_tensors(&out, r));
        assert_eq!(a.len(), b.len(), "rank {r}");
        for (name, h) in &b {
            let p = "model.layers.0.linear_attn.";
            let ctx = format!("rank {r}");
            let u = r as usize;
            if let Some(w) = name.strip_prefix(p).filter(|w| w.starts_with("in_proj")) {
                let (src, n) = (&t[&format!("{p}{w}")], h.shape[0] as usize);
                assert_tensor(
                    &b,
                    name,
                    "BF16",
                    &[n, 128],
                    src.rows(u * n, (u + 1) * n),
                    &ctx,
                );
            } else if !name.contains("in_proj") {
                assert!(h == &a[&format!("language_model.{name}")], "{ctx} {name}");
            }
        }
        assert_eq!(
            b["model.layers.1.linear_attn.in_proj_qkvz.weight"].shape,
            [192, 128]
        );
    }
    let pp = sharded(next.path(), tmp.path(), "pp", 1, &["--pp", "2"]);
    let (s0, s1) = (stage_tensors(&pp, 0, 0), stage_tensors(&pp, 1, 0));
    for k in ["lm_head.weight", "model.embed_tokens.weight"] {
        assert!(
            s0.contains_key(k) && s1.contains_key(k),
            "{k} on both stages"
        );
    }
    assert!(!s0.contains_key("model.norm.weight") && s1.contains_key("model.norm.weight"));
    // Without layer_types, transformers' full_attention_interval pattern (every 4th layer full)
    // gives the same layers.
    let mut cfg = text_config("Qwen3NextForCausalLM", "qwen3_next");
    cfg.as_object_mut().unwrap().remove("layer_types");
    let by_interval = write_checkpoint(&cfg, &t);
    let again = sharded(by_interval.path(), tmp.path(), "interval", 2, &[]);
    for r in 0..2 {
        assert_eq!(rank_tensors(&again, r), rank_tensors(&out, r), "rank {r}");
    }
}

/// The dense Qwen3.5 text model (`Qwen3_5ForCausalLM`): the same layers with a dense MLP
/// (`mlp.gate_up_proj` = [gate_r; up_r], `down_proj` columns); a community text-only checkpoint's
/// `model.language_model.` prefix is stripped (qwen3_5.py:315–317).
#[test]
fn the_dense_text_model_holds_a_dense_mlp() {
    let tmp = TempDir::new().unwrap();
    let ckpt = checkpoint_tensors(&fixture(CASE));
    let mut t: Tensors = (ckpt.iter())
        .filter(|(k, _)| !k.starts_with("model.visual.") && !k.contains(".mlp."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let inter = 64u64;
    for i in 0..LAYERS as u64 {
        let p = format!("model.language_model.layers.{i}.mlp.");
        for (j, w) in ["gate_proj", "up_proj"].iter().enumerate() {
            let data = bf16_data(100 + i * 3 + j as u64, (inter * 128) as usize);
            t.insert(format!("{p}{w}.weight"), held("BF16", &[inter, 128], data));
        }
        let data = bf16_data(100 + i * 3 + 2, (inter * 128) as usize);
        t.insert(
            format!("{p}down_proj.weight"),
            held("BF16", &[128, inter], data),
        );
    }
    let mut cfg = text_config("Qwen3_5ForCausalLM", "qwen3_5_text");
    cfg["intermediate_size"] = json!(inter);
    let dense = write_checkpoint(&cfg, &t);
    let q35 = sharded(&fixture(CASE), tmp.path(), "q35", 2, &[LM]);
    let out = sharded(dense.path(), tmp.path(), "dense", 2, &[]);
    for r in 0..2usize {
        let (a, b) = (rank_tensors(&q35, r as u64), rank_tensors(&out, r as u64));
        let p = "model.language_model.layers.2.mlp.";
        let (g, u) = (
            &t[&format!("{p}gate_proj.weight")],
            &t[&format!("{p}up_proj.weight")],
        );
        let want = cat(&[g.rows(r * 32, r * 32 + 32), u.rows(r * 32, r * 32 + 32)]);
        let name = "model.layers.2.mlp.gate_up_proj.weight";
        assert_tensor(&b, name, "BF16", &[64, 128], &want, &format!("rank {r}"));
        let down = t[&format!("{p}down_proj.weight")].cols(r * 32, r * 32 + 32);
        assert_tensor(
            &b,
            "model.layers.2.mlp.down_proj.weight",
            "BF16",
            &[128, 32],
            &down,
            "",
        );
        for (name, h) in &b {
            if !name.contains(".mlp.") {
                assert!(
                    h == &a[&format!("language_model.{name}")],
                    "rank {r} {name}"
                );
            }
        }
        assert!(
            !b.keys().any(|k| k.contains("experts")),
            "rank {r}: no MoE block"
        );
    }
    // The same text model in the vision-language wrapper (Qwen3_5ForConditionalGeneration):
    // under `language_model.`, after the tower.
    let mut vl: Value =
        serde_json::from_slice(&std::fs::read(fixture(CASE).join("config.json")).unwrap()).unwrap();
    vl["architectures"] = json!(["Qwen3_5ForConditionalGeneration"]);
    vl["model_type"] = json!("qwen3_5");
    vl["text_config"]["model_type"] = json!("qwen3_5_text");
    vl["text_config"]["intermediate_size"] = json!(inter);
    let mut with_tower = t.clone();
    with_tower.extend(
        ckpt.iter()
            .filter(|(k, _)| k.starts_with("model.visual."))
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    let vl = write_checkpoint(&vl, &with_tower);
    let vl_out = sharded(vl.path(), tmp.path(), "vl", 2, &[]);
    for r in 0..2 {
        let (text, both) = (rank_tensors(&out, r), rank_tensors(&vl_out, r));
        let tower = both.keys().filter(|k| k.starts_with("visual.")).count();
        assert_eq!(both.len(), text.len() + tower, "rank {r}");
        assert!(tower > 0, "rank {r}: the tower");
        for (name, h) in &text {
            assert!(
                h == &both[&format!("language_model.{name}")],
                "rank {r} {name}"
            );
        }
    }
}

/// vLLM's refusals, before anything is read: more ranks than experts or than attention heads,
/// linear-attention value heads TP does not divide.
#[test]
fn what_vllm_refuses_is_refused_with_its_words() {
    let src = fixture(CASE);
    let refused = run(&["plan", s(&src), "--tp", "8", LM]);
    assert_refusal_text(
        &refused,
        3,
        &[
            "Tensor parallel size 8 is greater than the number of experts 4.",
            "num_attention_heads (4) % tp (8) != 0",
        ],
    );
    let six = r#"{"text_config": {"linear_num_value_heads": 6}}"#;
    let refused = run(&["plan", s(&src), "--tp", "4", LM, "--hf-overrides", six]);
    assert_refusal_text(
        &refused,
        3,
        &["6 is not divisible by 4", "linear_num_value_heads"],
    );
    let ok = run(&["plan", s(&src), "--tp", "4", LM]);
    assert!(ok.status.success(), "{}", context(&ok));
    let sizes = wload_json(&["sizes", s(&src), "--max-tp", "8", "--json", LM]);
    assert_eq!(sizes["accepted_tp"], json!([1, 2, 4]), "{sizes:#}");
}

/// A per-tensor FP8 Qwen3.5 checkpoint is refused, naming in_proj_qkvz and the format: only block
/// FP8's tuple scales are planned, and nothing is written wrong.
#[test]
fn a_quantized_checkpoint_is_refused_at_the_tuple_shards() {
    let q = fixture_with(CASE, |m| {
        let fp8 = json!({"quant_method": "fp8", "activation_scheme": "dynamic"});
        m.insert("quantization_config".into(), fp8);
    });
    let refused = run(&["plan", s(q.path()), "--tp", "2", LM]);
    assert_refusal_text(
        &refused,
        3,
        &[
            "layers.0.linear_attn.in_proj_qkvz: a merged column filled by tuple shards",
            "quantized as fp8: FP8 per-tensor",
        ],
    );
}

/// A layer type vLLM does not build, or too few layer types, is refused up front.
#[test]
fn layer_types_vllm_cannot_build_are_refused() {
    let src = fixture(CASE);
    for (types, needle) in [
        (
            r#"["linear_attention", "mamba", "linear_attention", "full_attention"]"#,
            "Invalid layer_type",
        ),
        (
            r#"["linear_attention", "full_attention"]"#,
            "fewer entries than num_hidden_layers (4)",
        ),
    ] {
        let o = format!(r#"{{"text_config": {{"layer_types": {types}}}}}"#);
        let refused = run(&["plan", s(&src), "--tp", "2", LM, "--hf-overrides", &o]);
        assert_refusal_text(&refused, 3, &[needle]);
    }
}
