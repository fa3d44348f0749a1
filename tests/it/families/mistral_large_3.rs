//! Mistral Large 3 (`MistralLarge3ForCausalLM`, mappings/mistral_large_3.yaml) beyond its golden
//! TP2 case: Mistral-native `consolidated.safetensors` + `params.json`, DeepSeek-V3's layout. The
//! checkpoints are the golden fixture or derived from it; every rank is checked against vLLM's
//! files for the case and the fixture's bytes: expert parallelism, the dense-MLA params.json
//! vLLM turns into a one-expert block, the serve line, and what vLLM refuses.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tempfile::TempDir;

use crate::support::*;

const ML3: &str = "mistral_large_3";
const H: usize = 128; // dim
const MI: usize = 64; // moe.expert_hidden_dim
const E: usize = 4; // moe.num_experts

fn vllm_tp2() -> PathBuf {
    golden_cases()
        .into_iter()
        .find(|c| c.name == format!("{ML3}/tp2"))
        .expect("the golden case mistral_large_3/tp2")
        .vllm_dir()
}

fn params(dir: &Path) -> Map<String, Value> {
    match serde_json::from_slice(&fs::read(dir.join("params.json")).unwrap()).unwrap() {
        Value::Object(m) => m,
        other => panic!("params.json is not an object: {other}"),
    }
}

/// A Mistral-native folder: `params` as params.json, `tensors` as consolidated.safetensors.
fn native(params: &Map<String, Value>, tensors: &Tensors) -> TempDir {
    let tmp = TempDir::new().unwrap();
    write_json(
        &tmp.path().join("params.json"),
        &Value::Object(params.clone()),
    );
    write_held(&tmp.path().join("consolidated.safetensors"), tensors);
    tmp
}

/// Under expert parallelism each rank holds two whole experts (w13 = `[w1; w3]`, w2), placed
/// linearly; every other tensor is vLLM's TP2 one.
#[test]
fn expert_parallel_places_whole_experts_and_keeps_the_rest() {
    let ck = checkpoint_tensors(&fixture(ML3));
    let vllm = vllm_tp2();
    let tmp = TempDir::new().unwrap();
    shard_ok(
        &fixture(ML3),
        2,
        tmp.path(),
        &["--enable-expert-parallel", "-q"],
    );
    let routed = "model.layers.1.mlp.experts.routed_experts.w";
    for r in 0..2u64 {
        let ctx = format!("ep2 rank {r}");
        let got = rank_tensors(tmp.path(), r);
        let want = rank_tensors(&vllm, r);
        let keys = |t: &Tensors| t.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&got), keys(&want), "{ctx}: keys");
        for (name, t) in got.iter().filter(|(n, _)| !n.starts_with(routed)) {
            assert!(*t == want[name], "{ctx}: '{name}' differs from vLLM's TP2");
        }
        let (mut w13, mut w2) = (Vec::new(), Vec::new());
        for e in r as usize * E / 2..(r as usize + 1) * E / 2 {
            let c = |w: &str| &ck[&format!("layers.1.experts.{e}.{w}.weight")].data;
            w13.extend_from_slice(c("w1"));
            w13.extend_from_slice(c("w3"));
            w2.extend_from_slice(c("w2"));
        }
        assert_tensor(
            &got,
            &format!("{routed}13_weight"),
            "BF16",
            &[E / 2, 2 * MI, H],
            &w13,
            &ctx,
        );
        assert_tensor(
            &got,
            &format!("{routed}2_weight"),
            "BF16",
            &[E / 2, H, MI],
            &w2,
            &ctx,
        );
    }
}

