//! `wload inspect`: files, config, tensors, totals.

use std::io::{self, Write};

use super::*;
use crate::commands::inspect::{Inspection, TensorRow};

/// The `inspect` report for a terminal or a pager: where the files came from, which were read,
/// the model, every tensor, duplicates and totals.
pub fn write_inspection(w: &mut dyn Write, i: &Inspection, verbose: bool) -> io::Result<()> {
    write_origin(w, i)?;
    write_files(w, i, verbose)?;
    write_model(w, i)?;
    write_tensors(w, i)?;
    write_totals(w, i)
}

fn write_origin(w: &mut dyn Write, i: &Inspection) -> io::Result<()> {
    let f = &i.format;
    writeln!(w, "source  {}", i.source)?;
    if let Some(h) = &i.hub {
        writeln!(w, "hub     revision {} at commit {}", h.revision, h.commit)?;
        let fetched = match (h.downloaded.len(), h.offline) {
            (0, true) => "offline, all from the cache".to_string(),
            (0, false) => "all from the cache".to_string(),
            (1, _) => "1 file downloaded".to_string(),
            (n, _) => format!("{n} files downloaded"),
        };
        writeln!(w, "cache   {} ({fetched})", h.snapshot.display())?;
        if let Some(note) = &h.note {
            writeln!(
                w,
                "note    the hub could not be asked, so the cache answered: {note}"
            )?;
        }
    }
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
    writeln!(w, "config  {}", f.config_file)
}

fn write_files(w: &mut dyn Write, i: &Inspection, verbose: bool) -> io::Result<()> {
    writeln!(w, "\nfiles ({} read)", i.files.len())?;
    let mut columns = vec![("FILE", false), ("SIZE", true)];
    if verbose {
        columns.push(("HEADER", true));
    }
    columns.push(("TENSORS", true));
    if i.hub.is_some() {
        columns.push(("FROM", false));
    }
    if verbose {
        columns.push(("WHY", false));
    }
    let mut t = Table::new(&columns);
    for fi in &i.files {
        let mut row = vec![fi.file.clone(), human_bytes(fi.size)];
        if verbose {
            row.push(human_bytes(fi.header_bytes));
        }
        row.push(fi.tensors.to_string());
        if i.hub.is_some() {
            row.push(fi.origin.map_or("-", |o| o.as_str()).to_string());
        }
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
    Ok(())
}

fn write_model(w: &mut dyn Write, i: &Inspection) -> io::Result<()> {
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
    Ok(())
}

/// One row per tensor, 128k for a large checkpoint: sized in a first pass and written in a
/// second, rather than stored.
fn write_tensors(w: &mut dyn Write, i: &Inspection) -> io::Result<()> {
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
    let mut cells = TensorCells::default();
    for r in &i.tensors {
        t.fit(&cells.of(r));
    }
    let mut rows = t.writer(w, "  ")?;
    for r in &i.tensors {
        rows.row(&cells.of(r))?;
    }

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
    Ok(())
}

fn write_totals(w: &mut dyn Write, i: &Inspection) -> io::Result<()> {
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

/// The cells of a row of the `inspect` tensor table, formatted into buffers reused from row to row.
#[derive(Default)]
struct TensorCells {
    shape: String,
    bytes: String,
    file: String,
}

impl TensorCells {
    fn of<'s>(&'s mut self, r: &'s TensorRow) -> [&'s str; 5] {
        fn set(buf: &mut String, args: fmt::Arguments) {
            buf.clear();
            buf.write_fmt(args)
                .expect("formatting into a String does not fail");
        }
        set(&mut self.shape, format_args!("{}", Shape(r.shape)));
        set(&mut self.bytes, format_args!("{}", HumanBytes(r.bytes)));
        let file = if r.shadowed {
            set(
                &mut self.file,
                format_args!("{} (shadowed by a later file)", r.file),
            );
            &self.file
        } else {
            r.file
        };
        [r.name, r.dtype.as_str(), &self.shape, &self.bytes, file]
    }
}
