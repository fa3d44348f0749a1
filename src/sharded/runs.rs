//! Run records. A `wload shard` run that writes every rank records it in `wload.json`; a
//! `--ranks` run that writes some records them in `wload-ranks-{ranks}.json` instead. So runs of
//! one plan split across machines (one per node, under torchrun or Slurm) and copied into one
//! folder leave one record each, none written over another, and read back as one manifest: the
//! union of their ranks and files. Runs of different plans (another source, TP, PP, dtype or
//! wload version) are not merged: the disagreement is a problem that names both records.

use std::collections::BTreeSet;
use std::path::Path;

use super::manifest::{MANIFEST, Manifest};
use crate::checkpoint::Checkpoint;
use crate::problem::Problem;

/// The file-name prefix of a `--ranks` run's record.
const RECORD_PREFIX: &str = "wload-ranks-";

/// The record a run of `ranks` (global ranks, sorted) out of `world` writes: `wload.json` for all
/// of them, else `wload-ranks-0-3.json` (ranges joined by `_`: `wload-ranks-0-1_4.json`).
pub fn record_name(ranks: &[u64], world: u64) -> String {
    if ranks.len() as u64 == world && ranks.iter().copied().eq(0..world) {
        return MANIFEST.to_string();
    }
    let mut spans: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let start = ranks[i];
        while i + 1 < ranks.len() && ranks[i + 1] == ranks[i] + 1 {
            i += 1;
        }
        spans.push(if ranks[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", ranks[i])
        });
        i += 1;
    }
    format!("{RECORD_PREFIX}{}.json", spans.join("_"))
}

/// Whether `name` is a run record: `wload.json` or a `--ranks` run's.
pub fn is_record(name: &str) -> bool {
    name == MANIFEST
        || name
            .strip_prefix(RECORD_PREFIX)
            .and_then(|n| n.strip_suffix(".json"))
            .is_some_and(|n| {
                !n.is_empty() && n.chars().all(|c| c.is_ascii_digit() || "-_".contains(c))
            })
}

/// A folder's records, merged.
#[derive(Debug, Default)]
pub struct Runs {
    /// The merged view; `None` without a readable record.
    pub manifest: Option<Manifest>,
    /// Records of other plans, or that list one file differently.
    pub problems: Vec<Problem>,
}

/// The records in `dir`, `wload.json` first, then by name, merged into one view.
pub fn read(dir: &Path) -> Runs {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Runs::default();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| is_record(n))
        .collect();
    names.sort_by_key(|n| (n != MANIFEST, n.clone()));
    let records = names
        .iter()
        .filter_map(|n| Manifest::read_record(&dir.join(n)));
    merge(dir, records)
}

fn merge(dir: &Path, records: impl Iterator<Item = Manifest>) -> Runs {
    let mut runs = Runs::default();
    for r in records {
        let Some(base) = &mut runs.manifest else {
            runs.manifest = Some(r);
            continue;
        };
        if let Some(p) = disagreement(dir, base, &r) {
            runs.problems.push(p);
            continue;
        }
        add_run(dir, base, r, &mut runs.problems);
    }
    if let Some(m) = &mut runs.manifest {
        m.files.sort_by_key(|f| (f.rank, f.part));
        m.ranks.sort_unstable();
        m.ranks.dedup();
    }
    runs
}

/// `r`'s ranks, files and side files added to `base`; a file both list differently is a problem.
fn add_run(dir: &Path, base: &mut Manifest, r: Manifest, problems: &mut Vec<Problem>) {
    let record = r.records.first().cloned().unwrap_or_default();
    for f in r.files {
        match base.files.iter().find(|b| b.name == f.name) {
            Some(b) if b.size == f.size && b.xxh3_64k == f.xxh3_64k => {}
            Some(b) => problems.push(Problem {
                message: format!(
                    "{}: {} and {} both list {} but with other contents ({} and {} bytes, checksums {} and {})",
                    dir.display(),
                    base.records.join(", "),
                    record,
                    f.name,
                    b.size,
                    f.size,
                    b.xxh3_64k.as_deref().unwrap_or("none"),
                    f.xxh3_64k.as_deref().unwrap_or("none"),
                ),
                fix: Some(format!(
                    "keep one run's copy of {}: re-shard that rank, or remove {record} and its files",
                    f.name
                )),
                file: Some(dir.join(&record).display().to_string()),
                ..Default::default()
            }),
            None => base.files.push(f),
        }
    }
    base.ranks.extend(r.ranks);
    let side: BTreeSet<String> = (base.side_files.iter().flatten())
        .chain(r.side_files.iter().flatten())
        .cloned()
        .collect();
    if base.side_files.is_some() || r.side_files.is_some() {
        base.side_files = Some(side.into_iter().collect());
    }
    if let Some(tree) = r.side_tree {
        let mut all: BTreeSet<String> = base
            .side_tree
            .take()
            .unwrap_or_default()
            .into_iter()
            .collect();
        all.extend(tree);
        base.side_tree = Some(all.into_iter().collect());
    }
    base.records.push(record);
}

