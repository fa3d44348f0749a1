//! The `wload` binary: parse the command line, run the subcommand through the library, turn
//! the outcome into an exit status. Nothing else lives here: the args → options conversions are
//! in [`options`], everything written to stdout and stderr in [`emit`].

use std::io::{self, BufWriter, Write};
use std::process::ExitCode;
use std::time::Instant;

mod alloc;
mod bars;
mod emit;
mod interrupt;
mod man;
mod options;

use wload::Esc;
use wload::ResolveError;
use wload::cli::{Cli, Command, InspectArgs, LoadArgs, PlanArgs, ShardArgs, SizesArgs};
use wload::{Error, ExitStatus};

use emit::{Human, emit, json_if, say};
use options::{Globals, source_options};

fn main() -> ExitCode {
    let cli = match Cli::parse_args(std::env::args_os()) {
        Ok(cli) => cli,
        // Help and version on stdout (exit 0); a usage error on stderr (exit 2).
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            emit::usage_error(&e);
            return ExitCode::from(ExitStatus::Usage as u8);
        }
    };
    if matches!(
        cli.command,
        Command::Inspect(_) | Command::Plan(_) | Command::Sizes(_)
    ) {
        alloc::keep_freed_memory();
    }
    let json = cli.command.json();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            let status = match e.exit_status() {
                ExitStatus::Interrupted => interrupt::exit_status(),
                status => status as u8,
            };
            emit::failure(&e, status, json);
            ExitCode::from(status)
        }
    }
}

fn run(cli: Cli) -> Result<(), Error> {
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
    if let Some(other) = wload::other_source(&args.source.source, filter)? {
        let human: Human = &|w| wload::report::write_other_source(w, &other, g.verbose);
        // An incomplete pre-sharded folder: reported whole, then refused as `load` would be.
        if let wload::OtherSource::PreSharded(s) = &other
            && !s.complete
        {
            let e = wload::PlanError::Invalid(s.problems.clone());
            return emit::refused(out, args.json, &other, human, e.into());
        }
        return emit(out, json_if(args.json, None), &other, Some(human));
    }
    let sopts = headers_only(source_options(&args.source, g.quiet)?);
    let opened = match wload::open(&sopts, wload::Want::Checkpoint) {
        // A local folder without its config: listed all the same, then refused (exit 3).
        Err(wload::OpenError::Resolve(e @ ResolveError::NoConfig { .. }))
            if sopts.source.is_dir() =>
        {
            return inspect_config_less(args, g, &sopts, e, out);
        }
        r => r?,
    };
    emit::hub_fetched(opened.fetched().as_ref(), g.quiet);
    let mut report = wload::inspect_mapped(&opened, filter, args.mapping.as_deref())?;
    // An architecture plan refuses: everything printed, then plan's error and its exit status.
    let refusal = report.support.refusal.take();
    let human: Human = &|w| wload::report::write_inspection(w, &report, g.verbose);
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
    sopts: &wload::SourceOptions,
    refusal: ResolveError,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let (resolved, checkpoint) = wload::open_config_less(&sopts.source, sopts.load_format)?;
    let note = refusal.to_string();
    let report = wload::inspect_config_less(&resolved, &checkpoint, args.filter.as_deref(), note)?;
    let human: Human = &|w| wload::report::write_config_less(w, &report, g.verbose);
    emit::refused(out, args.json, &report, human, refusal.into())
}

fn plan(args: &PlanArgs, g: Globals, out: &mut dyn Write) -> Result<(), Error> {
    let opened = wload::open(
        &headers_only(source_options(&args.source, g.quiet)?),
        wload::Want::Checkpoint,
    )?;
    emit::hub_fetched(opened.fetched().as_ref(), g.quiet);
    let opts = options::plan_options(&args.parallel);
    let report = wload::plan_report(&opened, &opts, args.rank)?;
    let human: Human = &|w| wload::report::write_plan(w, &report, g.verbose, g.quiet);
    emit(out, json_if(args.json, None), &report, Some(human))
}

