//! Qwen3-MoE GPTQ experts as `AutoGPTQMoEMethod` creates them (`is_transposed`): `w13_*`
//! `[E, H/8 or H/g, 2·I_r (/8)]` with gate then up on the last dim, `w2_*` `[E, I_r/8 or
//! I_r/g, H (/8)]`, zero biases always there; in vLLM's order; put back together across TP
//! ranks (and whole experts under EP) they are the checkpoint's experts.

use super::*;

const E: u64 = 2;
const MH: u64 = 128;
const MI: u64 = 64;
const G: u64 = 32;

/// A one-layer Qwen3-MoE, every linear and expert GPTQ 4-bit in groups of 32.
pub(super) fn qwen3_moe_gptq() -> TempDir {
    qwen3_moe(Method::Gptq)
}

/// A one-layer Qwen3-MoE, every linear and expert 4-bit in groups of 32.
fn qwen3_moe(method: Method) -> TempDir {
    let qc = match method {
        Method::Gptq => json!({"quant_method": "gptq", "bits": 4, "group_size": G,
            "desc_act": false, "sym": true}),
        Method::Awq => json!({"quant_method": "awq", "bits": 4, "group_size": G,
            "zero_point": true, "version": "gemm"}),
    };
    let tmp = TempDir::new().unwrap();
    write_json(
        &tmp.path().join("config.json"),
        &json!({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": MH, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 32, "num_experts": E, "num_experts_per_tok": 1,
            "moe_intermediate_size": MI, "intermediate_size": 256, "vocab_size": 64,
            "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
            "dtype": "float16", "decoder_sparse_step": 1, "mlp_only_layers": [],
            "quantization_config": qc}),
    );
    let l = "model.layers.0";
    let mut specs: Vec<(String, &str, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), "F16", vec![64, MH]),
        (format!("{l}.self_attn.q_norm.weight"), "F16", vec![32]),
        (format!("{l}.self_attn.k_norm.weight"), "F16", vec![32]),
        (format!("{l}.mlp.gate.weight"), "F16", vec![E, MH]),
        (format!("{l}.input_layernorm.weight"), "F16", vec![MH]),
        (
            format!("{l}.post_attention_layernorm.weight"),
            "F16",
            vec![MH],
        ),
        ("model.norm.weight".into(), "F16", vec![MH]),
        ("lm_head.weight".into(), "F16", vec![64, MH]),
    ];
    for (m, n) in [
        ("q_proj", 128),
        ("k_proj", 64),
        ("v_proj", 64),
        ("o_proj", 128),
    ] {
        specs.extend(packed(method, &format!("{l}.self_attn.{m}"), MH, n, G));
    }
    for e in 0..E {
        let p = format!("{l}.mlp.experts.{e}");
        specs.extend(packed(method, &format!("{p}.gate_proj"), MH, MI, G));
        specs.extend(packed(method, &format!("{p}.up_proj"), MH, MI, G));
        specs.extend(packed(method, &format!("{p}.down_proj"), MI, MH, G));
    }
    write_specs(&tmp.path().join("model.safetensors"), &specs);
    tmp
}

/// Expert `e` of a 3-D tensor, as a 2-D one.
fn expert(t: &Held, e: u64) -> Held {
    let per = t.data.len() / t.shape[0] as usize;
    Held {
        dtype: t.dtype.clone(),
        shape: t.shape[1..].to_vec(),
        data: t.data[e as usize * per..(e as usize + 1) * per].to_vec(),
    }
}

/// Per (expert, parameter, checkpoint module): the parts the ranks hold, put back together.
type Parts = std::collections::BTreeMap<(u64, &'static str, &'static str), Vec<Vec<u32>>>;

const PARAMS: [&str; 8] = [
    "w13_qweight",
    "w2_qweight",
    "w13_scales",
    "w2_scales",
    "w13_qzeros",
    "w2_qzeros",
    "w13_bias",
    "w2_bias",
];

/// The checkpoint tensor a fused expert parameter's part comes from.
fn source(ckpt: &Tensors, e: u64, proj: &str, param: &str) -> Vec<Vec<u32>> {
    let p = param.split_once('_').map_or(param, |(_, p)| p);
    matrix(
        &ckpt[&format!("model.layers.0.mlp.experts.{e}.{proj}.{p}")],
        None,
    )
}

