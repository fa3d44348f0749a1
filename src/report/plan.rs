//! `wload plan`: per rank, the tensors and their pieces.

use std::io::{self, Write};

use super::*;
use crate::plan::{Piece, PlanReport};
use crate::units::id_runs;

/// The `plan` report: the model and layout, a table of the ranks, per rank its tensors and where
/// they come from, and last the verdict with the totals. `quiet`: the verdict line only.
pub fn write_plan(w: &mut dyn Write, r: &PlanReport, verbose: bool, quiet: bool) -> io::Result<()> {
    if !quiet {
        write_header(w, r, verbose)?;
        write_rank_table(w, &r.plan)?;
        for rank in &r.plan.ranks {
            write_rank(w, &r.plan, rank, verbose)?;
        }
        writeln!(w)?;
    }
    write_verdict(w, r)
}

/// `ok: TP 8 × PP 1, 8 ranks, 1,283 tensors per rank, 17.2 GiB per rank (max), 137.4 GiB in
/// all; vLLM would load this`. A refused plan never gets here: its problems are the error.
fn write_verdict(w: &mut dyn Write, r: &PlanReport) -> io::Result<()> {
    let (p, t) = (&r.plan, &r.totals);
    let ep = if p.expert_parallel { " + EP" } else { "" };
    let tensors = if t.tensors_per_rank_min == t.tensors_per_rank_max {
        thousands(t.tensors_per_rank_max)
    } else {
        format!(
            "{}–{}",
            thousands(t.tensors_per_rank_min),
            thousands(t.tensors_per_rank_max)
        )
    };
    let shown = match &p.ranks[..] {
        [one] if t.ranks > 1 => format!(" (rank {} shown)", one.rank),
        _ => String::new(),
    };
    writeln!(
        w,
        "ok: TP {} × PP {}{ep}, {} {}{shown}, {tensors} tensors per rank, {} per rank (max), {} in all; vLLM would load this",
        p.tp,
        p.pp,
        thousands(t.ranks),
        if t.ranks == 1 { "rank" } else { "ranks" },
        human_bytes(t.bytes_per_rank_max),
        human_bytes(t.bytes),
    )
}

/// One row per rank (those shown): its stage, tensors and bytes.
fn write_rank_table(w: &mut dyn Write, p: &crate::plan::Plan) -> io::Result<()> {
    let staged = p.pp > 1;
    let mut columns = vec![("RANK", true)];
    if staged {
        columns.extend([("STAGE", true), ("TP RANK", true)]);
    }
    columns.extend([("TENSORS", true), ("BYTES", true)]);
    let mut t = Table::new(&columns);
    for rank in &p.ranks {
        t.cell_fmt(format_args!("{}", rank.rank));
        if staged {
            t.cell_fmt(format_args!("{}", rank.pp_rank));
            t.cell_fmt(format_args!("{}", rank.tp_rank));
        }
        t.cell(&thousands(rank.tensors.len() as u64));
        t.cell(&human_bytes(rank.bytes));
    }
    writeln!(w)?;
    t.write(w, "")
}

/// Source, model, layout, dtype and tying; the skipped tensors (each one with `verbose`).
fn write_header(w: &mut dyn Write, r: &PlanReport, verbose: bool) -> io::Result<()> {
    let p = &r.plan;
    writeln!(w, "source        {}", Esc(&r.source))?;
    writeln!(
        w,
        "model         {} (mapping {})",
        Esc(&p.architecture),
        Esc(&p.family)
    )?;
    let ep = if p.expert_parallel {
        " + expert parallel"
    } else {
        ""
    };
    if p.pp > 1 {
        writeln!(w, "parallel      tp {} × pp {}{ep}", p.tp, p.pp)?;
        for s in &p.stages {
            writeln!(
                w,
                "stage {:<7} layers [{}, {}), ranks {}..{}",
                s.pp_rank,
                s.first_layer,
                s.end_layer,
                s.pp_rank * p.tp,
                (s.pp_rank + 1) * p.tp - 1
            )?;
        }
    } else {
        writeln!(w, "parallel      tp {}{ep}", p.tp)?;
    }
    writeln!(w, "dtype         {}", p.dtype)?;
    writeln!(w, "tied lm_head  {}", p.tie_word_embeddings)?;
    if let Some(rt) = &p.retie {
        writeln!(
            w,
            "note          config says tied but the checkpoint has '{}': kept as two tensors unless equal to '{}'",
            Esc(&rt.compare[1]),
            Esc(&rt.compare[0])
        )?;
    }
    if !p.skipped.is_empty() {
        writeln!(w, "skipped       {} checkpoint tensors", p.skipped.len())?;
        if verbose {
            for s in &p.skipped {
                writeln!(w, "  {}: {}", Esc(&s.tensor), Esc(&s.reason))?;
            }
        }
    }
    Ok(())
}

