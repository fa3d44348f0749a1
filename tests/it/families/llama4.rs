//! Llama 4 text (`Llama4ForConditionalGeneration` with `--language-model-only`,
//! mappings/llama4.yaml) beyond the golden TP 2 case, on its fixture (spec §11.1 "Llama 4"). The
//! test rebuilds every rank from the checkpoint by plain slicing, following vLLM's rules written
//! out here: q/k rows permuted per head at load before the split (`llama4.py:805–844`), KV heads
//! replicated past their count, the fused experts transposed, vocab padded to 64. The rules are
//! first checked against real vLLM's TP 2 ranks (their digests), then wload's TP 4, TP 8, EP and
//! PP output against them, byte for byte.

use tempfile::TempDir;

use crate::support::*;

const CASE: &str = "llama4";
const GOLDEN: &str = "llama4__lmonly";
const H: usize = 128; // hidden_size
const NH: usize = 8; // num_attention_heads
const NKV: usize = 2; // num_key_value_heads
const HD: usize = 16; // head_dim
const I: usize = 64; // intermediate_size: the routed and the shared experts
const IM: usize = 128; // intermediate_size_mlp: the dense layer 0
const E: usize = 4; // num_local_experts
const LM: &str = "--language-model-only";

fn ck(n: &str) -> String {
    format!("language_model.{n}")
}

fn layer(i: usize, n: &str) -> String {
    format!("language_model.model.layers.{i}.{n}")
}

fn bf16(shape: &[usize], data: Vec<u8>) -> Held {
    Held::new("BF16", shape, data)
}

/// `w.view(n, d/2, 2, in).transpose(1, 2).reshape(d n, in)`: within each of the `n` heads of `d`
/// rows, the even rows first, then the odd ones (row `b·d/2 + a` is old row `2a + b`).
fn permuted(w: &Held, n: usize) -> Held {
    let d = w.shape[0] as usize / n;
    let data = (0..n)
        .flat_map(|h| (0..2).flat_map(move |b| (0..d / 2).map(move |a| h * d + 2 * a + b)))
        .flat_map(|row| w.rows(row, row + 1).to_vec())
        .collect();
    bf16(&[n * d, H], data)
}

/// Layer `i`'s attention on rank `r` of `tp`: qkv rows `[q_r | k_r | v_r]` of the permuted q/k
/// (v as stored), o_proj columns, the four scale buffers, the two norms whole.
fn attention(want: &mut Tensors, c: &Tensors, i: usize, r: usize, tp: usize) {
    let src = |n: &str| &c[&layer(i, n)];
    let q = permuted(src("self_attn.q_proj.weight"), NH);
    let k = permuted(src("self_attn.k_proj.weight"), NKV);
    let v = src("self_attn.v_proj.weight");
    let qr = NH * HD / tp;
    let qkv = [
        q.rows(r * qr, (r + 1) * qr),
        kv_rows(&k, r, tp, NKV, HD),
        kv_rows(v, r, tp, NKV, HD),
    ]
    .concat();
    let kvr = (NKV * HD / tp).max(HD);
    want.insert(
        layer(i, "self_attn.qkv_proj.weight"),
        bf16(&[qr + 2 * kvr, H], qkv),
    );
    let o = src("self_attn.o_proj.weight").cols(r * qr, (r + 1) * qr);
    want.insert(layer(i, "self_attn.o_proj.weight"), bf16(&[H, qr], o));
    for s in ["k", "v", "q", "prob"] {
        let one = Held::new("F32", &[], 1f32.to_le_bytes().to_vec());
        want.insert(layer(i, &format!("self_attn.attn._{s}_scale")), one);
    }
    for n in ["input_layernorm.weight", "post_attention_layernorm.weight"] {
        want.insert(layer(i, n), src(n).clone());
    }
}

/// A tensor-parallel MLP of intermediate size `n`: gate_up rows `[gate_r ; up_r]`, down columns.
fn mlp(want: &mut Tensors, c: &Tensors, from: &str, to: &str, n: usize, r: usize, tp: usize) {
    let (a, b) = (r * n / tp, (r + 1) * n / tp);
    let src = |p: &str| &c[&format!("{from}.{p}_proj.weight")];
    let gate_up = [src("gate").rows(a, b), src("up").rows(a, b)].concat();
    want.insert(
        format!("{to}.gate_up_proj.weight"),
        bf16(&[2 * (b - a), H], gate_up),
    );
    let down = src("down").cols(a, b);
    want.insert(format!("{to}.down_proj.weight"), bf16(&[H, b - a], down));
}

