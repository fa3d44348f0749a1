//! `inspect`'s structure section: attention and its layers, experts and their layers, MTP, the
//! vision tower.

use std::io::{self, Write};

use crate::model::structure::{Attention, Moe, QLora, Structure};
use crate::report::{Esc, thousands};
use crate::units::plural;

/// What a deployer weighs before picking `--tp` / `--enable-expert-parallel`: one line per item.
/// Without a mapping (`support.structure_from` "config.json") the section says so in its title,
/// and claims nothing the config does not state (no "dense MLP" for an absent expert count).
pub(super) fn write_structure(
    w: &mut dyn Write,
    s: &Structure,
    support: &crate::commands::inspect::support::Support,
) -> io::Result<()> {
    let guessed = support.structure_from != "mapping";
    if guessed {
        writeln!(
            w,
            "\nstructure (read from config.json only: without a mapping, the family's defaults and derived sizes are unknown)"
        )?;
    } else {
        writeln!(w, "\nstructure")?;
    }
    let mut rows = attention_rows(&s.attention);
    if let Some(a) = &s.attention_layers {
        let layers = match (&a.full, &a.linear) {
            (Some(full), Some(linear)) => {
                layer_runs((full, "full attention"), (linear, "linear attention"))
            }
            _ => "unknown".into(),
        };
        rows.push((
            "attention layers",
            format!("{layers}{}", rule(&a.layer_rule)),
        ));
    }
    match &s.moe {
        Some(m) => rows.extend(moe_rows(m)),
        None if guessed => rows.push(("experts", "none named in config.json".into())),
        None => rows.push(("experts", "none (a dense MLP on every layer)".into())),
    }
    rows.extend(mtp_row(s).map(|n| ("mtp", n)));
    rows.extend(module_tree_row(s).map(|n| ("module tree", n)));
    for (k, v) in rows {
        writeln!(w, "  {k:<20} {}", Esc(&v))?;
    }
    Ok(())
}

/// The multi-token-prediction layers vLLM's main model skips; `None` when there are none.
fn mtp_row(s: &Structure) -> Option<String> {
    match s.mtp_layers {
        Some(0) => None,
        Some(n) => Some(format!(
            "{n} layer{} past num_hidden_layers{}: vLLM's main model skips {}",
            plural(n),
            s.mtp_field
                .as_ref()
                .map_or_else(String::new, |f| format!(" ({f})")),
            if n == 1 { "it" } else { "them" }
        )),
        None => Some("unknown".into()),
    }
}

/// For a family vLLM builds per platform: which build's keys a sharded folder holds, and so
/// where it loads.
fn module_tree_row(s: &Structure) -> Option<String> {
    s.module_tree.as_ref().map(|t| {
        format!(
            "{t}: vLLM names this family's modules per platform; a sharded folder holds the {t} build's keys and loads only on {t}"
        )
    })
}

/// The encoder's size, and what `--language-model-only` does with it.
pub(super) fn write_tower(
    w: &mut dyn Write,
    t: &crate::commands::inspect::tower::Tower,
) -> io::Result<()> {
    let how = match (t.mapped, t.data_mode) {
        (true, true) => {
            "split over --tp, or whole on every rank with --mm-encoder-tp-mode data; none with --language-model-only"
        }
        (true, false) => {
            "split over --tp (vLLM has no --mm-encoder-tp-mode data for this model: it falls back to weights); none with --language-model-only"
        }
        (false, _) => {
            "not mapped by wload: shard with --language-model-only (the text model alone)"
        }
    };
    let (n, size) = (thousands(t.tensors), crate::units::human_bytes(t.bytes));
    let line = format!("{n} tensors, {size} ({}): {how}", t.modules.join(", "));
    writeln!(w, "  {:<20} {}", "vision tower", Esc(&line))
}

/// A structure field the config leaves unknown (absent without a default, or not a number).
fn known<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "unknown".into(), T::to_string)
}

