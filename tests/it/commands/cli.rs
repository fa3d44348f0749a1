//! The command line as a whole: generated completions and man page kept fresh, help text, usage
//! errors.
//!
//! The checked-in completions and man page are regenerated with
//! `WLOAD_BLESS=1 cargo test --test it cli`.

use std::fs;

use predicates::prelude::*;

use crate::support::*;

const BLESS_HINT: &str =
    "regenerate with `WLOAD_BLESS=1 cargo test --test it cli` and commit the result";

fn blessing() -> bool {
    std::env::var_os("WLOAD_BLESS").is_some_and(|v| v == "1")
}

/// Compares the stdout of `wload <args>` with the checked-in file `rel`, or writes the file when
/// `WLOAD_BLESS=1`.
fn check_generated(args: &[&str], rel: &str) {
    let out = wload().args(args).output().expect("wload runs");
    assert!(
        out.status.success(),
        "wload {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.stdout.is_empty(), "wload {args:?} printed nothing");
    let path = manifest_dir().join(rel);
    if blessing() {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, &out.stdout).unwrap();
        return;
    }
    let current = fs::read(&path).unwrap_or_else(|e| {
        panic!("{rel} cannot be read ({e}); {BLESS_HINT}");
    });
    if current != out.stdout {
        let (cur, new) = (
            String::from_utf8_lossy(&current),
            String::from_utf8_lossy(&out.stdout),
        );
        let first_diff = cur
            .lines()
            .zip(new.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| cur.lines().count().min(new.lines().count()));
        panic!(
            "{rel} is stale: it differs from `wload {}` from line {} on\n  checked in: {:?}\n  generated:  {:?}\n{BLESS_HINT}",
            args.join(" "),
            first_diff + 1,
            cur.lines().nth(first_diff).unwrap_or("<end of file>"),
            new.lines().nth(first_diff).unwrap_or("<end of output>"),
        );
    }
}

#[test]
fn bash_completions_are_fresh() {
    check_generated(&["completions", "bash"], "completions/wload.bash");
}

#[test]
fn zsh_completions_are_fresh() {
    check_generated(&["completions", "zsh"], "completions/_wload");
}

#[test]
fn fish_completions_are_fresh() {
    check_generated(&["completions", "fish"], "completions/wload.fish");
}

#[test]
fn man_page_is_fresh() {
    check_generated(&["man"], "docs/wload.1");
}

/// wload(1) refers to a page per subcommand (wload-inspect(1), …): each is generated from clap
/// and checked in.
#[test]
fn every_subcommand_has_a_fresh_man_page() {
    use clap::CommandFactory;
    let mut cli = wload::cli::Cli::command();
    cli.build();
    let names: Vec<String> = cli
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_string())
        .collect();
    for wanted in ["inspect", "plan", "sizes", "shard", "load", "completions"] {
        assert!(names.iter().any(|n| n == wanted), "{wanted} in {names:?}");
    }
    for name in &names {
        check_generated(&["man", name], &format!("docs/wload-{name}.1"));
    }
    let top = fs::read_to_string(manifest_dir().join("docs/wload.1")).unwrap();
    for name in &names {
        assert!(
            top.contains(&format!("wload\\-{name}(1)")),
            "wload(1) lists wload-{name}(1)"
        );
    }
    // No page is left over from a subcommand that is gone.
    for entry in fs::read_dir(manifest_dir().join("docs")).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        if let Some(name) = file
            .strip_prefix("wload-")
            .and_then(|f| f.strip_suffix(".1"))
        {
            assert!(
                names.iter().any(|n| n == name),
                "docs/{file} has no subcommand"
            );
        }
    }
}

#[test]
fn a_subcommand_page_names_the_command_as_typed() {
    let out = wload().args(["man", "inspect"]).output().unwrap();
    assert!(out.status.success(), "{}", context(&out));
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.contains(".TH wload-inspect 1 "), "{page}");
    let footer = format!("\"wload {}\"", env!("CARGO_PKG_VERSION"));
    assert!(page.contains(&footer), "{page}");
    assert!(
        page.contains("\\fBwload inspect\\fR"),
        "the synopsis: {page}"
    );
    let out = wload().args(["man", "no-such-command"]).output().unwrap();
    assert_refusal_text(&out, 2, &["no page for 'no-such-command'", "inspect"]);
}

#[test]
fn long_help_documents_exit_statuses() {
    for args in [&["--help"][..], &["inspect", "--help"]] {
        wload()
            .args(args)
            .assert()
            .success()
            .stdout(predicate::str::contains("Exit status"))
            .stdout(predicate::str::contains("0  success"))
            .stdout(predicate::str::contains("1  runtime failure"))
            .stdout(predicate::str::contains("2  usage error"))
            .stdout(predicate::str::contains("3  the checkpoint"));
    }
}

