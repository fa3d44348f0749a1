//! `inspect` of a folder without its config: the refusal first, then the files, every tensor and
//! the totals.

use std::io::{self, Write};

use super::{write_file_list, write_tensor_list, write_totals};
use crate::commands::inspect::config_less::ConfigLess;
use crate::report::Esc;

pub fn write_config_less(w: &mut dyn Write, c: &ConfigLess, verbose: bool) -> io::Result<()> {
    let f = &c.format;
    writeln!(w, "source  {}", Esc(&c.source))?;
    let index = f
        .index
        .as_ref()
        .map_or_else(String::new, |x| format!(", filtered by {}", Esc(x)));
    writeln!(w, "format  {}: {}{index}", f.load_format, Esc(&f.pattern))?;
    writeln!(
        w,
        "config  none: no model, structure or support verdict ({})",
        Esc(&c.note)
    )?;
    write_file_list(w, &c.files, &c.dropped, false, verbose)?;
    write_tensor_list(w, &c.tensors, c.filter.as_deref(), &c.duplicates)?;
    write_totals(w, &c.totals)
}