fn sizes(args: &SizesArgs, g: Globals, out: &mut dyn Write) -> Result<(), Error> {
    let opened = wload::open(
        &headers_only(source_options(&args.source, g.quiet)?),
        wload::Want::Checkpoint,
    )?;
    emit::hub_fetched(opened.fetched().as_ref(), g.quiet);
    let report = wload::sizes(&opened, &options::sizes_options(args))?;
    let human: Human = &|w| wload::report::write_sizes(w, &report, g.quiet);
    // As `plan` would answer every layout: refused (exit 3), with the flag that helps if any.
    if let Some(e) = report.refusal() {
        return emit::refused(out, args.json, &report, human, e.into());
    }
    emit(out, json_if(args.json, None), &report, Some(human))
}

/// `inspect`, `plan` and `sizes` read no tensor data: of a hub repo, only the headers.
fn headers_only(sopts: wload::SourceOptions) -> wload::SourceOptions {
    wload::SourceOptions {
        headers_only: true,
        ..sopts
    }
}

fn shard(args: &ShardArgs, g: Globals, out: &mut dyn Write) -> Result<(), Error> {
    let mut sopts = source_options(&args.source, g.quiet)?;
    // The one command that copies the side files, so the one that downloads them.
    sopts.side_files = true;
    let mut opened = wload::open(&sopts, wload::Want::Checkpoint)?;
    emit::hub_fetched(opened.fetched().as_ref(), g.quiet);
    // OUT and --ranks are checked before planning, which may take a while on a large model.
    let world = options::world(&args.parallel);
    let opts = options::shard_options(args, world)?;
    wload::precheck(&opts, world, &opened.resolved.root)?;
    let t = Instant::now();
    let plan = wload::make_plan(&opened, &options::plan_options(&args.parallel))?;
    opened.timings.plan_s = t.elapsed().as_secs_f64();
    // From here on a signal stops the run cleanly: nothing is published, the staging folder goes.
    interrupt::install();
    let bar = |total| bars::labelled_bar(total, g.quiet, "writing");
    let report = wload::shard(&opened, plan, &opts, interrupt::flag(), &bar)?;
    if !g.quiet {
        emit::shard_notes(&report);
    } else {
        // `-q` prints the serve line alone: a script must still learn that it is not yet true.
        emit::partial_run_warning(&report);
    }
    let detail = match (g.quiet, g.verbose) {
        (true, _) => wload::report::Detail::Quiet,
        (false, true) => wload::report::Detail::Verbose,
        (false, false) => wload::report::Detail::Normal,
    };
    let human: Human = &|w| wload::report::write_shard(w, &report, detail);
    let json = json_if(args.json, Some(wload::schema::SHARD));
    emit(out, json, &report, Some(human))
}

fn load(args: &LoadArgs, g: Globals, out: &mut dyn Write) -> Result<(), Error> {
    let t_all = std::time::Instant::now();
    let mut source = source_options(&args.source, g.quiet)?;
    let lopts = options::load_options(args);
    let planned = wload::plan(wload::Request {
        flags: options::load_flags(args, source.hf_overrides.take()),
        source,
        ranks: wload::Ranks::ThisProcess(lopts.ranks.clone()),
        // A dry run without --read reads no tensor data: of a hub repo, only the headers.
        headers_only: lopts.dry_run && !lopts.read,
    })?;
    // Called once planning is done and the transfer starts: from then on a signal stops the
    // transfer cleanly.
    let start = |total| {
        interrupt::install();
        bars::labelled_bar(total, g.quiet, "loading")
    };
    let report = wload::load(&planned, &lopts, interrupt::flag(), &start, t_all)?;
    emit::hub_fetched(report.hub_fetched.as_ref(), g.quiet);
    // After the run: an error, when there is one, comes first on stderr.
    if let (Some(note), false) = (&planned.note, g.quiet) {
        say(format_args!("note: {}", Esc(note)));
    }
    let json = json_if(args.json, Some(wload::schema::LOAD));
    let human: Human = &|w| wload::report::write_load(w, &report, g.verbose, g.quiet);
    emit(out, json, &report, Some(human))
}