#[test]
fn help_lists_the_subcommands_but_not_the_hidden_ones() {
    let out = wload().arg("--help").output().expect("wload runs");
    assert!(out.status.success(), "{}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    // The names in the "Commands:" section, one per line ("  NAME  description"): the about text
    // above it mentions "load" and "shard" too, so searching the whole text proves nothing.
    let listed: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        listed,
        [
            "inspect",
            "plan",
            "sizes",
            "shard",
            "load",
            "completions",
            "man",
            "help"
        ],
        "subcommands in --help:\n{text}"
    );
}

#[test]
fn version_is_the_crate_version() {
    wload()
        .arg("--version")
        .assert()
        .success()
        .stdout(format!("wload {}\n", env!("CARGO_PKG_VERSION")));
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &[][..],
        &["no-such-subcommand"],
        &["inspect"],
        &["inspect", ".", "--load-format", "gguf"],
        &["inspect", ".", "--no-such-flag"],
        &["inspect", ".", "--quiet", "--verbose"],
        &["completions", "tcsh-9000"],
    ] {
        wload()
            .args(args)
            .assert()
            .code(2)
            .stdout(predicate::str::is_empty());
    }
}

/// A SOURCE that does not exist, on an otherwise complete command line: exit 2 with wload's own
/// message naming the path (not clap's usage error, which would mean SOURCE was never looked at),
/// nothing on stdout, no panic, and for `shard` no OUT.
#[test]
fn missing_source_is_a_usage_error() {
    let work = tempfile::TempDir::new().unwrap();
    let missing = work.path().join("no-such-checkpoint");
    let out = work.path().join("out");
    let (src, o) = (missing.to_str().unwrap(), out.to_str().unwrap());
    for args in [
        &["inspect", src][..],
        &["plan", src, "--tp", "2"],
        &["shard", src, "--tp", "2", "-o", o],
        &["load", src, "--tp", "2", "--device", "cpu"],
    ] {
        let run = wload()
            .args(args)
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        let stderr = assert_refusal_text(&run, 2, &["no such file or directory"]);
        let ctx = format!("{args:?}: {}", context(&run));
        assert!(
            stderr.starts_with(&format!("error: {src}: ")),
            "names SOURCE; {ctx}"
        );
        assert!(
            !stderr.contains("Usage:"),
            "clap refused the command line; {ctx}"
        );
        assert!(!out.exists(), "OUT created; {ctx}");
    }
}