/// The first thing that makes `r` a run of another plan than `base`, as a problem naming both.
fn disagreement(dir: &Path, base: &Manifest, r: &Manifest) -> Option<Problem> {
    let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "none".into());
    let source = |m: &Manifest| match (&base.source_id, &r.source_id) {
        (Some(_), Some(_)) => opt(&m.source_id),
        _ => m.source.clone(),
    };
    let fields: [(&str, String, String); 13] = [
        (
            "wload version",
            base.wload_version.clone(),
            r.wload_version.clone(),
        ),
        ("format", base.format.clone(), r.format.clone()),
        ("source", source(base), source(r)),
        (
            "architecture",
            base.architecture.clone(),
            r.architecture.clone(),
        ),
        ("--tp", base.tp.to_string(), r.tp.to_string()),
        ("--pp", base.pp.to_string(), r.pp.to_string()),
        (
            crate::ranks::stages::PP_PARTITION_VAR,
            opt(&base.pp_layer_partition),
            opt(&r.pp_layer_partition),
        ),
        (
            "expert parallelism",
            base.expert_parallel.to_string(),
            r.expert_parallel.to_string(),
        ),
        ("dtype", base.dtype.clone(), r.dtype.clone()),
        ("--moe-backend", opt(&base.moe_backend), opt(&r.moe_backend)),
        (
            "--language-model-only",
            base.language_model_only.to_string(),
            r.language_model_only.to_string(),
        ),
        (
            "--mm-encoder-tp-mode",
            opt(&base.mm_encoder_tp_mode),
            opt(&r.mm_encoder_tp_mode),
        ),
        ("module tree", opt(&base.module_tree), opt(&r.module_tree)),
    ];
    let (what, a, b) = fields.into_iter().find(|(_, a, b)| a != b)?;
    let record = r.records.first().cloned().unwrap_or_default();
    Some(Problem {
        message: format!(
            "{}: {record} records a run of another plan than {}: {what} {b}, not {a}",
            dir.display(),
            base.records.join(", "),
        ),
        fix: Some(format!(
            "keep the files of one plan in a folder: move {record} and the rank files it lists elsewhere, or re-shard those ranks with the same source, flags and wload version"
        )),
        file: Some(dir.join(&record).display().to_string()),
        ..Default::default()
    })
}

/// The source's identity wherever its copy lies: XXH3-64 of its weight files' names and sizes
/// and every tensor's name, dtype, shape and place. Two copies of one checkpoint agree; a changed
/// tensor table does not. (The data is not read: that would double a run's reading.)
pub fn source_id(ck: &Checkpoint) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for f in &ck.files {
        h.update(f.name.as_bytes());
        h.update(&f.size.to_le_bytes());
        for t in &f.tensors {
            h.update(t.name.as_bytes());
            h.update(t.dtype.as_str().as_bytes());
            for d in &t.shape {
                h.update(&d.to_le_bytes());
            }
            h.update(&t.offset.to_le_bytes());
            h.update(&t.len.to_le_bytes());
        }
    }
    format!("{:016x}", h.digest())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_names_say_which_ranks() {
        assert_eq!(record_name(&[0, 1, 2, 3], 4), "wload.json");
        assert_eq!(record_name(&[4, 5, 6, 7], 8), "wload-ranks-4-7.json");
        assert_eq!(record_name(&[0, 1, 4], 8), "wload-ranks-0-1_4.json");
        assert_eq!(record_name(&[3], 8), "wload-ranks-3.json");
        for n in [
            "wload.json",
            "wload-ranks-4-7.json",
            "wload-ranks-0-1_4.json",
        ] {
            assert!(is_record(n), "{n}");
        }
        for n in [
            "wload-ranks-.json",
            "wload-ranks-a.json",
            "wload.json.bak",
            "config.json",
        ] {
            assert!(!is_record(n), "{n}");
        }
    }
}
