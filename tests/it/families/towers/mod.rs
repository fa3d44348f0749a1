//! Vision towers served with images (spec §13.1): Gemma 3's SigLIP, Mistral 3's Pixtral, Llama
//! 4's vision model and Qwen3.5's ViT. Each family's test writes vLLM's rules for its tower out
//! as a table, [`Cut`] per tensor, and every rank wload writes is compared with the tensors the
//! table cuts from the checkpoint, in vLLM's registration order; the text model beside it is the
//! `--language-model-only` output's. The rules themselves: a Linear is split as in a text layer
//! (q/k/v fused `[q_r; k_r; v_r]`, the tower's heads also its kv heads; column-parallel rows,
//! biases included; row-parallel columns, the bias whole on every rank); everything else whole;
//! `--mm-encoder-tp-mode data` holds every tower Linear whole (q/k/v still fused) where the model
//! supports it.

mod gemma3;
mod llama4;
mod mistral3;
mod qwen3_5;

use std::path::{Path, PathBuf};

use crate::support::*;

/// How vLLM cuts a checkpoint tensor (or several, fused) into a rank's tensor.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Cut {
    /// Whole on every rank (norms, embeddings, convolutions, row-parallel biases).
    Whole,
    /// Column-parallel: rows `[r·n/tp, (r+1)·n/tp)` of each source, stacked (gate/up fused
    /// from two sources; a bias as its weight).
    Rows,
    /// Row-parallel: columns `[r·k/tp, (r+1)·k/tp)`.
    Cols,
    /// q, k, v (three sources, or one fused source cut in thirds): each one's rows as `Rows`.
    Qkv,
    /// Column-parallel even in data mode (Llama 4's projector, built without disable_tp).
    RowsAlways,
}

/// One rank tensor: its name, how it is cut, and the checkpoint tensors it is cut from.
pub(super) struct Rule {
    pub to: String,
    pub cut: Cut,
    pub from: Vec<String>,
}

/// A rule: rank tensor `to` cut by `cut` from the checkpoint tensors `from`.
pub(super) fn rule(to: impl Into<String>, cut: Cut, from: &[String]) -> Rule {
    Rule {
        to: to.into(),
        cut,
        from: from.to_vec(),
    }
}

/// One tower layer's rules, in vLLM's order (`l` names the layer's tensors): q, k, v fused into
/// `self_attn.qkv_proj` (weight and bias, as the ViTs with biased attention have them), then
/// `rest`, each tensor cut from itself.
pub(super) fn layer_rules(t: &mut Vec<Rule>, l: impl Fn(&str) -> String, rest: &[(&str, Cut)]) {
    let qkv = |p: &str| ["q", "k", "v"].map(|x| l(&format!("self_attn.{x}_proj.{p}")));
    for p in ["weight", "bias"] {
        t.push(rule(
            l(&format!("self_attn.qkv_proj.{p}")),
            Cut::Qkv,
            &qkv(p),
        ));
    }
    for &(n, c) in rest {
        t.push(rule(l(n), c, &[l(n)]));
    }
}

/// Rank `r` of `tp`'s tensor for `rule`, from the checkpoint `c`; with `data` (the whole tower
/// on every rank) every cut but [`Cut::RowsAlways`] takes the sources whole.
fn cut(c: &Tensors, rule: &Rule, r: usize, tp: usize, data: bool) -> Held {
    let src: Vec<&Held> = rule
        .from
        .iter()
        .map(|n| c.get(n).unwrap_or_else(|| panic!("checkpoint lacks {n}")))
        .collect();
    let first = src[0];
    let mut shape: Vec<usize> = first.shape.iter().map(|&d| d as usize).collect();
    let whole = data && rule.cut != Cut::RowsAlways;
    let rows = |t: &Held, parts: usize, k: usize| -> Vec<u8> {
        // Part `k` of `parts` equal parts, then this rank's rows of it.
        let n = t.shape[0] as usize / parts;
        let (a, b) = if whole {
            (0, n)
        } else {
            (r * n / tp, (r + 1) * n / tp)
        };
        t.rows(k * n + a, k * n + b).to_vec()
    };
    let data = match rule.cut {
        Cut::Whole => src.iter().flat_map(|t| t.data.clone()).collect::<Vec<u8>>(),
        Cut::Cols if !whole => {
            let k = shape[1];
            shape[1] = k / tp;
            first.cols(r * k / tp, (r + 1) * k / tp)
        }
        Cut::Cols => first.data.clone(),
        Cut::Rows | Cut::RowsAlways => src.iter().flat_map(|t| rows(t, 1, 0)).collect(),
        Cut::Qkv if src.len() == 1 => (0..3).flat_map(|k| rows(first, 3, k)).collect(),
        Cut::Qkv => src.iter().flat_map(|t| rows(t, 1, 0)).collect(),
    };
    let el = first.data.len() / first.shape.iter().product::<u64>().max(1) as usize;
    let row: usize = shape[1..].iter().product();
    shape[0] = data.len() / el / row.max(1);
    Held::new(&first.dtype, &shape, data)
}

