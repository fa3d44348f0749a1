//! Dequantization: every rank's FP8 weight matches vLLM's bf16 shard at every TP size.

use super::*;

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
fn per_tensor_fp8_dequantizes_to_vllm_bf16_at_tp2() {
    dequantizes_to_vllm_bf16("llama_gqa_fp8_tensor", Scheme::PerTensor, 2);
}

/// TP 8 replicates the 4 KV heads: each rank's qkv holds one k and one v head, and the scale
/// vector still has the three slots [q, k, v].
#[test]
fn per_tensor_fp8_dequantizes_to_vllm_bf16_at_tp8_with_replicated_kv_heads() {
    dequantizes_to_vllm_bf16("llama_gqa_fp8_tensor", Scheme::PerTensor, 8);
}

#[test]
fn compressed_tensors_channel_fp8_dequantizes_to_vllm_bf16_at_tp2() {
    dequantizes_to_vllm_bf16("llama_gqa_ct_fp8_dynamic", Scheme::Channel, 2);
}

#[test]
fn compressed_tensors_channel_fp8_dequantizes_to_vllm_bf16_at_tp8() {
    dequantizes_to_vllm_bf16("llama_gqa_ct_fp8_dynamic", Scheme::Channel, 8);
}

#[test]
fn block_fp8_dequantizes_to_vllm_bf16_at_tp2() {
    dequantizes_to_vllm_bf16("llama_gqa_fp8_block", Scheme::Block, 2);
}
