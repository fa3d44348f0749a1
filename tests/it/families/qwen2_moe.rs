//! Qwen2-MoE (`Qwen2MoeForCausalLM`, mappings/qwen2_moe.yaml) beyond the golden TP2 case, which
//! runs with the other golden cases: expert parallelism and pipeline stages checked against
//! vLLM's own TP2 output of the same fixture, dense layers and a model without a shared expert,
//! block FP8, and the sizes vLLM refuses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::*;

/// (name, dtype, shape, data bytes) of every tensor, in file and header order.
type Tensors = Vec<(String, String, Vec<u64>, Vec<u8>)>;

fn read_tensors(files: &[PathBuf]) -> Tensors {
    assert!(!files.is_empty(), "no safetensors files to read");
    let mut out = Tensors::new();
    for f in files {
        let raw = RawFile::read(f);
        for t in header_tensors(f) {
            let data = raw.data[t.start as usize..t.end as usize].to_vec();
            out.push((t.name, t.dtype, t.shape, data));
        }
    }
    out
}

/// TP rank `r` of a TP-only output folder.
fn rank(dir: &Path, r: u64) -> Tensors {
    read_tensors(&files_with_prefix(dir, &format!("model-rank-{r}-part-")))
}

/// Data bytes by name of every tensor of a checkpoint folder.
fn source_bytes(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    checkpoint_tensors(dir)
        .into_iter()
        .map(|(n, t)| (n, t.data))
        .collect()
}

fn names(t: &Tensors) -> Vec<&str> {
    t.iter().map(|(n, ..)| n.as_str()).collect()
}