/// The folder has params.json and no consolidated*.safetensors, so vLLM would look for a
/// config.json: the serve line says `--config-format mistral` (transformers_utils/config.py:889).
#[test]
fn the_output_is_served_with_the_mistral_config_format() {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    let o = shard_ok(&fixture(ML3), 2, &out, &[]);
    assert!(out.join("params.json").is_file());
    assert!(!out.join("config.json").exists());
    let m: Value = serde_json::from_slice(&fs::read(out.join("wload.json")).unwrap()).unwrap();
    assert_eq!(m["architecture"], "MistralLarge3ForCausalLM");
    assert_eq!(m["family"], ML3);
    let shell = m["serve"]["shell"].as_str().unwrap();
    assert!(
        shell.ends_with(
            "--tensor-parallel-size 2 --dtype bfloat16 --config-format mistral --skip-tokenizer-init"
        ),
        "{shell}"
    );
    assert!(
        stdout(&o).contains("--config-format mistral"),
        "{}",
        stdout(&o)
    );
}

/// vLLM asserts a llama_4_scaling block with both keys (configs/mistral.py:37–48).
#[test]
fn params_without_llama_4_scaling_are_refused() {
    let ck = checkpoint_tensors(&fixture(ML3));
    for drop in ["llama_4_scaling", "beta"] {
        let mut p = params(&fixture(ML3));
        match drop {
            "beta" => {
                p["llama_4_scaling"].as_object_mut().unwrap().remove("beta");
            }
            key => {
                p.remove(key);
            }
        }
        let src = native(&p, &ck);
        let o = run(&["plan", s(src.path()), "--tp", "2"]);
        assert_refusal_text(
            &o,
            3,
            &[
                "params.json has no llama_4_scaling",
                "MistralLarge3 expect llama4 scaling config.",
            ],
        );
    }
}

/// An MLA params.json without a `moe` block is given one expert and one shared expert on no
/// layer (configs/mistral.py:310–326): vLLM builds Mistral Large 3 with every layer dense.
#[test]
fn a_dense_mla_params_json_is_mistral_large_3_with_dense_layers() {
    let mut ck = checkpoint_tensors(&fixture(ML3));
    ck.retain(|n, _| {
        !(n.starts_with("layers.1.experts.")
            || n.starts_with("layers.1.shared_experts.")
            || n.starts_with("layers.1.gate."))
    });
    for w in ["w1", "w2", "w3"] {
        let t = ck[&format!("layers.0.feed_forward.{w}.weight")].clone();
        ck.insert(format!("layers.1.feed_forward.{w}.weight"), t);
    }
    let mut p = params(&fixture(ML3));
    p.remove("moe");
    let src = native(&p, &ck);
    let plan = clean_plan_json(src.path(), &["--tp", "2"]);
    assert_eq!(plan["architecture"], "MistralLarge3ForCausalLM");
    let names: Vec<&str> = plan["ranks"][0]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for i in 0..2 {
        let dense = format!("model.layers.{i}.mlp.gate_up_proj.weight");
        assert!(
            names.contains(&dense.as_str()),
            "layer {i} dense: {names:?}"
        );
    }
    assert!(!names.iter().any(|n| n.contains("experts")), "{names:?}");
}

#[test]
fn sizes_vllm_refuses_are_refused() {
    let f = fixture(ML3);
    let o = run(&["plan", s(&f), "--tp", "16"]);
    assert_refusal_text(
        &o,
        3,
        &["num_attention_heads (8) is not divisible by tp (16)"],
    );
    let o = run(&["plan", s(&f), "--tp", "3"]);
    assert_refusal_text(
        &o,
        3,
        &[
            "moe_intermediate_size (64) is not divisible by tp (3)",
            "the shared experts' intermediate size (64) is not divisible by tp (3)",
        ],
    );
}

