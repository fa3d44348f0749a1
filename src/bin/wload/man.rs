//! `wload man`: the manual pages, generated from the clap definitions (clap_mangen) with the
//! EXAMPLES and ENVIRONMENT sections clap knows nothing about. On a terminal the page is shown
//! as `man` would show it; otherwise it is printed as roff, so that `wload man > wload.1` works.

use std::io::{self, IsTerminal, Write};
use std::process::{Command, Stdio};

use clap::CommandFactory;

use wload::Error;
use wload::cli::Cli;

/// The variables wload reads, and what for: (name, description).
const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "VLLM_PP_LAYER_PARTITION",
        "Layers per pipeline stage, comma-separated (plan, sizes, shard, load), as vLLM reads it: it must have --pp counts adding up to the layers.",
    ),
    (
        "VLLM_REPLICATE_EMBED",
        "1 or true (any case, spaces stripped), as vLLM reads it (plan, sizes, shard, load): DeepSeek-V3.2 and GLM-5 hold the whole padded embedding on every rank; recorded in wload.json and the serve line.",
    ),
    (
        "HF_HOME",
        "The Hugging Face folder (default ~/.cache/huggingface, or $XDG_CACHE_HOME/huggingface); the hub cache is its hub/ unless HF_HUB_CACHE is set, the token its token file.",
    ),
    (
        "HF_HUB_CACHE",
        "The hub cache for repo ids (also HUGGINGFACE_HUB_CACHE); --download-dir wins over it.",
    ),
    (
        "HF_HUB_OFFLINE",
        "1 (or ON, YES, TRUE; also TRANSFORMERS_OFFLINE): no connection; every file must be in the cache.",
    ),
    (
        "HF_TOKEN",
        "The token for gated and private repos (also HUGGING_FACE_HUB_TOKEN, else the file HF_TOKEN_PATH or $HF_HOME/token); sent only to the endpoint.",
    ),
    (
        "HF_ENDPOINT",
        "The hub to download from (default https://huggingface.co).",
    ),
    (
        "HF_HUB_ETAG_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT",
        "The longest silence allowed in a metadata request and in a transfer, in whole seconds (default 10; 0 means the default).",
    ),
    (
        "RANK, WORLD_SIZE, LOCAL_RANK",
        "Under torchrun, load takes only the process's own ranks (unless --ranks is given), onto its local GPUs; shard --ranks launcher writes the process's block of the ranks.",
    ),
    (
        "SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID",
        "The same under srun.",
    ),
    (
        "SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_MIN, SLURM_ARRAY_TASK_STEP, SLURM_ARRAY_TASK_COUNT",
        "In a Slurm array, shard --ranks launcher writes the task's block of the ranks.",
    ),
    (
        "JOB_COMPLETION_INDEX, WLOAD_RUNS",
        "In a Kubernetes Indexed Job, shard --ranks launcher writes the pod's block of the ranks; set WLOAD_RUNS to the Job's completions (Kubernetes puts them in no variable).",
    ),
    (
        "WLOAD_NO_COPY_FILE_RANGE",
        "1: shard copies through memory instead of copy_file_range, for a filesystem where that call misbehaves.",
    ),
    (
        "MANPAGER, PAGER",
        "wload man on a terminal: the pager for the plain-text page when man(1) cannot show it (default less -R).",
    ),
    (
        "NO_COLOR",
        "No colour in help and usage errors (wload's reports have none).",
    ),
];

/// Typical command lines: (command, what it does).
const EXAMPLES: &[(&str, &str)] = &[
    (
        "wload inspect ./Llama-3.1-8B",
        "The weight files vLLM would read, the config's dimensions, every tensor.",
    ),
    (
        "wload sizes ./Llama-3.1-8B",
        "Which --tp, --pp and expert-parallel sizes vLLM accepts, and why not the others.",
    ),
    (
        "wload plan ./Llama-3.1-8B --tp 8 -q",
        "Whether vLLM would load it at TP 8: the verdict and the totals per rank.",
    ),
    (
        "wload plan ./Llama-3.1-8B --tp 8 --json | jq -e .ok",
        "The same, for a pipeline: one JSON document, whatever happens.",
    ),
    (
        "wload shard meta-llama/Llama-3.1-8B --tp 8 -o Llama-3.1-8B-tp8",
        "Pre-sharded per-rank files from a hub repo, for vllm serve Llama-3.1-8B-tp8 --load-format sharded_state -tp 8.",
    ),
    (
        "wload load --dry-run --read ./Llama-3.1-8B-tp8",
        "Check a sharded folder as vLLM would load it, and every byte against its wload.json, without a GPU.",
    ),
    (
        "wload load ./Llama-3.1-8B --tp 8 --cold --repeat 3",
        "Load onto 8 GPUs three times, each from a cold page cache, timing every stage.",
    ),
    (
        "wload man plan > wload-plan.1",
        "Write a page as roff, to install it.",
    ),
];

