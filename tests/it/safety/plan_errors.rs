//! `wload plan` on checkpoints that do not fit: each test plants one fault (or a few) in a copy of a
//! real golden fixture, or builds a tiny checkpoint, and checks that planning refuses it with exit
//! status 3 and a message naming what matters (tensor, file, parameter, shapes, rule, fix), every
//! problem at once. Also the usage errors around `plan` (exit 2) and the flags that change what a
//! valid plan holds (`--mapping`, `--dtype`).

use std::fs;
use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};

use crate::support::*;

/// layer 0's q/k/v, gate_proj and o_proj live here.
const ATTN0: &str = "model-00002-of-00006.safetensors";
/// layer 0's up_proj and down_proj live here.
const MLP0: &str = "model-00003-of-00006.safetensors";
/// layer 1's norms, down_proj and model.norm live here.
const LAST: &str = "model-00006-of-00006.safetensors";

const UP0: &str = "model.layers.0.mlp.up_proj.weight";
const Q0: &str = "model.layers.0.self_attn.q_proj.weight";

/// What one `wload` run printed and how it ended.
struct Run {
    out: Output,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn context(&self) -> String {
        context(&self.out)
    }

    /// A refusal with exit status `code` (see [`assert_refused`]).
    fn refused(&self, code: i32) -> &Self {
        assert_refusal_text(&self.out, code, &[]);
        self
    }

    /// stderr contains every one of `parts` (exact substrings).
    fn says(&self, parts: &[&str]) -> &Self {
        for p in parts {
            assert!(
                self.stderr.contains(p),
                "stderr should contain {p:?}; {}",
                self.context()
            );
        }
        self
    }

    /// Some line of stderr contains every one of `parts`: they belong to the same problem.
    fn one_line_says(&self, parts: &[&str]) -> &Self {
        assert!(
            self.stderr
                .lines()
                .any(|l| parts.iter().all(|p| l.contains(p))),
            "no single stderr line contains all of {parts:?}; {}",
            self.context()
        );
        self
    }

    /// The problem whose message line contains `anchor` has a fix containing `fix`: the first
    /// fix line after it (`fix: …`, or `fix (the N above): …` after a run of problems sharing
    /// one), with only other problems between.
    fn fix_for(&self, anchor: &str, fix: &str) -> &Self {
        let lines: Vec<&str> = self.stderr.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.contains(anchor))
            .unwrap_or_else(|| panic!("no line contains {anchor:?}; {}", self.context()));
        let next = lines[at + 1..]
            .iter()
            .map(|l| l.trim_start())
            .find(|l| !l.starts_with("- ") && !l.starts_with("… and"))
            .unwrap_or("");
        assert!(
            next.starts_with("fix") && next.contains(fix),
            "the fix after {anchor:?} should contain {fix:?}; {}",
            self.context()
        );
        self
    }

    /// The number of problems the error header announces.
    fn problem_count(&self) -> usize {
        let head = self.stderr.lines().next().unwrap_or("");
        // "error: N problem(s) found; ...", N with thousands separators
        head.trim_start_matches("error: ")
            .split(' ')
            .next()
            .expect("problem count in the first line")
            .replace(',', "")
            .parse()
            .unwrap_or_else(|_| panic!("no problem count in {head:?}"))
    }
}

fn run(args: &[&str]) -> Run {
    let out = wload()
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("wload runs");
    Run {
        code: out.status.code(),
        stdout: stdout(&out),
        stderr: stderr(&out),
        out,
    }
}

fn plan(dir: &Path, extra: &[&str]) -> Run {
    let mut args = vec!["plan", s(dir)];
    args.extend_from_slice(extra);
    run(&args)
}

/// Renames tensor `from` to `to` in the header of `dir/file` (the data stay where they are) and in
/// the index's weight_map, as a checkpoint saved with a different module name would have it.
fn rename_tensor(dir: &Path, file: &str, from: &str, to: &str) {
    edit_header(&dir.join(file), |h| {
        let entry = h
            .shift_remove(from)
            .unwrap_or_else(|| panic!("{file} has no {from}"));
        h.insert(to.to_string(), entry);
    });
    edit_index(dir, |wm| {
        let f = wm.shift_remove(from).expect("indexed tensor");
        wm.insert(to.to_string(), f);
    });
}

/// Edits the `weight_map` of `dir/model.safetensors.index.json`.
fn edit_index(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = dir.join("model.safetensors.index.json");
    let mut index: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    edit(index["weight_map"].as_object_mut().expect("weight_map"));
    write_json(&path, &index);
}

/// Sets the shape of `tensor` in the header of `dir/file` (its byte span is kept).
fn set_shape(dir: &Path, file: &str, tensor: &str, shape: &[u64]) {
    edit_header(&dir.join(file), |h| {
        let entry = h
            .get_mut(tensor)
            .unwrap_or_else(|| panic!("{file} has no {tensor}"));
        entry["shape"] = json!(shape);
    });
}

