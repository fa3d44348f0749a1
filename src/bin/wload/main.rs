//! The `wload` binary: parse the command line, call the library, turn errors into messages and
//! exit statuses. Nothing else lives here.

use std::io::{self, BufWriter, Write};
use std::process::ExitCode;
use std::time::Instant;

mod bars;
mod interrupt;

use clap::{CommandFactory, Parser};

use wload::cli::{
    Cli, Command, InspectArgs, LoadArgs, ParallelArgs, PlanArgs, ShardArgs, SourceArgs,
};
use wload::{Error, ExitStatus, SourceOptions};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                ExitStatus::Usage as u8
            } else {
                0
            });
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            // stderr may be closed or full too; there is nowhere left to say so.
            let _ = writeln!(io::stderr(), "error: {e}");
            ExitCode::from(match e.exit_status() {
                ExitStatus::Interrupted => interrupt::exit_status(),
                status => status as u8,
            })
        }
    }
}

fn run(cli: Cli) -> Result<(), Error> {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let g = Globals {
        verbose: cli.verbose > 0,
        quiet: cli.quiet,
    };
    match cli.command {
        Command::Inspect(args) => inspect(&args, g, &mut out)?,
        Command::Plan(args) => plan(&args, g, &mut out)?,
        Command::Shard(args) => shard(&args, g, &mut out)?,
        Command::Load(args) => load(&args, g, &mut out)?,
        Command::Completions { shell } => {
            // `generate` panics on a write error: render to memory, then write and check.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "wload", &mut script);
            out.write_all(&script).map_err(Error::Output)?;
        }
        Command::Man => {
            clap_mangen::Man::new(Cli::command())
                .render(&mut out)
                .map_err(Error::Output)?;
        }
    }
    out.flush().map_err(Error::Output)
}

/// The flags every subcommand takes.
#[derive(Clone, Copy)]
struct Globals {
    verbose: bool,
    quiet: bool,
}

/// Writes a report for people (a table, a summary).
type Human<'a> = &'a dyn Fn(&mut dyn Write) -> io::Result<()>;

/// One JSON document with `--json`, else the human table (`human`, unless it is `None`).
fn emit<T: serde::Serialize>(
    out: &mut dyn Write,
    json: bool,
    report: &T,
    human: Option<Human>,
) -> Result<(), Error> {
    if json {
        serde_json::to_writer_pretty(&mut *out, report).map_err(|e| Error::Output(e.into()))?;
        writeln!(out).map_err(Error::Output)
    } else if let Some(h) = human {
        h(out).map_err(Error::Output)
    } else {
        Ok(())
    }
}

fn inspect(
    args: &InspectArgs,
    g: Globals,
    out: &mut BufWriter<io::StdoutLock>,
) -> Result<(), Error> {
    let opened = wload::open(&source_options(&args.source, g.quiet)?)?;
    let report = wload::inspect::inspect(&opened, args.filter.as_deref())?;
    emit(
        out,
        args.json,
        &report,
        Some(&|w| wload::report::write_inspection(w, &report, g.verbose)),
    )?;
    out.flush().map_err(Error::Output)?;
    // A large checkpoint is hundreds of thousands of small allocations (names, shapes, rows);
    // freeing them one by one takes tens of milliseconds just before the process exits and the
    // OS reclaims everything anyway. Output is flushed above; nothing here has a destructor with
    // an effect outside the process.
    std::mem::forget(report);
    std::mem::forget(opened);
    Ok(())
}

fn plan(args: &PlanArgs, g: Globals, out: &mut dyn Write) -> Result<(), Error> {
    let opened = wload::open(&source_options(&args.source, g.quiet)?)?;
    let report = wload::plan_report(&opened, &plan_options(&args.parallel), args.rank)
        .map_err(|e| wload::report::json_problems(out, args.json, e))?;
    emit(
        out,
        args.json,
        &report,
        Some(&|w| wload::report::write_plan(w, &report, g.verbose)),
    )
}

fn shard(args: &ShardArgs, g: Globals, out: &mut dyn Write) -> Result<(), Error> {
    let mut opened = wload::open(&source_options(&args.source, g.quiet)?)?;
    let opts = wload::shard::ShardOptions {
        out: args.out.clone(),
        max_part_size: args.max_part_size,
        ranks: args.ranks.clone(),
        force: args.force,
        verify: args.verify,
        io: args.io.io,
        cold: args.io.cold,
    };
    // OUT and --ranks are checked before planning, which may take a while on a large model.
    wload::shard::precheck(
        &opts,
        wload::ranks::World {
            tp: args.parallel.tp,
            pp: args.parallel.pp,
        },
        &opened.resolved.root,
    )?;
    let t = Instant::now();
    let plan = wload::make_plan(&opened, &plan_options(&args.parallel))
        .map_err(|e| wload::report::json_problems(out, args.json, e))?;
    opened.timings.plan_s = t.elapsed().as_secs_f64();
    // From here on a signal stops the run cleanly: nothing is published, the staging folder goes.
    interrupt::install();
    let report = wload::shard::shard(&opened, plan, &opts, interrupt::flag(), &|total| {
        bars::bar(total, g.quiet)
    })?;
    for s in &report.removed_leftovers {
        let _ = writeln!(
            io::stderr(),
            "note: removed {}, left by wload process {} (no longer running)",
            s.path.display(),
            s.pid
        );
    }
    let human: Human = &|w| wload::report::write_shard(w, &report);
    emit(out, args.json, &report, (!g.quiet).then_some(human))
}

fn load(args: &LoadArgs, g: Globals, out: &mut dyn Write) -> Result<(), Error> {
    let lopts = wload::load::LoadOptions {
        device: args.device,
        dry_run: args.dry_run,
        read: args.read,
        ranks: args.ranks.clone(),
        check: args.check,
        checksums: args.checksums,
        io: args.io.io,
        cold: args.io.cold,
        repeat: args.repeat,
    };
    let report = wload::load::load(
        &source_options(&args.source, g.quiet)?,
        &plan_options(&args.parallel),
        &lopts,
        interrupt::flag(),
        // Called once planning is done and the transfer starts: from then on a signal stops the
        // transfer cleanly.
        &|total| {
            interrupt::install();
            bars::bar(total, g.quiet)
        },
    )
    .map_err(|e| wload::report::json_problems(out, args.json, e))?;
    emit(
        out,
        args.json,
        &report,
        Some(&|w| wload::report::write_load(w, &report, g.quiet)),
    )
}

fn source_options(a: &SourceArgs, quiet: bool) -> Result<SourceOptions, Error> {
    Ok(SourceOptions {
        source: a.source.clone(),
        load_format: a.load_format,
        config_format: a.config_format,
        hf_overrides: a
            .hf_overrides
            .as_deref()
            .map(wload::config::parse_overrides)
            .transpose()?,
        revision: Some(a.revision.clone()),
        download_dir: a.download_dir.clone(),
        download_progress: bars::download_bars(quiet),
    })
}

fn plan_options(a: &ParallelArgs) -> wload::PlanOptions {
    wload::PlanOptions {
        tp: a.tp,
        pp: a.pp,
        // vLLM reads it from its environment (envs.VLLM_PP_LAYER_PARTITION); so does wload.
        pp_partition: std::env::var("VLLM_PP_LAYER_PARTITION").ok(),
        expert_parallel: a.enable_expert_parallel,
        dtype: a.dtype,
        mapping: a.mapping.clone(),
        shapes_only: false,
    }
}
