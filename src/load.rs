//! `wload load`: a checkpoint (planned on the fly) or a pre-sharded folder, into per-rank device
//! memory, with stage timings; or, with `--dry-run`, every check vLLM would fail, before any
//! device is touched.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use serde::Serialize;

use crate::checkpoint::Checkpoint;
use crate::exec::device::{CpuDevice, Device, DeviceError};
use crate::exec::{ExecError, Placement, Sink, Stats};
use crate::manifest::{self, MANIFEST, Manifest};
use crate::plan::{self, OutTensor, Piece, Plan, Problem, RankPlan, SourceTensor};
use crate::progress::{Progress, Quiet};
use crate::{Error, Opened, PlanOptions, SourceOptions, Timings};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Cuda,
    Cpu,
}

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub device: DeviceKind,
    pub dry_run: bool,
    /// With `dry_run`: read and checksum every byte.
    pub read: bool,
    /// Ranks to load; `None` means from the launcher's environment, else all.
    pub ranks: Option<crate::ranks::RankList>,
    /// Copy every tensor back and compare it with what was sent.
    pub check: bool,
    /// Report an XXH3 checksum per loaded tensor.
    pub checksums: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("{0}")]
    Launcher(String),
    #[error(transparent)]
    BadRank(#[from] crate::ranks::RankOutOfRange),
    #[error("--check: {rank_tensor} differs after the round trip through {device}")]
    CheckFailed { rank_tensor: String, device: String },
}

impl LoadError {
    pub fn exit_status(&self) -> crate::ExitStatus {
        use crate::ExitStatus;
        match self {
            LoadError::BadRank(_) | LoadError::Launcher(_) => ExitStatus::Usage,
            LoadError::Exec(e) => e.exit_status(),
            LoadError::Device(_) | LoadError::CheckFailed { .. } => ExitStatus::Runtime,
        }
    }
}

/// Where the tensors came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum InputKind {
    /// A Hugging Face / Mistral checkpoint, planned on the fly.
    Checkpoint,
    /// Per-rank files written by `wload shard` or vLLM's save_sharded_state.
    PreSharded,
}

#[derive(Debug, Serialize)]
pub struct LoadReport {
    pub source: String,
    pub kind: InputKind,
    pub device: DeviceKind,
    pub dry_run: bool,
    pub tp: u64,
    pub ranks: Vec<RankReport>,
    pub bytes: u64,
    pub timings: LoadTimings,
    pub warnings: Vec<String>,
    /// Per-file XXH3 from `--dry-run --read`.
    pub files_read: Vec<FileSum>,
}

#[derive(Debug, Serialize)]
pub struct RankReport {
    pub rank: u64,
    pub device: String,
    pub tensors: usize,
    pub bytes: u64,
    /// Seconds spent handing this rank's bytes to its device, summed over threads.
    pub copy_s: f64,
    pub checksums: Option<Vec<TensorSum>>,
}

#[derive(Debug, Serialize)]
pub struct TensorSum {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub xxh3: String,
}

#[derive(Debug, Serialize)]
pub struct FileSum {
    pub file: String,
    pub bytes: u64,
    pub xxh3: String,
    /// Whether it matched the manifest (`None` when there is none to compare with).
    pub matches_manifest: Option<bool>,
}

#[derive(Debug, Default, Serialize)]
pub struct LoadTimings {
    #[serde(flatten)]
    pub open: Timings,
    /// Creating contexts and allocating device memory.
    pub open_devices_s: f64,
    /// Reading, converting and copying (wall clock, all stages overlapped).
    pub transfer_s: f64,
    /// Thread-summed seconds in each overlapped stage.
    pub read_s: f64,
    pub convert_s: f64,
    pub copy_s: f64,
    /// Waiting for the devices to finish.
    pub sync_s: f64,
    /// Bytes read from storage.
    pub bytes_read: u64,
    pub total_s: f64,
}

