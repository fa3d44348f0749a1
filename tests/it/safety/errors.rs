//! A corpus of broken checkpoints: each is a copy of the `llama_gqa` fixture with exactly one file
//! damaged. Every one must be refused with exit status 3 and an `error: …` message naming the
//! damaged file, never a panic or a backtrace (the tests run with `RUST_BACKTRACE=1` to prove it).

use std::fs;
use std::path::Path;

use serde_json::{Value, json};

use crate::support::*;

/// The shard the header cases damage: 4 BF16 tensors packed as
/// input_layernorm [0, 256), down_proj [256, 65792), post_attention_layernorm [65792, 66048),
/// model.norm [66048, 66304).
const SHARD: &str = "model-00006-of-00006.safetensors";

/// Runs `wload inspect` on the damaged copy, with backtraces asked for, and checks the refusal:
/// exit 3 naming `names` and saying `says` (in any case), and no backtrace.
fn assert_inspect_refused(dir: &Path, names: &str, says: &str) {
    let out = wload()
        .args(["inspect", s(dir)])
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .output()
        .expect("wload runs");
    let stderr = assert_refusal_text(&out, 3, &[names]);
    let context = context(&out);
    assert!(
        stderr.to_lowercase().contains(&says.to_lowercase()),
        "should say {says:?}; {context}"
    );
    assert!(!stderr.to_lowercase().contains("backtrace"), "{context}");
}

