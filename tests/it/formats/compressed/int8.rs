//! W8A8 INT8 with static, asymmetric activations: a linear layer has one `input_scale` F32 `[1]`
//! and one `input_zero_point` I8 `[1]` (`BasevLLMParameter`), which every shard of a fused layer
//! overwrites whole, so each rank holds the values of the shard loaded last (in one sorted file
//! v_proj of q/k/v, up_proj of gate/up); the BF16 checkpoint scale becomes F32 exactly.

use serde_json::json;

use crate::support::*;

const FIXTURE: &str = "llama_gqa_ct_w8a8_int8";
const PROJS: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

#[test]
fn a_static_input_scale_and_zero_point_are_the_last_loaded_shards() {
    let dir = fixture_with(FIXTURE, |c| {
        c["quantization_config"]["config_groups"]["group_0"]["input_activations"] = json!({
            "num_bits": 8, "type": "int", "symmetric": false, "strategy": "tensor",
            "dynamic": false});
    });
    let file = dir.path().join("model.safetensors");
    // Projection k of layer l: scale 1 + k/8 + l (exact in BF16), zero point 10·l + k.
    let scale = |l: usize, k: usize| 1.0 + k as f32 / 8.0 + l as f32;
    for l in 0..2 {
        for (k, p) in PROJS.iter().enumerate() {
            let bits = (scale(l, k).to_bits() >> 16) as u16;
            let at = format!("model.layers.{l}.{p}");
            append_tensor(
                &file,
                &format!("{at}.input_scale"),
                "BF16",
                &[1],
                &bits.to_le_bytes(),
            );
            let zp = [(10 * l + k) as u8];
            append_tensor(&file, &format!("{at}.input_zero_point"), "I8", &[1], &zp);
        }
    }
    for tp in [1u64, 2] {
        let out = tempfile::tempdir().unwrap();
        shard_ok(dir.path(), tp, out.path(), &[]);
        for r in 0..tp {
            let t = rank_tensors(out.path(), r);
            for l in 0..2 {
                // The fused layers keep v_proj's (index 2) and up_proj's (5).
                for (module, k) in [
                    ("self_attn.qkv_proj", 2),
                    ("self_attn.o_proj", 3),
                    ("mlp.gate_up_proj", 5),
                    ("mlp.down_proj", 6),
                ] {
                    let at = |s: &str| format!("model.layers.{l}.{module}.{s}");
                    let s = &t[&at("input_scale")];
                    assert_eq!((s.dtype.as_str(), s.shape.as_slice()), ("F32", &[1u64][..]));
                    assert_eq!(
                        s.data,
                        scale(l, k).to_le_bytes(),
                        "tp{tp} rank {r} {}",
                        at("input_scale")
                    );
                    let z = &t[&at("input_zero_point")];
                    assert_eq!((z.dtype.as_str(), z.shape.as_slice()), ("I8", &[1u64][..]));
                    assert_eq!(
                        z.data,
                        [(10 * l + k) as u8],
                        "tp{tp} rank {r} {}",
                        at("input_zero_point")
                    );
                    assert_eq!(t[&at("weight")].dtype, "I8");
                }
            }
        }
    }
}