/// The test hooks (WLOAD_TEST_* variables) reach the binary these tests run (the crate's
/// dev-dependency on itself enables `test-hooks`; tests/it/commands/shard.rs proves the flip hook works) but
/// no normal build: `cargo build`, `cargo build --release` and `cargo install` resolve the crate
/// without the feature.
#[test]
fn test_hooks_stay_out_of_normal_builds() {
    let features = |edges: &str| {
        let out = std::process::Command::new(env!("CARGO"))
            .args(["tree", "--offline", "-e", edges, "-i", "wload"])
            .current_dir(manifest_dir())
            .output()
            .expect("cargo runs");
        assert!(
            out.status.success(),
            "cargo tree -e {edges}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let normal = features("normal,build,features");
    assert!(normal.contains("wload feature \"default\""), "{normal}");
    assert!(
        !normal.contains("test-hooks"),
        "a normal build has the test hooks:\n{normal}"
    );
    // And the check above would see the feature if it were there: the test build has it.
    let with_dev = features("features");
    assert!(
        with_dev.contains("wload feature \"test-hooks\""),
        "{with_dev}"
    );
}

/// A count flag out of range says what it needs, not clap's `0 is not in 1..18446744073709551615`.
#[test]
fn numeric_flags_say_their_range_in_words() {
    let src = "examples/tiny-llama";
    for (args, says) in [
        (
            &["plan", src, "--tp", "0"][..],
            "error: --tp must be at least 1, not 0",
        ),
        (
            &["plan", src, "--tp", "2", "--pp", "0"],
            "error: --pp must be at least 1, not 0",
        ),
        (
            &["load", src, "--tp", "0", "--device", "cpu"],
            "error: --tp must be at least 1, not 0",
        ),
        (
            &["load", src, "--pp", "0", "--device", "cpu"],
            "error: --pp must be at least 1, not 0",
        ),
        (
            &["shard", src, "--tp", "2", "--pp", "0", "-o", "x"],
            "error: --pp must be at least 1, not 0",
        ),
        (
            &["sizes", src, "--max-tp", "0"],
            "error: --max-tp must be between 1 and 4096, not 0",
        ),
        (
            &["sizes", src, "--max-pp", "5000"],
            "error: --max-pp must be between 1 and 1024, not 5000",
        ),
        (
            &["load", src, "--tp", "1", "--repeat", "0"],
            "error: --repeat must be between 1 and 1000, not 0",
        ),
        (
            &["plan", src, "--tp", "two"],
            "error: --tp takes a whole number, such as 2, not 'two'",
        ),
    ] {
        let out = run(args);
        let err = assert_refusal_text(&out, 2, &[says]);
        assert!(!err.contains("18446744073709551615"), "{args:?}: {err}");
    }
}

/// `shard --io` and `load --io` say what `auto` does for each, as the code does it: shard stays
/// buffered (src/commands/shard.rs `source_io`), load goes direct for a mostly cold source.
#[test]
fn io_help_says_what_auto_does_for_each_command() {
    for cmd in ["shard", "load"] {
        let out = run(&[cmd, "--help"]);
        let text = stdout(&out);
        assert!(
            text.contains("for shard, always") && text.contains("buffered, since its"),
            "{cmd} --help:\n{text}"
        );
        assert!(text.contains("for load, direct when under half"), "{text}");
    }
}

/// -q and -v say in --help what each leaves out or adds.
#[test]
fn help_documents_quiet_and_verbose() {
    let text = stdout(&run(&["--help"]));
    for needle in [
        "plan: the verdict and totals line",
        "load: the one result line",
        "load: where the bytes came from",
    ] {
        assert!(text.contains(needle), "{needle:?} in --help:\n{text}");
    }
}

/// wload(1) has EXAMPLES and an ENVIRONMENT section naming every variable wload reads; a
/// subcommand's page has its own examples.
#[test]
fn the_man_page_has_examples_and_environment() {
    let page = stdout(&run(&["man"]));
    let section = |name: &str| {
        let start = page
            .find(&format!("\n.SH {name}\n"))
            .unwrap_or_else(|| panic!("no {name} section:\n{page}"));
        let rest = &page[start + 1..];
        let end = rest[1..].find("\n.SH ").map_or(rest.len(), |e| e + 1);
        rest[..end].replace("\\-", "-")
    };
    let env = section("ENVIRONMENT");
    for var in [
        "VLLM_PP_LAYER_PARTITION",
        "HF_HOME",
        "HF_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "HF_TOKEN",
        "HF_ENDPOINT",
        "HF_HUB_ETAG_TIMEOUT",
        "HF_HUB_DOWNLOAD_TIMEOUT",
        "RANK, WORLD_SIZE, LOCAL_RANK",
        "SLURM_PROCID",
        "WLOAD_NO_COPY_FILE_RANGE",
        "NO_COLOR",
    ] {
        assert!(env.contains(var), "{var} in ENVIRONMENT:\n{env}");
    }
    let examples = section("EXAMPLES");
    for cmd in ["wload sizes ", "wload plan ", "wload shard ", "wload load "] {
        assert!(examples.contains(cmd), "{cmd:?} in EXAMPLES:\n{examples}");
    }
    let plan = stdout(&run(&["man", "plan"]));
    assert!(plan.contains(".SH EXAMPLES"), "{plan}");
    assert!(
        !plan.contains("wload shard "),
        "plan's examples only:\n{plan}"
    );
    assert!(!plan.contains(".SH ENVIRONMENT"), "{plan}");
}

/// `wload man` on a terminal shows the page: through `man -l -` reading the roff on its stdin,
/// else as plain text through $PAGER. Run under script(1) for a terminal, with a PATH holding
/// only what each case needs.
#[test]
fn man_on_a_terminal_goes_through_man_or_a_pager() {
    const TEST: &str = "man_on_a_terminal_goes_through_man_or_a_pager";
    let script = std::path::Path::new("/usr/bin/script");
    if !script.exists() {
        missing_environment(TEST, "script(1) from util-linux is needed for a terminal");
        return;
    }
    let bin = tempfile::TempDir::new().unwrap();
    let got = bin.path().join("got");
    std::os::unix::fs::symlink("/bin/sh", bin.path().join("sh")).unwrap();
    let on_terminal = |path: &std::path::Path, pager: &str| {
        let out = std::process::Command::new(script)
            .args([
                "-qec",
                &format!("{} man", env!("CARGO_BIN_EXE_wload")),
                "/dev/null",
            ])
            .env("PATH", path)
            .env("PAGER", pager)
            .env_remove("MANPAGER")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", context(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // No man(1): the plain text goes to $PAGER, and nothing is printed as roff.
    let shown = on_terminal(bin.path(), &format!("/bin/cat > {}", got.display()));
    let text = fs::read_to_string(&got).unwrap();
    assert!(text.starts_with("Shard and load LLM checkpoints"), "{text}");
    assert!(
        text.contains("Examples:") && text.contains("Environment:"),
        "{text}"
    );
    assert!(!shown.contains(".TH"), "{shown}");
    // A man(1) that records its arguments and stdin.
    let man = bin.path().join("man");
    fs::write(
        &man,
        format!(
            "#!/bin/sh\necho \"$@\" > {0}.args\n/bin/cat > {0}\n",
            got.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&man, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let shown = on_terminal(bin.path(), "false");
    let args = fs::read_to_string(got.with_extension("args")).unwrap();
    assert_eq!(args.trim(), "-l -");
    let roff = fs::read_to_string(&got).unwrap();
    assert!(
        roff.contains(".TH wload 1") && roff.contains(".SH EXAMPLES"),
        "{roff}"
    );
    assert!(!shown.contains(".TH"), "{shown}");
}
