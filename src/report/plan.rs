//! `wload plan`: per rank, the tensors and their pieces.

use std::io::{self, Write};

use super::*;
use crate::plan::{Piece, PlanReport};

/// The `plan` report: a summary, then per rank its tensors and where they come from.
pub fn write_plan(w: &mut dyn Write, r: &PlanReport, verbose: bool) -> io::Result<()> {
    let p = &r.plan;
    writeln!(w, "source        {}", r.source)?;
    writeln!(w, "model         {} (mapping {})", p.architecture, p.family)?;
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
            rt.compare[1], rt.compare[0]
        )?;
    }
    if !p.skipped.is_empty() {
        writeln!(w, "skipped       {} checkpoint tensors", p.skipped.len())?;
        if verbose {
            for s in &p.skipped {
                writeln!(w, "  {}: {}", s.tensor, s.reason)?;
            }
        }
    }
    for rank in &p.ranks {
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
            let mut from: Vec<String> = Vec::new();
            for piece in &o.pieces {
                let s = match piece {
                    Piece::Copy { source, region, .. } => {
                        let src = &p.sources[*source];
                        let conv = if src.dtype == o.dtype {
                            String::new()
                        } else {
                            format!(" {}→{}", src.dtype, o.dtype)
                        };
                        if verbose {
                            format!("{} {region}{conv} ({})", src.name, src.file)
                        } else {
                            format!("{} {region}{conv}", src.name)
                        }
                    }
                    Piece::Fill { value, .. } => format!("fill {value}"),
                };
                if from.last() != Some(&s) {
                    from.push(s);
                }
            }
            t.row(vec![
                o.name.clone(),
                o.dtype.to_string(),
                shape(&o.shape),
                human_bytes(o.bytes),
                from.join(" + "),
            ]);
        }
        t.write(w, "  ")?;
    }
    Ok(())
}
