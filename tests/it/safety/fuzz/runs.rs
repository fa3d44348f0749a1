//! Run records copied together at random: folders gathered from real `--ranks` runs of the GQA
//! fixture at TP 4, each run's record kept, dropped, truncated, turned into a folder, edited to
//! another wload version, or replaced (with its rank files) by a run of another source, TP or
//! dtype. `inspect` and `load --dry-run --read` must agree on every folder: both accept it when it
//! is one complete output ([`one_output`]), else both refuse it naming an offending record (or,
//! for a dropped record, the rank files it listed). The Python side (`python/tests/test_runs.py`) holds `wload.plan` to the
//! same verdict.

use std::fs;
use std::path::{Path, PathBuf};

use fastrand::Rng;
use tempfile::TempDir;

use crate::support::*;

const SEED: u64 = 0x0038_2e3a;
/// Each case runs the binary twice on a 1 MiB folder: a few dozen keep the test to seconds.
const CASES: usize = 36;
const TP: u64 = 4;
/// The runs a folder is gathered from: their `--ranks` and record names.
const RUNS: [(&str, &str); 3] = [
    ("0-1", "wload-ranks-0-1.json"),
    ("2", "wload-ranks-2.json"),
    ("3", "wload-ranks-3.json"),
];

/// What happens to one run on its way into the folder.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Kept,
    /// The record not copied (its rank files are).
    Missing,
    /// The record cut in half: not JSON.
    Truncated,
    /// A folder under the record's name.
    Folder,
    /// The record says another wload version wrote it.
    OtherVersion,
    /// The run replaced, record and rank files, by one of a fine-tune with the same tensor table.
    OtherSource,
    /// ... by one at TP 8 (the same record name: `--ranks` names the same ranks).
    OtherTp,
    /// ... by one with `--dtype float16`.
    OtherDtype,
}

const FATES: [Fate; 7] = [
    Fate::Missing,
    Fate::Truncated,
    Fate::Folder,
    Fate::OtherVersion,
    Fate::OtherSource,
    Fate::OtherTp,
    Fate::OtherDtype,
];

impl Fate {
    fn pick(rng: &mut Rng) -> Fate {
        // Half kept, so that most folders mix good records with bad ones.
        if rng.bool() {
            Fate::Kept
        } else {
            FATES[rng.usize(..FATES.len())]
        }
    }

    /// The folder of runs this run's files are copied from.
    fn runs(self) -> &'static str {
        match self {
            Fate::OtherSource => "fine-tune",
            Fate::OtherTp => "tp8",
            Fate::OtherDtype => "float16",
            _ => "base",
        }
    }
}

/// Every run a case may copy: `<root>/<runs>/<ranks>/`, sharded once per test.
fn shard_runs(root: &Path) {
    let tuned = copy_fixture(GQA);
    fine_tune(tuned.path());
    let sources: [(&str, &Path, u64, &[&str]); 4] = [
        ("base", &fixture(GQA), TP, &[]),
        ("fine-tune", tuned.path(), TP, &[]),
        ("tp8", &fixture(GQA), 8, &[]),
        ("float16", &fixture(GQA), TP, &["--dtype", "float16"]),
    ];
    for (name, source, tp, extra) in sources {
        fs::create_dir_all(root.join(name)).unwrap();
        for (ranks, _) in RUNS {
            let mut args = vec!["--ranks", ranks];
            args.extend_from_slice(extra);
            shard_ok(source, tp, &root.join(name).join(ranks), &args);
        }
    }
}

/// Every tensor's data changed, the headers kept: another checkpoint with the same tensor table.
fn fine_tune(dir: &Path) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let mut raw = RawFile::read(&p);
            raw.data.iter_mut().for_each(|b| *b ^= 1);
            raw.write(&p);
        }
    }
}

/// The folder of case `fates`, gathered in `dir` from the runs in `root`.
fn gather(root: &Path, fates: &[Fate; 3], dir: &Path) {
    for ((ranks, record), fate) in RUNS.iter().zip(fates) {
        copy_files(&root.join(fate.runs()).join(ranks), dir);
        let path = dir.join(record);
        match fate {
            Fate::Missing => fs::remove_file(&path).unwrap(),
            Fate::Truncated => {
                let text = fs::read(&path).unwrap();
                fs::write(&path, &text[..text.len() / 2]).unwrap();
            }
            Fate::Folder => {
                fs::remove_file(&path).unwrap();
                fs::create_dir(&path).unwrap();
            }
            Fate::OtherVersion => {
                let mut m: serde_json::Value =
                    serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
                m["wload_version"] = "0.0.9".into();
                fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
            }
            _ => {}
        }
    }
}