/// One tensor of a file being rewritten: name, dtype, shape, bytes.
type Owned = (String, String, Vec<u64>, Vec<u8>);

/// Rewrites the safetensors file `path` with its tensors (in header order) changed by `edit`,
/// packed again so that the file stays valid.
fn repack(path: &Path, edit: impl FnOnce(&mut Vec<Owned>)) {
    let raw = RawFile::read(path);
    let mut tensors: Vec<Owned> = header_tensors(path)
        .into_iter()
        .map(|t| {
            let bytes = raw.data[t.start as usize..t.end as usize].to_vec();
            (t.name, t.dtype, t.shape, bytes)
        })
        .collect();
    edit(&mut tensors);
    let refs: Vec<Tensor> = tensors
        .iter()
        .map(|(n, d, sh, b)| (n.as_str(), d.as_str(), sh.as_slice(), b.as_slice()))
        .collect();
    write_safetensors(path, &refs);
}

/// Sets `config.json`'s `key` to `value`.
fn set_config(dir: &Path, key: &str, value: Value) {
    let path = dir.join("config.json");
    let mut cfg: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    cfg[key] = value;
    write_json(&path, &cfg);
}

/// Every tensor of `rank` in a plan's JSON: name → (dtype, shape).
fn rank_tensors(plan: &Value, rank: usize) -> Vec<(String, String, Vec<u64>)> {
    plan["ranks"][rank]["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .map(json_tensor)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Checkpoint faults (exit 3)

#[test]
fn renamed_tensor_is_named_with_its_file_and_the_parameter_it_leaves_empty_is_reported_too() {
    let tmp = copy_fixture("llama_gqa");
    let bad = "model.layers.0.mlp.upp_proj.weight";
    rename_tensor(tmp.path(), MLP0, UP0, bad);
    let r = plan(tmp.path(), &["--tp", "2"]);
    r.refused(3)
        // the checkpoint tensor nothing takes, with its file
        .one_line_says(&[MLP0, &format!("'{bad}'"), "matches no parameter"])
        .fix_for(bad, "--mapping FILE")
        // and, in the same run, the parameter that now lacks its up half
        .one_line_says(&[
            "'model.layers.0.mlp.gate_up_proj.weight'",
            "nothing in the checkpoint",
            "shard 1",
        ])
        .fix_for("model.layers.0.mlp.gate_up_proj.weight", "wload inspect");
    assert_eq!(r.problem_count(), 2, "{}", r.context());
    // layer 1 is untouched.
    assert!(
        !r.stderr.contains("model.layers.1.mlp.gate_up_proj"),
        "{}",
        r.context()
    );
}

#[test]
fn wrong_shape_names_tensor_file_target_parameter_and_both_shapes() {
    let tmp = copy_fixture("llama_gqa");
    // Same element count, so the byte span still matches and only the plan can object.
    set_shape(tmp.path(), ATTN0, Q0, &[64, 256]);
    let r = plan(tmp.path(), &["--tp", "2"]);
    r.refused(3)
        .one_line_says(&[
            ATTN0,
            &format!("'{Q0}'"),
            "[64, 256]",
            "'model.layers.0.self_attn.qkv_proj.weight'",
            "shard q",
            "[128, 128]",
        ])
        .fix_for("[64, 256]", "config.json");
}

#[test]
fn tp_that_does_not_divide_the_heads_quotes_the_rule_and_suggests_another_tp() {
    let fixture = fixtures_dir().join("llama_gqa");
    let r = plan(&fixture, &["--tp", "3"]);
    r.refused(3)
        .one_line_says(&[
            "num_attention_heads (8) is not divisible by tp (3)",
            "num_attention_heads % tp == 0",
        ])
        .fix_for("num_attention_heads (8)", "--tp")
        .fix_for("num_attention_heads (8)", "8");
    // Not a flood of per-parameter complaints: the geometry checks stop at the rule.
    assert!(r.problem_count() <= 2, "{}", r.context());
}

#[test]
fn qwen3_moe_plans_at_tp2_with_the_router_kept_under_its_experts_name() {
    let tmp = tiny_qwen3_moe();
    let p = wload_json(&["plan", s(tmp.path()), "--tp", "2", "--json"]);
    assert_eq!(p["family"], "qwen3_moe");
    for rank in 0..2 {
        let names: Vec<String> = rank_tensors(&p, rank).into_iter().map(|t| t.0).collect();
        let at = |n: &str| names.iter().position(|x| x == n);
        let router = at("model.layers.0.mlp.experts.gate.weight")
            .unwrap_or_else(|| panic!("rank {rank}: no router key in {names:?}"));
        let w13 = at("model.layers.0.mlp.experts.routed_experts.w13_weight")
            .unwrap_or_else(|| panic!("rank {rank}: no w13 in {names:?}"));
        assert!(router < w13, "rank {rank}: router after w13 in {names:?}");
        assert_eq!(
            at("model.layers.0.mlp.gate.weight"),
            None,
            "rank {rank}: the router is one tensor, kept once: {names:?}"
        );
        let shapes = rank_tensors(&p, rank);
        let shape_of = |n: &str| shapes.iter().find(|t| t.0 == n).unwrap().2.clone();
        assert_eq!(
            shape_of("model.layers.0.mlp.experts.routed_experts.w13_weight"),
            vec![2, 8, 16]
        );
        assert_eq!(
            shape_of("model.layers.0.mlp.experts.routed_experts.w2_weight"),
            vec![2, 16, 4]
        );
        assert_eq!(
            shape_of("model.layers.0.mlp.experts.gate.weight"),
            vec![2, 16]
        );
    }
}

#[test]
fn tp_larger_than_the_expert_count_is_refused_for_qwen3_moe() {
    let tmp = tiny_qwen3_moe();
    let msg = "Tensor parallel size 4 is greater than the number of experts 2";
    plan(tmp.path(), &["--tp", "4"])
        .refused(3)
        .one_line_says(&[msg, "tp <= num_experts"])
        .fix_for(msg, "--tp");
}

#[test]
fn tp_larger_than_the_expert_count_is_refused_even_with_expert_parallel() {
    // vLLM checks tp against the expert count, whatever the expert parallelism.
    let tmp = tiny_qwen3_moe();
    plan(tmp.path(), &["--tp", "4", "--enable-expert-parallel"])
        .refused(3)
        .says(&["Tensor parallel size 4 is greater than the number of experts 2"]);
}

/// An expert count no model has (a typo, or a hostile config) is refused at once, naming the
/// field and the limit, for every family's experts layout: planning 2^31 experts a layer would
/// run for hours and exhaust memory first.
#[test]
fn an_absurd_expert_count_is_refused_at_once() {
    for (fixture, field) in [
        ("mixtral", "num_local_experts"),
        ("qwen2_moe", "num_experts"),
        ("deepseek_v3", "n_routed_experts"),
        ("gpt_oss", "num_local_experts"),
    ] {
        let dir = copy_fixture(fixture);
        set_config(dir.path(), field, json!(1u64 << 31));
        for extra in [
            &["--tp", "2"][..],
            &["--tp", "2", "--enable-expert-parallel"],
        ] {
            plan(dir.path(), extra)
                .refused(3)
                .says(&["gives 2147483648 experts; wload plans at most 65536"]);
        }
    }
}

#[test]
fn missing_norm_names_the_parameter_left_unfilled() {
    let tmp = copy_fixture("llama_gqa");
    let gone = "model.layers.1.post_attention_layernorm.weight";
    repack(&tmp.path().join(LAST), |ts| {
        let before = ts.len();
        ts.retain(|t| t.0 != gone);
        assert_eq!(ts.len(), before - 1, "{LAST} held {gone}");
    });
    edit_index(tmp.path(), |wm| {
        wm.shift_remove(gone).expect("indexed");
    });
    let r = plan(tmp.path(), &["--tp", "2"]);
    r.refused(3)
        .one_line_says(&[&format!("'{gone}'"), "nothing in the checkpoint"])
        .fix_for(gone, "wload inspect");
    assert_eq!(r.problem_count(), 1, "{}", r.context());
}

#[test]
fn unknown_architecture_lists_the_known_ones_and_suggests_a_mapping_file() {
    let tmp = copy_fixture("llama_gqa");
    set_config(tmp.path(), "architectures", json!(["FooForCausalLM"]));
    plan(tmp.path(), &["--tp", "2"]).refused(3).one_line_says(&[
        "'FooForCausalLM'",
        "LlamaForCausalLM",
        "Qwen3MoeForCausalLM",
        "Gemma2ForCausalLM",
        "--mapping FILE",
    ]);
}

#[test]
fn several_faults_are_all_reported_in_one_run() {
    let tmp = copy_fixture("llama_gqa");
    let bad = "model.layers.0.mlp.upp_proj.weight";
    rename_tensor(tmp.path(), MLP0, UP0, bad);
    set_shape(tmp.path(), ATTN0, Q0, &[64, 256]);
    let r = plan(tmp.path(), &["--tp", "2"]);
    r.refused(3)
        .one_line_says(&[MLP0, bad, "matches no parameter"])
        .one_line_says(&["model.layers.0.mlp.gate_up_proj.weight", "shard 1"])
        .one_line_says(&[ATTN0, Q0, "[64, 256]", "[128, 128]"]);
    assert!(r.problem_count() >= 3, "{}", r.context());
    assert_eq!(
        fixes_cover(&r.stderr),
        r.problem_count(),
        "every problem has a fix; {}",
        r.context()
    );
}

/// How many problems the fix lines cover: `fix: …` one, `fix (the N above): …` N.
fn fixes_cover(stderr: &str) -> usize {
    stderr
        .lines()
        .map(str::trim_start)
        .filter_map(|l| {
            if l.starts_with("fix: ") {
                return Some(1);
            }
            let n = l.strip_prefix("fix (the ")?.split(' ').next()?;
            n.replace(',', "").parse().ok()
        })
        .sum()
}

#[test]
fn gemma2_with_an_lm_head_tensor_is_refused() {
    // Gemma 2 has no lm_head module: vLLM fails with "no module or parameter named 'lm_head'".
    let tmp = copy_fixture("gemma2");
    let file = "model-00005-of-00005.safetensors";
    repack(&tmp.path().join(file), |ts| {
        ts.push((
            "lm_head.weight".into(),
            "BF16".into(),
            vec![1000, 128],
            zeros(1000 * 128 * 2),
        ));
    });
    edit_index(tmp.path(), |wm| {
        wm.insert("lm_head.weight".into(), json!(file));
    });
    plan(tmp.path(), &["--tp", "2"]).refused(3).one_line_says(&[
        file,
        "'lm_head.weight'",
        "matches no parameter",
    ]);
}

// ---------------------------------------------------------------------------------------------
// --mapping FILE

#[test]
fn custom_mapping_file_with_a_renamed_stacked_rule_plans_a_renamed_checkpoint() {
    let tmp = copy_fixture("llama_gqa");
    rename_tensor(tmp.path(), MLP0, UP0, "model.layers.0.mlp.w3.weight");
    rename_tensor(
        tmp.path(),
        "model-00004-of-00006.safetensors",
        "model.layers.1.mlp.up_proj.weight",
        "model.layers.1.mlp.w3.weight",
    );
    // The stock mapping does not know .w3.
    plan(tmp.path(), &["--tp", "2"])
        .refused(3)
        .says(&["model.layers.0.mlp.w3.weight", "matches no parameter"]);

    let stock = fs::read_to_string(manifest_dir().join("mappings/llama.yaml")).unwrap();
    let old = "{from: .up_proj, to: .gate_up_proj, shard: 1}";
    assert!(stock.contains(old), "llama.yaml's up_proj rule changed");
    let custom = stock.replace(old, "{from: .w3, to: .gate_up_proj, shard: 1}");
    let mapping = tempfile::TempDir::new().unwrap();
    let mfile = mapping.path().join("my-llama.yaml");
    fs::write(&mfile, custom).unwrap();

    let p = wload_json(&[
        "plan",
        s(tmp.path()),
        "--tp",
        "2",
        "--mapping",
        s(&mfile),
        "--json",
    ]);
    let sources = p["sources"].as_array().unwrap();
    for r in 0..2 {
        let gate_up = p["ranks"][r]["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "model.layers.0.mlp.gate_up_proj.weight")
            .expect("gate_up_proj planned");
        let from: Vec<&str> = gate_up["pieces"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|pc| pc["copy"]["source"].as_u64())
            .map(|i| sources[i as usize]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            from,
            [
                "model.layers.0.mlp.gate_proj.weight",
                "model.layers.0.mlp.w3.weight"
            ],
            "rank {r}: {gate_up}"
        );
        assert_eq!(
            rank_tensors(&p, r)
                .iter()
                .find(|t| t.0 == "model.layers.0.mlp.gate_up_proj.weight")
                .unwrap()
                .2,
            vec![256, 128]
        );
    }
}

#[test]
fn mapping_file_with_a_yaml_syntax_error_is_a_usage_error_naming_the_file() {
    let mapping = tempfile::TempDir::new().unwrap();
    let mfile = mapping.path().join("broken.yaml");
    fs::write(
        &mfile,
        "family: broken\narchitectures: [LlamaForCausalLM\nparameters: {}\n",
    )
    .unwrap();
    let fixture = fixtures_dir().join("llama_gqa");
    plan(&fixture, &["--tp", "2", "--mapping", s(&mfile)])
        .refused(2)
        .says(&[s(&mfile)]);
}

// ---------------------------------------------------------------------------------------------
// Usage errors (exit 2)

#[test]
fn rank_out_of_range_is_a_usage_error() {
    let fixture = fixtures_dir().join("llama_gqa");
    plan(&fixture, &["--tp", "2", "--rank", "2"])
        .refused(2)
        .says(&["--rank 2", "--tp 2"]);
}

#[test]
fn tp_zero_is_a_usage_error() {
    let fixture = fixtures_dir().join("llama_gqa");
    plan(&fixture, &["--tp", "0"]).refused(2).says(&["--tp"]);
}

// Regression: `--tp 0 --rank 0` once underflowed `tp - 1` in the rank range check.
#[test]
fn tp_zero_with_a_rank_is_a_usage_error_not_a_panic() {
    let fixture = fixtures_dir().join("llama_gqa");
    plan(&fixture, &["--tp", "0", "--rank", "0"])
        .refused(2)
        .says(&["--tp"]);
}

// ---------------------------------------------------------------------------------------------
// What a valid plan holds

#[test]
fn dtype_float16_converts_weights_but_keeps_attention_scales_f32() {
    let fixture = fixtures_dir().join("llama_gqa");
    let p = wload_json(&[
        "plan",
        s(&fixture),
        "--tp",
        "2",
        "--dtype",
        "float16",
        "--json",
    ]);
    assert_eq!(p["dtype"], "F16");
    for r in 0..2 {
        let ts = rank_tensors(&p, r);
        let dtype_of = |n: &str| {
            ts.iter()
                .find(|t| t.0 == n)
                .unwrap_or_else(|| panic!("rank {r}: no {n}"))
                .1
                .clone()
        };
        assert_eq!(dtype_of("model.layers.0.self_attn.qkv_proj.weight"), "F16");
        assert_eq!(dtype_of("model.embed_tokens.weight"), "F16");
        assert_eq!(dtype_of("model.layers.1.input_layernorm.weight"), "F16");
        assert_eq!(dtype_of("model.layers.0.self_attn.attn._k_scale"), "F32");
        for t in &ts {
            let want = if t.0.contains("attn._") { "F32" } else { "F16" };
            assert_eq!(t.1, want, "rank {r}: {}", t.0);
        }
    }
}

#[test]
fn float32_checkpoint_under_auto_dtype_plans_bf16() {
    let fixture = fixtures_dir().join("phi3_fp32");
    let p = wload_json(&["plan", s(&fixture), "--tp", "2", "--json"]);
    assert_eq!(p["dtype"], "BF16");
    let ts = rank_tensors(&p, 0);
    assert!(ts.iter().any(|t| t.1 == "BF16"));
    for t in ts.iter().filter(|t| !t.0.contains("attn._")) {
        assert_eq!(t.1, "BF16", "{}", t.0);
    }
}

#[test]
fn human_plan_output_lists_each_rank_and_the_qkv_sources() {
    let fixture = fixtures_dir().join("llama_gqa");
    let r = plan(&fixture, &["--tp", "2"]);
    assert_eq!(r.code, Some(0), "{}", r.context());
    let out = &r.stdout;
    assert!(out.contains("rank 0 ("), "{out}");
    let rank1 = out
        .find("rank 1 (")
        .map(|i| &out[i..])
        .unwrap_or_else(|| panic!("no rank 1 section:\n{out}"));
    let qkv = rank1
        .lines()
        .find(|l| {
            l.trim_start()
                .starts_with("model.layers.0.self_attn.qkv_proj.weight")
        })
        .unwrap_or_else(|| panic!("no qkv row in rank 1:\n{rank1}"));
    for src in ["q_proj", "k_proj", "v_proj"] {
        assert!(
            qkv.contains(&format!("model.layers.0.self_attn.{src}.weight")),
            "{qkv}"
        );
    }
    // rank 1 takes the second half of the q heads and of the kv heads (4 kv heads, tp 2).
    assert!(qkv.contains("q_proj.weight rows [64, 128)"), "{qkv}");
    assert!(qkv.contains("k_proj.weight rows [32, 64)"), "{qkv}");
    assert!(qkv.contains("v_proj.weight rows [32, 64)"), "{qkv}");
    assert!(r.stderr.is_empty(), "{}", r.context());
}

#[test]
fn bf16_weights_under_an_fp8_config_are_refused_naming_the_layer() {
    let tmp = copy_fixture("llama_gqa");
    set_config(
        tmp.path(),
        "quantization_config",
        serde_json::json!({"quant_method": "fp8", "activation_scheme": "dynamic"}),
    );
    plan(tmp.path(), &["--tp", "2"]).refused(3).says(&[
        "tensor 'model.layers.0.self_attn.q_proj.weight' is BF16, which cannot be converted to F8_E4M3",
        "ignored_layers / modules_to_not_convert",
    ]);
}

#[test]
fn a_quantization_method_wload_cannot_write_is_refused_by_name() {
    let tmp = copy_fixture("llama_gqa");
    set_config(
        tmp.path(),
        "quantization_config",
        serde_json::json!({"quant_method": "hqq", "bits": 4, "group_size": 128}),
    );
    plan(tmp.path(), &["--tp", "2"])
        .refused(3)
        .says(&["quant_method = \"hqq\" is not supported"]);
}

// ---------------------------------------------------------------------------------------------
// Output bounded on the terminal, complete in --json

/// 4,000 layers (within the 4096-layer limit) whose up_proj is misnamed: each layer has a tensor nothing takes and a
/// gate_up_proj without its up half, 8,000 problems of two kinds.
fn four_thousand_misnamed_layers() -> tempfile::TempDir {
    let tmp = tempfile::TempDir::new().unwrap();
    many_layers_checkpoint(tmp.path(), 4_000, |n| n.replace(".up_proj.", ".upp_proj."));
    tmp
}

#[test]
fn eight_thousand_problems_are_summarised_on_the_terminal_by_kind() {
    let tmp = four_thousand_misnamed_layers();
    let r = plan(tmp.path(), &["--tp", "2"]);
    r.refused(3);
    assert_eq!(r.problem_count(), 8_000, "{}", &r.stderr[..2000]);
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert!(lines.len() < 300, "{} lines on stderr", lines.len());
    // The first five of each kind, in the order found.
    let shown: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("  - "))
        .collect();
    // Tensors are met in a file's key order (sorted names: layer 0, 1, 10, 100, 1000, …),
    // parameters in the model's (layer 0, 1, 2, …).
    let mut unmapped: Vec<String> = (0..4_000)
        .map(|i| format!("tensor 'model.layers.{i}.mlp.upp_proj.weight' matches no parameter"))
        .collect();
    unmapped.sort();
    let missing = |i: u64| {
        format!(
            "parameter 'model.layers.{i}.mlp.gate_up_proj.weight' has nothing in the checkpoint to fill it (missing shard 1)"
        )
    };
    let expected: Vec<String> = unmapped
        .into_iter()
        .take(5)
        .chain((0..5).map(missing))
        .collect();
    assert_eq!(shown.len(), expected.len(), "{}", r.stderr);
    for (got, want) in shown.iter().zip(&expected) {
        assert!(
            got.contains(want.as_str()),
            "{got:?} should contain {want:?}"
        );
    }
    // Each kind's fix once, for all 4,000 of it.
    let fixes: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.trim_start().starts_with("fix"))
        .collect();
    assert_eq!(fixes.len(), 2, "{}", r.stderr);
    assert!(
        fixes
            .iter()
            .all(|l| l.starts_with("    fix (the 4,000 above): ")),
        "{fixes:?}"
    );
    // Then how many more of each kind, and the total.
    let more: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("  … and "))
        .collect();
    assert_eq!(
        more,
        [
            "  … and 3,995 more like this",
            "  … and 3,995 more like this"
        ],
        "{}",
        r.stderr
    );
    assert_eq!(
        lines.last().copied(),
        Some("8,000 problems in all, 10 shown above; pass --json for the complete list")
    );
}

