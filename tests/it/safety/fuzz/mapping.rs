//! Mapping files as applied, not only parsed: generated hostile `--mapping` files (rules that
//! double or lengthen names, huge replacement templates, self-containing Mistral tokens, regexes
//! that compile large, parameter lists multiplied by blocks and layers, deep nesting) run through
//! `wload plan` on a golden fixture, every case with its time and memory bounded.
//!
//! Each case runs the binary as a child under `prlimit --as` (address space) and a wall-clock
//! kill, because the failure this guards against is the process running away: an allocation
//! past the limit makes the child abort (a signal, not an exit status), which no in-process check
//! could survive or catch reliably (a counting allocator in this test binary would count every
//! other test's allocations too). A case passes when the child exits 0, 2 or 3 by itself, prints
//! no panic, and takes under [`CASE_SECONDS`].

use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

use fastrand::Rng;

use crate::support::*;

/// Address space a case may use: real plans of the fixture need well under 100 MB; the limit
/// leaves room for thread stacks and malloc arenas on a many-core machine.
const ADDRESS_SPACE: u64 = 3 << 30;

/// A case still running after this is killed and fails the test.
const CASE_SECONDS: u64 = 10;

const HEAD: &str = "extends: llama\nfamily: fuzz\narchitectures: [LlamaForCausalLM]\n";

fn regex_chain(rng: &mut Rng) -> String {
    let patterns = [
        r"^(.*)$",
        r"(.)",
        r"(.+)",
        r"(\w+)",
        r"([a-z]+)",
        r"(\.)",
        r"()",
    ];
    let rules: String = (0..rng.usize(1..60))
        .map(|_| {
            let refs = rng.usize(1..40);
            let lit = "x".repeat(rng.usize(0..30));
            format!(
                "    - {{pattern: '{}', replace: '{lit}{}'}}\n",
                patterns[rng.usize(..patterns.len())],
                r"\1".repeat(refs)
            )
        })
        .collect();
    format!("rules:\n  regex:\n{rules}")
}

fn literal_growth(rng: &mut Rng) -> String {
    let kind = ["substr", "stacked", "prefix", "suffix"][rng.usize(..4)];
    let n = rng.usize(1..1200);
    let grow = "y".repeat(rng.usize(1..1100));
    let rules: String = (0..n)
        .map(|k| match kind {
            "stacked" => format!("    - {{from: .weight, to: '.{grow}{k}.weight', shard: q}}\n"),
            "prefix" => format!("    - {{from: layers, to: 'layers{grow}'}}\n"),
            "suffix" => format!("    - {{from: weight, to: '{grow}weight'}}\n"),
            _ => format!("    - {{from: self_attn, to: 'self_attn.{grow}'}}\n"),
        })
        .collect();
    format!("rules:\n  {kind}:\n{rules}")
}

fn mistral_tokens(rng: &mut Rng) -> String {
    let growth = ["layers.layers.layers", "model.layers.model", "0.0.0.0"];
    format!(
        "rules:\n  mistral:\n    tokens: {{'model.layers': '{}', layers: '{}'}}\n",
        growth[rng.usize(..growth.len())],
        growth[rng.usize(..growth.len())]
    )
}

fn big_regexes(rng: &mut Rng) -> String {
    let patterns = [
        r"\w{1000}",
        r"(a{100}){100}",
        r"[\p{L}\p{N}]{500}",
        r"(?:(?:(?:a|b)*)*)*c",
    ];
    let rules: String = (0..rng.usize(1..300))
        .map(|_| {
            format!(
                "    - {{pattern: '{}', replace: z}}\n",
                patterns[rng.usize(..patterns.len())]
            )
        })
        .collect();
    let kind = if rng.bool() { "regex" } else { "experts" };
    let rules = if kind == "experts" {
        rules
            .replace("replace: z}", r"replace: z, shard: w1}")
            .replace("'}", r"(\d+)'}")
    } else {
        rules
    };
    format!("rules:\n  {kind}:\n{rules}")
}

fn many_parameters(rng: &mut Rng) -> String {
    let block: String = (0..rng.usize(1..300))
        .map(|k| format!("    - {{name: 'model.layers.{{i}}.{{m}}.p{k}', layout: {{kind: replicated, shape: [hidden_size]}}}}\n"))
        .collect();
    let uses: String = (0..rng.usize(1..600))
        .map(|u| format!("    - {{use: big, with: {{m: m{u}}}}}\n"))
        .collect();
    let layers = [
        "num_hidden_layers * 1000",
        "4096",
        "100000",
        "num_hidden_layers",
    ];
    format!(
        "blocks:\n  big:\n{block}parameters:\n  layers: {}\n  layer:\n{uses}",
        layers[rng.usize(..layers.len())]
    )
}

fn deep_nesting(rng: &mut Rng) -> String {
    let depth = rng.usize(10..300);
    let expr = format!("{}hidden_size{}", "(".repeat(depth), ")".repeat(depth));
    let yaml_depth = rng.usize(10..200);
    let nested = format!("{}1{}", "[".repeat(yaml_depth), "]".repeat(yaml_depth));
    format!(
        "derive:\n  deep: \"{expr}\"\ndefaults:\n  nested: {nested}\nparameters:\n  tail:\n    - {{name: x.weight, layout: {{kind: replicated, shape: [deep, deep, deep, deep]}}}}\n"
    )
}

fn make_case(rng: &mut Rng) -> String {
    let body = match rng.usize(..6) {
        0 => regex_chain(rng),
        1 => literal_growth(rng),
        2 => mistral_tokens(rng),
        3 => big_regexes(rng),
        4 => many_parameters(rng),
        _ => deep_nesting(rng),
    };
    format!("{HEAD}{body}")
}

#[test]
fn hostile_mappings_applied_stay_within_time_and_memory() {
    let fixture = fixtures_dir().join("llama_gqa");
    let dir = tempfile::TempDir::new().unwrap();
    let mut failures = Vec::new();
    for case in 0..36u64 {
        let mut rng = Rng::with_seed(0x6D61_7070 ^ case);
        let text = make_case(&mut rng);
        let file = dir.path().join(format!("case-{case}.yaml"));
        fs::write(&file, &text).unwrap();
        let t = Instant::now();
        let out = Command::new("prlimit")
            .arg(format!("--as={ADDRESS_SPACE}"))
            .args(["--", "timeout", "-s", "KILL", &CASE_SECONDS.to_string()])
            .arg(env!("CARGO_BIN_EXE_wload"))
            .args([
                "plan",
                s(&fixture),
                "--tp",
                "2",
                "-q",
                "--mapping",
                s(&file),
            ])
            .env("RAYON_NUM_THREADS", "2")
            .env_remove("RUST_BACKTRACE")
            .output()
            .expect("prlimit and timeout run");
        let took = t.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        let ok = matches!(code, Some(0 | 2 | 3))
            && !stderr.contains("panicked")
            && took < Duration::from_secs(CASE_SECONDS);
        if !ok {
            let head: String = stderr.chars().take(300).collect();
            failures.push(format!(
                "case {case} ({}): status {:?} after {took:?}: {head}",
                file.display(),
                out.status
            ));
        }
    }
    if !failures.is_empty() {
        // Kept for replay: `wload plan FIXTURE --tp 2 --mapping FILE`.
        let kept = dir.keep();
        panic!(
            "{} of 36 hostile mappings ran away (inputs in {}):\n{}",
            failures.len(),
            kept.display(),
            failures.join("\n")
        );
    }
}
