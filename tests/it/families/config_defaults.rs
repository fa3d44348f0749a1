//! Fields a config.json may leave out: vLLM reads the config class's default (transformers 5.20,
//! the version vLLM 0.33 runs with), so a missing field plans exactly as that default written out,
//! and where the checkpoint agrees with the default, exactly as the original.

use std::fs;
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::support::*;

/// `wload plan --json` at `tp`, accepted or refused, without what differs between two folders.
fn plan_doc(dir: &Path, tp: u64) -> Value {
    let tp = tp.to_string();
    let out = run(&["plan", s(dir), "--tp", &tp, "--json"]);
    let mut doc: Value = json_doc(&["plan"], &out);
    let o = doc.as_object_mut().expect("an object");
    o.remove("timings");
    o.remove("source");
    doc
}

/// As DeepSeek-V2 (same module tree as V3, other config defaults).
fn as_deepseek_v2(m: &mut Map<String, Value>) {
    m.insert("model_type".into(), json!("deepseek_v2"));
    m.insert("architectures".into(), json!(["DeepseekV2ForCausalLM"]));
}

/// Each (fixture, class, field, default): the fixture without the field plans as with the
/// default written out. Where the default does not fit the tiny checkpoint both are refused,
/// with the same problems (shapes computed from the default), rather than one refused for a
/// missing field.
#[test]
fn a_missing_field_is_the_config_class_default() {
    type Edit = fn(&mut Map<String, Value>);
    let keep: Edit = |_| {};
    let cases: &[(&str, Edit, &str, Value)] = &[
        // LlamaConfig / Phi3Config: one kv head per attention head.
        ("llama_gqa", keep, "num_key_value_heads", json!(8)),
        ("phi3_fp32", keep, "num_key_value_heads", json!(8)),
        ("qwen2", keep, "num_key_value_heads", json!(32)),
        ("mixtral", keep, "num_key_value_heads", json!(8)),
        ("qwen2_moe", keep, "num_key_value_heads", json!(16)),
        ("qwen3_moe_fp8_block", keep, "num_key_value_heads", json!(4)),
        ("gemma2", keep, "num_key_value_heads", json!(4)),
        ("gemma2", keep, "head_dim", json!(256)),
        // Qwen3MoeConfig has no head_dim (Qwen3Config's 128 is not inherited): hidden // heads.
        ("qwen3_moe_fp8_block", keep, "head_dim", json!(16)),
        ("mixtral", keep, "num_local_experts", json!(8)),
        ("gpt_oss", keep, "num_key_value_heads", json!(8)),
        ("gpt_oss", keep, "num_local_experts", json!(128)),
        ("gpt_oss", keep, "intermediate_size", json!(2880)),
        ("qwen3_moe_fp8_block", keep, "num_experts", json!(128)),
        (
            "qwen3_moe_fp8_block",
            keep,
            "moe_intermediate_size",
            json!(768),
        ),
        ("qwen2_moe", keep, "intermediate_size", json!(5632)),
        ("deepseek_v3", keep, "n_routed_experts", json!(256)),
        ("deepseek_v3", keep, "moe_intermediate_size", json!(2048)),
        ("deepseek_v3", keep, "intermediate_size", json!(18432)),
        ("deepseek_v3", as_deepseek_v2, "n_routed_experts", json!(64)),
        (
            "deepseek_v3",
            as_deepseek_v2,
            "moe_intermediate_size",
            json!(1407),
        ),
        (
            "deepseek_v3",
            as_deepseek_v2,
            "intermediate_size",
            json!(11008),
        ),
    ];
    for (fixture, edit, field, default) in cases {
        let missing = fixture_with(fixture, |m| {
            edit(m);
            m.remove(*field).expect("the fixture states the field");
        });
        let stated = fixture_with(fixture, |m| {
            edit(m);
            m.insert(field.to_string(), default.clone());
        });
        assert_eq!(
            plan_doc(missing.path(), 2),
            plan_doc(stated.path(), 2),
            "{fixture}: {field} missing vs {default}"
        );
    }
}

