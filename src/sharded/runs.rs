//! Run records. A `wload shard` run that writes every rank records it in `wload.json`; a
//! `--ranks` run that writes some records them in `wload-ranks-{ranks}.json` instead. So runs of
//! one plan split across machines (one per node, under torchrun or Slurm) and copied into one
//! folder leave one record each, none written over another, and read back as one manifest: the
//! union of their ranks and files. Runs of different plans (another source, TP, PP, dtype or
//! wload version) are not merged: the disagreement is a problem that names both records.
//!
//! [`check`] is the one verdict on whether a folder's records and rank files are one complete,
//! consistent output: `inspect`, `load` (with or without `--dry-run`) and the planner of
//! pre-sharded folders (so the Python binding and the vLLM plugin) all take it, so that none
//! accepts a folder another refuses. A record that cannot be read, or a rank file no record
//! lists, is a problem naming the file, never skipped: the unlisted file's checksum is unknown.

use std::collections::BTreeSet;
use std::path::Path;

use super::manifest::{MANIFEST, Manifest, RecordError};
use super::names::RankFiles;
use crate::problem::Problem;

// Here, above the record it returns: a folder's manifest is its run records merged.
impl Manifest {
    /// The manifest of folder `dir`: its run records merged ([`read`]), if it has
    /// a readable one. Records that disagree leave the first one's view; the folder's checks
    /// report the disagreement ([`read`]).
    pub(crate) fn read(dir: &Path) -> Option<Manifest> {
        read(dir).manifest
    }
}

/// The file-name prefix of a `--ranks` run's record.
const RECORD_PREFIX: &str = "wload-ranks-";

/// The record a run of `ranks` (global ranks, sorted) out of `world` writes: `wload.json` for all
/// of them, else `wload-ranks-0-3.json` (ranges joined by `_`: `wload-ranks-0-1_4.json`).
pub(crate) fn record_name(ranks: &[u64], world: u64) -> String {
    if ranks.len() as u64 == world && ranks.iter().copied().eq(0..world) {
        return MANIFEST.to_string();
    }
    // `_` for the `,` of `--ranks`: a comma in a file name needs quoting in shells.
    let runs = crate::units::id_runs(ranks).replace(',', "_");
    format!("{RECORD_PREFIX}{runs}.json")
}

/// Whether `name` is a run record: `wload.json` or a `--ranks` run's.
pub(crate) fn is_record(name: &str) -> bool {
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
pub(crate) struct Runs {
    /// The merged view; `None` without a readable record.
    pub manifest: Option<Manifest>,
    /// Records that cannot be read, of other plans, or that list one file differently; with
    /// [`check`], also rank files no record lists and listed files that are gone.
    pub problems: Vec<Problem>,
}

/// The folder `dir` with rank files `files` as one output: its records merged, and every problem
/// that makes them not one complete, consistent output. A folder without any record (vLLM's own
/// save_sharded_state) has none of these problems: its files are checked by their headers only.
pub(crate) fn check(dir: &Path, files: &RankFiles) -> Runs {
    let mut runs = read(dir);
    // Files of a record that is unreadable or of another plan would be named again here, as
    // unlisted: that record is the problem to fix first.
    if let Some(m) = runs.manifest.as_ref().filter(|_| runs.problems.is_empty()) {
        runs.problems.extend(unlisted(dir, files, m));
        runs.problems.extend(gone(dir, files, m));
    }
    runs
}

/// The records in `dir`, `wload.json` first, then by name, merged into one view; a record that
/// cannot be read is a problem naming it.
pub(crate) fn read(dir: &Path) -> Runs {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Runs::default();
    };
    let records = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| is_record(n))
        .map(|n| {
            let read = crate::small_file::read(&dir.join(&n)).map_err(RecordError::from);
            (n, read)
        })
        .collect();
    merge_named(dir, records)
}

/// Records as `(name, bytes)`, wherever they were read from (a folder, a store's listing),
/// `wload.json` first, then by name, merged into one view; `dir` names where they are in
/// messages. A record that cannot be read or parsed is a problem naming it.
pub(crate) fn merge_named(
    dir: &Path,
    mut records: Vec<(String, Result<Vec<u8>, RecordError>)>,
) -> Runs {
    records.sort_by(|a, b| (a.0 != MANIFEST, &a.0).cmp(&(b.0 != MANIFEST, &b.0)));
    let mut unreadable = Vec::new();
    let parsed: Vec<Manifest> = records
        .into_iter()
        .filter_map(
            |(n, bytes)| match bytes.and_then(|b| Manifest::parse_record(&n, &b)) {
                Ok(m) => Some(m),
                Err(e) => {
                    unreadable.push(unreadable_record(dir, &n, &e));
                    None
                }
            },
        )
        .collect();
    let mut runs = merge(dir, parsed);
    unreadable.append(&mut runs.problems);
    runs.problems = unreadable;
    runs
}

/// The manifest a complete set of `--ranks` runs' records make together, for `wload.json`: `Some`
/// only when `records` (none of them `wload.json`) merge without a problem and cover every
/// rank of their plan. The merge's order is the names', so whichever run finishes last, the
/// bytes are the same.
pub(crate) fn completed(
    dir: &Path,
    records: Vec<(String, Result<Vec<u8>, RecordError>)>,
) -> Option<Manifest> {
    let runs = merge_named(dir, records);
    let m = runs.manifest.filter(|_| runs.problems.is_empty())?;
    let world = m.tp.checked_mul(m.pp)?;
    if !m.ranks.iter().copied().eq(0..world) {
        return None;
    }
    Some(m)
}

