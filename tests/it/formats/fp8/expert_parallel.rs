//! Block FP8 MoE with expert parallelism, and pipeline stages of block FP8.

use super::*;

// ---------------------------------------------------------------------------------------------
// 7. Block FP8 MoE with expert parallelism
// ---------------------------------------------------------------------------------------------

/// BF16 scale bytes as the F32 bytes vLLM's parameter holds (exact widening).
fn bf16_to_f32_bytes(t: &Held) -> Vec<u8> {
    assert_eq!(t.dtype, "BF16");
    f32_bytes(&values(t))
}

/// EP 2 on the block-FP8 Qwen3-MoE: each rank holds 4 whole experts with their whole block scales
/// (`[gate ; up]` and down, BF16 cast to F32); everything else is byte for byte vLLM's TP 2 rank.
#[test]
fn block_fp8_moe_with_expert_parallel_holds_whole_experts_and_scales() {
    let name = "qwen3_moe_fp8_block";
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(&fixture(name), 2, &out, &["-q", "--enable-expert-parallel"]);
    let ckpt = checkpoint_tensors(&fixture(name));
    let ex = |e: u64, p: &str| &ckpt[&format!("model.layers.1.mlp.experts.{e}.{p}")];
    let cat = |parts: Vec<Vec<u8>>| parts.concat();
    for r in 0..2u64 {
        let got = rank_tensors(&out, r);
        let mut want = rank_tensors(&expected(name, 2), r);
        let local: Vec<u64> = (4 * r..4 * r + 4).collect();
        let routed = "model.layers.1.mlp.experts.routed_experts";
        let experts = [
            (
                "w13_weight",
                "F8_E4M3",
                vec![4, 128, 128],
                cat(local
                    .iter()
                    .flat_map(|&e| {
                        [ex(e, "gate_proj.weight"), ex(e, "up_proj.weight")].map(|t| t.data.clone())
                    })
                    .collect()),
            ),
            (
                "w13_weight_scale_inv",
                "F32",
                vec![4, 4, 4],
                cat(local
                    .iter()
                    .flat_map(|&e| {
                        [
                            ex(e, "gate_proj.weight_scale_inv"),
                            ex(e, "up_proj.weight_scale_inv"),
                        ]
                        .map(bf16_to_f32_bytes)
                    })
                    .collect()),
            ),
            (
                "w2_weight",
                "F8_E4M3",
                vec![4, 128, 64],
                cat(local
                    .iter()
                    .map(|&e| ex(e, "down_proj.weight").data.clone())
                    .collect()),
            ),
            (
                "w2_weight_scale_inv",
                "F32",
                vec![4, 4, 2],
                cat(local
                    .iter()
                    .map(|&e| bf16_to_f32_bytes(ex(e, "down_proj.weight_scale_inv")))
                    .collect()),
            ),
        ];
        for (param, dtype, shape, data) in experts {
            let held = Held {
                dtype: dtype.into(),
                shape,
                data,
            };
            assert!(
                want.insert(format!("{routed}.{param}"), held).is_some(),
                "vLLM's TP 2 output has {routed}.{param}"
            );
        }
        let (gk, wk): (BTreeSet<_>, BTreeSet<_>) = (got.keys().collect(), want.keys().collect());
        assert_eq!(gk, wk, "rank {r}: keys");
        for (n, w) in &want {
            let g = &got[n];
            assert!(
                g == w,
                "rank {r}: '{n}' differs: got {} {:?}, want {} {:?}",
                g.dtype,
                g.shape,
                w.dtype,
                w.shape
            );
        }
    }
}

/// Pipeline parallelism on an FP8 checkpoint: each stage holds its layer's weights and scales,
/// byte for byte what vLLM's TP-only output of the same TP rank holds under the same keys, and
/// together the stages hold all of them.
#[test]
fn block_fp8_pipeline_stages_split_vllms_tp_output() {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(
        &fixture("llama_gqa_fp8_block"),
        2,
        &out,
        &["-q", "--pp", "2"],
    );
    for t in 0..2 {
        let whole = rank_tensors(&expected("llama_gqa__fp8_block", 2), t);
        let mut union = BTreeSet::new();
        for p in 0..2 {
            for (name, held) in stage_tensors(&out, p, t) {
                let other_layer = format!("model.layers.{}.", 1 - p);
                assert!(!name.starts_with(&other_layer), "stage {p} holds '{name}'");
                assert!(
                    whole.get(&name) == Some(&held),
                    "stage {p} tp {t}: '{name}' differs from vLLM's TP-only rank"
                );
                union.insert(name);
            }
        }
        let all: BTreeSet<String> = whole.keys().cloned().collect();
        assert_eq!(union, all, "tp {t}: the stages together");
    }
}
