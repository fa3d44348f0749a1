//! Pipeline parallelism (`--pp`): each stage holds its layers and the head/tail parameters its
//! family builds there, every tensor byte-identical to the same key of the TP-only output; files
//! `model-pp-{p}-tp-{t}-part-{k}`; refusals for sizes and layouts vLLM would not run. The golden
//! case `llama_gqa__pp2` (real vLLM output) runs with the other golden cases.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use serde_json::json;
use tempfile::TempDir;

use crate::support::*;

/// Every tensor of every stage equals the TP-only output's tensor of the same TP rank under the
/// same key (or under `alias`'s other name, for a tied pair that the TP-only output keeps under
/// one key); returns each stage's keys.
fn assert_stages_match_tp_only(
    pp_out: &Path,
    tp_out: &Path,
    tp: u64,
    pp: u64,
    alias: Option<(&str, &str)>,
) -> Vec<BTreeSet<String>> {
    let mut keys = Vec::new();
    for p in 0..pp {
        let mut stage_keys: Option<BTreeSet<String>> = None;
        for t in 0..tp {
            let whole = rank_tensors(tp_out, t);
            let got = stage_tensors(pp_out, p, t);
            for (name, held) in &got {
                let want = whole.get(name).or_else(|| {
                    let (a, b) = alias?;
                    let other = if name == a { b } else { a };
                    whole.get(other)
                });
                let want = want.unwrap_or_else(|| {
                    panic!("stage {p} tp {t}: '{name}' is not in the TP-only output")
                });
                assert!(
                    held == want,
                    "stage {p} tp {t}: '{name}' differs from the TP-only output"
                );
            }
            let names: BTreeSet<String> = got.keys().cloned().collect();
            if let Some(k) = &stage_keys {
                assert_eq!(k, &names, "stage {p}: TP ranks hold different keys");
            }
            stage_keys = Some(names);
        }
        keys.push(stage_keys.unwrap());
    }
    keys
}

