//! The shard output loads, and loading the checkpoint gives the same bytes.

use super::*;

// ---------------------------------------------------------------------------------------------
// 5. The shard output loads, and loading the checkpoint gives the same bytes
// ---------------------------------------------------------------------------------------------

/// `wload load ARGS…` without launcher variables (which would pick ranks).
fn load(args: &[&str]) -> std::process::Output {
    let mut cmd = wload();
    for v in LAUNCHER_VARS {
        cmd.env_remove(v);
    }
    cmd.arg("load").args(args).output().expect("wload runs")
}

/// A folder `shard` wrote passes `load --dry-run --read` (keys, shapes, every byte against
/// wload.json), and loading the FP8 checkpoint itself into host memory gives, per rank, exactly the
/// tensors and bytes of that folder.
#[test]
fn fp8_shards_load_and_match_loading_the_checkpoint() {
    let ep: &[&str] = &["--enable-expert-parallel"];
    for (name, tp, flags) in [
        ("llama_gqa_fp8_tensor", 4, &[][..]),
        ("llama_gqa_ct_fp8_dynamic", 8, &[]),
        ("llama_gqa_fp8_block", 1, &[]),
        ("qwen3_moe_fp8_block", 2, ep),
    ] {
        let tmp = TempDir::new().unwrap();
        let out = tmp.path().join("out");
        shard_ok(&fixture(name), tp, &out, &[&["-q"], flags].concat());
        let tps = tp.to_string();
        let mut dry_args = vec![s(&out), "--tp", &tps, "--dry-run", "--read", "-q"];
        dry_args.extend_from_slice(flags);
        let dry = load(&dry_args);
        assert!(dry.status.success(), "{name} tp {tp}: {}", context(&dry));

        let src = fixture(name);
        let mut args = vec![
            s(&src),
            "--tp",
            &tps,
            "--device",
            "cpu",
            "--checksums",
            "--json",
        ];
        args.extend_from_slice(flags);
        let o = load(&args);
        assert!(o.status.success(), "{name} tp {tp}: {}", context(&o));
        let report: Value = json_doc(&["load"], &o);
        let ranks = report["ranks"].as_array().expect("ranks");
        assert_eq!(ranks.len() as u64, tp, "{name} tp {tp}: ranks loaded");
        for rank in ranks {
            let r = rank["rank"].as_u64().expect("rank number");
            let got: BTreeMap<String, (String, Vec<u64>, String)> = rank["checksums"]
                .as_array()
                .expect("checksums")
                .iter()
                .map(|t| {
                    let (n, d, sh) = json_tensor(t);
                    (n, (d, sh, t["xxh3"].as_str().expect("xxh3").to_string()))
                })
                .collect();
            let want: BTreeMap<String, (String, Vec<u64>, String)> = rank_tensors(&out, r)
                .into_iter()
                .map(|(n, t)| (n, (t.dtype, t.shape, format!("{:016x}", xxh3_64(&t.data)))))
                .collect();
            assert_eq!(got, want, "{name} tp {tp} rank {r}: loaded vs sharded");
        }
    }
}