#[test]
fn gptq_experts_are_input_major_and_put_back_together_are_the_checkpoint() {
    experts_put_back_together(Method::Gptq);
}

/// `AutoAWQMoEMethod`: `w13_qweight [E, H, 2·I_r/8]`, `w2_qweight [E, I_r, H/8]`, no biases.
#[test]
fn awq_experts_are_packed_on_the_output_and_put_back_together_are_the_checkpoint() {
    experts_put_back_together(Method::Awq);
}

fn experts_put_back_together(method: Method) {
    let src = qwen3_moe(method);
    let ckpt = checkpoint_tensors(src.path());
    for (tp, ep) in [(1, false), (2, false), (2, true)] {
        let flags: &[&str] = if ep {
            &["--enable-expert-parallel"]
        } else {
            &[]
        };
        let out = sharded(src.path(), tp, flags);
        let dir = out.path().join("out");
        let ctx = format!("{method:?} tp{tp} ep {ep}");
        let (moe_tp, e_loc) = if ep { (1, E / tp) } else { (tp, E) };
        let ir = MI / moe_tp;
        let base = "model.layers.0.mlp.experts.routed_experts";
        let (w13, w2) = match method {
            Method::Gptq => ([e_loc, MH / 8, 2 * ir], [e_loc, ir / 8, MH]),
            Method::Awq => ([e_loc, MH, 2 * ir / 8], [e_loc, ir, MH / 8]),
        };
        let params = match method {
            Method::Gptq => &PARAMS[..],
            Method::Awq => &PARAMS[..6],
        };
        let shapes = [
            w13,
            w2,
            [e_loc, MH / G, 2 * ir],
            [e_loc, ir / G, MH],
            [e_loc, MH / G, 2 * ir / 8],
            [e_loc, ir / G, MH / 8],
        ];
        let mut got: Parts = Default::default();
        for r in 0..tp {
            let tp_arg = tp.to_string();
            let mut args = vec!["--tp", tp_arg.as_str()];
            args.extend_from_slice(flags);
            let names: Vec<String> = (plan_order(src.path(), &args, r as usize).into_iter())
                .filter(|n| n.starts_with(base))
                .collect();
            let want: Vec<String> = params.iter().map(|p| format!("{base}.{p}")).collect();
            assert_eq!(names, want, "{ctx}: vLLM's registration order");
            let t = rank_tensors(&dir, r);
            // The router's checkpoint tensor is F16: GateLinear stays unquantized.
            let router = &t["model.layers.0.mlp.experts.gate.weight"];
            assert_eq!(
                (router.dtype.as_str(), &router.shape[..]),
                ("F16", &[E, MH][..])
            );
            for (p, shape) in PARAMS.iter().zip(&shapes) {
                assert_eq!(
                    t[&format!("{base}.{p}")].shape,
                    shape.to_vec(),
                    "{ctx}: {p}"
                );
            }
            let biases = [
                ("w13_bias", vec![e_loc, 2 * ir]),
                ("w2_bias", vec![e_loc, MH]),
            ];
            for (p, shape) in biases.into_iter().filter(|_| method == Method::Gptq) {
                let b = &t[&format!("{base}.{p}")];
                assert_eq!((b.dtype.as_str(), &b.shape), ("F16", &shape), "{ctx}: {p}");
                assert!(b.data.iter().all(|&x| x == 0), "{ctx}: {p} zeros");
            }
            for j in 0..e_loc {
                let e = if ep { r * e_loc + j } else { j };
                for p in ["w13_qweight", "w13_scales", "w13_qzeros"] {
                    let m = matrix(&expert(&t[&format!("{base}.{p}")], j), None);
                    let half = m[0].len() / 2;
                    hcat(
                        got.entry((e, p, "gate_proj")).or_default(),
                        cols(&m, 0, half),
                    );
                    hcat(
                        got.entry((e, p, "up_proj")).or_default(),
                        cols(&m, half, 2 * half),
                    );
                }
                for p in ["w2_qweight", "w2_scales", "w2_qzeros"] {
                    let m = matrix(&expert(&t[&format!("{base}.{p}")], j), None);
                    got.entry((e, p, "down_proj")).or_default().extend(m);
                }
            }
        }
        assert_eq!(got.len() as u64, E * 9, "{ctx}");
        for ((e, p, proj), m) in &got {
            assert!(
                *m == source(&ckpt, *e, proj, p),
                "{ctx}: {p} of expert {e}'s {proj}"
            );
        }
    }
}