impl LoadTimings {
    pub fn gbps(&self, bytes: u64) -> f64 {
        let t = self.transfer_s + self.sync_s;
        if t > 0.0 { bytes as f64 / t / 1e9 } else { 0.0 }
    }
}

/// The part files of a folder that `shard` or vLLM wrote: rank → (part, file name).
pub fn pre_sharded_files(root: &Path) -> BTreeMap<u64, Vec<(u64, String)>> {
    let mut out: BTreeMap<u64, Vec<(u64, String)>> = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(root) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(f) = crate::rank_files::RankFile::parse(&name)
                && f.pp.is_none()
            {
                out.entry(f.tp).or_default().push((f.part, name));
            }
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// Ranks from `--ranks`, else from torchrun (RANK/WORLD_SIZE/LOCAL_RANK) or Slurm
/// (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID), else all; and the first local device ordinal.
pub fn select_ranks(
    tp: u64,
    given: Option<&crate::ranks::RankList>,
) -> Result<(Vec<u64>, usize), LoadError> {
    if let Some(v) = given {
        return Ok((v.resolve(tp)?, 0));
    }
    let env = |k: &str| std::env::var(k).ok();
    let launcher = match (env("RANK"), env("WORLD_SIZE")) {
        (Some(r), Some(w)) => Some(("torchrun", r, w, env("LOCAL_RANK"))),
        _ => match (env("SLURM_PROCID"), env("SLURM_NTASKS")) {
            (Some(r), Some(w)) => Some(("srun", r, w, env("SLURM_LOCALID"))),
            _ => None,
        },
    };
    let Some((who, r, w, local)) = launcher else {
        return Ok(((0..tp).collect(), 0));
    };
    let parse = |name: &str, v: &str| {
        v.trim()
            .parse::<u64>()
            .map_err(|_| LoadError::Launcher(format!("{who}: {name}='{v}' is not a number")))
    };
    let (rank, world) = (parse("rank", &r)?, parse("world size", &w)?);
    if world == 0 || !tp.is_multiple_of(world) || rank >= world {
        return Err(LoadError::Launcher(format!(
            "{who}: {world} processes cannot share --tp {tp} evenly (this is process {rank}); start \
             one process per GPU (world size {tp}), or one per node with --tp divisible by the node count"
        )));
    }
    let per = tp / world;
    let local = match local {
        Some(l) => parse("local rank", &l)? as usize,
        None => 0,
    };
    Ok((
        (rank * per..(rank + 1) * per).collect(),
        local * per as usize,
    ))
}

/// What each rank must hold: the plan for a checkpoint, or for a pre-sharded folder a plan that
/// copies its files' tensors whole — after checking them against what vLLM's module tree needs.
pub fn prepare(
    opened: &Opened,
    popts: &PlanOptions,
    given_ranks: Option<&crate::ranks::RankList>,
    warnings: &mut Vec<String>,
) -> Result<(Plan, InputKind), Error> {
    let root = &opened.resolved.root;
    let files = pre_sharded_files(root);
    if files.is_empty() {
        return Ok((crate::make_plan(opened, popts)?, InputKind::Checkpoint));
    }
    let manifest = Manifest::read(root);

    // What vLLM's fresh model holds per rank at this TP (names, dtypes, shapes).
    let mapping = crate::mapping::select(popts.mapping.as_deref(), opened.config.architecture())?;
    let empty = Checkpoint::from_files(Vec::new());
    let expected = plan::plan(
        &mapping,
        &opened.config,
        &empty,
        &plan::PlanOptions {
            tp: popts.tp,
            expert_parallel: popts.expert_parallel
                || manifest.as_ref().is_some_and(|m| m.expert_parallel),
            dtype: popts.dtype,
            shapes_only: true,
        },
    )?;

    let mut problems = Vec::new();
    if let Some(m) = &manifest
        && m.tp != popts.tp
    {
        problems.push(Problem {
            message: format!(
                "{}: written for --tp {}, loaded with --tp {}",
                root.join(MANIFEST).display(),
                m.tp,
                popts.tp
            ),
            fix: Some(format!(
                "load with --tp {} (vLLM's loader would accept smaller tensors silently)",
                m.tp
            )),
        });
    }
    let extra: Vec<u64> = files.keys().copied().filter(|r| *r >= popts.tp).collect();
    if !extra.is_empty() {
        problems.push(Problem {
            message: format!(
                "{}: has files for ranks {extra:?}, beyond --tp {}",
                root.display(),
                popts.tp
            ),
            fix: Some(format!(
                "load with --tp {}",
                files.keys().max().map_or(1, |m| m + 1)
            )),
        });
    }

    // Only now is --tp known to fit the model, so the rank list is bounded.
    let (ranks, _) = select_ranks(popts.tp, given_ranks).map_err(Error::from)?;
    let mut sources = Vec::new();
    let mut out_ranks = Vec::new();
    for &r in &ranks {
        let Some(parts) = files.get(&r) else {
            problems.push(Problem {
                message: format!(
                    "{}: no files for rank {r} ({})",
                    root.display(),
                    crate::rank_files::tp_only_glob(r)
                ),
                fix: Some("copy the missing rank files, or check --tp".into()),
            });
            continue;
        };
        let names: Vec<String> = parts.iter().map(|(_, n)| n.clone()).collect();
        let ck = Checkpoint::open(root, &names).map_err(Error::Headers)?;
        let want = &expected.ranks[r as usize];
        let want_by: BTreeMap<&str, &OutTensor> =
            want.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut seen = BTreeSet::new();
        let mut tensors = Vec::new();
        for f in &ck.files {
            for t in &f.tensors {
                if !seen.insert(t.name.clone()) {
                    problems.push(Problem {
                        message: format!(
                            "{}: tensor '{}' appears in two part files of rank {r}",
                            f.name, t.name
                        ),
                        fix: Some("remove the duplicate (vLLM raises KeyError)".into()),
                    });
                    continue;
                }
                match want_by.get(t.name.as_str()) {
                    None => problems.push(Problem {
                        message: format!(
                            "{}: unexpected tensor '{}' (vLLM's {} at tp {} has no such parameter; its loader raises KeyError)",
                            f.name, t.name, expected.architecture, popts.tp
                        ),
                        fix: Some("re-shard from the original checkpoint with `wload shard`".into()),
                    }),
                    Some(w) if w.shape != t.shape => problems.push(Problem {
                        message: format!(
                            "{}: tensor '{}' has shape {:?}, but rank {r} of {} at tp {} needs {:?}",
                            f.name, t.name, t.shape, expected.architecture, popts.tp, w.shape
                        ),
                        fix: Some(if t.name.contains("experts") {
                            "the folder was probably sharded for another --tp or with(out) --enable-expert-parallel; load it the same way".into()
                        } else {
                            "the folder was probably sharded for another --tp; load it with that TP size".into()
                        }),
                    }),
                    Some(w) if w.dtype != t.dtype && !plan::convertible(t.dtype, w.dtype) => {
                        problems.push(Problem {
                            message: format!(
                                "{}: tensor '{}' is {}, which cannot be converted to the parameter's {}",
                                f.name, t.name, t.dtype, w.dtype
                            ),
                            fix: Some("re-shard with the intended --dtype".into()),
                        })
                    }
                    Some(w) => {
                        if w.dtype != t.dtype {
                            // vLLM's loader only warns, and `copy_` converts: so do we.
                            warnings.push(format!(
                                "{}: '{}' is {} where vLLM's parameter is {}; converted as vLLM does",
                                f.name, t.name, t.dtype, w.dtype
                            ));
                        }
                        let numel = t.numel();
                        sources.push(SourceTensor {
                            name: t.name.clone(),
                            file: f.name.clone(),
                            file_index: t.file,
                            offset: t.offset,
                            dtype: t.dtype,
                            shape: t.shape.clone(),
                        });
                        tensors.push(OutTensor {
                            name: t.name.clone(),
                            dtype: w.dtype,
                            shape: t.shape.clone(),
                            bytes: w.bytes,
                            pieces: vec![Piece::Copy {
                                source: sources.len() - 1,
                                region: "all".into(),
                                rows: 1,
                                row: numel,
                                src_start: 0,
                                src_stride: numel,
                                dst_start: 0,
                                dst_stride: numel,
                            }],
                        });
                    }
                }
            }
        }
        for w in &want.tensors {
            if !seen.contains(&w.name) {
                problems.push(Problem {
                    message: format!("rank {r}: missing tensor '{}' (vLLM: \"Missing keys ... in loaded state\")", w.name),
                    fix: Some("re-shard from the original checkpoint with `wload shard`".into()),
                });
            }
        }
        out_ranks.push(RankPlan {
            rank: r,
            bytes: tensors.iter().map(|t| t.bytes).sum(),
            tensors,
        });
    }
    if !problems.is_empty() {
        return Err(plan::PlanError::Invalid(problems).into());
    }
    // Sources of different ranks live in different files: index files by name.
    let mut file_ix: BTreeMap<String, usize> = BTreeMap::new();
    for s in &mut sources {
        let n = file_ix.len();
        s.file_index = *file_ix.entry(s.file.clone()).or_insert(n);
    }
    Ok((
        Plan {
            family: expected.family,
            architecture: expected.architecture,
            tp: popts.tp,
            expert_parallel: expected.expert_parallel,
            dtype: expected.dtype,
            sources,
            ranks: out_ranks,
            tie_word_embeddings: expected.tie_word_embeddings,
            retie: None,
            skipped: Vec::new(),
        },
        InputKind::PreSharded,
    ))
}

struct LoadSink<'a> {
    devices: &'a [Box<dyn Device>],
    /// out → (device, buffer)
    map: Vec<(usize, usize)>,
    copy_ns: Vec<std::sync::atomic::AtomicU64>,
}

