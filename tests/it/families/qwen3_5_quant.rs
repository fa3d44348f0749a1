//! Quantized Qwen3.5 (vllm-spec §13.2) on small generated text checkpoints, for the formats with
//! no golden case here: GPTQ (the fused on-disk `in_proj_qkv` cut per shard in packed columns,
//! `in_proj_ba` whole on every rank by vLLM's CUDA rule, recorded as such, and the module list an
//! output's config must carry to reload, §13.6) and ModelOpt NVFP4 (the tuple's one scalar in
//! slots 0–2 of `[4]` scales, the excluded `in_proj_ba` split). AWQ's is the golden
//! `qwen3_5_awq`; its `modules_to_not_convert: null`, which vLLM fails on (§13.7), is refused here.

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::*;

/// Hidden size, GDN key heads × dim, value heads × dim (16 value heads, as the spec's GPTQ
/// fixture, so that a split `in_proj_b` / `in_proj_a` would still pack), attention heads.
const H: usize = 128;
const KEY: usize = 4 * 16;
const NV: usize = 16;
const VALUE: usize = NV * 16;
const LAYERS: usize = 4;

/// A dense Qwen3.5 text config: layers `[lin, lin, lin, full]`, 4 q / 2 kv heads of 32.
fn config(dtype: &str) -> Value {
    json!({
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "dtype": dtype,
        "hidden_size": H, "intermediate_size": 256, "num_hidden_layers": LAYERS,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "attn_output_gate": true,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_num_key_heads": 4,
        "linear_value_head_dim": 16, "linear_num_value_heads": NV, "vocab_size": 300,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "max_position_embeddings": 256,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}
    })
}

/// Every linear layer `(module, out, in)` of layer `i`, as the checkpoint names it.
fn linears(i: usize) -> Vec<(String, usize, usize)> {
    let l = format!("model.layers.{i}");
    let mut out: Vec<(String, usize, usize)> = if i < 3 {
        vec![
            ("linear_attn.in_proj_qkv", 2 * KEY + VALUE, H),
            ("linear_attn.in_proj_z", VALUE, H),
            ("linear_attn.in_proj_b", NV, H),
            ("linear_attn.in_proj_a", NV, H),
            ("linear_attn.out_proj", H, VALUE),
        ]
    } else {
        vec![
            ("self_attn.q_proj", 2 * 4 * 32, H),
            ("self_attn.k_proj", 64, H),
            ("self_attn.v_proj", 64, H),
            ("self_attn.o_proj", H, 128),
        ]
    }
    .into_iter()
    .map(|(m, n, k)| (m.to_string(), n, k))
    .collect();
    out.extend([
        ("mlp.gate_proj".to_string(), 256, H),
        ("mlp.up_proj".to_string(), 256, H),
        ("mlp.down_proj".to_string(), H, 256),
    ]);
    out.into_iter()
        .map(|(m, n, k)| (format!("{l}.{m}"), n, k))
        .collect()
}

/// Distinct bytes for each tensor (`seed` its place in the list).
fn bytes(seed: usize, n: usize) -> Vec<u8> {
    (0..n)
        .map(|k| (mix((seed as u64) << 32 | k as u64) & 0x7f) as u8)
        .collect()
}

