//! What vLLM 0.33 refuses about GPTQ and AWQ checkpoints is refused up front, before anything is
//! written, in vLLM's words, naming the layer, the rule and the fix.

use super::*;

fn refused(src: &Path, tp: u64, extra: &[&str], needles: &[&str]) -> String {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    let err = assert_refusal_text(&shard(src, tp, &out, extra), 3, needles);
    assert!(!out.exists(), "refused, yet {} was created", out.display());
    err
}

#[test]
fn gptq_and_awq_configs_vllm_refuses_are_refused_with_its_words_and_a_fix() {
    let cases: [(Method, Value, &[&str]); 5] = [
        (
            Method::Gptq,
            json!({"desc_act": true}),
            &[
                "GPTQ group activation ordering (desc_act=True) is no longer supported",
                "desc_act false",
            ],
        ),
        (
            Method::Gptq,
            json!({"sym": false}),
            &[
                "Unsupported quantization config: bits=4, sym=False",
                "symmetric",
            ],
        ),
        (
            Method::Gptq,
            json!({"bits": 3}),
            &[
                "Unsupported quantization config: bits=3, sym=True",
                "4- or 8-bit",
            ],
        ),
        (
            Method::Awq,
            json!({"bits": 8}),
            &["Unsupported num_bits = 8. Supported: 4.", "4-bit AWQ"],
        ),
        (
            Method::Gptq,
            json!({"quant_method": "bitsandbytes"}),
            &[
                "Unknown quantization method: bitsandbytes. Must be one of ['awq',",
                "removed bitsandbytes",
            ],
        ),
    ];
    for (method, edit, needles) in cases {
        let src = dense(method, 32, edit);
        refused(src.path(), 2, &["-q"], needles);
        // `inspect` as a CI gate agrees with plan: the same refusal, the same exit status.
        let out = run(&["inspect", s(src.path())]);
        assert_eq!(out.status.code(), Some(3), "{}", context(&out));
        let support = stdout(&out);
        let support = support
            .lines()
            .find(|l| l.starts_with("support "))
            .unwrap_or_default();
        assert!(support.contains("refuse its quantization"), "{support}");
        assert!(stderr(&out).contains(needles[0]), "{}", context(&out));
    }
    let src = dense(Method::Gptq, 32, json!({"quant_method": "fbgemm_fp8"}));
    refused(
        src.path(),
        2,
        &["-q"],
        &["deprecated", "--allow-deprecated-quantization"],
    );
}

/// At TP 8, o_proj's 16 input columns per rank are half a 32-column group (the classic
/// "input_size_per_partition is not divisible by group_size"); TP 4 is fine.
#[test]
fn a_group_that_straddles_ranks_is_refused_at_that_tp_only() {
    let src = dense(Method::Gptq, 32, json!({}));
    let err = refused(
        src.path(),
        8,
        &[],
        &[
            "model.layers.0.self_attn.o_proj: GPTQ linear layer at tp 8: in_features per partition 16 is not divisible by group_size = 32.",
            "choose a --tp",
        ],
    );
    assert!(
        !err.contains("down_proj"),
        "down_proj has 32 columns per rank: {err}"
    );
    let _ok = sharded(src.path(), 4, &[]);
}

/// At TP 4 each rank holds 16 of the experts' 64 intermediate rows, half a group:
/// `check_moe_marlin_supports_layer` fails and vLLM would switch to MoeWNA16's parameters.
#[test]
fn experts_marlin_cannot_take_are_refused_with_the_reason() {
    let src = super::moe::qwen3_moe_gptq();
    refused(
        src.path(),
        4,
        &[],
        &[
            "Layer 'model.layers.0.mlp.experts' is not supported by GPTQMoeMarlin. Falling back to Moe WNA16 kernels.",
            "intermediate size per rank 16 a multiple of the group size 32",
            "--enable-expert-parallel",
        ],
    );
}

/// GPTQ and AWQ accept float16 and bfloat16 activations only.
#[test]
fn float32_is_refused_as_vllm_refuses_it() {
    let src = dense(Method::Awq, 32, json!({}));
    refused(
        src.path(),
        2,
        &["--dtype", "float32"],
        &[
            "torch.float32 is not supported for quantization method auto_awq",
            "--dtype",
        ],
    );
}
