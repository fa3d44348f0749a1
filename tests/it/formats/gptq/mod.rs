//! GPTQ and AWQ checkpoints: every rank's packed weights, zero points and scales, unpacked and
//! put back together across the ranks (fused layers part by part, row-parallel layers row by
//! row, replicated kv heads once), are the checkpoint's unpacked tensors, at several TP sizes;
//! Qwen3-MoE GPTQ experts in vLLM's input-major layout, with EP; the refusals vLLM makes, up
//! front; and a GPTQ output's config.json that lists its quantized modules so that vLLM can
//! load the folder. The TP 2 golden case (byte-identical to vLLM) runs with the other golden
//! cases.

use std::path::Path;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::*;

mod awq_shapes;
mod moe;
mod property;
mod refusals;
mod reload;

/// Llama dimensions shared by the dense fixtures: hidden 128, 8 heads of 16, 4 kv heads,
/// intermediate 256.
const H: u64 = 128;
const HEADS: u64 = 8;
const KV: u64 = 4;
const HD: u64 = 16;
const I: u64 = 256;

/// GPTQ or AWQ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Method {
    Gptq,
    Awq,
}

fn i32_data(t: u64, n: u64) -> Vec<u8> {
    (0..n)
        .flat_map(|k| (mix(t << 32 | k) as u32).to_le_bytes())
        .collect()
}

/// A one-layer dense checkpoint (Llama for GPTQ, Qwen2 with its qkv bias for AWQ), its linear
/// layers quantized in groups of `group` (-1: one group per output channel), the rest F16.
/// `specs` (name, dtype, shape) written to `path` with distinct generated data: integers for the
/// I32 tensors, floats for the rest.
pub(super) fn write_specs(path: &Path, specs: &[(String, &str, Vec<u64>)]) {
    let data: Vec<Vec<u8>> = (specs.iter().enumerate())
        .map(|(t, (_, dtype, shape))| {
            let n: u64 = shape.iter().product();
            match *dtype {
                "I32" => i32_data(t as u64, n),
                _ => bf16_data(t as u64, n as usize),
            }
        })
        .collect();
    let tensors: Vec<Tensor> = (specs.iter().zip(&data))
        .map(|((n, d, s), b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
        .collect();
    write_safetensors(path, &tensors);
}

pub(super) fn dense(method: Method, group: i64, extra: Value) -> TempDir {
    let tmp = TempDir::new().unwrap();
    let (arch, model_type) = match method {
        Method::Gptq => ("LlamaForCausalLM", "llama"),
        Method::Awq => ("Qwen2ForCausalLM", "qwen2"),
    };
    let mut qc = match method {
        Method::Gptq => json!({"quant_method": "gptq", "bits": 4, "group_size": group,
            "desc_act": false, "sym": true, "modules_in_block_to_quantize": null}),
        Method::Awq => json!({"quant_method": "awq", "bits": 4, "group_size": group,
            "zero_point": true, "version": "gemm", "modules_to_not_convert": null}),
    };
    let bits = extra.get("bits").and_then(Value::as_u64).unwrap_or(4);
    let pack = if bits == 8 { 4 } else { 8 };
    for (k, v) in extra.as_object().into_iter().flatten() {
        qc[k] = v.clone();
    }
    write_json(
        &tmp.path().join("config.json"),
        &json!({"architectures": [arch], "model_type": model_type, "hidden_size": H,
            "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD,
            "intermediate_size": I, "vocab_size": 64, "num_hidden_layers": 1,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "dtype": "float16",
            "max_position_embeddings": 256, "quantization_config": qc}),
    );
    let mut specs: Vec<(String, &str, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), "F16", vec![64, H]),
        ("lm_head.weight".into(), "F16", vec![64, H]),
        ("model.norm.weight".into(), "F16", vec![H]),
    ];
    let l = "model.layers.0";
    for (n, shape) in [("input_layernorm", H), ("post_attention_layernorm", H)] {
        specs.push((format!("{l}.{n}.weight"), "F16", vec![shape]));
    }
    for (m, k, n) in linears() {
        let g = u64::try_from(group).unwrap_or(k);
        let mut tensors = packed(method, &format!("{l}.{m}"), k, n, g);
        if pack != 8 {
            // 8-bit GPTQ: 4 values to an int32 (only qweight and qzeros are packed).
            for (name, _, shape) in tensors.iter_mut() {
                if name.ends_with("qweight") {
                    shape[0] = k / pack;
                } else if name.ends_with("qzeros") {
                    shape[1] = n / pack;
                }
            }
        }
        specs.extend(tensors);
        if method == Method::Awq && m.starts_with("self_attn.") && m != "self_attn.o_proj" {
            specs.push((format!("{l}.{m}.bias"), "F16", vec![n]));
        }
    }
    write_specs(&tmp.path().join("model.safetensors"), &specs);
    tmp
}

