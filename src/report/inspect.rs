//! `wload inspect`: files, config, tensors, totals.

mod config_less;
mod structure;

use std::io::{self, Write};

use super::*;
use crate::commands::inspect::{FileInfo, Inspection, RoleTotal, TensorRow};
use crate::quant::info::QuantInfo;
use crate::quant::names::TensorRole;
use crate::resolve::DroppedFile;
pub use config_less::write_config_less;
use structure::{write_structure, write_tower};

/// Ignored modules listed before "and N more" (all with `-v`): a real MoE checkpoint leaves
/// hundreds of norms and router gates unquantized.
const IGNORED_SHOWN: usize = 8;

/// The `inspect` report for a terminal or a pager: where the files came from, which were read,
/// the model, every tensor, duplicates and totals.
pub fn write_inspection(w: &mut dyn Write, i: &Inspection, verbose: bool) -> io::Result<()> {
    write_origin(w, i)?;
    write_files(w, i, verbose)?;
    write_model(w, i)?;
    write_structure(w, &i.structure, &i.support)?;
    if let Some(t) = &i.vision_tower {
        write_tower(w, t)?;
    }
    write_quantization(w, i, verbose)?;
    write_tensors(w, i)?;
    write_totals(w, &i.totals)
}

fn write_origin(w: &mut dyn Write, i: &Inspection) -> io::Result<()> {
    let f = &i.format;
    writeln!(w, "source  {}", Esc(&i.source))?;
    if let Some(h) = &i.hub {
        writeln!(
            w,
            "hub     revision {} at commit {}",
            Esc(&h.revision),
            Esc(&h.commit)
        )?;
        let fetched = match (h.downloaded.len(), h.offline) {
            (0, true) => "offline, all from the cache".to_string(),
            (0, false) => "all from the cache".to_string(),
            (1, _) => "1 file downloaded".to_string(),
            (n, _) => format!("{n} files downloaded"),
        };
        writeln!(
            w,
            "cache   {} ({fetched})",
            Esc(&h.snapshot.to_string_lossy())
        )?;
        if let Some(note) = &h.note {
            writeln!(
                w,
                "note    the hub could not be asked, so the cache answered: {}",
                Esc(note)
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
        .map_or_else(String::new, |x| format!(", filtered by {}", Esc(x)));
    writeln!(
        w,
        "format  {}{requested}: {}{index}",
        f.load_format,
        Esc(&f.pattern)
    )?;
    writeln!(w, "config  {}", Esc(&f.config_file))?;
    writeln!(w, "support {}", Esc(&i.support.summary))
}

fn write_files(w: &mut dyn Write, i: &Inspection, verbose: bool) -> io::Result<()> {
    write_file_list(w, &i.files, &i.dropped, i.hub.is_some(), verbose)
}

/// The files read (and with `verbose` why), then those not read and why.
fn write_file_list(
    w: &mut dyn Write,
    files: &[FileInfo],
    dropped: &[DroppedFile],
    hub: bool,
    verbose: bool,
) -> io::Result<()> {
    writeln!(w, "\nfiles ({} read)", files.len())?;
    let mut columns = vec![("FILE", false), ("SIZE", true)];
    if verbose {
        columns.push(("HEADER", true));
    }
    columns.push(("TENSORS", true));
    if hub {
        columns.push(("FROM", false));
    }
    if verbose {
        columns.push(("WHY", false));
    }
    let mut t = Table::new(&columns);
    for fi in files {
        let mut row = vec![fi.file.clone(), human_bytes(fi.size)];
        if verbose {
            row.push(human_bytes(fi.header_bytes));
        }
        row.push(fi.tensors.to_string());
        if hub {
            row.push(fi.origin.map_or("-", |o| o.as_str()).to_string());
        }
        if verbose {
            row.push(fi.reason.clone());
        }
        t.row(row);
    }
    t.write(w, "  ")?;
    if !dropped.is_empty() {
        writeln!(w, "\nnot read ({})", dropped.len())?;
        let mut t = Table::new(&[("FILE", false), ("WHY", false)]);
        for d in dropped {
            t.row(vec![d.file.clone(), d.reason.clone()]);
        }
        t.write(w, "  ")?;
    }
    Ok(())
}

fn write_model(w: &mut dyn Write, i: &Inspection) -> io::Result<()> {
    let c = &i.config.config;
    writeln!(w, "\nmodel")?;
    // What config.json leaves out, as the family fills it (the structure below): the config
    // class's default, not what the field would be in another family.
    let heads = i.structure.attention.heads();
    let stated = |field: &str| c.raw.get(field).is_some_and(|v| !v.is_null());
    // An explicit null is filled as the config class's __post_init__ fills it, not defaulted.
    let filled = |field: &str| match c.raw.get(field) {
        Some(v) if v.is_null() => "null in config: filled as the family fills it",
        _ => "not in config: the family's default",
    };
    let split = i.config.head_dim_default;
    let head_dim = match (c.head_dim, heads.and_then(|h| h.head_dim).or(split)) {
        (Some(h), _) => h.to_string(),
        (None, Some(d)) if Some(d) == split => format!("{d} (hidden/heads; not in config)"),
        (None, Some(d)) => format!("{d} ({})", filled("head_dim")),
        (None, None) => "-".into(),
    };
    let kv_heads = match heads {
        Some(h) if !stated("num_key_value_heads") => {
            format!("{} ({})", h.kv_heads, filled("num_key_value_heads"))
        }
        _ => c.num_key_value_heads.to_string(),
    };
    let auto =
        crate::sharded::serve::vllm_dtype(i.config.auto_dtype.as_str()).unwrap_or("bfloat16");
    let dtype = match &c.dtype {
        Some(d) if d.trim_start_matches("torch.") == auto => d.clone(),
        Some(d) => format!("{d} (vLLM's --dtype auto: {auto})"),
        None => format!("- (not in config: vLLM's --dtype auto takes {auto} from the weights)"),
    };
    let experts = match (c.num_experts, c.moe_intermediate_size) {
        (Some(e), Some(m)) => format!("{e} (moe intermediate {m})"),
        (Some(e), None) => e.to_string(),
        (None, _) => match i.structure.moe.as_ref().and_then(|m| m.routed_experts) {
            Some(e) => format!("{e} (not in config: the family's default)"),
            None => "-".into(),
        },
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
        ("kv heads", kv_heads),
        ("head_dim", head_dim),
        ("intermediate", opt(&c.intermediate_size)),
        ("vocab", c.vocab_size.to_string()),
        ("experts", experts),
        ("tie_word_embeddings", tie),
        ("dtype", dtype),
        ("model_type", opt(&c.model_type)),
    ];
    for (k, v) in rows {
        writeln!(w, "  {k:<20} {}", Esc(&v))?;
    }
    Ok(())
}

/// The quantization section: shown for a checkpoint whose config has a `quantization_config`, or
/// whose tensors include scales anyway (vLLM would not load those unquantized).
fn write_quantization(w: &mut dyn Write, i: &Inspection, verbose: bool) -> io::Result<()> {
    let scales = i.totals.by_role.iter().any(|r| is_scale(r.role));
    if i.quantization.is_none() && !scales {
        return Ok(());
    }
    writeln!(w, "\nquantization")?;
    let mut rows: Vec<(&str, String)> = match &i.quantization {
        Some(q) => quant_rows(q, verbose),
        None => vec![(
            "method",
            "none: the config has no quantization_config, yet the checkpoint has scale tensors"
                .into(),
        )],
    };
    let mut tensors = role_summary(&i.totals.by_role);
    if let Some(f) = &i.filter {
        tensors.push_str(&format!(" (of those matching /{f}/)"));
    }
    rows.push(("tensors", tensors));
    for (k, v) in rows {
        writeln!(w, "  {k:<20} {}", Esc(&v))?;
    }
    Ok(())
}

fn quant_rows(q: &QuantInfo, verbose: bool) -> Vec<(&'static str, String)> {
    let mut rows = vec![(
        "method",
        q.method
            .clone()
            .unwrap_or_else(|| "(no quant_method)".into()),
    )];
    let block = q.weight_block_size.map(|[n, k]| format!("{n}×{k}"));
    match (q.scheme, &block) {
        _ if q.weights.is_some() => rows.push(("weights", q.weights.clone().unwrap_or_default())),
        (Some(scheme), _) => {
            let per = match (scheme, &block) {
                ("per-channel", _) => "output channel".to_string(),
                (_, Some(b)) => format!("{b} block"),
                _ => "tensor".to_string(),
            };
            let scale = if q.method.as_deref() == Some("fp8") && block.is_some() {
                "weight_scale_inv"
            } else {
                "weight_scale"
            };
            rows.push(("weights", format!("FP8, one scale per {per} ({scale})")));
        }
        (None, Some(b)) => rows.push(("block", b.clone())),
        (None, None) => {}
    }
    if let Some(a) = &q.activation_scheme {
        let how = match a.as_str() {
            "static" => format!("{a} (an input_scale per linear layer)"),
            "dynamic" => format!("{a} (scaled at run time)"),
            _ => a.clone(),
        };
        rows.push(("activations", how));
    }
    if let Some(k) = q.kv_cache_scheme {
        rows.push((
            "kv cache",
            format!("FP8, scales per {k} (attn.k_scale, v_scale, q_scale)"),
        ));
    }
    rows.push(("ignored", ignored_list(&q.ignored, verbose)));
    match &q.refusal {
        None => rows.push(("wload", "supported: plan, shard and load accept it".into())),
        Some(r) => {
            rows.push((
                "wload",
                format!("refused by plan, shard and load: {}", r.message),
            ));
            rows.push(("fix", r.fix.clone()));
        }
    }
    rows
}

fn ignored_list(ignored: &[String], verbose: bool) -> String {
    if ignored.is_empty() {
        return "none".into();
    }
    let shown = if verbose {
        ignored.len()
    } else {
        IGNORED_SHOWN.min(ignored.len())
    };
    let mut s = format!("{}: {}", ignored.len(), ignored[..shown].join(", "));
    if shown < ignored.len() {
        s.push_str(&format!(
            ", and {} more (-v lists all)",
            ignored.len() - shown
        ));
    }
    s
}

fn is_scale(r: TensorRole) -> bool {
    matches!(
        r,
        TensorRole::WeightScale
            | TensorRole::ZeroPoint
            | TensorRole::InputScale
            | TensorRole::KvCacheScale
    )
}

/// "14 F8_E4M3 weights, 7 BF16 weights, 14 F32 weight scales".
fn role_summary(by_role: &[RoleTotal]) -> String {
    let parts: Vec<String> = by_role
        .iter()
        .map(|r| {
            let what = match (r.role, r.count.tensors) {
                (TensorRole::Other, 1) => "other tensor".to_string(),
                (TensorRole::Other, _) => "other tensors".to_string(),
                (TensorRole::Bias, 1) => "bias".to_string(),
                (TensorRole::Bias, _) => "biases".to_string(),
                (role, 1) => role.as_str().to_string(),
                (role, _) => format!("{}s", role.as_str()),
            };
            format!("{} {} {what}", thousands(r.count.tensors as u64), r.dtype)
        })
        .collect();
    if parts.is_empty() {
        "none listed".into()
    } else {
        parts.join(", ")
    }
}

/// One row per tensor, 128k for a large checkpoint: sized in a first pass and written in a
/// second, rather than stored.
fn write_tensors(w: &mut dyn Write, i: &Inspection) -> io::Result<()> {
    write_tensor_list(w, &i.tensors, i.filter.as_deref(), &i.duplicates)
}

fn write_tensor_list(
    w: &mut dyn Write,
    tensors: &[TensorRow],
    filter: Option<&str>,
    duplicates: &[crate::checkpoint::Duplicate],
) -> io::Result<()> {
    let filtered = filter.map_or_else(String::new, |f| format!(" matching /{}/", Esc(f)));
    writeln!(w, "\ntensors ({}{filtered})", tensors.len())?;
    let mut t = Table::new(&[
        ("NAME", false),
        ("DTYPE", false),
        ("SHAPE", false),
        ("BYTES", true),
        ("FILE", false),
    ]);
    let mut cells = TensorCells::default();
    for r in tensors {
        t.fit(&cells.of(r));
    }
    let mut rows = t.writer(w, "  ")?;
    for r in tensors {
        rows.row(&cells.of(r))?;
    }

    if !duplicates.is_empty() {
        writeln!(
            w,
            "\nduplicates ({}): the same name in several files; vLLM keeps the last",
            duplicates.len()
        )?;
        for d in duplicates {
            writeln!(w, "  {}: {}", Esc(&d.name), Esc(&d.files.join(" → ")))?;
        }
    }
    Ok(())
}

pub(super) fn write_totals(
    w: &mut dyn Write,
    totals: &crate::commands::inspect::Totals,
) -> io::Result<()> {
    writeln!(w, "\ntotals")?;
    let mut t = Table::new(&[
        ("DTYPE", false),
        ("TENSORS", true),
        ("PARAMETERS", true),
        ("BYTES", true),
    ]);
    for d in &totals.by_dtype {
        t.row(vec![
            d.dtype.to_string(),
            thousands(d.count.tensors as u64),
            thousands(d.count.parameters),
            human_bytes(d.count.bytes),
        ]);
    }
    t.row(vec![
        "all".into(),
        thousands(totals.count.tensors as u64),
        thousands(totals.count.parameters),
        human_bytes(totals.count.bytes),
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
