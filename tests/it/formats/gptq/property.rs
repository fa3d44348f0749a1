//! The property the issue asks for: unpack every rank's packed tensors, put the ranks back
//! together, and get the checkpoint's unpacked tensors — for GPTQ (qweight packed on K, qzeros
//! on N) and AWQ (both on N, raw nibble order), at TP 1, 2, 4 and 8 (where 4 kv heads are
//! replicated), fused qkv and gate/up layers part by part at their packed offsets.

use super::*;

/// One output part of a fused layer: the checkpoint module, its width N, and its head count
/// when TP may replicate it (kv heads).
struct Part {
    module: &'static str,
    n: u64,
    heads: Option<u64>,
}

fn part(module: &'static str, n: u64, heads: Option<u64>) -> Part {
    Part { module, n, heads }
}

/// (vLLM module, its parts; `None`: row-parallel, one part split on K).
fn layers() -> Vec<(&'static str, Option<Vec<Part>>, &'static str)> {
    vec![
        (
            "self_attn.qkv_proj",
            Some(vec![
                part("self_attn.q_proj", HEADS * HD, Some(HEADS)),
                part("self_attn.k_proj", KV * HD, Some(KV)),
                part("self_attn.v_proj", KV * HD, Some(KV)),
            ]),
            "",
        ),
        ("self_attn.o_proj", None, "self_attn.o_proj"),
        (
            "mlp.gate_up_proj",
            Some(vec![
                part("mlp.gate_proj", I, None),
                part("mlp.up_proj", I, None),
            ]),
            "",
        ),
        ("mlp.down_proj", None, "mlp.down_proj"),
    ]
}

/// The packed parameters and the dim each is packed on, in vLLM's registration order.
fn params(method: Method) -> [(&'static str, Option<usize>, &'static str); 3] {
    match method {
        Method::Gptq => [
            ("qweight", Some(0), "I32"),
            ("scales", None, "F16"),
            ("qzeros", Some(1), "I32"),
        ],
        Method::Awq => [
            ("qweight", Some(1), "I32"),
            ("qzeros", Some(1), "I32"),
            ("scales", None, "F16"),
        ],
    }
}

/// Rank `r`'s columns of `p` (width per rank, and whether this rank's copy is the one kept).
fn share(p: &Part, tp: u64, r: u64) -> (u64, bool) {
    match p.heads {
        Some(h) if tp > h => (p.n / h, r.is_multiple_of(tp / h)),
        _ => (p.n / tp, true),
    }
}

fn check(method: Method, tp: u64, group: i64, bits: u64) {
    let src = dense(method, group, json!({"bits": bits}));
    let out = sharded(src.path(), tp, &[]);
    let dir = out.path().join("out");
    let ckpt = checkpoint_tensors(src.path());
    let ranks: Vec<Tensors> = (0..tp).map(|r| rank_tensors(&dir, r)).collect();
    let ctx = format!("{method:?} {bits}-bit tp{tp} group {group}");
    for rank in &ranks {
        assert!(
            rank.keys().all(|k| !k.ends_with("g_idx")),
            "{ctx}: g_idx is dropped"
        );
    }
    for (vllm, parts, row_module) in layers() {
        for (param, unpack, dtype) in params(method) {
            let name = format!("model.layers.0.{vllm}.{param}");
            let got: Vec<Vec<Vec<u32>>> = (ranks.iter())
                .map(|t| {
                    let h = t.get(&name).unwrap_or_else(|| panic!("{ctx}: no {name}"));
                    assert_eq!(h.dtype, dtype, "{ctx}: {name}");
                    matrix_of(h, unpack, bits)
                })
                .collect();
            let want =
                |m: &str| matrix_of(&ckpt[&format!("model.layers.0.{m}.{param}")], unpack, bits);
            let Some(parts) = &parts else {
                if group == -1 && param != "qweight" {
                    // marlin_repeat_scales_on_all_ranks: channelwise row-parallel scales whole.
                    for m in &got {
                        assert!(*m == want(row_module), "{ctx}: {name} whole on every rank");
                    }
                    continue;
                }
                let rows: Vec<Vec<u32>> = got.into_iter().flatten().collect();
                assert!(
                    rows == want(row_module),
                    "{ctx}: {name} rows put back together"
                );
                continue;
            };
            let mut at = vec![0usize; tp as usize];
            for p in parts {
                let mut whole = Vec::new();
                for (r, m) in got.iter().enumerate() {
                    let (w, kept) = share(p, tp, r as u64);
                    let from = at[r];
                    at[r] += w as usize;
                    if kept {
                        hcat(&mut whole, cols(m, from, at[r]));
                    }
                }
                assert!(whole == want(p.module), "{ctx}: {name}, part {}", p.module);
            }
            for (r, m) in got.iter().enumerate() {
                assert_eq!(
                    at[r],
                    m[0].len(),
                    "{ctx}: {name} rank {r} holds its parts only"
                );
            }
        }
    }
}

#[test]
fn gptq_ranks_unpacked_and_put_back_together_are_the_checkpoint() {
    for tp in [1, 2, 4, 8] {
        check(Method::Gptq, tp, 16, 4);
        check(Method::Gptq, tp, -1, 4);
        check(Method::Gptq, tp, 32.min(128 / tp as i64), 8);
    }
}

#[test]
fn awq_ranks_unpacked_and_put_back_together_are_the_checkpoint() {
    for tp in [1, 2, 4, 8] {
        check(Method::Awq, tp, 16, 4);
    }
}

/// vLLM's registration order per layer (GPTQ: qweight, scales, qzeros; AWQ: qweight, qzeros,
/// scales), and AWQ's qkv bias kept in the model dtype `[q_r | k_r | v_r]`.
#[test]
fn parameters_come_in_vllms_order_and_awq_keeps_its_bias() {
    for method in [Method::Gptq, Method::Awq] {
        let src = dense(method, 32, json!({}));
        let out = sharded(src.path(), 2, &[]);
        let names: Vec<String> = (plan_order(src.path(), &["--tp", "2"], 1).into_iter())
            .filter(|n| n.contains(".o_proj."))
            .collect();
        let want: Vec<String> = params(method)
            .iter()
            .map(|(p, ..)| format!("model.layers.0.self_attn.o_proj.{p}"))
            .collect();
        assert_eq!(names, want, "{method:?}");
        let t = rank_tensors(&out.path().join("out"), 1);
        if method == Method::Awq {
            let b = &t["model.layers.0.self_attn.qkv_proj.bias"];
            assert_eq!(
                (b.dtype.as_str(), b.shape.as_slice()),
                ("F16", &[128u64][..])
            );
            assert_eq!(
                t["model.layers.0.self_attn.qkv_proj.qweight"].shape,
                [128, 16]
            );
            assert_eq!(t["model.layers.0.self_attn.o_proj.qzeros"].shape, [2, 16]);
        }
    }
}
