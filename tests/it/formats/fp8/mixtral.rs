//! Per-tensor FP8 Mixtral (AutoFP8): expert scales where vLLM's MoE loader puts them.

use super::*;

// ---------------------------------------------------------------------------------------------
// 4. Per-tensor FP8 Mixtral (AutoFP8): expert scales where vLLM's MoE loader puts them
// ---------------------------------------------------------------------------------------------

const MIXTRAL_EXPERTS: u64 = 4;

/// A distinct, exactly representable scale for layer `l`, module `m` (0..16), kind `k` (0 weight,
/// 1 input).
fn mixtral_scale(l: u64, m: u64, k: u64) -> f32 {
    (1 + l * 64 + m * 2 + k) as f32 / 256.0
}

/// Index of a quantized Mixtral module for [`mixtral_scale`]: q, k, v, o, then w1/w2/w3 of each
/// expert.
fn mixtral_module(name: &str) -> u64 {
    match name {
        "self_attn.q_proj" => 0,
        "self_attn.k_proj" => 1,
        "self_attn.v_proj" => 2,
        "self_attn.o_proj" => 3,
        _ => {
            let rest = name
                .strip_prefix("block_sparse_moe.experts.")
                .unwrap_or_else(|| panic!("not a quantized module: {name}"));
            let (e, w) = rest.split_once(".w").unwrap();
            4 + e.parse::<u64>().unwrap() * 3 + w.parse::<u64>().unwrap() - 1
        }
    }
}

