//! `wload sizes`: each parallel layout checked, vLLM's verdict, and the first reason for a refusal.

use std::io::{self, Write};

use super::*;
use crate::commands::pipeline::Verdict;
use crate::commands::plan::{NotChecked, SizesReport};

/// The model's shape, a table of every layout checked, and the accepted sizes summed up; with
/// `quiet`, the summary alone (what a script reads).
pub fn write_sizes(w: &mut dyn Write, r: &SizesReport, quiet: bool) -> io::Result<()> {
    if !quiet {
        write_layouts(w, r)?;
    }
    write_summary(w, r)
}

/// The source, the model's shape and the table of layouts.
fn write_layouts(w: &mut dyn Write, r: &SizesReport) -> io::Result<()> {
    writeln!(w, "source   {}", Esc(&r.source))?;
    writeln!(
        w,
        "model    {} (mapping {})",
        Esc(&r.architecture),
        Esc(&r.family)
    )?;
    let experts = r
        .experts
        .map_or(String::new(), |e| format!(", {e} experts"));
    writeln!(
        w,
        "shape    {} attention heads, {} KV heads, {} layers{experts}",
        r.attention_heads, r.kv_heads, r.layers
    )?;
    writeln!(w)?;
    let mut t = Table::new(&[
        ("TP", true),
        ("PP", true),
        ("EP", false),
        ("VLLM", false),
        ("FIRST REASON", false),
    ]);
    for v in &r.checked {
        t.cell_fmt(format_args!("{}", v.tp));
        t.cell_fmt(format_args!("{}", v.pp));
        t.cell(if v.expert_parallel { "yes" } else { "no" });
        t.cell(match (v.accepted, v.wload_limit) {
            (true, _) => "accepts",
            (false, false) => "refuses",
            // vLLM would load it; wload cannot plan it (a tower it does not map).
            (false, true) => "wload cannot",
        });
        t.cell(&reason(v));
    }
    t.write(w, "  ")?;
    writeln!(w)
}

/// The sizes accepted, per list, with those not checked.
fn write_summary(w: &mut dyn Write, r: &SizesReport) -> io::Result<()> {
    match &r.accepted_tp_language_model_only {
        Some(lm) => {
            writeln!(
                w,
                "wload plans --tp none of these: it does not map the vision tower"
            )?;
            writeln!(
                w,
                "  with --language-model-only (the text model alone): --tp {}",
                list(lm)
            )?;
        }
        None => writeln!(w, "vLLM accepts --tp {}", list(&r.accepted_tp))?,
    }
    if let Some(ep) = &r.accepted_tp_expert_parallel {
        writeln!(w, "  with --enable-expert-parallel: --tp {}", list(ep))?;
        write_not_checked(w, r, |n| n.expert_parallel)?;
    }
    for p in &r.accepted_pp {
        writeln!(w, "  with --pp {}: --tp {}", p.pp, list(&p.tp))?;
        write_not_checked(w, r, |n| n.pp == p.pp && n.tp.is_some())?;
    }
    for n in r.not_checked.iter().filter(|n| n.tp.is_none()) {
        writeln!(w, "  not checked: {}", Esc(&n.reason))?;
    }
    Ok(())
}

/// The layouts of one list that were not checked, one line per reason: `not checked: --tp 3, 5
/// (REASON)`.
fn write_not_checked(
    w: &mut dyn Write,
    r: &SizesReport,
    of: impl Fn(&NotChecked) -> bool,
) -> io::Result<()> {
    let mut groups: Vec<(&str, Vec<u64>)> = Vec::new();
    for n in r.not_checked.iter().filter(|n| of(n)) {
        let Some(tp) = n.tp else { continue };
        match groups.iter_mut().find(|g| g.0 == n.reason) {
            Some(g) => g.1.push(tp),
            None => groups.push((&n.reason, vec![tp])),
        }
    }
    for (reason, tps) in groups {
        writeln!(w, "    not checked: --tp {} ({})", list(&tps), Esc(reason))?;
    }
    Ok(())
}

/// The first problem, and how many more `wload plan` would list.
fn reason(v: &Verdict) -> String {
    match (&v.reason, v.problems) {
        (None, _) => String::new(),
        (Some(r), n) if n > 1 => format!("{r} (+{} more)", n - 1),
        (Some(r), _) => r.clone(),
    }
}

/// `1, 2, 4`, or `none` for an empty list.
fn list(v: &[u64]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
}
