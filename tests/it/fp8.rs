//! FP8 checkpoints (`quant_method: fp8` and compressed-tensors FP8), checked by what a user relies
//! on rather than by wload's own formulas: every rank's FP8 weight, dequantized with that rank's
//! scales by an independent E4M3 decoder, is the bf16 weight real vLLM put on that rank of the
//! unquantized fixture (to within FP8 rounding); checkpoint kv scales land on the attention layer;
//! MoE expert scales (per-tensor Mixtral, block Qwen3-MoE under EP) and fused-on-disk scales sit
//! where vLLM's loaders put them; variants vLLM loads to the same state shard to the same bytes;
//! and what vLLM cannot load (unaligned blocks, half-quantized fused layers, missing or
//! unquantized tensors) or wload does not write (other quantization methods) is refused with
//! exit 3 before anything is written. The TP 2 golden cases (byte-identical to vLLM) run with the
//! other golden cases.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use serde_json::{Value, json};
use tempfile::TempDir;
use xxhash_rust::xxh3::xxh3_64;

use crate::support::*;

// ---------------------------------------------------------------------------------------------
// Reading tensors and FP8 values
// ---------------------------------------------------------------------------------------------

/// The tensors of one safetensors file, in header order.
fn file_tensors(path: &Path) -> Vec<(String, Held)> {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let base = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    header_tensors(path)
        .into_iter()
        .map(|t| {
            let data = bytes[base + t.start as usize..base + t.end as usize].to_vec();
            let held = Held {
                dtype: t.dtype,
                shape: t.shape,
                data,
            };
            (t.name, held)
        })
        .collect()
}

/// One FP8 E4M3 ("fn": no infinities, S.1111.111 is NaN) byte, decoded exactly: bias 7,
/// subnormals m/8·2^-6.
fn e4m3(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((b >> 3) & 0x0f);
    let man = f32::from(b & 0x07);
    if exp == 0x0f && b & 0x07 == 7 {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        man / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    };
    sign * mag
}

/// A tensor's elements as f32 (F8_E4M3, BF16 and F32, the dtypes these checkpoints hold).
fn values(t: &Held) -> Vec<f32> {
    match t.dtype.as_str() {
        "F8_E4M3" => t.data.iter().map(|&b| e4m3(b)).collect(),
        "BF16" => t
            .data
            .chunks_exact(2)
            .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
            .collect(),
        "F32" => t
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        other => panic!("no decoder for {other}"),
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn e4m3_decoder_knows_the_format() {
    // Values from the OCP FP8 spec (E4M3): max normal 448, min normal 2^-6, min subnormal 2^-9.
    for (byte, want) in [
        (0x00, 0.0),
        (0x38, 1.0),
        (0xb8, -1.0),
        (0x7e, 448.0),
        (0xfe, -448.0),
        (0x08, 2f32.powi(-6)),
        (0x01, 2f32.powi(-9)),
        (0x07, 7.0 * 2f32.powi(-9)),
        (0x3c, 1.5),
        (0x50, 8.0),
    ] {
        assert_eq!(e4m3(byte), want, "byte {byte:#04x}");
    }
    assert!(e4m3(0x7f).is_nan() && e4m3(0xff).is_nan());
}

// ---------------------------------------------------------------------------------------------
// 1. Dequantization matches vLLM's bf16 shards at every TP size
// ---------------------------------------------------------------------------------------------

/// How the fixture's weights carry their scales.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scheme {
    /// `weight_scale` (and static `input_scale`) F32 `[slots]`: one per logical shard.
    PerTensor,
    /// compressed-tensors channel: `weight_scale` F32 `[rows, 1]`.
    Channel,
    /// `weight_scale_inv` F32, one per 32×32 block.
    Block,
}

const BLOCK: usize = 32;

/// The FP8 linears of each llama_gqa layer as vLLM fuses them.
const MODULES: [&str; 4] = [
    "self_attn.qkv_proj",
    "self_attn.o_proj",
    "mlp.gate_up_proj",
    "mlp.down_proj",
];

/// Rows of each logical shard of `module` on one rank of llama_gqa (8 heads, 4 KV heads, head_dim
/// 16, intermediate 256) at `tp`: vLLM's partition sizes, which KV replication at TP 8 keeps at one
/// head.
fn slot_rows(module: &str, tp: u64, rows: usize) -> Vec<usize> {
    let tp = tp as usize;
    if module.ends_with("qkv_proj") {
        let kv = 16 * (4 / tp).max(1);
        vec![128 / tp, kv, kv]
    } else if module.ends_with("gate_up_proj") {
        vec![256 / tp; 2]
    } else {
        vec![rows]
    }
}

/// The scale tensor's name for `module` under `scheme`.
fn scale_name(module: &str, scheme: Scheme) -> String {
    match scheme {
        Scheme::Block => format!("{module}.weight_scale_inv"),
        _ => format!("{module}.weight_scale"),
    }
}

/// `module`'s FP8 weight on this rank, dequantized with the rank's scales: (value, scale) per
/// element, row-major.
fn dequantize(rank: &Tensors, module: &str, scheme: Scheme, tp: u64) -> Vec<(f32, f32)> {
    let w = &rank[&format!("{module}.weight")];
    assert_eq!(w.dtype, "F8_E4M3", "{module}.weight");
    let (rows, cols) = (w.shape[0] as usize, w.shape[1] as usize);
    let sname = scale_name(module, scheme);
    let st = rank
        .get(&sname)
        .unwrap_or_else(|| panic!("no '{sname}' on this rank"));
    assert_eq!(st.dtype, "F32", "{sname}");
    let s = values(st);
    let scale_of: Box<dyn Fn(usize, usize) -> f32> = match scheme {
        Scheme::PerTensor => {
            let slots = slot_rows(module, tp, rows);
            assert_eq!(slots.iter().sum::<usize>(), rows, "{module}: rows per slot");
            assert_eq!(st.shape, [slots.len() as u64], "{sname}");
            let slot: Vec<usize> = slots
                .iter()
                .enumerate()
                .flat_map(|(k, &n)| std::iter::repeat_n(k, n))
                .collect();
            Box::new(move |i, _| s[slot[i]])
        }
        Scheme::Channel => {
            assert_eq!(st.shape, [rows as u64, 1], "{sname}");
            Box::new(move |i, _| s[i])
        }
        Scheme::Block => {
            let (br, bc) = (rows.div_ceil(BLOCK), cols.div_ceil(BLOCK));
            assert_eq!(st.shape, [br as u64, bc as u64], "{sname}");
            Box::new(move |i, j| s[(i / BLOCK) * bc + j / BLOCK])
        }
    };
    values(w)
        .into_iter()
        .enumerate()
        .map(|(k, q)| {
            let sc = scale_of(k / cols, k % cols);
            (q * sc, sc)
        })
        .collect()
}

/// The largest error of `deq` against the bf16 `want`, in units of what E4M3 rounding of
/// `w / scale` allows: half a step is at most 2^-4 of the value for normals and 2^-10·scale for
/// subnormals (the bound is doubled there, and widened by 2^-7 for a scale stored rounded to
/// BF16). At most 1 when the weight is this rank's weight with this rank's scales.
fn worst_error(deq: &[(f32, f32)], want: &[f32]) -> f64 {
    assert_eq!(deq.len(), want.len(), "element count");
    deq.iter()
        .zip(want)
        .map(|(&(d, s), &w)| {
            let allowed =
                f64::from(w.abs()) * (2f64.powi(-4) + 2f64.powi(-7)) + f64::from(s) * 2f64.powi(-9);
            let err = f64::from(d - w).abs();
            if err.is_nan() {
                f64::INFINITY
            } else {
                err / allowed
            }
        })
        .fold(0.0, f64::max)
}

/// Each FP8 module's [`worst_error`] on a rank against vLLM's bf16 tensors `want` of a rank;
/// every non-FP8 tensor of `want` must be in `got` byte for byte.
fn fp8_errors(got: &Tensors, want: &Tensors, scheme: Scheme, tp: u64) -> BTreeMap<String, f64> {
    let mut errs = BTreeMap::new();
    for (name, w) in want {
        let g = got
            .get(name)
            .unwrap_or_else(|| panic!("'{name}' missing (vLLM's bf16 shard has it)"));
        if g.dtype == "F8_E4M3" {
            assert_eq!(g.shape, w.shape, "{name}: shape");
            let module = name.strip_suffix(".weight").expect("an FP8 weight");
            let deq = dequantize(got, module, scheme, tp);
            errs.insert(module.to_string(), worst_error(&deq, &values(w)));
        } else {
            assert_eq!(g, w, "'{name}' differs from vLLM's bf16 shard");
        }
    }
    errs
}

/// The tensors an FP8 shard holds beyond vLLM's bf16 shard: the scales of each FP8 linear and
/// the attention's quantization parameters.
fn extra_keys(scheme: Scheme) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        for m in MODULES {
            keys.insert(scale_name(&format!("{p}.{m}"), scheme));
            if scheme == Scheme::PerTensor {
                keys.insert(format!("{p}.{m}.input_scale"));
            }
        }
        let attn: &[&str] = match scheme {
            // compressed-tensors' KV cache method: [1] scales and zero points, no prob_scale.
            Scheme::Channel => &[
                "q_scale",
                "k_scale",
                "v_scale",
                "q_zero_point",
                "k_zero_point",
                "v_zero_point",
            ],
            _ => &["q_scale", "k_scale", "v_scale", "prob_scale"],
        };
        keys.extend(attn.iter().map(|a| format!("{p}.self_attn.attn.{a}")));
    }
    keys
}

