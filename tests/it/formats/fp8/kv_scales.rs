//! Checkpoint KV scales land on the attention layer.

use super::*;

// ---------------------------------------------------------------------------------------------
// 3. Checkpoint KV scales land on the attention layer
// ---------------------------------------------------------------------------------------------

/// ModelOpt/AutoFP8 write the KV cache scales as `k_proj.k_scale` / `v_proj.v_scale` (layer 0
/// here); older exports as `self_attn.kv_scale` (deprecated: k only) and `self_attn.v_scale`
/// (layer 1). vLLM renames them onto `self_attn.attn.{k,v}_scale` (BF16 `[]`, the model dtype) on
/// every rank; the parameters the checkpoint does not fill keep vLLM's -1.0.
#[test]
fn checkpoint_kv_scales_land_on_the_attention_layer() {
    let src = copy_fixture("llama_gqa_fp8_tensor");
    rewrite_model(src.path(), |t| {
        t.push((
            "model.layers.0.self_attn.k_proj.k_scale".into(),
            f32_scalar(0.5),
        ));
        t.push((
            "model.layers.0.self_attn.v_proj.v_scale".into(),
            f32_scalar(0.25),
        ));
        t.push(("model.layers.1.self_attn.kv_scale".into(), f32_scalar(2.0)));
        t.push(("model.layers.1.self_attn.v_scale".into(), f32_scalar(4.0)));
    });
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(src.path(), 2, &out, &["-q"]);
    let golden = expected("llama_gqa__fp8_tensor", 2);
    let attn = |l: u64, p: &str| format!("model.layers.{l}.self_attn.attn.{p}");
    let want_scales = [
        (attn(0, "k_scale"), 0x3f00), // 0.5
        (attn(0, "v_scale"), 0x3e80), // 0.25
        (attn(0, "q_scale"), 0xbf80), // -1.0
        (attn(0, "prob_scale"), 0xbf80),
        (attn(1, "k_scale"), 0x4000), // 2.0
        (attn(1, "v_scale"), 0x4080), // 4.0
        (attn(1, "q_scale"), 0xbf80),
        (attn(1, "prob_scale"), 0xbf80),
    ];
    for r in 0..2 {
        let got = rank_tensors(&out, r);
        let mut want = rank_tensors(&golden, r);
        for (name, bits) in &want_scales {
            assert_eq!(
                got.get(name),
                Some(&bf16_scalar(*bits)),
                "rank {r}: {name} should be BF16 [] {bits:#06x}"
            );
            want.insert(name.clone(), bf16_scalar(*bits));
        }
        // Everything else is vLLM's output for the fixture without kv scales.
        assert!(
            got == want,
            "rank {r}: other tensors changed or keys differ"
        );
    }
}
