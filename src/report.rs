//! Human-facing output: aligned tables and sizes. JSON output is serde's; this is the rest.

use std::io::{self, Write};

use crate::inspect::Inspection;
use crate::plan::{Piece, PlanReport};

/// A plain aligned table; columns marked numeric are right-aligned.
pub struct Table {
    header: Vec<&'static str>,
    numeric: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&'static str, bool)]) -> Table {
        Table {
            header: columns.iter().map(|c| c.0).collect(),
            numeric: columns.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.header.len());
        self.rows.push(cells);
    }

    pub fn write(&self, w: &mut dyn Write, indent: &str) -> io::Result<()> {
        let mut width: Vec<usize> = self.header.iter().map(|h| h.len()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let line = |w: &mut dyn Write, cells: &mut dyn Iterator<Item = &str>| -> io::Result<()> {
            let mut s = String::from(indent);
            for (i, c) in cells.enumerate() {
                if i > 0 {
                    s.push_str("  ");
                }
                let pad = width[i] - c.chars().count();
                let last = i + 1 == width.len();
                if self.numeric[i] {
                    s.extend(std::iter::repeat_n(' ', pad));
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    if !last {
                        s.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
            writeln!(w, "{}", s.trim_end())
        };
        line(w, &mut self.header.iter().copied())?;
        for r in &self.rows {
            line(w, &mut r.iter().map(String::as_str))?;
        }
        Ok(())
    }
}

/// 1536 → "1.5 KiB".
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// 1234567 → "1,234,567".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

pub fn shape(s: &[u64]) -> String {
    let parts: Vec<String> = s.iter().map(u64::to_string).collect();
    format!("[{}]", parts.join(", "))
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".to_string(), T::to_string)
}

/// The `inspect` report for a terminal or a pager.
pub fn write_inspection(w: &mut dyn Write, i: &Inspection, verbose: bool) -> io::Result<()> {
    let f = &i.format;
    writeln!(w, "source  {}", i.source)?;
    let requested = if f.requested == f.load_format {
        String::new()
    } else {
        format!(" (requested {})", f.requested)
    };
    let index = f
        .index
        .as_ref()
        .map_or_else(String::new, |x| format!(", filtered by {x}"));
    writeln!(
        w,
        "format  {}{requested}: {}{index}",
        f.load_format, f.pattern
    )?;
    writeln!(w, "config  {}", f.config_file)?;

    writeln!(w, "\nfiles ({} read)", i.files.len())?;
    let mut t = if verbose {
        Table::new(&[
            ("FILE", false),
            ("SIZE", true),
            ("HEADER", true),
            ("TENSORS", true),
            ("WHY", false),
        ])
    } else {
        Table::new(&[("FILE", false), ("SIZE", true), ("TENSORS", true)])
    };
    for fi in &i.files {
        let mut row = vec![fi.file.clone(), human_bytes(fi.size)];
        if verbose {
            row.push(human_bytes(fi.header_bytes));
        }
        row.push(fi.tensors.to_string());
        if verbose {
            row.push(fi.reason.clone());
        }
        t.row(row);
    }
    t.write(w, "  ")?;
    if !i.dropped.is_empty() {
        writeln!(w, "\nnot read ({})", i.dropped.len())?;
        let mut t = Table::new(&[("FILE", false), ("WHY", false)]);
        for d in &i.dropped {
            t.row(vec![d.file.clone(), d.reason.clone()]);
        }
        t.write(w, "  ")?;
    }

    let c = &i.config.config;
    writeln!(w, "\nmodel")?;
    let head_dim = match (c.head_dim, i.config.head_dim_default) {
        (Some(h), _) => h.to_string(),
        (None, Some(d)) => format!("{d} (hidden/heads; not in config)"),
        (None, None) => "-".into(),
    };
    let tie = match c.tie_word_embeddings {
        Some(b) => b.to_string(),
        None => "(not set: family default)".into(),
    };
    let rows: [(&str, String); 12] = [
        ("architecture", opt(&i.config.architecture)),
        ("layers", c.num_hidden_layers.to_string()),
        ("hidden", c.hidden_size.to_string()),
        ("heads", c.num_attention_heads.to_string()),
        ("kv heads", c.num_key_value_heads.to_string()),
        ("head_dim", head_dim),
        ("intermediate", opt(&c.intermediate_size)),
        ("vocab", c.vocab_size.to_string()),
        (
            "experts",
            match (c.num_experts, c.moe_intermediate_size) {
                (Some(e), Some(m)) => format!("{e} (moe intermediate {m})"),
                (e, _) => opt(&e),
            },
        ),
        ("tie_word_embeddings", tie),
        ("dtype", opt(&c.dtype)),
        ("model_type", opt(&c.model_type)),
    ];
    for (k, v) in rows {
        writeln!(w, "  {k:<20} {v}")?;
    }

    let filtered = i
        .filter
        .as_ref()
        .map_or_else(String::new, |f| format!(" matching /{f}/"));
    writeln!(w, "\ntensors ({}{filtered})", i.tensors.len())?;
    let mut t = Table::new(&[
        ("NAME", false),
        ("DTYPE", false),
        ("SHAPE", false),
        ("BYTES", true),
        ("FILE", false),
    ]);
    for r in &i.tensors {
        let file = if r.shadowed {
            format!("{} (shadowed by a later file)", r.file)
        } else {
            r.file.clone()
        };
        t.row(vec![
            r.name.clone(),
            r.dtype.to_string(),
            shape(&r.shape),
            human_bytes(r.bytes),
            file,
        ]);
    }
    t.write(w, "  ")?;

    if !i.duplicates.is_empty() {
        writeln!(
            w,
            "\nduplicates ({}): the same name in several files; vLLM keeps the last",
            i.duplicates.len()
        )?;
        for d in &i.duplicates {
            writeln!(w, "  {}: {}", d.name, d.files.join(" → "))?;
        }
    }

    writeln!(w, "\ntotals")?;
    let mut t = Table::new(&[
        ("DTYPE", false),
        ("TENSORS", true),
        ("PARAMETERS", true),
        ("BYTES", true),
    ]);
    for d in &i.totals.by_dtype {
        t.row(vec![
            d.dtype.to_string(),
            thousands(d.tensors as u64),
            thousands(d.parameters),
            human_bytes(d.bytes),
        ]);
    }
    t.row(vec![
        "all".into(),
        thousands(i.totals.tensors as u64),
        thousands(i.totals.parameters),
        human_bytes(i.totals.bytes),
    ]);
    t.write(w, "  ")
}

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
    writeln!(w, "parallel      tp {}{ep}", p.tp)?;
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
        writeln!(
            w,
            "\nrank {} ({} tensors, {})",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(thousands(12), "12");
        assert_eq!(shape(&[]), "[]");
        assert_eq!(shape(&[2, 3]), "[2, 3]");
    }
}
