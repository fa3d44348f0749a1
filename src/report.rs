//! Human-facing output: aligned tables and sizes. JSON output is serde's; this is the rest.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::io::{self, Write};

use crate::commands::inspect::{Inspection, TensorRow};
use crate::plan::{Piece, PlanReport, Problem};

/// A plain aligned table; columns marked numeric are right-aligned.
///
/// A table either stores its rows ([`Table::row`], then [`Table::write`]), every cell's text back
/// to back in one buffer, or, for one of 100k+ rows, is written in two passes over the caller's
/// data without storing any: [`Table::fit`] for each row to size the columns, then
/// [`Table::writer`] and [`Rows::row`] for each row.
pub struct Table {
    header: Vec<&'static str>,
    numeric: Vec<bool>,
    width: Vec<usize>,
    /// Every stored cell's text, row after row.
    text: String,
    /// Where each stored cell ends in `text`; a cell starts where the previous one ends.
    ends: Vec<usize>,
}

impl Table {
    pub fn new(columns: &[(&'static str, bool)]) -> Table {
        Table {
            header: columns.iter().map(|c| c.0).collect(),
            numeric: columns.iter().map(|c| c.1).collect(),
            width: columns.iter().map(|c| width(c.0)).collect(),
            text: String::new(),
            ends: Vec::new(),
        }
    }

    /// Stores a whole row.
    pub fn row<S: AsRef<str>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let before = self.ends.len();
        for c in cells {
            self.cell(c.as_ref());
        }
        debug_assert_eq!(self.ends.len() - before, self.header.len());
    }

    /// Stores the next cell: cells fill a row from left to right, then start the next row.
    pub fn cell(&mut self, s: &str) {
        self.text.push_str(s);
        self.end_cell();
    }

    /// Stores the next cell, formatted straight into the table (`format_args!`).
    pub fn cell_fmt(&mut self, args: fmt::Arguments) {
        self.text
            .write_fmt(args)
            .expect("formatting into a String does not fail");
        self.end_cell();
    }

    fn end_cell(&mut self) {
        let start = self.ends.last().copied().unwrap_or(0);
        let col = self.ends.len() % self.width.len();
        self.width[col] = self.width[col].max(width(&self.text[start..]));
        self.ends.push(self.text.len());
    }

    /// Widens the columns to fit a row that is written with [`Rows::row`] rather than stored.
    pub fn fit(&mut self, cells: &[&str]) {
        debug_assert_eq!(cells.len(), self.width.len());
        for (w, c) in self.width.iter_mut().zip(cells) {
            *w = (*w).max(width(c));
        }
    }

    /// Writes the header line, and returns what writes the rows after it.
    pub fn writer<'a>(&'a self, w: &'a mut dyn Write, indent: &'a str) -> io::Result<Rows<'a>> {
        let mut rows = Rows {
            table: self,
            w,
            indent,
            line: String::new(),
        };
        rows.line(self.header.iter().copied())?;
        Ok(rows)
    }

    /// Writes the header and the stored rows.
    pub fn write(&self, w: &mut dyn Write, indent: &str) -> io::Result<()> {
        debug_assert_eq!(self.ends.len() % self.header.len(), 0);
        let mut rows = self.writer(w, indent)?;
        let mut start = 0;
        for row in self.ends.chunks(self.header.len()) {
            rows.line(row.iter().map(|&end| {
                let c = &self.text[start..end];
                start = end;
                c
            }))?;
        }
        Ok(())
    }
}

/// Writes the rows of a [`Table`], one line at a time.
pub struct Rows<'a> {
    table: &'a Table,
    w: &'a mut dyn Write,
    indent: &'a str,
    /// The line being written, reused from line to line.
    line: String,
}

impl Rows<'_> {
    /// Writes one row, padded to the widths the table had when [`Table::writer`] was called.
    pub fn row(&mut self, cells: &[&str]) -> io::Result<()> {
        debug_assert_eq!(cells.len(), self.table.width.len());
        self.line(cells.iter().copied())
    }

    /// Built whole before it is written, so that trailing blanks can be trimmed.
    fn line<'c>(&mut self, cells: impl Iterator<Item = &'c str>) -> io::Result<()> {
        let (t, line) = (self.table, &mut self.line);
        line.clear();
        line.push_str(self.indent);
        for (i, c) in cells.enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = t.width[i].saturating_sub(width(c));
            let last = i + 1 == t.width.len();
            if t.numeric[i] {
                push_spaces(line, pad);
                line.push_str(c);
            } else {
                line.push_str(c);
                if !last {
                    push_spaces(line, pad);
                }
            }
        }
        line.truncate(line.trim_end().len());
        line.push('\n');
        self.w.write_all(line.as_bytes())
    }
}

