//! What a load runs from, made one way for every caller (`wload load`, the Python package's
//! `wload.plan`, and so the vLLM plugin): a [`Request`] — the source and the load flags as given —
//! completed from the folder's run records, opened, checked and planned into a [`Planned`].

use std::path::Path;
use std::time::Instant;

use super::InputKind;
use super::settings::{LoadFlags, load_settings};
use crate::commands::error::Error;
use crate::commands::error::load::LoadError;
use crate::open::{Opened, SourceOptions, Want};
use crate::plan::Plan;
use crate::ranks::{self, RankList};

/// A load as asked for: SOURCE with its options, the flags as given, and whose ranks.
#[derive(Debug, Clone)]
pub struct Request {
    pub source: SourceOptions,
    pub flags: LoadFlags,
    pub ranks: Ranks,
    /// Read no tensor data: of a hub repo only the headers (a dry run without `--read`).
    pub headers_only: bool,
}

/// Which ranks of the plan are kept.
#[derive(Debug, Clone)]
pub enum Ranks {
    /// Every rank (the Python package: the caller picks one per `Plan.load`).
    All,
    /// This process's: those given (`--ranks`), else the launcher's environment's, else all.
    ThisProcess(Option<RankList>),
}

/// What each kept rank must hold, and where it comes from.
#[derive(Debug)]
pub struct Planned {
    pub opened: Opened,
    /// The plan, narrowed to the kept ranks.
    pub plan: Plan,
    pub kind: InputKind,
    /// The local device ordinal of the first kept rank.
    pub local_base: usize,
    pub warnings: Vec<String>,
    /// What was taken from the folder's run records, one line for the user.
    pub note: Option<String>,
}

impl Planned {
    pub fn root(&self) -> &Path {
        &self.opened.resolved.root
    }

    /// The bytes of every kept rank.
    pub fn bytes(&self) -> u64 {
        self.plan.ranks.iter().map(|r| r.bytes).sum()
    }
}

/// Completes the flags from SOURCE's run records, opens SOURCE, checks that its data can be
/// read (unless `headers_only`), plans (a checkpoint, or a pre-sharded folder copied whole) and
/// keeps the requested ranks — only after planning, which refuses a `--tp` that does not fit the
/// model, so no rank list is built for an absurd one.
pub fn plan(req: Request) -> Result<Planned, Error> {
    let settings = load_settings(&req.source.source, &req.flags)?;
    let sopts = SourceOptions {
        config_format: settings.config_format,
        hf_overrides: settings.hf_overrides,
        headers_only: req.headers_only,
        ..req.source
    };
    let mut opened = crate::open::open(&sopts, Want::Detect)?;
    if !req.headers_only {
        (opened.checkpoint.data_readable()).map_err(|e| Error::Headers(vec![e]))?;
    }
    let given = match &req.ranks {
        Ranks::All => None,
        Ranks::ThisProcess(r) => r.as_ref(),
    };
    let mut warnings = Vec::new();
    let t = Instant::now();
    let (mut plan, kind) = super::prepare(
        &opened,
        &opened.rank_files,
        &settings.plan,
        given,
        &mut warnings,
    )?;
    opened.timings.plan_s = t.elapsed().as_secs_f64();
    let local_base = match &req.ranks {
        Ranks::All => 0,
        Ranks::ThisProcess(r) => {
            let (kept, base) = ranks::select(plan.world(), r.as_ref()).map_err(LoadError::from)?;
            if kept.len() < plan.ranks.len() {
                // While every rank is here: a run of some reads what the others read too
                // through the page cache (`exec::shared`).
                plan.readers = crate::exec::shared::count_readers(&plan);
            }
            plan.ranks.retain(|r| kept.contains(&r.rank));
            base
        }
    };
    Ok(Planned {
        opened,
        plan,
        kind,
        local_base,
        warnings,
        note: settings.note,
    })
}