/// One test per damaged checkpoint: `case!(name, file named in the error, words in the error,
/// |dir| damage)`.
macro_rules! case {
    ($(#[$meta:meta])* $name:ident, $names:expr, $says:expr, |$dir:ident| $damage:expr) => {
        #[test]
        $(#[$meta])*
        fn $name() {
            let tmp = copy_fixture("llama_gqa");
            let $dir: &Path = tmp.path();
            $damage;
            assert_inspect_refused($dir, $names, $says);
        }
    };
}

fn shard(dir: &Path) -> std::path::PathBuf {
    dir.join(SHARD)
}

fn bytes(dir: &Path) -> Vec<u8> {
    fs::read(shard(dir)).unwrap()
}

fn set_offsets(h: &mut serde_json::Map<String, Value>, tensor: &str, start: u64, end: u64) {
    h[tensor]["data_offsets"] = json!([start, end]);
}

/// Replaces the 8-byte header length, keeping everything else.
fn set_header_len(dir: &Path, len: u64) {
    let mut b = bytes(dir);
    b[..8].copy_from_slice(&len.to_le_bytes());
    write_raw(&shard(dir), &b);
}

const LN0: &str = "model.layers.1.input_layernorm.weight";
const LN1: &str = "model.layers.1.post_attention_layernorm.weight";
const NORM: &str = "model.norm.weight";

case!(truncated_data, SHARD, "truncated", |d| {
    let b = bytes(d);
    write_raw(&shard(d), &b[..b.len() - 100]);
});

case!(header_length_past_end_of_file, SHARD, "past the end", |d| {
    let size = bytes(d).len() as u64;
    set_header_len(d, size);
});

case!(header_length_over_100mb, SHARD, "limit", |d| {
    set_header_len(d, 100_000_001);
});

case!(header_length_u64_max, SHARD, "limit", |d| {
    set_header_len(d, u64::MAX);
});

case!(header_not_json, SHARD, "JSON", |d| {
    let mut raw = RawFile::read(&shard(d));
    let n = raw.header_text.len();
    raw.header_text = b"{\"model.norm.weight\": {\"dtype\": ".to_vec();
    raw.header_text.resize(n, b' ');
    raw.write(&shard(d));
});

case!(header_not_an_object, SHARD, "JSON", |d| {
    let mut raw = RawFile::read(&shard(d));
    raw.header_text = b"[1, 2, 3]".to_vec();
    raw.write(&shard(d));
});

case!(zero_length_header, SHARD, "JSON", |d| {
    write_raw(&shard(d), &0u64.to_le_bytes());
});

case!(unknown_dtype, SHARD, "Q7", |d| {
    edit_header(&shard(d), |h| h[NORM]["dtype"] = json!("Q7"));
});

case!(tensor_without_data_offsets, SHARD, "data_offsets", |d| {
    edit_header(&shard(d), |h| {
        h[NORM].as_object_mut().unwrap().remove("data_offsets");
    });
});

case!(negative_shape, SHARD, NORM, |d| {
    edit_header(&shard(d), |h| h[NORM]["shape"] = json!([-128]));
});

case!(overlapping_offsets, SHARD, "overlap", |d| {
    // post_attention_layernorm moved 2 bytes back, into down_proj; same size.
    edit_header(&shard(d), |h| set_offsets(h, LN1, 65790, 66046));
});

case!(offsets_past_end_of_data, SHARD, "past the end", |d| {
    edit_header(&shard(d), |h| set_offsets(h, NORM, 66304, 66560));
});

case!(
    // Regression: offsets near u64::MAX once overflowed `data_start + start`.
    offsets_near_u64_max,
    SHARD,
    "past the end",
    |d| {
        edit_header(&shard(d), |h| {
            h[NORM] = json!({"dtype": "U8", "shape": [1],
                             "data_offsets": [u64::MAX - 1, u64::MAX]});
        })
    }
);

case!(shape_does_not_match_offsets, SHARD, "needs", |d| {
    edit_header(&shard(d), |h| h[NORM]["shape"] = json!([129]));
});

case!(dtype_does_not_match_offsets, SHARD, "needs", |d| {
    edit_header(&shard(d), |h| h[NORM]["dtype"] = json!("F32"));
});

case!(empty_file, SHARD, "empty", |d| {
    write_raw(&shard(d), b"");
});

case!(five_byte_file, SHARD, "too short", |d| {
    write_raw(&shard(d), b"\x10\x00\x00\x00\x00");
});

case!(header_not_utf8, SHARD, "UTF-8", |d| {
    let mut raw = RawFile::read(&shard(d));
    // Inside the first tensor name, so the header is still well-formed JSON apart from the byte.
    let at = raw
        .header_text
        .windows(5)
        .position(|w| w == b"model")
        .unwrap();
    raw.header_text[at] = 0xFF;
    raw.write(&shard(d));
});

case!(reversed_offsets, SHARD, "end before start", |d| {
    edit_header(&shard(d), |h| set_offsets(h, LN0, 256, 0));
});

case!(gap_between_tensors, SHARD, "gap", |d| {
    // model.norm shifted 2 bytes later and the file grown by 2: everything fits but a hole.
    edit_header(&shard(d), |h| set_offsets(h, NORM, 66050, 66306));
    let mut b = bytes(d);
    b.extend_from_slice(&[0, 0]);
    write_raw(&shard(d), &b);
});

case!(trailing_bytes, SHARD, "trailing", |d| {
    let mut b = bytes(d);
    b.extend_from_slice(b"junk");
    write_raw(&shard(d), &b);
});

case!(duplicate_key_in_header, SHARD, "twice", |d| {
    let mut raw = RawFile::read(&shard(d));
    let text = String::from_utf8(raw.header_text.clone()).unwrap();
    let entry = serde_json::to_string(&raw.header()[NORM]).unwrap();
    raw.header_text = format!("{{\"{NORM}\":{entry},{}", &text[1..]).into_bytes();
    raw.write(&shard(d));
});

/// No config.json: `inspect` still lists the weight files vLLM would select, every tensor and the
/// totals, says the config is missing, and exits 3 with the refusal plan gives; `--json` is that
/// listing with `"ok": false`. plan and shard refuse with nothing on stdout.
#[test]
fn missing_config_json() {
    let tmp = copy_fixture("llama_gqa");
    let d = tmp.path();
    fs::remove_file(d.join("config.json")).unwrap();
    let out = wload()
        .args(["inspect", s(d)])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let want = format!(
        "error: {}: no config.json; vLLM needs the model's config to build it\n",
        s(d)
    );
    assert_eq!(out.status.code(), Some(3), "{}", context(&out));
    assert_eq!(stderr(&out), want);
    let human = stdout(&out);
    for needle in [
        "config  none: no model, structure or support verdict (",
        "\nfiles (6 read)\n",
        "\ntensors (21)\n",
        "model.layers.1.post_attention_layernorm.weight",
        "\ntotals\n",
        "  all         21     551,552  1.1 MiB",
    ] {
        assert!(human.contains(needle), "{needle:?} in {human}");
    }
    assert!(!human.contains("\nstructure"), "{human}");

    let out = run(&["inspect", s(d), "--json", "--filter", "norm"]);
    assert_eq!(out.status.code(), Some(3), "{}", context(&out));
    let v: Value = json_doc(&["inspect"], &out);
    assert_eq!(
        (v["ok"].clone(), v["exit_status"].clone()),
        (json!(false), json!(3))
    );
    assert_eq!(v["error"]["kind"], "checkpoint");
    assert_eq!(v["kind"], "no-config");
    assert_eq!(v["files"].as_array().unwrap().len(), 6);
    assert_eq!(v["totals"]["tensors"], 5, "the filter applies: {v:#}");
    assert!(v["note"].as_str().unwrap().contains("no config.json"));

    for cmd in [
        &["plan", s(d), "--tp", "2"][..],
        &["shard", s(d), "--tp", "2", "-o", "x"],
    ] {
        assert_refusal_text(&run(cmd), 3, &["no config.json"]);
    }
}

case!(config_json_not_json, "config.json", "JSON", |d| {
    write_raw(&d.join("config.json"), b"{\"hidden_size\": 128,");
});

case!(config_json_not_an_object, "config.json", "object", |d| {
    write_raw(&d.join("config.json"), b"[\"LlamaForCausalLM\"]");
});

case!(
    config_json_missing_hidden_size,
    "config.json",
    "hidden_size",
    |d| {
        let p = d.join("config.json");
        let mut v: Value = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("hidden_size");
        write_json(&p, &v);
    }
);

case!(
    config_json_hidden_size_a_string,
    "config.json",
    "hidden_size",
    |d| {
        let p = d.join("config.json");
        let mut v: Value = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
        v["hidden_size"] = json!("128");
        write_json(&p, &v);
    }
);

case!(
    index_not_json,
    "model.safetensors.index.json",
    "JSON",
    |d| {
        write_raw(
            &d.join("model.safetensors.index.json"),
            b"{\"weight_map\": ",
        );
    }
);

case!(
    index_without_weight_map,
    "model.safetensors.index.json",
    "weight_map",
    |d| {
        write_json(
            &d.join("model.safetensors.index.json"),
            &json!({"metadata": {"total_size": 0}}),
        );
    }
);

case!(
    index_with_non_string_file,
    "model.safetensors.index.json",
    NORM,
    |d| {
        let p = d.join("model.safetensors.index.json");
        let mut v: Value = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
        v["weight_map"][NORM] = json!(6);
        write_json(&p, &v);
    }
);

/// The same checks for a file that is not in the index-driven layout: a lone damaged
/// `model.safetensors` next to a valid config.
#[test]
fn damaged_single_file_checkpoint() {
    let tmp = tiny_checkpoint();
    let p = tmp.path().join("model.safetensors");
    let b = fs::read(&p).unwrap();
    write_raw(&p, &b[..b.len() - 1]);
    assert_inspect_refused(tmp.path(), "model.safetensors", "truncated");
}

/// Two damaged shards: both must be named, and the same way on every run.
///
/// Regression: headers read in parallel once reported only whichever damaged file a thread hit
/// first. Every bad file is reported, in load order, on every run.
#[test]
fn every_damaged_file_is_reported() {
    let tmp = copy_fixture("llama_gqa");
    let first = "model-00001-of-00006.safetensors";
    write_raw(&tmp.path().join(first), b"");
    write_raw(&shard(tmp.path()), b"");
    for _ in 0..5 {
        assert_inspect_refused(tmp.path(), first, "empty");
        assert_inspect_refused(tmp.path(), SHARD, "empty");
    }
}
