//! GLM-4.5 / 4.6 (`Glm4MoeForCausalLM`, mappings/glm4_moe.yaml). There is no golden case from real
//! vLLM for it, so the test builds a tiny GLM-4.5-shaped checkpoint (qkv bias, q/k norms, one dense
//! layer, one MoE layer with a shared expert and a noaux_tc correction bias, one MTP layer) with
//! distinct values everywhere, and checks every rank against vLLM 0.33's rules read from
//! models/glm4_moe.py: the key list in state_dict order, dtypes, shapes, and that slices hold the
//! right checkpoint rows — with tensor parallelism and with expert parallelism.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::*;

const H: usize = 128; // hidden_size
const HEADS: usize = 8;
const KV_HEADS: usize = 4;
const HD: usize = 32; // head_dim (q out 256 != hidden)
const I: usize = 256; // intermediate_size (the dense layer 0)
const E: usize = 8; // n_routed_experts
const MI: usize = 64; // moe_intermediate_size (n_shared_experts 1: the shared experts' too)
const VOCAB: usize = 1000;
const LAYERS: usize = 2; // num_hidden_layers; layer 2 is the MTP layer

/// `n` distinct F32 values for tensor number `t`.
fn f32_data(t: u64, n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|k| (t as f32 + k as f32 / 64.0).to_le_bytes())
        .collect()
}

/// The tensors of the checkpoint as Hugging Face names them (transformers' Glm4Moe module tree,
/// DeepSeek-V3-style MTP layer at index num_hidden_layers), with shapes.
fn specs() -> Vec<(String, Vec<usize>)> {
    let mut v: Vec<(String, Vec<usize>)> =
        vec![("model.embed_tokens.weight".into(), vec![VOCAB, H])];
    for i in 0..=LAYERS {
        let p = |n: &str| format!("model.layers.{i}.{n}");
        for (n, sh) in [
            ("self_attn.q_proj.weight", vec![HEADS * HD, H]),
            ("self_attn.q_proj.bias", vec![HEADS * HD]),
            ("self_attn.k_proj.weight", vec![KV_HEADS * HD, H]),
            ("self_attn.k_proj.bias", vec![KV_HEADS * HD]),
            ("self_attn.v_proj.weight", vec![KV_HEADS * HD, H]),
            ("self_attn.v_proj.bias", vec![KV_HEADS * HD]),
            ("self_attn.o_proj.weight", vec![H, HEADS * HD]),
            ("self_attn.q_norm.weight", vec![HD]),
            ("self_attn.k_norm.weight", vec![HD]),
            ("input_layernorm.weight", vec![H]),
            ("post_attention_layernorm.weight", vec![H]),
        ] {
            v.push((p(n), sh));
        }
        if i == 0 {
            v.push((p("mlp.gate_proj.weight"), vec![I, H]));
            v.push((p("mlp.up_proj.weight"), vec![I, H]));
            v.push((p("mlp.down_proj.weight"), vec![H, I]));
            continue;
        }
        v.push((p("mlp.gate.weight"), vec![E, H]));
        v.push((p("mlp.gate.e_score_correction_bias"), vec![E]));
        for e in 0..E {
            v.push((p(&format!("mlp.experts.{e}.gate_proj.weight")), vec![MI, H]));
            v.push((p(&format!("mlp.experts.{e}.up_proj.weight")), vec![MI, H]));
            v.push((p(&format!("mlp.experts.{e}.down_proj.weight")), vec![H, MI]));
        }
        v.push((p("mlp.shared_experts.gate_proj.weight"), vec![MI, H]));
        v.push((p("mlp.shared_experts.up_proj.weight"), vec![MI, H]));
        v.push((p("mlp.shared_experts.down_proj.weight"), vec![H, MI]));
        if i == LAYERS {
            // The MTP layer's own modules.
            v.push((p("eh_proj.weight"), vec![H, 2 * H]));
            v.push((p("enorm.weight"), vec![H]));
            v.push((p("hnorm.weight"), vec![H]));
            v.push((p("shared_head.norm.weight"), vec![H]));
        }
    }
    v.push(("model.norm.weight".into(), vec![H]));
    v.push(("lm_head.weight".into(), vec![VOCAB, H]));
    v
}

