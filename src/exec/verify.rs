//! `--verify`: read every written byte back and compare it with what the plan computes from the
//! checkpoint, so a corrupted or truncated output is caught before it is published.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::jobs::placements_for;
use super::parts::PartFile;
use super::{Control, ExecError, Sink, execute};
use crate::plan::Plan;

struct VerifySink<'a> {
    files: Vec<(PathBuf, File)>,
    parts: &'a [PartFile],
    plan: &'a Plan,
}

impl VerifySink<'_> {
    /// The tensor that holds byte `offset` of part `out`, for messages.
    fn tensor_at(&self, out: usize, offset: u64) -> String {
        let f = &self.parts[out];
        let rank = self.plan.ranks.iter().find(|r| r.rank == f.rank);
        f.tensors
            .iter()
            .filter(|(_, o)| *o <= offset)
            .max_by_key(|(_, o)| *o)
            .and_then(|(i, _)| rank.map(|r| r.tensors[*i].name.clone()))
            .unwrap_or_else(|| "(header)".into())
    }
}

impl Sink for VerifySink<'_> {
    fn put(&self, out: usize, offset: u64, bytes: &[u8]) -> Result<(), ExecError> {
        let (path, f) = &self.files[out];
        let mut got = vec![0u8; bytes.len()];
        f.read_exact_at(&mut got, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                ExecError::Verify {
                    path: path.clone(),
                    message: "the file is shorter than its header says".into(),
                }
            } else {
                ExecError::io("reading back", path, e)
            }
        })?;
        if got != bytes {
            let at = got.iter().zip(bytes).position(|(a, b)| a != b).unwrap_or(0) as u64;
            return Err(ExecError::Mismatch {
                path: path.clone(),
                tensor: self.tensor_at(out, offset + at),
                offset: offset + at,
            });
        }
        Ok(())
    }

    fn starts_zeroed(&self) -> bool {
        false
    }
}

/// Checks that the part files in `dir` hold exactly the plan's bytes: sizes, headers, and every
/// element of every tensor (fills included).
pub(crate) fn verify_parts(
    plan: &Plan,
    root: &Path,
    dir: &Path,
    files: &[PartFile],
    ctl: &Control,
) -> Result<(), ExecError> {
    let mut opened = Vec::with_capacity(files.len());
    for f in files {
        let path = dir.join(&f.name);
        let file = File::open(&path).map_err(|e| ExecError::io("opening", &path, e))?;
        let size = file
            .metadata()
            .map_err(|e| ExecError::io("reading", &path, e))?
            .len();
        if size != f.size {
            return Err(ExecError::Verify {
                path,
                message: format!("{size} bytes, expected {}", f.size),
            });
        }
        opened.push((path, file));
    }
    let sink = VerifySink {
        files: opened,
        parts: files,
        plan,
    };
    for (i, f) in files.iter().enumerate() {
        sink.put(i, 0, &f.header)?;
    }
    execute(plan, root, &placements_for(plan, files), &sink, ctl)
}
