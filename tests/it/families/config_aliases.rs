//! transformers' attribute aliases (src/config/aliases.rs): a config.json that spells a field the
//! other way plans, shards and summarises exactly as the Hub spelling does; `--hf-overrides` may
//! use either spelling; a missing field names both.

use std::fs;
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::support::*;

/// Renames `from` to `to` in `dir`'s config.json (the value kept, the key order otherwise kept).
fn respell(dir: &Path, from: &str, to: &str) {
    let m: Map<String, Value> = read_config(dir)
        .into_iter()
        .map(|(k, v)| {
            if k == from {
                (to.to_string(), v)
            } else {
                (k, v)
            }
        })
        .collect();
    assert!(m.contains_key(to), "config.json has no '{from}' to respell");
    write_config(dir, m);
}

/// `wload plan --json` without what differs between two runs on two folders.
fn plan(dir: &Path, tp: u64, extra: &[&str]) -> Value {
    let tp = tp.to_string();
    let mut args = vec!["plan", s(dir), "--tp", &tp, "--json"];
    args.extend_from_slice(extra);
    let mut p = wload_json(&args);
    let o = p.as_object_mut().expect("plan is an object");
    o.remove("timings").expect("timings");
    o.remove("source").expect("source");
    p
}

/// `wload inspect --json`'s config summary.
fn summary(dir: &Path) -> Value {
    wload_json(&["inspect", s(dir), "--json"])["config"].clone()
}

/// The rank files (and index, when there is one) `shard` writes for `dir` (config.json is copied
/// as it is, and so keeps the spelling it was given).
fn shard_bytes(dir: &Path, tp: u64) -> Vec<(String, Vec<u8>)> {
    let out = tempfile::TempDir::new().unwrap();
    let to = out.path().join("out");
    shard_ok(dir, tp, &to, &[]);
    let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(&to)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.ends_with(".safetensors") || n == "model.safetensors.index.json"
        })
        .map(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            (n, fs::read(&p).unwrap())
        })
        .collect();
    files.sort();
    let ranks = files.iter().filter(|(n, _)| n.ends_with(".safetensors"));
    assert!(ranks.count() >= tp as usize, "a file per rank at least");
    files
}

/// transformers 5 writes Mixtral's expert count as `num_local_experts`, and its attribute_map
/// reads `num_experts` as the same attribute: the golden fixture respelled plans and shards
/// byte for byte as the original.
#[test]
fn mixtral_reads_num_experts_as_num_local_experts() {
    let hub = copy_fixture("mixtral");
    let other = copy_fixture("mixtral");
    respell(other.path(), "num_local_experts", "num_experts");
    for tp in [1, 2] {
        assert_eq!(
            plan(hub.path(), tp, &[]),
            plan(other.path(), tp, &[]),
            "tp {tp}"
        );
    }
    assert_eq!(summary(hub.path()), summary(other.path()));
    assert_eq!(shard_bytes(hub.path(), 2), shard_bytes(other.path(), 2));
}

/// `torch_dtype` (Hub configs before transformers 4.56) is `dtype` for every config class.
#[test]
fn torch_dtype_is_read_as_dtype() {
    for fixture in ["llama_tied_fp16", "mixtral", "phi3_fp32"] {
        let hub = copy_fixture(fixture);
        let other = copy_fixture(fixture);
        respell(other.path(), "dtype", "torch_dtype");
        assert_eq!(
            plan(hub.path(), 2, &[]),
            plan(other.path(), 2, &[]),
            "{fixture}"
        );
        assert_eq!(summary(hub.path()), summary(other.path()), "{fixture}");
    }
}

/// When both spellings are in the file, transformers keeps the one it sets last: the class's
/// dataclass field first, then the other spelling through `attribute_map` (`dtype` over
/// `torch_dtype` whatever the class; Mixtral's field is `num_local_experts`, so `num_experts`
/// wins; Qwen3-MoE's is `num_experts`, so `num_local_experts` wins).
#[test]
fn the_spelling_set_last_wins_when_both_are_present() {
    let hub = copy_fixture("mixtral");
    let both = copy_fixture("mixtral");
    let mut m = read_config(both.path());
    let experts = m["num_local_experts"].clone();
    m.insert("num_local_experts".into(), json!(7));
    m.insert("num_experts".into(), experts);
    m.insert("torch_dtype".into(), json!("float32"));
    write_config(both.path(), m);
    assert_eq!(plan(hub.path(), 2, &[]), plan(both.path(), 2, &[]));

    let hub = tiny_qwen3_moe();
    let both = tiny_qwen3_moe();
    let mut m = read_config(both.path());
    m.insert("num_experts".into(), json!(7));
    m.insert("num_local_experts".into(), json!(2));
    write_config(both.path(), m);
    assert_eq!(plan(hub.path(), 2, &[]), plan(both.path(), 2, &[]));
    assert_eq!(summary(both.path())["num_experts"], json!(2));
}

