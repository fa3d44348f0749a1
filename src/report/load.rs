//! `wload load`: the result first (what was loaded, how fast), then per rank bytes and rates and
//! the stage timings; `-v` adds where the bytes came from, `-q` leaves the result line alone.

use std::io::{self, Write};

use super::*;

/// The `load` report: the result line, then (unless `quiet`) per-rank bytes and copy rates and
/// where the time went, with `verbose` where the bytes came from. `--checksums` are results:
/// printed with `quiet` too.
pub fn write_load(
    w: &mut dyn Write,
    r: &crate::commands::load::LoadReport,
    verbose: bool,
    quiet: bool,
) -> io::Result<()> {
    if r.dry_run {
        write_dry_run(w, r, quiet)?;
    } else {
        write_result(w, r)?;
        if !quiet {
            if r.checked {
                write_checked(w, r)?;
            }
            if verbose {
                write_source(w, r)?;
            }
            writeln!(w)?;
            write_ranks(w, r)?;
            write_timings(w, r)?;
        }
        write_checksums(w, r)?;
    }
    if !quiet {
        for warn in &r.warnings {
            writeln!(w, "warning: {}", Esc(warn))?;
        }
    }
    Ok(())
}

/// `--dry-run`: the verdict, and with `--read` each file's checksum against wload.json.
fn write_dry_run(
    w: &mut dyn Write,
    r: &crate::commands::load::LoadReport,
    quiet: bool,
) -> io::Result<()> {
    writeln!(
        w,
        "ok: vLLM would load {} at tp {}{} ({} ranks checked, {}, {})",
        Esc(&r.source),
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
    for f in r.files_read.iter().filter(|_| !quiet) {
        let m = match f.matches_manifest {
            Some(true) => " (matches wload.json)",
            Some(false) => " (DIFFERS from wload.json)",
            None => "",
        };
        writeln!(
            w,
            "  read {} {} checksum {}{m}",
            Esc(&f.file),
            human_bytes(f.bytes),
            Esc(&f.xxh3_64k)
        )?;
    }
    Ok(())
}

/// One row per rank: where its bytes went and how fast each stage ran.
fn write_ranks(w: &mut dyn Write, r: &crate::commands::load::LoadReport) -> io::Result<()> {
    let host = on_host(r);
    let mut tab = Table::new(&[
        ("RANK", true),
        ("DEVICE", false),
        ("TENSORS", true),
        ("BYTES", true),
        ("COPY s*", true),
        ("READ GB/s", true),
        (if host { "INTO MEMORY GB/s" } else { "H2D GB/s" }, true),
        ("OVERLAP", true),
    ]);
    for k in &r.ranks {
        let st = &k.stages;
        tab.row(vec![
            k.rank.to_string(),
            k.device.clone(),
            k.tensors.to_string(),
            human_bytes(k.bytes),
            format!("{:.3}", k.copy_s),
            rate(st.read_bytes, st.read_gbps),
            rate(st.h2d_bytes, st.h2d_gbps),
            format!("{:.0}%", st.overlap * 100.0),
        ]);
    }
    tab.write(w, "")?;
    writeln!(
        w,
        "* summed over the rank's threads, which copy at once: it may exceed the wall time"
    )
}

/// The destination is host memory (`--device cpu`): no host-to-device copy to speak of.
fn on_host(r: &crate::commands::load::LoadReport) -> bool {
    r.device == crate::commands::load::DeviceKind::Cpu
}

/// The one result line: what was loaded where, how fast, and how much of the source was in the
/// page cache (so that warm and cold figures are never confused); with `--repeat`, the spread.
fn write_result(w: &mut dyn Write, r: &crate::commands::load::LoadReport) -> io::Result<()> {
    let t = &r.timings;
    let tensors: usize = r.ranks.iter().map(|k| k.tensors).sum();
    let pp = if r.pp > 1 {
        format!(" × PP {}", r.pp)
    } else {
        String::new()
    };
    let cache = match &r.cache {
        Some(c) => format!(
            ", source {:.0}% in the page cache{}",
            c.resident_share * 100.0,
            if c.evicted_from_bytes.is_some() {
                " (--cold)"
            } else {
                ""
            }
        ),
        None => String::new(),
    };
    let repeats = match &r.repeats {
        Some(rep) => format!(
            "; {} runs: {:.2} / {:.2} / {:.2} GB/s min / median / max",
            rep.runs.len(),
            rep.gbps_min,
            rep.gbps_median,
            rep.gbps_max
        ),
        None => String::new(),
    };
    let mut devices: Vec<&str> = r.ranks.iter().map(|k| k.device.as_str()).collect();
    devices.sort_unstable();
    devices.dedup();
    let onto = match (r.device, devices.len()) {
        (crate::commands::load::DeviceKind::Cpu, _) => "into host memory".to_string(),
        (_, 1) => "onto 1 GPU".to_string(),
        (_, n) => format!("onto {n} GPUs"),
    };
    writeln!(
        w,
        "loaded {} ({} tensors, {} {} of TP {}{pp}) {onto} in {:.3}s: {:.2} GB/s{cache}{repeats}",
        human_bytes(r.bytes),
        thousands(tensors as u64),
        r.ranks.len(),
        if r.ranks.len() == 1 { "rank" } else { "ranks" },
        r.tp,
        t.transfer_s + t.sync_s,
        t.gbps(r.bytes)
    )
}

/// Where the time went, stage by stage.
fn write_timings(w: &mut dyn Write, r: &crate::commands::load::LoadReport) -> io::Result<()> {
    let t = &r.timings;
    if let Some(rep) = &r.repeats {
        writeln!(
            w,
            "\n{} runs: {:.3} / {:.3} / {:.3} s min / median / max; the rest is the last run",
            rep.runs.len(),
            rep.seconds_min,
            rep.seconds_median,
            rep.seconds_max
        )?;
    }
    writeln!(
        w,
        "\ntransfer {:.3}s: read, convert and copy overlapped, sync included",
        t.transfer_s + t.sync_s
    )?;
    let copy_label = if on_host(r) {
        "copy to memory"
    } else {
        "copy to device"
    };
    // Bytes a sink reads itself (straight into the destination) are timed as its copy.
    let read_how = if t.read_s == 0.0 && t.bytes_read > 0 {
        "thread-summed; read straight into the destination, timed in the copy"
    } else {
        "thread-summed"
    };
    let rows: [(&str, f64, &str); 10] = [
        ("resolve", t.open.resolve_s, "wall"),
        ("config", t.open.config_s, "wall"),
        ("headers", t.open.headers_s, "wall"),
        ("plan", t.open.plan_s, "wall"),
        ("page cache", t.cache_s, "wall"),
        ("open devices", t.open_devices_s, "wall"),
        ("read", t.read_s, read_how),
        ("convert", t.convert_s, "thread-summed"),
        (copy_label, t.copy_s, "thread-summed"),
        ("sync", t.sync_s, "wall"),
    ];
    for (k, v, how) in rows {
        writeln!(w, "  {k:<15} {v:>9.3}s  {how}")?;
    }
    writeln!(w, "  {:<15} {:>9.3}s  wall", "total", t.total_s)
}

/// `--checksums`: one line per tensor.
fn write_checksums(w: &mut dyn Write, r: &crate::commands::load::LoadReport) -> io::Result<()> {
    for k in &r.ranks {
        for s in k.checksums.iter().flatten() {
            writeln!(
                w,
                "rank {} {} {} {}",
                k.rank,
                Esc(&s.name),
                shape(&s.shape),
                Esc(&s.xxh3)
            )?;
        }
    }
    Ok(())
}

/// `--check`'s confirmation: without it, a check that passed would print nothing that says so.
fn write_checked(w: &mut dyn Write, r: &crate::commands::load::LoadReport) -> io::Result<()> {
    let tensors: usize = r.ranks.iter().map(|k| k.tensors).sum();
    let mut devices: Vec<&str> = r.ranks.iter().map(|k| k.device.as_str()).collect();
    devices.dedup();
    writeln!(
        w,
        "checked: all {tensors} {} read back from {} equal byte for byte what the host computes from the source",
        if tensors == 1 { "tensor" } else { "tensors" },
        Esc(&devices.join(", "))
    )
}

/// A stage's rate, or `-` when the stage moved nothing.
fn rate(bytes: u64, gbps: f64) -> String {
    if bytes == 0 {
        "-".into()
    } else {
        format!("{gbps:.2}")
    }
}

/// `-v`: where the bytes came from: the page cache's share before the load, the eviction, the
/// I/O mode and why, the staging memory, the storage and host-to-device rates.
fn write_source(w: &mut dyn Write, r: &crate::commands::load::LoadReport) -> io::Result<()> {
    if let Some(c) = &r.cache {
        let evicted = match c.evicted_from_bytes {
            Some(b) => format!(" (--cold: evicted from {} cached)", human_bytes(b)),
            None => String::new(),
        };
        writeln!(
            w,
            "  source {}: {:.0}% in the page cache at the start ({}){evicted}",
            human_bytes(c.source_bytes),
            c.resident_share * 100.0,
            human_bytes(c.resident_bytes),
        )?;
    }
    if let Some(io) = &r.io {
        let staging = if io.staging_bytes_per_rank > 0 {
            format!(
                "; staging {} per rank",
                human_bytes(io.staging_bytes_per_rank)
            )
        } else {
            String::new()
        };
        writeln!(
            w,
            "  io {} ({}); {} threads{staging}",
            io.choice.used,
            Esc(&io.choice.why),
            io.threads
        )?;
    }
    let t = &r.timings;
    let into = if on_host(r) {
        "into host memory"
    } else {
        "host -> device"
    };
    writeln!(
        w,
        "  storage -> host {:.2} GB/s ({} read), {into} {:.2} GB/s, over the transfer's wall time",
        t.read_gbps,
        human_bytes(t.bytes_read),
        t.h2d_gbps
    )
}
