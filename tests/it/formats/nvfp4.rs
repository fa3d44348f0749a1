//! ModelOpt NVFP4: every rank's packed weights, unpacked to FP4 codes and put back together, are
//! the checkpoint's, at every TP size (fused qkv and gate/up, kv heads replicated at TP 8, the
//! packed input split of row-parallel layers); global scales per part; experts under TP, and
//! under EP with the input scales `--moe-backend` sizes (refused without it, with the reason);
//! ModelOpt algorithms wload does not write refused by name.

use std::path::Path;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::{
    Fp4Names, Held, assert_llama_gqa_fp4_reassembles, assert_refusal_text, copy_fixture, fixture,
    rank_tensors, read_files, s, shard, shard_ok, write_json, write_safetensors,
};

const FIXTURE: &str = "llama_gqa_modelopt_nvfp4";

#[test]
fn unpacked_ranks_put_back_together_are_the_checkpoint_at_every_tp() {
    let names = Fp4Names {
        weight: "weight",
        per_part: &["weight_scale_2", "input_scale"],
    };
    assert_llama_gqa_fp4_reassembles(&fixture(FIXTURE), &names, &[1, 2, 4, 8]);
}

/// A row-parallel layer whose input per rank is not a multiple of 16 is refused as vLLM refuses it.
#[test]
fn an_input_split_off_the_16_grid_is_refused_naming_the_layer_and_the_fix() {
    let src = copy_fixture(FIXTURE);
    let out = TempDir::new().unwrap();
    // o_proj's input 128 at tp 16 would leave 8 per rank (and 8 heads do not split 16 ways:
    // both are reported).
    let o = shard(src.path(), 16, &out.path().join("o"), &[]);
    let text = assert_refusal_text(
        &o,
        3,
        &[
            "model.layers.0.self_attn.o_proj",
            "not multiple of 16",
            "per rank at tp 16: 8",
        ],
    );
    assert!(text.contains("use a TP size"), "{text}");
}

#[test]
fn other_modelopt_algorithms_are_refused_by_name_with_the_fix() {
    let src = copy_fixture(FIXTURE);
    let path = src.path().join("hf_quant_config.json");
    let mut qc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    qc["quantization"]["quant_algo"] = json!("FP8");
    write_json(&path, &qc);
    let out = TempDir::new().unwrap();
    let o = shard(src.path(), 2, &out.path().join("o"), &[]);
    let text = assert_refusal_text(&o, 3, &["quant_algo \"FP8\" is not supported", "NVFP4"]);
    assert!(!out.path().join("o").exists(), "{text}");
}

/// A one-layer Qwen3-MoE in ModelOpt NVFP4 with 4 experts (hidden 64, expert intermediate 64),
/// attention and router unquantized by `exclude_modules`.
pub(super) fn nvfp4_moe(dir: &Path) {
    let (h, i, e) = (64u64, 64u64, 4u64);
    write_json(
        &dir.join("config.json"),
        &json!({
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": h, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "num_experts": e, "num_experts_per_tok": 2, "moe_intermediate_size": i,
            "intermediate_size": 128, "vocab_size": 64, "num_hidden_layers": 1,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "dtype": "bfloat16"
        }),
    );
    write_json(
        &dir.join("hf_quant_config.json"),
        &json!({"producer": {"name": "modelopt", "version": "0.23.0"},
                "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
                                 "exclude_modules": ["lm_head", "model.layers.0.self_attn*", "model.layers.0.mlp.gate"]}}),
    );
    let mut specs: Vec<(String, &str, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), "BF16", vec![64, h]),
        ("model.norm.weight".into(), "BF16", vec![h]),
        ("lm_head.weight".into(), "BF16", vec![64, h]),
    ];
    let l = "model.layers.0";
    for (p, n) in [("q_proj", 64), ("k_proj", 32), ("v_proj", 32)] {
        specs.push((format!("{l}.self_attn.{p}.weight"), "BF16", vec![n, h]));
    }
    specs.push((format!("{l}.self_attn.o_proj.weight"), "BF16", vec![h, 64]));
    specs.push((format!("{l}.self_attn.q_norm.weight"), "BF16", vec![16]));
    specs.push((format!("{l}.self_attn.k_norm.weight"), "BF16", vec![16]));
    specs.push((format!("{l}.mlp.gate.weight"), "BF16", vec![e, h]));
    specs.push((format!("{l}.input_layernorm.weight"), "BF16", vec![h]));
    specs.push((
        format!("{l}.post_attention_layernorm.weight"),
        "BF16",
        vec![h],
    ));
    for x in 0..e {
        let p = format!("{l}.mlp.experts.{x}");
        for (proj, n, k) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)] {
            specs.push((format!("{p}.{proj}.weight"), "U8", vec![n, k / 2]));
            specs.push((
                format!("{p}.{proj}.weight_scale"),
                "F8_E4M3",
                vec![n, k / 16],
            ));
            specs.push((format!("{p}.{proj}.weight_scale_2"), "F32", vec![]));
            specs.push((format!("{p}.{proj}.input_scale"), "F32", vec![]));
        }
    }
    let datas: Vec<Vec<u8>> = (specs.iter().enumerate())
        .map(|(k, (_, d, sh))| {
            let width = if *d == "BF16" || *d == "F32" {
                if *d == "F32" { 4 } else { 2 }
            } else {
                1
            };
            let n = sh.iter().product::<u64>().max(1) as usize * width;
            (0..n)
                .map(|b| ((b * 31 + k * 7) % 251) as u8 & 0x77)
                .collect()
        })
        .collect();
    let tensors: Vec<_> = (specs.iter().zip(&datas))
        .map(|((n, d, sh), data)| (n.as_str(), *d, sh.as_slice(), data.as_slice()))
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
}