/// The config.json of the checkpoint.
fn config() -> Value {
    json!({
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "hidden_size": H,
        "intermediate_size": I,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HD,
        "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB,
        "n_routed_experts": E,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": MI,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": true,
        "attention_bias": true,
        "use_qk_norm": true,
        "partial_rotary_factor": 0.5,
        "num_nextn_predict_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false,
        "dtype": "bfloat16"
    })
}

/// The checkpoint's tensors: BF16, the correction bias F32 as GLM ships it.
fn tensors() -> Tensors {
    let mut tensors = Tensors::new();
    for (t, (name, shape)) in specs().into_iter().enumerate() {
        let n = shape.iter().product();
        let (dtype, data) = if name.ends_with("e_score_correction_bias") {
            ("F32", f32_data(t as u64, n))
        } else {
            ("BF16", bf16_data(t as u64, n))
        };
        let dtype = dtype.to_string();
        let shape = shape.iter().map(|&d| d as u64).collect();
        tensors.insert(name, Held { dtype, shape, data });
    }
    tensors
}

/// The checkpoint in a temp folder, and its tensors.
fn checkpoint() -> (TempDir, Tensors) {
    let tensors = tensors();
    (write_checkpoint(&config(), &tensors), tensors)
}

/// vLLM's state_dict keys for one rank, in order, read from models/glm4_moe.py (vLLM 0.33):
/// Glm4MoeForCausalLM registers `model` then `lm_head` (:555–566); Glm4MoeModel `embed_tokens`,
/// `layers`, `norm` (:428–456); a decoder layer `self_attn`, `mlp`, `input_layernorm`,
/// `post_attention_layernorm` (:338–375); Glm4MoeAttention `qkv_proj` (weight, bias), `o_proj`,
/// `attn` (its four F32 scale buffers), `q_norm`, `k_norm` (:262–298); layer 0 (<
/// first_k_dense_replace) a Glm4MoeMLP `gate_up_proj`, `down_proj` (:91–105, :363–370); layer 1 a
/// Glm4MoE (:141–208): `gate` (weight, then the e_score_correction_bias set on it), then
/// `shared_experts`, then `experts`. The bias and the shared experts are registered again inside
/// `experts` (the runner's `routed_experts.e_score_correction_bias` and
/// `_shared_experts._layer`): the sharded state keeps the lexicographically smallest name at the
/// first name's place (sharded_state_loader.py `_filter_subtensors`). The MTP layer 2 is not built.
fn vllm_keys() -> Vec<String> {
    let mut keys = vec!["model.embed_tokens.weight".to_string()];
    for i in 0..LAYERS {
        let mut layer = vec![
            "self_attn.qkv_proj.weight",
            "self_attn.qkv_proj.bias",
            "self_attn.o_proj.weight",
            "self_attn.attn._k_scale",
            "self_attn.attn._v_scale",
            "self_attn.attn._q_scale",
            "self_attn.attn._prob_scale",
            "self_attn.q_norm.weight",
            "self_attn.k_norm.weight",
        ];
        if i == 0 {
            layer.extend(["mlp.gate_up_proj.weight", "mlp.down_proj.weight"]);
        } else {
            layer.extend([
                "mlp.gate.weight",
                "mlp.experts.routed_experts.e_score_correction_bias",
                "mlp.experts._shared_experts._layer.gate_up_proj.weight",
                "mlp.experts._shared_experts._layer.down_proj.weight",
                "mlp.experts.routed_experts.w13_weight",
                "mlp.experts.routed_experts.w2_weight",
            ]);
        }
        layer.extend(["input_layernorm.weight", "post_attention_layernorm.weight"]);
        keys.extend(layer.iter().map(|n| format!("model.layers.{i}.{n}")));
    }
    keys.extend(["model.norm.weight".into(), "lm_head.weight".into()]);
    keys
}

