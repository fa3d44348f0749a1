//! Mamba2 hybrids (vllm-spec §13.3–13.4): Granite 4 (`GraniteMoeHybridForCausalLM`,
//! mappings/granitemoehybrid.yaml) beyond its golden TP 2 case, and Nemotron-H
//! (`NemotronHForCausalLM`, mappings/nemotron_h.yaml) on a generated checkpoint. Every rank is
//! rebuilt here from the checkpoint by vLLM's rules written out (`MambaMixer2`,
//! mamba_mixer2.py:202–520): `in_proj` rows `[z_r; x_r; B_r; C_r; dt_r]` and `conv1d` `[x_r; B_r;
//! C_r]` when TP divides the groups, the one group's B and C whole on every rank otherwise;
//! `A = -exp(A_log)` in F32, correctly rounded (the F64 exp rounded to nearest: wload's contract,
//! within 1 ulp of any device's expf); `D` and `dt_bias` in the model dtype. The Granite rules
//! are first checked against real vLLM's TP 2 ranks (their digests, `A` within 1 ulp).

use tempfile::TempDir;

use crate::support::*;

/// A Mamba2 mixer's dimensions: heads, intermediate size, groups, state, conv kernel, hidden.
#[derive(Clone, Copy)]
struct Mixer {
    nh: usize,
    i: usize,
    g: usize,
    n: usize,
    k: usize,
    h: usize,
}

fn bf16(shape: &[usize], data: Vec<u8>) -> Held {
    Held::new("BF16", shape, data)
}

/// F32 values as a tensor's bytes.
fn f32_bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(f32::to_le_bytes).collect()
}