/// The layer numbers a stage's keys name.
fn layers(keys: &BTreeSet<String>) -> BTreeSet<u64> {
    keys.iter()
        .filter_map(|k| {
            k.strip_prefix("model.layers.")?
                .split('.')
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

fn top_level(keys: &BTreeSet<String>) -> BTreeSet<&str> {
    keys.iter()
        .map(String::as_str)
        .filter(|k| !k.starts_with("model.layers."))
        .collect()
}

#[test]
fn mixtral_stages_each_hold_embedding_norm_and_lm_head() {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(&fixture("mixtral"), 2, &out, &["--pp", "2", "-q"]);
    // vLLM's own TP-only output of the same fixture.
    let keys = assert_stages_match_tp_only(&out, &expected("mixtral", 2), 2, 2, None);
    let all = BTreeSet::from([
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
    ]);
    for (p, k) in keys.iter().enumerate() {
        assert_eq!(top_level(k), all, "stage {p}");
        assert_eq!(layers(k), BTreeSet::from([p as u64]), "stage {p}");
    }
}

#[test]
fn tied_llama_last_stage_saves_lm_head_and_not_the_embedding() {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(&fixture("llama_tied_fp16"), 2, &out, &["--pp", "2", "-q"]);
    // vLLM's TP-only output keeps the tied pair as lm_head.weight (the smaller key).
    let keys = assert_stages_match_tp_only(
        &out,
        &expected("llama_tied_fp16", 2),
        2,
        2,
        Some(("lm_head.weight", "model.embed_tokens.weight")),
    );
    assert_eq!(
        top_level(&keys[0]),
        BTreeSet::from(["model.embed_tokens.weight"])
    );
    assert_eq!(
        top_level(&keys[1]),
        BTreeSet::from(["lm_head.weight", "model.norm.weight"])
    );
    assert_eq!(layers(&keys[0]), BTreeSet::from([0]));
    assert_eq!(layers(&keys[1]), BTreeSet::from([1]));
}

/// A Llama checkpoint with `n` layers (hidden 8, 2 heads, 1 KV head, vocab 16), every tensor's
/// bytes distinct, so that a tensor taken from the wrong place shows.
fn llama_layers(dir: &Path, n: u64) {
    let mut config = tiny_config();
    config["num_hidden_layers"] = json!(n);
    config["dtype"] = json!("bfloat16");
    write_json(&dir.join("config.json"), &config);
    let specs = tiny_llama_specs(n);
    let data: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(k, (_, sh))| {
            let len = 2 * sh.iter().product::<u64>() as usize;
            // Small finite bf16 values, different per tensor and element.
            (0..len)
                .map(|b| if b % 2 == 0 { (b / 2 + k) as u8 } else { 0x3f })
                .collect()
        })
        .collect();
    let tensors: Vec<Tensor> = specs
        .iter()
        .zip(&data)
        .map(|((name, sh), d)| (name.as_str(), "BF16", *sh, d.as_slice()))
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
}

#[test]
fn three_layers_on_three_stages() {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    llama_layers(&src, 3);
    let (pp_out, tp_out) = (tmp.path().join("pp"), tmp.path().join("tp"));
    shard_ok(&src, 1, &pp_out, &["--pp", "3", "-q"]);
    shard_ok(&src, 1, &tp_out, &["-q"]);
    let keys = assert_stages_match_tp_only(&pp_out, &tp_out, 1, 3, None);
    for (p, k) in keys.iter().enumerate() {
        assert_eq!(layers(k), BTreeSet::from([p as u64]), "stage {p}");
    }
    assert_eq!(
        top_level(&keys[0]),
        BTreeSet::from(["model.embed_tokens.weight"])
    );
    assert_eq!(top_level(&keys[1]), BTreeSet::new());
    assert_eq!(
        top_level(&keys[2]),
        BTreeSet::from(["lm_head.weight", "model.norm.weight"])
    );
    // Attention scale buffers follow their layer.
    assert!(keys[1].contains("model.layers.1.self_attn.attn._k_scale"));
    // The manifest records the stages; the folder loads back at --pp 3 only.
    let m: serde_json::Value =
        serde_json::from_slice(&fs::read(pp_out.join("wload.json")).unwrap()).unwrap();
    assert_eq!(m["pp"], 3);
    assert_eq!(m["ranks"], json!([0, 1, 2]));
    let f = &m["files"][2];
    assert_eq!(f["name"], "model-pp-2-tp-0-part-0.safetensors");
    assert_eq!(
        (&f["rank"], &f["pp_rank"], &f["tp_rank"]),
        (&json!(2), &json!(2), &json!(0))
    );
    let tp_manifest = fs::read_to_string(tp_out.join("wload.json")).unwrap();
    for field in ["\"pp\"", "pp_rank", "tp_rank"] {
        assert!(!tp_manifest.contains(field), "{tp_manifest}");
    }
    let ok = run(&[
        "load",
        s(&pp_out),
        "--tp",
        "1",
        "--pp",
        "3",
        "--dry-run",
        "--read",
    ]);
    assert!(ok.status.success(), "{}", context(&ok));
    assert!(
        stdout(&ok).contains("matches wload.json"),
        "{}",
        context(&ok)
    );
    let o = run(&["load", s(&pp_out), "--tp", "1", "--pp", "2", "--dry-run"]);
    assert_refusal_text(
        &o,
        3,
        &[
            "--pp 2 expects",
            "stage 0 holds layers [0, 2), stage 1 holds layers [2, 3)",
            "stage 0, stage 1, stage 2",
            "model-pp-2-tp-0-part-0.safetensors",
            "load with --pp 3",
        ],
    );
}

#[test]
fn a_wrong_pp_on_load_is_refused_naming_the_layouts() {
    let tmp = TempDir::new().unwrap();
    let (pp_out, tp_out) = (tmp.path().join("pp"), tmp.path().join("tp"));
    shard_ok(&fixture(GQA), 2, &pp_out, &["--pp", "2", "-q"]);
    shard_ok(&fixture(GQA), 2, &tp_out, &["-q"]);
    // --pp 1 given: without it, load would take --pp 2 from wload.json.
    let o = run(&[
        "load",
        s(&pp_out),
        "--tp",
        "2",
        "--pp",
        "1",
        "--device",
        "cpu",
        "--dry-run",
    ]);
    assert_refusal_text(
        &o,
        3,
        &[
            "--pp 1 expects model-rank-{t}-part-{k}.safetensors files (stage 0 holds layers [0, 2))",
            "stage 0, stage 1",
            "model-pp-1-tp-1-part-0.safetensors",
            "load with --pp 2",
        ],
    );
    // Not a dry run: refused the same way, before any device.
    let o = run(&[
        "load",
        s(&pp_out),
        "--tp",
        "2",
        "--pp",
        "1",
        "--device",
        "cpu",
    ]);
    assert_refusal_text(&o, 3, &["load with --pp 2"]);
    let o = run(&["load", s(&tp_out), "--tp", "2", "--pp", "2", "--dry-run"]);
    assert_refusal_text(
        &o,
        3,
        &[
            "stage 0 holds layers [0, 1), stage 1 holds layers [1, 2)",
            "no stage (TP-only model-rank-* files)",
            "model-rank-0-part-0.safetensors",
            "load with --pp 1",
        ],
    );
    // The right one passes, bytes checked against the manifest.
    let ok = run(&[
        "load",
        s(&pp_out),
        "--tp",
        "2",
        "--pp",
        "2",
        "--dry-run",
        "--read",
    ]);
    assert!(ok.status.success(), "{}", context(&ok));
    assert!(
        stdout(&ok).contains("at tp 2 pp 2 (4 ranks checked"),
        "{}",
        stdout(&ok)
    );
}

#[test]
fn pp_zero_is_a_usage_error_and_more_stages_than_layers_is_refused() {
    for cmd in ["plan", "load"] {
        let o = run(&[cmd, s(&fixture(GQA)), "--tp", "1", "--pp", "0"]);
        assert_eq!(o.status.code(), Some(2), "{}", context(&o));
        assert!(stderr(&o).contains("--pp"), "{}", context(&o));
    }
    let o = run(&[
        "plan",
        s(&fixture(GQA)),
        "--tp",
        "1",
        "--pipeline-parallel-size",
        "3",
    ]);
    assert_refusal_text(
        &o,
        3,
        &[
            "--pp 3 is more than the model's 2 layers",
            "choose a --pp of at most 2",
        ],
    );
}

#[test]
fn vllm_pp_layer_partition_is_honoured_and_checked() {
    let tmp = TempDir::new().unwrap();
    llama_layers(tmp.path(), 3);
    let plan = |env: Option<&str>, json: bool| {
        let mut c = wload();
        c.args(["plan", s(tmp.path()), "--tp", "1", "--pp", "2"]);
        if json {
            c.arg("--json");
        }
        match env {
            Some(v) => c.env("VLLM_PP_LAYER_PARTITION", v),
            None => c.env_remove("VLLM_PP_LAYER_PARTITION"),
        };
        c.output().unwrap()
    };
    let stages = |o: &std::process::Output| {
        assert!(o.status.success(), "{}", context(o));
        let v: serde_json::Value = json_doc(&["plan"], o);
        v["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["first_layer"].as_u64().unwrap(),
                    s["end_layer"].as_u64().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(stages(&plan(None, true)), [(0, 2), (2, 3)]);
    assert_eq!(stages(&plan(Some("1,2"), true)), [(0, 1), (1, 3)]);
    for (bad, says) in [
        (
            "2,2",
            "sum(partitions)=4 does not match num_hidden_layers=3.",
        ),
        ("1,1,1", "len(partitions)=3 does not match pp_size=2."),
        // 4 + (2^64 - 1) wraps to 3 in u64: it used to be taken for a fit.
        (
            "4,18446744073709551615",
            "sum(partitions)=18446744073709551619 does not match num_hidden_layers=3.",
        ),
        ("1,x", "Invalid partition string: 1,x"),
        (
            "3,0",
            "VLLM_PP_LAYER_PARTITION gives pipeline stage 1 no layers",
        ),
    ] {
        assert_refusal_text(&plan(Some(bad), false), 3, &[says]);
    }
    // vLLM checks it at PP 1 too.
    let o = run_env(&["plan", s(tmp.path()), "--tp", "1"], "2,1");
    assert_refusal_text(&o, 3, &["len(partitions)=2 does not match pp_size=1."]);
    let o = run_env(&["plan", s(tmp.path()), "--tp", "1"], "3");
    assert!(o.status.success(), "{}", context(&o));
}

fn run_env(args: &[&str], partition: &str) -> std::process::Output {
    wload()
        .args(args)
        .env("VLLM_PP_LAYER_PARTITION", partition)
        .output()
        .unwrap()
}

#[test]
fn plan_json_names_stage_and_tp_rank_of_every_rank() {
    let p = wload_json(&["plan", s(&fixture(GQA)), "--tp", "2", "--pp", "2", "--json"]);
    assert_eq!(p["pp"], 2);
    let ids: Vec<(u64, u64, u64)> = p["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["rank"].as_u64().unwrap(),
                r["pp_rank"].as_u64().unwrap(),
                r["tp_rank"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ids, [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]);
    // Without PP the fields are there too: one stage, tp_rank = rank.
    let p = wload_json(&["plan", s(&fixture(GQA)), "--tp", "2", "--json"]);
    assert_eq!(p["pp"], 1);
    assert_eq!(p["ranks"][1]["pp_rank"], 0);
    assert_eq!(p["ranks"][1]["tp_rank"], 1);
    // The terminal report names the stages; --rank takes a global rank.
    let o = run(&[
        "plan",
        s(&fixture(GQA)),
        "--tp",
        "2",
        "--pp",
        "2",
        "--rank",
        "3",
    ]);
    assert!(o.status.success(), "{}", context(&o));
    let text = stdout(&o);
    assert!(
        text.contains("stage 1       layers [1, 2), ranks 2..3"),
        "{text}"
    );
    assert!(text.contains("rank 3 (stage 1, tp rank 1)"), "{text}");
    let o = run(&[
        "plan",
        s(&fixture(GQA)),
        "--tp",
        "2",
        "--pp",
        "2",
        "--rank",
        "4",
    ]);
    assert_refusal_text(
        &o,
        2,
        &["--rank 4 is out of range for --tp 2 --pp 2 (ranks 0..3)"],
    );
}

#[test]
fn ranks_and_launchers_pick_global_ranks() {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(
        &fixture(GQA),
        2,
        &out,
        &["--pp", "2", "--ranks", "2-3", "-q"],
    );
    let names: BTreeSet<String> = fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("model-"))
        .collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "model-pp-1-tp-0-part-0.safetensors".to_string(),
            "model-pp-1-tp-1-part-0.safetensors".to_string()
        ])
    );
    let o = shard(
        &fixture(GQA),
        2,
        &tmp.path().join("o2"),
        &["--pp", "2", "--ranks", "4"],
    );
    assert_refusal_text(
        &o,
        2,
        &["rank 4 is out of range for --tp 2 --pp 2 (ranks are 0 to 3)"],
    );
    let o = wload()
        .args([
            "load",
            s(&fixture(GQA)),
            "--tp",
            "2",
            "--pp",
            "2",
            "--dry-run",
        ])
        .env("RANK", "0")
        .env("WORLD_SIZE", "3")
        .output()
        .unwrap();
    assert_refusal_text(&o, 2, &["3 processes cannot share --tp 2 --pp 2 evenly"]);
    // A launcher whose rank is not below its world size contradicts itself: said so, naming the
    // variables, not taken for a sharing problem.
    for (rank, world, says) in [
        (
            ("RANK", "4"),
            ("WORLD_SIZE", "4"),
            "RANK=4 is not below WORLD_SIZE=4",
        ),
        (
            ("SLURM_PROCID", "9"),
            ("SLURM_NTASKS", "2"),
            "SLURM_PROCID=9 is not below SLURM_NTASKS=2",
        ),
    ] {
        let o = wload()
            .args([
                "load",
                s(&fixture(GQA)),
                "--tp",
                "2",
                "--pp",
                "2",
                "--dry-run",
            ])
            .env(rank.0, rank.1)
            .env(world.0, world.1)
            .output()
            .unwrap();
        let err = assert_refusal_text(&o, 2, &[says, "the launcher's variables disagree"]);
        assert!(!err.contains("evenly"), "{err}");
    }
    // torchrun's second of two processes at tp 2 × pp 2 loads global ranks 2 and 3.
    let o = wload()
        .args([
            "load",
            s(&fixture(GQA)),
            "--tp",
            "2",
            "--pp",
            "2",
            "--dry-run",
            "--json",
        ])
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .env_remove("SLURM_PROCID")
        .env_remove("SLURM_NTASKS")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", context(&o));
    let v: serde_json::Value = json_doc(&["load"], &o);
    let ranks: Vec<u64> = v["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(ranks, [2, 3]);
    assert_eq!(v["pp"], 2);
}

/// `--max-part-size` splits each (stage, TP rank)'s tensors on their own, parts numbered from 0,
/// as vLLM's save_model does per rank; the stages load back.
#[test]
fn parts_are_split_per_stage_and_tp_rank() {
    let tmp = TempDir::new().unwrap();
    let (small, whole) = (tmp.path().join("small"), tmp.path().join("whole"));
    shard_ok(
        &fixture(GQA),
        2,
        &small,
        &["--pp", "2", "--max-part-size", "40000", "-q"],
    );
    shard_ok(&fixture(GQA), 2, &whole, &["--pp", "2", "-q"]);
    for p in 0..2 {
        for t in 0..2 {
            let parts = files_with_prefix(&small, &format!("model-pp-{p}-tp-{t}-part-"));
            assert!(parts.len() > 1, "stage {p} tp {t}: {parts:?}");
            for (k, f) in parts.iter().enumerate() {
                let want = format!("model-pp-{p}-tp-{t}-part-{k}.safetensors");
                assert_eq!(f.file_name().unwrap().to_string_lossy(), want);
            }
            assert!(
                stage_tensors(&small, p, t) == stage_tensors(&whole, p, t),
                "stage {p} tp {t}"
            );
        }
    }
    let ok = run(&[
        "load",
        s(&small),
        "--tp",
        "2",
        "--pp",
        "2",
        "--dry-run",
        "--read",
    ]);
    assert!(ok.status.success(), "{}", context(&ok));
}

/// The top-level (non-layer) keys of each rank of `plan --json`.
fn planned_top_level(fixture_name: &str, tp: &str, pp: &str) -> Vec<BTreeSet<String>> {
    let p = wload_json(&[
        "plan",
        s(&fixture(fixture_name)),
        "--tp",
        tp,
        "--pp",
        pp,
        "--json",
    ]);
    p["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_string())
                .filter(|n| !n.starts_with("model.layers."))
                .collect()
        })
        .collect()
}

/// Gemma 2 has no lm_head module and builds its embedding and norm on every stage
/// (gemma2.py:259, 270: no PPMissingLayer).
#[test]
fn gemma2_stages_each_hold_embedding_and_norm() {
    let want: BTreeSet<String> = ["model.embed_tokens.weight", "model.norm.weight"]
        .map(String::from)
        .into();
    assert_eq!(planned_top_level("gemma2", "1", "2"), [want.clone(), want]);
}

/// Stage placement is the mapping's: a head or tail parameter without `pp_stage` is refused at
/// PP > 1 (and fine at PP 1), and a layer parameter with one is refused.
#[test]
fn pp_stage_must_be_declared_for_head_and_tail_only() {
    let tmp = TempDir::new().unwrap();
    let llama = fs::read_to_string(manifest_dir().join("mappings/llama.yaml")).unwrap();
    let without: String = llama
        .lines()
        .filter(|l| !l.contains("pp_stage"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(without, llama, "llama.yaml declares pp_stage");
    let path = tmp.path().join("no-stages.yaml");
    fs::write(&path, without).unwrap();
    let gqa = fixture(GQA);
    let base = ["plan", s(&gqa), "--tp", "1", "--mapping", s(&path)];
    assert!(run(&base).status.success());
    let mut pp2 = base.to_vec();
    pp2.extend(["--pp", "2"]);
    assert_refusal_text(
        &run(&pp2),
        3,
        &[
            "model.embed_tokens.weight: the mapping does not say on which pipeline stages",
            "lm_head.weight: the mapping does not say",
            "add `pp_stage:`",
        ],
    );
    let layer = llama.replace(
        "    - use: layer_norms",
        "    - name: model.layers.{i}.extra.weight\n      layout: {kind: replicated, shape: [hidden_size]}\n      optional: true\n      pp_stage: true\n    - use: layer_norms",
    );
    assert_ne!(layer, llama);
    fs::write(&path, layer).unwrap();
    assert_refusal_text(
        &run(&base),
        3,
        &["model.layers.{i}.extra.weight: `pp_stage` is for head and tail parameters"],
    );
}

/// vLLM's Qwen3-MoE needs a MoE layer on every pipeline stage ("No Qwen3MoE layer found in the
/// model.layers.", qwen3_moe.py:607): the fixture's layer 0 is dense (`mlp_only_layers: [0]`), so
/// PP 2 leaves stage 0 without one.
#[test]
fn a_qwen3_moe_stage_without_a_moe_layer_is_refused() {
    let r = run(&[
        "plan",
        fixture("qwen3_moe_fp8_block").to_str().unwrap(),
        "--tp",
        "1",
        "--pp",
        "2",
    ]);
    assert_refusal_text(
        &r,
        3,
        &["No Qwen3MoE layer found in the model.layers. (pipeline stage 0 holds layers [0, 1))"],
    );
}
