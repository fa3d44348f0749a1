//! Everything the command writes: reports as one `--json` document or as text for people,
//! failures and notes on stderr, completions (man pages: [`super::man`]). Kept apart from `mod.rs` so that
//! one file holds the rule of the output streams.
//!
//! Every text for people leaves through [`Terminal`]: the human reports (in
//! [`emit`]) and everything on stderr ([`say`]), so that no control character of a name, a path
//! or a manifest reaches the terminal raw; `--json` documents are written as serde writes them.

use std::ffi::OsString;
use std::io::{self, Write};

use clap::CommandFactory;

use crate::cli::Cli;
use crate::commands::error::Error;
use crate::escape::{Esc, Terminal};

/// Writes a report for people (a table, a summary).
pub(crate) type Human<'a> = &'a dyn Fn(&mut dyn Write) -> io::Result<()>;

/// `--json` was given; the schema version to add to a report that has none of its own.
#[derive(Clone, Copy)]
pub(crate) struct Json(Option<u32>);

/// `--json` for a report that carries its own `schema_version`, or for one that needs `version`.
pub(crate) fn json_if(flag: bool, version: Option<u32>) -> Option<Json> {
    flag.then_some(Json(version))
}

/// One JSON document with `--json` (with `"ok": true`, and `schema_version` for a report without
/// its own), else the human table (`human`, unless it is `None`).
pub(crate) fn emit<T: serde::Serialize>(
    out: &mut dyn Write,
    json: Option<Json>,
    report: &T,
    human: Option<Human>,
) -> Result<(), Error> {
    if let Some(Json(schema_version)) = json {
        let doc = crate::report::json::success(report, schema_version);
        serde_json::to_writer_pretty(&mut *out, &doc).map_err(|e| Error::Output(e.into()))?;
        writeln!(out).map_err(Error::Output)
    } else if let Some(h) = human {
        let mut t = Terminal::new(out);
        h(&mut t).and_then(|()| t.flush()).map_err(Error::Output)
    } else {
        Ok(())
    }
}

/// Set once a report went to stdout as the `--json` document of a failing command
/// ([`refused`]): the failure then prints no second document.
static DOCUMENT_PRINTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A report printed whole although the command fails with `e` (`inspect` of what `plan` would
/// refuse): with `--json` the report's document with `"ok": false` and the error, else the human
/// report; then `Err(e)`, for [`super::run`] to print on stderr and return as the exit status.
pub(crate) fn refused<T: serde::Serialize>(
    out: &mut dyn Write,
    json: bool,
    report: &T,
    human: Human,
    e: Error,
) -> Result<(), Error> {
    if json {
        let doc = crate::report::json::refused(report, &e, e.exit_status() as u8);
        serde_json::to_writer_pretty(&mut *out, &doc).map_err(|e| Error::Output(e.into()))?;
        writeln!(out).map_err(Error::Output)?;
        DOCUMENT_PRINTED.store(true, std::sync::atomic::Ordering::Relaxed);
    } else {
        let mut text = Vec::new();
        emit(&mut text, None, report, Some(human))?;
        out.write_all(&text).map_err(Error::Output)?;
        *REPORT_PRINTED.lock().unwrap_or_else(|p| p.into_inner()) =
            String::from_utf8_lossy(&text).into_owned();
    }
    out.flush().map_err(Error::Output)?;
    Err(e)
}

/// The report for people that went to stdout before the failure ([`refused`]): when it lists
/// every line of the failure's message already (a folder's problems), stderr says only what
/// failed, not the list again.
static REPORT_PRINTED: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// Whether every line of `message` after the first is in the report printed on stdout.
fn listed_above(message: &str) -> bool {
    let report = REPORT_PRINTED.lock().unwrap_or_else(|p| p.into_inner());
    !report.is_empty()
        && (message.lines().skip(1))
            .map(str::trim)
            .all(|l| l.is_empty() || report.contains(&*one_fix(l)))
}

/// A fix the message gives once for several problems (`fix (the 3 above): …`) as the report
/// gives it under each (`fix: …`).
fn one_fix(line: &str) -> std::borrow::Cow<'_, str> {
    match line.strip_prefix("fix (").and_then(|r| r.split_once("): ")) {
        Some((_, fix)) => format!("fix: {fix}").into(),
        None => line.into(),
    }
}

/// A failed command: its JSON document with `--json` (unless stdout itself failed, or already
/// carries the report's document), then the message on stderr.
pub(crate) fn failure(e: &Error, status: u8, json: bool) {
    let printed = DOCUMENT_PRINTED.load(std::sync::atomic::Ordering::Relaxed);
    // A failed write to stdout leaves nowhere to put a document.
    let document = json && !matches!(e, Error::Output(_));
    if document && !printed {
        print_json(&crate::report::json::failure(e, status));
    }
    let message = e.for_terminal();
    let where_listed = if document {
        Some("the JSON document on stdout has all of it")
    } else if listed_above(&message) {
        Some("listed above")
    } else {
        None
    };
    say(format_args!("error: {}", headline(&message, where_listed)));
}