impl LoadSink<'_> {
    /// Runs a device call for output `out`, timing it against that rank.
    fn on_device<T>(
        &self,
        out: usize,
        f: impl FnOnce(&dyn Device, usize) -> Result<T, DeviceError>,
    ) -> Result<T, ExecError> {
        let (d, b) = self.map[out];
        let t = Instant::now();
        let r = f(self.devices[d].as_ref(), b).map_err(|e| ExecError::Device(e.to_string()))?;
        self.copy_ns[d].fetch_add(
            t.elapsed().as_nanos() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(r)
    }
}

impl Sink for LoadSink<'_> {
    fn put(&self, out: usize, offset: u64, bytes: &[u8]) -> Result<(), ExecError> {
        self.on_device(out, |d, b| d.upload(b, offset, bytes))
    }

    fn starts_zeroed(&self) -> bool {
        true
    }

    fn cheap_small_puts(&self) -> bool {
        self.devices.iter().all(|d| d.is_host())
    }

    fn copy_from_file(
        &self,
        out: usize,
        offset: u64,
        src: &std::fs::File,
        src_offset: u64,
        len: u64,
    ) -> Result<bool, ExecError> {
        self.on_device(out, |d, b| {
            d.upload_from_file(b, offset, src, src_offset, len)
        })
    }
}

