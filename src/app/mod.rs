//! The `wload` command: parse the command line, run the subcommand through the library, turn
//! the outcome into an exit status. Here in the library, not in the binary, so that the one
//! command has two doors: `src/bin/wload/main.rs` (cargo's binary) and the Python package's
//! `wload` console script (`_wload.main`), both a call of [`run`]. Nothing else lives here: the
//! args → options conversions are in [`options`], everything written to stdout and stderr in
//! [`emit`].

use std::ffi::OsString;
use std::io::{self, BufWriter, Write};
use std::time::Instant;

mod alloc;
mod bars;
mod emit;
mod interrupt;
mod man;
mod options;

use crate::cli::{Cli, Command, InspectArgs, LoadArgs, PlanArgs, ShardArgs, SizesArgs};
use crate::commands::error::Error;
use crate::escape::Esc;
use crate::exit::ExitStatus;
use crate::resolve::ResolveError;

use emit::{Human, emit, json_if, say};
use options::{Globals, source_options};

/// Runs the command line `args` (the program's name first) to its end and returns the exit
/// status, with everything written to stdout and stderr. Once per process: it may install the
/// process's SIGINT, SIGTERM and SIGHUP handlers ([`interrupt`]) and set the allocator's
/// parameters ([`alloc`]), and a signal's second arrival ends the process.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let status = run_args(&args);
    // The console script returns to Python, which exits without flushing Rust's stdout: a last
    // line without its newline would stay in the buffer. stderr is not buffered.
    let _ = io::stdout().flush();
    status
}

fn run_args(args: &[OsString]) -> u8 {
    let cli = match Cli::parse_args(args) {
        Ok(cli) => cli,
        // Help and version on stdout (exit 0); a usage error on stderr (exit 2).
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return 0;
        }
        Err(e) => {
            emit::usage_error(&e, args.get(1..).unwrap_or_default());
            return ExitStatus::Usage as u8;
        }
    };
    if matches!(
        cli.command,
        Command::Inspect(_) | Command::Plan(_) | Command::Sizes(_)
    ) {
        alloc::keep_freed_memory();
    }
    let json = cli.command.json();
    match run_command(cli) {
        Ok(()) => 0,
        Err(e) if e.is_broken_pipe() => 0,
        Err(e) => {
            let status = match e.exit_status() {
                ExitStatus::Interrupted => interrupt::exit_status(),
                status => status as u8,
            };
            emit::failure(&e, status, json);
            status
        }
    }
}

fn run_command(cli: Cli) -> Result<(), Error> {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let g = Globals::from(&cli);
    match cli.command {
        Command::Inspect(args) => inspect(&args, g, &mut out)?,
        Command::Plan(args) => plan(&args, g, &mut out)?,
        Command::Shard(args) => shard(&args, g, &mut out)?,
        Command::Load(args) => load(&args, g, &mut out)?,
        Command::Sizes(args) => sizes(&args, g, &mut out)?,
        Command::Completions { shell } => emit::completions(shell, &mut out)?,
        Command::Man { command } => man::man(command.as_deref(), &mut out)?,
    }
    out.flush().map_err(Error::Output)
}

fn inspect(args: &InspectArgs, g: Globals, out: &mut dyn Write) -> Result<(), Error> {
    let filter = args.filter.as_deref();
    if let Some(other) = crate::commands::inspect::other_source(&args.source.source, filter)? {
        let human: Human = &|w| crate::report::write_other_source(w, &other, g.verbose);
        // An incomplete pre-sharded folder: reported whole, then refused as `load` would be.
        if let crate::commands::inspect::OtherSource::PreSharded(s) = &other
            && !s.complete
        {
            let e = crate::plan::PlanError::Invalid(s.problems.clone());
            return emit::refused(out, args.json, &other, human, e.into());
        }
        return emit(out, json_if(args.json, None), &other, Some(human));
    }
    let sopts = headers_only(source_options(&args.source, g.quiet)?);
    let opened = match crate::open::open(&sopts, crate::open::Want::Checkpoint) {
        // A local folder without its config: listed all the same, then refused (exit 3).
        Err(crate::open::OpenError::Resolve(e @ ResolveError::NoConfig { .. }))
            if sopts.source.is_dir() =>
        {
            return inspect_config_less(args, g, &sopts, e, out);
        }
        r => r?,
    };
    emit::hub_fetched(opened.fetched().as_ref(), g.quiet);
    let mut report =
        crate::commands::inspect::inspect_mapped(&opened, filter, args.mapping.as_deref())?;
    // An architecture plan refuses: everything printed, then plan's error and its exit status.
    let refusal = report.support.refusal.take();
    let human: Human = &|w| crate::report::write_inspection(w, &report, g.verbose);
    if let Some(e) = refusal {
        return emit::refused(out, args.json, &report, human, e);
    }
    emit(out, json_if(args.json, None), &report, Some(human))?;
    out.flush().map_err(Error::Output)?;
    // A large checkpoint is hundreds of thousands of small allocations (names, shapes, rows);
    // freeing them one by one takes tens of milliseconds just before the process exits and the
    // OS reclaims everything anyway. Output is flushed above; nothing here has a destructor with
    // an effect outside the process.
    std::mem::forget(report);
    std::mem::forget(opened);
    Ok(())
}