#[test]
fn json_lists_every_problem_when_the_plan_is_refused() {
    let tmp = four_thousand_misnamed_layers();
    let out_parent = tempfile::TempDir::new().unwrap();
    let out = out_parent.path().join("out");
    for cmd in [
        vec!["plan", s(tmp.path()), "--tp", "2", "--json"],
        vec!["load", s(tmp.path()), "--tp", "2", "--dry-run", "--json"],
        vec!["shard", s(tmp.path()), "--tp", "2", "-o", s(&out), "--json"],
    ] {
        let r = run(&cmd);
        assert_eq!(
            r.code,
            Some(3),
            "{cmd:?}: {}",
            &r.stderr[..2000.min(r.stderr.len())]
        );
        assert!(
            r.stderr.starts_with("error: 8,000 problems found"),
            "{cmd:?}"
        );
        assert!(
            r.stderr.lines().count() < 300,
            "{cmd:?}: the terminal still gets a summary"
        );
        let doc: Value = serde_json::from_str(&r.stdout)
            .unwrap_or_else(|e| panic!("{cmd:?}: stdout is not one JSON document: {e}"));
        assert_schema(&cmd, &doc);
        assert_eq!(doc["schema_version"], 1, "{cmd:?}");
        assert_eq!(doc["exit_status"], 3, "{cmd:?}");
        assert_eq!(doc["problem_count"], 8_000, "{cmd:?}");
        let problems = doc["problems"].as_array().expect("problems");
        assert_eq!(problems.len(), 8_000, "{cmd:?}");
        // Every layer's two problems, each with its fix.
        let mut unmapped = vec![false; 4_000];
        let mut missing = vec![false; 4_000];
        for p in problems {
            let m = p["message"].as_str().expect("message");
            assert!(p["fix"].as_str().is_some_and(|f| !f.is_empty()), "{p}");
            let layer = |prefix: &str| -> Option<usize> {
                let rest = &m[m.find(prefix)? + prefix.len()..];
                rest[..rest.find('.')?].parse().ok()
            };
            if m.contains("matches no parameter") {
                unmapped[layer("'model.layers.").expect("layer")] = true;
            } else if m.contains("has nothing in the checkpoint") {
                missing[layer("'model.layers.").expect("layer")] = true;
            } else {
                panic!("{cmd:?}: unexpected problem {m}");
            }
        }
        assert!(
            unmapped.iter().all(|&x| x),
            "{cmd:?}: every misnamed tensor is listed"
        );
        assert!(
            missing.iter().all(|&x| x),
            "{cmd:?}: every unfilled parameter is listed"
        );
    }
    assert!(!out.exists(), "a refused shard writes nothing");
}