/// Layer 1's routed experts on rank `r`: with EP the experts `[r E/tp, (r+1) E/tp)` whole, else
/// every expert's intermediate slice; `w13` = `gate_up_proj[e].T` rows `[gate_r ; up_r]`, `w2` =
/// `down_proj[e].T` columns.
fn routed(want: &mut Tensors, c: &Tensors, r: usize, tp: usize, ep: bool) {
    let (experts, a, b) = if ep {
        (r * E / tp..(r + 1) * E / tp, 0, I)
    } else {
        (0..E, r * I / tp, (r + 1) * I / tp)
    };
    let gate_up = &c[&layer(1, "feed_forward.experts.gate_up_proj")];
    let down = &c[&layer(1, "feed_forward.experts.down_proj")];
    let (mut w13, mut w2) = (vec![], vec![]);
    for e in experts.clone() {
        let t = gate_up.item(e).transposed(); // [2I, H]
        w13.extend([t.rows(a, b), t.rows(I + a, I + b)].concat());
        w2.extend(down.item(e).transposed().cols(a, b)); // [H, I] columns
    }
    let n = experts.len();
    let p = |x: &str| layer(1, &format!("feed_forward.experts.routed_experts.{x}"));
    want.insert(p("w13_weight"), bf16(&[n, 2 * (b - a), H], w13));
    want.insert(p("w2_weight"), bf16(&[n, H, b - a], w2));
}

/// Every tensor rank `r` of `tp` must hold (with `ep`: expert parallelism), rebuilt from the
/// checkpoint `c` by the rules alone.
fn want_rank(c: &Tensors, r: usize, tp: usize, ep: bool) -> Tensors {
    let mut want = Tensors::new();
    for n in ["model.embed_tokens.weight", "lm_head.weight"] {
        want.insert(ck(n), vocab_rows(&c[&ck(n)], r, tp));
    }
    let norm = ck("model.norm.weight");
    want.insert(norm.clone(), c[&norm].clone());
    for i in 0..2 {
        attention(&mut want, c, i, r, tp);
    }
    let dense = layer(0, "feed_forward");
    mlp(&mut want, c, &dense, &dense, IM, r, tp);
    let router = layer(1, "feed_forward.router.weight");
    want.insert(router.clone(), c[&router].clone()); // BF16, whole
    let shared = layer(1, "feed_forward.experts._shared_experts._layer");
    mlp(
        &mut want,
        c,
        &layer(1, "feed_forward.shared_expert"),
        &shared,
        I,
        r,
        tp,
    );
    routed(&mut want, c, r, tp, ep);
    want
}

fn checkpoint() -> Tensors {
    checkpoint_tensors(&fixture(CASE))
}

/// `wload shard` of the fixture, text only, with `flags`, into `dir/name`.
fn sharded(dir: &TempDir, name: &str, tp: u64, flags: &[&str]) -> std::path::PathBuf {
    let out = dir.path().join(name);
    shard_ok(&fixture(CASE), tp, &out, &[&["-q", LM], flags].concat());
    out
}

/// The rules rebuild real vLLM's TP 2 ranks exactly: what the tests below check wload against
/// at other sizes is vLLM's behaviour, not a guess.
#[test]
fn the_rules_rebuild_vllms_tp2_ranks() {
    let c = checkpoint();
    for r in 0..2 {
        assert_matches_vllm_rank(&want_rank(&c, r, 2, false), GOLDEN, 2, r as u64);
    }
}

/// TP 4 (2 KV heads over 4 ranks: rank r holds KV head r / 2) and TP 8 (one q head a rank, KV
/// head r / 4, vocab 320 / 8 rows, the last 20 of rank 7 zero): every tensor by the rules.
#[test]
fn tp4_and_tp8_follow_vllms_rules() {
    let c = checkpoint();
    let tmp = TempDir::new().unwrap();
    for tp in [4usize, 8] {
        let dir = sharded(&tmp, &format!("tp{tp}"), tp as u64, &[]);
        for r in 0..tp {
            let got = rank_tensors(&dir, r as u64);
            assert_same_tensors(
                &got,
                &want_rank(&c, r, tp, false),
                &format!("tp{tp} rank {r}"),
            );
        }
        // Ranks sharing a KV head hold the same k and v rows.
        let qkv = layer(1, "self_attn.qkv_proj.weight");
        let kv = |r: u64| {
            rank_tensors(&dir, r)[&qkv]
                .rows(NH * HD / tp, NH * HD / tp + 2 * HD)
                .to_vec()
        };
        assert_eq!(
            kv(0),
            kv(tp as u64 / 2 - 1),
            "tp{tp}: ranks 0 and {} share KV head 0",
            tp / 2 - 1
        );
        assert_ne!(
            kv(0),
            kv(tp as u64 / 2),
            "tp{tp}: rank {} holds KV head 1",
            tp / 2
        );
    }
}