/// Resolves, plans and (unless dry-run) loads.
pub fn load(
    sopts: &SourceOptions,
    popts: &PlanOptions,
    lopts: &LoadOptions,
    cancel: &AtomicBool,
    progress: &dyn Fn(u64) -> Box<dyn Progress>,
) -> Result<LoadReport, Error> {
    let t_all = Instant::now();
    let (mut opened, _) = crate::open_detect(sopts)?;
    let mut warnings = Vec::new();
    let t = Instant::now();
    let (mut plan, kind) = prepare(&opened, popts, lopts.ranks.as_ref(), &mut warnings)?;
    opened.timings.plan_s = t.elapsed().as_secs_f64();
    // After planning, which refuses a --tp that does not fit the model: no rank list is built
    // for an absurd one.
    let (ranks, local_base) = select_ranks(popts.tp, lopts.ranks.as_ref()).map_err(Error::from)?;
    plan.ranks.retain(|r| ranks.contains(&r.rank));
    let bytes: u64 = plan.ranks.iter().map(|r| r.bytes).sum();
    let mut timings = LoadTimings {
        open: opened.timings,
        ..Default::default()
    };
    let root = opened.resolved.root.clone();

    if lopts.dry_run {
        let mut files_read = Vec::new();
        if lopts.read {
            files_read = read_all(&root, &plan, kind).map_err(Error::from)?;
            let bad: Vec<&FileSum> = files_read
                .iter()
                .filter(|f| f.matches_manifest == Some(false))
                .collect();
            if !bad.is_empty() {
                return Err(plan::PlanError::Invalid(
                    bad.iter()
                        .map(|f| Problem {
                            message: format!("{}: checksum {} differs from the manifest (wload.json): the file changed or is corrupt", f.file, f.xxh3),
                            fix: Some("re-shard, or copy the file again".into()),
                        })
                        .collect(),
                )
                .into());
            }
        }
        timings.total_s = t_all.elapsed().as_secs_f64();
        return Ok(LoadReport {
            source: root.display().to_string(),
            kind,
            device: lopts.device,
            dry_run: true,
            tp: plan.tp,
            ranks: plan
                .ranks
                .iter()
                .map(|r| RankReport {
                    rank: r.rank,
                    device: "-".into(),
                    tensors: r.tensors.len(),
                    bytes: r.bytes,
                    copy_s: 0.0,
                    checksums: None,
                })
                .collect(),
            bytes,
            timings,
            warnings,
            files_read,
        });
    }

    // Devices: rank j of this process on local device local_base + j.
    let t = Instant::now();
    let mut devices: Vec<Box<dyn Device>> = Vec::new();
    let mut local_base = local_base;
    if lopts.device == DeviceKind::Cuda {
        let found = crate::exec::cuda::device_count()?;
        // A task that sees exactly its own GPUs (srun --gpus-per-task, CUDA_VISIBLE_DEVICES set
        // per process) finds them from ordinal 0.
        if found == ranks.len() {
            local_base = 0;
        }
        if local_base + ranks.len() > found {
            return Err(Error::Load(
                DeviceError::TooFewDevices {
                    needed: local_base + ranks.len(),
                    found,
                    ranks: format!("{ranks:?}"),
                }
                .into(),
            ));
        }
    }
    let mut map = Vec::new();
    let mut placements = Vec::new();
    for (j, r) in plan.ranks.iter().enumerate() {
        let mut dev: Box<dyn Device> = match lopts.device {
            DeviceKind::Cpu => Box::new(CpuDevice::default()),
            DeviceKind::Cuda => Box::new(crate::exec::cuda::CudaDevice::new(local_base + j)?),
        };
        let sizes: Vec<u64> = r.tensors.iter().map(|t| t.bytes).collect();
        dev.alloc(&sizes)?;
        for ti in 0..r.tensors.len() {
            placements.push(Placement {
                rank: j,
                tensor: ti,
                out: map.len(),
                offset: 0,
            });
            map.push((j, ti));
        }
        devices.push(dev);
    }
    timings.open_devices_s = t.elapsed().as_secs_f64();

    let sink = LoadSink {
        devices: &devices,
        map,
        copy_ns: (0..devices.len()).map(|_| Default::default()).collect(),
    };
    let stats = Stats::default();
    let t = Instant::now();
    let bar = progress(bytes);
    crate::exec::execute_with_stats(
        &plan,
        &root,
        &placements,
        &sink,
        cancel,
        bar.as_ref(),
        &stats,
    )?;
    drop(bar);
    timings.transfer_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for d in &devices {
        d.synchronize()?;
    }
    timings.sync_s = t.elapsed().as_secs_f64();
    timings.read_s = Stats::secs(&stats.read_ns);
    timings.convert_s = Stats::secs(&stats.convert_ns);
    timings.copy_s = Stats::secs(&stats.put_ns);
    timings.bytes_read = stats.bytes_read.load(std::sync::atomic::Ordering::Relaxed);

    let mut reports = Vec::new();
    for (j, r) in plan.ranks.iter().enumerate() {
        let mut sums = None;
        if lopts.checksums || lopts.check {
            let mut v = Vec::new();
            for (ti, t) in r.tensors.iter().enumerate() {
                let got = devices[j].download(ti)?;
                let sum = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&got));
                if lopts.check {
                    let want = reference_bytes(&plan, &root, j, ti, cancel)?;
                    if want != got {
                        return Err(Error::from(LoadError::CheckFailed {
                            rank_tensor: format!("rank {} tensor '{}'", r.rank, t.name),
                            device: devices[j].describe(),
                        }));
                    }
                }
                v.push(TensorSum {
                    name: t.name.clone(),
                    dtype: t.dtype.to_string(),
                    shape: t.shape.clone(),
                    xxh3: sum,
                });
            }
            sums = lopts.checksums.then_some(v);
        }
        reports.push(RankReport {
            rank: r.rank,
            device: devices[j].describe(),
            tensors: r.tensors.len(),
            bytes: r.bytes,
            copy_s: Stats::secs(&sink.copy_ns[j]),
            checksums: sums,
        });
    }
    timings.total_s = t_all.elapsed().as_secs_f64();
    Ok(LoadReport {
        source: root.display().to_string(),
        kind,
        device: lopts.device,
        dry_run: false,
        tp: plan.tp,
        ranks: reports,
        bytes,
        timings,
        warnings,
        files_read: Vec::new(),
    })
}

