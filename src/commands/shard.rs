//! `wload shard`: per-rank files that vLLM's `--load-format sharded_state` reads, built in a
//! temporary sibling folder and renamed into place only when complete (and verified).

mod error;
pub(crate) mod output;
mod serve_line;
mod side;
mod space;

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::Serialize;

pub(crate) use error::ShardError;
use output::Publish;
use serde_json::Value;

use crate::commands::error::Error;
use crate::exec::parts::{self, PartFile};
use crate::exec::{Control, ExecError, convert, verify, write};
use crate::open::Opened;
use crate::plan::Plan;
use crate::progress::{Progress, Quiet};
use crate::sharded::manifest::{Manifest, ManifestFile};
use crate::sharded::serve::is_tokenizer_file;

#[derive(Debug, Clone)]
pub struct ShardOptions {
    pub out: PathBuf,
    pub max_part_size: u64,
    /// Ranks to write; all when `None`.
    pub ranks: Option<crate::ranks::RankList>,
    /// Where `ranks` came from when a launcher gave them (`--ranks launcher`): the launcher and
    /// its variables, for the report.
    pub ranks_from: Option<String>,
    pub force: bool,
    pub verify: bool,
    /// How to read the source, and whether to evict it from the page cache first (as `load`).
    pub io: crate::exec::source::IoMode,
    pub cold: bool,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ShardReport {
    pub out: String,
    pub manifest: Manifest,
    pub bytes: u64,
    pub side_files: Vec<String>,
    /// Entries of the source left out of the side files, though vLLM's example script would
    /// copy them, with why: earlier wload outputs and staging folders inside the checkpoint,
    /// weights of other formats, the source's weight index.
    pub skipped_side_files: Vec<side::Skipped>,
    /// What wload changed in config.json (`key: before → after (why)`): empty when it was copied
    /// unchanged, `None` when the source has none (Mistral-native: params.json is a side file).
    pub config_changes: Option<Vec<String>>,
    pub verified: bool,
    /// `--ranks launcher`: which launcher's variables gave the ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks_from: Option<String>,
    /// A `--ranks` run that found the other runs' records and completed OUT: it wrote the
    /// merged `wload.json` ([`crate::sharded::runs`]).
    pub completed: bool,
    /// What the output lacks that serving may want (no tokenizer), each with what to do.
    pub warnings: Vec<String>,
    /// Leftover staging folders of dead runs that this run removed.
    pub removed_leftovers: Vec<output::Swept>,
    pub timings: ShardTimings,
    /// How the source was read (`--io`), and its page-cache residency as writing started.
    pub io: crate::exec::io_choice::IoChoice,
    pub source_cache: crate::exec::io_choice::SourceCache,
}

#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
pub struct ShardTimings {
    #[serde(flatten)]
    pub open: crate::open::Timings,
    pub write_s: f64,
    pub side_files_s: f64,
    /// Checksums for the manifest: the seconds they added after the last write (blocks are
    /// hashed as they are written), and the seconds the writing threads spent on them, summed
    /// (on a busy machine that includes time they waited for a core).
    pub hash_s: f64,
    pub hash_busy_s: f64,
    pub verify_s: f64,
}

/// Checks OUT and `--ranks` before any work is done: see [`output`] for what OUT may be.
pub fn precheck(
    opts: &ShardOptions,
    world: crate::ranks::World,
    source: &Path,
) -> Result<(), ShardError> {
    if let Some(list) = &opts.ranks {
        list.check(world)?;
    }
    let never = AtomicBool::new(false);
    match output::Bucket::of(opts, &never)? {
        Some(bucket) => bucket.check(opts.force, source).map(drop),
        None => output::Folder { out: &opts.out }
            .check(opts.force, source)
            .map(drop),
    }
}

/// Writes the shards. `progress` is built once the total size is known.
pub fn shard(
    opened: &Opened,
    plan: Plan,
    opts: &ShardOptions,
    cancel: &AtomicBool,
    progress: &dyn Fn(u64) -> Box<dyn Progress>,
) -> Result<ShardReport, Error> {
    match output::Bucket::of(opts, cancel)? {
        Some(bucket) => shard_into(&bucket, opened, plan, opts, cancel, progress),
        None => shard_into(
            &output::Folder { out: &opts.out },
            opened,
            plan,
            opts,
            cancel,
            progress,
        ),
    }
}

/// [`shard`] into one destination: checked, staged, written, published.
fn shard_into<P: Publish>(
    dest: &P,
    opened: &Opened,
    plan: Plan,
    opts: &ShardOptions,
    cancel: &AtomicBool,
    progress: &dyn Fn(u64) -> Box<dyn Progress>,
) -> Result<ShardReport, Error> {
    (opts.ranks.as_ref()).map_or(Ok(()), |l| l.check(plan.world()).map_err(ShardError::from))?;
    let target = dest.check(opts.force, &opened.resolved.root)?;
    // The plan has checked that --tp and --pp fit the model, so this list is bounded.
    let ranks = match &opts.ranks {
        Some(list) => list.resolve(plan.world()).map_err(ShardError::from)?,
        None => (0..plan.world_size()).collect(),
    };
    let removed_leftovers = dest.sweep();
    let root = &opened.resolved.root;
    let mut timings = ShardTimings {
        open: opened.timings,
        ..Default::default()
    };

    let plan = resolve_tying(plan, root)?;

    let files: Vec<PartFile> = plan
        .ranks
        .iter()
        .filter(|r| ranks.contains(&r.rank))
        .flat_map(|r| parts::layout(r, Some(opts.max_part_size), plan.pp > 1))
        .collect();
    let total: u64 = files.iter().map(|f| f.size).sum();
    let side = side::list(root, &opts.out)?;
    let need = space_needed(root, (total, files.len() as u64), &side);
    let (staging, space) = dest.stage(&target, need)?;
    let tmp = staging.path();
    let published = |e: ShardError| e.named_in_out(tmp, &opts.out, Some(&space));

    let (source_cache, io) = source_io(&plan, root, opts)?;
    let t = Instant::now();
    let bar = progress(total);
    let exec = crate::exec::ExecOptions {
        io: io.used,
        ..crate::exec::ExecOptions::for_run()
    };
    let written = write::write_parts(
        &plan,
        root,
        tmp,
        &files,
        &Control::new(cancel, bar.as_ref()).with_options(exec),
    )
    .map_err(|e| published(ShardError::from(e)))?;
    timings.write_s = t.elapsed().as_secs_f64() - written.hash_tail_s;
    timings.hash_s = written.hash_tail_s;
    timings.hash_busy_s = written.hash_busy_s;
    let hashes = written.hashes;

    let t = Instant::now();
    side.copy(root, tmp, cancel).map_err(published)?;
    let config_changes = write_config(root, opened, tmp, &plan).map_err(published)?;
    timings.side_files_s = t.elapsed().as_secs_f64();

    #[cfg(feature = "test-hooks")]
    if let Some(fault) = std::env::var_os("WLOAD_TEST_FLIP_BYTE") {
        flip_byte_for_tests(tmp, &fault.to_string_lossy());
    }
    if opts.verify {
        let t = Instant::now();
        verify::verify_parts(&plan, root, tmp, &files, &Control::new(cancel, &Quiet))
            .map_err(|e| published(ShardError::from(e)))?;
        timings.verify_s = t.elapsed().as_secs_f64();
    }
    if cancel.load(Ordering::Relaxed) {
        return Err(published(ShardError::Exec(ExecError::Cancelled)).into());
    }
    let config = config_changes.is_some().then(|| "config.json".to_string());
    let mut manifest = manifest_for(root, &plan, opts, &ranks, &files, hashes, (&side, config));
    record_config(&mut manifest, &config_changes, &opened.resolved.config_file);
    record_run(tmp, &mut manifest, (&plan, opened), opts).map_err(published)?;

    let completed = dest.publish(staging, &target)?;
    Ok(ShardReport {
        warnings: warnings(&plan, &manifest, opened),
        out: opts.out.display().to_string(),
        bytes: total,
        manifest,
        side_files: side.names(),
        skipped_side_files: side.skipped,
        config_changes,
        verified: opts.verify,
        ranks_from: opts.ranks_from.clone(),
        completed,
        removed_leftovers,
        timings,
        io,
        source_cache,
    })
}

/// What the run writes where the output is staged, as bytes and files: the part files, the side
/// files, config.json and the manifest (estimated generously), checked before anything is
/// written there.
fn space_needed(
    root: &Path,
    (parts, part_files): (u64, u64),
    side: &side::SideFiles,
) -> (u64, u64) {
    let config = fs::metadata(root.join("config.json")).map_or(0, |m| m.len());
    // An untied config.json grows by a few bytes; a manifest entry is under 512 bytes.
    let small = config + 4096 + 512 * (part_files + side.count());
    let bytes = parts.saturating_add(side.bytes).saturating_add(small);
    // The part files, the side files and folders, config.json, wload.json, the owner record.
    let count = part_files + side.count() + 3;
    (bytes, count)
}

/// `--cold` and `--io`, as `load` does them (see [`crate::exec::io_choice::prepare`]).
fn source_io(
    plan: &Plan,
    root: &Path,
    opts: &ShardOptions,
) -> Result<
    (
        crate::exec::io_choice::SourceCache,
        crate::exec::io_choice::IoChoice,
    ),
    ShardError,
> {
    use crate::exec::source::IoMode;
    let paths = crate::exec::source_files(plan, root);
    let (cache, mut io) = crate::exec::io_choice::prepare(&paths, opts.io, opts.cold)
        .map_err(|e| ShardError::Exec(ExecError::from(e)))?;
    // Measured cold on the 3.85 GB checkpoint at --tp 8: buffered (file-to-file copies) wrote in
    // 7.7 s with a 45 MiB peak, direct in 9.7 s with 226 MiB; so `auto` stays buffered here.
    if io.requested == IoMode::Auto && io.used == IoMode::Direct {
        io.used = IoMode::Buffered;
        io.why = format!(
            "{}; but shard copies file to file through the page cache, faster than direct reads, so buffered",
            io.why
        );
    }
    Ok((cache, io))
}

/// vLLM loads lm_head and the embedding both and re-ties them only if they are equal
/// (weight_tying.py:73–99): the plan says which two to compare; when equal, each rank keeps one
/// tensor under the tied name.
fn resolve_tying(mut plan: Plan, root: &Path) -> Result<Plan, ShardError> {
    let Some(rt) = plan.retie.take() else {
        return Ok(plan);
    };
    let equal = tensors_equal(&plan, root, &rt.compare[0], &rt.compare[1], plan.dtype)?;
    if !equal {
        return Ok(plan);
    }
    for r in &mut plan.ranks {
        let a = r.tensors.iter().position(|t| t.name == rt.compare[0]);
        let b = r.tensors.iter().position(|t| t.name == rt.compare[1]);
        if let (Some(a), Some(b)) = (a, b) {
            let (first, second) = (a.min(b), a.max(b));
            r.tensors[first].name = rt.keep.clone();
            r.tensors[first].pieces = r.tensors[a].pieces.clone();
            r.tensors.remove(second);
            r.bytes = r.tensors.iter().map(|t| t.bytes).sum();
        }
    }
    plan.tie_word_embeddings = true;
    Ok(plan)
}

fn manifest_for(
    root: &Path,
    plan: &Plan,
    opts: &ShardOptions,
    ranks: &[u64],
    files: &[PartFile],
    hashes: Vec<String>,
    (side, config): (&side::SideFiles, Option<String>),
) -> Manifest {
    Manifest {
        wload_version: env!("CARGO_PKG_VERSION").into(),
        format: if plan.pp > 1 {
            "vllm-sharded-state (vLLM 0.33, model-pp-{pp}-tp-{tp}-part-{part}.safetensors)".into()
        } else {
            "vllm-sharded-state (vLLM 0.33, model-rank-{rank}-part-{part}.safetensors)".into()
        },
        // As the user named it, made absolute: a link's own path, not where it points today
        // (the link is what they will name again).
        source: std::path::absolute(root)
            .unwrap_or_else(|_| root.to_path_buf())
            .display()
            .to_string(),
        architecture: plan.architecture.clone(),
        family: plan.family.clone(),
        tp: plan.tp,
        pp: plan.pp,
        ranks: ranks.to_vec(),
        expert_parallel: plan.expert_parallel,
        dtype: plan.dtype.to_string(),
        max_part_size: opts.max_part_size,
        tie_word_embeddings: plan.tie_word_embeddings,
        files: files
            .iter()
            .zip(hashes)
            .map(|(f, h)| ManifestFile {
                name: f.name.clone(),
                rank: f.rank,
                pp_rank: (plan.pp > 1).then(|| f.rank / plan.tp),
                tp_rank: (plan.pp > 1).then(|| f.rank % plan.tp),
                part: f.part,
                size: f.size,
                xxh3_64k: Some(h),
                xxh3: None,
            })
            .collect(),
        side_files: Some(side.names().into_iter().chain(config).collect()),
        side_tree: side.tree(),
        config_changes: None,
        serve: None,
        moe_backend: plan.moe_backend.map(str::to_string),
        language_model_only: plan.language_model_only,
        mm_encoder_tp_mode: plan.mm_encoder_tp_mode.map(str::to_string),
        module_tree: plan.module_tree.clone(),
        replicate_embed: plan.replicate_embed,
        config_format: None,
        pp_layer_partition: partition(plan),
        hf_overrides: None,
        source_repo: None,
        source_commit: None,
        source_id: None,
        source_data: None,
        computed: plan.computed(),
        vllm_versions: Some(crate::sharded::manifest::VLLM_VERSIONS.into()),
        records: Vec::new(),
    }
}

/// The plan's stage split as `VLLM_PP_LAYER_PARTITION` counts, when it is not vLLM's even split
/// (so vLLM must be started with it).
fn partition(plan: &Plan) -> Option<String> {
    let layers = plan.stages.last()?.end_layer;
    let even = crate::ranks::stages::split_layers(layers, plan.pp, None).ok();
    if plan.pp <= 1 || even.as_deref() == Some(&plan.stages[..]) {
        return None;
    }
    let counts: Vec<String> = (plan.stages.iter())
        .map(|s| (s.end_layer - s.first_layer).to_string())
        .collect();
    Some(counts.join(","))
}

/// What the manifest says of the config: wload's changes to config.json, and `mistral` when the
/// files were planned from params.json (vLLM must read it again, even beside a copied
/// config.json: `--config-format mistral`).
fn record_config(m: &mut Manifest, changes: &Option<Vec<String>>, config_file: &str) {
    m.config_changes = changes.clone().filter(|c| !c.is_empty());
    m.config_format = (config_file != "config.json").then(|| "mistral".into());
}

/// vLLM's warnings for the plan; then, with no tokenizer, that the serve line's
/// `--skip-tokenizer-init` ([`crate::sharded::serve`]) serves token ids only.
fn warnings(plan: &Plan, m: &Manifest, opened: &Opened) -> Vec<String> {
    let mut out = plan.warnings.clone();
    let side = m.side_files.as_deref().unwrap_or_default();
    if side.iter().any(|f| is_tokenizer_file(f)) {
        return out;
    }
    let instead = match &opened.resolved.remote {
        Some(r) => format!("--tokenizer {}", r.repo),
        None => "--tokenizer ORG/NAME (the model's hub repo)".into(),
    };
    out.push(format!(
        "{} has no tokenizer (tokenizer.json, tokenizer.model, tekken.json, vocab.json, …): the serve line passes --skip-tokenizer-init, so vLLM starts but takes token ids, not text; to serve text, copy the model's tokenizer files into the output folder (`wload inspect` then prints the line without the flag), or serve with {instead} instead",
        opened.resolved.root.display()
    ));
    out
}

/// Where the source came from, as the serve line and merging runs need it: the hub repo (the
/// name clients send) and identities of its tensor table and its data that hold wherever a copy
/// of the checkpoint lies ([`crate::sharded::source`]).
fn record_source(m: &mut Manifest, opened: &Opened) -> Result<(), ShardError> {
    use crate::sharded::source;
    if let Some(remote) = &opened.resolved.remote {
        m.source_repo = Some(remote.repo.clone());
        m.source_commit = Some(remote.commit.clone());
    }
    m.hf_overrides = opened.config.overrides.clone();
    m.source_id = Some(source::table_id(&opened.checkpoint));
    let data = source::data_id(&opened.checkpoint, &opened.config.file_bytes);
    let root = &opened.resolved.root;
    m.source_data = Some(data.map_err(|e| ShardError::io("sampling the data of", root, e))?);
    Ok(())
}

/// The run's record, completed with the source and the serve line, written into `tmp` as
/// `wload.json`, or for a `--ranks` run as `wload-ranks-*.json` ([`crate::sharded::runs`]).
fn record_run(
    tmp: &Path,
    manifest: &mut Manifest,
    (plan, opened): (&Plan, &Opened),
    opts: &ShardOptions,
) -> Result<(), ShardError> {
    record_source(manifest, opened)?;
    let serve = serve_line::serve_command(&opts.out, manifest, plan, &opened.config);
    let record = crate::sharded::runs::record_name(&manifest.ranks, plan.world_size());
    // A `--ranks` run into a local folder: its files are served from wherever the runs' files
    // are copied together, which this machine's path is not; `wload inspect` of that folder
    // gives the line. A store's URL is the same for every run.
    let partial = (manifest.ranks.len() as u64) < plan.world_size();
    let local = !crate::resolve::store::url::looks_like_url(&opts.out.to_string_lossy());
    manifest.serve = (!(partial && local)).then(|| serve.clone());
    write_manifest(&tmp.join(record), manifest)?;
    // The report still says how this machine's folder would be served.
    manifest.serve = Some(serve);
    Ok(())
}

/// A run record at `path`.
fn write_manifest(path: &Path, manifest: &Manifest) -> Result<(), ShardError> {
    fs::write(path, manifest.to_json()).map_err(|e| ShardError::io("writing", path, e))
}

/// config.json as vLLM needs it: the bytes planned from, unchanged (not the file read again: it
/// may have changed since), except that when lm_head stays a tensor of its own,
/// `tie_word_embeddings` must say false (the sharded loader builds the module tree from it),
/// and the quantization method may need it to say more (GPTQ: its quantized modules, see
/// `quant/gptq/output_config.rs`). Returns the changes made (none: copied), or `None` without a config.json.
fn write_config(
    root: &Path,
    opened: &crate::open::Opened,
    tmp: &Path,
    plan: &Plan,
) -> Result<Option<Vec<String>>, ShardError> {
    let dst = tmp.join("config.json");
    if opened.resolved.config_file != "config.json" {
        // Mistral-native source: params.json was copied with the side files, and a config.json
        // beside it, not planned from, is copied like one.
        let src = root.join("config.json");
        if !src.exists() {
            return Ok(None);
        }
        side::copy_file(&src, &dst)?;
        return Ok(Some(Vec::new()));
    }
    let text = &opened.config.file_bytes;
    let mut cfg: Value = serde_json::from_slice(text).map_err(|e| {
        ShardError::io(
            "parsing",
            &root.join("config.json"),
            io::Error::new(io::ErrorKind::InvalidData, e),
        )
    })?;
    let says_tied = |v: &Value| v.get("tie_word_embeddings") == Some(&Value::Bool(true));
    let needs_untie = !plan.tie_word_embeddings
        && (says_tied(&cfg) || cfg.get("text_config").is_some_and(says_tied));
    let mut changes = Vec::new();
    if needs_untie {
        let why = "lm_head differs from the embedding: both are written, untied";
        changes.push(untie(&mut cfg, "tie_word_embeddings", why));
        if let Some(t) = cfg.get_mut("text_config").filter(|t| t.is_object()) {
            changes.push(untie(t, "text_config.tie_word_embeddings", why));
        }
    }
    // What the method needs the output's config to say (GPTQ: its quantized modules).
    if let (Some(q), Some(qc)) = (&plan.quantization, cfg.get_mut("quantization_config")) {
        changes.extend(q.output_config(qc, &|| plan.written()));
    }
    if !changes.is_empty() {
        let text = serde_json::to_string_pretty(&cfg).expect("config serialises") + "\n";
        fs::write(&dst, text).map_err(|e| ShardError::io("writing", &dst, e))?;
    } else {
        // The bytes already read, unchanged (and no copy_file_range: see `copy_through_memory`).
        fs::write(&dst, text).map_err(|e| ShardError::io("writing", &dst, e))?;
    }
    Ok(Some(changes))
}

/// Sets `tie_word_embeddings` of object `v` to false; says what it was, as `name: before →
/// false (why)`.
fn untie(v: &mut Value, name: &str, why: &str) -> String {
    let before = v
        .get("tie_word_embeddings")
        .map_or_else(|| "(absent)".to_string(), Value::to_string);
    v["tie_word_embeddings"] = Value::Bool(false);
    format!("{name}: {before} → false ({why})")
}

/// Whether two source tensors are equal once converted to the model dtype (torch.equal on the
/// loaded parameters).
fn tensors_equal(
    plan: &Plan,
    root: &Path,
    a: &str,
    b: &str,
    dtype: crate::dtype::Dtype,
) -> Result<bool, ShardError> {
    let find = |n: &str| plan.sources.iter().find(|s| &*s.name == n);
    let (Some(x), Some(y)) = (find(a), find(b)) else {
        return Ok(false);
    };
    if x.shape != y.shape {
        return Ok(false);
    }
    // The files planned from, unchanged before and after: the tying decision is part of the
    // output and must come from the same bytes as the rest of it.
    let open_planned = |s: &crate::plan::SourceTensor| -> Result<File, ShardError> {
        let path = root.join(&*s.file);
        let f = File::open(&path).map_err(|e| ShardError::io("reading", &path, e))?;
        crate::exec::still_planned(plan, s.file_index, &f, &path)?;
        Ok(f)
    };
    let (fx, fy) = (open_planned(x)?, open_planned(y)?);
    let equal =
        read_equal(x, &fx, y, &fy, dtype).map_err(|e| ShardError::io("reading", root, e))?;
    for (s, f) in [(x, &fx), (y, &fy)] {
        crate::exec::still_planned(plan, s.file_index, f, &root.join(&*s.file))?;
    }
    Ok(equal)
}

/// Whether sources `x` in `fx` and `y` in `fy` hold the same values in `dtype`.
fn read_equal(
    x: &crate::plan::SourceTensor,
    fx: &File,
    y: &crate::plan::SourceTensor,
    fy: &File,
    dtype: crate::dtype::Dtype,
) -> io::Result<bool> {
    let n: u64 = x.shape.iter().product();
    let step = 1 << 20;
    let (mut bx, mut by, mut cx, mut cy) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut at = 0;
    while at < n {
        let k = step.min(n - at);
        for (s, f, buf, conv) in [(x, fx, &mut bx, &mut cx), (y, fy, &mut by, &mut cy)] {
            let isz = s.dtype.bits() / 8;
            buf.resize((k * isz) as usize, 0);
            f.read_exact_at(buf, s.offset + at * isz)?;
            conv.clear();
            convert::convert_into(s.dtype, dtype, buf, conv);
        }
        if cx != cy {
            return Ok(false);
        }
        at += k;
    }
    Ok(true)
}

/// Test hook (`WLOAD_TEST_FLIP_BYTE=FILE:OFFSET`): corrupts one byte after writing, so tests can
/// prove that --verify catches it. Only in builds with the `test-hooks` feature, which the tests
/// enable and `cargo build --release` / `cargo install` never do (see src/exec/hooks.rs).
#[cfg(feature = "test-hooks")]
fn flip_byte_for_tests(dir: &Path, spec: &str) {
    if let Some((name, off)) = spec.rsplit_once(':')
        && let Ok(off) = off.parse::<u64>()
        && let Ok(f) = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join(name))
    {
        let mut b = [0u8; 1];
        if f.read_exact_at(&mut b, off).is_ok() {
            let _ = f.write_all_at(&[b[0] ^ 0x01], off);
        }
    }
}
