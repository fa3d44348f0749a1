//! gpt-oss MXFP4 (`quant_method: mxfp4`): the unpadded default against vLLM's padded golden
//! state, the packed experts reassembled from every rank at several TP sizes and with expert
//! parallelism (uneven cdiv splits and an empty rank included), and the refusals.

use std::path::Path;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::*;

const GOLDEN: &str = "gpt_oss_mxfp4";
const ROUTED: &str = "mlp.experts.routed_experts";
const PARTS: [&str; 6] = [
    "w13_weight",
    "w13_weight_scale",
    "w2_weight",
    "w2_weight_scale",
    "w13_bias",
    "w2_bias",
];

fn el_size(dtype: &str) -> usize {
    match dtype {
        "U8" => 1,
        "BF16" => 2,
        other => panic!("unexpected dtype {other}"),
    }
}

/// The leading corner `lead` of `t` (same rank), asserting every byte outside it is zero.
fn corner(t: &Held, lead: &[u64], ctx: &str) -> Held {
    assert_eq!(t.shape.len(), lead.len(), "{ctx}");
    assert!(
        t.shape.iter().zip(lead).all(|(s, l)| l <= s),
        "{ctx}: {:?} in {:?}",
        lead,
        t.shape
    );
    let el = el_size(&t.dtype);
    let mut data = Vec::new();
    let n: u64 = t.shape.iter().product();
    for flat in 0..n {
        let mut rest = flat;
        let mut inside = true;
        for (d, &s) in t.shape.iter().enumerate().rev() {
            inside &= rest % s < lead[d];
            rest /= s;
        }
        let bytes = &t.data[flat as usize * el..(flat as usize + 1) * el];
        if inside {
            data.extend_from_slice(bytes);
        } else {
            assert!(
                bytes.iter().all(|&b| b == 0),
                "{ctx}: padding at element {flat} is not zero"
            );
        }
    }
    Held {
        dtype: t.dtype.clone(),
        shape: lead.to_vec(),
        data,
    }
}

/// OUT's wload.json.
fn manifest(out: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(out.join("wload.json")).unwrap()).unwrap()
}

/// Without `--moe-backend` every rank holds the real slices; vLLM's padded state (TRITON) is
/// those slices in the leading corner and zeros after. Everything else is byte for byte vLLM's.
#[test]
fn unpadded_output_is_the_leading_corner_of_vllms_padded_state() {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(&fixture(GOLDEN), 2, &out, &["-q"]);
    for r in 0..2u64 {
        let got = rank_tensors(&out, r);
        let want = rank_tensors(&expected(GOLDEN, 2), r);
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "rank {r}"
        );
        for (name, w) in &want {
            let g = &got[name];
            let ctx = format!("rank {r} {name}");
            assert_eq!(g.dtype, w.dtype, "{ctx}");
            if name.contains(ROUTED) {
                assert_eq!(&corner(w, &g.shape, &ctx), g, "{ctx}");
            } else {
                assert_eq!(g, w, "{ctx}");
            }
        }
        // tp 2 of I 224 (7 blocks): rank 0 holds 4 blocks, rank 1 three.
        let rows = [256, 192][r as usize];
        let w13 = &got[&format!("model.layers.0.{ROUTED}.w13_weight")];
        assert_eq!(w13.shape, [4, rows, 96], "rank {r}");
    }
    let m = manifest(&out);
    assert!(m.get("moe_backend").is_none(), "{m:#}");
    let serve = m["serve"]["argv"].as_array().unwrap();
    assert!(!serve.contains(&json!("--moe-backend")), "{serve:?}");
}

/// Padded for a backend, the manifest and the serve line say which: vLLM must pick it too.
#[test]
fn a_padded_output_records_its_backend_in_the_manifest_and_the_serve_line() {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(
        &fixture(GOLDEN),
        2,
        &out,
        &["-q", "--moe-backend", "triton"],
    );
    let m = manifest(&out);
    assert_eq!(m["moe_backend"], "triton", "{m:#}");
    let argv: Vec<&str> = m["serve"]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let at = argv
        .iter()
        .position(|a| *a == "--moe-backend")
        .expect("--moe-backend");
    assert_eq!(argv[at + 1], "triton", "{argv:?}");
    // `load` of the folder takes the backend from wload.json, so its shapes check out.
    let load = wload()
        .args(["load", s(&out), "--dry-run"])
        .output()
        .unwrap();
    assert!(load.status.success(), "{}", context(&load));
    assert!(
        stderr(&load).contains("--moe-backend triton")
            || stdout(&load).contains("--moe-backend triton"),
        "{}",
        context(&load)
    );
}

