//! gpt-oss (bf16): the golden TP2 case (real vLLM output) runs with the other golden cases; here
//! what has no golden output is checked from vLLM's loader rules (gpt_oss.py
//! `_load_weights_other`) against the fixture's own tensors: expert parallelism, TP1 against
//! TP2, pipeline stages, and the refusals.

use std::collections::BTreeSet;
use std::fs;

use tempfile::TempDir;

use crate::support::*;

const CASE: &str = "gpt_oss";
/// The fixture's experts, hidden size and intermediate size.
const E: usize = 4;
const H: usize = 128;
const I: usize = 64;

/// Every tensor of the fixture's checkpoint files.
fn checkpoint() -> Tensors {
    checkpoint_tensors(&fixture(CASE))
}

/// BF16 element `i` of a tensor's bytes.
fn el(data: &[u8], i: usize) -> [u8; 2] {
    [data[2 * i], data[2 * i + 1]]
}

fn data<'a>(t: &'a Tensors, name: &str) -> &'a [u8] {
    &t.get(name)
        .unwrap_or_else(|| panic!("'{name}' missing"))
        .data
}

fn shape(t: &Tensors, name: &str) -> Vec<u64> {
    t[name].shape.clone()
}

/// Checkpoint tensor `k` of layer `l`, and the rank tensor `k` of layer `l`.
fn ck(l: usize, k: &str) -> String {
    format!("model.layers.{l}.mlp.experts.{k}")
}

fn out(l: usize, k: &str) -> String {
    format!("model.layers.{l}.mlp.experts.routed_experts.{k}")
}

/// With `--enable-expert-parallel` at TP2 rank r holds experts [2r, 2r + 2) whole: w13 is
/// `gate_up_proj[e]` transposed (interleaving kept), w2 `down_proj[e]` transposed, both biases
/// the experts' rows on every rank (non-zero on rank 1 too); everything else is the TP2 output.
#[test]
fn expert_parallel_takes_whole_experts_and_their_biases() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("ep");
    shard_ok(&fixture(CASE), 2, &dir, &["--enable-expert-parallel", "-q"]);
    let src = checkpoint();
    let local = E / 2;
    for r in 0..2 {
        let got = rank_tensors(&dir, r as u64);
        let tp = rank_tensors(&expected(CASE, 2), r as u64);
        let got_keys: BTreeSet<&String> = got.keys().collect();
        let tp_keys: BTreeSet<&String> = tp.keys().collect();
        assert_eq!(got_keys, tp_keys, "rank {r}: the same keys as TP2");
        for (name, t) in &got {
            if !name.contains(".routed_experts.") {
                assert!(
                    t == &tp[name],
                    "rank {r}: '{name}' differs from the TP2 output"
                );
            }
        }
        for l in 0..2 {
            let (gu, dp) = (
                data(&src, &ck(l, "gate_up_proj")),
                data(&src, &ck(l, "down_proj")),
            );
            let w13 = data(&got, &out(l, "w13_weight"));
            let w2 = data(&got, &out(l, "w2_weight"));
            assert_eq!(
                shape(&got, &out(l, "w13_weight")),
                [2, 2 * I as u64, H as u64]
            );
            assert_eq!(shape(&got, &out(l, "w2_weight")), [2, H as u64, I as u64]);
            for j in 0..local {
                let e = r * local + j;
                for c in 0..2 * I {
                    for h in 0..H {
                        let want = el(gu, (e * H + h) * 2 * I + c);
                        let at = (j * 2 * I + c) * H + h;
                        assert_eq!(el(w13, at), want, "rank {r} layer {l} w13[{j}][{c}][{h}]");
                    }
                }
                for h in 0..H {
                    for i in 0..I {
                        let want = el(dp, (e * I + i) * H + h);
                        let at = (j * H + h) * I + i;
                        assert_eq!(el(w2, at), want, "rank {r} layer {l} w2[{j}][{h}][{i}]");
                    }
                }
            }
            for (bias, ckpt, row) in [
                ("w13_bias", "gate_up_proj_bias", 2 * I),
                ("w2_bias", "down_proj_bias", H),
            ] {
                let want =
                    &data(&src, &ck(l, ckpt))[2 * row * r * local..2 * row * (r + 1) * local];
                assert_eq!(data(&got, &out(l, bias)), want, "rank {r} layer {l} {bias}");
                assert!(
                    want.iter().any(|&b| b != 0),
                    "the fixture's {ckpt} is not zero"
                );
            }
        }
    }
}