/// The unquantized tensors (norms, GDN state, embeddings) in the model dtype `dt` (F16 / BF16),
/// plus the linear layers `quantized` makes of each `(module, out, in)`; `keep` names the
/// linear modules stored unquantized.
fn checkpoint(
    dt: &str,
    quantized: impl Fn(&str, usize, usize) -> Vec<(String, &'static str, Vec<usize>)>,
    keep: &[&str],
) -> Tensors {
    let mut specs: Vec<(String, &str, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), dt, vec![300, H]),
        ("model.norm.weight".into(), dt, vec![H]),
        ("lm_head.weight".into(), dt, vec![300, H]),
    ];
    for i in 0..LAYERS {
        let l = format!("model.layers.{i}");
        specs.push((format!("{l}.input_layernorm.weight"), dt, vec![H]));
        specs.push((format!("{l}.post_attention_layernorm.weight"), dt, vec![H]));
        if i < 3 {
            let a = format!("{l}.linear_attn");
            specs.push((format!("{a}.A_log"), dt, vec![NV]));
            specs.push((format!("{a}.dt_bias"), dt, vec![NV]));
            specs.push((
                format!("{a}.conv1d.weight"),
                dt,
                vec![2 * KEY + VALUE, 1, 4],
            ));
            specs.push((format!("{a}.norm.weight"), dt, vec![16]));
        } else {
            specs.push((format!("{l}.self_attn.q_norm.weight"), dt, vec![32]));
            specs.push((format!("{l}.self_attn.k_norm.weight"), dt, vec![32]));
        }
        for (m, n, k) in linears(i) {
            if keep.iter().any(|s| m.ends_with(s)) {
                specs.push((format!("{m}.weight"), dt, vec![n, k]));
            } else {
                specs.extend(quantized(&m, n, k));
            }
        }
    }
    let width = |d: &str| match d {
        "F32" | "I32" => 4,
        "F16" | "BF16" => 2,
        _ => 1,
    };
    (specs.into_iter().enumerate())
        .map(|(seed, (name, d, shape))| {
            let n = shape.iter().product::<usize>().max(1) * width(d);
            (name, Held::new(d, &shape, bytes(seed, n)))
        })
        .collect()
}

/// Of each 2-D part, columns `[from, to)`, the parts side by side row by row (all have as many
/// rows): a rank's packed columns of a fused layer.
fn side_by_side(parts: &[(&Held, usize, usize)]) -> Vec<u8> {
    let cut: Vec<Vec<u8>> = parts.iter().map(|(t, a, b)| t.cols(*a, *b)).collect();
    let rows = parts[0].0.shape[0] as usize;
    (0..rows)
        .flat_map(|r| {
            cut.iter()
                .map(move |c| {
                    let w = c.len() / rows;
                    c[r * w..(r + 1) * w].to_vec()
                })
                .collect::<Vec<_>>()
        })
        .flatten()
        .collect()
}

fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// GPTQ int4 g32 (tp2): `in_proj_qkvz.qweight [16, 320]` = q 32 | k 32 | v 128 | z 128 columns,
/// `qzeros [4, 40]` the same at offsets / 8, `scales [4, 320]`; `in_proj_ba` `[16, 32]` = `[b | a]`
/// whole on both ranks (the CUDA rule, `module_tree: cuda` in wload.json); the output's config
/// lists the checkpoint's quantized modules, GDN names included, within the block.
#[test]
fn gptq_cuts_the_fused_gdn_projection_per_shard_and_replicates_in_proj_ba() {
    let gptq = |m: &str, n: usize, k: usize| {
        vec![
            (format!("{m}.qweight"), "I32", vec![k / 8, n]),
            (format!("{m}.qzeros"), "I32", vec![k / 32, n / 8]),
            (format!("{m}.scales"), "F16", vec![k / 32, n]),
            (format!("{m}.g_idx"), "I32", vec![k]),
        ]
    };
    let ckpt = checkpoint("F16", gptq, &[]);
    let mut cfg = config("float16");
    cfg["quantization_config"] = json!({"quant_method": "gptq", "bits": 4, "group_size": 32,
        "desc_act": false, "sym": true});
    let src = write_checkpoint(&cfg, &ckpt);
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("o");
    shard_ok(src.path(), 2, &out, &["-q"]);
    let a = "model.layers.1.linear_attn";
    let c = |p: &str| &ckpt[&format!("{a}.{p}")];
    for r in 0..2usize {
        let got = rank_tensors(&out, r as u64);
        let ctx = format!("rank {r}");
        // Columns of [q | k | v] (64, 64, 256) and z (256), in units of `d` per word.
        let qkvz = |p: &str, d: usize| {
            let (qkv, z) = (c(&format!("in_proj_qkv.{p}")), c(&format!("in_proj_z.{p}")));
            let (k, v) = (KEY / 2 / d, VALUE / 2 / d);
            side_by_side(&[
                (qkv, r * k, (r + 1) * k),
                (qkv, 2 * k + r * k, 2 * k + (r + 1) * k),
                (qkv, 4 * k + r * v, 4 * k + (r + 1) * v),
                (z, r * v, (r + 1) * v),
            ])
        };
        let f = |p: &str| format!("{a}.in_proj_qkvz.{p}");
        assert_tensor(
            &got,
            &f("qweight"),
            "I32",
            &[16, 320],
            &qkvz("qweight", 1),
            &ctx,
        );
        assert_tensor(
            &got,
            &f("qzeros"),
            "I32",
            &[4, 40],
            &qkvz("qzeros", 8),
            &ctx,
        );
        assert_tensor(
            &got,
            &f("scales"),
            "F16",
            &[4, 320],
            &qkvz("scales", 1),
            &ctx,
        );
        let ba = |p: &str, n: usize| {
            let (b, a2) = (c(&format!("in_proj_b.{p}")), c(&format!("in_proj_a.{p}")));
            side_by_side(&[(b, 0, n), (a2, 0, n)])
        };
        let f = |p: &str| format!("{a}.in_proj_ba.{p}");
        assert_tensor(
            &got,
            &f("qweight"),
            "I32",
            &[16, 32],
            &ba("qweight", 16),
            &ctx,
        );
        assert_tensor(&got, &f("qzeros"), "I32", &[4, 4], &ba("qzeros", 2), &ctx);
        assert_tensor(&got, &f("scales"), "F16", &[4, 32], &ba("scales", 16), &ctx);
        assert!(
            !got.keys().any(|k| k.ends_with("g_idx")),
            "{ctx}: g_idx dropped"
        );
    }
    let record = read_json(&out.join("wload.json"));
    assert_eq!(record["module_tree"], "cuda", "the CUDA rule is recorded");
    let listed =
        read_json(&out.join("config.json"))["quantization_config"]["modules_in_block_to_quantize"]
            .clone();
    let flat: Vec<&str> = (listed.as_array().unwrap().iter())
        .flat_map(|g| g.as_array().unwrap())
        .map(|n| n.as_str().unwrap())
        .collect();
    for m in [
        "linear_attn.in_proj_qkv",
        "linear_attn.in_proj_z",
        "linear_attn.in_proj_b",
        "linear_attn.in_proj_a",
        "linear_attn.out_proj",
        "self_attn.q_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.down_proj",
    ] {
        assert!(flat.contains(&m), "{m} in {listed}");
    }
    // At tp 1 nothing differs by platform: no platform recorded.
    let one = tmp.path().join("one");
    shard_ok(src.path(), 1, &one, &["-q"]);
    assert!(
        read_json(&one.join("wload.json"))
            .get("module_tree")
            .is_none()
    );
}