/// A tensor's values widened to F32 (BF16 exactly, as torch's copy into an F32 parameter).
fn f32_values(t: &Held) -> Vec<f32> {
    (t.to_f32().data.chunks(4))
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// An F32 tensor rounded to BF16 as torch's `copy_` rounds it (nearest, ties to even); a BF16
/// one as it is.
fn to_bf16(t: &Held) -> Vec<u8> {
    if t.dtype == "BF16" {
        return t.data.clone();
    }
    (f32_values(t).into_iter())
        .flat_map(|x| {
            let b = x.to_bits();
            (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16).to_le_bytes()
        })
        .collect()
}

/// Rows of `t` for rank `r` of `tp`, part by part: each part `(offset, size, whole)` TP-sliced,
/// or whole when `whole` (the one group's B and C at TP > groups).
fn parts(t: &Held, spec: &[(usize, usize, bool)], r: usize, tp: usize) -> (usize, Vec<u8>) {
    let (mut rows, mut data) = (0, Vec::new());
    for &(at, size, whole) in spec {
        let (from, n) = if whole {
            (at, size)
        } else {
            (at + r * size / tp, size / tp)
        };
        data.extend_from_slice(t.rows(from, from + n));
        rows += n;
    }
    (rows, data)
}

/// Rank `r` of `tp`'s mixer tensors as vLLM holds them, from the checkpoint's `src.*` (A_log,
/// D, dt_bias, conv1d, in_proj, norm, out_proj), under `dst.`.
fn mixer(want: &mut Tensors, c: &Tensors, (src, dst): (&str, &str), m: Mixer, r: usize, tp: usize) {
    let s = |n: &str| &c[&format!("{src}.{n}")];
    let mut put = |n: &str, t: Held| {
        want.insert(format!("{dst}.{n}"), t);
    };
    let hr = m.nh / tp;
    let a: Vec<f32> = f32_values(s("A_log"))[r * hr..(r + 1) * hr]
        .iter()
        .map(|&x| -(f64::from(x).exp() as f32))
        .collect();
    put("A", Held::new("F32", &[hr], f32_bytes(a)));
    let d = to_bf16(s("D"))[r * hr * 2..(r + 1) * hr * 2].to_vec();
    put("D", bf16(&[hr], d));
    put(
        "dt_bias",
        bf16(&[hr], s("dt_bias").rows(r * hr, (r + 1) * hr).to_vec()),
    );
    let whole = !m.g.is_multiple_of(tp); // one group, more ranks: B and C whole on every rank
    let gn = m.g * m.n;
    let conv = [(0, m.i, false), (m.i, gn, whole), (m.i + gn, gn, whole)];
    let (rows, w) = parts(s("conv1d.weight"), &conv, r, tp);
    put("conv1d.weight", bf16(&[rows, 1, m.k], w));
    let (rows, b) = parts(s("conv1d.bias"), &conv, r, tp);
    put("conv1d.bias", bf16(&[rows], b));
    let in_proj = [
        (0, m.i, false),
        (m.i, m.i, false),
        (2 * m.i, gn, whole),
        (2 * m.i + gn, gn, whole),
        (2 * m.i + 2 * gn, m.nh, false),
    ];
    let (rows, w) = parts(s("in_proj.weight"), &in_proj, r, tp);
    put("in_proj.weight", bf16(&[rows, m.h], w));
    let ir = m.i / tp;
    let out = s("out_proj.weight").cols(r * ir, (r + 1) * ir);
    put("out_proj.weight", bf16(&[m.h, ir], out));
    put(
        "norm.weight",
        bf16(&[ir], s("norm.weight").rows(r * ir, (r + 1) * ir).to_vec()),
    );
}

/// Qkv rows `[q_r; k_r; v_r]`, o_proj columns and the four scale buffers of an attention module
/// `src` (checkpoint) / `dst` (vLLM) with `nh` heads, `nkv` kv heads of `hd`.
fn attention(
    want: &mut Tensors,
    c: &Tensors,
    (src, dst): (&str, &str),
    dims: [usize; 4],
    r: usize,
    tp: usize,
) {
    let [nh, nkv, hd, h] = dims;
    let s = |n: &str| &c[&format!("{src}.{n}")];
    let qr = nh * hd / tp;
    let qkv = [
        s("q_proj.weight").rows(r * qr, (r + 1) * qr),
        kv_rows(s("k_proj.weight"), r, tp, nkv, hd),
        kv_rows(s("v_proj.weight"), r, tp, nkv, hd),
    ]
    .concat();
    let kvr = (nkv * hd / tp).max(hd);
    want.insert(
        format!("{dst}.qkv_proj.weight"),
        bf16(&[qr + 2 * kvr, h], qkv),
    );
    let o = s("o_proj.weight").cols(r * qr, (r + 1) * qr);
    want.insert(format!("{dst}.o_proj.weight"), bf16(&[h, qr], o));
    for sc in ["k", "v", "q", "prob"] {
        let one = Held::new("F32", &[], 1f32.to_le_bytes().to_vec());
        want.insert(format!("{dst}.attn._{sc}_scale"), one);
    }
}

// --- Granite 4 ---------------------------------------------------------------------------------

const GRANITE: Mixer = Mixer {
    nh: 8,
    i: 128,
    g: 1,
    n: 16,
    k: 4,
    h: 128,
};

/// Rank `r` of `tp` of the granite4 fixture (`[mamba, attention, mamba]`, 4 experts of I 64, a
/// shared MLP of 64, tied embeddings: only `lm_head.weight` is kept).
fn granite_rank(c: &Tensors, r: usize, tp: usize) -> Tensors {
    let (h, e, ei, si) = (128, 4, 64, 64);
    let mut want = Tensors::new();
    want.insert(
        "lm_head.weight".into(),
        vocab_rows(&c["model.embed_tokens.weight"], r, tp),
    );
    want.insert("model.norm.weight".into(), c["model.norm.weight"].clone());
    for l in 0..3 {
        let p = format!("model.layers.{l}");
        if l == 1 {
            let at = format!("{p}.self_attn");
            attention(&mut want, c, (&at, &at), [4, 2, 32, h], r, tp);
        } else {
            let m = format!("{p}.mamba");
            mixer(&mut want, c, (&m, &m), GRANITE, r, tp);
        }
        let moe = format!("{p}.block_sparse_moe");
        let gate = c[&format!("{moe}.router.layer.weight")].clone();
        want.insert(format!("{moe}.gate.weight"), gate);
        let (w13, w2) = (
            &c[&format!("{moe}.input_linear.weight")],
            &c[&format!("{moe}.output_linear.weight")],
        );
        let ir = ei / tp;
        let w13: Vec<u8> = (0..e)
            .flat_map(|x| {
                let t = w13.item(x);
                [
                    t.rows(r * ir, (r + 1) * ir),
                    t.rows(ei + r * ir, ei + (r + 1) * ir),
                ]
                .concat()
            })
            .collect();
        want.insert(
            format!("{moe}.experts.routed_experts.w13_weight"),
            bf16(&[e, 2 * ir, h], w13),
        );
        let w2: Vec<u8> = (0..e)
            .flat_map(|x| w2.item(x).cols(r * ir, (r + 1) * ir))
            .collect();
        want.insert(
            format!("{moe}.experts.routed_experts.w2_weight"),
            bf16(&[e, h, ir], w2),
        );
        let sr = si / tp;
        let shared = &c[&format!("{p}.shared_mlp.input_linear.weight")];
        let up = [
            shared.rows(r * sr, (r + 1) * sr),
            shared.rows(si + r * sr, si + (r + 1) * sr),
        ]
        .concat();
        want.insert(
            format!("{p}.shared_mlp.input_linear.weight"),
            bf16(&[2 * sr, h], up),
        );
        let down = c[&format!("{p}.shared_mlp.output_linear.weight")].cols(r * sr, (r + 1) * sr);
        want.insert(
            format!("{p}.shared_mlp.output_linear.weight"),
            bf16(&[h, sr], down),
        );
        for n in ["input_layernorm", "post_attention_layernorm"] {
            let k = format!("{p}.{n}.weight");
            want.insert(k.clone(), c[&k].clone());
        }
    }
    want
}

/// The rules above are vLLM's at TP 2 (its digests; `A` within 1 ulp), and wload's TP 4 and
/// TP 1 output follows them byte for byte: at TP 4 in_proj is 98 rows (32 + 32 + 16 + 16 + 2)
/// and conv1d 64 (32 + 16 + 16), the single group's B and C whole on every rank; TP 1 is vLLM's
/// merged path, the tensors as stored.
#[test]
fn granite4_ranks_follow_vllms_mamba2_rules_at_tp_1_2_and_4() {
    let fixture = fixture("granite4");
    let c = checkpoint_tensors(&fixture);
    for r in 0..2 {
        assert_matches_vllm_rank(&granite_rank(&c, r, 2), "granite4", 2, r as u64);
    }
    let tmp = TempDir::new().unwrap();
    for tp in [1usize, 4] {
        let out = tmp.path().join(format!("tp{tp}"));
        shard_ok(&fixture, tp as u64, &out, &["-q"]);
        for r in 0..tp {
            let got = rank_tensors(&out, r as u64);
            let ctx = format!("granite4 tp{tp} rank {r}");
            assert_same_tensors(&got, &granite_rank(&c, r, tp), &ctx);
            if tp == 4 {
                assert_eq!(
                    got["model.layers.0.mamba.in_proj.weight"].shape,
                    [98, 128],
                    "{ctx}"
                );
                assert_eq!(
                    got["model.layers.2.mamba.conv1d.weight"].shape,
                    [64, 1, 4],
                    "{ctx}"
                );
            }
        }
    }
}

/// Hub configs spell the layer types `mamba` / `attention`, which transformers 5 remaps to
/// `linear_attention` / `full_attention` before vLLM reads them: the same ranks.
#[test]
fn granite4_legacy_layer_type_names_plan_the_same_ranks() {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("legacy");
    copy_files(&fixture("granite4"), &src);
    let path = src.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["layer_types"] = serde_json::json!(["mamba", "attention", "mamba"]);
    write_json(&path, &config);
    let out = tmp.path().join("out");
    shard_ok(&src, 2, &out, &["-q"]);
    let c = checkpoint_tensors(&src);
    for r in 0..2 {
        assert_same_tensors(
            &rank_tensors(&out, r as u64),
            &granite_rank(&c, r, 2),
            "legacy names",
        );
    }
}

// --- Nemotron-H --------------------------------------------------------------------------------

const NEMOTRON: Mixer = Mixer {
    nh: 8,
    i: 128,
    g: 2,
    n: 16,
    k: 4,
    h: 64,
};
const VOCAB: usize = 100;
const MLP: usize = 96;

/// `n` F32 values for tensor number `t`, in [0, 2.8) (Mamba2's A_log = log(1..16) range) when
/// `spread`, else near 1 (D), none exactly representable in BF16.
fn f32_data(t: u64, n: usize, spread: bool) -> Vec<u8> {
    f32_bytes((0..n as u64).map(|k| {
        let u = (mix(t << 32 | k) >> 40) as f32 / (1u64 << 24) as f32;
        if spread { 2.8 * u } else { 0.5 + u }
    }))
}

/// A Nemotron-H checkpoint of pattern `M-M*` (mamba, MLP relu2, mamba, attention), mamba 8 heads
/// × 16 = I 128 in 2 groups of state 16, conv 4 with bias; `A_log` and `D` stored F32, the rest
/// BF16; untied lm_head; an MTP tensor vLLM drops.
fn nemotron_h() -> (TempDir, Tensors) {
    let m = NEMOTRON;
    let config = serde_json::json!({
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "dtype": "bfloat16",
        "vocab_size": VOCAB, "hidden_size": m.h, "hybrid_override_pattern": "M-M*",
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": MLP, "mamba_num_heads": m.nh, "mamba_head_dim": m.i / m.nh,
        "n_groups": m.g, "ssm_state_size": m.n, "conv_kernel": m.k, "use_conv_bias": true,
        "tie_word_embeddings": false
    });
    let conv = m.i + 2 * m.g * m.n;
    let mut specs: Vec<(String, &str, Vec<usize>)> = vec![
        (
            "backbone.embeddings.weight".into(),
            "BF16",
            vec![VOCAB, m.h],
        ),
        ("backbone.norm_f.weight".into(), "BF16", vec![m.h]),
        ("lm_head.weight".into(), "BF16", vec![VOCAB, m.h]),
        ("mtp.layers.0.norm.weight".into(), "BF16", vec![m.h]),
    ];
    for l in 0..4 {
        let p = |n: &str| format!("backbone.layers.{l}.{n}");
        specs.push((p("norm.weight"), "BF16", vec![m.h]));
        let more: Vec<(&str, &str, Vec<usize>)> = match l {
            0 | 2 => vec![
                ("mixer.A_log", "F32", vec![m.nh]),
                ("mixer.D", "F32", vec![m.nh]),
                ("mixer.dt_bias", "BF16", vec![m.nh]),
                ("mixer.conv1d.weight", "BF16", vec![conv, 1, m.k]),
                ("mixer.conv1d.bias", "BF16", vec![conv]),
                ("mixer.in_proj.weight", "BF16", vec![conv + m.i + m.nh, m.h]),
                ("mixer.norm.weight", "BF16", vec![m.i]),
                ("mixer.out_proj.weight", "BF16", vec![m.h, m.i]),
            ],
            1 => vec![
                ("mixer.up_proj.weight", "BF16", vec![MLP, m.h]),
                ("mixer.down_proj.weight", "BF16", vec![m.h, MLP]),
            ],
            _ => vec![
                ("mixer.q_proj.weight", "BF16", vec![64, m.h]),
                ("mixer.k_proj.weight", "BF16", vec![32, m.h]),
                ("mixer.v_proj.weight", "BF16", vec![32, m.h]),
                ("mixer.o_proj.weight", "BF16", vec![m.h, 64]),
            ],
        };
        specs.extend(more.into_iter().map(|(n, d, s)| (p(n), d, s)));
    }
    let tensors: Tensors = (specs.into_iter().enumerate())
        .map(|(t, (name, dtype, shape))| {
            let n = shape.iter().product();
            let data = match dtype {
                "F32" => f32_data(t as u64, n, name.ends_with("A_log")),
                _ => bf16_data(t as u64, n),
            };
            (name, Held::new(dtype, &shape, data))
        })
        .collect();
    (write_checkpoint(&config, &tensors), tensors)
}

/// Rank `r` of `tp` of [`nemotron_h`] as vLLM holds it.
fn nemotron_rank(c: &Tensors, r: usize, tp: usize) -> Tensors {
    let h = NEMOTRON.h;
    let mut want = Tensors::new();
    want.insert(
        "model.embed_tokens.weight".into(),
        vocab_rows(&c["backbone.embeddings.weight"], r, tp),
    );
    want.insert(
        "lm_head.weight".into(),
        vocab_rows(&c["lm_head.weight"], r, tp),
    );
    want.insert(
        "model.norm_f.weight".into(),
        c["backbone.norm_f.weight"].clone(),
    );
    for l in 0..4 {
        let (src, dst) = (format!("backbone.layers.{l}"), format!("model.layers.{l}"));
        want.insert(
            format!("{dst}.norm.weight"),
            c[&format!("{src}.norm.weight")].clone(),
        );
        let (sm, dm) = (format!("{src}.mixer"), format!("{dst}.mixer"));
        match l {
            0 | 2 => mixer(&mut want, c, (&sm, &dm), NEMOTRON, r, tp),
            1 => {
                let mr = MLP / tp;
                let up = c[&format!("{sm}.up_proj.weight")]
                    .rows(r * mr, (r + 1) * mr)
                    .to_vec();
                want.insert(format!("{dm}.up_proj.weight"), bf16(&[mr, h], up));
                let down = c[&format!("{sm}.down_proj.weight")].cols(r * mr, (r + 1) * mr);
                want.insert(format!("{dm}.down_proj.weight"), bf16(&[h, mr], down));
            }
            _ => attention(&mut want, c, (&sm, &dm), [4, 2, 16, h], r, tp),
        }
    }
    want
}

/// TP 1 and TP 2 (two groups: every part of in_proj and conv1d TP-sliced, 164 and 96 rows at
/// TP 2), byte for byte; `D` stored F32 is rounded to BF16, `A` F32 from the F32 `A_log`.
#[test]
fn nemotron_h_ranks_follow_vllms_rules_at_tp_1_and_2() {
    let (ckpt, c) = nemotron_h();
    let tmp = TempDir::new().unwrap();
    for tp in [1usize, 2] {
        let out = tmp.path().join(format!("tp{tp}"));
        shard_ok(ckpt.path(), tp as u64, &out, &["-q"]);
        for r in 0..tp {
            let got = rank_tensors(&out, r as u64);
            let ctx = format!("nemotron_h tp{tp} rank {r}");
            assert_same_tensors(&got, &nemotron_rank(&c, r, tp), &ctx);
            if tp == 2 {
                assert_eq!(
                    got["model.layers.0.mixer.in_proj.weight"].shape,
                    [164, 64],
                    "{ctx}"
                );
                assert_eq!(got["model.layers.2.mixer.conv1d.bias"].shape, [96], "{ctx}");
            }
        }
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("wload.json")).unwrap()).unwrap();
        let note = manifest["computed"][0].as_str().unwrap_or_default();
        assert!(
            note.contains("within 1 ulp") && note.contains("model.layers.0.mixer.A"),
            "{note}"
        );
    }
}

