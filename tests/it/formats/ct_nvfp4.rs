//! compressed-tensors `nvfp4-pack-quantized`: the ModelOpt NVFP4 golden fixture's tensors renamed
//! to compressed-tensors' names under a compressed-tensors config shard, at every TP size, into
//! the ModelOpt output's tensors renamed (same bytes, same order), with the compressed-tensors
//! kv-cache parameters; unpacked and put back together they are the checkpoint; W4A16 has no
//! input scales; experts split under TP and EP (their input scales are the rank's experts' on
//! every backend); vLLM's refusals with its words and the fix.

use std::path::Path;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::{
    Fp4Names, Held, Tensors, assert_llama_gqa_fp4_reassembles, assert_refusal_text,
    checkpoint_tensors, clean_plan_json, fixture, json_tensor, rank_tensors, read_config, shard,
    shard_ok, wload_json, write_config, write_held,
};

const MODELOPT: &str = "llama_gqa_modelopt_nvfp4";

/// compressed-tensors' name for a ModelOpt NVFP4 linear tensor name (checkpoint or output).
fn ct_name(name: &str) -> Option<String> {
    let (module, last) = name.rsplit_once('.')?;
    let last = match last {
        "weight_scale_2" => "weight_global_scale",
        "input_scale" => "input_global_scale",
        other => other,
    };
    Some(format!("{module}.{last}"))
}

/// An NVFP4 args object: 4-bit floats, tensor-group scales of 16.
fn nvfp4_args(dynamic: Value) -> Value {
    json!({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
           "symmetric": true, "dynamic": dynamic})
}

/// A compressed-tensors config: W4A4 (NVFP4 activations, dynamic local) or W4A16.
fn ct_config(w4a4: bool) -> Value {
    json!({
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"], "weights": nvfp4_args(json!(false)),
            "input_activations": if w4a4 { nvfp4_args(json!("local")) } else { Value::Null }}}
    })
}

/// The ModelOpt fixture as compressed-tensors stores it: `weight_packed`, `weight_global_scale`
/// `[1]`, `weight_scale`, and `input_global_scale` `[1]` for W4A4 only.
fn ct_fixture(w4a4: bool) -> TempDir {
    let src = fixture(MODELOPT);
    let ck = checkpoint_tensors(&src);
    let quantized: Vec<&str> = (ck.keys())
        .filter_map(|k| k.strip_suffix(".weight_scale_2"))
        .collect();
    let mut out = Tensors::new();
    for (name, t) in &ck {
        let (module, last) = name.rsplit_once('.').unwrap();
        if !quantized.contains(&module) {
            out.insert(name.clone(), t.clone());
            continue;
        }
        let (last, shape) = match last {
            "weight" => ("weight_packed", t.shape.clone()),
            "weight_scale" => ("weight_scale", t.shape.clone()),
            "weight_scale_2" => ("weight_global_scale", vec![1]),
            "input_scale" if w4a4 => ("input_global_scale", vec![1]),
            "input_scale" => continue,
            other => panic!("{name}: unexpected {other}"),
        };
        let held = Held { shape, ..t.clone() };
        out.insert(format!("{module}.{last}"), held);
    }
    let dir = TempDir::new().unwrap();
    let mut config = read_config(&src);
    config.insert("quantization_config".into(), ct_config(w4a4));
    write_config(dir.path(), config);
    std::fs::copy(
        src.join("generation_config.json"),
        dir.path().join("generation_config.json"),
    )
    .unwrap();
    write_held(&dir.path().join("model.safetensors"), &out);
    dir
}

/// Every tensor of rank `r` of `source` sharded into `dir` at `tp`, in vLLM's registration order
/// (the plan's; part files sort their headers by name): (name, dtype, shape, bytes).
fn ordered(source: &Path, tp: u64, dir: &Path, r: u64) -> Vec<(String, String, Vec<u64>, Vec<u8>)> {
    let held = rank_tensors(dir, r);
    let plan = clean_plan_json(source, &["--tp", &tp.to_string()]);
    let listed = plan["ranks"][r as usize]["tensors"].as_array().unwrap();
    assert_eq!(listed.len(), held.len(), "rank {r}: plan and files");
    listed
        .iter()
        .map(|t| {
            let (name, dtype, shape) = json_tensor(t);
            let h = &held[&name];
            assert_eq!((&h.dtype, &h.shape), (&dtype, &shape), "rank {r} {name}");
            (name, dtype, shape, h.data.clone())
        })
        .collect()
}