/// `got` with the scale tensors of every FP8 module replaced by a misplaced copy: the slots of
/// a per-tensor vector rotated (q's scale on k's rows…), or for channel and block scales the
/// neighbouring rank's (or, at TP 1, the rows in reverse order). Returns it and the modules whose
/// scales changed.
fn misplaced_scales(
    got: &Tensors,
    other: Option<&Tensors>,
    scheme: Scheme,
) -> (Tensors, BTreeSet<String>) {
    let mut bad = got.clone();
    let mut changed = BTreeSet::new();
    for (name, t) in got {
        let Some(module) = name.strip_suffix(".weight") else {
            continue;
        };
        if t.dtype != "F8_E4M3" {
            continue;
        }
        let sname = scale_name(module, scheme);
        let scale = &got[&sname];
        let moved = match (scheme, other) {
            (Scheme::PerTensor, _) => {
                let mut v = values(scale);
                v.rotate_left(1);
                f32_bytes(&v)
            }
            (_, Some(o)) => o[&sname].data.clone(),
            (_, None) => {
                let row = 4 * scale.shape[1] as usize;
                scale.data.chunks(row).rev().flatten().copied().collect()
            }
        };
        if moved != scale.data {
            changed.insert(module.to_string());
            bad.get_mut(&sname).unwrap().data = moved;
        }
    }
    (bad, changed)
}

/// Shards `name` at `tp` and checks every rank against vLLM's bf16 `llama_gqa` shard of the same
/// rank and TP; then checks that the comparison does fail for a neighbour's weights and for
/// misplaced scales, so that it could catch a slicing error.
fn dequantizes_to_vllm_bf16(name: &str, scheme: Scheme, tp: u64) {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(&fixture(name), tp, &out, &["-q"]);
    let golden = expected(GQA, tp);
    let fp8_modules: BTreeSet<String> = (0..2)
        .flat_map(|l| MODULES.map(|m| format!("model.layers.{l}.{m}")))
        .collect();
    let ranks: Vec<Tensors> = (0..tp).map(|r| rank_tensors(&out, r)).collect();
    for r in 0..tp {
        let (got, want) = (&ranks[r as usize], rank_tensors(&golden, r));
        let got_keys: BTreeSet<String> = got.keys().cloned().collect();
        let want_keys: BTreeSet<String> = want.keys().cloned().collect();
        let extra: BTreeSet<String> = got_keys.difference(&want_keys).cloned().collect();
        assert_eq!(
            extra,
            extra_keys(scheme),
            "{name} tp {tp} rank {r}: extra keys"
        );

        let errs = fp8_errors(got, &want, scheme, tp);
        assert_eq!(
            errs.keys().cloned().collect::<BTreeSet<_>>(),
            fp8_modules,
            "{name} tp {tp} rank {r}: FP8 modules"
        );
        for (m, e) in &errs {
            assert!(
                *e <= 1.0,
                "{name} tp {tp} rank {r}: {m} dequantized is {e:.2}× the FP8 rounding bound away from vLLM's bf16 weight"
            );
        }

        let next = (tp > 1).then(|| &ranks[((r + 1) % tp) as usize]);
        if tp > 1 {
            let neighbour = rank_tensors(&golden, (r + 1) % tp);
            for (m, w) in &neighbour {
                let Some(module) = m.strip_suffix(".weight") else {
                    continue;
                };
                if !fp8_modules.contains(module) {
                    continue;
                }
                let e = worst_error(&dequantize(got, module, scheme, tp), &values(w));
                assert!(
                    e > 1.0,
                    "{name} tp {tp} rank {r}: {module} also passes against rank {}'s weight ({e:.2}): the check cannot see a wrong slice",
                    (r + 1) % tp
                );
            }
        }
        let (bad, changed) = misplaced_scales(got, next, scheme);
        for must in [
            "model.layers.0.self_attn.qkv_proj",
            "model.layers.0.mlp.gate_up_proj",
        ] {
            assert!(
                changed.contains(must),
                "{name} tp {tp} rank {r}: the misplaced-scale control leaves {must} as it was"
            );
        }
        for (m, e) in fp8_errors(&bad, &want, scheme, tp) {
            if changed.contains(&m) {
                assert!(
                    e > 1.0,
                    "{name} tp {tp} rank {r}: {m} still passes with misplaced scales ({e:.2}): the check cannot see a wrong scale slice"
                );
            }
        }
    }
}