fn attention_rows(a: &Attention) -> Vec<(&'static str, String)> {
    let (kind, h) = match a {
        Attention::Mha(h) => ("MHA", h),
        Attention::Gqa(h) => ("GQA", h),
        Attention::Mqa(h) => ("MQA", h),
        Attention::Mla(m) => {
            let q = match m.q_lora_rank {
                QLora::Rank(r) => format!("q_lora_rank {r}"),
                QLora::None => "q_lora_rank none (q_proj from the hidden state)".into(),
                QLora::Unknown(_) => "q_lora_rank unknown".into(),
            };
            let kv = known(&m.kv_lora_rank);
            return vec![
                (
                    "attention",
                    format!(
                        "MLA: {} heads; {q}, kv_lora_rank {kv} (k and v are one shared latent: no kv heads to replicate)",
                        m.heads
                    ),
                ),
                (
                    "mla head dims",
                    format!(
                        "qk_nope {} + qk_rope {}, v {}",
                        known(&m.qk_nope_head_dim),
                        known(&m.qk_rope_head_dim),
                        known(&m.v_head_dim)
                    ),
                ),
            ];
        }
    };
    vec![(
        "attention",
        format!(
            "{kind}: {} heads, {} kv head{}, head_dim {}",
            h.heads,
            h.kv_heads,
            plural(h.kv_heads),
            known(&h.head_dim)
        ),
    )]
}

fn moe_rows(m: &Moe) -> Vec<(&'static str, String)> {
    let mut rows = vec![(
        "experts",
        format!(
            "{} routed, {} per token, intermediate {}",
            known(&m.routed_experts),
            known(&m.experts_per_token),
            known(&m.expert_intermediate_size)
        ),
    )];
    if let Some(s) = &m.shared_experts {
        let gate = s.gate.map_or_else(String::new, |g| {
            format!(", scaled by {g}(shared_expert_gate)")
        });
        let fused = if s.count == 1 {
            format!("1, intermediate {}", known(&s.intermediate_size))
        } else {
            format!(
                "{} × {}, fused into one MLP of {}",
                s.count,
                known(&s.intermediate_size),
                known(&s.fused_intermediate_size)
            )
        };
        rows.push((
            "shared experts",
            format!("{fused}{gate}; tensor-parallel even with expert parallelism"),
        ));
    }
    let layers = match (&m.moe_layers, &m.dense_layers) {
        (Some(moe), Some(dense)) => layer_runs((moe, "MoE"), (dense, "dense")),
        _ => "unknown".into(),
    };
    rows.push(("layers", format!("{layers}{}", rule(&m.layer_rule))));
    let r = &m.router;
    let mut router = format!("{} scoring", known(&r.scoring_func));
    if let Some(t) = &r.topk_method {
        router.push_str(&format!(", topk_method {t}"));
    }
    if r.e_score_correction_bias {
        router.push_str(&format!(
            ": F32 e_score_correction_bias [{}]",
            known(&m.routed_experts)
        ));
    }
    if r.bias {
        router.push_str(", with a router bias");
    }
    rows.push(("router", router));
    rows
}

/// " (the config fields that decide it)", or nothing.
fn rule(r: &Option<String>) -> String {
    r.as_ref().map_or_else(String::new, |r| format!(" ({r})"))
}

/// Runs of two kinds of layers ("layers 0–2 dense, 3–60 MoE"), each given by its ascending
/// indices and its name; counts instead when the pattern alternates too often to read.
fn layer_runs((yes, yes_kind): (&[u64], &str), (no, no_kind): (&[u64], &str)) -> String {
    let total = (yes.len() + no.len()) as u64;
    if no.is_empty() {
        return format!("all {total} layers {yes_kind}");
    }
    if yes.is_empty() {
        return format!("all {total} layers {no_kind}");
    }
    let mut runs: Vec<(u64, u64, bool)> = Vec::new();
    for i in 0..total {
        let is_yes = yes.binary_search(&i).is_ok();
        match runs.last_mut() {
            Some((_, end, m)) if *m == is_yes => *end = i,
            _ => runs.push((i, i, is_yes)),
        }
    }
    if runs.len() > 4 {
        let first: Vec<String> = yes.iter().take(3).map(u64::to_string).collect();
        return format!(
            "{} {yes_kind} ({}, …), {} {no_kind}",
            yes.len(),
            first.join(", "),
            no.len()
        );
    }
    let parts: Vec<String> = runs
        .iter()
        .map(|&(a, b, m)| {
            let kind = if m { yes_kind } else { no_kind };
            if a == b {
                format!("{a} {kind}")
            } else {
                format!("{a}–{b} {kind}")
            }
        })
        .collect();
    let word = if runs[0].0 == runs[0].1 {
        "layer"
    } else {
        "layers"
    };
    format!("{word} {}", parts.join(", "))
}
