//! The MLA families of late 2026 beyond their golden TP2 cases (byte-identical to real vLLM 0.33,
//! run with the other golden cases): GLM-4.7-Flash (`Glm4MoeLiteForCausalLM`), DeepSeek-V3.2
//! (`DeepseekV32ForCausalLM`, CUDA module tree) and GLM-5 on the same tree. Every checkpoint is
//! the golden fixture or derived from it, and every rank is checked against vLLM's files for the
//! case (`GoldenCase::vllm_dir`) and the fixture's bytes: expert parallelism, the indexer
//! schedule, the platform note, and what vLLM refuses.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tempfile::TempDir;

use crate::support::*;

const GLM: &str = "glm4_moe_lite";
const DSV32: &str = "deepseek_v32";
const H: usize = 128; // hidden_size of both fixtures
const MI: usize = 64; // moe_intermediate_size of both fixtures

/// vLLM's own TP2 files for the golden case of `fixture` (rebuilt from the digests).
fn vllm_tp2(fixture: &str) -> PathBuf {
    golden_cases()
        .into_iter()
        .find(|c| c.name == format!("{fixture}/tp2"))
        .unwrap_or_else(|| panic!("a golden case {fixture}/tp2"))
        .vllm_dir()
}

fn l(i: usize, n: &str) -> String {
    format!("model.layers.{i}.{n}")
}

/// The routed experts `experts` of layer 1 whole, from the checkpoint `ck`, as vLLM holds them
/// under expert parallelism: w13 `[gate; up]` and w2 `down` per expert.
fn whole_experts(ck: &Tensors, experts: std::ops::Range<usize>) -> (Vec<u8>, Vec<u8>) {
    let (mut w13, mut w2) = (Vec::new(), Vec::new());
    for e in experts {
        let c = |n: &str| &ck[&l(1, &format!("mlp.experts.{e}.{n}.weight"))].data;
        w13.extend_from_slice(c("gate_proj"));
        w13.extend_from_slice(c("up_proj"));
        w2.extend_from_slice(c("down_proj"));
    }
    (w13, w2)
}

/// Shards `fixture` at TP 2 with expert parallelism and checks each rank: the same keys as vLLM's
/// TP2 output, every tensor but the routed experts byte-identical to it, and the routed experts
/// `e` whole experts per rank, placed linearly.
fn assert_expert_parallel(case: &str, e: usize) {
    let ck = checkpoint_tensors(&fixture(case));
    let vllm = vllm_tp2(case);
    let tmp = TempDir::new().unwrap();
    shard_ok(
        &fixture(case),
        2,
        tmp.path(),
        &["--enable-expert-parallel", "-q"],
    );
    let routed = l(1, "mlp.experts.routed_experts.w");
    for r in 0..2u64 {
        let ctx = format!("{case} ep2 rank {r}");
        let got = rank_tensors(tmp.path(), r);
        let want = rank_tensors(&vllm, r);
        let keys = |t: &Tensors| t.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&got), keys(&want), "{ctx}: keys");
        for (name, t) in got.iter().filter(|(n, _)| !n.starts_with(&routed)) {
            assert!(*t == want[name], "{ctx}: '{name}' differs from vLLM's TP2");
        }
        let r = r as usize;
        let (w13, w2) = whole_experts(&ck, r * e / 2..(r + 1) * e / 2);
        let name = format!("{routed}13_weight");
        assert_tensor(&got, &name, "BF16", &[e / 2, 2 * MI, H], &w13, &ctx);
        let name = format!("{routed}2_weight");
        assert_tensor(&got, &name, "BF16", &[e / 2, H, MI], &w2, &ctx);
    }
}

// --- GLM-4.7-Flash ------------------------------------------------------------------------------

#[test]
fn glm4_moe_lite_expert_parallel_places_whole_experts_and_keeps_the_rest() {
    assert_expert_parallel(GLM, 8);
}