#[test]
fn per_tensor_fp8_dequantizes_to_vllm_bf16_at_tp4() {
    dequantizes_to_vllm_bf16("llama_gqa_fp8_tensor", Scheme::PerTensor, 4);
}

/// TP 8 replicates the 4 KV heads: each rank's qkv holds one k and one v head, and the scale
/// vector still has the three slots [q, k, v].
#[test]
fn per_tensor_fp8_dequantizes_to_vllm_bf16_at_tp8_with_replicated_kv_heads() {
    dequantizes_to_vllm_bf16("llama_gqa_fp8_tensor", Scheme::PerTensor, 8);
}

#[test]
fn compressed_tensors_channel_fp8_dequantizes_to_vllm_bf16_at_tp4() {
    dequantizes_to_vllm_bf16("llama_gqa_ct_fp8_dynamic", Scheme::Channel, 4);
}

#[test]
fn compressed_tensors_channel_fp8_dequantizes_to_vllm_bf16_at_tp8() {
    dequantizes_to_vllm_bf16("llama_gqa_ct_fp8_dynamic", Scheme::Channel, 8);
}

#[test]
fn block_fp8_dequantizes_to_vllm_bf16_at_tp1() {
    dequantizes_to_vllm_bf16("llama_gqa_fp8_block", Scheme::Block, 1);
}

#[test]
fn block_fp8_dequantizes_to_vllm_bf16_at_tp2() {
    dequantizes_to_vllm_bf16("llama_gqa_fp8_block", Scheme::Block, 2);
}

// ---------------------------------------------------------------------------------------------
// 2. What vLLM cannot load is refused, by name, before anything is written
// ---------------------------------------------------------------------------------------------

/// Rewrites the single-file checkpoint `dir/model.safetensors` with `edit` applied to its
/// tensors (header order kept).
fn rewrite_model(dir: &Path, edit: impl FnOnce(&mut Vec<(String, Held)>)) {
    let path = dir.join("model.safetensors");
    let mut tensors = file_tensors(&path);
    edit(&mut tensors);
    write_held(&path, tensors.iter().map(|(n, t)| (n, t)));
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    edit(&mut config);
    write_json(&path, &config);
}

/// `wload shard SOURCE --tp TP` is refused with exit 3 and every one of `needles`, and the
/// output folder was never created. Returns stderr.
fn shard_refused(source: &Path, tp: u64, extra: &[&str], needles: &[&str]) -> String {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    let o = shard(source, tp, &out, extra);
    let err = assert_refused(&o, 3, needles);
    assert!(
        !out.exists(),
        "{} --tp {tp}: refused, yet {} was created",
        source.display(),
        out.display()
    );
    err
}

/// At TP 4 each rank's k and v partitions are 16 rows, half a 32-row block: vLLM's ceil-block
/// slicing reads k/v scale rows past the checkpoint's 2 (ranks 2 and 3), and its loader fails.
#[test]
fn block_fp8_at_tp4_is_refused_because_kv_blocks_run_past_the_scale() {
    let err = shard_refused(
        &fixture("llama_gqa_fp8_block"),
        4,
        &[],
        &[
            "model.layers.0.self_attn.qkv_proj.weight_scale_inv",
            "model.layers.1.self_attn.qkv_proj.weight_scale_inv",
            "do not align with this TP size",
            "block_n = 32",
            "--tp",
        ],
    );
    assert!(
        !err.contains("o_proj"),
        "o_proj has 32 input columns per rank at TP 4: {err}"
    );
}

/// At TP 8 o_proj's 16 input columns per rank are not a whole 32-column block: vLLM's
/// `validate_fp8_block_shape` refuses with this exact message.
#[test]
fn block_fp8_at_tp8_is_refused_with_vllms_block_k_message() {
    shard_refused(
        &fixture("llama_gqa_fp8_block"),
        8,
        &[],
        &[
            "model.layers.0.self_attn.o_proj.weight_scale_inv: Weight input_size_per_partition = 16 is not divisible by weight quantization block_k = 32.",
            "model.layers.1.self_attn.o_proj.weight_scale_inv",
            "choose another --tp (now 8)",
        ],
    );
}