/// The names a refusal of case `fates` may give: each record not kept, or for a missing one
/// the rank files it listed.
fn offenders(fates: &[Fate; 3]) -> Vec<String> {
    let mut names = Vec::new();
    for ((ranks, record), fate) in RUNS.iter().zip(fates) {
        match fate {
            Fate::Kept => {}
            Fate::Missing => names.extend(rank_files(ranks)),
            _ => names.push(record.to_string()),
        }
    }
    names
}

/// The TP 4 rank files of `--ranks ranks`.
fn rank_files(ranks: &str) -> Vec<String> {
    let (a, b) = ranks.split_once('-').unwrap_or((ranks, ranks));
    let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
    (a..=b)
        .map(|r| format!("model-rank-{r}-part-0.safetensors"))
        .collect()
}

/// What `inspect --json` and `load --dry-run --read` made of `dir`: (accepted, what they said).
fn verdicts(dir: &Path) -> [(bool, String); 2] {
    let i = run(&["inspect", s(dir), "--json"]);
    // Whatever the folder holds, stdout is one inspect (or error) document.
    let doc = json_doc(&["inspect"], &i);
    let inspect_ok = i.status.success() && doc["complete"] == true;
    let l = run(&["load", s(dir), "--dry-run", "--read"]);
    [
        (inspect_ok, format!("{}{}", stdout(&i), stderr(&i))),
        (l.status.success(), stderr(&l)),
    ]
}

/// Whether the case's folder is one complete output: every run of one plan, source and version,
/// its record readable (or, all records dropped, a folder of rank files checked by their names
/// and headers as vLLM's own). A record unreadable or dropped beside others, or runs of two plans,
/// sources or versions, make a folder that must be refused.
fn one_output(fates: &[Fate; 3]) -> bool {
    let uniform = fates.iter().all(|f| *f == fates[0]);
    // Truncated and Folder records are unreadable; OtherTp's runs cover ranks 0-3 of 8.
    uniform && !matches!(fates[0], Fate::Truncated | Fate::Folder | Fate::OtherTp)
}

/// Whether both accepted the case's folder; or why the case fails: the two disagree, a refusal
/// names no offender, or a folder that is one output is refused or one that is not is accepted.
fn check(fates: &[Fate; 3], dir: &Path) -> Result<bool, String> {
    let [(inspect_ok, inspect), (load_ok, load)] = verdicts(dir);
    let names = offenders(fates);
    let why = if inspect_ok != load_ok {
        "inspect and load disagree"
    } else if one_output(fates) && !load_ok {
        "one output is refused"
    } else if !one_output(fates) && load_ok {
        "a folder that is not one output is accepted"
    } else if !load_ok && !names.iter().any(|n| inspect.contains(n.as_str())) {
        "inspect names no offender"
    } else if !load_ok && !names.iter().any(|n| load.contains(n.as_str())) {
        "load names no offender"
    } else {
        return Ok(load_ok);
    };
    Err(format!(
        "{why}: {fates:?} (inspect accepts: {inspect_ok}, load accepts: {load_ok}; offenders {names:?})\n--- inspect:\n{inspect}\n--- load:\n{load}"
    ))
}

/// The first cases, before the random ones: folders that are one output (every run kept; every
/// record dropped; every run of the fine-tune or of float16), which random picks seldom make, and
/// runs of a checkpoint and its fine-tune with one tensor table, which must not merge.
const FIXED: [[Fate; 3]; 6] = [
    [Fate::Kept; 3],
    [Fate::Missing; 3],
    [Fate::OtherSource; 3],
    [Fate::OtherDtype; 3],
    [Fate::OtherVersion; 3],
    [Fate::Kept, Fate::Kept, Fate::OtherSource],
];

#[test]
fn run_records_copied_together_are_one_output_or_refused_by_both() {
    let work = TempDir::new().unwrap();
    let root = work.path().join("runs");
    shard_runs(&root);
    let mut rng = Rng::with_seed(SEED);
    let mut failures = Vec::new();
    let (mut accepted, mut refused) = (0, 0);
    for case in 0..CASES {
        let fates: [Fate; 3] = match FIXED.get(case) {
            Some(fates) => *fates,
            None => std::array::from_fn(|_| Fate::pick(&mut rng)),
        };
        let dir: PathBuf = work.path().join(format!("case-{case}"));
        gather(&root, &fates, &dir);
        match check(&fates, &dir) {
            Err(f) => failures.push(format!("case {case} (seed {SEED:#x}): {f}")),
            Ok(true) => accepted += 1,
            Ok(false) => refused += 1,
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {CASES} cases failed (folders kept in {}):\n{}",
        failures.len(),
        work.keep().display(),
        failures.join("\n\n")
    );
    assert!(
        accepted > 0 && refused > CASES / 2,
        "{accepted} accepted, {refused} refused"
    );
}