/// ModelOpt NVFP4 (tp2): `in_proj_qkvz.weight` rows `[q_r; k_r; v_r; z_r]` (U8, two values a
/// byte), `weight_scale_2` / `input_scale` F32 `[4]` = `[s_qkv, s_qkv, s_qkv, s_z]`; the excluded
/// `in_proj_ba` BF16 split `[b_r; a_r]` (ModelOpt is not a Marlin INT config: no replication).
#[test]
fn nvfp4_fills_the_tuples_scale_slots_and_splits_the_excluded_in_proj_ba() {
    let nvfp4 = |m: &str, n: usize, k: usize| {
        vec![
            (format!("{m}.weight"), "U8", vec![n, k / 2]),
            (format!("{m}.weight_scale"), "F8_E4M3", vec![n, k / 16]),
            (format!("{m}.weight_scale_2"), "F32", vec![]),
            (format!("{m}.input_scale"), "F32", vec![]),
        ]
    };
    let ckpt = checkpoint("BF16", nvfp4, &["in_proj_b", "in_proj_a"]);
    let src = write_checkpoint(&config("bfloat16"), &ckpt);
    // As ModelOpt writes its exclusions: each excluded module by its full name.
    let mut exclude = vec![json!("lm_head")];
    for i in 0..3 {
        for p in ["in_proj_b", "in_proj_a"] {
            exclude.push(json!(format!("model.layers.{i}.linear_attn.{p}")));
        }
    }
    write_json(
        &src.path().join("hf_quant_config.json"),
        &json!({"producer": {"name": "modelopt", "version": "0.23.0"},
                "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
                                 "exclude_modules": exclude}}),
    );
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("o");
    shard_ok(src.path(), 2, &out, &["-q"]);
    let a = "model.layers.2.linear_attn";
    let c = |p: &str| &ckpt[&format!("{a}.{p}")];
    for r in 0..2usize {
        let got = rank_tensors(&out, r as u64);
        let ctx = format!("rank {r}");
        let rows = |p: &str| {
            let (qkv, z) = (c(&format!("in_proj_qkv.{p}")), c(&format!("in_proj_z.{p}")));
            let (k, v) = (KEY / 2, VALUE / 2);
            [
                qkv.rows(r * k, (r + 1) * k),
                qkv.rows(2 * k + r * k, 2 * k + (r + 1) * k),
                qkv.rows(4 * k + r * v, 4 * k + (r + 1) * v),
                z.rows(r * v, (r + 1) * v),
            ]
            .concat()
        };
        let f = |p: &str| format!("{a}.in_proj_qkvz.{p}");
        assert_tensor(&got, &f("weight"), "U8", &[320, 64], &rows("weight"), &ctx);
        assert_tensor(
            &got,
            &f("weight_scale"),
            "F8_E4M3",
            &[320, 8],
            &rows("weight_scale"),
            &ctx,
        );
        for s in ["weight_scale_2", "input_scale"] {
            let (qkv, z) = (
                &c(&format!("in_proj_qkv.{s}")).data,
                &c(&format!("in_proj_z.{s}")).data,
            );
            let want = [&qkv[..], qkv, qkv, z].concat();
            assert_tensor(&got, &f(s), "F32", &[4], &want, &ctx);
        }
        let (b, a2) = (c("in_proj_b.weight"), c("in_proj_a.weight"));
        let n = NV / 2;
        let want = [b.rows(r * n, (r + 1) * n), a2.rows(r * n, (r + 1) * n)].concat();
        assert_tensor(
            &got,
            &format!("{a}.in_proj_ba.weight"),
            "BF16",
            &[16, 128],
            &want,
            &ctx,
        );
    }
    assert!(
        read_json(&out.join("wload.json"))
            .get("module_tree")
            .is_none()
    );
}

/// AutoAWQ's `modules_to_not_convert: null` on a GDN checkpoint: vLLM derives the list from the
/// dtypes, which names `…linear_attn` itself (it owns the float `A_log`, `dt_bias`), matches it
/// as a substring and builds the quantized projections under it unquantized; the load fails.
#[test]
fn awq_without_modules_to_not_convert_on_a_gdn_checkpoint_is_refused_in_vllms_words() {
    let src = copy_fixture("qwen3_5_awq");
    let path = src.path().join("config.json");
    let mut cfg = read_json(&path);
    cfg["quantization_config"]["modules_to_not_convert"] = Value::Null;
    write_json(&path, &cfg);
    let tmp = TempDir::new().unwrap();
    let o = shard(src.path(), 2, &tmp.path().join("o"), &[]);
    let text = assert_refusal_text(
        &o,
        3,
        &[
            "AttributeError: 'MergedColumnParallelLinear' object has no attribute 'data'",
            "model.language_model.layers.0.linear_attn`",
            "modules_to_not_convert",
        ],
    );
    assert!(!tmp.path().join("o").exists(), "{text}");
}