#[test]
fn nvfp4_experts_split_under_tp() {
    let src = TempDir::new().unwrap();
    nvfp4_moe(src.path());
    let ck = read_files(&[src.path().join("model.safetensors")]);
    let out = TempDir::new().unwrap();
    shard_ok(src.path(), 2, out.path(), &[]);
    let base = "model.layers.0.mlp.experts.routed_experts";
    let x = "model.layers.0.mlp.experts";
    for r in 0..2u64 {
        let t = rank_tensors(out.path(), r);
        let shape = |n: &str| {
            (
                t[&format!("{base}.{n}")].dtype.clone(),
                t[&format!("{base}.{n}")].shape.clone(),
            )
        };
        for (n, d, sh) in [
            ("w13_weight", "U8", vec![4, 64, 32]),
            ("w2_weight", "U8", vec![4, 64, 16]),
            ("w13_weight_scale", "F8_E4M3", vec![4, 64, 4]),
            ("w2_weight_scale", "F8_E4M3", vec![4, 64, 2]),
            ("w13_weight_scale_2", "F32", vec![4, 2]),
            ("w2_weight_scale_2", "F32", vec![4]),
            ("w13_input_scale", "F32", vec![4, 2]),
            ("w2_input_scale", "F32", vec![4]),
        ] {
            assert_eq!(shape(n), (d.to_string(), sh), "rank {r} {n}");
        }
        // Expert 3's rows: gate then up, this rank's half of each; its down_proj packed columns.
        let w13 = &t[&format!("{base}.w13_weight")];
        let expert = w13.data.len() / 4;
        let e3 = &w13.data[3 * expert..4 * expert];
        let gate = &ck[&format!("{x}.3.gate_proj.weight")];
        let up = &ck[&format!("{x}.3.up_proj.weight")];
        let half = |m: &Held| m.rows(32 * r as usize, 32 * (r as usize + 1)).to_vec();
        assert_eq!(e3, [half(gate), half(up)].concat(), "rank {r} expert 3 w13");
        let w2 = &t[&format!("{base}.w2_weight")];
        let e3 = w2.data[3 * w2.data.len() / 4..].to_vec();
        let down = &ck[&format!("{x}.3.down_proj.weight")];
        assert_eq!(
            e3,
            down.cols(16 * r as usize, 16 * (r as usize + 1)),
            "rank {r} expert 3 w2"
        );
        let s2 = &t[&format!("{base}.w13_weight_scale_2")];
        let want = [
            ck[&format!("{x}.2.gate_proj.weight_scale_2")].data.clone(),
            ck[&format!("{x}.2.up_proj.weight_scale_2")].data.clone(),
        ]
        .concat();
        assert_eq!(
            &s2.data[16..24],
            &want[..],
            "rank {r} expert 2 [gate, up] global scales"
        );
    }
}