/// The mixtral fixture as AutoFP8 would write it: q/k/v/o and every expert's w1/w2/w3 F8_E4M3
/// with scalar F32 `weight_scale` and static `input_scale`, routers and lm_head ignored, in one
/// file with the tensors in name order (as Python's safetensors writes same-dtype tensors) or,
/// with `reversed`, in reverse name order (vLLM reads a file's tensors sorted by name either way).
fn mixtral_fp8(dir: &Path, reversed: bool) {
    let mut config: Value =
        serde_json::from_slice(&fs::read(fixture("mixtral").join("config.json")).unwrap()).unwrap();
    config["quantization_config"] = json!({
        "quant_method": "fp8",
        "activation_scheme": "static",
        "ignored_layers": [
            "lm_head",
            "model.layers.0.block_sparse_moe.gate",
            "model.layers.1.block_sparse_moe.gate"
        ]
    });
    write_json(&dir.join("config.json"), &config);
    let mut tensors = Vec::new();
    for (name, t) in checkpoint_tensors(&fixture("mixtral")) {
        let quantized = name
            .strip_prefix("model.layers.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(l, r)| Some((l.parse::<u64>().ok()?, r.strip_suffix(".weight")?)))
            .filter(|(_, m)| {
                m.starts_with("self_attn.") || m.starts_with("block_sparse_moe.experts.")
            });
        let Some((l, module)) = quantized else {
            tensors.push((name, t));
            continue;
        };
        let m = mixtral_module(module);
        let prefix = name.strip_suffix(".weight").unwrap();
        tensors.push((
            format!("{prefix}.weight_scale"),
            f32_scalar(mixtral_scale(l, m, 0)),
        ));
        tensors.push((
            format!("{prefix}.input_scale"),
            f32_scalar(mixtral_scale(l, m, 1)),
        ));
        let fp8 = Held {
            dtype: "F8_E4M3".into(),
            shape: t.shape,
            data: low_bytes(&t.data),
        };
        tensors.push((name, fp8));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    if reversed {
        tensors.reverse();
    }
    write_held(
        &dir.join("model.safetensors"),
        tensors.iter().map(|(n, t)| (n, t)),
    );
}

/// What vLLM holds on one rank of the FP8 Mixtral: `bf16` is vLLM's rank of the bf16 fixture
/// (same TP/EP), `experts` the global experts this rank holds.
fn mixtral_fp8_rank(bf16: &Tensors, experts: &[u64]) -> Tensors {
    let mut want = Tensors::new();
    for (name, t) in bf16 {
        let fp8 = name.ends_with("proj.weight") || name.contains(".routed_experts.");
        let held = if fp8 {
            Held {
                dtype: "F8_E4M3".into(),
                shape: t.shape.clone(),
                data: low_bytes(&t.data),
            }
        } else {
            t.clone()
        };
        want.insert(name.clone(), held);
    }
    let n = experts.len() as u64;
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        let s = |m: u64, k: u64| mixtral_scale(l, m, k);
        for (proj, slots) in [("qkv_proj", vec![0, 1, 2]), ("o_proj", vec![3])] {
            let shape = [slots.len() as u64];
            let ws: Vec<f32> = slots.iter().map(|&m| s(m, 0)).collect();
            let is: Vec<f32> = slots.iter().map(|&m| s(m, 1)).collect();
            want.insert(
                format!("{p}.self_attn.{proj}.weight_scale"),
                f32_held(&shape, &ws),
            );
            want.insert(
                format!("{p}.self_attn.{proj}.input_scale"),
                f32_held(&shape, &is),
            );
        }
        for a in ["q_scale", "k_scale", "v_scale", "prob_scale"] {
            want.insert(format!("{p}.self_attn.attn.{a}"), bf16_scalar(0xbf80));
        }
        let w = |e: u64, k: u64| 4 + e * 3 + k - 1;
        let ex = format!("{p}.block_sparse_moe.experts.routed_experts");
        let w13: Vec<f32> = experts
            .iter()
            .flat_map(|&e| [s(w(e, 1), 0), s(w(e, 3), 0)])
            .collect();
        want.insert(format!("{ex}.w13_weight_scale"), f32_held(&[n, 2], &w13));
        let per_expert =
            |k: u64, kind: u64| -> Vec<f32> { experts.iter().map(|&e| s(w(e, k), kind)).collect() };
        want.insert(
            format!("{ex}.w2_weight_scale"),
            f32_held(&[n], &per_expert(2, 0)),
        );
        // w1 and w3 share one input-scale slot per expert; w3 is read last.
        want.insert(
            format!("{ex}.w13_input_scale"),
            f32_held(&[n], &per_expert(3, 1)),
        );
        want.insert(
            format!("{ex}.w2_input_scale"),
            f32_held(&[n], &per_expert(2, 1)),
        );
    }
    want
}

/// Every key one rank of the FP8 Mixtral holds (vLLM 0.33, spec §9).
fn mixtral_fp8_keys() -> BTreeSet<String> {
    const LAYER: [&str; 23] = [
        "block_sparse_moe.experts.routed_experts.w13_input_scale",
        "block_sparse_moe.experts.routed_experts.w13_weight",
        "block_sparse_moe.experts.routed_experts.w13_weight_scale",
        "block_sparse_moe.experts.routed_experts.w2_input_scale",
        "block_sparse_moe.experts.routed_experts.w2_weight",
        "block_sparse_moe.experts.routed_experts.w2_weight_scale",
        "block_sparse_moe.gate.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.attn._k_scale",
        "self_attn.attn._prob_scale",
        "self_attn.attn._q_scale",
        "self_attn.attn._v_scale",
        "self_attn.attn.k_scale",
        "self_attn.attn.prob_scale",
        "self_attn.attn.q_scale",
        "self_attn.attn.v_scale",
        "self_attn.o_proj.input_scale",
        "self_attn.o_proj.weight",
        "self_attn.o_proj.weight_scale",
        "self_attn.qkv_proj.input_scale",
        "self_attn.qkv_proj.weight",
        "self_attn.qkv_proj.weight_scale",
    ];
    let mut keys: BTreeSet<String> = [
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
    ]
    .map(String::from)
    .into();
    for l in 0..2 {
        keys.extend(LAYER.map(|k| format!("model.layers.{l}.{k}")));
    }
    keys
}

/// The w13 input-scale key of layer `l`: one slot per expert that w1 and w3 both write.
fn w13_input_scale(l: u64) -> String {
    format!("model.layers.{l}.block_sparse_moe.experts.routed_experts.w13_input_scale")
}

/// Shards the FP8 Mixtral at TP 2 with `extra` flags and compares both ranks with
/// [`mixtral_fp8_rank`] of vLLM's bf16 case `bf16_case`; `experts` per rank. The w13 input
/// scales are only checked for dtype and shape here: which of w1/w3 lands in them is
/// [`mixtral_w13_input_scale_is_w3s_whatever_the_data_order_and_timing`]'s subject.
fn mixtral_fp8_matches(extra: &[&str], bf16_case: &str, experts: [&[u64]; 2]) {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    mixtral_fp8(&src, false);
    let out = tmp.path().join("out");
    let mut flags = vec!["-q"];
    flags.extend_from_slice(extra);
    shard_ok(&src, 2, &out, &flags);
    for r in 0..2u64 {
        let got = rank_tensors(&out, r);
        let keys: BTreeSet<String> = got.keys().cloned().collect();
        assert_eq!(keys, mixtral_fp8_keys(), "{bf16_case} rank {r}: keys");
        let mine = experts[r as usize];
        let want = mixtral_fp8_rank(&rank_tensors(&expected(bf16_case, 2), r), mine);
        for (name, w) in &want {
            let g = &got[name];
            if name.ends_with(".w13_input_scale") {
                assert_eq!(
                    (&g.dtype, &g.shape),
                    (&w.dtype, &w.shape),
                    "{bf16_case} rank {r}: {name}"
                );
            } else {
                assert!(
                    g == w,
                    "{bf16_case} rank {r}: {name}: got {g:?}, want {w:?}"
                );
            }
        }
        // vLLM's Mixtral router is built without a quant config: BF16 whatever the config says.
        let router = &got["model.layers.0.block_sparse_moe.gate.weight"];
        assert_eq!(
            (router.dtype.as_str(), router.shape.as_slice()),
            ("BF16", &[MIXTRAL_EXPERTS, 128][..])
        );
    }
}

/// TP 2: every rank holds all four experts, each sliced; the expert scales are per expert, not
/// sliced, identical on both ranks.
#[test]
fn per_tensor_fp8_mixtral_expert_scales_at_tp2() {
    mixtral_fp8_matches(&[], "mixtral", [&[0, 1, 2, 3], &[0, 1, 2, 3]]);
}

/// EP 2: rank 0 holds experts 0 and 1 whole, rank 1 experts 2 and 3, with their scales.
#[test]
fn per_tensor_fp8_mixtral_expert_scales_with_expert_parallel() {
    mixtral_fp8_matches(
        &["--enable-expert-parallel"],
        "mixtral__ep",
        [&[0, 1], &[2, 3]],
    );
}

/// vLLM reads a file's tensors in name order (`safe_open(...).keys()` is sorted), so of the two
/// input scales w1 and w3 write into one `w13_input_scale` slot, w3's stays. It must, on every
/// run, and whatever order the file stores the data in.
#[test]
fn mixtral_w13_input_scale_is_w3s_whatever_the_data_order_and_timing() {
    const RUNS: usize = 20;
    let tmp = TempDir::new().unwrap();
    let mut wrong = Vec::new();
    for reversed in [false, true] {
        let src = tmp.path().join(format!("src-{reversed}"));
        fs::create_dir(&src).unwrap();
        mixtral_fp8(&src, reversed);
        for run in 0..RUNS {
            let out = tmp.path().join(format!("out-{reversed}-{run}"));
            shard_ok(&src, 2, &out, &["-q"]);
            for l in 0..2 {
                let w3: Vec<f32> = (0..MIXTRAL_EXPERTS)
                    .map(|e| mixtral_scale(l, 4 + e * 3 + 2, 1))
                    .collect();
                let got = values(&rank_tensors(&out, 0)[&w13_input_scale(l)]);
                if got != w3 {
                    wrong.push(format!(
                        "data in reverse name order: {reversed}, run {run}, layer {l}: {got:?}, want w3's {w3:?}"
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} results wrong:\n{}",
        wrong.len(),
        2 * 2 * RUNS,
        wrong.join("\n")
    );
}