/// TP1 holds every expert whole; TP2 rank r holds rows [2·I_r·r, …) of TP1's w13 (the
/// interleaved gate/up columns it took), columns [I_r·r, …) of its w2 and of its w13 bias, and
/// the down bias on rank 0 alone (zeros on rank 1). The TP2 side is vLLM's own output.
#[test]
fn tp1_and_tp2_agree() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("tp1");
    shard_ok(&fixture(CASE), 1, &dir, &["-q"]);
    let one = rank_tensors(&dir, 0);
    let src = checkpoint();
    let ir = I / 2;
    for l in 0..2 {
        // TP1 is the plain transpose of the checkpoint.
        let (gu, w13) = (
            data(&src, &ck(l, "gate_up_proj")),
            data(&one, &out(l, "w13_weight")),
        );
        for e in 0..E {
            for c in 0..2 * I {
                for h in 0..H {
                    assert_eq!(
                        el(w13, (e * 2 * I + c) * H + h),
                        el(gu, (e * H + h) * 2 * I + c)
                    );
                }
            }
        }
        assert_eq!(
            data(&one, &out(l, "w2_bias")),
            data(&src, &ck(l, "down_proj_bias"))
        );
        for r in 0..2 {
            let two = rank_tensors(&expected(CASE, 2), r as u64);
            let (w13_1, w13_2) = (
                data(&one, &out(l, "w13_weight")),
                data(&two, &out(l, "w13_weight")),
            );
            let (w2_1, w2_2) = (
                data(&one, &out(l, "w2_weight")),
                data(&two, &out(l, "w2_weight")),
            );
            let (b13_1, b13_2) = (
                data(&one, &out(l, "w13_bias")),
                data(&two, &out(l, "w13_bias")),
            );
            for e in 0..E {
                for c in 0..2 * ir {
                    for h in 0..H {
                        let want = el(w13_1, (e * 2 * I + 2 * ir * r + c) * H + h);
                        assert_eq!(el(w13_2, (e * 2 * ir + c) * H + h), want, "w13 r{r}");
                    }
                    let want = el(b13_1, e * 2 * I + 2 * ir * r + c);
                    assert_eq!(el(b13_2, e * 2 * ir + c), want, "w13_bias r{r}");
                }
                for h in 0..H {
                    for i in 0..ir {
                        let want = el(w2_1, (e * H + h) * I + ir * r + i);
                        assert_eq!(el(w2_2, (e * H + h) * ir + i), want, "w2 r{r}");
                    }
                }
            }
            let b2 = data(&two, &out(l, "w2_bias"));
            if r == 0 {
                assert_eq!(b2, data(&one, &out(l, "w2_bias")));
            } else {
                assert!(b2.iter().all(|&b| b == 0), "w2_bias is zeros on rank 1");
            }
            let sinks = format!("model.layers.{l}.attn.sinks");
            let (s1, s2) = (data(&one, &sinks), data(&two, &sinks));
            assert_eq!(s2, &s1[8 * r..8 * (r + 1)], "sinks: rank {r}'s 4 heads");
        }
    }
}

/// gpt_oss.py builds the embedding, the final norm and lm_head unconditionally (no
/// PPMissingLayer): every stage holds them, each tensor as in the TP-only output.
#[test]
fn every_pipeline_stage_holds_embedding_norm_and_lm_head() {
    let tmp = TempDir::new().unwrap();
    let (pp, tp) = (tmp.path().join("pp"), tmp.path().join("tp"));
    shard_ok(&fixture(CASE), 1, &pp, &["--pp", "2", "-q"]);
    shard_ok(&fixture(CASE), 1, &tp, &["-q"]);
    let whole = rank_tensors(&tp, 0);
    let head_tail = BTreeSet::from([
        "lm_head.weight",
        "model.embedding.weight",
        "model.norm.weight",
    ]);
    for p in 0..2u64 {
        let stage = stage_tensors(&pp, p, 0);
        let top: BTreeSet<&str> = stage
            .keys()
            .map(String::as_str)
            .filter(|k| !k.starts_with("model.layers."))
            .collect();
        assert_eq!(top, head_tail, "stage {p}");
        let layer = format!("model.layers.{p}.");
        for (name, t) in &stage {
            assert!(
                !name.starts_with("model.layers.") || name.starts_with(&layer),
                "stage {p} holds '{name}'"
            );
            assert!(t == &whole[name], "stage {p}: '{name}' differs from TP1");
        }
    }
}