/// A native release may ship a config.json beside params.json: vLLM reads params.json there
/// (next to consolidated*.safetensors) with config.json's keys as defaults. The output keeps both,
/// and without consolidated files vLLM would read config.json: so the manifest records
/// `config_format: mistral`, and the serve line and `load` of the folder use it.
#[test]
fn a_config_json_beside_params_json_still_serves_with_the_mistral_format() {
    let src = copy_fixture(ML3);
    let hf = serde_json::json!({"architectures": ["SomethingElse"], "rope_theta": 1.0});
    write_json(&src.path().join("config.json"), &hf);
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(src.path(), 2, &out, &["-q"]);
    assert!(out.join("config.json").is_file() && out.join("params.json").is_file());
    let m: Value = serde_json::from_slice(&fs::read(out.join("wload.json")).unwrap()).unwrap();
    assert_eq!(
        m["architecture"], "MistralLarge3ForCausalLM",
        "params.json's, not config.json's"
    );
    assert_eq!(m["config_format"], "mistral");
    let shell = m["serve"]["shell"].as_str().unwrap();
    assert!(
        shell.ends_with("--config-format mistral --skip-tokenizer-init"),
        "{shell}"
    );
    let l = run(&["load", s(&out), "--dry-run"]);
    assert!(l.status.success(), "{}", context(&l));
    assert!(
        stderr(&l).contains("--config-format mistral taken from"),
        "{}",
        stderr(&l)
    );
    let i = run(&["inspect", s(&out)]);
    assert!(
        stdout(&i).contains("--config-format mistral"),
        "{}",
        context(&i)
    );
    for r in 0..2 {
        assert!(
            rank_tensors(&out, r) == rank_tensors(&vllm_tp2(), r),
            "rank {r}"
        );
    }
}

/// An FP8 release's params.json says `quantization: {qformat_weight: fp8_e4m3, qscheme_act:
/// TENSOR}`: vLLM reads it as the `fp8` method with static per-tensor scales
/// (configs/mistral.py:199–223), and the class renames `.qscale_weight` / `.qscale_act` to
/// `.weight_scale` / `.input_scale` (mistral_large_3.py:80–83). The plan holds them per shard.
#[test]
fn an_fp8_params_json_is_read_as_vllms_fp8_method_with_the_renamed_scales() {
    let mut ck = checkpoint_tensors(&fixture(ML3));
    let linear = |n: &str| {
        n.ends_with(".weight")
            && [
                ".wq_a.",
                ".wq_b.",
                ".wkv_a_with_mqa.",
                ".wkv_b.",
                ".wo.",
                ".w1.",
                ".w2.",
                ".w3.",
            ]
            .iter()
            .any(|p| n.contains(p))
    };
    let names: Vec<String> = ck.keys().filter(|n| linear(n)).cloned().collect();
    for n in names {
        let t = ck.get_mut(&n).unwrap();
        t.dtype = "F8_E4M3".into();
        t.data = t.data.iter().skip(1).step_by(2).copied().collect();
        let stem = n.strip_suffix("weight").unwrap();
        for (s, v) in [("qscale_weight", 0.5f32), ("qscale_act", 0.25)] {
            let data = v.to_le_bytes().to_vec();
            let held = Held {
                dtype: "F32".into(),
                shape: vec![],
                data,
            };
            ck.insert(format!("{stem}{s}"), held);
        }
    }
    let mut p = params(&fixture(ML3));
    p.insert(
        "quantization".into(),
        serde_json::json!({"qformat_weight": "fp8_e4m3", "qscheme_act": "TENSOR"}),
    );
    let src = native(&p, &ck);
    let plan = clean_plan_json(src.path(), &["--tp", "2"]);
    let tensors = plan["ranks"][0]["tensors"].as_array().unwrap();
    let find = |name: &str| {
        tensors
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in the plan"))
    };
    let fused = "model.layers.0.self_attn.fused_qkv_a_proj";
    assert_eq!(find(&format!("{fused}.weight"))["dtype"], "F8_E4M3");
    assert_eq!(
        find(&format!("{fused}.weight_scale"))["shape"],
        serde_json::json!([2])
    );
    assert_eq!(
        find(&format!("{fused}.input_scale"))["shape"],
        serde_json::json!([2])
    );
    let routed = "model.layers.1.mlp.experts.routed_experts";
    assert_eq!(
        find(&format!("{routed}.w13_weight_scale"))["shape"],
        serde_json::json!([E, 2])
    );
    assert_eq!(
        find(&format!("{routed}.w2_input_scale"))["shape"],
        serde_json::json!([E])
    );
    // The router and the norms stay BF16.
    assert_eq!(
        find("model.layers.1.mlp.experts.gate.weight")["dtype"],
        "BF16"
    );
}