/// `wload man [NAME]`: formatted on a terminal, else roff on `out`.
pub(crate) fn man(name: Option<&str>, out: &mut dyn Write) -> Result<(), Error> {
    let page = page(name)?;
    let mut roff = Vec::new();
    render(&page, &mut roff).map_err(Error::Output)?;
    if io::stdout().is_terminal() && show(&page, &roff) {
        return Ok(());
    }
    out.write_all(&roff).map_err(Error::Output)
}

/// wload(1), or a subcommand's page: wload-inspect(1) and so on, the names wload(1) refers to.
fn page(name: Option<&str>) -> Result<clap::Command, Error> {
    let mut cli = Cli::command();
    // Builds the subcommands' names (wload-inspect, "wload inspect") and global flags.
    cli.build();
    let Some(name) = name else { return Ok(cli) };
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
    })
}

/// The page as roff: clap_mangen's sections, with EXAMPLES and ENVIRONMENT (wload(1) only)
/// before VERSION.
fn render(page: &clap::Command, out: &mut dyn Write) -> io::Result<()> {
    let top = page.get_name() == "wload";
    let mut roff = Vec::new();
    // The footer names the program and version on every page, not the subcommand's name.
    clap_mangen::Man::new(page.clone())
        .source(format!("wload {}", env!("CARGO_PKG_VERSION")))
        .render(&mut roff)?;
    let roff = String::from_utf8_lossy(&roff);
    let at = roff.find("\n.SH VERSION").map_or(roff.len(), |i| i + 1);
    let (head, tail) = roff.split_at(at);
    out.write_all(head.as_bytes())?;
    let examples = examples(page);
    if !examples.is_empty() {
        section(out, "EXAMPLES", &examples)?;
    }
    if top {
        section(out, "ENVIRONMENT", ENVIRONMENT)?;
    }
    out.write_all(tail.as_bytes())
}

/// The examples of `page`: all of them on wload(1), a subcommand's own on its page.
fn examples(page: &clap::Command) -> Vec<(&'static str, &'static str)> {
    let name = page.get_name();
    let command = format!("wload {name} ");
    let ours = |line: &str| name == "wload" || line.starts_with(&command);
    EXAMPLES
        .iter()
        .copied()
        .filter(|(line, _)| ours(line))
        .collect()
}

/// A section of tagged paragraphs (`.TP`): the tag in bold, the text under it.
fn section(out: &mut dyn Write, title: &str, items: &[(&str, &str)]) -> io::Result<()> {
    writeln!(out, ".SH {title}")?;
    for (tag, text) in items {
        writeln!(out, ".TP\n\\fB{}\\fR\n{}", roff_text(tag), roff_text(text))?;
    }
    Ok(())
}

/// `s` as roff text: backslashes and hyphens escaped, no line that starts as a request.
fn roff_text(s: &str) -> String {
    let s = s.replace('\\', "\\e").replace('-', "\\-");
    match s.starts_with(['.', '\'']) {
        true => format!("\\&{s}"),
        false => s,
    }
}

/// Shows the page on the terminal: formatted by `man -l -`, else as plain text through
/// `$MANPAGER`, `$PAGER` or `less -R`. False when none of them could show it.
fn show(page: &clap::Command, roff: &[u8]) -> bool {
    if pipe_to(Command::new("man").args(["-l", "-"]), roff) {
        return true;
    }
    let text = plain(page);
    let pagers = ["MANPAGER", "PAGER"]
        .iter()
        .filter_map(|v| std::env::var(v).ok().filter(|p| !p.trim().is_empty()))
        .chain(["less -R".to_string()]);
    for pager in pagers {
        if pipe_to(Command::new("sh").args(["-c", &pager]), text.as_bytes()) {
            return true;
        }
    }
    false
}

/// Runs `cmd` with `input` on its stdin; true when it ran and exited 0. The reader may quit
/// before reading everything (`q` in a pager): that is not a failure.
fn pipe_to(cmd: &mut Command, input: &[u8]) -> bool {
    let child = cmd.stdin(Stdio::piped()).stderr(Stdio::null()).spawn();
    let Ok(mut child) = child else { return false };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input);
    }
    child.wait().is_ok_and(|s| s.success())
}

/// The page as plain text: the long help, the examples and (wload(1)) the environment.
fn plain(page: &clap::Command) -> String {
    let mut text = page.clone().render_long_help().to_string();
    let mut list = |title: &str, items: &[(&str, &str)]| {
        text.push_str(&format!("\n{title}:\n"));
        for (tag, what) in items {
            text.push_str(&format!("  {tag}\n      {what}\n"));
        }
    };
    let examples = examples(page);
    if !examples.is_empty() {
        list("Examples", &examples);
    }
    if page.get_name() == "wload" {
        list("Environment", ENVIRONMENT);
    }
    text
}