/// The dense layer's linear layers: checkpoint module, K, N.
pub(super) fn linears() -> Vec<(&'static str, u64, u64)> {
    vec![
        ("self_attn.q_proj", H, HEADS * HD),
        ("self_attn.k_proj", H, KV * HD),
        ("self_attn.v_proj", H, KV * HD),
        ("self_attn.o_proj", HEADS * HD, H),
        ("mlp.gate_proj", H, I),
        ("mlp.up_proj", H, I),
        ("mlp.down_proj", I, H),
    ]
}

/// A GPTQ or AWQ linear layer's checkpoint tensors (`g_idx` too: vLLM drops it).
pub(super) fn packed(
    method: Method,
    module: &str,
    k: u64,
    n: u64,
    g: u64,
) -> Vec<(String, &'static str, Vec<u64>)> {
    let at = |s: &str| format!("{module}.{s}");
    match method {
        Method::Gptq => vec![
            (at("qweight"), "I32", vec![k / 8, n]),
            (at("qzeros"), "I32", vec![k / g, n / 8]),
            (at("scales"), "F16", vec![k / g, n]),
            (at("g_idx"), "I32", vec![k]),
        ],
        Method::Awq => vec![
            (at("qweight"), "I32", vec![k, n / 8]),
            (at("qzeros"), "I32", vec![k / g, n / 8]),
            (at("scales"), "F16", vec![k / g, n]),
        ],
    }
}

/// [`matrix_of`] for 4-bit values.
pub(super) fn matrix(t: &Held, unpack: Option<usize>) -> Vec<Vec<u32>> {
    matrix_of(t, unpack, 4)
}

/// The values of a 2-D tensor as a matrix of elements: int32 words split into their
/// `bits`-bit values along `unpack` (0: rows, 1: columns), other dtypes element by element.
pub(super) fn matrix_of(t: &Held, unpack: Option<usize>, bits: u64) -> Vec<Vec<u32>> {
    let per = 32 / bits;
    let mask = (1u32 << bits) - 1;
    let bits = bits as u32;
    let [rows, cols] = t.shape[..] else {
        panic!("a 2-D tensor, got {:?}", t.shape)
    };
    let el = t.data.len() / (rows * cols) as usize;
    let at = |r: u64, c: u64| {
        let o = (r * cols + c) as usize * el;
        let mut b = [0u8; 4];
        b[..el].copy_from_slice(&t.data[o..o + el]);
        u32::from_le_bytes(b)
    };
    match unpack {
        None => (0..rows)
            .map(|r| (0..cols).map(|c| at(r, c)).collect())
            .collect(),
        Some(0) => (0..rows * per)
            .map(|r| {
                (0..cols)
                    .map(|c| (at(r / per, c) >> (bits * (r % per) as u32)) & mask)
                    .collect()
            })
            .collect(),
        Some(_) => (0..rows)
            .map(|r| {
                (0..cols * per)
                    .map(|c| (at(r, c / per) >> (bits * (c % per) as u32)) & mask)
                    .collect()
            })
            .collect(),
    }
}

/// Columns `[from, to)` of every row.
pub(super) fn cols(m: &[Vec<u32>], from: usize, to: usize) -> Vec<Vec<u32>> {
    m.iter().map(|r| r[from..to].to_vec()).collect()
}

/// `b`'s columns after `a`'s, row by row.
pub(super) fn hcat(a: &mut Vec<Vec<u32>>, b: Vec<Vec<u32>>) {
    if a.is_empty() {
        *a = b;
    } else {
        a.iter_mut().zip(b).for_each(|(x, y)| x.extend(y));
    }
}

/// Rank `r`'s tensor names in state_dict order, as `plan --json` lists them (the files hold
/// them sorted, as safetensors saves them).
pub(super) fn plan_order(src: &Path, args: &[&str], r: usize) -> Vec<String> {
    let plan = clean_plan_json(src, args);
    (plan["ranks"][r]["tensors"]
        .as_array()
        .expect("tensors")
        .iter())
    .map(|t| t["name"].as_str().unwrap().to_string())
    .collect()
}

/// Shards `src` at `tp` (with `extra` flags) into a fresh folder.
pub(super) fn sharded(src: &Path, tp: u64, extra: &[&str]) -> TempDir {
    let out = TempDir::new().unwrap();
    let dir = out.path().join("out");
    shard_ok(src, tp, &dir, extra);
    out
}