/// Glm4MoeLiteConfig has no first_k_dense_replace, yet vLLM reads it (glm4_moe_lite.py:170): a
/// config.json without one fails in vLLM with AttributeError, and wload says so, alone.
#[test]
fn glm4_moe_lite_without_first_k_dense_replace_is_refused() {
    let dir = fixture_with(GLM, |c| {
        c.remove("first_k_dense_replace");
    });
    let o = run(&["plan", s(dir.path()), "--tp", "2"]);
    let err = assert_refusal_text(
        &o,
        3,
        &[
            "config.json has no first_k_dense_replace",
            "add \"first_k_dense_replace\": N to config.json",
        ],
    );
    assert!(
        err.contains("1 problem found"),
        "only the missing field: {err}"
    );
}

/// Its router and correction bias stay F32 and the experts' sizes decide the TP sizes vLLM takes.
#[test]
fn glm4_moe_lite_refusals_name_what_vllm_asserts() {
    let f = fixture(GLM);
    // 8 heads: TP 16 cannot split them.
    let o = run(&["plan", s(&f), "--tp", "16"]);
    assert_refusal_text(
        &o,
        3,
        &["num_attention_heads (8) is not divisible by tp (16)"],
    );
    // TP 3: neither the routed nor the shared experts' 64 rows split; EP takes the routed ones
    // whole, not the shared.
    let o = run(&["plan", s(&f), "--tp", "3", "--enable-expert-parallel"]);
    let err = assert_refusal_text(
        &o,
        3,
        &["the shared experts' intermediate size (64) is not divisible by tp (3)"],
    );
    assert!(!err.contains("moe_intermediate_size (64)"), "{err}");
    // Two stages of one layer each: the first holds no MoE layer (glm4_moe.py:507–509).
    let o = run(&["plan", s(&f), "--tp", "1", "--pp", "2"]);
    assert_refusal_text(&o, 3, &["No Glm4MoE layer found in model.layers."]);
}

// --- DeepSeek-V3.2 ------------------------------------------------------------------------------

#[test]
fn deepseek_v32_expert_parallel_places_whole_experts_and_keeps_the_rest() {
    assert_expert_parallel(DSV32, 4);
}

