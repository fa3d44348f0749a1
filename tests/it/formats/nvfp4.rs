//! ModelOpt NVFP4: every rank's packed weights, unpacked to FP4 codes and put back together, are
//! the checkpoint's, at every TP size (fused qkv and gate/up, kv heads replicated at TP 8, the
//! packed input split of row-parallel layers); global scales per part; experts under TP, refused
//! under EP with the reason; ModelOpt algorithms wload does not write refused by name.

use std::path::Path;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::{
    Held, Tensors, assert_refused, copy_fixture, fixture, rank_tensors, read_files, s, shard,
    shard_ok, write_json, write_safetensors,
};

const FIXTURE: &str = "llama_gqa_modelopt_nvfp4";

/// A U8 matrix `[rows, bytes]` as its FP4 codes `[rows, 2·bytes]`, low nibble first.
fn codes(t: &Held) -> Vec<Vec<u8>> {
    let cols = t.shape[1] as usize;
    t.data
        .chunks(cols)
        .map(|r| r.iter().flat_map(|b| [b & 0xF, b >> 4]).collect())
        .collect()
}

/// Rows of a byte matrix (F8_E4M3 scales are one byte each).
fn byte_rows(t: &Held) -> Vec<Vec<u8>> {
    t.data
        .chunks(t.shape[1] as usize)
        .map(<[u8]>::to_vec)
        .collect()
}

/// The global rows `[at, at + n)` from every rank's `rows`, checking that ranks holding the same
/// rows (replicated kv heads) agree.
fn gather_rows(parts: &[(usize, Vec<Vec<u8>>)], total: usize) -> Vec<Vec<u8>> {
    let mut out: Vec<Option<Vec<u8>>> = vec![None; total];
    for (at, rows) in parts {
        for (i, r) in rows.iter().enumerate() {
            match &out[at + i] {
                Some(prev) => assert_eq!(prev, r, "replicas of row {} differ", at + i),
                None => out[at + i] = Some(r.clone()),
            }
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|| panic!("row {i} on no rank")))
        .collect()
}

/// Which rows of q, k and v rank `r` holds: (q offset, k/v offset, q rows, k/v rows).
fn qkv_rows(tp: usize, r: usize, [heads, kv, hd]: [usize; 3]) -> (usize, usize, usize, usize) {
    let q = heads / tp * hd;
    let (kv_local, replicas) = if tp >= kv { (1, tp / kv) } else { (kv / tp, 1) };
    let k = kv_local * hd;
    (r * q, (r / replicas) * k, q, k)
}

/// Reassembles one fused column-parallel tensor per part from all ranks: `split` gives rank `r`'s
/// (offset in the part, rows) for each part, in the order the rank holds them.
fn column_parts(
    ranks: &[Tensors],
    name: &str,
    unpack: fn(&Held) -> Vec<Vec<u8>>,
    parts: &[usize],
    split: &dyn Fn(usize) -> Vec<(usize, usize)>,
) -> Vec<Vec<Vec<u8>>> {
    (0..parts.len())
        .map(|k| {
            let pieces: Vec<(usize, Vec<Vec<u8>>)> = ranks
                .iter()
                .enumerate()
                .map(|(r, t)| {
                    let rows = unpack(&t[name]);
                    let spans = split(r);
                    let start: usize = spans[..k].iter().map(|s| s.1).sum();
                    (spans[k].0, rows[start..start + spans[k].1].to_vec())
                })
                .collect();
            gather_rows(&pieces, parts[k])
        })
        .collect()
}

/// A row-parallel tensor from all ranks: each rank's columns side by side.
fn row_parallel(ranks: &[Tensors], name: &str, unpack: fn(&Held) -> Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let per_rank: Vec<Vec<Vec<u8>>> = ranks.iter().map(|t| unpack(&t[name])).collect();
    (0..per_rank[0].len())
        .map(|i| per_rank.iter().flat_map(|m| m[i].clone()).collect())
        .collect()
}

