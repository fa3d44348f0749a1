//! `wload shard`: what was written and how to serve it.

use std::io::{self, Write};

use super::*;

/// The `shard` summary: where the files went and how long each stage took.
pub fn write_shard(w: &mut dyn Write, r: &crate::commands::shard::ShardReport) -> io::Result<()> {
    let m = &r.manifest;
    writeln!(
        w,
        "wrote {} files ({}) for tp {}{} ranks {:?} to {}",
        m.files.len(),
        human_bytes(r.bytes),
        m.tp,
        if m.pp > 1 {
            format!(" pp {}", m.pp)
        } else {
            String::new()
        },
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
    let Some(serve) = &m.serve else {
        return Ok(());
    };
    let world = m.tp.saturating_mul(m.pp);
    if (m.ranks.len() as u64) < world {
        // `--ranks`: the other machines' files complete the folder.
        writeln!(
            w,
            "serve with (once all {world} ranks' files are in one folder; `wload inspect` checks): {}",
            serve.shell
        )
    } else {
        writeln!(w, "serve with: {}", serve.shell)
    }
}
