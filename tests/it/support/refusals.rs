//! Refusals as reviewed snapshots (insta, `tests/it/snapshots/refusals/`): the whole message a
//! user reads — the file, tensor, rule and shapes it names and the fix it gives — not only the
//! fragments a test looks for, so that a change anywhere in it shows as a `.snap` diff to review.
//! Snapshots are named by the test (`commands__folders__…`, `-2` for its second refusal).

use std::collections::HashMap;
use std::process::Output;
use std::sync::Mutex;

use super::{assert_refused, manifest_dir};

/// The filters every snapshot applies: the checkout's and the temp folder's paths, timings,
/// rates, shard's page-cache-dependent read choice, the version, the test hubs' ports and the
/// disk's free space.
pub(crate) fn snapshot_filters() -> Vec<(String, String)> {
    let root = manifest_dir().display().to_string();
    let tmp = std::env::temp_dir().display().to_string();
    [
        (regex_escape(&root), "[ROOT]"),
        (
            format!(r"{}/\.tmp[A-Za-z0-9]+", regex_escape(&tmp)),
            "[TMP]",
        ),
        (r"\b\d+(\.\d+)? ?(ns|µs|us|ms|s)\b".into(), "[TIME]"),
        (r"\b\d+(\.\d+)? ?[KMGT]i?B/s\b".into(), "[RATE]"),
        // How shard chose to read depends on the page cache at the time.
        (r"(?m)^read: io .*$".into(), "read: [IO CHOICE]"),
        (
            r#""wload_version": "[^"]*""#.into(),
            r#""wload_version": "[VERSION]""#,
        ),
        // The tests' local hub servers listen on a port the system picks.
        (r"127\.0\.0\.1:\d+".into(), "127.0.0.1:[PORT]"),
        // Free space on this machine's disk.
        (r"has \d+ free".into(), "has [FREE] free"),
        (r"\b\d+(\.\d+)? [KMGT]iB was free".into(), "[FREE] was free"),
    ]
    .into_iter()
    .map(|(a, b)| (a, b.to_string()))
    .collect()
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$#&-~".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// How many refusals each test has snapshotted so far (tests run on threads named after them).
static SEEN: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

/// [`assert_refused`], and the whole stderr checked against the test's next refusal snapshot.
pub(crate) fn assert_refusal_text(out: &Output, code: i32, needles: &[&str]) -> String {
    let err = assert_refused(out, code, needles);
    let test = std::thread::current()
        .name()
        .expect("a refusal snapshot is taken on the test's own thread")
        .to_string();
    let n = {
        let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        let count = seen.get_or_insert_with(HashMap::new).entry(test.clone());
        let n = count.or_insert(0);
        *n += 1;
        *n
    };
    let mut name = test.replace("::", "__");
    if n > 1 {
        name.push_str(&format!("-{n}"));
    }
    let filters = snapshot_filters();
    let filters: Vec<(&str, &str)> = filters
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    insta::with_settings!({
        filters => filters,
        snapshot_path => "../snapshots/refusals",
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(name, format!("exit: {code}\n{err}"));
    });
    err
}