/// A record that cannot be read: the rank files it lists cannot be checked, so the folder is not
/// one known output until it is copied again or its run repeated.
fn unreadable_record(dir: &Path, name: &str, e: &RecordError) -> Problem {
    Problem {
        message: format!("{}: run record {name} {e}", dir.display()),
        fix: Some(format!(
            "copy {name} again from the machine that ran that `wload shard --ranks` run, or re-shard those ranks into the folder"
        )),
        file: Some(dir.join(name).display().to_string()),
        ..Default::default()
    }
}

/// Rank files that no readable record lists: left from another run, or written by a run whose
/// record was not copied. Their checksums are unknown, so they cannot be part of the output.
fn unlisted(dir: &Path, files: &RankFiles, m: &Manifest) -> Option<Problem> {
    let listed: BTreeSet<&str> = m.files.iter().map(|f| f.name.as_str()).collect();
    let names: Vec<&str> = (files.values().flatten())
        .map(|(_, n)| n.as_str())
        .filter(|n| !listed.contains(n))
        .collect();
    let first = *names.first()?;
    Some(Problem {
        message: format!(
            "{}: {} listed in no run record ({}): left from another run, or a --ranks run whose record was not copied",
            dir.display(),
            some_names(&names),
            m.record_names(),
        ),
        fix: Some("copy the run record (wload-ranks-*.json) that lists them beside them, remove them, or re-shard into an empty folder".into()),
        file: Some(first.to_string()),
        ..Default::default()
    })
}

/// Files the records list that are not in the folder.
fn gone(dir: &Path, files: &RankFiles, m: &Manifest) -> Option<Problem> {
    let present: BTreeSet<&str> = (files.values().flatten())
        .map(|(_, n)| n.as_str())
        .collect();
    let names: Vec<&str> = (m.files.iter())
        .map(|f| f.name.as_str())
        .filter(|n| !present.contains(n))
        .collect();
    let first = *names.first()?;
    Some(Problem {
        message: format!(
            "{}: {} lists files that are gone: {}",
            dir.display(),
            m.record_names(),
            some_names(&names)
        ),
        fix: Some("copy them again, or re-shard".into()),
        file: Some(first.to_string()),
        ..Default::default()
    })
}

/// The first names of a list, for a message: eight, then how many more.
fn some_names(names: &[&str]) -> String {
    const SHOWN: usize = 8;
    let mut s = names[..names.len().min(SHOWN)].join(", ");
    if names.len() > SHOWN {
        s += &format!(" and {} more", names.len() - SHOWN);
    }
    s
}

fn merge(dir: &Path, records: Vec<Manifest>) -> Runs {
    let mut runs = Runs::default();
    for r in records {
        let Some(base) = &mut runs.manifest else {
            runs.manifest = Some(r);
            continue;
        };
        if let Some(p) = disagreement(dir, base, &r).or_else(|| data_disagreement(dir, base, &r)) {
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
    // In the first record's order, then the names it lacks: runs of one plan list the same side
    // files, so the merged list is each run's, and `wload.json` of a split output is a whole run's.
    if let Some(theirs) = r.side_files {
        let side = base.side_files.get_or_insert_with(Vec::new);
        for n in theirs {
            if !side.contains(&n) {
                side.push(n);
            }
        }
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
    let overrides = |m: &Manifest| {
        (m.hf_overrides.clone())
            .map_or_else(|| "none".into(), |o| serde_json::Value::from(o).to_string())
    };
    let fields: [(&str, String, String); 15] = [
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
        ("--hf-overrides", overrides(base), overrides(r)),
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
        (
            crate::ranks::embed::REPLICATE_EMBED_VAR,
            base.replicate_embed.to_string(),
            r.replicate_embed.to_string(),
        ),
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

/// `r` a run of another checkpoint than `base` with the same tensor table ([`super::source`]),
/// or a record that cannot tell: one written before wload recorded its source's data. Such a
/// record is not merged at all (wload has not been released without the field, so only folders
/// of development builds are affected, and a silent merge of two checkpoints is what the field
/// prevents); a folder of one such record alone needs no merge and still loads.
fn data_disagreement(dir: &Path, base: &Manifest, r: &Manifest) -> Option<Problem> {
    let record = r.records.first().cloned().unwrap_or_default();
    let (message, fix) = match (&base.source_data, &r.source_data) {
        (Some(a), Some(b)) if a == b => return None,
        (Some(a), Some(b)) => (
            format!(
                "{}: {record} records a run of another checkpoint than {}, with the same tensors but other data (source data {b}, not {a}: a fine-tune and its base, or two releases of one model)",
                dir.display(),
                base.records.join(", "),
            ),
            format!(
                "keep the files of one checkpoint in a folder: move {record} and the rank files it lists elsewhere, or re-shard those ranks from the same checkpoint"
            ),
        ),
        _ => {
            let old: Vec<&str> = [base, r]
                .into_iter()
                .filter(|m| m.source_data.is_none())
                .flat_map(|m| m.records.iter().map(String::as_str))
                .collect();
            (
                format!(
                    "{}: {record} and {} cannot be merged: {} records no source data (written by an earlier wload), so the runs may be of two checkpoints",
                    dir.display(),
                    base.records.join(", "),
                    old.join(", ")
                ),
                format!(
                    "re-shard the ranks of {} with this wload ({})",
                    old.join(", "),
                    env!("CARGO_PKG_VERSION")
                ),
            )
        }
    };
    Some(Problem {
        message,
        fix: Some(fix),
        file: Some(dir.join(&record).display().to_string()),
        ..Default::default()
    })
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