#[test]
fn a_few_problems_are_printed_whole_in_the_order_found() {
    // Under the per-kind limit nothing is grouped or counted: the list reads as before.
    let tmp = tempfile::TempDir::new().unwrap();
    many_layers_checkpoint(tmp.path(), 3, |n| n.replace(".up_proj.", ".upp_proj."));
    let r = plan(tmp.path(), &["--tp", "2"]);
    r.refused(3);
    assert_eq!(r.problem_count(), 6, "{}", r.context());
    let shown: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("  - ")).collect();
    assert_eq!(shown.len(), 6, "{}", r.context());
    // Tensors are checked before parameters: the three unmapped names, then the three gaps.
    for (i, l) in shown.iter().enumerate() {
        let want = if i < 3 {
            "matches no parameter"
        } else {
            "has nothing in the checkpoint"
        };
        assert!(l.contains(want), "line {i}: {l}");
    }
    assert!(!r.stderr.contains("… and"), "{}", r.context());
    assert!(!r.stderr.contains("in all"), "{}", r.context());
}

#[test]
fn a_config_claiming_a_billion_layers_is_refused_before_anything_is_built() {
    // Building a billion layers' parameters would exhaust memory and abort.
    let fixture = fixtures_dir().join("llama_gqa");
    let r = plan(
        &fixture,
        &[
            "--tp",
            "2",
            "--hf-overrides",
            r#"{"num_hidden_layers": 1000000000}"#,
        ],
    );
    r.refused(3)
        .one_line_says(&["1000000000 layers", "num_hidden_layers", "at most 4096"])
        .fix_for("1000000000 layers", "--hf-overrides");
    assert_eq!(r.problem_count(), 1, "{}", r.context());
}