/// A bf16 checkpoint whose config says `quant_method: mxfp4` (as openai/gpt-oss-*'s do): the
/// experts are planned as MXFP4 (tests/it/formats/mxfp4.rs), so the bf16 tensors are refused by
/// shape, and the scales they lack are named.
#[test]
fn a_bf16_checkpoint_that_says_mxfp4_is_refused_by_shape() {
    let dir = copy_fixture(CASE);
    let cfg = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&cfg).unwrap()).unwrap();
    // As openai/gpt-oss-20b's config.json has it.
    config["quantization_config"] = serde_json::json!({
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
        "quant_method": "mxfp4"
    });
    write_json(&cfg, &config);
    for cmd in ["plan", "shard"] {
        let tmp = TempDir::new().unwrap();
        let o = tmp.path().join("out");
        let mut args = vec![cmd, s(dir.path()), "--tp", "2"];
        if cmd == "shard" {
            args.extend(["-o", s(&o)]);
        }
        let err = assert_refusal_text(
            &run(&args),
            3,
            &[
                "tensor 'model.layers.0.mlp.experts.gate_up_proj' has shape [4, 128, 128]",
                "'model.layers.0.mlp.experts.routed_experts.w13_weight' (via suffix '.experts.gate_up_proj' → '.experts.routed_experts.w13_weight') expects [4, 128, 4, 16]",
                "parameter 'model.layers.0.mlp.experts.routed_experts.w13_weight_scale' has nothing in the checkpoint to fill it",
            ],
        );
        assert!(
            !err.contains("matches no parameter"),
            "one clear reason: {err}"
        );
        assert!(!o.exists(), "{cmd}: nothing written");
    }
}

/// A TP size vLLM's OAIAttention cannot split (kv heads are not replicated), and config
/// dimensions that do not fit the stacked expert tensors, are refused with what to change.
#[test]
fn sizes_that_do_not_fit_are_refused() {
    let fx = fixture(CASE);
    assert_refusal_text(
        &run(&["plan", s(&fx), "--tp", "8"]),
        3,
        &[
            "num_key_value_heads (4) is not divisible by tp (8)",
            "choose a --tp that divides 4",
        ],
    );
    assert_refusal_text(
        &run(&[
            "plan",
            s(&fx),
            "--tp",
            "2",
            "--hf-overrides",
            r#"{"intermediate_size": 32}"#,
        ]),
        3,
        &[
            "tensor 'model.layers.0.mlp.experts.gate_up_proj' has shape [4, 128, 128]",
            "'model.layers.0.mlp.experts.routed_experts.w13_weight'",
            "expects [4, 128, 64]",
        ],
    );
}

/// `--dtype float32` converts after the transposing gather: every tensor is vLLM's bf16 TP2
/// output widened (bf16 → f32 is exact), the scale buffers unchanged; with tiny chunks too.
#[test]
fn float32_output_is_the_bf16_output_widened() {
    for chunk in [None, Some("6"), Some("1000")] {
        let tmp = TempDir::new().unwrap();
        let dir = tmp.path().join("f32");
        let mut cmd = wload();
        cmd.args([
            "shard",
            s(&fixture(CASE)),
            "--tp",
            "2",
            "--dtype",
            "float32",
            "-q",
        ])
        .args(["-o", s(&dir)]);
        if let Some(c) = chunk {
            cmd.env("WLOAD_TEST_CHUNK_BYTES", c);
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", context(&o));
        for r in 0..2 {
            let got = rank_tensors(&dir, r);
            let want = rank_tensors(&expected(CASE, 2), r);
            assert_eq!(got.len(), want.len(), "rank {r}");
            for (name, w) in &want {
                let (dtype, shape, bytes) = (&w.dtype, &w.shape, &w.data);
                let (gd, gs, gb) = (&got[name].dtype, &got[name].shape, &got[name].data);
                assert_eq!((gs, gd.as_str()), (shape, "F32"), "{name}");
                let widened: Vec<u8> = if dtype == "BF16" {
                    bytes.chunks(2).flat_map(|b| [0, 0, b[0], b[1]]).collect()
                } else {
                    bytes.clone()
                };
                assert!(gb == &widened, "rank {r} '{name}' ({chunk:?})");
            }
        }
    }
}