/// An explicit `null` is not the class default: transformers keeps None and the class's
/// `__post_init__` fills it (one kv head per attention head; gpt-oss's head_dim hidden // heads),
/// so the config plans exactly as with that value written out, even where the class default
/// differs (Qwen2's 32 kv heads, Qwen2-MoE's 16).
#[test]
fn an_explicit_null_is_filled_as_the_config_class_fills_it() {
    type Fill = fn(&Map<String, Value>) -> Value;
    let cases: &[(&str, &str, Fill)] = &[
        ("qwen2", "num_key_value_heads", |m| {
            m["num_attention_heads"].clone()
        }),
        ("qwen2_moe", "num_key_value_heads", |m| {
            m["num_attention_heads"].clone()
        }),
        ("mixtral", "num_key_value_heads", |m| {
            m["num_attention_heads"].clone()
        }),
        ("gpt_oss", "num_key_value_heads", |m| {
            m["num_attention_heads"].clone()
        }),
        ("gpt_oss", "head_dim", |m| {
            let hidden = m["hidden_size"].as_u64().unwrap();
            json!(hidden / m["num_attention_heads"].as_u64().unwrap())
        }),
        ("llama_gqa", "num_key_value_heads", |m| {
            m["num_attention_heads"].clone()
        }),
    ];
    for (fixture, field, filled) in cases {
        let null = fixture_with(fixture, |m| {
            m.insert(field.to_string(), Value::Null);
        });
        let stated = fixture_with(fixture, |m| {
            let v = filled(m);
            m.insert(field.to_string(), v);
        });
        for tp in [1, 2] {
            assert_eq!(
                plan_doc(null.path(), tp),
                plan_doc(stated.path(), tp),
                "{fixture}: {field} null, tp {tp}"
            );
        }
    }
}

/// DeepseekV3Config's one MTP layer: with a tensor of the layer past num_hidden_layers in the
/// checkpoint, a config.json without `num_nextn_predict_layers` skips it, as the original does.
#[test]
fn deepseek_v3_without_an_mtp_count_skips_one_mtp_layer() {
    let hub = copy_fixture("deepseek_v3");
    add_mtp_tensor(hub.path());
    let missing = copy_fixture("deepseek_v3");
    add_mtp_tensor(missing.path());
    let mut m = read_config(missing.path());
    m.remove("num_nextn_predict_layers").expect("stated");
    write_config(missing.path(), m);
    for tp in [1, 2] {
        let want = plan_doc(hub.path(), tp);
        assert_eq!(want["ok"], json!(true), "{want}");
        assert_eq!(want, plan_doc(missing.path(), tp), "tp {tp}");
    }
    let skipped = plan_doc(missing.path(), 2)["skipped"].to_string();
    assert!(skipped.contains(".eh_proj.weight"), "{skipped}");
}

/// Appends `model.layers.{num_hidden_layers}.eh_proj.weight` (an MTP layer's tensor, as
/// DeepSeek-V3 releases ship) to the first file of `dir`, and to its index.
fn add_mtp_tensor(dir: &Path) {
    let layers = read_config(dir)["num_hidden_layers"]
        .as_u64()
        .expect("layers");
    let name = format!("model.layers.{layers}.eh_proj.weight");
    let index_path = dir.join("model.safetensors.index.json");
    let mut index: Value = serde_json::from_slice(&fs::read(&index_path).unwrap()).unwrap();
    let file = "model-00001-of-00006.safetensors";
    index["weight_map"][&name] = json!(file);
    write_json(&index_path, &index);
    append_tensor(&dir.join(file), &name, "BF16", &[4], &[0; 8]);
}

/// DeepSeek's model builds its own lm_head whatever `tie_word_embeddings` says: a tied config
/// keeps both tensors (the embedding on the first stage only), and a checkpoint without
/// lm_head.weight is refused rather than given the embedding.
#[test]
fn deepseek_never_ties_lm_head_to_the_embedding() {
    let hub = copy_fixture("deepseek_v3");
    let tied = fixture_with("deepseek_v3", |m| {
        m.insert("tie_word_embeddings".into(), json!(true));
    });
    for tp in ["1", "2"] {
        let a = wload_json(&["plan", s(hub.path()), "--tp", tp, "--pp", "2", "--json"]);
        let b = wload_json(&["plan", s(tied.path()), "--tp", tp, "--pp", "2", "--json"]);
        assert_eq!(a["ranks"], b["ranks"], "tp {tp}");
        assert_eq!(b["tie_word_embeddings"], json!(false));
    }
    // Without lm_head.weight in the checkpoint: refused, not filled from the embedding.
    let dir = fixture_with("deepseek_v3", |m| {
        m.insert("tie_word_embeddings".into(), json!(true));
    });
    drop_tensor(dir.path(), "lm_head.weight");
    let out = run(&["plan", s(dir.path()), "--tp", "2"]);
    assert_refusal_text(
        &out,
        3,
        &["parameter 'lm_head.weight' has nothing in the checkpoint to fill it"],
    );
}

/// Renames `tensor` in whichever file of `dir` holds it to a tensor of the MTP layer past
/// num_hidden_layers, which vLLM skips: the checkpoint no longer ships `tensor`, and its bytes
/// keep the data region whole.
fn drop_tensor(dir: &Path, tensor: &str) {
    let layers = read_config(dir)["num_hidden_layers"]
        .as_u64()
        .expect("layers");
    let index_path = dir.join("model.safetensors.index.json");
    let mut index: Value = serde_json::from_slice(&fs::read(&index_path).unwrap()).unwrap();
    let map = index["weight_map"].as_object_mut().expect("weight_map");
    let file = map.remove(tensor).expect("the index names the tensor");
    let renamed = format!("model.layers.{layers}.dropped.weight");
    map.insert(renamed.clone(), file.clone());
    write_json(&index_path, &index);
    edit_header(&dir.join(file.as_str().unwrap()), |h| {
        let t = h.remove(tensor).expect("the file holds the tensor");
        h.insert(renamed, t);
    });
}

