//! `wload load`: per rank, bytes and copy time; the stage timings.

use std::io::{self, Write};

use super::*;

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
            "ok: vLLM would load {} at tp {}{} ({} ranks checked, {}, {})",
            r.source,
            r.tp,
            if r.pp > 1 {
                format!(" pp {}", r.pp)
            } else {
                String::new()
            },
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