/// The kv-cache method's parameters (not the Attention layer's own `_k_scale` buffers).
fn is_kv_param(name: &str) -> bool {
    name.contains(".attn.")
        && !name.contains(".attn._")
        && (name.ends_with("_scale") || name.ends_with("_zero_point"))
}

/// Same data as ModelOpt, renamed: every non-kv tensor of every rank, in order, is the ModelOpt
/// output's under compressed-tensors' name; the kv-cache parameters are
/// `CompressedTensorsKVCacheMethod`'s (F32 `[1]` ones, then BF16 `[1]` zero points).
#[test]
fn ct_ranks_are_the_modelopt_ranks_renamed_at_every_tp() {
    let ct = ct_fixture(true);
    for tp in [1u64, 2, 4, 8] {
        let (mo_out, ct_out) = (TempDir::new().unwrap(), TempDir::new().unwrap());
        let modelopt = fixture(MODELOPT);
        shard_ok(&modelopt, tp, mo_out.path(), &[]);
        shard_ok(ct.path(), tp, ct_out.path(), &[]);
        for r in 0..tp {
            let got = ordered(ct.path(), tp, ct_out.path(), r);
            let want: Vec<_> = ordered(&modelopt, tp, mo_out.path(), r)
                .into_iter()
                .filter(|t| !is_kv_param(&t.0))
                .map(|(n, d, s, b)| {
                    let quantized = d == "U8";
                    let n = if quantized {
                        format!("{n}_packed")
                    } else {
                        ct_name(&n).unwrap()
                    };
                    (n, d, s, b)
                })
                .collect();
            let (kv, rest): (Vec<_>, Vec<_>) = got.into_iter().partition(|t| is_kv_param(&t.0));
            assert_eq!(rest.len(), want.len(), "tp{tp} rank {r}: tensor count");
            for (g, w) in rest.iter().zip(&want) {
                assert_eq!(
                    (&g.0, &g.1, &g.2),
                    (&w.0, &w.1, &w.2),
                    "tp{tp} rank {r}: order, dtype, shape"
                );
                assert!(g.3 == w.3, "tp{tp} rank {r}: {} bytes differ", g.0);
            }
            let one = 1.0f32.to_le_bytes().to_vec();
            for layer in 0..2 {
                let a = format!("model.layers.{layer}.self_attn.attn");
                let want_kv: Vec<_> = ["k_scale", "v_scale", "q_scale"]
                    .map(|s| (format!("{a}.{s}"), "F32", vec![1u64], one.clone()))
                    .into_iter()
                    .chain(
                        ["k_zero_point", "v_zero_point", "q_zero_point"]
                            .map(|s| (format!("{a}.{s}"), "BF16", vec![1u64], vec![0u8, 0])),
                    )
                    .collect();
                let got_kv: Vec<_> = (kv.iter())
                    .filter(|t| t.0.starts_with(&a))
                    .map(|(n, d, s, b)| (n.clone(), d.as_str(), s.clone(), b.clone()))
                    .collect();
                assert_eq!(got_kv, want_kv, "tp{tp} rank {r} {a}");
            }
        }
    }
}

#[test]
fn ct_unpacked_ranks_put_back_together_are_the_checkpoint_at_every_tp() {
    let names = Fp4Names {
        weight: "weight_packed",
        per_part: &["weight_global_scale", "input_global_scale"],
    };
    assert_llama_gqa_fp4_reassembles(ct_fixture(true).path(), &names, &[1, 2, 4, 8]);
}

/// W4A16 (no `input_activations`): `CompressedTensorsW4A4Fp4(use_a16=True)` registers no input
/// scale at all (ModelOpt's W4A16 keeps a NaN one).
#[test]
fn ct_w4a16_linears_have_no_input_scale() {
    let ct = ct_fixture(false);
    let out = TempDir::new().unwrap();
    shard_ok(ct.path(), 2, out.path(), &[]);
    let names = Fp4Names {
        weight: "weight_packed",
        per_part: &["weight_global_scale"],
    };
    assert_llama_gqa_fp4_reassembles(ct.path(), &names, &[2]);
    for r in 0..2 {
        let t = rank_tensors(out.path(), r);
        let q = "model.layers.0.self_attn.qkv_proj";
        assert_eq!(t[&format!("{q}.weight_global_scale")].shape, [3]);
        let inputs: Vec<&String> = (t.keys())
            .filter(|k| k.ends_with("input_global_scale") || k.ends_with("input_scale"))
            .collect();
        assert!(inputs.is_empty(), "rank {r}: {inputs:?}");
    }
}

