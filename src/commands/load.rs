//! `wload load`: a checkpoint (planned on the fly) or a pre-sharded folder, into per-rank device
//! memory, with stage timings; or, with `--dry-run`, every check vLLM would fail, before any
//! device is touched.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use serde::Serialize;

use crate::exec::device::{CpuDevice, Device, DeviceError};
use crate::exec::{ExecError, Placement, Sink, Stats};
use crate::manifest::{self, Manifest};
use crate::plan::{self, Plan, Problem};
use crate::progress::{Progress, Quiet};
use crate::{Error, Opened, PlanOptions, SourceOptions, Timings};
use crate::{pre_sharded, ranks};

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
    #[error(transparent)]
    Ranks(#[from] ranks::RankError),
    #[error("--check: {rank_tensor} differs after the round trip through {device}")]
    CheckFailed { rank_tensor: String, device: String },
}

impl LoadError {
    pub fn exit_status(&self) -> crate::ExitStatus {
        use crate::ExitStatus;
        match self {
            LoadError::Ranks(_) => ExitStatus::Usage,
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

/// What each rank must hold: the plan for a checkpoint, or for a pre-sharded folder a plan that
/// copies its files' tensors whole (see [`crate::pre_sharded`]).
pub fn prepare(
    opened: &Opened,
    popts: &PlanOptions,
    given_ranks: Option<&crate::ranks::RankList>,
    warnings: &mut Vec<String>,
) -> Result<(Plan, InputKind), Error> {
    let files = pre_sharded::files(&opened.resolved.root);
    if files.is_empty() {
        return Ok((crate::make_plan(opened, popts)?, InputKind::Checkpoint));
    }
    let plan = pre_sharded::plan(opened, popts, &files, given_ranks, warnings)?;
    Ok((plan, InputKind::PreSharded))
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
    let (ranks, local_base) =
        ranks::select(popts.tp, lopts.ranks.as_ref()).map_err(LoadError::from)?;
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