/// The case: a Qwen3-MoE config.json written by transformers 5 carries
/// `num_local_experts` where Hub configs carry `num_experts`.
#[test]
fn qwen3_moe_reads_num_local_experts_as_num_experts() {
    let hub = tiny_qwen3_moe();
    let tf5 = tiny_qwen3_moe();
    respell(tf5.path(), "num_experts", "num_local_experts");
    for tp in [1, 2] {
        assert_eq!(
            plan(hub.path(), tp, &[]),
            plan(tf5.path(), tp, &[]),
            "tp {tp}"
        );
    }
    assert_eq!(summary(hub.path()), summary(tf5.path()));
    assert_eq!(summary(tf5.path())["num_experts"], json!(2));
    assert_eq!(shard_bytes(hub.path(), 2), shard_bytes(tf5.path(), 2));
    // The mapping's check reads the resolved count whichever spelling the file used.
    let out = run(&["plan", s(tf5.path()), "--tp", "4"]);
    assert_refusal_text(
        &out,
        3,
        &["Tensor parallel size 4 is greater than the number of experts 2"],
    );
}

/// vLLM applies `--hf-overrides` with setattr, which follows attribute_map: an override in
/// either spelling replaces the file's value in either spelling.
#[test]
fn hf_overrides_take_either_spelling() {
    let hub = tiny_qwen3_moe();
    let want = plan(hub.path(), 2, &[]);
    for (file_key, override_key) in [
        ("num_experts", "num_experts"),
        ("num_experts", "num_local_experts"),
        ("num_local_experts", "num_experts"),
        ("num_local_experts", "num_local_experts"),
    ] {
        let wrong = tiny_qwen3_moe();
        let mut m = read_config(wrong.path());
        m.remove("num_experts");
        // A count the checkpoint does not have: only the override makes the plan right.
        m.insert(file_key.into(), json!(4));
        write_config(wrong.path(), m);
        let o = format!("{{\"{override_key}\": 2}}");
        let got = plan(wrong.path(), 2, &["--hf-overrides", &o]);
        assert_eq!(got, want, "file {file_key}, override {override_key}");
    }
}

/// A field with two spellings that the config lacks, and that the mapping gives no default
/// (here a user's mapping file that reads it without one), is named in both.
#[test]
fn a_missing_aliased_field_names_both_spellings() {
    let tmp = tiny_qwen3_moe();
    let mut m = read_config(tmp.path());
    m.remove("num_experts");
    write_config(tmp.path(), m);
    let mapping = tmp.path().join("no-default.yaml");
    fs::write(
        &mapping,
        "extends: qwen3\nfamily: acme\narchitectures: [Qwen3MoeForCausalLM]\nchecks:\n  - {rule: num_experts > 0, message: no experts}\n",
    )
    .unwrap();
    let out = run(&["plan", s(tmp.path()), "--tp", "1", "--mapping", s(&mapping)]);
    assert_refusal_text(
        &out,
        3,
        &["config field 'num_experts' (or 'num_local_experts') is missing"],
    );
}

/// transformers 5's DeepseekV3Config (and Glm4MoeConfig) read `num_local_experts` as
/// `n_routed_experts` and `num_mtp_layers` as `num_nextn_predict_layers`: the golden fixture
/// respelled both ways plans, summarises and shards byte for byte as the original, its MTP layer
/// skipped as before, at TP and under expert parallelism.
#[test]
fn deepseek_v3_reads_num_local_experts_and_num_mtp_layers() {
    let hub = copy_fixture("deepseek_v3");
    let other = copy_fixture("deepseek_v3");
    respell(other.path(), "n_routed_experts", "num_local_experts");
    respell(other.path(), "num_nextn_predict_layers", "num_mtp_layers");
    for (tp, extra) in [
        (1, &[][..]),
        (2, &[][..]),
        (2, &["--enable-expert-parallel"][..]),
    ] {
        assert_eq!(
            plan(hub.path(), tp, extra),
            plan(other.path(), tp, extra),
            "tp {tp} {extra:?}"
        );
    }
    assert_eq!(summary(hub.path()), summary(other.path()));
    assert_eq!(shard_bytes(hub.path(), 2), shard_bytes(other.path(), 2));
}

/// DeepseekV2Config reads `num_experts` as `n_routed_experts`; GptOssConfig reads it as
/// `num_local_experts`. The model type, not the mapping, decides which.
#[test]
fn num_experts_is_read_as_each_class_names_it() {
    let hub = copy_fixture("gpt_oss");
    let other = copy_fixture("gpt_oss");
    respell(other.path(), "num_local_experts", "num_experts");
    assert_eq!(plan(hub.path(), 2, &[]), plan(other.path(), 2, &[]));
    assert_eq!(summary(hub.path()), summary(other.path()));

    // The DeepSeek-V3 fixture as a DeepSeek-V2 model: the same MLA and MoE structure.
    let as_v2 = |key: &str| {
        let d = copy_fixture("deepseek_v3");
        let mut m = read_config(d.path());
        m.insert("model_type".into(), json!("deepseek_v2"));
        m.insert("architectures".into(), json!(["DeepseekV2ForCausalLM"]));
        write_config(d.path(), m);
        respell(d.path(), "n_routed_experts", key);
        d
    };
    let v2 = as_v2("n_routed_experts");
    let other = as_v2("num_experts");
    assert_eq!(plan(v2.path(), 2, &[]), plan(other.path(), 2, &[]));
    assert_eq!(summary(v2.path())["num_experts"], json!(8));
    assert_eq!(summary(other.path())["num_experts"], json!(8));
}