/// A small gpt-oss MXFP4 checkpoint of intermediate size `i` (480 = 15 blocks: uneven cdiv at
/// tp 2, 4 and 8; 224 = 7 blocks: rank 7 of 8 empty), H 64, 8 experts, one layer, every byte
/// distinct by position.
fn mxfp4_checkpoint(dir: &Path, i: u64) {
    let (h, e, heads, hd, v) = (64u64, 8u64, 24u64, 8u64, 384u64);
    let mut cfg = read_config(&fixture(GOLDEN));
    for (k, val) in [
        ("hidden_size", json!(h)),
        ("intermediate_size", json!(i)),
        ("num_local_experts", json!(e)),
        ("num_attention_heads", json!(heads)),
        ("num_key_value_heads", json!(heads)),
        ("head_dim", json!(hd)),
        ("num_hidden_layers", json!(1)),
        ("vocab_size", json!(v)),
        ("layer_types", json!(["full_attention"])),
    ] {
        cfg.insert(k.into(), val);
    }
    write_config(dir, cfg);
    let l = "model.layers.0";
    let bf16: Vec<(String, Vec<u64>)> = [
        ("lm_head.weight".to_string(), vec![v, h]),
        ("model.embed_tokens.weight".into(), vec![v, h]),
        ("model.norm.weight".into(), vec![h]),
        (format!("{l}.input_layernorm.weight"), vec![h]),
        (format!("{l}.post_attention_layernorm.weight"), vec![h]),
        (format!("{l}.self_attn.sinks"), vec![heads]),
        (format!("{l}.self_attn.o_proj.weight"), vec![h, heads * hd]),
        (format!("{l}.self_attn.o_proj.bias"), vec![h]),
        (format!("{l}.mlp.router.weight"), vec![e, h]),
        (format!("{l}.mlp.router.bias"), vec![e]),
        (format!("{l}.mlp.experts.gate_up_proj_bias"), vec![e, 2 * i]),
        (format!("{l}.mlp.experts.down_proj_bias"), vec![e, h]),
    ]
    .into_iter()
    .chain(["q", "k", "v"].into_iter().flat_map(|p| {
        [
            (
                format!("{l}.self_attn.{p}_proj.weight"),
                vec![heads * hd, h],
            ),
            (format!("{l}.self_attn.{p}_proj.bias"), vec![heads * hd]),
        ]
    }))
    .collect();
    let u8s: Vec<(String, Vec<u64>)> = vec![
        (
            format!("{l}.mlp.experts.gate_up_proj_blocks"),
            vec![e, 2 * i, h / 32, 16],
        ),
        (
            format!("{l}.mlp.experts.gate_up_proj_scales"),
            vec![e, 2 * i, h / 32],
        ),
        (
            format!("{l}.mlp.experts.down_proj_blocks"),
            vec![e, h, i / 32, 16],
        ),
        (
            format!("{l}.mlp.experts.down_proj_scales"),
            vec![e, h, i / 32],
        ),
    ];
    let data: Vec<(String, &'static str, Vec<u64>, Vec<u8>)> = bf16
        .into_iter()
        .enumerate()
        .map(|(t, (n, s))| {
            let d = bf16_data(t as u64, s.iter().product::<u64>() as usize);
            (n, "BF16", s, d)
        })
        .chain(u8s.into_iter().enumerate().map(|(t, (n, s))| {
            let d = (0..s.iter().product::<u64>())
                .map(|k| mix((100 + t as u64) << 32 | k) as u8)
                .collect();
            (n, "U8", s, d)
        }))
        .collect();
    let tensors: Vec<Tensor> = data
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
}

/// E2M1 nibbles as values, two a byte (low nibble first, as the kernels read them).
fn unpack(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().flat_map(|b| [b & 0xF, b >> 4]).collect()
}

/// `parts` (same dtype, same leading dims) concatenated along `dim`.
fn cat(parts: &[Held], dim: usize) -> Held {
    let el = el_size(&parts[0].dtype);
    let outer: u64 = parts[0].shape[..dim].iter().product();
    let mut data = Vec::new();
    for o in 0..outer as usize {
        for p in parts {
            let inner = p.shape[dim..].iter().product::<u64>() as usize * el;
            data.extend_from_slice(&p.data[o * inner..(o + 1) * inner]);
        }
    }
    let mut shape = parts[0].shape.clone();
    shape[dim] = parts.iter().map(|p| p.shape[dim]).sum();
    Held {
        dtype: parts[0].dtype.clone(),
        shape,
        data,
    }
}

/// The real rows of rank `r` of `tp` (`cdiv(I/32, tp)` blocks each, the last ranks short or empty).
fn real_rows(i: u64, tp: u64, r: u64) -> u64 {
    let per = (i / 32).div_ceil(tp) * 32;
    let start = (r * per).min(i);
    (start + per).min(i) - start
}

/// Every rank's expert tensors, padding stripped (checked zero), unpacked and put back together,
/// are the checkpoint's: TP 1, 2, 3, 4, 8 and EP 2, 4, 8, unpadded and padded for two backends.
#[test]
fn every_ranks_experts_reassemble_into_the_checkpoint() {
    let runs: Vec<(u64, bool, &[&str])> = [1, 2, 3, 4, 8]
        .into_iter()
        .flat_map(|tp| {
            [
                (tp, false, &[][..]),
                (tp, false, &["--moe-backend", "marlin"][..]),
            ]
        })
        .chain([2, 4, 8].map(|tp| (tp, true, &[][..])))
        .chain([
            (2, false, &["--moe-backend", "triton"][..]),
            (4, true, &["--moe-backend", "flashinfer-cutlass"][..]),
        ])
        .collect();
    reassemble(480, &runs);
}

/// With 7 blocks over 8 ranks the last rank starts past I: it holds one block of zeros
/// unpadded (every key present), zeros only padded, and the others still add up.
#[test]
fn a_rank_past_the_last_block_holds_only_zeros() {
    reassemble(
        224,
        &[
            (8, false, &[][..]),
            (8, false, &["--moe-backend", "triton"][..]),
        ],
    );
}

/// Shards a checkpoint of intermediate size `i` with each of `runs` (tp, ep, flags) and checks
/// that the ranks' experts reassemble into it.
fn reassemble(i: u64, runs: &[(u64, bool, &[&str])]) {
    let (h, e) = (64u64, 8u64);
    let src = TempDir::new().unwrap();
    mxfp4_checkpoint(src.path(), i);
    let ckpt = checkpoint_tensors(src.path());
    let x = |p: &str| ckpt[&format!("model.layers.0.mlp.experts.{p}")].clone();
    // The checkpoint's blocks viewed as vLLM views them: [E, 2I, H/2] and [E, H, I/2].
    let view = |t: Held, shape: Vec<u64>| Held { shape, ..t };
    let want = [
        view(x("gate_up_proj_blocks"), vec![e, 2 * i, h / 2]),
        x("gate_up_proj_scales"),
        view(x("down_proj_blocks"), vec![e, h, i / 2]),
        x("down_proj_scales"),
        x("gate_up_proj_bias"),
        x("down_proj_bias"),
    ];
    for &(tp, ep, extra) in runs {
        let ctx = format!("tp {tp} ep {ep} {extra:?}");
        let tmp = TempDir::new().unwrap();
        let out = tmp.path().join("out");
        let mut args = vec!["-q"];
        args.extend(extra);
        if ep {
            args.push("--enable-expert-parallel");
        }
        shard_ok(src.path(), tp, &out, &args);
        let ranks: Vec<_> = (0..tp).map(|r| rank_tensors(&out, r)).collect();
        for (k, part) in PARTS.iter().enumerate() {
            let real: Vec<Held> = (0..tp)
                .map(|r| {
                    let t = &ranks[r as usize][&format!("model.layers.0.{ROUTED}.{part}")];
                    let (el, rows) = if ep {
                        (e / tp, i)
                    } else {
                        (e, real_rows(i, tp, r))
                    };
                    let lead = match *part {
                        "w13_weight" => vec![el, 2 * rows, h / 2],
                        "w13_weight_scale" => vec![el, 2 * rows, h / 32],
                        "w2_weight" => vec![el, h, rows / 2],
                        "w2_weight_scale" => vec![el, h, rows / 32],
                        "w13_bias" => vec![el, 2 * rows],
                        _ => vec![el, h],
                    };
                    corner(t, &lead, &format!("{ctx} rank {r} {part}"))
                })
                .collect();
            let got = match (*part, ep) {
                (_, true) => cat(&real, 0),
                // The down bias is rank 0's; the others hold zeros (the all-reduce adds it once).
                ("w2_bias", false) => {
                    assert!(
                        real[1..].iter().all(|t| t.data.iter().all(|&b| b == 0)),
                        "{ctx}"
                    );
                    real[0].clone()
                }
                ("w13_weight" | "w13_weight_scale" | "w13_bias", false) => cat(&real, 1),
                _ => cat(&real, 2),
            };
            assert_eq!(got.shape, want[k].shape, "{ctx} {part}");
            assert_eq!(got.dtype, want[k].dtype, "{ctx} {part}");
            if part.ends_with("_weight") {
                assert!(
                    unpack(&got.data) == unpack(&want[k].data),
                    "{ctx} {part}: values differ"
                );
            } else {
                assert!(got.data == want[k].data, "{ctx} {part}: bytes differ");
            }
        }
    }
}

/// `mxfp4` on a model other than gpt-oss, a hidden size that is not whole blocks, a backend
/// wload does not know, and `--moe-backend` on a checkpoint without MXFP4 experts are refused
/// with the field, the rule and the fix.
#[test]
fn mxfp4_refusals_name_the_field_the_rule_and_the_fix() {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    let not_gpt_oss = fixture_with(GOLDEN, |c| {
        c.insert("model_type".into(), json!("deepseek_v4"));
    });
    let run = shard(not_gpt_oss.path(), 2, &out, &["-q"]);
    assert_refusal_text(
        &run,
        3,
        &[
            "quant_method = \"mxfp4\"",
            "\"deepseek_v4\"",
            "Mxfp4MoEMethod",
            "bf16 release",
        ],
    );
    let unknown = shard(&fixture(GOLDEN), 2, &out, &["-q", "--moe-backend", "cuda"]);
    assert_refusal_text(&unknown, 2, &["'cuda'", "--moe-backend", "triton, marlin"]);
    let bf16 = shard(
        &fixture("gpt_oss"),
        2,
        &out,
        &["-q", "--moe-backend", "triton"],
    );
    assert_refusal_text(
        &bf16,
        3,
        &[
            "--moe-backend triton",
            "only for MXFP4",
            "leave out --moe-backend",
        ],
    );
    let src = TempDir::new().unwrap();
    mxfp4_checkpoint(src.path(), 480);
    // Expert parallelism hands every rank E / tp experts, with no remainder handling.
    let run = shard(src.path(), 3, &out, &["-q", "--enable-expert-parallel"]);
    assert_refusal_text(
        &run,
        3,
        &[
            "routed_experts.w13_weight: number of experts (8) is not divisible by tp (3)",
            "choose another --tp",
        ],
    );
    let mut cfg = read_config(src.path());
    cfg.insert("intermediate_size".into(), Value::from(488));
    write_config(src.path(), cfg);
    let run = shard(src.path(), 2, &out, &["-q"]);
    assert_refusal_text(
        &run,
        3,
        &["intermediate_size (488) is not a multiple of the MXFP4 block size 32"],
    );
    // An NVFP4-only name: vLLM takes it for MXFP4 too, but wload does not know its padding.
    let humming = shard(
        &fixture(GOLDEN),
        2,
        &out,
        &["-q", "--moe-backend", "humming"],
    );
    assert_refusal_text(
        &humming,
        3,
        &["--moe-backend humming", "pads MXFP4", "triton, marlin"],
    );
}
