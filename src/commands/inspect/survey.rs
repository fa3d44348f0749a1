//! `inspect` of a pre-sharded folder: what it holds per rank and part, what layout it was written
//! for, and whether it is complete. Only headers are read; `load --dry-run` is what plans it.

use std::path::Path;

use serde::Serialize;

use crate::checkpoint::Checkpoint;
use crate::plan::pre_sharded::layout_problems;
use crate::problem::Problem;
use crate::sharded::layers::{self, StageLayers};
use crate::sharded::manifest::Manifest;
use crate::sharded::manifest::ServeCommand;
use crate::sharded::names::{WrittenFor, in_folder, pattern};
use crate::sharded::serve::{serve_command, shell_quote};

/// `inspect` of a pre-sharded folder: per rank and part, the files, their tensors and bytes; what
/// TP, PP and EP they were written for; and whether every file of every rank is there, as the
/// manifest (else the file names) says it should be. Only headers are read.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Survey {
    pub schema_version: u32,
    pub wload_version: &'static str,
    /// Always "pre-sharded": tells this report from a checkpoint's.
    pub kind: &'static str,
    pub source: String,
    /// The rank files' name pattern.
    pub pattern: &'static str,
    pub written_for: WrittenFor,
    /// tp × pp: how many ranks a complete folder has files for.
    pub world_size: u64,
    pub ranks: Vec<SurveyRank>,
    pub filter: Option<String>,
    pub totals: SurveyTotals,
    /// Every rank's parts present (and, with a manifest, every file it lists at its size), and
    /// every header readable.
    pub complete: bool,
    pub problems: Vec<Problem>,
    /// The decoder layers each pipeline stage's files hold (empty without stages).
    pub stages: Vec<StageLayers>,
    /// The run records read (`wload.json`, `wload-ranks-*.json`: one per `--ranks` run).
    pub records: Vec<String>,
    /// The vLLM versions whose parameter names and slicing the files follow, when a record says.
    pub vllm_versions: Option<String>,
    /// `vllm serve` for the folder as wload builds it from the manifest's layout, here and now
    /// ([`serve_command`]); `None` without a manifest, or while the folder is incomplete (vLLM
    /// would fail on it).
    pub serve: Option<ServeCommand>,
    /// `wload load` for the folder, with the flags only the file names can tell otherwise.
    pub check_with: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SurveyRank {
    /// The global rank, `pp_rank * tp + tp_rank`.
    pub rank: u64,
    /// The pipeline stage; `None` for TP-only file names.
    pub pp_rank: Option<u64>,
    pub tp_rank: u64,
    pub files: Vec<SurveyFile>,
    pub tensors: usize,
    pub bytes: u64,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SurveyFile {
    pub file: String,
    pub part: u64,
    pub size: u64,
    /// Tensors in the file (matching the filter, with one); `None` when its header cannot be read.
    pub tensors: Option<usize>,
    /// Their data bytes.
    pub bytes: u64,
    /// Whether the size is the manifest's; `None` when no manifest lists the file.
    pub size_matches_manifest: Option<bool>,
}

#[derive(Debug, Default, Serialize, schemars::JsonSchema)]
pub struct SurveyTotals {
    pub files: usize,
    pub tensors: usize,
    pub bytes: u64,
    pub parameters: u64,
}

/// Surveys the pre-sharded folder `root`; `filter` keeps the tensors whose name matches.
pub(crate) fn survey(root: &Path, filter: Option<&regex::Regex>) -> Survey {
    let files = in_folder(root);
    let runs = crate::sharded::runs::check(root, &files);
    let manifest = runs.manifest;
    let written_for = WrittenFor::of(&files, manifest.as_ref());
    let mut problems = runs.problems;
    problems.extend(layout_problems(&files, &written_for, manifest.as_ref()));
    let mut totals = SurveyTotals::default();
    let mut ranks = Vec::new();
    for (&(pp_rank, tp_rank), parts) in &files {
        let mut rank = SurveyRank {
            // Saturating: hostile names may claim ranks near u64::MAX.
            rank: pp_rank
                .unwrap_or(0)
                .saturating_mul(written_for.tp)
                .saturating_add(tp_rank),
            pp_rank,
            tp_rank,
            files: Vec::new(),
            tensors: 0,
            bytes: 0,
        };
        for (part, name) in parts {
            let f = survey_file(root, *part, name, filter, manifest.as_ref(), &mut problems);
            totals.files += 1;
            if let Some((n, bytes, params)) = f.1 {
                rank.tensors += n;
                rank.bytes += bytes;
                totals.tensors += n;
                totals.bytes += bytes;
                totals.parameters += params;
            }
            rank.files.push(f.0);
        }
        ranks.push(rank);
    }
    ranks.sort_by_key(|r| (r.rank, r.pp_rank, r.tp_rank));
    let stages = layers::of_folder(root, &files);
    let complete = problems.is_empty();
    let quoted = shell_quote(&root.display().to_string());
    Survey {
        schema_version: crate::commands::schema::INSPECT,
        wload_version: env!("CARGO_PKG_VERSION"),
        kind: "pre-sharded",
        source: root.display().to_string(),
        pattern: pattern(&files),
        world_size: written_for.tp.saturating_mul(written_for.pp),
        check_with: match manifest {
            Some(_) => format!("wload load {quoted} --dry-run --read"),
            None => format!(
                "wload load {quoted} {} --dry-run --read",
                written_for.flags()
            ),
        },
        ranks,
        filter: filter.map(|r| r.as_str().to_string()),
        totals,
        complete,
        problems,
        serve: (manifest.as_ref())
            .filter(|_| complete)
            .map(|m| serve_command(root, &files, &written_for, Some(m), &stages)),
        records: manifest
            .as_ref()
            .map(|m| m.records.clone())
            .unwrap_or_default(),
        vllm_versions: manifest.as_ref().and_then(|m| m.vllm_versions.clone()),
        stages,
        written_for,
    }
}

impl Survey {
    /// The survey of `mirror`'s folder said of the store's: its URL where the mirror's path was,
    /// the streamer's serve line, and what to do about missing ranks said for runs that upload.
    pub(crate) fn in_store(mut self, mirror: &crate::resolve::store::mirror::Mirror) -> Survey {
        let local = mirror.dir.display().to_string();
        let to_url = |s: &mut String| *s = s.replace(&local, &mirror.url);
        to_url(&mut self.source);
        self.check_with = self
            .check_with
            .replace(&shell_quote(&local), &shell_quote(&mirror.url));
        for p in &mut self.problems {
            to_url(&mut p.message);
            p.file.iter_mut().for_each(to_url);
            if p.message.contains("no files for rank") {
                p.fix = Some(
                    "run `wload shard … --ranks` for the missing ranks into this prefix (or wait \
                     for the runs still uploading): the last one to finish writes wload.json"
                        .into(),
                );
            }
        }
        self.serve = self.serve.map(|s| s.in_store(&mirror.url));
        self
    }
}

/// One part file: its row, and (tensors, bytes, parameters) when its header could be read.
fn survey_file(
    root: &Path,
    part: u64,
    name: &str,
    filter: Option<&regex::Regex>,
    manifest: Option<&Manifest>,
    problems: &mut Vec<Problem>,
) -> (SurveyFile, Option<(usize, u64, u64)>) {
    let size = std::fs::metadata(root.join(name)).map_or(0, |m| m.len());
    let listed = manifest.and_then(|m| m.files.iter().find(|f| f.name == name));
    if let (Some(m), Some(l)) = (manifest, listed)
        && l.size != size
    {
        problems.push(Problem {
            message: format!(
                "{name}: {size} bytes, but {} records {}: the file is truncated or was replaced",
                m.record_names(),
                l.size
            ),
            fix: Some("copy the file again, or re-shard".into()),
            file: Some(name.to_string()),
            ..Default::default()
        });
    }
    let counted = match Checkpoint::open(root, &[name.to_string()]) {
        Ok(ck) => {
            let kept = ck.files[0]
                .tensors
                .iter()
                .filter(|t| filter.is_none_or(|re| re.is_match(&t.name)));
            let (mut n, mut bytes, mut params) = (0, 0, 0);
            for t in kept {
                n += 1;
                bytes += t.len;
                params += t.numel();
            }
            Some((n, bytes, params))
        }
        Err(errors) => {
            problems.extend(errors.iter().map(|e| Problem {
                fix: Some("copy the file again, or re-shard".into()),
                ..Problem::from(e)
            }));
            None
        }
    };
    let row = SurveyFile {
        file: name.to_string(),
        part,
        size,
        tensors: counted.map(|c| c.0),
        bytes: counted.map_or(0, |c| c.1),
        size_matches_manifest: listed.map(|l| l.size == size),
    };
    (row, counted)
}
