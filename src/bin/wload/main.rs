//! The `wload` binary: parse the command line, call the library, turn errors into messages and
//! exit statuses. Nothing else lives here.
//!
//! Every text for people leaves through [`wload::escape::Terminal`]: the human reports (in
//! [`emit`]) and everything on stderr ([`say`]), so that no control character of a name, a path
//! or a manifest reaches the terminal raw; `--json` documents are written as serde writes them.

use std::io::{self, BufWriter, Write};
use std::process::ExitCode;
use std::time::Instant;

mod bars;
mod interrupt;

use clap::{CommandFactory, Parser};

use wload::cli::{
    Cli, Command, InspectArgs, LoadArgs, ParallelArgs, PlanArgs, ShardArgs, SizesArgs, SourceArgs,
};
use wload::escape::{Esc, Terminal};
use wload::{Error, ExitStatus, SourceOptions};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return refused_command_line(&e),
    };
    if matches!(
        cli.command,
        Command::Inspect(_) | Command::Plan(_) | Command::Sizes(_)
    ) {
        keep_freed_memory();
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
            // A failed write to stdout leaves nowhere to put a document.
            if json && !matches!(e, Error::Output(_)) {
                print_json(&wload::report::json::failure(&e, status));
            }
            say(format_args!("error: {}", e.for_terminal()));
            ExitCode::from(status)
        }
    }
}

/// clap's verdict on the command line: help and version on stdout (exit 0), a usage error on
/// stderr (exit 2), and then with `--json` anywhere on the line also its JSON document, since
/// the pipeline that passed the flag reads stdout.
fn refused_command_line(e: &clap::Error) -> ExitCode {
    if !e.use_stderr() {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    if json_requested(std::env::args_os().skip(1)) {
        print_json(&wload::report::json::usage_failure(&e.render().to_string()));
    }
    match escaped_usage_error(std::env::args_os().skip(1)) {
        Some(text) => say(format_args!("{}", text.trim_end())),
        None => {
            let _ = e.print();
        }
    }
    ExitCode::from(ExitStatus::Usage as u8)
}

/// clap's message for the command line with every argument escaped, when one has a control
/// character in it (a file name passed by a script, say); `None` otherwise, for clap to print in
/// colour. clap quotes the argument it refuses, after stripping only some controls (ESC
/// sequences, not CR, C1 or a newline): parsing the escaped arguments again gives the same
/// refusal, quoting the escaped text, so that nothing in it can start a line.
fn escaped_usage_error(args: impl Iterator<Item = std::ffi::OsString>) -> Option<String> {
    let args: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    if !args
        .iter()
        .any(|a| a.chars().any(wload::escape::is_control))
    {
        return None;
    }
    let escaped = args.iter().map(|a| wload::escape::escape(a).into_owned());
    let program = std::iter::once("wload".to_string());
    match Cli::try_parse_from(program.chain(escaped)) {
        Err(e) => Some(e.render().to_string()),
        // Escaping made the line acceptable (it never should): say that it was refused.
        Ok(_) => Some(
            "error: the command line was refused, and one of its arguments has control characters in it"
                .into(),
        ),
    }
}

/// One line on stderr for people, its control characters escaped ([`Terminal`]). stderr may be
/// closed or full; there is nowhere left to say so.
fn say(line: std::fmt::Arguments) {
    let mut t = Terminal::new(io::stderr().lock());
    let _ = writeln!(t, "{line}").and_then(|()| t.flush());
}

/// Whether `--json` is among the options (not after `--`, where everything is a value).
fn json_requested(args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    args.take_while(|a| a != "--").any(|a| a == "--json")
}

/// One document on stdout, if stdout takes it: the exit status says the rest.
fn print_json<T: serde::Serialize>(doc: &T) {
    let mut out = io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, doc)
        .map_err(io::Error::from)
        .and_then(|()| writeln!(out))
        .and_then(|()| out.flush());
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
        Command::Sizes(args) => sizes(&args, g, &mut out)?,
        Command::Completions { shell } => {
            // `generate` panics on a write error: render to memory, then write and check.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "wload", &mut script);
            out.write_all(&script).map_err(Error::Output)?;
        }
        Command::Man { command } => man_page(command.as_deref(), &mut out)?,
    }
    out.flush().map_err(Error::Output)
}