/// One tensor computed on the host, independently of the device, for `--check`.
fn reference_bytes(
    plan: &Plan,
    root: &Path,
    rank: usize,
    tensor: usize,
    cancel: &AtomicBool,
) -> Result<Vec<u8>, Error> {
    let mut dev = CpuDevice::default();
    let n = plan.ranks[rank].tensors[tensor].bytes;
    dev.alloc(&[n])?;
    let devices: Vec<Box<dyn Device>> = vec![Box::new(dev)];
    let sink = LoadSink {
        devices: &devices,
        map: vec![(0, 0)],
        copy_ns: vec![Default::default()],
    };
    let pl = [Placement {
        rank,
        tensor,
        out: 0,
        offset: 0,
    }];
    crate::exec::execute(plan, root, &pl, &sink, cancel, &Quiet)?;
    Ok(devices[0].download(0)?)
}

/// `--dry-run --read`: every byte of every file the plan reads, hashed; compared with the manifest
/// of a pre-sharded folder.
fn read_all(root: &Path, plan: &Plan, kind: InputKind) -> Result<Vec<FileSum>, LoadError> {
    use rayon::prelude::*;
    let manifest = (kind == InputKind::PreSharded)
        .then(|| Manifest::read(root))
        .flatten();
    let files: BTreeSet<&str> = plan.sources.iter().map(|s| s.file.as_str()).collect();
    files
        .into_par_iter()
        .map(|f| {
            let path = root.join(f);
            let sum = manifest::hash_file(&path).map_err(|e| {
                LoadError::Exec(ExecError::Corrupt {
                    path: path.clone(),
                    message: e.to_string(),
                })
            })?;
            let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            let matches_manifest = manifest
                .as_ref()
                .and_then(|m| m.files.iter().find(|x| x.name == f))
                .map(|m| m.xxh3 == sum && m.size == bytes);
            Ok(FileSum {
                file: f.to_string(),
                bytes,
                xxh3: sum,
                matches_manifest,
            })
        })
        .collect()
}
