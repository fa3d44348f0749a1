//! Fused-on-disk FP8 (Phi-3): one checkpoint scale fills every slot.

use super::*;

// ---------------------------------------------------------------------------------------------
// 8. Fused-on-disk FP8 (Phi-3): one checkpoint scale fills every slot
// ---------------------------------------------------------------------------------------------

/// `x` rounded to BF16 bits, to nearest even, as PyTorch casts on the CPU.
fn bf16_rne(x: f32) -> u16 {
    let b = x.to_bits();
    assert!(!x.is_nan(), "no NaN in the fixtures");
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// Phi-3 stores qkv_proj and gate_up_proj fused on disk. As an FP8 checkpoint, each has one
/// scalar `weight_scale` / `input_scale`; vLLM's v2 loader copies it into every logical slot
/// (qkv `[3]`, gate_up `[2]`), the same on every rank, and slices the FP8 weight like the bf16
/// one. The FP8 bytes are the low bytes of the weights' BF16 values, so vLLM's bf16 shards of
/// the phi3 fixture predict them.
#[test]
fn fused_on_disk_fp8_copies_one_scale_into_every_slot() {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    let mut config: Value =
        serde_json::from_slice(&fs::read(fixture("phi3_fp32").join("config.json")).unwrap())
            .unwrap();
    config["quantization_config"] = json!({"quant_method": "fp8", "activation_scheme": "static"});
    write_json(&src.join("config.json"), &config);
    let linears = [
        "self_attn.qkv_proj",
        "self_attn.o_proj",
        "mlp.gate_up_proj",
        "mlp.down_proj",
    ];
    let scale = |l: u64, m: usize, input: bool| {
        (1 + 16 * l + 2 * m as u64 + u64::from(input)) as f32 / 64.0
    };
    let mut tensors = Vec::new();
    for (name, t) in checkpoint_tensors(&fixture("phi3_fp32")) {
        let linear = (0..2u64)
            .flat_map(|l| linears.iter().enumerate().map(move |(m, p)| (l, m, *p)))
            .find(|(l, _, p)| name == format!("model.layers.{l}.{p}.weight"));
        if let Some((l, m, _)) = linear {
            let prefix = name.strip_suffix(".weight").unwrap();
            tensors.push((
                format!("{prefix}.weight_scale"),
                f32_scalar(scale(l, m, false)),
            ));
            tensors.push((
                format!("{prefix}.input_scale"),
                f32_scalar(scale(l, m, true)),
            ));
            let data = values(&t)
                .into_iter()
                .map(|x| bf16_rne(x).to_le_bytes()[0])
                .collect();
            tensors.push((
                name,
                Held {
                    dtype: "F8_E4M3".into(),
                    shape: t.shape,
                    data,
                },
            ));
        } else {
            tensors.push((name, t));
        }
    }
    write_held(
        &src.join("model.safetensors"),
        tensors.iter().map(|(n, t)| (n, t)),
    );

    let out = tmp.path().join("out");
    shard_ok(&src, 2, &out, &["-q"]);
    assert_ranks_equal(&out, "phi3_fp32", |_, want| {
        for (name, t) in want.iter_mut() {
            if linears
                .iter()
                .any(|p| name.ends_with(&format!("{p}.weight")))
            {
                t.dtype = "F8_E4M3".into();
                t.data = low_bytes(&t.data);
            }
        }
        for l in 0..2u64 {
            for (m, p) in linears.iter().enumerate() {
                let slots = match *p {
                    "self_attn.qkv_proj" => 3,
                    "mlp.gate_up_proj" => 2,
                    _ => 1,
                };
                for (kind, input) in [("weight_scale", false), ("input_scale", true)] {
                    let v = vec![scale(l, m, input); slots];
                    want.insert(
                        format!("model.layers.{l}.{p}.{kind}"),
                        f32_held(&[slots as u64], &v),
                    );
                }
            }
            for a in ["q_scale", "k_scale", "v_scale", "prob_scale"] {
                want.insert(
                    format!("model.layers.{l}.self_attn.attn.{a}"),
                    bf16_scalar(0xbf80),
                );
            }
        }
    });
}