/// Display width as the table counts it: characters (bytes when the text is ASCII, which is faster).
fn width(s: &str) -> usize {
    if s.is_ascii() {
        s.len()
    } else {
        s.chars().count()
    }
}

fn push_spaces(s: &mut String, n: usize) {
    const SPACES: &str = "                                                                ";
    let mut n = n;
    while n > 0 {
        let k = n.min(SPACES.len());
        s.push_str(&SPACES[..k]);
        n -= k;
    }
}

/// 1536 → "1.5 KiB".
pub fn human_bytes(n: u64) -> String {
    HumanBytes(n).to_string()
}

/// [`human_bytes`] as a `Display`, to format without an intermediate `String`.
pub struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
        let n = self.0;
        let mut v = n as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            write!(f, "{n} B")
        } else {
            write!(f, "{v:.1} {}", UNITS[u])
        }
    }
}

/// 1234567 → "1,234,567".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// [2, 3] → "[2, 3]".
pub fn shape(s: &[u64]) -> String {
    Shape(s).to_string()
}

/// [`shape`] as a `Display`, to format without an intermediate `String`.
pub struct Shape<'a>(pub &'a [u64]);

impl fmt::Display for Shape<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('[')?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_char(']')
    }
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".to_string(), T::to_string)
}

/// The `inspect` report for a terminal or a pager.
pub fn write_inspection(w: &mut dyn Write, i: &Inspection, verbose: bool) -> io::Result<()> {
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
    writeln!(w, "config  {}", f.config_file)?;

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
    // One row per tensor, 128k for a large checkpoint: sized in a first pass and written in a
    // second, rather than stored.
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

/// The `shard` summary: where the files went and how long each stage took.
pub fn write_shard(w: &mut dyn Write, r: &crate::commands::shard::ShardReport) -> io::Result<()> {
    let m = &r.manifest;
    writeln!(
        w,
        "wrote {} files ({}) for tp {} ranks {:?} to {}",
        m.files.len(),
        human_bytes(r.bytes),
        m.tp,
        m.ranks,
        r.out
    )?;
    if !r.side_files.is_empty() {
        writeln!(w, "copied {}", r.side_files.join(", "))?;
    }
    let t = &r.timings;
    let rate = if t.write_s > 0.0 {
        format!(" ({}/s)", human_bytes((r.bytes as f64 / t.write_s) as u64))
    } else {
        String::new()
    };
    writeln!(
        w,
        "time: headers {:.3}s, plan {:.3}s, write {:.3}s{rate}, side files {:.3}s, hash {:.3}s{}",
        t.open.headers_s,
        t.open.plan_s,
        t.write_s,
        t.side_files_s,
        t.hash_s,
        if r.verified {
            format!(", verify {:.3}s (all bytes match)", t.verify_s)
        } else {
            String::new()
        }
    )?;
    writeln!(
        w,
        "serve with: vllm serve {} --load-format sharded_state --tensor-parallel-size {}",
        r.out, m.tp
    )
}

/// The `load` report: per-rank bytes and copy rates, then where the time went.
pub fn write_load(
    w: &mut dyn Write,
    r: &crate::commands::load::LoadReport,
    quiet: bool,
) -> io::Result<()> {
    let t = &r.timings;
    if r.dry_run {
        writeln!(
            w,
            "ok: vLLM would load {} at tp {} ({} ranks checked, {}, {})",
            r.source,
            r.tp,
            r.ranks.len(),
            human_bytes(r.bytes),
            match r.kind {
                crate::commands::load::InputKind::Checkpoint => "checkpoint",
                crate::commands::load::InputKind::PreSharded => "pre-sharded",
            }
        )?;
        for f in &r.files_read {
            let m = match f.matches_manifest {
                Some(true) => " (matches wload.json)",
                Some(false) => " (DIFFERS from wload.json)",
                None => "",
            };
            writeln!(
                w,
                "  read {} {} xxh3 {}{m}",
                f.file,
                human_bytes(f.bytes),
                f.xxh3
            )?;
        }
    } else {
        let mut tab = Table::new(&[
            ("RANK", true),
            ("DEVICE", false),
            ("TENSORS", true),
            ("BYTES", true),
            ("COPY s", true),
        ]);
        for k in &r.ranks {
            tab.row(vec![
                k.rank.to_string(),
                k.device.clone(),
                k.tensors.to_string(),
                human_bytes(k.bytes),
                format!("{:.3}", k.copy_s),
            ]);
        }
        tab.write(w, "")?;
        writeln!(
            w,
            "\nloaded {} in {:.3}s: {:.2} GB/s (read, convert and copy overlapped; sync included)",
            human_bytes(r.bytes),
            t.transfer_s + t.sync_s,
            t.gbps(r.bytes)
        )?;
        let rows: [(&str, f64, &str); 9] = [
            ("resolve", t.open.resolve_s, "wall"),
            ("config", t.open.config_s, "wall"),
            ("headers", t.open.headers_s, "wall"),
            ("plan", t.open.plan_s, "wall"),
            ("open devices", t.open_devices_s, "wall"),
            ("read", t.read_s, "thread-summed"),
            ("convert", t.convert_s, "thread-summed"),
            ("copy to device", t.copy_s, "thread-summed"),
            ("sync", t.sync_s, "wall"),
        ];
        for (k, v, how) in rows {
            writeln!(w, "  {k:<15} {v:>9.3}s  {how}")?;
        }
        writeln!(w, "  {:<15} {:>9.3}s  wall", "total", t.total_s)?;
        for k in &r.ranks {
            for s in k.checksums.iter().flatten() {
                writeln!(
                    w,
                    "  rank {} {} {} {}",
                    k.rank,
                    s.name,
                    shape(&s.shape),
                    s.xxh3
                )?;
            }
        }
    }
    if !quiet {
        for warn in &r.warnings {
            writeln!(w, "warning: {warn}")?;
        }
    }
    Ok(())
}

/// With `--json`, a refused plan's problems also go to stdout, every one, while stderr gets the
/// summary. Returns `e`: the refusal stays the result whether or not its JSON copy could be
/// written, so that a closed pipe cannot turn exit 3 into a quiet success.
pub fn json_problems(out: &mut dyn Write, json: bool, e: crate::Error) -> crate::Error {
    if json && let Some(doc) = crate::plan::ProblemsReport::of(&e) {
        let _ = serde_json::to_writer_pretty(&mut *out, &doc)
            .map_err(io::Error::from)
            .and_then(|()| writeln!(out))
            .and_then(|()| out.flush());
    }
    e
}

/// At most this many problems of one kind are printed; the rest are counted.
pub const PROBLEMS_PER_KIND: usize = 5;
/// At most this many kinds of problem are printed; problems of the others are counted.
pub const PROBLEM_KINDS_SHOWN: usize = 20;

/// A refused plan's problems for a terminal. A short list is printed whole, in the order found.
/// A long one (a config claiming 20,000 layers yields 120,000 problems) is grouped by kind: the
/// first few of each kind, how many more there are, and a closing total; `--json` has them all.
pub struct ProblemList<'a>(pub &'a [Problem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ps = self.0;
        write!(
            f,
            "{} problem{} found; vLLM would refuse this checkpoint or load it wrongly:",
            thousands(ps.len() as u64),
            plural(ps.len())
        )?;
        let kinds = problem_kinds(ps);
        let elided =
            kinds.len() > PROBLEM_KINDS_SHOWN || kinds.iter().any(|k| k.count > PROBLEMS_PER_KIND);
        if !elided {
            return ps.iter().try_for_each(|p| write_problem(f, p));
        }
        let mut shown = 0;
        for k in kinds.iter().take(PROBLEM_KINDS_SHOWN) {
            for &i in &k.first {
                write_problem(f, &ps[i])?;
                shown += 1;
            }
            let more = k.count - k.first.len();
            if more > 0 {
                write!(f, "\n  … and {} more like this", thousands(more as u64))?;
            }
        }
        if let Some(rest) = kinds.get(PROBLEM_KINDS_SHOWN..) {
            let n: usize = rest.iter().map(|k| k.count).sum();
            write!(
                f,
                "\n  … and {} more problem{} of {} other kind{}",
                thousands(n as u64),
                plural(n),
                rest.len(),
                plural(rest.len())
            )?;
        }
        write!(
            f,
            "\n{} problems in all, {} shown above; pass --json for the complete list",
            thousands(ps.len() as u64),
            thousands(shown as u64)
        )
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn write_problem(f: &mut fmt::Formatter<'_>, p: &Problem) -> fmt::Result {
    write!(f, "\n  - {}", p.message)?;
    if let Some(fix) = &p.fix {
        write!(f, "\n    fix: {fix}")?;
    }
    Ok(())
}

/// Problems of one kind: the indices of the first few, and how many there are.
struct Kind {
    first: Vec<usize>,
    count: usize,
}

/// Kinds in the order their first problem was found.
fn problem_kinds(ps: &[Problem]) -> Vec<Kind> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut kinds: Vec<Kind> = Vec::new();
    for (i, p) in ps.iter().enumerate() {
        let n = kinds.len();
        let k = *index.entry(problem_kind(&p.message)).or_insert(n);
        if k == n {
            kinds.push(Kind {
                first: Vec::new(),
                count: 0,
            });
        }
        let kind = &mut kinds[k];
        kind.count += 1;
        if kind.first.len() < PROBLEMS_PER_KIND {
            kind.first.push(i);
        }
    }
    kinds
}

/// A message with what varies from one instance to the next masked: quoted names (`'…'`) and
/// numbers (layer indices, shapes, file numbers). Two problems of one kind differ only there.
/// A quote opens only after a non-alphanumeric character and closes only before one, so that
/// the apostrophe of "vLLM's" is prose, not a quote.
fn problem_kind(message: &str) -> String {
    let mut kind = String::with_capacity(message.len());
    let mut quoted = false;
    let mut prev = ' ';
    let mut chars = message.chars().peekable();
    while let Some(c) = chars.next() {
        let next = chars.peek().copied().unwrap_or(' ');
        let opens = c == '\'' && !quoted && !prev.is_alphanumeric();
        let closes = c == '\'' && quoted && !next.is_alphanumeric();
        if opens || closes {
            quoted = !quoted;
            kind.push(c);
        } else if !quoted && c.is_ascii_digit() {
            if !kind.ends_with('#') {
                kind.push('#');
            }
        } else if !quoted {
            kind.push(c);
        }
        prev = c;
    }
    kind
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
        assert_eq!(shape(&[0, 10, u64::MAX]), format!("[0, 10, {}]", u64::MAX));
    }

    #[test]
    fn tables_align_by_characters_and_trim_line_ends() {
        let mut t = Table::new(&[("NAME", false), ("N", true), ("NOTE", false)]);
        t.row(["ünïcode.模型", "7", "x"]);
        t.cell("a");
        t.cell_fmt(format_args!("{}", 1234));
        t.cell("");
        t.row(["b  ", "5", " "]);
        let mut out = Vec::new();
        t.write(&mut out, "  ").unwrap();
        let expected = "  NAME           N  NOTE\n  ünïcode.模型     7  x\n  a           1234\n  b              5\n";
        assert_eq!(String::from_utf8(out).unwrap(), expected);

        // The same rows, fitted then written without being stored.
        let rows: [[&str; 3]; 3] = [
            ["ünïcode.模型", "7", "x"],
            ["a", "1234", ""],
            ["b  ", "5", " "],
        ];
        let mut t = Table::new(&[("NAME", false), ("N", true), ("NOTE", false)]);
        for r in &rows {
            t.fit(r);
        }
        let mut out = Vec::new();
        let mut w = t.writer(&mut out, "  ").unwrap();
        for r in &rows {
            w.row(r).unwrap();
        }
        assert_eq!(String::from_utf8(out).unwrap(), expected);
    }

    fn problem(message: String) -> Problem {
        Problem {
            message,
            fix: Some("do this".into()),
        }
    }

    #[test]
    fn problem_kinds_mask_names_and_numbers_but_not_prose() {
        assert_eq!(
            problem_kind(
                "model-00002-of-00006.safetensors: tensor 'model.layers.7.x' has shape [64, 256]"
            ),
            "model-#-of-#.safetensors: tensor '' has shape [#, #]"
        );
        // The apostrophe of "vLLM's" does not open a quote that would swallow the rest.
        assert_eq!(
            problem_kind("x: unexpected tensor 'a.b' (vLLM's Llama at tp 2 has no such parameter)"),
            "x: unexpected tensor '' (vLLM's Llama at tp # has no such parameter)"
        );
        assert_ne!(
            problem_kind(
                "parameter 'a' has nothing in the checkpoint to fill it (missing shard q)"
            ),
            problem_kind(
                "parameter 'a' has nothing in the checkpoint to fill it (missing shard k)"
            ),
        );
    }

    #[test]
    fn problems_of_too_many_kinds_are_counted_past_the_first_twenty() {
        // 30 kinds of 2 problems each: no kind is long, but the kinds are too many.
        let ps: Vec<Problem> = (0..30)
            .flat_map(|k| {
                let kind = "abcdefghijklmnopqrstuvwxyzABCD".as_bytes()[k] as char;
                [0, 1].map(|i| problem(format!("kind {kind} instance '{i}'")))
            })
            .collect();
        let text = ProblemList(&ps).to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.iter().filter(|l| l.starts_with("  - ")).count(), 40);
        assert!(
            lines.contains(&"  … and 20 more problems of 10 other kinds"),
            "{text}"
        );
        assert_eq!(
            lines.last().copied(),
            Some("60 problems in all, 40 shown above; pass --json for the complete list")
        );
        // In the order found: kind a's two, then kind b's.
        assert_eq!(lines[1], "  - kind a instance '0'");
        assert_eq!(lines[3], "  - kind a instance '1'");
        assert_eq!(lines[5], "  - kind b instance '0'");
    }

    #[test]
    fn one_problem_reads_as_before() {
        let text = ProblemList(&[problem("it is 'broken'".into())]).to_string();
        assert_eq!(
            text,
            "1 problem found; vLLM would refuse this checkpoint or load it wrongly:\n  - it is 'broken'\n    fix: do this"
        );
    }
}