/// `inspect` of a folder without its config: its files and tensors, then `refusal`.
fn inspect_config_less(
    args: &InspectArgs,
    g: Globals,
    sopts: &crate::open::SourceOptions,
    refusal: ResolveError,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let (resolved, checkpoint) =
        crate::commands::inspect::config_less::open(&sopts.source, sopts.load_format)?;
    let note = refusal.to_string();
    let report = crate::commands::inspect::config_less::config_less(
        &resolved,
        &checkpoint,
        args.filter.as_deref(),
        note,
    )?;
    let human: Human = &|w| crate::report::write_config_less(w, &report, g.verbose);
    emit::refused(out, args.json, &report, human, refusal.into())
}

fn plan(args: &PlanArgs, g: Globals, out: &mut dyn Write) -> Result<(), Error> {
    let opened = crate::open::open(
        &headers_only(source_options(&args.source, g.quiet)?),
        crate::open::Want::Checkpoint,
    )?;
    emit::hub_fetched(opened.fetched().as_ref(), g.quiet);
    let opts = options::plan_options(&args.parallel);
    let report = crate::commands::plan::plan_report(&opened, &opts, args.rank)?;
    emit::warnings(&report.plan.warnings, g.quiet);
    let human: Human = &|w| crate::report::write_plan(w, &report, g.verbose, g.quiet);
    emit(out, json_if(args.json, None), &report, Some(human))
}

fn sizes(args: &SizesArgs, g: Globals, out: &mut dyn Write) -> Result<(), Error> {
    let opened = crate::open::open(
        &headers_only(source_options(&args.source, g.quiet)?),
        crate::open::Want::Checkpoint,
    )?;
    emit::hub_fetched(opened.fetched().as_ref(), g.quiet);
    let report = crate::commands::plan::sizes(&opened, &options::sizes_options(args))?;
    emit::warnings(&report.warnings, g.quiet);
    let human: Human = &|w| crate::report::write_sizes(w, &report, g.quiet);
    // As `plan` would answer every layout: refused (exit 3), with the flag that helps if any.
    if let Some(e) = report.refusal() {
        return emit::refused(out, args.json, &report, human, e.into());
    }
    emit(out, json_if(args.json, None), &report, Some(human))
}

/// `inspect`, `plan` and `sizes` read no tensor data: of a hub repo, only the headers.
fn headers_only(sopts: crate::open::SourceOptions) -> crate::open::SourceOptions {
    crate::open::SourceOptions {
        headers_only: true,
        ..sopts
    }
}

fn shard(args: &ShardArgs, g: Globals, out: &mut dyn Write) -> Result<(), Error> {
    let mut sopts = source_options(&args.source, g.quiet)?;
    // The one command that copies the side files, so the one that downloads them.
    sopts.side_files = true;
    let mut opened = crate::open::open(&sopts, crate::open::Want::Checkpoint)?;
    emit::hub_fetched(opened.fetched().as_ref(), g.quiet);
    // OUT and --ranks are checked before planning, which may take a while on a large model.
    let world = options::world(&args.parallel);
    let opts = options::shard_options(args, world)?;
    crate::commands::shard::precheck(&opts, world, &opened.resolved.root)?;
    let t = Instant::now();
    let plan =
        crate::commands::pipeline::make_plan(&opened, &options::plan_options(&args.parallel))?;
    opened.timings.plan_s = t.elapsed().as_secs_f64();
    // From here on a signal stops the run cleanly: nothing is published, the staging folder goes.
    interrupt::install();
    let bar = |total| bars::labelled_bar(total, g.quiet, "writing");
    let report = crate::commands::shard::shard(&opened, plan, &opts, interrupt::flag(), &bar)?;
    if !g.quiet {
        emit::shard_notes(&report);
    } else {
        // `-q` prints the serve line alone: a script must still learn that it is not yet true.
        emit::partial_run_warning(&report);
    }
    let detail = match (g.quiet, g.verbose) {
        (true, _) => crate::report::Detail::Quiet,
        (false, true) => crate::report::Detail::Verbose,
        (false, false) => crate::report::Detail::Normal,
    };
    let human: Human = &|w| crate::report::write_shard(w, &report, detail);
    let json = json_if(args.json, Some(crate::commands::schema::SHARD));
    emit(out, json, &report, Some(human))
}

fn load(args: &LoadArgs, g: Globals, out: &mut dyn Write) -> Result<(), Error> {
    let t_all = std::time::Instant::now();
    let mut source = source_options(&args.source, g.quiet)?;
    let lopts = options::load_options(args);
    let planned = crate::commands::load::plan(crate::commands::load::Request {
        flags: options::load_flags(args, source.hf_overrides.take()),
        source,
        ranks: crate::commands::load::Ranks::ThisProcess(lopts.ranks.clone()),
        // A dry run without --read reads no tensor data: of a hub repo, only the headers.
        headers_only: lopts.dry_run && !lopts.read,
    })?;
    // Called once planning is done and the transfer starts: from then on a signal stops the
    // transfer cleanly.
    let start = |total| {
        interrupt::install();
        bars::labelled_bar(total, g.quiet, "loading")
    };
    let report = crate::commands::load::load(&planned, &lopts, interrupt::flag(), &start, t_all)?;
    emit::hub_fetched(report.hub_fetched.as_ref(), g.quiet);
    // After the run: an error, when there is one, comes first on stderr.
    if let (Some(note), false) = (&planned.note, g.quiet) {
        say(format_args!("note: {}", Esc(note)));
    }
    let json = json_if(args.json, Some(crate::commands::schema::LOAD));
    let human: Human = &|w| crate::report::write_load(w, &report, g.verbose, g.quiet);
    emit(out, json, &report, Some(human))
}