/// Two groups at TP 4: vLLM's assertion (mamba_mixer2.py:320, refusals/nemotron_h_tp4.txt), exit
/// 3, naming TP sizes that work; `sizes` agrees.
#[test]
fn nemotron_h_two_groups_at_tp_4_are_refused_in_vllms_words() {
    let (ckpt, _) = nemotron_h();
    let tmp = TempDir::new().unwrap();
    let out = shard(ckpt.path(), 4, &tmp.path().join("tp4"), &[]);
    assert_refused(
        &out,
        3,
        &[
            "If tensor parallel world size does not divide num_groups, then num_groups must equal 1.",
            "choose a --tp that divides n_groups (2)",
        ],
    );
    let sizes = wload_json(&["sizes", s(ckpt.path()), "--json"]);
    let text = sizes.to_string();
    assert!(text.contains("num_groups must equal 1"), "{text}");
}

// --- Granite 4, compressed-tensors FP8 ----------------------------------------------------------

/// The granite4 fixture as an llm-compressor FP8 release (vllm-spec §13.3 `granite4_fp8`): every
/// linear layer but the MoE's and lm_head F8_E4M3 with BF16 channel scales `[out, 1]`, dynamic
/// activations; conv1d stays BF16 (not a Linear to the compressor).
fn granite4_fp8() -> (TempDir, Tensors) {
    let fixture = fixture("granite4");
    let mut c = checkpoint_tensors(&fixture);
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture.join("config.json")).unwrap()).unwrap();
    let scheme = serde_json::json!({"num_bits": 8, "type": "float", "symmetric": true, "dynamic": false, "strategy": "channel"});
    let dynamic = serde_json::json!({"num_bits": 8, "type": "float", "symmetric": true, "dynamic": true, "strategy": "token"});
    config["quantization_config"] = serde_json::json!({
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": scheme, "input_activations": dynamic}},
        "ignore": ["lm_head", "re:.*block_sparse_moe.*"]
    });
    let linear: Vec<String> = (c.keys())
        .filter(|n| {
            ["in_proj", "out_proj", "_proj.weight", "shared_mlp"]
                .iter()
                .any(|p| n.contains(p))
                && n.ends_with(".weight")
                && !n.contains("block_sparse_moe")
        })
        .cloned()
        .collect();
    for (t, name) in linear.iter().enumerate() {
        let w = &c[name];
        // Any E4M3 code but the NaNs (0x7F, 0xFF).
        let f8: Vec<u8> = (w.data.chunks(2))
            .map(|b| if b[0] & 0x7F == 0x7F { 0 } else { b[0] })
            .collect();
        let shape: Vec<usize> = w.shape.iter().map(|&d| d as usize).collect();
        let rows = shape[0];
        c.insert(name.clone(), Held::new("F8_E4M3", &shape, f8));
        let scale = bf16(&[rows, 1], bf16_data(1000 + t as u64, rows));
        c.insert(name.replace(".weight", ".weight_scale"), scale);
    }
    (write_checkpoint(&config, &c), c)
}