/// wload(1), or a subcommand's page: wload-inspect(1) and so on, the names wload(1) refers to.
fn man_page(name: Option<&str>, out: &mut dyn Write) -> Result<(), Error> {
    let mut cli = Cli::command();
    // Builds the subcommands' names (wload-inspect, "wload inspect") and global flags.
    cli.build();
    let page = match name {
        None => cli,
        Some(name) => {
            let pages = || {
                let visible = cli.get_subcommands().filter(|c| !c.is_hide_set());
                visible.map(|c| c.get_name()).collect::<Vec<_>>().join(", ")
            };
            let sub = cli.find_subcommand(name).filter(|c| !c.is_hide_set());
            sub.cloned().ok_or_else(|| {
                Error::Usage(format!(
                    "man: no page for '{name}'; there are pages for {}",
                    pages()
                ))
            })?
        }
    };
    // The footer names the program and version on every page, not the subcommand's name.
    clap_mangen::Man::new(page)
        .source(format!("wload {}", env!("CARGO_PKG_VERSION")))
        .render(out)
        .map_err(Error::Output)
}

/// The flags every subcommand takes.
#[derive(Clone, Copy)]
struct Globals {
    verbose: bool,
    quiet: bool,
}

/// Writes a report for people (a table, a summary).
type Human<'a> = &'a dyn Fn(&mut dyn Write) -> io::Result<()>;

/// One JSON document with `--json` (with `"ok": true`, and `schema_version` for a report without
/// its own), else the human table (`human`, unless it is `None`).
fn emit<T: serde::Serialize>(
    out: &mut dyn Write,
    json: Option<Json>,
    report: &T,
    human: Option<Human>,
) -> Result<(), Error> {
    if let Some(Json(schema_version)) = json {
        let doc = wload::report::json::success(report, schema_version);
        serde_json::to_writer_pretty(&mut *out, &doc).map_err(|e| Error::Output(e.into()))?;
        writeln!(out).map_err(Error::Output)
    } else if let Some(h) = human {
        let mut t = Terminal::new(out);
        h(&mut t).and_then(|()| t.flush()).map_err(Error::Output)
    } else {
        Ok(())
    }
}

/// `--json` was given; the schema version to add to a report that has none of its own.
#[derive(Clone, Copy)]
struct Json(Option<u32>);

/// `--json` for a report that carries its own `schema_version`, or for one that needs `version`.
fn json_if(flag: bool, version: Option<u32>) -> Option<Json> {
    flag.then_some(Json(version))
}

