//! `wload plan`: every rank's tensors and where each byte comes from, or every problem.

use std::time::Instant;

use crate::plan::PlanOptions;
use crate::{Error, Opened, Timings, map, mapping, plan};

/// Picks the mapping, maps the checkpoint's names and plans every rank.
pub fn make_plan(opened: &Opened, opts: &PlanOptions) -> Result<plan::Plan, Error> {
    let mapping = mapping::select(opts.mapping.as_deref(), opened.config.architecture())?;
    let mapping = plan::mapping_for(&mapping, &opened.config, opts);
    let mapped = map::map(&mapping, &opened.checkpoint);
    let p = plan::plan_mapped(&mapping, &opened.config, &mapped, opts)?;
    Ok(p)
}

/// The plan as `wload plan` prints it, optionally for one rank.
pub fn plan_report(
    opened: &Opened,
    opts: &PlanOptions,
    rank: Option<u64>,
) -> Result<plan::PlanReport, Error> {
    if opts.tp == 0 {
        return Err(plan::PlanError::BadTp.into());
    }
    if opts.pp == 0 {
        return Err(plan::PlanError::BadPp.into());
    }
    let world = opts.tp.saturating_mul(opts.pp);
    if let Some(r) = rank
        && r >= world
    {
        let pp = if opts.pp > 1 {
            format!(" --pp {}", opts.pp)
        } else {
            String::new()
        };
        return Err(Error::Usage(format!(
            "--rank {r} is out of range for --tp {}{pp} (ranks 0..{})",
            opts.tp,
            world - 1
        )));
    }
    let t = Instant::now();
    let mut p = make_plan(opened, opts)?;
    let timings = Timings {
        plan_s: t.elapsed().as_secs_f64(),
        ..opened.timings
    };
    if let Some(r) = rank {
        p.ranks.retain(|x| x.rank == r);
    }
    Ok(plan::PlanReport {
        schema_version: plan::SCHEMA_VERSION,
        wload_version: env!("CARGO_PKG_VERSION"),
        source: opened.resolved.root.display().to_string(),
        timings,
        plan: p,
    })
}