#[test]
fn unpacked_ranks_put_back_together_are_the_checkpoint_at_every_tp() {
    let source = fixture(FIXTURE);
    let ck = read_files(&[source.join("model.safetensors")]);
    let [heads, kv, hd] = [8, 4, 16];
    for tp in [1usize, 2, 4, 8] {
        let out = TempDir::new().unwrap();
        shard_ok(&source, tp as u64, out.path(), &[]);
        let ranks: Vec<Tensors> = (0..tp as u64)
            .map(|r| rank_tensors(out.path(), r))
            .collect();
        for layer in 0..2 {
            let l = format!("model.layers.{layer}");
            for (suffix, unpack) in [
                ("weight", codes as fn(&Held) -> Vec<Vec<u8>>),
                ("weight_scale", byte_rows),
            ] {
                let qkv = column_parts(
                    &ranks,
                    &format!("{l}.self_attn.qkv_proj.{suffix}"),
                    unpack,
                    &[heads * hd, kv * hd, kv * hd],
                    &|r| {
                        let (qa, ka, q, k) = qkv_rows(tp, r, [heads, kv, hd]);
                        vec![(qa, q), (ka, k), (ka, k)]
                    },
                );
                for (part, proj) in qkv.iter().zip(["q_proj", "k_proj", "v_proj"]) {
                    let want = unpack(&ck[&format!("{l}.self_attn.{proj}.{suffix}")]);
                    assert_eq!(part, &want, "tp{tp} {l} {proj}.{suffix}");
                }
                let i = 256 / tp;
                let gate_up = column_parts(
                    &ranks,
                    &format!("{l}.mlp.gate_up_proj.{suffix}"),
                    unpack,
                    &[256, 256],
                    &|r| vec![(r * i, i), (r * i, i)],
                );
                for (part, proj) in gate_up.iter().zip(["gate_proj", "up_proj"]) {
                    let want = unpack(&ck[&format!("{l}.mlp.{proj}.{suffix}")]);
                    assert_eq!(part, &want, "tp{tp} {l} {proj}.{suffix}");
                }
                for row in ["self_attn.o_proj", "mlp.down_proj"] {
                    let got = row_parallel(&ranks, &format!("{l}.{row}.{suffix}"), unpack);
                    let want = unpack(&ck[&format!("{l}.{row}.{suffix}")]);
                    assert_eq!(got, want, "tp{tp} {l} {row}.{suffix}");
                }
            }
            // One F32 global scale per part, the checkpoint's, on every rank.
            for (fused, parts) in [
                (
                    "self_attn.qkv_proj",
                    &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"][..],
                ),
                ("mlp.gate_up_proj", &["mlp.gate_proj", "mlp.up_proj"][..]),
                ("self_attn.o_proj", &["self_attn.o_proj"][..]),
            ] {
                for scale in ["weight_scale_2", "input_scale"] {
                    let want: Vec<u8> = (parts.iter())
                        .flat_map(|p| ck[&format!("{l}.{p}.{scale}")].data.clone())
                        .collect();
                    for (r, t) in ranks.iter().enumerate() {
                        let got = &t[&format!("{l}.{fused}.{scale}")];
                        assert_eq!(
                            (got.dtype.as_str(), &got.shape, &got.data),
                            ("F32", &vec![parts.len() as u64], &want),
                            "tp{tp} rank {r} {l}.{fused}.{scale}"
                        );
                    }
                }
            }
        }
    }
}

/// A row-parallel layer whose input per rank is not a multiple of 16 is refused as vLLM refuses it.
#[test]
fn an_input_split_off_the_16_grid_is_refused_naming_the_layer_and_the_fix() {
    let src = copy_fixture(FIXTURE);
    let out = TempDir::new().unwrap();
    // o_proj's input 128 at tp 16 would leave 8 per rank (and 8 heads do not split 16 ways:
    // both are reported).
    let o = shard(src.path(), 16, &out.path().join("o"), &[]);
    let text = assert_refused(
        &o,
        3,
        &[
            "model.layers.0.self_attn.o_proj",
            "not multiple of 16",
            "per rank at tp 16: 8",
        ],
    );
    assert!(text.contains("use a TP size"), "{text}");
}

#[test]
fn other_modelopt_algorithms_are_refused_by_name_with_the_fix() {
    let src = copy_fixture(FIXTURE);
    let path = src.path().join("hf_quant_config.json");
    let mut qc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    qc["quantization"]["quant_algo"] = json!("FP8");
    write_json(&path, &qc);
    let out = TempDir::new().unwrap();
    let o = shard(src.path(), 2, &out.path().join("o"), &[]);
    let text = assert_refused(&o, 3, &["quant_algo \"FP8\" is not supported", "NVFP4"]);
    assert!(!out.path().join("o").exists(), "{text}");
}