/// A wrong --tp refuses every layer's scale for one reason: the fix is printed once, after them,
/// while --json keeps it on every problem.
#[test]
fn a_fix_shared_by_many_problems_is_printed_once() {
    let fixture = fixtures_dir().join("llama_gqa_fp8_block");
    let r = plan(&fixture, &["--tp", "4"]);
    r.refused(3);
    let fixes: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.trim_start().starts_with("fix"))
        .collect();
    assert_eq!(
        fixes,
        ["    fix (the 6 above): choose another --tp (now 4); TP sizes that work: 1, 2"],
        "{}",
        r.context()
    );
    assert_eq!(fixes_cover(&r.stderr), r.problem_count());
    let json = plan(&fixture, &["--tp", "4", "--json"]);
    let doc: Value = serde_json::from_str(&json.stdout).expect("one JSON document");
    assert_schema(&["plan"], &doc);
    let problems = doc["problems"].as_array().expect("problems");
    assert_eq!(problems.len(), 6);
    assert!(
        problems
            .iter()
            .all(|p| p["fix"] == "choose another --tp (now 4); TP sizes that work: 1, 2"),
        "{doc}"
    );
}

/// A mapping expression naming a variable nothing defines: a typo is called one, with the name
/// meant and the mapping file to correct, not "add the field to config.json".
#[test]
fn a_typo_in_a_mapping_expression_points_at_the_mapping_file() {
    let tmp = tempfile::TempDir::new().unwrap();
    let llama = std::fs::read_to_string(manifest_dir().join("mappings/llama.yaml")).unwrap();
    let typo = tmp.path().join("typo.yaml");
    let check = "rule: num_attention_heads % tp == 0";
    assert!(llama.contains(check));
    std::fs::write(
        &typo,
        llama.replace(check, "rule: num_attention_head % tp == 0"),
    )
    .unwrap();
    let r = plan(
        &fixtures_dir().join("llama_gqa"),
        &["--tp", "2", "--mapping", s(&typo)],
    );
    r.refused(3)
        .one_line_says(&["cannot check `num_attention_head % tp == 0`"])
        .fix_for(
            "cannot check",
            "'num_attention_head' is not a config field or a value the mapping defines; did you mean 'num_attention_heads'?",
        )
        .fix_for("cannot check", &format!("Correct it in {}", typo.display()));
    assert!(
        !r.stderr.contains("add the field to config.json"),
        "{}",
        r.context()
    );

    // In a parameter's shape, and with nothing close: both remedies, and the closest names.
    let shape = "inner: [hidden_size]";
    assert!(llama.contains(shape));
    std::fs::write(&typo, llama.replacen(shape, "inner: [model_width]", 1)).unwrap();
    let r = plan(
        &fixtures_dir().join("llama_gqa"),
        &["--tp", "2", "--mapping", s(&typo)],
    );
    r.refused(3).fix_for(
        "`model_width`",
        "'model_width' is an unknown variable: if the model needs that field, add it to config.json or pass it with --hf-overrides; if the name is wrong, correct it in",
    );
    r.fix_for("`model_width`", "(closest known: ");
}