/// Mixtral's experts (`block_sparse_moe.experts.{e}.w1/w2/w3`) take the same input-major
/// parameters; its router (`block_sparse_moe.gate`, F16 in GPTQ releases) stays unquantized.
#[test]
fn mixtral_gptq_experts_have_vllms_shapes() {
    let tmp = TempDir::new().unwrap();
    write_json(
        &tmp.path().join("config.json"),
        &json!({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "hidden_size": MH, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_local_experts": E, "num_experts_per_tok": 1, "intermediate_size": MI,
            "vocab_size": 64, "num_hidden_layers": 1, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": false, "torch_dtype": "float16",
            "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": G,
                "desc_act": false, "sym": true}}),
    );
    let l = "model.layers.0";
    let mut specs: Vec<(String, &str, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), "F16", vec![64, MH]),
        (
            format!("{l}.block_sparse_moe.gate.weight"),
            "F16",
            vec![E, MH],
        ),
        (format!("{l}.input_layernorm.weight"), "F16", vec![MH]),
        (
            format!("{l}.post_attention_layernorm.weight"),
            "F16",
            vec![MH],
        ),
        ("model.norm.weight".into(), "F16", vec![MH]),
        ("lm_head.weight".into(), "F16", vec![64, MH]),
    ];
    for (m, n) in [
        ("q_proj", 128),
        ("k_proj", 64),
        ("v_proj", 64),
        ("o_proj", 128),
    ] {
        specs.extend(packed(
            Method::Gptq,
            &format!("{l}.self_attn.{m}"),
            MH,
            n,
            G,
        ));
    }
    for e in 0..E {
        let p = format!("{l}.block_sparse_moe.experts.{e}");
        specs.extend(packed(Method::Gptq, &format!("{p}.w1"), MH, MI, G));
        specs.extend(packed(Method::Gptq, &format!("{p}.w3"), MH, MI, G));
        specs.extend(packed(Method::Gptq, &format!("{p}.w2"), MI, MH, G));
    }
    let data: Vec<Vec<u8>> = (specs.iter().enumerate())
        .map(|(t, (_, dtype, shape))| match *dtype {
            "I32" => i32_data(t as u64, shape.iter().product()),
            _ => bf16_data(t as u64, shape.iter().product::<u64>() as usize),
        })
        .collect();
    let tensors: Vec<Tensor> = (specs.iter().zip(&data))
        .map(|((n, d, s), b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
        .collect();
    write_safetensors(&tmp.path().join("model.safetensors"), &tensors);
    let out = sharded(tmp.path(), 2, &[]);
    let t = rank_tensors(&out.path().join("out"), 1);
    let base = format!("{l}.block_sparse_moe.experts.routed_experts");
    let ir = MI / 2;
    for (p, dtype, shape) in [
        ("w13_qweight", "I32", [E, MH / 8, 2 * ir]),
        ("w2_qweight", "I32", [E, ir / 8, MH]),
        ("w13_scales", "F16", [E, MH / G, 2 * ir]),
        ("w2_scales", "F16", [E, ir / G, MH]),
        ("w13_qzeros", "I32", [E, MH / G, 2 * ir / 8]),
        ("w2_qzeros", "I32", [E, ir / G, MH / 8]),
    ] {
        let h = &t[&format!("{base}.{p}")];
        assert_eq!((h.dtype.as_str(), &h.shape[..]), (dtype, &shape[..]), "{p}");
    }
    let gate = t
        .iter()
        .find(|(n, _)| n.ends_with("gate.weight"))
        .map(|(_, h)| h.dtype.clone());
    assert_eq!(gate.as_deref(), Some("F16"), "the router stays F16");
}
