//! Human-facing output: aligned tables, sizes and problem lists, one file per subcommand. JSON
//! output is serde's; this is the rest.
//!
//! Everything here is written for a terminal, through [`crate::escape::Terminal`] (see
//! `src/app/`), which escapes control characters. What it cannot do is tell a newline in
//! a name from one wload writes: every untrusted value (a name, a path, a string from a config,
//! a mapping, a hub or a manifest) is formatted into a line with [`Esc`], and a [`Table`]
//! escapes its cells itself.

mod hub;
mod inspect;
pub mod json;
mod load;
mod plan;
pub mod schema;
mod shard;
mod sizes;
mod survey;

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::io::{self, Write};

pub use crate::escape::{Esc, EscShell, escape};
pub use hub::hub_fetched_line;
pub use inspect::{write_config_less, write_inspection};
pub use load::write_load;
pub use plan::write_plan;
pub use shard::{Detail, write_shard};
pub use sizes::write_sizes;
pub use survey::write_other_source;

/// A plain aligned table; columns marked numeric are right-aligned. Cells are escaped
/// ([`escape`]): a name with a newline or an ESC in it stays one cell of one line.
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
    pub(crate) fn cell(&mut self, s: &str) {
        self.text.push_str(&escape(s));
        self.end_cell();
    }

    /// Stores the next cell, formatted straight into the table (`format_args!`).
    pub(crate) fn cell_fmt(&mut self, args: fmt::Arguments) {
        let start = self.text.len();
        self.text
            .write_fmt(args)
            .expect("formatting into a String does not fail");
        if let Cow::Owned(e) = escape(&self.text[start..]) {
            self.text.truncate(start);
            self.text.push_str(&e);
        }
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
            *w = (*w).max(width(&escape(c)));
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

    /// Built whole before it is written, so that trailing blanks can be trimmed. Cells are
    /// escaped here too, for rows that were fitted rather than stored (a stored cell is escaped
    /// already, and escaping is idempotent).
    fn line<'c>(&mut self, cells: impl Iterator<Item = &'c str>) -> io::Result<()> {
        let (t, line) = (self.table, &mut self.line);
        line.clear();
        line.push_str(self.indent);
        for (i, c) in cells.enumerate() {
            let c = escape(c);
            let c = c.as_ref();
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

pub use crate::units::{HumanBytes, human_bytes, thousands};

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
}