/// A `--mapping` file of a few hundred bytes whose regex rules each double a name must not run
/// out of memory (2^20 times a name's length after twenty): the rules may add at most 4 KiB to a
/// name, and the refusal names the rule and the limit, as a fault of the flag's file (exit 2).
#[test]
fn a_mapping_whose_rules_double_names_is_refused_naming_the_rule() {
    let tmp = tempfile::TempDir::new().unwrap();
    let rules: String = (0..20)
        .map(|_| "    - {pattern: '^(.*)$', replace: '\\1\\1'}\n")
        .collect();
    let file = tmp.path().join("double.yaml");
    fs::write(
        &file,
        format!("extends: llama\nfamily: bomb\narchitectures: [LlamaForCausalLM]\nrules:\n  regex:\n{rules}"),
    )
    .unwrap();
    let t = std::time::Instant::now();
    let r = plan(
        &fixtures_dir().join("llama_gqa"),
        &["--tp", "1", "--mapping", s(&file)],
    );
    r.refused(2).one_line_says(&[
        "regex `^(.*)$`",
        "longer than",
        "the most the rules may add",
    ]);
    assert!(t.elapsed().as_secs() < 20, "took {:?}", t.elapsed());
}

/// Whatever a mapping can multiply is bounded where it is written: a parameter list of more than
/// 1024 entries, more than 256 regex rules.
#[test]
fn a_mapping_that_multiplies_work_is_refused_naming_the_limit() {
    let tmp = tempfile::TempDir::new().unwrap();
    let params: String = (0..1100)
        .map(|k| format!("    - {{name: 'model.layers.{{i}}.p{k}', layout: {{kind: replicated, shape: [1]}}}}\n"))
        .collect();
    let regexes: String = (0..300)
        .map(|k| format!("    - {{pattern: 'x{k}$', replace: y}}\n"))
        .collect();
    let head = "extends: llama\nfamily: big\narchitectures: [LlamaForCausalLM]\n";
    for (body, needles) in [
        (
            format!("parameters:\n  layer:\n{params}"),
            &["parameters.layer", "more than 1024 parameters"][..],
        ),
        (
            format!("rules:\n  regex:\n{regexes}"),
            &["300 regex and expert rules", "at most 256"][..],
        ),
    ] {
        let file = tmp.path().join("big.yaml");
        fs::write(&file, format!("{head}{body}")).unwrap();
        let r = plan(
            &fixtures_dir().join("llama_gqa"),
            &["--tp", "1", "--mapping", s(&file)],
        );
        r.refused(2).one_line_says(needles);
    }
}

