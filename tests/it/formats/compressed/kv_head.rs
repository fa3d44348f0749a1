//! `kv_cache_scheme` strategy `tensor`: the checkpoint's `[1]` scales, ones where it has none.
//! Strategy `attn_head`: every rank's `attn.k_scale` / `v_scale` are its kv
//! heads' checkpoint scales, `q_scale` the maximum over each kv head's query group, computed
//! from the checkpoint here — with TP above the kv head count too (kv heads replicated: rank r
//! holds head `r / (tp / kv_heads)`); the zero points stay zero whatever the checkpoint says.

use crate::support::*;

const FIXTURE: &str = "llama_kv2_ct_fp8_kv_head";
const HEADS: usize = 8;
const KV_HEADS: usize = 2;

fn bf16_values(h: &Held) -> Vec<f32> {
    (h.data.chunks_exact(2))
        .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
        .collect()
}

fn f32_values(h: &Held) -> Vec<f32> {
    (h.data.chunks_exact(4))
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn per_head_scales_follow_the_ranks_kv_heads_and_q_is_the_group_maximum() {
    let dir = copy_fixture(FIXTURE);
    let file = dir.path().join("model.safetensors");
    // A checkpoint zero point vLLM's attn_head loader ignores.
    let ones: Vec<u8> = [1.0f32; KV_HEADS]
        .iter()
        .flat_map(|_| 0x3F80u16.to_le_bytes())
        .collect();
    append_tensor(
        &file,
        "model.layers.0.self_attn.k_zero_point",
        "BF16",
        &[KV_HEADS as u64, 1, 1],
        &ones,
    );
    let ckpt = checkpoint_tensors(dir.path());
    for tp in [1usize, 2, 4, 8] {
        let out = tempfile::tempdir().unwrap();
        shard_ok(dir.path(), tp as u64, out.path(), &[]);
        let n = (KV_HEADS / tp).max(1);
        for r in 0..tp {
            let t = rank_tensors(out.path(), r as u64);
            let first = if tp >= KV_HEADS {
                r / (tp / KV_HEADS)
            } else {
                r * n
            };
            for l in 0..2 {
                let at = |s: &str| format!("model.layers.{l}.self_attn.{s}");
                let k = bf16_values(&ckpt[&at("k_scale")]);
                let v = bf16_values(&ckpt[&at("v_scale")]);
                let q = bf16_values(&ckpt[&at("q_scale")]);
                let g = HEADS / KV_HEADS;
                let q_max: Vec<f32> = (q.chunks(g))
                    .map(|c| c.iter().copied().fold(f32::MIN, f32::max))
                    .collect();
                for (name, want) in [("k_scale", &k), ("v_scale", &v), ("q_scale", &q_max)] {
                    let h = &t[&at(&format!("attn.{name}"))];
                    assert_eq!(
                        (h.dtype.as_str(), h.shape.as_slice()),
                        ("F32", &[n as u64][..])
                    );
                    assert_eq!(
                        f32_values(h),
                        want[first..first + n].to_vec(),
                        "tp{tp} rank {r} layer {l} {name}"
                    );
                }
                for z in ["k_zero_point", "v_zero_point", "q_zero_point"] {
                    let h = &t[&at(&format!("attn.{z}"))];
                    assert_eq!(
                        (h.dtype.as_str(), h.shape.as_slice()),
                        ("BF16", &[n as u64][..])
                    );
                    assert!(
                        h.data.iter().all(|&b| b == 0),
                        "tp{tp} rank {r}: {z} not zero"
                    );
                }
            }
        }
    }
}

/// Strategy `tensor`: one F32 `[1]` per k, v and q, the checkpoint's value (BF16 widened), q 1.0
/// when the checkpoint has none; zero points model dtype `[1]`, loaded when present.
#[test]
fn per_tensor_scales_are_the_checkpoints_values_on_every_rank() {
    let dir = fixture_with("llama_gqa_ct_fp8_dynamic", |c| {
        c["quantization_config"]["kv_cache_scheme"] = serde_json::json!({
            "num_bits": 8, "type": "float", "symmetric": true, "strategy": "tensor",
            "dynamic": false});
    });
    let file = dir.path().join("model.safetensors");
    for (name, bits) in [("k_scale", 0x3F00u16), ("v_scale", 0x4000)] {
        let at = format!("model.layers.1.self_attn.{name}");
        append_tensor(&file, &at, "BF16", &[1], &bits.to_le_bytes());
    }
    let out = tempfile::tempdir().unwrap();
    shard_ok(dir.path(), 2, out.path(), &[]);
    for r in 0..2 {
        let t = rank_tensors(out.path(), r);
        let at = |l: u64, s: &str| format!("model.layers.{l}.self_attn.attn.{s}");
        for (l, name, want) in [
            (1, "k_scale", 0.5f32),
            (1, "v_scale", 2.0),
            (1, "q_scale", 1.0),
            (0, "k_scale", 1.0),
        ] {
            let h = &t[&at(l, name)];
            assert_eq!((h.dtype.as_str(), h.shape.as_slice()), ("F32", &[1u64][..]));
            assert_eq!(f32_values(h), vec![want], "rank {r} layer {l} {name}");
        }
        let z = &t[&at(1, "k_zero_point")];
        assert_eq!(
            (z.dtype.as_str(), z.data.as_slice()),
            ("BF16", &[0u8, 0][..])
        );
    }
}
