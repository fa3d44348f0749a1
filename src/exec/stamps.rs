//! The source files a run reads are the files the plan was made from: opened and checked against
//! the plan's stamps, and checked again after reading, so that bytes of a file that changed
//! meanwhile are never used.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use super::ExecError;
use super::source::{IoMode, SourceFile};
use crate::file_stamp::{Change, FileStamp};
use crate::plan::Plan;

/// `f`, opened at `path`, is still the file `planned` describes, unchanged.
pub(crate) fn unchanged(planned: &FileStamp, f: &File, path: &Path) -> Result<(), ExecError> {
    let now = FileStamp::of_file(f).map_err(|e| ExecError::io("reading", path, e))?;
    match planned.change_to(&now) {
        None => Ok(()),
        Some(change) => Err(ExecError::SourceChanged {
            path: path.to_path_buf(),
            change,
        }),
    }
}

/// `f`, opened at `path`, is still the file the plan read as `file_index`, unchanged: for readers
/// of source bytes outside the engine (tying checks, `--dry-run --read`).
pub(crate) fn still_planned(
    plan: &Plan,
    file_index: usize,
    f: &File,
    path: &Path,
) -> Result<(), ExecError> {
    unchanged(&planned_stamp(plan, file_index, path)?, f, path)
}

/// The plan's stamp of the file at `file_index`.
pub(crate) fn planned_stamp(
    plan: &Plan,
    file_index: usize,
    path: &Path,
) -> Result<FileStamp, ExecError> {
    plan.file_stamps.get(file_index).copied().ok_or_else(|| {
        ExecError::io(
            "reading",
            path,
            io::Error::other("the plan has no stamp for this file (a plan built by hand?)"),
        )
    })
}

/// Every opened source is still the file the plan was made from, unchanged, and no page of a
/// mapped one vanished while it was read.
pub(super) fn check_sources(plan: &Plan, files: &[Option<SourceFile>]) -> Result<(), ExecError> {
    for (i, f) in files.iter().enumerate() {
        let Some(f) = f else { continue };
        // An object's etag was checked on every read: a replaced object failed there.
        let Some(file) = &f.file else { continue };
        let planned = planned_stamp(plan, i, &f.path)?;
        let now = FileStamp::of_file(file).map_err(|e| ExecError::io("reading", &f.path, e))?;
        let change = planned.change_to(&now).or_else(|| {
            f.lost_pages().then_some(Change::Resized {
                from: planned.size,
                to: now.size.min(planned.size.saturating_sub(1)),
            })
        });
        if let Some(change) = change {
            return Err(ExecError::SourceChanged {
                path: f.path.clone(),
                change,
            });
        }
    }
    Ok(())
}

/// Every checkpoint file the plan reads, opened once and shared (pread needs no seeking),
/// indexed by the sources' `file_index`.
pub(super) fn open_sources(
    plan: &Plan,
    root: &Path,
    io: IoMode,
) -> Result<Vec<Option<SourceFile>>, ExecError> {
    let mut files: Vec<Option<SourceFile>> = Vec::new();
    for s in &plan.sources {
        if files.len() <= s.file_index {
            files.resize_with(s.file_index + 1, || None);
        }
        if files[s.file_index].is_none() {
            let path = root.join(&*s.file);
            let planned = planned_stamp(plan, s.file_index, &path)?;
            let f = SourceFile::open(&path, io).map_err(ExecError::Open)?;
            if let Some(file) = &f.file {
                unchanged(&planned, file, &path)?;
            }
            files[s.file_index] = Some(f);
        }
    }
    Ok(files)
}

/// The files a plan reads, once each, in name order.
pub fn source_files(plan: &Plan, root: &Path) -> Vec<PathBuf> {
    let names: std::collections::BTreeSet<&str> = plan.sources.iter().map(|s| &*s.file).collect();
    names.into_iter().map(|f| root.join(f)).collect()
}