/// The folder holds CUDA's module tree: wload.json, plan --json and inspect say so; a family with
/// one tree everywhere says nothing.
#[test]
fn deepseek_v32_output_says_it_is_for_the_cuda_module_tree() {
    let tmp = TempDir::new().unwrap();
    let (v32, glm) = (tmp.path().join("v32"), tmp.path().join("glm"));
    let o = shard_ok(&fixture(DSV32), 2, &v32, &[]);
    assert!(
        stdout(&o).contains("platform: cuda module tree: serve on cuda only"),
        "{}",
        stdout(&o)
    );
    let o = shard_ok(&fixture(GLM), 2, &glm, &[]);
    assert!(!stdout(&o).contains("platform:"), "{}", stdout(&o));
    let manifest = |d: &Path| -> Value {
        serde_json::from_slice(&fs::read(d.join("wload.json")).unwrap()).unwrap()
    };
    assert_eq!(manifest(&v32)["module_tree"], "cuda");
    assert!(manifest(&glm).get("module_tree").is_none());
    let plan = clean_plan_json(&fixture(DSV32), &["--tp", "2"]);
    assert_eq!(plan["module_tree"], "cuda");
    let o = run(&["inspect", s(&fixture(DSV32))]);
    assert!(o.status.success(), "{}", context(&o));
    let line = stdout(&o)
        .lines()
        .find(|l| l.trim_start().starts_with("module tree"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("inspect names the module tree: {}", context(&o)));
    assert!(
        line.contains("cuda") && line.contains("loads only on cuda"),
        "{line}"
    );
    let doc = wload_json(&["inspect", s(&fixture(DSV32)), "--json"]);
    assert_eq!(doc["structure"]["module_tree"], "cuda");
    // The folder too: `inspect` of it names the tree it was written for.
    let o = run(&["inspect", s(&v32)]);
    assert!(
        stdout(&o).contains("cuda module tree (loads only on cuda)"),
        "{}",
        context(&o)
    );
    let doc = wload_json(&["inspect", s(&v32), "--json"]);
    assert_eq!(doc["written_for"]["module_tree"], "cuda");
}

/// The indexer keys of `layer`.
fn indexer_keys(layer: usize) -> Vec<String> {
    [
        "indexer.wq_b.weight",
        "indexer.wk_weights_proj.weight",
        "indexer.k_norm.weight",
        "indexer.k_norm.bias",
    ]
    .iter()
    .map(|n| l(layer, &format!("self_attn.{n}")))
    .collect()
}

/// A layer whose top-k is skipped builds no indexer (attention.py:167–177): with a pattern 'S'
/// there, or off the index_topk_freq schedule. vLLM's CUDA loader then has nowhere to put that
/// layer's indexer tensors (a KeyError), so wload refuses them; a checkpoint without them shards
/// to vLLM's keys less that layer's indexer.
#[test]
fn deepseek_v32_layers_without_an_indexer_follow_the_schedule() {
    let skip_layer_1: [(&str, Value); 2] = [
        ("index_topk_pattern", "FS".into()),
        ("index_topk_freq", 2.into()),
    ];
    let vllm = vllm_tp2(DSV32);
    for (field, value) in skip_layer_1 {
        let ctx = format!("{field} = {value}");
        let edit = |c: &mut serde_json::Map<String, Value>| {
            c.insert(field.into(), value.clone());
            c.insert("index_skip_topk_offset".into(), 1.into());
        };
        let dir = fixture_with(DSV32, edit);
        let o = run(&["plan", s(dir.path()), "--tp", "2"]);
        assert_refusal_text(
            &o,
            3,
            &[
                "'model.layers.1.self_attn.indexer.wq_b.weight'",
                "matches no parameter",
            ],
        );
        // Without layer 1's indexer tensors: vLLM's keys less those four.
        let mut ck = checkpoint_tensors(&fixture(DSV32));
        ck.retain(|n, _| !n.starts_with(&l(1, "self_attn.indexer.")));
        let mut config = serde_json::Map::new();
        let text = fs::read(fixture(DSV32).join("config.json")).unwrap();
        if let Value::Object(m) = serde_json::from_slice(&text).unwrap() {
            config = m;
        }
        edit(&mut config);
        let src = write_checkpoint(&Value::Object(config), &ck);
        let tmp = TempDir::new().unwrap();
        shard_ok(src.path(), 2, tmp.path(), &["-q"]);
        let gone = indexer_keys(1);
        for r in 0..2 {
            let got = rank_tensors(tmp.path(), r);
            let mut want = rank_tensors(&vllm, r);
            want.retain(|n, _| !gone.contains(n));
            assert!(
                got == want,
                "{ctx}: rank {r} differs from vLLM's less layer 1's indexer"
            );
            assert!(
                got.contains_key(&indexer_keys(0)[0]),
                "{ctx}: layer 0 keeps its indexer"
            );
        }
    }
}

/// The indexer's fused wk_weights_proj is `[wk; weights_proj]` whole on every rank, its norm F32.
#[test]
fn deepseek_v32_indexer_is_replicated_with_an_f32_norm() {
    let ck = checkpoint_tensors(&fixture(DSV32));
    let tmp = TempDir::new().unwrap();
    shard_ok(&fixture(DSV32), 4, tmp.path(), &["-q"]);
    for r in 0..4 {
        let got = rank_tensors(tmp.path(), r);
        let ctx = format!("tp4 rank {r}");
        let c = |n: &str| &ck[&l(0, &format!("self_attn.indexer.{n}"))].data;
        let fused = [c("wk.weight").as_slice(), c("weights_proj.weight")].concat();
        let name = l(0, "self_attn.indexer.wk_weights_proj.weight");
        assert_tensor(&got, &name, "BF16", &[32 + 4, H], &fused, &ctx);
        let name = l(0, "self_attn.indexer.wq_b.weight");
        assert_tensor(&got, &name, "BF16", &[4 * 32, 96], c("wq_b.weight"), &ctx);
        let widened: Vec<u8> = c("k_norm.bias")
            .chunks(2)
            .flat_map(|b| (u32::from(u16::from_le_bytes([b[0], b[1]])) << 16).to_le_bytes())
            .collect();
        let name = l(0, "self_attn.indexer.k_norm.bias");
        assert_tensor(&got, &name, "F32", &[32], &widened, &ctx);
    }
}

#[test]
fn deepseek_v32_refusals_name_what_vllm_asserts() {
    let dir = fixture_with(DSV32, |c| {
        c.insert("q_lora_rank".into(), Value::Null);
    });
    let o = run(&["plan", s(dir.path()), "--tp", "2"]);
    assert_refusal_text(&o, 3, &["q_lora_rank is null"]);
    let o = run(&["plan", s(&fixture(DSV32)), "--tp", "16"]);
    assert_refusal_text(
        &o,
        3,
        &["num_attention_heads (8) is not divisible by tp (16)"],
    );
}

/// GLM-5 (`GlmMoeDsaForCausalLM`) is served by the same CUDA module: the DSv3.2 fixture under
/// its architecture and model_type shards to vLLM's DSv3.2 bytes, and says cuda too.
#[test]
fn glm_moe_dsa_shares_the_deepseek_v32_cuda_tree() {
    let dir = fixture_with(DSV32, |c| {
        c.insert(
            "architectures".into(),
            serde_json::json!(["GlmMoeDsaForCausalLM"]),
        );
        c.insert("model_type".into(), "glm_moe_dsa".into());
    });
    let tmp = TempDir::new().unwrap();
    shard_ok(dir.path(), 2, tmp.path(), &["-q"]);
    let vllm = vllm_tp2(DSV32);
    for r in 0..2 {
        assert!(
            rank_tensors(tmp.path(), r) == rank_tensors(&vllm, r),
            "rank {r} differs from vLLM's DeepSeek-V3.2 output"
        );
    }
    let m: Value =
        serde_json::from_slice(&fs::read(tmp.path().join("wload.json")).unwrap()).unwrap();
    assert_eq!(
        (m["module_tree"].as_str(), m["family"].as_str()),
        (Some("cuda"), Some("glm_moe_dsa"))
    );
}

/// Pipeline stages as the CUDA tree builds them (nvidia/model.py:203, :227; the base class's
/// lm_head, deepseek_v2.py:1917): the embedding on the first stage, norm and lm_head on the
/// last, each stage its own layers, every tensor as the TP 1 output holds it.
#[test]
fn deepseek_v32_pipeline_stages_split_the_tp1_output() {
    let tmp = TempDir::new().unwrap();
    let (tp1, pp2) = (tmp.path().join("tp1"), tmp.path().join("pp2"));
    shard_ok(&fixture(DSV32), 1, &tp1, &["-q"]);
    shard_ok(&fixture(DSV32), 1, &pp2, &["--pp", "2", "-q"]);
    let whole = rank_tensors(&tp1, 0);
    let tops = [
        vec!["model.embed_tokens.weight"],
        vec!["model.norm.weight", "lm_head.weight"],
    ];
    for (p, top) in tops.iter().enumerate() {
        let got = stage_tensors(&pp2, p as u64, 0);
        let mut want = whole.clone();
        want.retain(|n, _| {
            n.starts_with(&format!("model.layers.{p}.")) || top.contains(&n.as_str())
        });
        assert!(want.len() > top.len(), "stage {p}: its layer's tensors");
        assert!(
            got == want,
            "stage {p}: differs from the TP 1 output's tensors"
        );
    }
}

/// The DeepSeek-V3.2 fixture as a block-FP8 (32×32) release: every projection F8_E4M3 with an
/// F32 `weight_scale_inv` of `[ceil(out/32), ceil(in/32)]`, the indexer's `wq_b` too; the
/// indexer's `weights_proj` stays BF16, and `wk` too unless `fp8_wk`.
fn dsv32_block_fp8(fp8_wk: bool) -> TempDir {
    let mut ck = checkpoint_tensors(&fixture(DSV32));
    let quantized = |n: &str| {
        n.starts_with("model.layers.")
            && !n.contains("weights_proj")
            && (n.ends_with("_proj.weight")
                || n.ends_with("_with_mqa.weight")
                || n.ends_with("indexer.wq_b.weight")
                || (fp8_wk && n.ends_with("indexer.wk.weight")))
    };
    let names: Vec<String> = ck.keys().filter(|n| quantized(n)).cloned().collect();
    for (t, name) in names.into_iter().enumerate() {
        let w = ck.get_mut(&name).unwrap();
        w.data = w.data.iter().skip(1).step_by(2).map(|b| b & 0xF7).collect();
        w.dtype = "F8_E4M3".into();
        let blocks = vec![w.shape[0].div_ceil(32), w.shape[1].div_ceil(32)];
        let n = blocks.iter().product::<u64>();
        let data = (0..n).flat_map(|k| ((t as u64 * 100 + k + 1) as f32).to_le_bytes());
        let scale = Held {
            dtype: "F32".into(),
            data: data.collect(),
            shape: blocks,
        };
        ck.insert(format!("{name}_scale_inv"), scale);
    }
    let text = fs::read(fixture(DSV32).join("config.json")).unwrap();
    let mut cfg: Value = serde_json::from_slice(&text).unwrap();
    cfg["quantization_config"] = serde_json::json!({
        "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
        "weight_block_size": [32, 32]
    });
    write_checkpoint(&cfg, &ck)
}

/// Block FP8: the indexer's `wq_b` is a quantizable ReplicatedLinear (whole weight and scale on
/// every rank); `wk_weights_proj` is built without the quant config and stays BF16, an FP8 `wk`
/// (some releases) dequantized into it as vLLM does at load.
#[test]
fn deepseek_v32_block_fp8_indexer() {
    let src = dsv32_block_fp8(false);
    let ck = checkpoint_tensors(src.path());
    let tmp = TempDir::new().unwrap();
    shard_ok(src.path(), 2, tmp.path(), &["-q"]);
    let idx = |n: &str| l(1, &format!("self_attn.indexer.{n}"));
    for r in 0..2 {
        let got = rank_tensors(tmp.path(), r);
        let ctx = format!("fp8 tp2 rank {r}");
        let wq_b = &ck[&idx("wq_b.weight")];
        assert_tensor(
            &got,
            &idx("wq_b.weight"),
            "F8_E4M3",
            &[128, 96],
            &wq_b.data,
            &ctx,
        );
        let scale = &ck[&idx("wq_b.weight_scale_inv")];
        assert_tensor(
            &got,
            &idx("wq_b.weight_scale_inv"),
            "F32",
            &[4, 3],
            &scale.data,
            &ctx,
        );
        assert_eq!(got[&idx("wk_weights_proj.weight")].dtype, "BF16", "{ctx}");
        assert!(
            !got.contains_key(&idx("wk_weights_proj.weight_scale_inv")),
            "{ctx}"
        );
    }
    // An FP8 wk: dequantized with its F32 [1, 4] scale (32×32 blocks) into BF16 rows, the
    // scale no parameter (families/dsv32_fp8_wk.rs checks the values).
    let src = dsv32_block_fp8(true);
    let tmp = TempDir::new().unwrap();
    shard_ok(src.path(), 2, tmp.path(), &["-q"]);
    let got = rank_tensors(tmp.path(), 0);
    let fused = &got[&idx("wk_weights_proj.weight")];
    assert_eq!(
        (fused.dtype.as_str(), &fused.shape[..]),
        ("BF16", &[36, 128][..])
    );
    assert!(!got.contains_key(&idx("wk_weights_proj.weight_scale_inv")));
}