/// `inspect` describes the attention vLLM builds: a kv head count the config leaves out is the
/// class default there too (Qwen2's 32), not the head count.
#[test]
fn inspect_names_the_default_kv_heads() {
    let dir = fixture_with("qwen2", |m| {
        m.remove("num_key_value_heads").expect("stated");
    });
    let st = wload_json(&["inspect", s(dir.path()), "--json"])["structure"].clone();
    assert_eq!(
        st["attention"],
        json!({"kind": "mha", "heads": 8, "kv_heads": 32, "head_dim": 16})
    );
    // The human summary of the config says the same, and that the value is not the file's.
    let out = run(&["inspect", s(dir.path())]);
    assert!(out.status.success(), "{}", context(&out));
    let text = stdout(&out);
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("kv heads"))
        .unwrap_or_else(|| panic!("no kv heads row: {text}"));
    assert!(row.contains("32 (not in config"), "{row}");
}

/// A bidirectional DeepSeek variant (`is_causal: false`, as embedding models ship) is built
/// by vLLM without MLA, under names the MLA mapping does not hold: refused, not planned as MLA.
#[test]
fn a_bidirectional_deepseek_is_refused() {
    let dir = fixture_with("deepseek_v3", |m| {
        m.insert("is_causal".into(), json!(false));
    });
    let out = run(&["plan", s(dir.path()), "--tp", "2"]);
    assert_refusal_text(&out, 3, &["is_causal is false"]);
    let causal = fixture_with("deepseek_v3", |m| {
        m.insert("is_causal".into(), json!(true));
    });
    assert_eq!(
        plan_doc(causal.path(), 2),
        plan_doc(&fixtures_dir().join("deepseek_v3"), 2)
    );
}

/// A config.json without `dtype` / `torch_dtype` (transformers leaves it None): vLLM reads the
/// dtype from the safetensors headers, the one every tensor casts to without loss, and its
/// `auto` keeps float16 and makes anything else bfloat16. So an all-float16 checkpoint shards
/// exactly as with `torch_dtype: float16` (it was taken as float32, i.e. bfloat16), and a float32
/// one as bfloat16. Serving the output needs `--dtype float16`: its rank files also hold vLLM's
/// float32 attention scales, from which vLLM would pick float32, i.e. bfloat16.
#[test]
fn a_config_without_a_dtype_takes_the_checkpoints() {
    for (fixture, want) in [
        ("llama_tied_fp16", "F16"),
        ("phi3_fp32", "BF16"),
        ("llama_gqa", "BF16"),
    ] {
        let none = fixture_with(fixture, |m| {
            m.remove("dtype");
            m.remove("torch_dtype");
        });
        assert_eq!(plan_doc(none.path(), 2)["dtype"], want, "{fixture}");
    }
    let none = fixture_with("llama_tied_fp16", |m| {
        m.remove("dtype");
        m.remove("torch_dtype");
    });
    let work = tempfile::TempDir::new().unwrap();
    let (with, without) = (work.path().join("with"), work.path().join("without"));
    let fixture = fixtures_dir().join("llama_tied_fp16");
    for (src, out) in [(fixture.as_path(), &with), (none.path(), &without)] {
        let o = run(&["shard", s(src), "--tp", "2", "-o", s(out), "-q"]);
        assert!(o.status.success(), "{}", context(&o));
    }
    let parts = |dir: &Path| {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("model-rank-"))
            .collect();
        v.sort();
        v
    };
    assert_eq!(parts(&with), parts(&without));
    assert!(!parts(&with).is_empty());
    for name in parts(&with) {
        assert!(
            fs::read(with.join(&name)).unwrap() == fs::read(without.join(&name)).unwrap(),
            "{name} differs"
        );
    }
    let manifest: Value =
        serde_json::from_slice(&fs::read(without.join("wload.json")).unwrap()).expect("wload.json");
    let argv = manifest["serve"]["argv"].to_string();
    assert!(argv.contains(r#""--dtype","float16""#), "{argv}");
    // inspect says so.
    let doc = wload_json(&["inspect", s(none.path()), "--json"]);
    assert_eq!(doc["config"]["auto_dtype"], "F16");
    assert_eq!(doc["config"]["dtype"], Value::Null);
    let out = run(&["inspect", s(none.path())]);
    assert!(
        stdout(&out).contains("takes float16 from the weights"),
        "{}",
        context(&out)
    );
}
