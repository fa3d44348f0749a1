//! `wload shard`: what was written and how to serve it.

use std::io::{self, Write};

use super::*;

/// How much `shard` says: `-q` the serve line alone (what a script captures), the default the
/// result and how to serve it, `-v` also how the source was read and where the time went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    Quiet,
    Normal,
    Verbose,
}

/// The `shard` summary: what was written where, then how to serve it.
pub fn write_shard(
    w: &mut dyn Write,
    r: &crate::commands::shard::ShardReport,
    detail: Detail,
) -> io::Result<()> {
    let m = &r.manifest;
    if detail == Detail::Quiet {
        return match &m.serve {
            Some(serve) => writeln!(w, "{}", EscShell(&serve.shell)),
            None => Ok(()),
        };
    }
    write_result(w, r)?;
    if detail == Detail::Verbose {
        write_read(w, r)?;
        write_times(w, r)?;
    }
    if let Some(t) = &m.module_tree {
        let why = "vLLM builds this model's modules per platform (wload.json: module_tree)";
        writeln!(
            w,
            "platform: {} module tree: serve on {} only; {why}",
            Esc(t),
            Esc(t)
        )?;
    }
    let Some(serve) = &m.serve else {
        return Ok(());
    };
    let world = m.tp.saturating_mul(m.pp);
    if r.completed {
        // The other runs' files were there already: this run finished the output.
        writeln!(
            w,
            "serve with (all {world} ranks' files are in OUT now: this run completed it and wrote wload.json): {}",
            EscShell(&serve.shell)
        )
    } else if (m.ranks.len() as u64) < world {
        // `--ranks`: the other machines' files complete the folder.
        writeln!(
            w,
            "serve with (once all {world} ranks' files are in one folder; `wload inspect` checks): {}",
            EscShell(&serve.shell)
        )
    } else {
        writeln!(w, "serve with: {}", EscShell(&serve.shell))
    }
}

/// What was written, where, how fast, and what else went into OUT.
fn write_result(w: &mut dyn Write, r: &crate::commands::shard::ShardReport) -> io::Result<()> {
    let m = &r.manifest;
    let n = m.files.len();
    let t = &r.timings;
    let rate = if t.write_s > 0.0 {
        format!(
            " in {:.2}s ({}/s)",
            t.write_s,
            human_bytes((r.bytes as f64 / t.write_s) as u64)
        )
    } else {
        String::new()
    };
    writeln!(
        w,
        "wrote {n} {} ({}) for tp {}{} {} {} to {}{rate}",
        if n == 1 { "file" } else { "files" },
        human_bytes(r.bytes),
        m.tp,
        if m.pp > 1 {
            format!(" pp {}", m.pp)
        } else {
            String::new()
        },
        if m.ranks.len() == 1 { "rank" } else { "ranks" },
        crate::units::id_runs(&m.ranks),
        Esc(&r.out)
    )?;
    if let Some(from) = &r.ranks_from {
        writeln!(
            w,
            "ranks {}: {}",
            crate::units::id_runs(&m.ranks),
            Esc(from)
        )?;
    }
    let unchanged_config = r.config_changes.as_ref().is_some_and(Vec::is_empty);
    let copied: Vec<&str> = unchanged_config
        .then_some("config.json")
        .into_iter()
        .chain(r.side_files.iter().map(String::as_str))
        .collect();
    if !copied.is_empty() {
        writeln!(w, "copied {}", Esc(&copied.join(", ")))?;
    }
    if let Some(changes) = r.config_changes.as_ref().filter(|c| !c.is_empty()) {
        writeln!(w, "rewrote config.json: {}", Esc(&changes.join("; ")))?;
    }
    if r.verified {
        writeln!(
            w,
            "verified: all {n} {} read back byte for byte as the plan computes them from the source",
            if n == 1 { "file" } else { "files" }
        )?;
    }
    Ok(())
}

/// Where the time went, stage by stage (`-v`).
fn write_times(w: &mut dyn Write, r: &crate::commands::shard::ShardReport) -> io::Result<()> {
    let t = &r.timings;
    writeln!(
        w,
        "time: headers {:.3}s, plan {:.3}s, write {:.3}s, hash {:.3}s after the last write ({:.3}s hashing in all, blocks hashed as written), side files {:.3}s{}",
        t.open.headers_s,
        t.open.plan_s,
        t.write_s,
        t.hash_s,
        t.hash_busy_s,
        t.side_files_s,
        if r.verified {
            format!(", verify {:.3}s", t.verify_s)
        } else {
            String::new()
        }
    )
}

/// How the source was read and how much of it the page cache held as writing started: what the
/// write rate depends on most, in the JSON as `io` and `source_cache`.
fn write_read(w: &mut dyn Write, r: &crate::commands::shard::ShardReport) -> io::Result<()> {
    let c = &r.source_cache;
    let evicted = match c.evicted_from_bytes {
        Some(b) => format!(", after --cold evicted it from {} cached", human_bytes(b)),
        None => String::new(),
    };
    writeln!(
        w,
        "read: io {} ({}); source {}, {:.0}% in the page cache at the start ({}{evicted})",
        r.io.used,
        Esc(&r.io.why),
        human_bytes(c.source_bytes),
        c.resident_share * 100.0,
        human_bytes(c.resident_bytes),
    )
}