/// Under EP the input scales follow `--moe-backend`: the rank's own experts' on MARLIN (and the
/// other non-FlashInfer backends), every expert's at its global id on every rank on a FlashInfer
/// backend, the checkpoint's values both ways; the other parameters are the rank's experts'
/// either way. Recorded in wload.json and the serve line. (Byte for byte against real vLLM:
/// the golden cases `nvfp4_moe_modelopt__ep` and `…__moe_flashinfer_trtllm`.)
#[test]
fn nvfp4_expert_input_scales_under_ep_follow_the_moe_backend() {
    let src = TempDir::new().unwrap();
    nvfp4_moe(src.path());
    let ck = read_files(&[src.path().join("model.safetensors")]);
    let base = "model.layers.0.mlp.experts.routed_experts";
    let x = "model.layers.0.mlp.experts";
    let scale = |e: u64, proj: &str| ck[&format!("{x}.{e}.{proj}.input_scale")].data.clone();
    for (backend, global) in [
        ("marlin", false),
        ("humming", false),
        ("flashinfer_trtllm", true),
        ("flashinfer-cutlass", true),
    ] {
        let out = TempDir::new().unwrap();
        let flags = ["--enable-expert-parallel", "--moe-backend", backend];
        shard_ok(src.path(), 2, out.path(), &flags);
        let m: Value =
            serde_json::from_slice(&std::fs::read(out.path().join("wload.json")).unwrap()).unwrap();
        let norm = backend.replace('-', "_");
        assert_eq!(m["moe_backend"], json!(norm), "{backend}");
        let argv: Vec<&str> = (m["serve"]["argv"].as_array().unwrap().iter())
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(
            argv.windows(2).any(|w| w == ["--moe-backend", &norm]),
            "{backend}: {argv:?}"
        );
        for r in 0..2u64 {
            let t = rank_tensors(out.path(), r);
            let held: Vec<u64> = if global {
                vec![0, 1, 2, 3]
            } else {
                vec![2 * r, 2 * r + 1]
            };
            let e_in = held.len() as u64;
            for (n, sh) in [
                ("w13_weight", vec![2, 128, 32]),
                ("w13_weight_scale_2", vec![2, 2]),
                ("w13_input_scale", vec![e_in, 2]),
                ("w2_input_scale", vec![e_in]),
            ] {
                assert_eq!(
                    t[&format!("{base}.{n}")].shape,
                    sh,
                    "{backend} rank {r} {n}"
                );
            }
            let w13: Vec<u8> = (held.iter())
                .flat_map(|&e| [scale(e, "gate_proj"), scale(e, "up_proj")].concat())
                .collect();
            let w2: Vec<u8> = held.iter().flat_map(|&e| scale(e, "down_proj")).collect();
            assert_eq!(
                t[&format!("{base}.w13_input_scale")].data,
                w13,
                "{backend} rank {r}"
            );
            assert_eq!(
                t[&format!("{base}.w2_input_scale")].data,
                w2,
                "{backend} rank {r}"
            );
        }
    }
}

/// Without `--moe-backend` NVFP4 experts under EP are refused naming the flag and the backends
/// on either side; a name vLLM does not take for NVFP4 experts is refused in its words; a dense
/// NVFP4 checkpoint has nothing for the flag to lay out.
#[test]
fn nvfp4_experts_under_ep_need_the_moe_backend_and_one_vllm_takes() {
    let src = TempDir::new().unwrap();
    nvfp4_moe(src.path());
    let out = TempDir::new().unwrap();
    let o = shard(
        src.path(),
        2,
        &out.path().join("ep"),
        &["--enable-expert-parallel"],
    );
    let text = assert_refusal_text(
        &o,
        3,
        &[
            "1 problem found",
            "w13_weight",
            "expert parallelism",
            "all 4 experts on the FlashInfer backends",
            "pass --moe-backend",
            "flashinfer_trtllm, flashinfer_cutlass, flashinfer_cutedsl, flashinfer_b12x",
            "marlin on H100/H200",
        ],
    );
    assert!(text.contains("without --enable-expert-parallel"), "{text}");
    assert!(!Path::new(s(&out.path().join("ep"))).exists());
    let o = shard(
        src.path(),
        2,
        &out.path().join("tr"),
        &["--enable-expert-parallel", "--moe-backend", "triton"],
    );
    assert_refusal_text(
        &o,
        3,
        &[
            "1 problem found",
            "moe_backend='triton' is not supported for NvFP4 MoE. Expected one of ['b12x', 'cutlass',",
        ],
    );
    let o = shard(
        &fixture(FIXTURE),
        2,
        &out.path().join("dense"),
        &["--moe-backend", "marlin"],
    );
    assert_refusal_text(&o, 3, &["--moe-backend marlin", "leave out --moe-backend"]);
}
