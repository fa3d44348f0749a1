//! The serve line of a folder sharded from a hub repo: it keeps the repo's name for clients
//! (`--served-model-name`), and a repo's tokenizer is copied so that vLLM loads it from the folder.

use tempfile::TempDir;

use super::*;

/// Sharded from `acme/llama-gqa` with a tokenizer in the repo: the line serves the folder under
/// the repo's name, without `--skip-tokenizer-init`, and `wload.json` records repo and commit.
#[test]
fn a_hub_source_is_served_under_its_repo_name() {
    let mut repo = llama_repo();
    repo.files
        .insert("tokenizer.json".into(), br#"{"version":"1.0"}"#.to_vec());
    let hub = Hub::start(one_repo(REPO, repo));
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = run(
        &mut wload_hub(Some(&hub), &work.path().join("home")),
        &["shard", REPO, "--tp", "2", "-o", s(&out), "-q"],
    );
    assert!(o.status.success(), "{}", context(&o));
    let line = stdout(&o);
    assert!(
        line.trim_end()
            .ends_with(&format!("--served-model-name {REPO}")),
        "{line}"
    );
    assert!(!line.contains("--skip-tokenizer-init"), "{line}");
    assert!(out.join("tokenizer.json").is_file());
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("wload.json")).unwrap()).unwrap();
    assert_eq!(m["source_repo"], REPO, "{m:#}");
    assert_eq!(m["source_commit"], SHA, "{m:#}");
    let i = crate::support::wload_json(&["inspect", s(&out), "--json"]);
    assert_eq!(i["serve"]["shell"].as_str().unwrap(), line.trim_end());
}