/// A copy of the CT fixture whose `config_groups.group_0` is changed by `edit`.
fn ct_with(edit: impl FnOnce(&mut Value)) -> TempDir {
    let dir = ct_fixture(true);
    let mut config = read_config(dir.path());
    edit(&mut config["quantization_config"]["config_groups"]["group_0"]);
    write_config(dir.path(), config);
    dir
}

#[test]
fn ct_nvfp4_refusals_name_the_rule_and_the_fix() {
    let out = TempDir::new().unwrap();
    let fp8_input = ct_with(|g| {
        g["input_activations"] = json!({"num_bits": 8, "type": "float", "strategy": "token",
                                        "symmetric": true, "dynamic": true});
    });
    let o = shard(fp8_input.path(), 2, &out.path().join("a"), &[]);
    let text = assert_refusal_text(
        &o,
        3,
        &[
            "For NVFP4 weights, input quantization must also be NVFP4 format, None for NVFP4A16",
            "config_groups.group_0.input_activations",
        ],
    );
    assert!(text.contains("unquantized"), "{text}");
    let group32 = ct_with(|g| g["weights"]["group_size"] = json!(32));
    let o = shard(group32.path(), 2, &out.path().join("b"), &[]);
    let text = assert_refusal_text(
        &o,
        3,
        &[
            "No compressed-tensors compatible scheme",
            "group_size 32",
            "tensor_group",
        ],
    );
    assert!(text.contains("check config_groups"), "{text}");
    // o_proj's input 128 at tp 16 leaves 8 columns per rank: half a scale group.
    let ct = ct_fixture(true);
    let o = shard(ct.path(), 16, &out.path().join("c"), &[]);
    let text = assert_refusal_text(
        &o,
        3,
        &[
            "model.layers.0.self_attn.o_proj",
            "whole groups of 16",
            "per rank at tp 16: 8",
        ],
    );
    assert!(text.contains("use a TP size"), "{text}");
    assert!(!out.path().join("c").exists());
}

#[test]
fn inspect_describes_ct_nvfp4() {
    for (w4a4, act) in [(true, "nvfp4"), (false, "none")] {
        let ct = ct_fixture(w4a4);
        let v = wload_json(&["inspect", crate::support::s(ct.path()), "--json"]);
        let q = &v["quantization"];
        assert_eq!(q["method"], "compressed-tensors", "{v}");
        assert_eq!(
            (&q["scheme"], &q["bits"], &q["group_size"]),
            (&json!("group"), &json!(4), &json!(16)),
            "{q}"
        );
        assert_eq!(q["activation_scheme"], act, "{q}");
        let w = q["weights"].as_str().unwrap();
        assert!(
            w.contains("weight_packed") && w.contains("weight_global_scale"),
            "{w}"
        );
    }
}

/// nvfp4.rs's one-layer Qwen3-MoE (4 experts, hidden 64, expert intermediate 64) with its expert
/// tensors renamed to compressed-tensors' and attention and router left out by `ignore`.
fn ct_moe() -> TempDir {
    let dir = TempDir::new().unwrap();
    super::nvfp4::nvfp4_moe(dir.path());
    std::fs::remove_file(dir.path().join("hf_quant_config.json")).unwrap();
    let ck = checkpoint_tensors(dir.path());
    let renamed: Tensors = (ck.into_iter())
        .map(|(name, t)| {
            if !name.contains(".experts.") {
                return (name, t);
            }
            let (module, last) = name.rsplit_once('.').unwrap();
            let (last, shape) = match last {
                "weight" => ("weight_packed", t.shape.clone()),
                "weight_scale_2" => ("weight_global_scale", vec![1]),
                "input_scale" => ("input_global_scale", vec![1]),
                other => (other, t.shape.clone()),
            };
            (format!("{module}.{last}"), Held { shape, ..t })
        })
        .collect();
    write_held(&dir.path().join("model.safetensors"), &renamed);
    let mut config = read_config(dir.path());
    let mut q = ct_config(true);
    q["ignore"] = json!(["lm_head", "re:.*self_attn.*", "re:.*mlp\\.gate$"]);
    config.insert("quantization_config".into(), q);
    write_config(dir.path(), config);
    dir
}