/// Quantization methods whose weights have their own packed layouts are refused by name.
#[test]
fn other_quantization_methods_are_refused_by_name() {
    let ct = |format: &str, wtype: &str, bits: u64| {
        json!({
            "quant_method": "compressed-tensors",
            "format": format,
            "quantization_status": "compressed",
            "ignore": ["lm_head"],
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"type": wtype, "num_bits": bits, "strategy": "group",
                            "group_size": 16, "symmetric": true, "dynamic": false},
                "input_activations": null
            }}
        })
    };
    let cases: [(Value, &[&str]); 7] = [
        (
            json!({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false, "sym": true}),
            &["quant_method = \"gptq\" is not supported"],
        ),
        (
            json!({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"}),
            &["quant_method = \"awq\" is not supported"],
        ),
        (
            json!({"quant_method": "mxfp4"}),
            &["quant_method = \"mxfp4\" is not supported"],
        ),
        (
            json!({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4"}),
            &["quant_method = \"bitsandbytes\" is not supported"],
        ),
        // llm-compressor W4A16 (INT4 packed into int32).
        (
            ct("pack-quantized", "int", 4),
            &["compressed-tensors format \"pack-quantized\" is not supported"],
        ),
        // llm-compressor NVFP4 (two FP4 values per byte).
        (
            ct("nvfp4-pack-quantized", "float", 4),
            &["compressed-tensors format \"nvfp4-pack-quantized\" is not supported"],
        ),
        // A 4-bit float scheme declared under the FP8 format name.
        (
            ct("float-quantized", "float", 4),
            &["compressed-tensors weights of type \"float\" with 4 bits are not supported"],
        ),
    ];
    for (qc, needles) in cases {
        let src = copy_fixture("llama_gqa_fp8_tensor");
        edit_config(src.path(), |c| c["quantization_config"] = qc.clone());
        shard_refused(src.path(), 2, &["-q"], needles);
    }
}

#[test]
fn fp8_in_float32_is_refused_as_vllm_does() {
    shard_refused(
        &fixture("llama_gqa_fp8_tensor"),
        2,
        &["--dtype", "float32"],
        &[
            "torch.float32 is not supported for quantization method fp8",
            "--dtype bfloat16",
        ],
    );
}

/// vLLM cannot run a fused qkv_proj whose q part is unquantized and k/v parts FP8.
#[test]
fn a_fused_layer_quantized_only_in_part_is_refused() {
    let src = copy_fixture("llama_gqa_fp8_tensor");
    edit_config(src.path(), |c| {
        c["quantization_config"]["ignored_layers"] = json!(["model.layers.0.self_attn.q_proj"]);
    });
    shard_refused(
        src.path(),
        2,
        &["-q"],
        &["Detected some but not all shards of model.layers.0.self_attn.qkv_proj are quantized"],
    );
}

/// Without k_proj's scale, vLLM would leave the k slot at float32's minimum and dequantize k with
/// it: refused, naming the parameter and the shard.
#[test]
fn a_missing_weight_scale_is_refused_naming_the_parameter() {
    let src = copy_fixture("llama_gqa_fp8_tensor");
    rewrite_model(src.path(), |t| {
        t.retain(|(n, _)| n != "model.layers.0.self_attn.k_proj.weight_scale");
    });
    shard_refused(
        src.path(),
        2,
        &["-q"],
        &[
            "model.layers.0.self_attn.qkv_proj.weight_scale",
            "nothing in the checkpoint to fill it (missing shard k)",
        ],
    );
}

/// A BF16 q_proj in a checkpoint whose config says FP8: vLLM would copy it into an FP8 parameter.
#[test]
fn an_unquantized_weight_where_the_config_says_fp8_is_refused() {
    let src = copy_fixture("llama_gqa_fp8_tensor");
    rewrite_model(src.path(), |t| {
        let (_, w) = t
            .iter_mut()
            .find(|(n, _)| n == "model.layers.0.self_attn.q_proj.weight")
            .expect("q_proj.weight in the fixture");
        w.dtype = "BF16".into();
        w.data = [0x80, 0x3f].repeat(w.data.len());
    });
    let err = shard_refused(
        src.path(),
        2,
        &["-q"],
        &[
            "model.layers.0.self_attn.q_proj.weight",
            "cannot be converted",
        ],
    );
    assert!(
        err.contains("ignored_layers") || err.contains("modules_to_not_convert"),
        "the fix should say how to keep the layer unquantized: {err}"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Checkpoint KV scales land on the attention layer
// ---------------------------------------------------------------------------------------------

/// A BF16 scalar with the bit pattern `bits`.
fn bf16_scalar(bits: u16) -> Held {
    Held {
        dtype: "BF16".into(),
        shape: vec![],
        data: bits.to_le_bytes().to_vec(),
    }
}

fn f32_scalar(v: f32) -> Held {
    Held {
        dtype: "F32".into(),
        shape: vec![],
        data: v.to_le_bytes().to_vec(),
    }
}

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

// ---------------------------------------------------------------------------------------------
// 4. Per-tensor FP8 Mixtral (AutoFP8): expert scales where vLLM's MoE loader puts them
// ---------------------------------------------------------------------------------------------

const MIXTRAL_EXPERTS: u64 = 4;

/// A distinct, exactly representable scale for layer `l`, module `m` (0..16), kind `k` (0 weight,
/// 1 input).
fn mixtral_scale(l: u64, m: u64, k: u64) -> f32 {
    (1 + l * 64 + m * 2 + k) as f32 / 256.0
}

/// Index of a quantized Mixtral module for [`mixtral_scale`]: q, k, v, o, then w1/w2/w3 of each
/// expert.
fn mixtral_module(name: &str) -> u64 {
    match name {
        "self_attn.q_proj" => 0,
        "self_attn.k_proj" => 1,
        "self_attn.v_proj" => 2,
        "self_attn.o_proj" => 3,
        _ => {
            let rest = name
                .strip_prefix("block_sparse_moe.experts.")
                .unwrap_or_else(|| panic!("not a quantized module: {name}"));
            let (e, w) = rest.split_once(".w").unwrap();
            4 + e.parse::<u64>().unwrap() * 3 + w.parse::<u64>().unwrap() - 1
        }
    }
}

/// The low byte of every BF16 element: any F8_E4M3 bytes will do, and these can be predicted from
/// vLLM's bf16 shard of the same fixture.
fn low_bytes(bf16: &[u8]) -> Vec<u8> {
    bf16.iter().step_by(2).copied().collect()
}

/// The mixtral fixture as AutoFP8 would write it: q/k/v/o and every expert's w1/w2/w3 F8_E4M3
/// with scalar F32 `weight_scale` and static `input_scale`, routers and lm_head ignored, in one
/// file with the tensors in name order (as Python's safetensors writes same-dtype tensors) or,
/// with `reversed`, in reverse name order (vLLM reads a file's tensors sorted by name either way).
fn mixtral_fp8(dir: &Path, reversed: bool) {
    let mut config: Value =
        serde_json::from_slice(&fs::read(fixture("mixtral").join("config.json")).unwrap()).unwrap();
    config["quantization_config"] = json!({
        "quant_method": "fp8",
        "activation_scheme": "static",
        "ignored_layers": [
            "lm_head",
            "model.layers.0.block_sparse_moe.gate",
            "model.layers.1.block_sparse_moe.gate"
        ]
    });
    write_json(&dir.join("config.json"), &config);
    let mut tensors = Vec::new();
    for (name, t) in checkpoint_tensors(&fixture("mixtral")) {
        let quantized = name
            .strip_prefix("model.layers.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(l, r)| Some((l.parse::<u64>().ok()?, r.strip_suffix(".weight")?)))
            .filter(|(_, m)| {
                m.starts_with("self_attn.") || m.starts_with("block_sparse_moe.experts.")
            });
        let Some((l, module)) = quantized else {
            tensors.push((name, t));
            continue;
        };
        let m = mixtral_module(module);
        let prefix = name.strip_suffix(".weight").unwrap();
        tensors.push((
            format!("{prefix}.weight_scale"),
            f32_scalar(mixtral_scale(l, m, 0)),
        ));
        tensors.push((
            format!("{prefix}.input_scale"),
            f32_scalar(mixtral_scale(l, m, 1)),
        ));
        let fp8 = Held {
            dtype: "F8_E4M3".into(),
            shape: t.shape,
            data: low_bytes(&t.data),
        };
        tensors.push((name, fp8));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    if reversed {
        tensors.reverse();
    }
    write_held(
        &dir.join("model.safetensors"),
        tensors.iter().map(|(n, t)| (n, t)),
    );
}

fn f32_held(shape: &[u64], v: &[f32]) -> Held {
    Held {
        dtype: "F32".into(),
        shape: shape.to_vec(),
        data: f32_bytes(v),
    }
}

/// What vLLM holds on one rank of the FP8 Mixtral: `bf16` is vLLM's rank of the bf16 fixture
/// (same TP/EP), `experts` the global experts this rank holds.
fn mixtral_fp8_rank(bf16: &Tensors, experts: &[u64]) -> Tensors {
    let mut want = Tensors::new();
    for (name, t) in bf16 {
        let fp8 = name.ends_with("proj.weight") || name.contains(".routed_experts.");
        let held = if fp8 {
            Held {
                dtype: "F8_E4M3".into(),
                shape: t.shape.clone(),
                data: low_bytes(&t.data),
            }
        } else {
            t.clone()
        };
        want.insert(name.clone(), held);
    }
    let n = experts.len() as u64;
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        let s = |m: u64, k: u64| mixtral_scale(l, m, k);
        for (proj, slots) in [("qkv_proj", vec![0, 1, 2]), ("o_proj", vec![3])] {
            let shape = [slots.len() as u64];
            let ws: Vec<f32> = slots.iter().map(|&m| s(m, 0)).collect();
            let is: Vec<f32> = slots.iter().map(|&m| s(m, 1)).collect();
            want.insert(
                format!("{p}.self_attn.{proj}.weight_scale"),
                f32_held(&shape, &ws),
            );
            want.insert(
                format!("{p}.self_attn.{proj}.input_scale"),
                f32_held(&shape, &is),
            );
        }
        for a in ["q_scale", "k_scale", "v_scale", "prob_scale"] {
            want.insert(format!("{p}.self_attn.attn.{a}"), bf16_scalar(0xbf80));
        }
        let w = |e: u64, k: u64| 4 + e * 3 + k - 1;
        let ex = format!("{p}.block_sparse_moe.experts.routed_experts");
        let w13: Vec<f32> = experts
            .iter()
            .flat_map(|&e| [s(w(e, 1), 0), s(w(e, 3), 0)])
            .collect();
        want.insert(format!("{ex}.w13_weight_scale"), f32_held(&[n, 2], &w13));
        let per_expert =
            |k: u64, kind: u64| -> Vec<f32> { experts.iter().map(|&e| s(w(e, k), kind)).collect() };
        want.insert(
            format!("{ex}.w2_weight_scale"),
            f32_held(&[n], &per_expert(2, 0)),
        );
        // w1 and w3 share one input-scale slot per expert; w3 is read last.
        want.insert(
            format!("{ex}.w13_input_scale"),
            f32_held(&[n], &per_expert(3, 1)),
        );
        want.insert(
            format!("{ex}.w2_input_scale"),
            f32_held(&[n], &per_expert(2, 1)),
        );
    }
    want
}

/// Every key one rank of the FP8 Mixtral holds (vLLM 0.33, spec §9).
fn mixtral_fp8_keys() -> BTreeSet<String> {
    const LAYER: [&str; 23] = [
        "block_sparse_moe.experts.routed_experts.w13_input_scale",
        "block_sparse_moe.experts.routed_experts.w13_weight",
        "block_sparse_moe.experts.routed_experts.w13_weight_scale",
        "block_sparse_moe.experts.routed_experts.w2_input_scale",
        "block_sparse_moe.experts.routed_experts.w2_weight",
        "block_sparse_moe.experts.routed_experts.w2_weight_scale",
        "block_sparse_moe.gate.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.attn._k_scale",
        "self_attn.attn._prob_scale",
        "self_attn.attn._q_scale",
        "self_attn.attn._v_scale",
        "self_attn.attn.k_scale",
        "self_attn.attn.prob_scale",
        "self_attn.attn.q_scale",
        "self_attn.attn.v_scale",
        "self_attn.o_proj.input_scale",
        "self_attn.o_proj.weight",
        "self_attn.o_proj.weight_scale",
        "self_attn.qkv_proj.input_scale",
        "self_attn.qkv_proj.weight",
        "self_attn.qkv_proj.weight_scale",
    ];
    let mut keys: BTreeSet<String> = [
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
    ]
    .map(String::from)
    .into();
    for l in 0..2 {
        keys.extend(LAYER.map(|k| format!("model.layers.{l}.{k}")));
    }
    keys
}

/// The w13 input-scale key of layer `l`: one slot per expert that w1 and w3 both write.
fn w13_input_scale(l: u64) -> String {
    format!("model.layers.{l}.block_sparse_moe.experts.routed_experts.w13_input_scale")
}

/// Shards the FP8 Mixtral at TP 2 with `extra` flags and compares both ranks with
/// [`mixtral_fp8_rank`] of vLLM's bf16 case `bf16_case`; `experts` per rank. The w13 input
/// scales are only checked for dtype and shape here: which of w1/w3 lands in them is
/// [`mixtral_w13_input_scale_is_w3s_whatever_the_data_order_and_timing`]'s subject.
fn mixtral_fp8_matches(extra: &[&str], bf16_case: &str, experts: [&[u64]; 2]) {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    mixtral_fp8(&src, false);
    let out = tmp.path().join("out");
    let mut flags = vec!["-q"];
    flags.extend_from_slice(extra);
    shard_ok(&src, 2, &out, &flags);
    for r in 0..2u64 {
        let got = rank_tensors(&out, r);
        let keys: BTreeSet<String> = got.keys().cloned().collect();
        assert_eq!(keys, mixtral_fp8_keys(), "{bf16_case} rank {r}: keys");
        let mine = experts[r as usize];
        let want = mixtral_fp8_rank(&rank_tensors(&expected(bf16_case, 2), r), mine);
        for (name, w) in &want {
            let g = &got[name];
            if name.ends_with(".w13_input_scale") {
                assert_eq!(
                    (&g.dtype, &g.shape),
                    (&w.dtype, &w.shape),
                    "{bf16_case} rank {r}: {name}"
                );
            } else {
                assert!(
                    g == w,
                    "{bf16_case} rank {r}: {name}: got {g:?}, want {w:?}"
                );
            }
        }
        // vLLM's Mixtral router is built without a quant config: BF16 whatever the config says.
        let router = &got["model.layers.0.block_sparse_moe.gate.weight"];
        assert_eq!(
            (router.dtype.as_str(), router.shape.as_slice()),
            ("BF16", &[MIXTRAL_EXPERTS, 128][..])
        );
    }
}

/// TP 2: every rank holds all four experts, each sliced; the expert scales are per expert, not
/// sliced, identical on both ranks.
#[test]
fn per_tensor_fp8_mixtral_expert_scales_at_tp2() {
    mixtral_fp8_matches(&[], "mixtral", [&[0, 1, 2, 3], &[0, 1, 2, 3]]);
}

/// EP 2: rank 0 holds experts 0 and 1 whole, rank 1 experts 2 and 3, with their scales.
#[test]
fn per_tensor_fp8_mixtral_expert_scales_with_expert_parallel() {
    mixtral_fp8_matches(
        &["--enable-expert-parallel"],
        "mixtral__ep",
        [&[0, 1], &[2, 3]],
    );
}

/// vLLM reads a file's tensors in name order (`safe_open(...).keys()` is sorted), so of the two
/// input scales w1 and w3 write into one `w13_input_scale` slot, w3's stays. It must, on every
/// run, and whatever order the file stores the data in.
#[test]
fn mixtral_w13_input_scale_is_w3s_whatever_the_data_order_and_timing() {
    const RUNS: usize = 20;
    let tmp = TempDir::new().unwrap();
    let mut wrong = Vec::new();
    for reversed in [false, true] {
        let src = tmp.path().join(format!("src-{reversed}"));
        fs::create_dir(&src).unwrap();
        mixtral_fp8(&src, reversed);
        for run in 0..RUNS {
            let out = tmp.path().join(format!("out-{reversed}-{run}"));
            shard_ok(&src, 2, &out, &["-q"]);
            for l in 0..2 {
                let w3: Vec<f32> = (0..MIXTRAL_EXPERTS)
                    .map(|e| mixtral_scale(l, 4 + e * 3 + 2, 1))
                    .collect();
                let got = values(&rank_tensors(&out, 0)[&w13_input_scale(l)]);
                if got != w3 {
                    wrong.push(format!(
                        "data in reverse name order: {reversed}, run {run}, layer {l}: {got:?}, want w3's {w3:?}"
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} results wrong:\n{}",
        wrong.len(),
        2 * 2 * RUNS,
        wrong.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// 5. The shard output loads, and loading the checkpoint gives the same bytes
// ---------------------------------------------------------------------------------------------

/// `wload load ARGS…` without launcher variables (which would pick ranks).
fn load(args: &[&str]) -> std::process::Output {
    let mut cmd = wload();
    for v in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
    ] {
        cmd.env_remove(v);
    }
    cmd.arg("load").args(args).output().expect("wload runs")
}

/// A folder `shard` wrote passes `load --dry-run --read` (keys, shapes, every byte against
/// wload.json), and loading the FP8 checkpoint itself into host memory gives, per rank, exactly the
/// tensors and bytes of that folder.
#[test]
fn fp8_shards_load_and_match_loading_the_checkpoint() {
    let ep: &[&str] = &["--enable-expert-parallel"];
    for (name, tp, flags) in [
        ("llama_gqa_fp8_tensor", 4, &[][..]),
        ("llama_gqa_ct_fp8_dynamic", 8, &[]),
        ("llama_gqa_fp8_block", 1, &[]),
        ("qwen3_moe_fp8_block", 2, ep),
    ] {
        let tmp = TempDir::new().unwrap();
        let out = tmp.path().join("out");
        shard_ok(&fixture(name), tp, &out, &[&["-q"], flags].concat());
        let tps = tp.to_string();
        let mut dry_args = vec![s(&out), "--tp", &tps, "--dry-run", "--read", "-q"];
        dry_args.extend_from_slice(flags);
        let dry = load(&dry_args);
        assert!(dry.status.success(), "{name} tp {tp}: {}", context(&dry));

        let src = fixture(name);
        let mut args = vec![
            s(&src),
            "--tp",
            &tps,
            "--device",
            "cpu",
            "--checksums",
            "--json",
        ];
        args.extend_from_slice(flags);
        let o = load(&args);
        assert!(o.status.success(), "{name} tp {tp}: {}", context(&o));
        let report: Value = serde_json::from_slice(&o.stdout).expect("JSON report");
        let ranks = report["ranks"].as_array().expect("ranks");
        assert_eq!(ranks.len() as u64, tp, "{name} tp {tp}: ranks loaded");
        for rank in ranks {
            let r = rank["rank"].as_u64().expect("rank number");
            let got: BTreeMap<String, (String, Vec<u64>, String)> = rank["checksums"]
                .as_array()
                .expect("checksums")
                .iter()
                .map(|t| {
                    let (n, d, sh) = json_tensor(t);
                    (n, (d, sh, t["xxh3"].as_str().expect("xxh3").to_string()))
                })
                .collect();
            let want: BTreeMap<String, (String, Vec<u64>, String)> = rank_tensors(&out, r)
                .into_iter()
                .map(|(n, t)| (n, (t.dtype, t.shape, format!("{:016x}", xxh3_64(&t.data)))))
                .collect();
            assert_eq!(got, want, "{name} tp {tp} rank {r}: loaded vs sharded");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 6. Variants of the per-tensor checkpoint that vLLM loads to the same state
// ---------------------------------------------------------------------------------------------

/// Each rank of `dir` equals vLLM's rank of `case` at TP 2, after `adjust` on vLLM's tensors.
fn assert_ranks_equal(dir: &Path, case: &str, adjust: impl Fn(u64, &mut Tensors)) {
    for r in 0..2 {
        let got = rank_tensors(dir, r);
        let mut want = rank_tensors(&expected(case, 2), r);
        adjust(r, &mut want);
        let (gk, wk): (BTreeSet<_>, BTreeSet<_>) = (got.keys().collect(), want.keys().collect());
        assert_eq!(gk, wk, "rank {r}: keys");
        for (name, w) in &want {
            assert!(&got[name] == w, "rank {r}: '{name}' differs");
        }
    }
}

/// Scales saved as `[1]` (as some exporters do) load into the same slots as scalars `[]`.
#[test]
fn per_tensor_scales_of_shape_1_shard_like_scalars() {
    let src = copy_fixture("llama_gqa_fp8_tensor");
    rewrite_model(src.path(), |t| {
        for (name, held) in t.iter_mut() {
            if name.ends_with("_scale") {
                held.shape = vec![1];
            }
        }
    });
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(src.path(), 2, &out, &["-q"]);
    assert_ranks_equal(&out, "llama_gqa__fp8_tensor", |_, _| {});
}

/// Layer 0's q, k and v kept in BF16 and listed in `ignored_layers`: vLLM builds that qkv_proj
/// unquantized (a BF16 weight, no scales), everything else as in the FP8 checkpoint.
#[test]
fn a_wholly_ignored_fused_layer_stays_bf16_without_scales() {
    let src = copy_fixture("llama_gqa_fp8_tensor");
    let bf16 = checkpoint_tensors(&fixture(GQA));
    let ignored = ["q_proj", "k_proj", "v_proj"].map(|p| format!("model.layers.0.self_attn.{p}"));
    rewrite_model(src.path(), |t| {
        t.retain(|(n, _)| !ignored.iter().any(|m| n.starts_with(&format!("{m}."))));
        for m in &ignored {
            let name = format!("{m}.weight");
            t.push((name.clone(), bf16[&name].clone()));
        }
    });
    edit_config(src.path(), |c| {
        c["quantization_config"]["ignored_layers"] = json!(ignored);
    });
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(src.path(), 2, &out, &["-q"]);
    let qkv = "model.layers.0.self_attn.qkv_proj";
    assert_ranks_equal(&out, "llama_gqa__fp8_tensor", |r, want| {
        want.remove(&format!("{qkv}.weight_scale"));
        want.remove(&format!("{qkv}.input_scale"));
        let name = format!("{qkv}.weight");
        want.insert(
            name.clone(),
            rank_tensors(&expected(GQA, 2), r)[&name].clone(),
        );
    });
}

/// compressed-tensors with the `tensor` weight strategy and static input scales holds the same
/// per-tensor slot vectors as `quant_method: fp8`; only the attention differs (compressed-tensors'
/// KV cache method: F32 `[1]` scales and BF16 zero points, no prob_scale), as in vLLM's
/// compressed-tensors channel output.
#[test]
fn compressed_tensors_tensor_strategy_matches_fp8_per_tensor() {
    let src = copy_fixture("llama_gqa_fp8_tensor");
    rewrite_model(src.path(), |t| {
        for (name, held) in t.iter_mut() {
            if name.ends_with("_scale") {
                held.shape = vec![1];
            }
        }
    });
    edit_config(src.path(), |c| {
        c["quantization_config"] = json!({
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "quantization_status": "compressed",
            "ignore": ["lm_head"],
            "kv_cache_scheme": null,
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"type": "float", "num_bits": 8, "strategy": "tensor",
                            "symmetric": true, "dynamic": false},
                "input_activations": {"type": "float", "num_bits": 8, "strategy": "tensor",
                                      "symmetric": true, "dynamic": false}
            }}
        });
    });
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(src.path(), 2, &out, &["-q"]);
    assert_ranks_equal(&out, "llama_gqa__fp8_tensor", |r, want| {
        let ct = rank_tensors(&expected("llama_gqa_ct_fp8_dynamic", 2), r);
        want.retain(|n, _| !n.contains(".attn.") || n.contains(".attn._"));
        want.extend(
            ct.into_iter()
                .filter(|(n, _)| n.contains(".attn.") && !n.contains(".attn._")),
        );
    });
}

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

// ---------------------------------------------------------------------------------------------
// 9. Spellings of the quantization config that vLLM normalizes
// ---------------------------------------------------------------------------------------------

/// A copy of `name` with `edit` applied to its config.json, sharded at TP 2, gives exactly vLLM's
/// TP 2 output `case` of the unedited fixture.
fn config_spelling_shards_as(name: &str, case: &str, edit: impl FnOnce(&mut Value)) {
    let src = copy_fixture(name);
    edit_config(src.path(), edit);
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(src.path(), 2, &out, &["-q"]);
    assert_ranks_equal(&out, case, |_, _| {});
}

/// vLLM lower-cases `quant_method` (`_normalize_quantization_config` in
/// transformers_utils/model_arch_config_convertor.py).
#[test]
fn quant_method_is_case_insensitive_as_in_vllm() {
    config_spelling_shards_as("llama_gqa_fp8_tensor", "llama_gqa__fp8_tensor", |c| {
        c["quantization_config"]["quant_method"] = json!("FP8");
    });
}

/// vLLM rewrites `compressed_tensors` to `compressed-tensors` (same function).
#[test]
fn compressed_tensors_with_an_underscore_is_compressed_tensors() {
    config_spelling_shards_as(
        "llama_gqa_ct_fp8_dynamic",
        "llama_gqa_ct_fp8_dynamic",
        |c| {
            c["quantization_config"]["quant_method"] = json!("compressed_tensors");
        },
    );
}

/// Older compressed-tensors checkpoints keep the config under `compression_config`; vLLM reads it
/// when there is no `quantization_config` (same function).
#[test]
fn compression_config_is_read_when_there_is_no_quantization_config() {
    config_spelling_shards_as(
        "llama_gqa_ct_fp8_dynamic",
        "llama_gqa_ct_fp8_dynamic",
        |c| {
            let qc = c
                .as_object_mut()
                .unwrap()
                .remove("quantization_config")
                .unwrap();
            c["compression_config"] = qc;
        },
    );
}

/// `--dtype float16`: the unquantized tensors are vLLM's float16 output of llama_gqa, the KV
/// scale parameters are float16 -1.0 (the model dtype), and the FP8 weights and F32 scales are
/// unchanged.
#[test]
fn fp8_in_float16_converts_only_the_unquantized_tensors() {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    shard_ok(
        &fixture("llama_gqa_fp8_tensor"),
        2,
        &out,
        &["-q", "--dtype", "float16"],
    );
    assert_ranks_equal(&out, "llama_gqa__fp8_tensor", |r, want| {
        let f16 = rank_tensors(&expected("llama_gqa__dtype_float16", 2), r);
        for (name, t) in want.iter_mut() {
            if name.contains(".attn.") && !name.contains(".attn._") {
                *t = Held {
                    dtype: "F16".into(),
                    shape: vec![],
                    data: 0xbc00u16.to_le_bytes().to_vec(),
                };
            } else if t.dtype == "BF16" {
                *t = f16[name].clone();
            }
        }
    });
}

/// At TP 8 o_proj's scale columns run past the checkpoint's because each rank's 16 input columns
/// are less than a 32-column block; whatever else is said, an explanation that o_proj's output
/// partition [128] is not a multiple of 32 is false and sends the user the wrong way.
#[test]
fn block_fp8_row_parallel_refusal_explains_the_input_partition() {
    let err = shard_refused(&fixture("llama_gqa_fp8_block"), 8, &["-q"], &["o_proj"]);
    assert!(
        !err.contains("output partitions [128] are not multiples of block_n = 32"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Expert block scales on vLLM's refined grid
// ---------------------------------------------------------------------------------------------

/// A one-layer block-FP8 Qwen3-MoE (hidden 256, 4 experts of intermediate 256, 128×128 blocks,
/// attention and router left unquantized) whose expert scales at TP 4 need vLLM's refinement:
/// each rank's 64 rows are half a block, so the grid becomes 64×64 (vllm-spec §6.3).
fn refinable_qwen3_moe(dir: &Path) {
    const H: u64 = 256;
    const E: u64 = 4;
    const I: u64 = 256;
    write_json(
        &dir.join("config.json"),
        &json!({
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": H, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64,
            "num_experts": E, "num_experts_per_tok": 2, "moe_intermediate_size": I,
            "intermediate_size": 512, "vocab_size": 256, "num_hidden_layers": 1,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "dtype": "bfloat16",
            "quantization_config": {
                "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
                "modules_to_not_convert": [
                    "lm_head", "model.layers.0.mlp.gate",
                    "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                    "model.layers.0.self_attn.v_proj", "model.layers.0.self_attn.o_proj"
                ]
            }
        }),
    );
    let l = "model.layers.0";
    let mut specs: Vec<(String, &str, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), "BF16", vec![256, H]),
        ("lm_head.weight".into(), "BF16", vec![256, H]),
        ("model.norm.weight".into(), "BF16", vec![H]),
        (format!("{l}.input_layernorm.weight"), "BF16", vec![H]),
        (
            format!("{l}.post_attention_layernorm.weight"),
            "BF16",
            vec![H],
        ),
        (format!("{l}.self_attn.q_norm.weight"), "BF16", vec![64]),
        (format!("{l}.self_attn.k_norm.weight"), "BF16", vec![64]),
        (format!("{l}.mlp.gate.weight"), "BF16", vec![E, H]),
    ];
    for p in ["q_proj", "k_proj", "v_proj", "o_proj"] {
        specs.push((format!("{l}.self_attn.{p}.weight"), "BF16", vec![H, H]));
    }
    for e in 0..E {
        for (p, shape) in [
            ("gate_proj", [I, H]),
            ("up_proj", [I, H]),
            ("down_proj", [H, I]),
        ] {
            let w = format!("{l}.mlp.experts.{e}.{p}");
            specs.push((format!("{w}.weight"), "F8_E4M3", shape.to_vec()));
            specs.push((
                format!("{w}.weight_scale_inv"),
                "F32",
                vec![shape[0].div_ceil(128), shape[1].div_ceil(128)],
            ));
        }
    }
    let data: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(t, (name, dtype, shape))| {
            let n: u64 = shape.iter().product();
            match *dtype {
                // Distinct scales: tensor number and element index.
                "F32" if name.ends_with("_scale_inv") => (0..n)
                    .flat_map(|k| (t as f32 * 100.0 + k as f32).to_le_bytes())
                    .collect(),
                "F8_E4M3" => (0..n)
                    .map(|k| (mix(t as u64 * 7919 + k) as u8) & 0x7E)
                    .collect(),
                _ => bf16_data(t as u64, n as usize),
            }
        })
        .collect();
    let tensors: Vec<Tensor> = specs
        .iter()
        .zip(&data)
        .map(|((n, d, s), bytes)| (n.as_str(), *d, s.as_slice(), bytes.as_slice()))
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// At TP 4 every rank's expert scales are the checkpoint's, upsampled ×2 both ways
/// (`repeat_interleave`, routed_experts.py:950–960) and cut at the rank's rows (w13) or columns
/// (w2); at TP 2 the checkpoint's blocks fit and are cut as they are.
#[test]
fn expert_block_scales_follow_vllms_refined_grid() {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    refinable_qwen3_moe(&src);
    let ck = checkpoint_tensors(&src);
    let scale = |e: u64, p: &str| {
        f32s(&ck[&format!("model.layers.0.mlp.experts.{e}.{p}.weight_scale_inv")].data)
    };
    // The checkpoint's [2, 2] scales upsampled to [4, 4]: element (i, c) is scale (i/2, c/2).
    let up = |s: &[f32], i: usize, c: usize| s[(i / 2) * 2 + c / 2];
    let out = tmp.path().join("tp4");
    shard_ok(&src, 4, &out, &["-q"]);
    let key = |p: &str| format!("model.layers.0.mlp.experts.routed_experts.{p}_weight_scale_inv");
    for r in 0..4usize {
        let got = rank_tensors(&out, r as u64);
        let w13 = &got[&key("w13")];
        let w2 = &got[&key("w2")];
        assert_eq!(
            (w13.shape.clone(), w2.shape.clone()),
            (vec![4, 2, 4], vec![4, 4, 1]),
            "rank {r}"
        );
        let (w13, w2) = (f32s(&w13.data), f32s(&w2.data));
        for e in 0..4u64 {
            let j = e as usize;
            for (h, p) in ["gate_proj", "up_proj"].iter().enumerate() {
                let s = scale(e, p);
                for c in 0..4 {
                    // One refined row per rank and shard: upsampled row r.
                    assert_eq!(
                        w13[(j * 2 + h) * 4 + c],
                        up(&s, r, c),
                        "rank {r} expert {e} {p} col {c}"
                    );
                }
            }
            let s = scale(e, "down_proj");
            for i in 0..4 {
                assert_eq!(
                    w2[j * 4 + i],
                    up(&s, i, r),
                    "rank {r} expert {e} down row {i}"
                );
            }
        }
    }
    // TP 2: 128 rows per rank, whole blocks, no refinement: w13 [4, 2, 2], w2 [4, 2, 1].
    let out2 = tmp.path().join("tp2");
    shard_ok(&src, 2, &out2, &["-q"]);
    let got = rank_tensors(&out2, 1);
    assert_eq!(got[&key("w13")].shape, vec![4, 2, 2]);
    assert_eq!(got[&key("w2")].shape, vec![4, 2, 1]);
    assert_eq!(f32s(&got[&key("w2")].data)[0], scale(0, "down_proj")[1]);
}