/// The layer a key belongs to, if any.
fn layer_of(name: &str) -> Option<u64> {
    name.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Rows `[from, to)` of a row-major matrix with rows of `row` bytes.
fn rows(data: &[u8], row: usize, from: usize, to: usize) -> &[u8] {
    &data[from * row..to * row]
}

/// Columns `[from, to)` (in elements of `elem` bytes) of every row of a matrix `cols` wide.
fn cols(data: &[u8], elem: usize, width: usize, from: usize, to: usize) -> Vec<u8> {
    data.chunks(width * elem)
        .flat_map(|r| r[from * elem..to * elem].iter().copied())
        .collect()
}

// --- Expert parallel and pipeline stages on the golden fixture -------------------------------

/// With `--enable-expert-parallel` each rank holds whole routed experts, placed linearly (rank r:
/// experts 4r..4r+3 of 8); everything else, the shared expert included, stays tensor-parallel and
/// is byte-identical to vLLM's TP2 output, in the same order.
#[test]
fn expert_parallel_places_whole_routed_experts_and_keeps_the_shared_expert_sliced() {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("ep");
    let fixture = fixture("qwen2_moe");
    shard_ok(&fixture, 2, &out, &["--enable-expert-parallel", "-q"]);
    let src = source_bytes(&fixture);
    let (experts, inter, hidden, bf16) = (8usize, 64usize, 128usize, 2usize);
    let local = experts / 2;
    for r in 0..2u64 {
        let got = rank(&out, r);
        let want = rank(&expected("qwen2_moe", 2), r);
        assert_eq!(names(&got), names(&want), "rank {r}: keys or their order");
        let (mut routed, mut shared) = (0, 0);
        for (g, w) in got.iter().zip(&want) {
            let name = g.0.as_str();
            if !name.contains(".routed_experts.") {
                shared += usize::from(name.contains("._shared_experts._layer."));
                assert!(g == w, "rank {r}: '{name}' differs from vLLM's TP2 output");
                continue;
            }
            let layer = layer_of(name).unwrap();
            let first = r as usize * local;
            let expert = |e: usize, part: &str| {
                let key = format!("model.layers.{layer}.mlp.experts.{e}.{part}.weight");
                src.get(&key)
                    .unwrap_or_else(|| panic!("fixture lacks '{key}'"))
                    .clone()
            };
            let (shape, bytes): (Vec<u64>, Vec<u8>) = if name.ends_with(".w13_weight") {
                let bytes = (first..first + local)
                    .flat_map(|e| [expert(e, "gate_proj"), expert(e, "up_proj")].concat())
                    .collect();
                (vec![local as u64, 2 * inter as u64, hidden as u64], bytes)
            } else {
                let bytes = (first..first + local)
                    .flat_map(|e| expert(e, "down_proj"))
                    .collect();
                (vec![local as u64, hidden as u64, inter as u64], bytes)
            };
            assert_eq!(g.1, "BF16", "rank {r}: '{name}'");
            assert_eq!(g.2, shape, "rank {r}: '{name}' shape");
            assert_eq!(g.3.len(), shape.iter().product::<u64>() as usize * bf16);
            assert!(
                g.3 == bytes,
                "rank {r}: '{name}' is not experts {first}..{}",
                first + local
            );
            routed += 1;
        }
        assert_eq!(routed, 4, "rank {r}: w13 and w2 of both layers checked");
        assert_eq!(
            shared, 6,
            "rank {r}: the shared expert's three tensors of both layers"
        );
    }
}

/// `--pp 2`: both stages hold the embedding, the final norm and lm_head (qwen2_moe.py builds them
/// on every stage, as vLLM's qwen2_moe__pp2 output shows) and their own layer; every tensor and
/// the order are those of vLLM's TP2 output.
#[test]
fn pipeline_stages_each_hold_embedding_norm_and_lm_head() {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("pp");
    shard_ok(&fixture("qwen2_moe"), 2, &out, &["--pp", "2", "-q"]);
    for p in 0..2u64 {
        for t in 0..2u64 {
            let got = read_tensors(&files_with_prefix(
                &out,
                &format!("model-pp-{p}-tp-{t}-part-"),
            ));
            let want: Tensors = rank(&expected("qwen2_moe", 2), t)
                .into_iter()
                .filter(|(n, ..)| layer_of(n).is_none_or(|l| l == p))
                .collect();
            assert_eq!(names(&got), names(&want), "stage {p} tp {t}");
            assert!(
                got == want,
                "stage {p} tp {t}: tensors differ from vLLM's TP2 output"
            );
            for top in [
                "model.embed_tokens.weight",
                "model.norm.weight",
                "lm_head.weight",
            ] {
                assert!(names(&got).contains(&top), "stage {p} tp {t} lacks {top}");
            }
        }
    }
}

// --- Generated checkpoints --------------------------------------------------------------------

/// A tiny Qwen2-MoE config (3 layers, 4 experts, hidden 32) with `over` merged in.
fn config(over: Value) -> Value {
    let mut c = json!({
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 24,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 64,
        "num_hidden_layers": 3,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false,
        "dtype": "bfloat16"
    });
    for (k, v) in over.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn int(c: &Value, k: &str) -> u64 {
    c[k].as_u64().unwrap_or_else(|| panic!("config lacks {k}"))
}

/// The tensors Hugging Face saves for config `c` (its MoE layers as transformers picks them), as
/// (name, shape, quantizable linear weight).
fn hf_tensors(c: &Value) -> Vec<(String, Vec<u64>, bool)> {
    let [h, nh, kv, i, mi, s, e, v, l] = [
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "num_experts",
        "vocab_size",
        "num_hidden_layers",
    ]
    .map(|k| int(c, k));
    let hd = h / nh;
    let dense: Vec<u64> = c["mlp_only_layers"]
        .as_array()
        .map(|a| a.iter().map(|x| x.as_u64().unwrap()).collect())
        .unwrap_or_default();
    let step = c["decoder_sparse_step"].as_u64().unwrap_or(1);
    let mut t = vec![("model.embed_tokens.weight".to_string(), vec![v, h], false)];
    for layer in 0..l {
        let p = format!("model.layers.{layer}.");
        let mut add = |n: &str, shape: Vec<u64>, q: bool| t.push((format!("{p}{n}"), shape, q));
        for (x, rows) in [("q", nh * hd), ("k", kv * hd), ("v", kv * hd)] {
            add(&format!("self_attn.{x}_proj.weight"), vec![rows, h], true);
            add(&format!("self_attn.{x}_proj.bias"), vec![rows], false);
        }
        add("self_attn.o_proj.weight", vec![h, nh * hd], true);
        if !dense.contains(&layer) && e > 0 && (layer + 1) % step == 0 {
            add("mlp.gate.weight", vec![e, h], false);
            for x in 0..e {
                add(
                    &format!("mlp.experts.{x}.gate_proj.weight"),
                    vec![mi, h],
                    true,
                );
                add(
                    &format!("mlp.experts.{x}.up_proj.weight"),
                    vec![mi, h],
                    true,
                );
                add(
                    &format!("mlp.experts.{x}.down_proj.weight"),
                    vec![h, mi],
                    true,
                );
            }
            if s > 0 {
                add("mlp.shared_expert.gate_proj.weight", vec![s, h], true);
                add("mlp.shared_expert.up_proj.weight", vec![s, h], true);
                add("mlp.shared_expert.down_proj.weight", vec![h, s], true);
            }
            add("mlp.shared_expert_gate.weight", vec![1, h], false);
        } else {
            add("mlp.gate_proj.weight", vec![i, h], true);
            add("mlp.up_proj.weight", vec![i, h], true);
            add("mlp.down_proj.weight", vec![h, i], true);
        }
        add("input_layernorm.weight", vec![h], false);
        add("post_attention_layernorm.weight", vec![h], false);
    }
    t.push(("model.norm.weight".into(), vec![h], false));
    t.push(("lm_head.weight".into(), vec![v, h], false));
    t
}

/// A checkpoint folder for config `c` with the tensors `hf_tensors` lists (minus `drop`), BF16,
/// or with `fp8_block` set F8_E4M3 linear weights each followed by its block `weight_scale_inv`
/// (and the matching `quantization_config`). Every tensor's bytes differ from every other's.
fn checkpoint(c: &Value, drop: &[&str], fp8_block: Option<u64>) -> TempDir {
    let tmp = TempDir::new().unwrap();
    let mut c = c.clone();
    let mut specs: Vec<(String, &str, Vec<u64>)> = Vec::new();
    for (name, shape, linear) in hf_tensors(&c) {
        if drop.contains(&name.as_str()) {
            continue;
        }
        match fp8_block {
            Some(b) if linear => {
                let scale = vec![shape[0].div_ceil(b), shape[1].div_ceil(b)];
                let scale_name = format!("{name}_scale_inv");
                specs.push((name, "F8_E4M3", shape));
                specs.push((scale_name, "F32", scale));
            }
            _ => specs.push((name, "BF16", shape)),
        }
    }
    if let Some(b) = fp8_block {
        c["quantization_config"] = json!({
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [b, b]
        });
    }
    let data: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(k, (_, dtype, shape))| {
            let width = match *dtype {
                "F8_E4M3" => 1,
                "F32" => 4,
                _ => 2,
            };
            (0..width * shape.iter().product::<u64>() as usize)
                .map(|b| (b * 7 + k * 31 + b / 251) as u8)
                .collect()
        })
        .collect();
    let tensors: Vec<Tensor> = specs
        .iter()
        .zip(&data)
        .map(|((n, d, sh), bytes)| (n.as_str(), *d, sh.as_slice(), bytes.as_slice()))
        .collect();
    write_safetensors(&tmp.path().join("model.safetensors"), &tensors);
    write_json(&tmp.path().join("config.json"), &c);
    tmp
}

/// (name, dtype, shape) of rank `r`'s tensors whose names contain `.mlp.`, from `plan --json`.
fn planned_mlp(dir: &Path, tp: &str, r: usize, extra: &[&str]) -> Vec<(String, String, Vec<u64>)> {
    let mut args = vec!["plan", s(dir), "--tp", tp, "--json"];
    args.extend_from_slice(extra);
    let plan = wload_json(&args);
    plan["ranks"][r]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(json_tensor)
        .filter(|(n, ..)| n.contains(".mlp."))
        .collect()
}

fn tensor(name: &str, dtype: &str, shape: &[u64]) -> (String, String, Vec<u64>) {
    (name.to_string(), dtype.to_string(), shape.to_vec())
}

/// `decoder_sparse_step: 2` makes only layer 1 sparse; the others keep a dense MLP of
/// intermediate_size. Without a shared expert, shared_expert_gate is still built and, registered
/// under that one path only, saved under its own name.
#[test]
fn sparse_step_dense_layers_and_no_shared_expert() {
    let c = config(json!({"decoder_sparse_step": 2, "shared_expert_intermediate_size": 0}));
    let ckpt = checkpoint(&c, &[], None);
    let l = |i: u64, rest: &str| format!("model.layers.{i}.mlp.{rest}");
    let dense = |i| {
        [
            tensor(&l(i, "gate_up_proj.weight"), "BF16", &[48, 32]),
            tensor(&l(i, "down_proj.weight"), "BF16", &[32, 24]),
        ]
    };
    let mut want = dense(0).to_vec();
    want.extend([
        tensor(&l(1, "gate.weight"), "BF16", &[4, 32]),
        tensor(&l(1, "shared_expert_gate.weight"), "BF16", &[1, 32]),
        tensor(
            &l(1, "experts.routed_experts.w13_weight"),
            "BF16",
            &[4, 16, 32],
        ),
        tensor(
            &l(1, "experts.routed_experts.w2_weight"),
            "BF16",
            &[4, 32, 8],
        ),
    ]);
    want.extend(dense(2));
    assert_eq!(planned_mlp(ckpt.path(), "2", 1, &[]), want);

    // The bytes: rank 1's dense gate_up is [gate rows 24..48; up rows 24..48], and the gate whole.
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(ckpt.path(), 2, &out, &["-q"]);
    let src = source_bytes(ckpt.path());
    let got: BTreeMap<String, Vec<u8>> = rank(&out, 1)
        .into_iter()
        .map(|(n, _, _, d)| (n, d))
        .collect();
    let row = 32 * 2;
    let gate_up = [
        rows(&src[&l(2, "gate_proj.weight")], row, 24, 48),
        rows(&src[&l(2, "up_proj.weight")], row, 24, 48),
    ]
    .concat();
    assert!(got[&l(2, "gate_up_proj.weight")] == gate_up);
    assert!(got[&l(1, "shared_expert_gate.weight")] == src[&l(1, "shared_expert_gate.weight")]);
}

/// `mlp_only_layers: [0]` keeps layer 0 dense; the sparse layers' shared expert is sliced like a
/// dense MLP of shared_expert_intermediate_size and saved under the MoE runner's names, after the
/// router and the shared expert's gate.
#[test]
fn mlp_only_layers_and_the_shared_expert_slices() {
    let c = config(json!({"mlp_only_layers": [0]}));
    let ckpt = checkpoint(&c, &[], None);
    let l = |i: u64, rest: &str| format!("model.layers.{i}.mlp.{rest}");
    let shared = |i: u64, rest: &str| l(i, &format!("experts._shared_experts._layer.{rest}"));
    let mut want = vec![
        tensor(&l(0, "gate_up_proj.weight"), "BF16", &[48, 32]),
        tensor(&l(0, "down_proj.weight"), "BF16", &[32, 24]),
    ];
    for i in 1..3 {
        want.extend([
            tensor(&l(i, "gate.weight"), "BF16", &[4, 32]),
            tensor(&shared(i, "expert_gate.weight"), "BF16", &[1, 32]),
            tensor(&shared(i, "gate_up_proj.weight"), "BF16", &[24, 32]),
            tensor(&shared(i, "down_proj.weight"), "BF16", &[32, 12]),
            tensor(
                &l(i, "experts.routed_experts.w13_weight"),
                "BF16",
                &[4, 16, 32],
            ),
            tensor(
                &l(i, "experts.routed_experts.w2_weight"),
                "BF16",
                &[4, 32, 8],
            ),
        ]);
    }
    assert_eq!(planned_mlp(ckpt.path(), "2", 0, &[]), want);

    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(ckpt.path(), 2, &out, &["-q"]);
    let src = source_bytes(ckpt.path());
    let got: BTreeMap<String, Vec<u8>> = rank(&out, 1)
        .into_iter()
        .map(|(n, _, _, d)| (n, d))
        .collect();
    let se = |rest: &str| src[&l(2, &format!("shared_expert.{rest}"))].clone();
    let row = 32 * 2;
    let gate_up = [
        rows(&se("gate_proj.weight"), row, 12, 24),
        rows(&se("up_proj.weight"), row, 12, 24),
    ]
    .concat();
    assert!(got[&shared(2, "gate_up_proj.weight")] == gate_up);
    assert!(got[&shared(2, "down_proj.weight")] == cols(&se("down_proj.weight"), 2, 24, 12, 24));
    assert!(got[&shared(2, "expert_gate.weight")] == src[&l(2, "shared_expert_gate.weight")]);
    for gone in [
        "shared_expert.gate_up_proj",
        "shared_expert.down_proj",
        "shared_expert_gate",
    ] {
        assert!(
            !got.contains_key(&l(2, &format!("{gone}.weight"))),
            "'{gone}' is an alias vLLM does not save"
        );
    }
}

/// Block FP8: the router and shared_expert_gate are built without the quant config and stay in
/// the model dtype; the shared expert MLP is quantized, its block scales following each weight
/// under the same saved name; the routed experts bring theirs after w2.
#[test]
fn fp8_block_quantizes_the_shared_expert_but_not_the_gates() {
    let c = config(json!({
        "num_hidden_layers": 2, "mlp_only_layers": [0],
        "intermediate_size": 32, "shared_expert_intermediate_size": 32
    }));
    let ckpt = checkpoint(&c, &[], Some(8));
    let l = |rest: &str| format!("model.layers.1.mlp.{rest}");
    let shared = |rest: &str| l(&format!("experts._shared_experts._layer.{rest}"));
    let got: Vec<_> = planned_mlp(ckpt.path(), "2", 1, &[])
        .into_iter()
        .filter(|(n, ..)| n.starts_with("model.layers.1."))
        .collect();
    let want = vec![
        tensor(&l("gate.weight"), "BF16", &[4, 32]),
        tensor(&shared("expert_gate.weight"), "BF16", &[1, 32]),
        tensor(&shared("gate_up_proj.weight"), "F8_E4M3", &[32, 32]),
        tensor(&shared("gate_up_proj.weight_scale_inv"), "F32", &[4, 4]),
        tensor(&shared("down_proj.weight"), "F8_E4M3", &[32, 16]),
        tensor(&shared("down_proj.weight_scale_inv"), "F32", &[4, 2]),
        tensor(
            &l("experts.routed_experts.w13_weight"),
            "F8_E4M3",
            &[4, 16, 32],
        ),
        tensor(
            &l("experts.routed_experts.w2_weight"),
            "F8_E4M3",
            &[4, 32, 8],
        ),
        tensor(
            &l("experts.routed_experts.w13_weight_scale_inv"),
            "F32",
            &[4, 2, 4],
        ),
        tensor(
            &l("experts.routed_experts.w2_weight_scale_inv"),
            "F32",
            &[4, 4, 1],
        ),
    ];
    assert_eq!(got, want);
}

// --- What vLLM refuses --------------------------------------------------------------------------

fn plan_out(dir: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["plan", s(dir)];
    args.extend_from_slice(extra);
    run(&args)
}

#[test]
fn more_ranks_than_experts_is_refused() {
    let c = config(json!({"num_experts": 2, "num_key_value_heads": 4}));
    let ckpt = checkpoint(&c, &[], None);
    assert_refusal_text(
        &plan_out(ckpt.path(), &["--tp", "4"]),
        3,
        &[
            "Tensor parallel size 4 is greater than the number of experts 2",
            "choose a --tp of at most 2",
        ],
    );
}

/// moe_intermediate_size must divide by the TP size unless the experts are placed whole (EP);
/// the shared expert is tensor-parallel either way.
#[test]
fn expert_sizes_that_do_not_divide_are_refused_unless_expert_parallel() {
    let c = config(json!({"moe_intermediate_size": 6}));
    let ckpt = checkpoint(&c, &[], None);
    assert_refusal_text(
        &plan_out(ckpt.path(), &["--tp", "4"]),
        3,
        &[
            "moe_intermediate_size (6) is not divisible by tp (4)",
            "--enable-expert-parallel",
        ],
    );
    let ep = planned_mlp(ckpt.path(), "4", 3, &["--enable-expert-parallel"]);
    let w13 = ep
        .iter()
        .find(|(n, ..)| n == "model.layers.0.mlp.experts.routed_experts.w13_weight")
        .expect("rank 3 holds an expert");
    assert_eq!(w13.2, [1, 12, 32], "rank 3 holds expert 3 whole");

    let c = config(json!({"shared_expert_intermediate_size": 6}));
    let ckpt = checkpoint(&c, &[], None);
    let err = assert_refusal_text(
        &plan_out(ckpt.path(), &["--tp", "4", "--enable-expert-parallel"]),
        3,
        &["shared_expert_intermediate_size (6) is not divisible by tp (4)"],
    );
    assert!(
        err.contains("1 problem found"),
        "one problem, not one per layer: {err}"
    );
}

/// shared_expert_gate is required even without a shared expert (vLLM builds it and refuses a
/// checkpoint that leaves it unloaded); shared expert tensors for a model without one have no
/// module to go to.
#[test]
fn a_missing_gate_or_an_unexpected_shared_expert_is_refused() {
    let c = config(json!({}));
    let ckpt = checkpoint(&c, &["model.layers.1.mlp.shared_expert_gate.weight"], None);
    assert_refusal_text(
        &plan_out(ckpt.path(), &["--tp", "2"]),
        3,
        &["'model.layers.1.mlp.shared_expert_gate.weight' has nothing in the checkpoint"],
    );

    let ckpt = checkpoint(&c, &[], None);
    let mut cfg = c.clone();
    cfg["shared_expert_intermediate_size"] = json!(0);
    write_json(&ckpt.path().join("config.json"), &cfg);
    assert_refusal_text(
        &plan_out(ckpt.path(), &["--tp", "2"]),
        3,
        &[
            "'model.layers.0.mlp.shared_expert.gate_proj.weight'",
            "matches no parameter",
        ],
    );
}

/// Qwen2MoeMLP raises for any activation but silu, and a decoder_sparse_step of 0 makes vLLM's
/// layer choice divide by zero; both are named as such.
#[test]
fn unsupported_activation_and_zero_sparse_step_are_refused() {
    let ckpt = checkpoint(&config(json!({"hidden_act": "gelu"})), &[], None);
    assert_refusal_text(
        &plan_out(ckpt.path(), &["--tp", "2"]),
        3,
        &["Unsupported activation: gelu. Only silu is supported for now."],
    );

    let ckpt = checkpoint(&config(json!({})), &[], None);
    let mut cfg = config(json!({}));
    cfg["decoder_sparse_step"] = json!(0);
    write_json(&ckpt.path().join("config.json"), &cfg);
    assert_refusal_text(
        &plan_out(ckpt.path(), &["--tp", "2"]),
        3,
        &["decoder_sparse_step is 0", "ZeroDivisionError"],
    );
}

/// Qwen3-MoE releases have no shared expert, but vLLM builds one, as Qwen2-MoE's, when config.json
/// gives `shared_expert_intermediate_size` (qwen3_moe.py:177–205): its gate and MLP are kept under
/// the MoE runner's names, after the router, the MLP split as a dense one at every TP rank.
#[test]
fn qwen3_moe_with_a_shared_expert_holds_it_as_qwen2_moe_does() {
    let src = tiny_qwen3_moe();
    let file = src.path().join("model.safetensors");
    let shared = [
        ("shared_expert_gate.weight", vec![1u64, 16]),
        ("shared_expert.gate_proj.weight", vec![12, 16]),
        ("shared_expert.up_proj.weight", vec![12, 16]),
        ("shared_expert.down_proj.weight", vec![16, 12]),
    ];
    for (k, (name, shape)) in shared.iter().enumerate() {
        let n = 2 * shape.iter().product::<u64>() as usize;
        let data: Vec<u8> = (0..n).map(|b| (b * 13 + k * 71 + 5) as u8).collect();
        append_tensor(
            &file,
            &format!("model.layers.0.mlp.{name}"),
            "BF16",
            shape,
            &data,
        );
    }
    let config = src.path().join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    cfg["shared_expert_intermediate_size"] = json!(12);
    write_json(&config, &cfg);

    let plan = wload_json(&["plan", s(src.path()), "--tp", "2", "--json"]);
    let s_ = "model.layers.0.mlp.experts._shared_experts._layer";
    let names: Vec<&str> = plan["ranks"][0]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .filter(|n| n.starts_with("model.layers.0.mlp."))
        .collect();
    assert_eq!(
        names,
        [
            "model.layers.0.mlp.experts.gate.weight".to_string(),
            format!("{s_}.expert_gate.weight"),
            format!("{s_}.gate_up_proj.weight"),
            format!("{s_}.down_proj.weight"),
            "model.layers.0.mlp.experts.routed_experts.w13_weight".to_string(),
            "model.layers.0.mlp.experts.routed_experts.w2_weight".to_string(),
        ]
    );
    let out = TempDir::new().unwrap();
    shard_ok(src.path(), 2, out.path(), &["-q"]);
    let ck = checkpoint_tensors(src.path());
    let c = |n: &str| &ck[&format!("model.layers.0.mlp.{n}")];
    for r in 0..2u64 {
        let got = rank_tensors(out.path(), r);
        let g = |n: &str| &got[&format!("{s_}.{n}")].data;
        let (a, b) = (r as usize * 6, r as usize * 6 + 6);
        assert_eq!(
            g("expert_gate.weight"),
            &c("shared_expert_gate.weight").data,
            "rank {r}"
        );
        let gate_up = [
            c("shared_expert.gate_proj.weight").rows(a, b),
            c("shared_expert.up_proj.weight").rows(a, b),
        ]
        .concat();
        assert_eq!(g("gate_up_proj.weight"), &gate_up, "rank {r}");
        assert_eq!(
            g("down_proj.weight"),
            &c("shared_expert.down_proj.weight").cols(a, b),
            "rank {r}"
        );
    }
    // Not divisible by the TP size: refused with the fix, as vLLM's MergedColumnParallelLinear is.
    let out = run(&[
        "plan",
        s(src.path()),
        "--tp",
        "2",
        "--hf-overrides",
        r#"{"shared_expert_intermediate_size": 7}"#,
    ]);
    assert_refusal_text(
        &out,
        3,
        &["shared_expert_intermediate_size (7) is not divisible by tp (2)"],
    );
}

/// gpt-oss's MLP block asserts `intermediate_size % world_size == 0` over every rank, pipeline
/// stages included (gpt_oss.py:381–389): a TP × PP layout whose product does not divide it is
/// refused even though each TP rank's slice would be whole.
#[test]
fn gpt_oss_intermediate_size_must_divide_tp_times_pp() {
    let dir = copy_fixture("gpt_oss");
    let wide = r#"{"intermediate_size": 66}"#;
    let msg = "intermediate_size (66) is not divisible by the world size tp × pp (2 × 2)";
    let out = run(&[
        "plan",
        s(dir.path()),
        "--tp",
        "2",
        "--pp",
        "2",
        "--hf-overrides",
        wide,
    ]);
    assert_refusal_text(&out, 3, &[msg]);
    // One stage: each of the two ranks takes 33 rows, and vLLM asserts nothing more.
    let out = run(&["plan", s(dir.path()), "--tp", "2", "--hf-overrides", wide]);
    assert!(!stderr(&out).contains("world size"), "{}", context(&out));
    let out = run(&["plan", s(dir.path()), "--tp", "2", "--pp", "2"]);
    assert!(out.status.success(), "{}", context(&out));
}