/// A config.json, params.json or index past the 64 MiB small-file limit is the checkpoint's
/// fault (exit 3, as a malformed one), named with the limit; not an I/O failure (exit 1).
#[test]
fn small_files_past_the_limit_are_the_checkpoints_fault() {
    for file in ["config.json", "model.safetensors.index.json"] {
        let dir = copy_fixture("llama_gqa");
        let path = dir.path().join(file);
        // Sparse: 65 MiB that cost nothing to write.
        fs::File::create(&path).unwrap().set_len(65 << 20).unwrap();
        let r = plan(dir.path(), &["--tp", "1"]);
        r.refused(3).one_line_says(&[file, "larger than 64 MiB"]);
    }
}

/// A header listing more tensors than any real file (here 262,145 one-byte tensors, a 14 MB
/// header) is refused naming the file and the limit, before wload builds anything per tensor.
#[test]
fn a_file_with_too_many_tensors_is_refused_naming_the_file_and_the_limit() {
    let dir = copy_fixture("llama_gqa");
    let n = (1usize << 18) + 1;
    let mut header = String::from("{");
    for i in 0..n {
        header.push_str(&format!(
            r#""extra.{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{}]}},"#,
            i + 1
        ));
    }
    header.pop();
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    write_raw(
        &dir.path().join("extra.safetensors"),
        &assemble(header.as_bytes(), &vec![0; n]),
    );
    // Without an index every *.safetensors file is read.
    fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    let r = plan(dir.path(), &["--tp", "1"]);
    r.refused(3)
        .one_line_says(&["extra.safetensors", "262145 tensors", "262144"]);
}

/// Config values whose products leave the 64-bit range (heads × head_dim, vocabulary rows ×
/// hidden size × bytes) are refused naming the values, never wrapped or panicked on.
#[test]
fn configs_whose_sizes_overflow_64_bits_are_refused_not_wrapped() {
    let fixture = fixtures_dir().join("llama_gqa");
    for overrides in [
        r#"{"num_attention_heads": 4294967296, "num_key_value_heads": 4294967296, "head_dim": 4294967296}"#,
        r#"{"vocab_size": 18446744073709551615}"#,
        r#"{"hidden_size": 9223372036854775807, "intermediate_size": 9223372036854775807}"#,
    ] {
        let r = plan(&fixture, &["--tp", "1", "--hf-overrides", overrides]);
        r.refused(3);
        assert!(!r.stderr.contains("panicked"), "{}", r.context());
    }
}