/// A rank's tensors and where each comes from.
fn write_rank(
    w: &mut dyn Write,
    p: &crate::plan::Plan,
    rank: &crate::plan::RankPlan,
    verbose: bool,
) -> io::Result<()> {
    let stage = if p.pp > 1 {
        format!(" (stage {}, tp rank {})", rank.pp_rank, rank.tp_rank)
    } else {
        String::new()
    };
    writeln!(
        w,
        "\nrank {}{stage} ({} tensors, {})",
        rank.rank,
        rank.tensors.len(),
        human_bytes(rank.bytes)
    )?;
    let mut t = Table::new(&[
        ("NAME", false),
        ("DTYPE", false),
        ("SHAPE", false),
        ("BYTES", true),
        ("FROM", false),
    ]);
    for o in &rank.tensors {
        let mut from = ExpertGroups::default();
        for piece in o.pieces.iter() {
            from.next.clear();
            describe(&mut from.next, &piece, p, o, verbose).map_err(io::Error::other)?;
            from.take();
        }
        t.row(vec![
            o.name.clone(),
            o.dtype.to_string(),
            shape(&o.shape),
            human_bytes(o.bytes),
            from.finish().join(" + "),
        ]);
    }
    t.write(w, "  ")
}

/// One piece as the FROM column says it: `NAME REGION[ DTYPE→DTYPE][ (FILE)]`, or `fill VALUE`.
fn describe(
    out: &mut String,
    piece: &Piece,
    p: &crate::plan::Plan,
    o: &crate::plan::OutTensor,
    verbose: bool,
) -> std::fmt::Result {
    use std::fmt::Write as _;
    match piece {
        Piece::Copy { source, region, .. } => {
            let src = &p.sources[*source];
            write!(out, "{} {region}", src.name)?;
            if let Some(scale) = region.dequant {
                write!(out, " by {}", p.sources[scale].name)?;
            }
            if src.dtype != o.dtype {
                write!(out, " {}→{}", src.dtype, o.dtype)?;
            }
            if verbose {
                write!(out, " ({})", src.file)?;
            }
            Ok(())
        }
        Piece::Fill { value, .. } => write!(out, "fill {value}"),
    }
}

/// A tensor's pieces as the FROM column lists them: a piece said as the one before it is said
/// once, and sources that differ only in their expert number are written once with the experts'
/// ranges (`model.layers.1.mlp.experts.{0-127}.gate_proj.weight rows [0, 96)`). Each piece is
/// said into one reused buffer and only a new group is kept: a fused expert tensor of a large MoE
/// has hundreds of pieces (a DeepSeek-V3 plan at TP 8, 712,000), and a string each took 0.5 s.
#[derive(Default)]
struct ExpertGroups {
    /// Each group's text, `{}` where the expert number was, and its experts.
    groups: Vec<(String, Vec<u64>)>,
    /// The piece being taken, and the one before it.
    next: String,
    last: String,
}

impl ExpertGroups {
    /// Takes the piece said in `next`.
    fn take(&mut self) {
        if !self.groups.is_empty() && self.next == self.last {
            return;
        }
        let s = &self.next;
        match expert_number(s) {
            Some((at, len, n)) => {
                let (before, after) = (&s[..at], &s[at + len..]);
                let same = |k: &String| {
                    k.len() == before.len() + 2 + after.len()
                        && k.starts_with(before)
                        && k[before.len()..].starts_with("{}")
                        && k.ends_with(after)
                };
                match self.groups.iter_mut().find(|(k, _)| same(k)) {
                    Some((_, ids)) => ids.push(n),
                    None => self.groups.push((format!("{before}{{}}{after}"), vec![n])),
                }
            }
            None => self.groups.push((s.clone(), Vec::new())),
        }
        std::mem::swap(&mut self.next, &mut self.last);
    }

    /// The groups' texts, in order of their first piece.
    fn finish(self) -> Vec<String> {
        (self.groups.into_iter())
            .map(|(key, ids)| {
                if ids.is_empty() {
                    key
                } else {
                    key.replacen("{}", &format!("{{{}}}", id_runs(&ids)), 1)
                }
            })
            .collect()
    }
}

/// Where the expert number of `.experts.N.` is in `s`: (byte offset, length, N).
fn expert_number(s: &str) -> Option<(usize, usize, u64)> {
    let at = s.find(".experts.")? + ".experts.".len();
    let len = s[at..].find(|c: char| !c.is_ascii_digit())?;
    let n = s[at..at + len].parse().ok()?;
    (len > 0 && s[at + len..].starts_with('.')).then_some((at, len, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_sources_are_written_once_with_their_ranges() {
        let from: Vec<String> = [0, 1, 2, 3, 5]
            .iter()
            .flat_map(|e| {
                [
                    format!("model.layers.1.mlp.experts.{e}.gate_proj.weight rows [0, 32)"),
                    format!("model.layers.1.mlp.experts.{e}.up_proj.weight rows [0, 32)"),
                ]
            })
            .chain(["fill 0".to_string()])
            .collect();
        let per_expert = |from: &[String]| {
            let mut g = ExpertGroups::default();
            for s in from {
                g.next.clone_from(s);
                g.take();
            }
            g.finish()
        };
        assert_eq!(
            per_expert(&from),
            [
                "model.layers.1.mlp.experts.{0-3,5}.gate_proj.weight rows [0, 32)",
                "model.layers.1.mlp.experts.{0-3,5}.up_proj.weight rows [0, 32)",
                "fill 0",
            ]
        );
        let plain = vec!["model.layers.0.self_attn.q_proj.weight rows [0, 64)".to_string()];
        assert_eq!(per_expert(&plain), plain);
    }
}