/// A message of several lines (a problem list) cut to its first, saying where the rest is, when
/// it is printed elsewhere already; whole otherwise.
fn headline(message: &str, where_listed: Option<&str>) -> String {
    match (message.split_once('\n'), where_listed) {
        (Some((first, _)), Some(place)) => {
            format!("{} ({place})", first.trim_end().trim_end_matches(':'))
        }
        _ => message.to_string(),
    }
}

/// A usage error from clap: on stderr, and then with `--json` anywhere on the line also its
/// JSON document, since the pipeline that passed the flag reads stdout.
/// `args` are the arguments after the program's name.
pub(crate) fn usage_error(e: &clap::Error, args: &[OsString]) {
    if json_requested(args.iter().cloned()) {
        print_json(&crate::report::json::usage_failure(&e.render().to_string()));
    }
    match escaped_usage_error(args.iter().cloned()) {
        Some(text) => say(format_args!("{}", text.trim_end())),
        None => {
            let _ = e.print();
        }
    }
}

/// clap's message for the command line with every argument escaped, when one has a control
/// character in it (a file name passed by a script, say); `None` otherwise, for clap to print in
/// colour. clap quotes the argument it refuses, after stripping only some controls (ESC
/// sequences, not CR, C1 or a newline): parsing the escaped arguments again gives the same
/// refusal, quoting the escaped text, so that nothing in it can start a line.
fn escaped_usage_error(args: impl Iterator<Item = OsString>) -> Option<String> {
    let args: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    if !args
        .iter()
        .any(|a| a.chars().any(crate::escape::is_control))
    {
        return None;
    }
    let escaped = args.iter().map(|a| crate::escape::escape(a).into_owned());
    let program = std::iter::once("wload".to_string());
    match Cli::parse_args(program.chain(escaped)) {
        Err(e) => Some(e.render().to_string()),
        // Escaping made the line acceptable (it never should): say that it was refused.
        Ok(_) => Some(
            "error: the command line was refused, and one of its arguments has control characters in it"
                .into(),
        ),
    }
}

/// Whether `--json` is among the options (not after `--`, where everything is a value).
fn json_requested(args: impl Iterator<Item = OsString>) -> bool {
    args.take_while(|a| a != "--").any(|a| a == "--json")
}

/// `shard`'s notes on stderr: the leftovers of killed runs it removed, the source entries it did
/// not copy.
pub(crate) fn shard_notes(report: &crate::commands::shard::ShardReport) {
    for s in &report.removed_leftovers {
        let (path, pid) = (Esc(&s.path.to_string_lossy()), s.pid);
        say(format_args!(
            "note: removed {path}, left by wload process {pid} (no longer running)"
        ));
    }
    for warning in &report.warnings {
        say(format_args!("warning: {}", Esc(warning)));
    }
    for skipped in &report.skipped_side_files {
        say(format_args!(
            "note: left out {} of the source: {}",
            Esc(&skipped.name),
            skipped.why
        ));
    }
}

/// A `--ranks` run that did not complete its output: the serve line it prints holds only once
/// every rank's files are in one folder.
pub(crate) fn partial_run_warning(report: &crate::commands::shard::ShardReport) {
    let m = &report.manifest;
    let world = m.tp.saturating_mul(m.pp);
    if report.completed || m.ranks.len() as u64 >= world {
        return;
    }
    say(format_args!(
        "warning: this run wrote {} of the {world} ranks: serve once all {world} ranks' files are in one folder (`wload inspect` checks)",
        m.ranks.len()
    ));
}

/// For a hub source, what the run fetched from the hub, on stderr (unless `--quiet`).
pub(crate) fn hub_fetched(fetched: Option<&crate::resolve::remote::Fetched>, quiet: bool) {
    if let (Some(f), false) = (fetched, quiet) {
        say(format_args!("{}", crate::report::hub_fetched_line(f)));
    }
}

/// vLLM's warnings for what a command planned (a `--mm-encoder-tp-mode data` it falls back
/// from), on stderr unless `-q`.
pub(crate) fn warnings(warnings: &[String], quiet: bool) {
    for w in warnings.iter().filter(|_| !quiet) {
        say(format_args!("warning: {}", Esc(w)));
    }
}

/// One line on stderr for people, its control characters escaped ([`Terminal`]). stderr may be
/// closed or full; there is nowhere left to say so.
pub(crate) fn say(line: std::fmt::Arguments) {
    let mut t = Terminal::new(io::stderr().lock());
    let _ = writeln!(t, "{line}").and_then(|()| t.flush());
}

/// One document on stdout, if stdout takes it: the exit status says the rest.
fn print_json<T: serde::Serialize>(doc: &T) {
    let mut out = io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, doc)
        .map_err(io::Error::from)
        .and_then(|()| writeln!(out))
        .and_then(|()| out.flush());
}

/// The completion script for `shell`.
pub(crate) fn completions(shell: clap_complete::Shell, out: &mut dyn Write) -> Result<(), Error> {
    // `generate` panics on a write error: render to memory, then write and check.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "wload", &mut script);
    out.write_all(&script).map_err(Error::Output)
}