/// What the table says rank `r` of `tp` holds of the tower, in its order.
pub(super) fn tower_rank(
    c: &Tensors,
    rules: &[Rule],
    r: usize,
    tp: usize,
    data: bool,
) -> Vec<(String, Held)> {
    rules
        .iter()
        .map(|x| (x.to.clone(), cut(c, x, r, tp, data)))
        .collect()
}

/// The tensor names rank `r` holds in vLLM's state_dict order (what `plan --json` lists).
fn state_dict_order(plan: &serde_json::Value, r: usize) -> Vec<String> {
    plan["ranks"][r]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

/// `wload shard` of `src` at `tp` with `flags` into `dir/name`.
pub(super) fn sharded(src: &Path, dir: &Path, name: &str, tp: u64, flags: &[&str]) -> PathBuf {
    let out = dir.join(name);
    shard_ok(src, tp, &out, &[&["-q"], flags].concat());
    out
}

/// `src` sharded at `tp` (with `--mm-encoder-tp-mode data` when `data`) into `dir`: every rank
/// holds, first in vLLM's state_dict order, exactly the tower the table cuts (names, dtypes,
/// shapes, bytes), then exactly the text model it holds with `--language-model-only`.
pub(super) fn assert_tower_then_text(
    src: &Path,
    dir: &Path,
    rules: &[Rule],
    (tp, data): (u64, bool),
) {
    let mode: &[&str] = if data {
        &["--mm-encoder-tp-mode", "data"]
    } else {
        &[]
    };
    let out = sharded(src, dir, &format!("tp{tp}-{data}"), tp, mode);
    let text = sharded(
        src,
        dir,
        &format!("lm{tp}-{data}"),
        tp,
        &["--language-model-only"],
    );
    let plan = clean_plan_json(src, &[&["--tp", &tp.to_string()][..], mode].concat());
    let c = checkpoint_tensors(src);
    let tp = tp as usize;
    for r in 0..tp {
        let ctx = format!("tp{tp}{} rank {r}", if data { " data" } else { "" });
        let got = rank_tensors(&out, r as u64);
        let want = tower_rank(&c, rules, r, tp, data);
        let order = state_dict_order(&plan, r);
        let names: Vec<&String> = want.iter().map(|(n, _)| n).collect();
        assert_eq!(
            order.iter().take(want.len()).collect::<Vec<_>>(),
            names,
            "{ctx}: the tower first, in vLLM's registration order"
        );
        for (name, w) in &want {
            let g = &got[name];
            assert_eq!((&g.dtype, &g.shape), (&w.dtype, &w.shape), "{ctx}: {name}");
            assert!(
                g.data == w.data,
                "{ctx}: {name}: other bytes than the rule's"
            );
        }
        let text = rank_tensors(&text, r as u64);
        assert_eq!(got.len(), want.len() + text.len(), "{ctx}: tower + text");
        for (name, t) in &text {
            assert!(
                got.get(name) == Some(t),
                "{ctx}: {name} as with --language-model-only"
            );
        }
    }
}

/// `--mm-encoder-tp-mode data` for a model vLLM does not support it for: vLLM's warning, in its
/// words, from `plan`, `shard` and `load`; the files, the record and the serve line those of
/// the default mode (vLLM serves the split tower).
pub(super) fn assert_data_mode_falls_back(src: &Path, weights: &Path, dir: &Path) {
    let words = "This model does not support `--mm-encoder-tp-mode data`. Falling back to \
                 `--mm-encoder-tp-mode weights`.";
    let flag = ["--mm-encoder-tp-mode", "data"];
    let plan = run(&[&["plan", s(src), "--tp", "2"], &flag[..]].concat());
    assert!(plan.status.success(), "{}", context(&plan));
    assert!(
        stderr(&plan).contains(&format!("warning: {words}")),
        "{}",
        context(&plan)
    );
    let out = dir.join("data");
    let shard = shard(src, 2, &out, &flag);
    assert!(shard.status.success(), "{}", context(&shard));
    assert!(stderr(&shard).contains(words), "{}", context(&shard));
    for r in 0..2 {
        let name = format!("model-rank-{r}-part-0.safetensors");
        assert_eq!(
            std::fs::read(out.join(&name)).unwrap(),
            std::fs::read(weights.join(&name)).unwrap(),
            "{name}: the split tower"
        );
    }
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("wload.json")).unwrap()).unwrap();
    assert!(m.get("mm_encoder_tp_mode").is_none(), "{m:#}");
    assert!(
        !m["serve"]["shell"].as_str().unwrap().contains("mm-encoder"),
        "{m:#}"
    );
    // Loading the folder with the flag falls back as serving it does: no disagreement.
    let load = run(&[&["load", s(&out), "--dry-run"], &flag[..]].concat());
    assert!(load.status.success(), "{}", context(&load));
    assert!(
        stdout(&load).contains(&format!("warning: {words}")),
        "{}",
        context(&load)
    );
}