/// TP 2: in_proj F8 `[164, 128]` and its F32 channel scale `[164, 1]` with the same rows
/// `[z_r; x_r; B; C; dt_r]` (the mamba-v2 loader is installed on both), out_proj F8 columns with
/// its `[H, 1]` scale whole, conv1d and the MoE still BF16, the compressed-tensors kv-cache
/// parameters on the attention layer.
#[test]
fn granite4_compressed_fp8_in_proj_scale_follows_the_weights_rows() {
    let (ckpt, c) = granite4_fp8();
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("tp2");
    shard_ok(ckpt.path(), 2, &out, &["-q"]);
    let bf16_c = checkpoint_tensors(&fixture("granite4"));
    let m = GRANITE;
    let spec = [
        (0, m.i, false),
        (m.i, m.i, false),
        (2 * m.i, m.n, true),
        (2 * m.i + m.n, m.n, true),
        (2 * m.i + 2 * m.n, m.nh, false),
    ];
    for r in 0..2usize {
        let got = rank_tensors(&out, r as u64);
        let bf16_want = granite_rank(&bf16_c, r, 2);
        let ctx = format!("granite4 fp8 tp2 rank {r}");
        for l in [0, 2] {
            let p = format!("model.layers.{l}.mamba");
            let (rows, w) = parts(&c[&format!("{p}.in_proj.weight")], &spec, r, 2);
            assert_tensor(
                &got,
                &format!("{p}.in_proj.weight"),
                "F8_E4M3",
                &[rows, 128],
                &w,
                &ctx,
            );
            let scale = c[&format!("{p}.in_proj.weight_scale")].to_f32();
            let (rows, s) = parts(&scale, &spec, r, 2);
            assert_eq!(rows, 164, "{ctx}");
            assert_tensor(
                &got,
                &format!("{p}.in_proj.weight_scale"),
                "F32",
                &[164, 1],
                &s,
                &ctx,
            );
            let o = c[&format!("{p}.out_proj.weight")].cols(r * 64, (r + 1) * 64);
            assert_tensor(
                &got,
                &format!("{p}.out_proj.weight"),
                "F8_E4M3",
                &[128, 64],
                &o,
                &ctx,
            );
            let os = c[&format!("{p}.out_proj.weight_scale")].to_f32().data;
            assert_tensor(
                &got,
                &format!("{p}.out_proj.weight_scale"),
                "F32",
                &[128, 1],
                &os,
                &ctx,
            );
            for n in [
                "conv1d.weight",
                "conv1d.bias",
                "A",
                "D",
                "dt_bias",
                "norm.weight",
            ] {
                let k = format!("{p}.{n}");
                assert_eq!(got[&k], bf16_want[&k], "{ctx}: {k}");
            }
        }
        for l in 0..3 {
            let k = format!("model.layers.{l}.block_sparse_moe.experts.routed_experts.w13_weight");
            assert_eq!(got[&k], bf16_want[&k], "{ctx}: {k}");
        }
        let at = "model.layers.1.self_attn";
        assert_eq!(
            got[&format!("{at}.qkv_proj.weight_scale")].shape,
            [128, 1],
            "{ctx}"
        );
        for (n, dtype) in [
            ("k_scale", "F32"),
            ("v_scale", "F32"),
            ("q_zero_point", "BF16"),
        ] {
            let t = &got[&format!("{at}.attn.{n}")];
            assert_eq!(
                (t.dtype.as_str(), t.shape.as_slice()),
                (dtype, &[1u64][..]),
                "{ctx}: {n}"
            );
        }
    }
}
