//! `wload inspect` of what is not a checkpoint: a pre-sharded folder (its ranks, parts, layout
//! and completeness) or a lone safetensors file.

use std::io::{self, Write};

use super::inspect::write_totals;
use super::*;
use crate::units::plural;

/// The `inspect` report for a pre-sharded folder or a lone safetensors file.
pub fn write_other_source(
    w: &mut dyn Write,
    o: &crate::commands::inspect::OtherSource,
    verbose: bool,
) -> io::Result<()> {
    use crate::commands::inspect::OtherSource;
    match o {
        OtherSource::PreSharded(s) => write_survey(w, s, verbose),
        OtherSource::File(f) => write_lone_file(w, f),
    }
}

fn write_survey(
    w: &mut dyn Write,
    s: &crate::commands::inspect::survey::Survey,
    verbose: bool,
) -> io::Result<()> {
    let wf = &s.written_for;
    writeln!(w, "source   {}", Esc(&s.source))?;
    writeln!(
        w,
        "kind     pre-sharded folder (vLLM sharded_state files, {})",
        s.pattern
    )?;
    writeln!(
        w,
        "written  for {} (per {}: {})",
        wf.flags(),
        wf.from,
        Esc(&written_for_facts(wf).join(", "))
    )?;
    if s.records.len() > 1 {
        writeln!(
            w,
            "runs     {} run records merged: {}",
            s.records.len(),
            Esc(&s.records.join(", "))
        )?;
    }
    for st in &s.stages {
        writeln!(w, "stage {:<3}{}", st.pp_rank, st.describe())?;
    }
    if let Some(v) = &s.vllm_versions {
        writeln!(
            w,
            "vllm     {} (the versions whose parameter names and slicing these files follow)",
            Esc(v)
        )?;
    }
    let filtered = s
        .filter
        .as_ref()
        .map_or_else(String::new, |f| format!(" (tensors matching /{}/)", Esc(f)));
    writeln!(w, "\nranks{filtered}")?;
    let mut t = Table::new(&[
        ("RANK", true),
        ("STAGE", true),
        ("TP RANK", true),
        ("PART", true),
        ("FILE", false),
        ("TENSORS", true),
        ("SIZE", true),
    ]);
    for r in &s.ranks {
        let stage = r.pp_rank.map_or_else(|| "-".to_string(), |p| p.to_string());
        for f in &r.files {
            t.row(vec![
                r.rank.to_string(),
                stage.clone(),
                r.tp_rank.to_string(),
                f.part.to_string(),
                f.file.clone(),
                f.tensors
                    .map_or_else(|| "unreadable".to_string(), |n| thousands(n as u64)),
                human_bytes(f.size),
            ]);
        }
    }
    t.write(w, "  ")?;
    let n = &s.totals;
    writeln!(
        w,
        "\ntotals   {} file{}, {} tensor{}, {} parameters, {} of tensor data",
        n.files,
        plural(n.files as u64),
        thousands(n.tensors as u64),
        plural(n.tensors as u64),
        thousands(n.parameters),
        human_bytes(n.bytes)
    )?;
    write_completeness(w, s)?;
    writeln!(w, "check    {}", EscShell(&s.check_with))?;
    if let Some(serve) = &s.serve {
        writeln!(w, "serve    {}", EscShell(&serve.shell))?;
    } else if verbose {
        writeln!(
            w,
            "serve    (no wload.json: see `wload load` above for the flags)"
        )?;
    }
    Ok(())
}

/// What wload.json (or the file names) say the folder was written from and with.
fn written_for_facts(wf: &crate::sharded::names::WrittenFor) -> Vec<String> {
    let mut facts = Vec::new();
    if let Some(a) = &wf.architecture {
        facts.push(a.clone());
    }
    if let Some(d) = &wf.dtype {
        facts.push(format!("dtype {d}"));
    }
    match wf.expert_parallel {
        Some(true) => facts.push("expert parallel".into()),
        Some(false) => facts.push("no expert parallel".into()),
        None => facts.push("expert parallel unknown (no wload.json)".into()),
    }
    if !wf.multimodal.is_empty() {
        facts.push(wf.multimodal.join(" "));
    }
    if let Some(t) = &wf.module_tree {
        facts.push(format!("{t} module tree (loads only on {t})"));
    }
    if let Some(src) = &wf.source_checkpoint {
        facts.push(format!("sharded from {src}"));
    }
    facts
}

/// Whether every rank has its files, or each problem with its fix.
fn write_completeness(
    w: &mut dyn Write,
    s: &crate::commands::inspect::survey::Survey,
) -> io::Result<()> {
    let wf = &s.written_for;
    if s.complete {
        writeln!(
            w,
            "complete yes: all {} rank{} of {} have their files{}",
            s.world_size,
            plural(s.world_size),
            wf.flags(),
            if wf.from == "file names" {
                String::new()
            } else {
                format!(", at the sizes {} records", Esc(&wf.from))
            }
        )?;
    } else {
        let k = s.problems.len() as u64;
        writeln!(w, "complete no, {k} problem{}:", plural(k))?;
        for p in &s.problems {
            writeln!(w, "  - {}", Esc(&p.message))?;
            if let Some(fix) = &p.fix {
                writeln!(w, "    fix: {}", Esc(fix))?;
            }
        }
    }
    Ok(())
}

fn write_lone_file(w: &mut dyn Write, f: &crate::commands::inspect::LoneFile) -> io::Result<()> {
    writeln!(w, "source  {}", Esc(&f.source))?;
    writeln!(
        w,
        "kind    a single safetensors file ({}, header {})",
        human_bytes(f.size),
        human_bytes(f.header_bytes)
    )?;
    writeln!(w, "note    {}", Esc(&f.note))?;
    let filtered = f
        .filter
        .as_ref()
        .map_or_else(String::new, |x| format!(" matching /{}/", Esc(x)));
    writeln!(w, "\ntensors ({}{filtered})", f.tensors.len())?;
    let mut t = Table::new(&[
        ("NAME", false),
        ("DTYPE", false),
        ("SHAPE", false),
        ("BYTES", true),
    ]);
    for r in &f.tensors {
        t.row(vec![
            r.name.clone(),
            r.dtype.to_string(),
            format!("{:?}", r.shape),
            thousands(r.bytes),
        ]);
    }
    t.write(w, "  ")?;
    write_totals(w, &f.totals)
}