/// The plan's tensor names for (global) rank `r`, in its order.
fn plan_keys(plan: &Value, r: usize) -> Vec<String> {
    plan["ranks"][r]["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

/// BF16 bytes widened to F32 bytes (exact: the BF16 bits are the F32's high half).
fn widen(bf16: &[u8]) -> Vec<u8> {
    bf16.chunks(2)
        .flat_map(|b| (u32::from(u16::from_le_bytes([b[0], b[1]])) << 16).to_le_bytes())
        .collect()
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// What rank `r` of `tp` must hold in the tensors that do not depend on expert parallelism.
fn check_common(got: &Tensors, ck: &Tensors, r: usize, tp: usize, ctx: &str) {
    let l = |n: &str| format!("model.layers.1.{n}");
    let c = |n: &str| &ck[&l(n)];
    let (q, kv) = (HEADS * HD / tp, KV_HEADS * HD / tp);
    // qkv rows [q_r | k_r | v_r], weight and bias.
    for suffix in ["weight", "bias"] {
        let want = cat(&[
            c(&format!("self_attn.q_proj.{suffix}")).rows(r * q, (r + 1) * q),
            c(&format!("self_attn.k_proj.{suffix}")).rows(r * kv, (r + 1) * kv),
            c(&format!("self_attn.v_proj.{suffix}")).rows(r * kv, (r + 1) * kv),
        ]);
        let mut shape = vec![q + 2 * kv];
        if suffix == "weight" {
            shape.push(H);
        }
        assert_tensor(
            got,
            &l(&format!("self_attn.qkv_proj.{suffix}")),
            "BF16",
            &shape,
            &want,
            ctx,
        );
    }
    let o = c("self_attn.o_proj.weight").cols(r * q, (r + 1) * q);
    assert_tensor(got, &l("self_attn.o_proj.weight"), "BF16", &[H, q], &o, ctx);
    // The per-head norms are whole on every rank.
    for n in ["self_attn.q_norm.weight", "self_attn.k_norm.weight"] {
        assert_tensor(got, &l(n), "BF16", &[HD], &c(n).data, ctx);
    }
    // The router: F32, the BF16 checkpoint values widened, whole; the correction bias F32, whole.
    let router = widen(&c("mlp.gate.weight").data);
    assert_tensor(got, &l("mlp.gate.weight"), "F32", &[E, H], &router, ctx);
    let bias = &c("mlp.gate.e_score_correction_bias").data;
    let bias_key = l("mlp.experts.routed_experts.e_score_correction_bias");
    assert_tensor(got, &bias_key, "F32", &[E], bias, ctx);
    // The shared experts: tensor-parallel like a dense MLP, [gate_r ; up_r] and a column slice.
    let s = MI / tp;
    let gate_up = cat(&[
        c("mlp.shared_experts.gate_proj.weight").rows(r * s, (r + 1) * s),
        c("mlp.shared_experts.up_proj.weight").rows(r * s, (r + 1) * s),
    ]);
    let shared = |n: &str| l(&format!("mlp.experts._shared_experts._layer.{n}"));
    assert_tensor(
        got,
        &shared("gate_up_proj.weight"),
        "BF16",
        &[2 * s, H],
        &gate_up,
        ctx,
    );
    let down = c("mlp.shared_experts.down_proj.weight").cols(r * s, (r + 1) * s);
    assert_tensor(
        got,
        &shared("down_proj.weight"),
        "BF16",
        &[H, s],
        &down,
        ctx,
    );
    // The dense layer 0's MLP.
    let d = |n: &str| &ck[&format!("model.layers.0.mlp.{n}")];
    let dense = cat(&[
        d("gate_proj.weight").rows(r * I / tp, (r + 1) * I / tp),
        d("up_proj.weight").rows(r * I / tp, (r + 1) * I / tp),
    ]);
    let name = "model.layers.0.mlp.gate_up_proj.weight";
    assert_tensor(got, name, "BF16", &[2 * I / tp, H], &dense, ctx);
}

/// `wload plan SOURCE --tp 2 --json EXTRA…`, clean (exit 0, nothing on stderr).
fn plan_json(source: &Path, extra: &[&str]) -> Value {
    clean_plan_json(source, &[&["--tp", "2"], extra].concat())
}

#[test]
fn tp2_holds_vllms_keys_dtypes_and_rows() {
    let (src, ck) = checkpoint();
    let plan = plan_json(src.path(), &[]);
    assert_eq!(plan["family"], "glm4_moe");
    let out = TempDir::new().unwrap();
    let dir = out.path().join("tp2");
    shard_ok(src.path(), 2, &dir, &[]);
    for r in 0..2 {
        let ctx = format!("tp2 rank {r}");
        assert_eq!(
            plan_keys(&plan, r),
            vllm_keys(),
            "{ctx}: keys in vLLM's order"
        );
        let got = rank_tensors(&dir, r as u64);
        let mut want_keys = vllm_keys();
        want_keys.sort();
        assert_eq!(
            got.keys().cloned().collect::<Vec<_>>(),
            want_keys,
            "{ctx}: keys on disk"
        );
        check_common(&got, &ck, r, 2, &ctx);
        let scales = got["model.layers.1.self_attn.attn._k_scale"].clone();
        assert_eq!(
            (scales.dtype.as_str(), scales.data),
            ("F32", 1f32.to_le_bytes().to_vec())
        );
    }
    // Routed experts on rank 1: every expert's intermediate rows [32, 64), [w1_r ; w3_r] and the
    // matching w2 columns.
    let got = rank_tensors(&dir, 1);
    let c = |n: String| &ck[&format!("model.layers.1.mlp.experts.{n}")];
    let (w13, w2): (Vec<u8>, Vec<u8>) = (0..E)
        .map(|e| {
            let w13 = cat(&[
                c(format!("{e}.gate_proj.weight")).rows(32, 64),
                c(format!("{e}.up_proj.weight")).rows(32, 64),
            ]);
            (w13, c(format!("{e}.down_proj.weight")).cols(32, 64))
        })
        .fold((vec![], vec![]), |(mut a, mut b), (x, y)| {
            a.extend(x);
            b.extend(y);
            (a, b)
        });
    let p = "model.layers.1.mlp.experts.routed_experts";
    assert_tensor(
        &got,
        &format!("{p}.w13_weight"),
        "BF16",
        &[E, MI, H],
        &w13,
        "tp2 rank 1",
    );
    assert_tensor(
        &got,
        &format!("{p}.w2_weight"),
        "BF16",
        &[E, H, MI / 2],
        &w2,
        "tp2 rank 1",
    );
}

#[test]
fn ep2_places_whole_experts_and_keeps_the_rest_as_tp2() {
    let (src, ck) = checkpoint();
    let out = TempDir::new().unwrap();
    let (tp_dir, ep_dir) = (out.path().join("tp2"), out.path().join("ep2"));
    shard_ok(src.path(), 2, &tp_dir, &[]);
    shard_ok(src.path(), 2, &ep_dir, &["--enable-expert-parallel"]);
    let p = "model.layers.1.mlp.experts.routed_experts";
    for r in 0..2 {
        let ctx = format!("ep2 rank {r}");
        let (tp, ep) = (
            rank_tensors(&tp_dir, r as u64),
            rank_tensors(&ep_dir, r as u64),
        );
        check_common(&ep, &ck, r, 2, &ctx);
        // Linear placement: rank r holds experts [4r, 4r + 4), whole.
        let c = |n: String| &ck[&format!("model.layers.1.mlp.experts.{n}")];
        let experts = r * E / 2..(r + 1) * E / 2;
        let w13: Vec<u8> = experts
            .clone()
            .flat_map(|e| {
                cat(&[
                    &c(format!("{e}.gate_proj.weight")).data,
                    &c(format!("{e}.up_proj.weight")).data,
                ])
            })
            .collect();
        let w2: Vec<u8> = experts
            .flat_map(|e| c(format!("{e}.down_proj.weight")).data.clone())
            .collect();
        assert_tensor(
            &ep,
            &format!("{p}.w13_weight"),
            "BF16",
            &[E / 2, 2 * MI, H],
            &w13,
            &ctx,
        );
        assert_tensor(
            &ep,
            &format!("{p}.w2_weight"),
            "BF16",
            &[E / 2, H, MI],
            &w2,
            &ctx,
        );
        // Everything else, the shared experts and the router included, is TP2's.
        assert_eq!(
            tp.keys().collect::<Vec<_>>(),
            ep.keys().collect::<Vec<_>>(),
            "{ctx}: the same keys as tp2"
        );
        for (name, t) in tp
            .iter()
            .filter(|(n, _)| !n.starts_with(p) || n.ends_with("bias"))
        {
            assert!(ep[name].data == t.data, "{ctx}: {name} differs from tp2's");
            assert_eq!(ep[name].shape, t.shape, "{ctx}: {name}");
        }
    }
}

#[test]
fn the_mtp_layer_is_reported_as_skipped() {
    let (src, ck) = checkpoint();
    let plan = plan_json(src.path(), &[]);
    let skipped = skipped_tensors(&plan, "MTP");
    let mtp: Vec<String> = ck
        .keys()
        .filter(|n| n.starts_with("model.layers.2."))
        .cloned()
        .collect();
    assert_eq!(
        mtp.len(),
        44,
        "the MTP layer is a full MoE layer plus its own 4 tensors"
    );
    assert_eq!(skipped, mtp);
    let sources = plan["sources"].as_array().unwrap();
    assert!(
        sources
            .iter()
            .all(|t| !t["name"].as_str().unwrap().starts_with("model.layers.2.")),
        "no piece reads the MTP layer"
    );
}

#[test]
fn a_tp_that_does_not_divide_the_heads_is_refused() {
    let (src, _) = checkpoint();
    let out = TempDir::new().unwrap();
    let dir = out.path().join("tp3");
    let o = shard(src.path(), 3, &dir, &[]);
    assert_refusal_text(
        &o,
        3,
        &[
            "num_attention_heads (8) is not divisible by tp (3)",
            "moe_intermediate_size (64) is not divisible by tp (3)",
            "the shared experts' intermediate size (64) is not divisible by tp (3)",
        ],
    );
    assert!(!dir.exists(), "nothing written");
    // With expert parallelism the routed experts are whole, but the shared experts are still
    // tensor-parallel (glm4_moe.py:174–181): a shared size that --tp does not divide is refused
    // even then.
    let mut cfg: Value =
        serde_json::from_slice(&fs::read(src.path().join("config.json")).unwrap()).unwrap();
    cfg["moe_intermediate_size"] = json!(MI + 4); // 68: splits by 2 and 4, not 8
    write_json(&src.path().join("config.json"), &cfg);
    let o = run(&[
        "plan",
        s(src.path()),
        "--tp",
        "8",
        "--enable-expert-parallel",
    ]);
    assert_refusal_text(
        &o,
        3,
        &["the shared experts' intermediate size (68) is not divisible by tp (8)"],
    );
}

#[test]
fn inspect_is_clean() {
    let (src, _) = checkpoint();
    let out = run(&["inspect", s(src.path()), "--json"]);
    assert!(out.status.success(), "{}", context(&out));
    assert!(out.stderr.is_empty(), "inspect is clean: {}", context(&out));
    let v: Value = json_doc(&["inspect"], &out);
    assert_eq!(v["config"]["architecture"], "Glm4MoeForCausalLM", "{v}");
    assert_eq!(
        v["config"]["num_experts"], E,
        "n_routed_experts read as the expert count"
    );
    assert_eq!(v["totals"]["tensors"], specs().len());
    assert_eq!(v["dropped"], json!([]));
    assert_eq!(v["duplicates"], json!([]));
}

/// The checkpoint as a block-FP8 release (`quant_method: fp8`, 32×32 blocks) ships it: every
/// projection F8_E4M3 with an F32 `weight_scale_inv`, the router left BF16, and the config's
/// `ignored_layers` not naming the router — vLLM builds it without the quant config
/// (glm4_moe.py:141–147), so it is never quantized, whatever the config lists.
#[test]
fn block_fp8_keeps_the_router_f32_and_quantizes_the_shared_experts() {
    let mut tensors = tensors();
    let projections: Vec<String> = tensors
        .keys()
        .filter(|n| n.ends_with("_proj.weight"))
        .cloned()
        .collect();
    for name in projections {
        let t = tensors.get_mut(&name).unwrap();
        // A BF16 byte pair's high byte, without E4M3's NaN pattern: a valid FP8 value.
        t.data = t.data.chunks(2).map(|b| b[1] & 0x77).collect();
        t.dtype = "F8_E4M3".into();
        let blocks = vec![t.shape[0].div_ceil(32), t.shape[1].div_ceil(32)];
        let n = blocks.iter().product::<u64>() as usize;
        let scale = Held {
            dtype: "F32".into(),
            shape: blocks,
            data: f32_data(7, n),
        };
        tensors.insert(format!("{name}_scale_inv"), scale);
    }
    let mut cfg = config();
    cfg["quantization_config"] = json!({
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": [32, 32]
    });
    let src = write_checkpoint(&cfg, &tensors);
    let plan = plan_json(src.path(), &[]);
    let rank0: BTreeMap<String, (String, Vec<u64>)> = plan["ranks"][0]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let (name, dtype, shape) = json_tensor(t);
            (name, (dtype, shape))
        })
        .collect();
    let l = |n: &str| format!("model.layers.1.{n}");
    let at = |n: &str| rank0.get(&l(n)).unwrap_or_else(|| panic!("no {n}")).clone();
    assert_eq!(
        at("mlp.gate.weight"),
        ("F32".into(), vec![E as u64, H as u64])
    );
    assert!(
        !rank0.contains_key(&l("mlp.gate.weight_scale_inv")),
        "the router has no scale"
    );
    let bias = at("mlp.experts.routed_experts.e_score_correction_bias");
    assert_eq!(bias, ("F32".into(), vec![E as u64]));
    let shared = |n: &str| at(&format!("mlp.experts._shared_experts._layer.{n}"));
    let (s, h) = ((MI / 2) as u64, H as u64);
    assert_eq!(
        shared("gate_up_proj.weight"),
        ("F8_E4M3".into(), vec![2 * s, h])
    );
    assert_eq!(
        shared("gate_up_proj.weight_scale_inv"),
        ("F32".into(), vec![2 * s / 32, h / 32])
    );
    assert_eq!(shared("down_proj.weight"), ("F8_E4M3".into(), vec![h, s]));
    assert_eq!(
        shared("down_proj.weight_scale_inv"),
        ("F32".into(), vec![h / 32, s / 32])
    );
    let w13 = at("mlp.experts.routed_experts.w13_weight_scale_inv");
    assert_eq!(w13, ("F32".into(), vec![E as u64, 2 * s / 32, h / 32]));
    // The router's bytes on disk: the BF16 checkpoint values widened, as without FP8.
    let out = TempDir::new().unwrap();
    shard_ok(src.path(), 2, out.path(), &[]);
    let got = rank_tensors(out.path(), 1);
    let router = widen(&tensors[&l("mlp.gate.weight")].data);
    assert_tensor(
        &got,
        &l("mlp.gate.weight"),
        "F32",
        &[E, H],
        &router,
        "fp8 rank 1",
    );
}