/// A one-layer Qwen3-MoE in ModelOpt NVFP4 with 4 experts (hidden 64, expert intermediate 64),
/// attention and router unquantized by `exclude_modules`.
fn nvfp4_moe(dir: &Path) {
    let (h, i, e) = (64u64, 64u64, 4u64);
    write_json(
        &dir.join("config.json"),
        &json!({
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": h, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "num_experts": e, "num_experts_per_tok": 2, "moe_intermediate_size": i,
            "intermediate_size": 128, "vocab_size": 64, "num_hidden_layers": 1,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "dtype": "bfloat16"
        }),
    );
    write_json(
        &dir.join("hf_quant_config.json"),
        &json!({"producer": {"name": "modelopt", "version": "0.23.0"},
                "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
                                 "exclude_modules": ["lm_head", "model.layers.0.self_attn*", "model.layers.0.mlp.gate"]}}),
    );
    let mut specs: Vec<(String, &str, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), "BF16", vec![64, h]),
        ("model.norm.weight".into(), "BF16", vec![h]),
        ("lm_head.weight".into(), "BF16", vec![64, h]),
    ];
    let l = "model.layers.0";
    for (p, n) in [("q_proj", 64), ("k_proj", 32), ("v_proj", 32)] {
        specs.push((format!("{l}.self_attn.{p}.weight"), "BF16", vec![n, h]));
    }
    specs.push((format!("{l}.self_attn.o_proj.weight"), "BF16", vec![h, 64]));
    specs.push((format!("{l}.self_attn.q_norm.weight"), "BF16", vec![16]));
    specs.push((format!("{l}.self_attn.k_norm.weight"), "BF16", vec![16]));
    specs.push((format!("{l}.mlp.gate.weight"), "BF16", vec![e, h]));
    specs.push((format!("{l}.input_layernorm.weight"), "BF16", vec![h]));
    specs.push((
        format!("{l}.post_attention_layernorm.weight"),
        "BF16",
        vec![h],
    ));
    for x in 0..e {
        let p = format!("{l}.mlp.experts.{x}");
        for (proj, n, k) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)] {
            specs.push((format!("{p}.{proj}.weight"), "U8", vec![n, k / 2]));
            specs.push((
                format!("{p}.{proj}.weight_scale"),
                "F8_E4M3",
                vec![n, k / 16],
            ));
            specs.push((format!("{p}.{proj}.weight_scale_2"), "F32", vec![]));
            specs.push((format!("{p}.{proj}.input_scale"), "F32", vec![]));
        }
    }
    let datas: Vec<Vec<u8>> = (specs.iter().enumerate())
        .map(|(k, (_, d, sh))| {
            let width = if *d == "BF16" || *d == "F32" {
                if *d == "F32" { 4 } else { 2 }
            } else {
                1
            };
            let n = sh.iter().product::<u64>().max(1) as usize * width;
            (0..n)
                .map(|b| ((b * 31 + k * 7) % 251) as u8 & 0x77)
                .collect()
        })
        .collect();
    let tensors: Vec<_> = (specs.iter().zip(&datas))
        .map(|((n, d, sh), data)| (n.as_str(), *d, sh.as_slice(), data.as_slice()))
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
}

#[test]
fn nvfp4_experts_split_under_tp_and_are_refused_under_ep_with_the_reason() {
    let src = TempDir::new().unwrap();
    nvfp4_moe(src.path());
    let ck = read_files(&[src.path().join("model.safetensors")]);
    let out = TempDir::new().unwrap();
    shard_ok(src.path(), 2, out.path(), &[]);
    let base = "model.layers.0.mlp.experts.routed_experts";
    let x = "model.layers.0.mlp.experts";
    for r in 0..2u64 {
        let t = rank_tensors(out.path(), r);
        let shape = |n: &str| {
            (
                t[&format!("{base}.{n}")].dtype.clone(),
                t[&format!("{base}.{n}")].shape.clone(),
            )
        };
        for (n, d, sh) in [
            ("w13_weight", "U8", vec![4, 64, 32]),
            ("w2_weight", "U8", vec![4, 64, 16]),
            ("w13_weight_scale", "F8_E4M3", vec![4, 64, 4]),
            ("w2_weight_scale", "F8_E4M3", vec![4, 64, 2]),
            ("w13_weight_scale_2", "F32", vec![4, 2]),
            ("w2_weight_scale_2", "F32", vec![4]),
            ("w13_input_scale", "F32", vec![4, 2]),
            ("w2_input_scale", "F32", vec![4]),
        ] {
            assert_eq!(shape(n), (d.to_string(), sh), "rank {r} {n}");
        }
        // Expert 3's rows: gate then up, this rank's half of each; its down_proj packed columns.
        let w13 = &t[&format!("{base}.w13_weight")];
        let expert = w13.data.len() / 4;
        let e3 = &w13.data[3 * expert..4 * expert];
        let gate = &ck[&format!("{x}.3.gate_proj.weight")];
        let up = &ck[&format!("{x}.3.up_proj.weight")];
        let half = |m: &Held| m.rows(32 * r as usize, 32 * (r as usize + 1)).to_vec();
        assert_eq!(e3, [half(gate), half(up)].concat(), "rank {r} expert 3 w13");
        let w2 = &t[&format!("{base}.w2_weight")];
        let e3 = w2.data[3 * w2.data.len() / 4..].to_vec();
        let down = &ck[&format!("{x}.3.down_proj.weight")];
        assert_eq!(
            e3,
            down.cols(16 * r as usize, 16 * (r as usize + 1)),
            "rank {r} expert 3 w2"
        );
        let s2 = &t[&format!("{base}.w13_weight_scale_2")];
        let want = [
            ck[&format!("{x}.2.gate_proj.weight_scale_2")].data.clone(),
            ck[&format!("{x}.2.up_proj.weight_scale_2")].data.clone(),
        ]
        .concat();
        assert_eq!(
            &s2.data[16..24],
            &want[..],
            "rank {r} expert 2 [gate, up] global scales"
        );
    }
    let o = shard(
        src.path(),
        2,
        &out.path().join("ep"),
        &["--enable-expert-parallel"],
    );
    let text = assert_refused(
        &o,
        3,
        &["w13_weight", "expert parallelism", "FlashInfer", "MARLIN"],
    );
    assert!(text.contains("without --enable-expert-parallel"), "{text}");
    assert!(!Path::new(s(&out.path().join("ep"))).exists());
}