/// Per rank under TP 2 (every expert, half the intermediate) and EP 2 (half the experts, whole):
/// vLLM's parameters in order, and expert 3's bytes and [gate, up] global scales where they land.
/// The input scales are the rank's experts' under EP too (`num_experts` is the local count and
/// `input_global_scale` loads by local id on every backend), so EP is not refused here.
#[test]
fn ct_nvfp4_experts_split_under_tp_and_ep() {
    let src = ct_moe();
    let ck = checkpoint_tensors(src.path());
    let base = "model.layers.0.mlp.experts.routed_experts";
    let x = "model.layers.0.mlp.experts";
    for (ep, e_l, i_r) in [(false, 4u64, 32u64), (true, 2, 64)] {
        let out = TempDir::new().unwrap();
        let flags: &[&str] = if ep {
            &["--enable-expert-parallel"]
        } else {
            &[]
        };
        shard_ok(src.path(), 2, out.path(), flags);
        let mut args = vec!["--tp", "2"];
        args.extend_from_slice(flags);
        let plan = clean_plan_json(src.path(), &args);
        for r in 0..2u64 {
            let t = rank_tensors(out.path(), r);
            let order: Vec<(String, String, Vec<u64>)> = (plan["ranks"][r as usize]["tensors"])
                .as_array()
                .unwrap()
                .iter()
                .map(json_tensor)
                .filter(|(n, _, _)| n.starts_with(base))
                .collect();
            let want: Vec<(String, String, Vec<u64>)> = [
                ("w13_weight_packed", "U8", vec![e_l, 2 * i_r, 32]),
                ("w2_weight_packed", "U8", vec![e_l, 64, i_r / 2]),
                ("w13_weight_scale", "F8_E4M3", vec![e_l, 2 * i_r, 4]),
                ("w2_weight_scale", "F8_E4M3", vec![e_l, 64, i_r / 16]),
                ("w13_weight_global_scale", "F32", vec![e_l, 2]),
                ("w2_weight_global_scale", "F32", vec![e_l]),
                ("w13_input_global_scale", "F32", vec![e_l, 2]),
                ("w2_input_global_scale", "F32", vec![e_l]),
            ]
            .into_iter()
            .map(|(n, d, s)| (format!("{base}.{n}"), d.to_string(), s))
            .collect();
            assert_eq!(order, want, "ep {ep} rank {r}: vLLM's order and shapes");
            for (n, d, s) in &want {
                assert_eq!((&t[n].dtype, &t[n].shape), (d, s), "ep {ep} rank {r} {n}");
            }
            // Global expert 3: local 3 under TP, rank 1's local 1 under EP.
            let local = match (ep, r) {
                (false, _) => 3,
                (true, 1) => 1,
                (true, _) => continue,
            };
            let i_at = if ep { 0 } else { r as usize * i_r as usize };
            let i_r = i_r as usize;
            let w13 = &t[&format!("{base}.w13_weight_packed")];
            let per = w13.data.len() / e_l as usize;
            let rows = |m: &Held| m.rows(i_at, i_at + i_r).to_vec();
            let (gate, up) = (
                &ck[&format!("{x}.3.gate_proj.weight_packed")],
                &ck[&format!("{x}.3.up_proj.weight_packed")],
            );
            assert_eq!(
                &w13.data[local * per..(local + 1) * per],
                &[rows(gate), rows(up)].concat()[..],
                "ep {ep} rank {r} expert 3 w13"
            );
            let w2 = &t[&format!("{base}.w2_weight_packed")];
            let per = w2.data.len() / e_l as usize;
            let down = &ck[&format!("{x}.3.down_proj.weight_packed")];
            assert_eq!(
                w2.data[local * per..(local + 1) * per].to_vec(),
                down.cols(i_at / 2, (i_at + i_r) / 2),
                "ep {ep} rank {r} expert 3 w2"
            );
            for scale in ["weight_global_scale", "input_global_scale"] {
                let got = &t[&format!("{base}.w13_{scale}")];
                let want = [
                    ck[&format!("{x}.3.gate_proj.{scale}")].data.clone(),
                    ck[&format!("{x}.3.up_proj.{scale}")].data.clone(),
                ]
                .concat();
                assert_eq!(
                    &got.data[local * 8..local * 8 + 8],
                    &want[..],
                    "ep {ep} rank {r} expert 3 [gate, up] {scale}"
                );
            }
        }
    }
}