/// `--enable-expert-parallel` at TP 2: rank 0 holds experts 0 and 1 whole, rank 1 experts 2 and
/// 3; the router, the shared expert, attention and everything else are TP 2's. At TP 4, one
/// expert a rank.
#[test]
fn expert_parallel_places_whole_experts_and_keeps_the_rest_as_tp2() {
    let c = checkpoint();
    let tmp = TempDir::new().unwrap();
    let ep = sharded(&tmp, "ep", 2, &["--enable-expert-parallel"]);
    let tp = sharded(&tmp, "tp", 2, &[]);
    let experts = |got: &Tensors, ctx: &str| {
        let w13 = &got[&layer(1, "feed_forward.experts.routed_experts.w13_weight")];
        assert_eq!(w13.shape, [2, 2 * I as u64, H as u64], "{ctx}");
    };
    assert_expert_parallel((&ep, &tp), 2, |r| want_rank(&c, r, 2, true), experts);
    // At TP 4 each rank holds one expert whole.
    let ep4 = sharded(&tmp, "ep4", 4, &["--enable-expert-parallel"]);
    for r in 0..4 {
        let got = rank_tensors(&ep4, r as u64);
        assert_same_tensors(&got, &want_rank(&c, r, 4, true), &format!("ep4 rank {r}"));
    }
}

/// `--pp 2` (with TP 2): stage 0 holds the embedding and layer 0, stage 1 layer 1, the final
/// norm and lm_head (Llama's PPMissingLayer placement, not tied); each tensor as at TP 2.
#[test]
fn pipeline_stages_hold_embedding_first_and_head_last() {
    let c = checkpoint();
    let tmp = TempDir::new().unwrap();
    let dir = sharded(&tmp, "pp", 2, &["--pp", "2"]);
    assert_two_stages(&dir, "language_model.model.layers.", |t| {
        want_rank(&c, t, 2, false)
    });
    let first = stage_tensors(&dir, 0, 0);
    assert!(first.contains_key(&ck("model.embed_tokens.weight")));
    assert!(!first.contains_key(&ck("lm_head.weight")));
    assert!(stage_tensors(&dir, 1, 1).contains_key(&ck("lm_head.weight")));
}

/// With `--language-model-only` vLLM builds no vision model or projector: their tensors are
/// skipped, named, and no other (the towers' own tests: families::towers::llama4).
#[test]
fn language_model_only_skips_the_vision_model_and_projector() {
    let src = fixture(CASE);
    let plan = clean_plan_json(&src, &["--tp", "2", LM]);
    let tower: Vec<String> = checkpoint()
        .into_keys()
        .filter(|n| !n.starts_with("language_model."))
        .collect();
    assert_eq!(
        tower.len(),
        26,
        "the fixture's tower (25) and projector (1)"
    );
    let mut skipped: Vec<String> = plan["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .map(|t| t["tensor"].as_str().unwrap().to_string())
        .collect();
    skipped.sort();
    assert_eq!(
        skipped, tower,
        "the tower's tensors, and no other, are skipped"
    );
}

/// `sizes` agrees with `plan` at every TP up to 8: TP 1, 2, 4, 8 accepted; 3, 5, 6, 7 refused
/// (exit 3), naming num_attention_heads first.
#[test]
fn sizes_agrees_with_the_checks() {
    let src = fixture(CASE);
    let sizes = wload_json(&["sizes", s(&src), "--max-tp", "8", "--json", LM]);
    assert_eq!(
        sizes["accepted_tp"],
        serde_json::json!([1, 2, 4, 8]),
        "{sizes:#}"
    );
    for tp in 1..=8u64 {
        let t = tp.to_string();
        let out = run(&["plan", s(&src), "--tp", &t, LM]);
        if [1, 2, 4, 8].contains(&tp) {
            assert!(out.status.success(), "tp {tp}: {}", context(&out));
            continue;
        }
        let heads = format!("num_attention_heads (8) is not divisible by tp ({tp})");
        assert_refusal_text(&out, 3, &[&heads, "choose a --tp that divides 8"]);
        let row = sizes["checked"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["tp"] == tp && c["pp"] == 1 && c["expert_parallel"] == false)
            .unwrap_or_else(|| panic!("tp {tp} checked: {sizes:#}"));
        assert!(row["reason"].as_str().unwrap().starts_with(&heads), "{row}");
    }
    let three = run(&["plan", s(&src), "--tp", "3", LM]);
    assert_refusal_text(
        &three,
        3,
        &[
            "num_key_value_heads (2) and tp (3) must divide one another",
            "intermediate_size (64) is not divisible by tp (3)",
            "intermediate_size_mlp (128) is not divisible by tp (3)",
        ],
    );
}