fn inspect(
    args: &InspectArgs,
    g: Globals,
    out: &mut BufWriter<io::StdoutLock>,
) -> Result<(), Error> {
    if let Some(other) = wload::inspect::other_source(&args.source.source, args.filter.as_deref())?
    {
        let human: Human = &|w| wload::report::write_other_source(w, &other, g.verbose);
        return emit(out, json_if(args.json, None), &other, Some(human));
    }
    let opened = wload::open(&source_options(&args.source, g.quiet)?)?;
    let report =
        wload::inspect::inspect_mapped(&opened, args.filter.as_deref(), args.mapping.as_deref())?;
    emit(
        out,
        json_if(args.json, None),
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
    let report = wload::plan_report(&opened, &plan_options(&args.parallel), args.rank)?;
    emit(
        out,
        json_if(args.json, None),
        &report,
        Some(&|w| wload::report::write_plan(w, &report, g.verbose)),
    )
}

fn sizes(args: &SizesArgs, g: Globals, out: &mut dyn Write) -> Result<(), Error> {
    let opened = wload::open(&source_options(&args.source, g.quiet)?)?;
    let opts = wload::commands::plan::SizesOptions {
        max_tp: args.max_tp,
        max_pp: args.max_pp,
        dtype: args.dtype,
        mapping: args.mapping.clone(),
        pp_partition: std::env::var("VLLM_PP_LAYER_PARTITION").ok(),
    };
    let report = wload::commands::plan::sizes(&opened, &opts)?;
    emit(
        out,
        json_if(args.json, None),
        &report,
        Some(&|w| wload::report::write_sizes(w, &report)),
    )
}

fn shard(args: &ShardArgs, g: Globals, out: &mut dyn Write) -> Result<(), Error> {
    let mut sopts = source_options(&args.source, g.quiet)?;
    // The one command that copies the side files, so the one that downloads them.
    sopts.side_files = true;
    let mut opened = wload::open(&sopts)?;
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
    let plan = wload::make_plan(&opened, &plan_options(&args.parallel))?;
    opened.timings.plan_s = t.elapsed().as_secs_f64();
    // From here on a signal stops the run cleanly: nothing is published, the staging folder goes.
    interrupt::install();
    let report = wload::shard::shard(&opened, plan, &opts, interrupt::flag(), &|total| {
        bars::labelled_bar(total, g.quiet, "writing")
    })?;
    for s in &report.removed_leftovers {
        say(format_args!(
            "note: removed {}, left by wload process {} (no longer running)",
            Esc(&s.path.to_string_lossy()),
            s.pid
        ));
    }
    for name in &report.skipped_side_files {
        say(format_args!(
            "note: left out {} of the source: a wload output or staging folder, not a side file",
            Esc(name)
        ));
    }
    let human: Human = &|w| wload::report::write_shard(w, &report);
    let json = json_if(args.json, Some(wload::report::json::SHARD_SCHEMA_VERSION));
    emit(out, json, &report, (!g.quiet).then_some(human))
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
    let settings = load_settings(args)?;
    let mut sopts = source_options(&args.source, g.quiet)?;
    sopts.config_format = settings.config_format;
    let report = wload::load::load(
        &sopts,
        &settings.plan,
        &lopts,
        interrupt::flag(),
        // Called once planning is done and the transfer starts: from then on a signal stops the
        // transfer cleanly.
        &|total| {
            interrupt::install();
            bars::labelled_bar(total, g.quiet, "loading")
        },
    )?;
    // After the run: an error, when there is one, comes first on stderr.
    if let (Some(note), false) = (&settings.note, g.quiet) {
        say(format_args!("note: {}", Esc(note)));
    }
    emit(
        out,
        json_if(args.json, Some(wload::report::json::LOAD_SCHEMA_VERSION)),
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
        side_files: false,
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

/// `load`'s flags, completed from SOURCE's wload.json (see `wload::commands::load::settings::load_settings`).
fn load_settings(args: &LoadArgs) -> Result<wload::commands::load::settings::LoadSettings, Error> {
    let p = &args.parallel;
    let flags = wload::commands::load::settings::LoadFlags {
        tp: p.tp,
        pp: p.pp,
        expert_parallel: p.enable_expert_parallel,
        dtype: p.dtype,
        config_format: args.source.config_format,
        pp_partition: std::env::var("VLLM_PP_LAYER_PARTITION").ok(),
        mapping: p.mapping.clone(),
    };
    wload::commands::load::settings::load_settings(&args.source.source, &flags)
}

/// Lets glibc reuse freed memory instead of returning it to the kernel. By default it maps each
/// allocation above 128 KiB on its own and unmaps it on free, so every large table the header
/// and plan stages build and drop is faulted in again, page by page, by the next one (a
/// DeepSeek-V3 `plan` took 18,000 page faults; on a VM each costs 2–3 µs). Allocations under
/// 32 MiB then come from the heap, which keeps up to 512 MiB freed before trimming: `plan` takes
/// a fifth fewer faults. Only for the commands that read headers and plan: under `shard` it
/// raised peak RSS from 49 to 61 MiB in one run of three (buffers kept by one thread's arena
/// while another's grew), and `shard` and `load` promise bounded memory.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets the allocator's parameters; it runs before any other thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
}
