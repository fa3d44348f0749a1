//! `wload load`: a checkpoint (planned on the fly) or a pre-sharded folder, into per-rank device
//! memory, with stage timings; or, with `--dry-run`, every check vLLM would fail, before any
//! device is touched.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use serde::Serialize;

mod planned;
mod report;
pub(crate) mod settings;

pub use planned::{Planned, Ranks, Request, plan};

pub use report::InputKind;
pub(crate) use report::{
    CacheReport, FileSum, IoReport, LoadReport, LoadTimings, RankReport, RankStages, Repeats,
    RunSample, TensorSum,
};

use crate::checksum;
use crate::commands::error::Error;
use crate::commands::error::load::LoadError;
use crate::exec::device::{CpuDevice, Device, DeviceError};
use crate::exec::io_choice;
use crate::exec::load::LoadSink;
use crate::exec::source::IoMode;
use crate::exec::timing;
use crate::exec::{Control, Destinations, ExecError, ExecOptions, Placement, Stats};
use crate::open::Opened;
use crate::plan::PlanOptions;
use crate::plan::pre_sharded;
use crate::plan::{self, Plan};
use crate::problem::Problem;
use crate::progress::{Progress, Quiet};
use crate::sharded::manifest::Manifest;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum, schemars::JsonSchema)]
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
    /// How to read the source (`auto` chooses by page-cache residency).
    pub io: IoMode,
    /// Drop the source from the page cache before each load.
    pub cold: bool,
    /// Load this many times (at least once), for min/median/max.
    pub repeat: u32,
}

/// What each rank must hold: the plan for a checkpoint or, when `files` (the rank files
/// [`crate::open::open`] found) is not empty, a plan that copies their tensors whole (see
/// [`crate::plan::pre_sharded`]).
pub(crate) fn prepare(
    opened: &Opened,
    files: &crate::sharded::names::RankFiles,
    popts: &PlanOptions,
    given_ranks: Option<&crate::ranks::RankList>,
    warnings: &mut Vec<String>,
) -> Result<(Plan, InputKind), Error> {
    if files.is_empty() {
        let plan = super::pipeline::make_plan(opened, popts)?;
        warnings.extend(plan.warnings.iter().cloned());
        return Ok((plan, InputKind::Checkpoint));
    }
    let plan = pre_sharded::plan(opened, popts, files, given_ranks, warnings)?;
    // After the folder's own checks, which name the manifest when it records no experts.
    super::pipeline::refuse_expert_parallel_without_experts(opened, popts)?;
    Ok((plan, InputKind::PreSharded))
}

/// Loads what [`plan`] made (unless dry-run): [`dry_run`], or [`open_devices`] → [`transfer`] →
/// [`read_back`]. `t_all` is when the request was made, for the total time.
pub fn load(
    planned: &Planned,
    lopts: &LoadOptions,
    cancel: &AtomicBool,
    progress: &dyn Fn(u64) -> Box<dyn Progress>,
    t_all: Instant,
) -> Result<LoadReport, Error> {
    let mut timings = LoadTimings {
        open: planned.opened.timings,
        ..Default::default()
    };
    let mut report = if lopts.dry_run {
        dry_run(planned, lopts)?
    } else {
        let mut samples = Vec::new();
        let mut last = None;
        for _ in 0..lopts.repeat.max(1) {
            // The devices of the run before are freed first: two copies of a model need not fit.
            drop(last.take());
            let mut t = LoadTimings {
                open: timings.open,
                ..Default::default()
            };
            let (cache, mut io) = prepare_source(planned, lopts, &mut t)?;
            let threads = crate::exec::worker_threads(io.choice.used);
            let devices = open_devices(planned, lopts.device, threads, &mut t)?;
            let opts = ExecOptions {
                io: io.choice.used,
                share_reads: io.choice.shares_reads(),
                ..ExecOptions::for_run()
            };
            let (copy_s, shared) = transfer(planned, &devices, opts, cancel, progress, &mut t)?;
            io.choice.note_shared(shared);
            samples.push(RunSample {
                seconds: t.transfer_s + t.sync_s,
                gbps: t.gbps(planned.bytes()),
                resident_share: cache.resident_share,
            });
            last = Some((devices, copy_s, cache, io, t));
        }
        let (devices, copy_s, cache, mut io, t) = last.expect("at least one run");
        let mut warnings = Vec::new();
        if lopts.cold && cache.resident_share > 0.05 {
            warnings.push(format!(
                "--cold: {:.0}% of the source is still in the page cache after the eviction (a tmpfs, or pages another process holds mapped or locked): these figures are not cold",
                cache.resident_share * 100.0
            ));
        }
        io.staging_bytes_per_rank = devices.iter().map(|d| d.staging_bytes()).max().unwrap_or(0);
        let ranks = read_back(planned, &devices, &copy_s, &t, lopts, cancel)?;
        timings = t;
        let mut r = planned.report(lopts, ranks, Vec::new());
        r.warnings.extend(warnings);
        r.io = Some(io);
        r.cache = Some(cache);
        r.repeats = (samples.len() > 1).then(|| repeats(samples));
        r
    };
    timings.total_s = t_all.elapsed().as_secs_f64();
    report.timings = timings;
    Ok(report)
}

/// With `--cold`, the source out of the page cache (and proof that it is); its residency as the
/// load starts; the I/O mode that residency calls for.
fn prepare_source(
    planned: &Planned,
    lopts: &LoadOptions,
    timings: &mut LoadTimings,
) -> Result<(CacheReport, IoReport), Error> {
    let t = Instant::now();
    let (cache, choice) = io_choice::prepare(
        &crate::exec::source_files(&planned.plan, planned.root()),
        lopts.io,
        lopts.cold,
    )
    .map_err(ExecError::from)?;
    timings.cache_s = t.elapsed().as_secs_f64();
    Ok((
        cache,
        IoReport {
            threads: crate::exec::worker_threads(choice.used),
            choice,
            staging_bytes_per_rank: 0,
        },
    ))
}

fn repeats(runs: Vec<RunSample>) -> Repeats {
    let stat = |f: fn(&RunSample) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        // An even count's median is the mean of the middle two, not the lower one.
        (v[0], (v[(n - 1) / 2] + v[n / 2]) / 2.0, v[n - 1])
    };
    let (gbps_min, gbps_median, gbps_max) = stat(|r| r.gbps);
    let (seconds_min, seconds_median, seconds_max) = stat(|r| r.seconds);
    Repeats {
        runs,
        gbps_min,
        gbps_median,
        gbps_max,
        seconds_min,
        seconds_median,
        seconds_max,
    }
}

impl Planned {
    fn report(
        &self,
        lopts: &LoadOptions,
        ranks: Vec<RankReport>,
        files: Vec<FileSum>,
    ) -> LoadReport {
        LoadReport {
            source: self.root().display().to_string(),
            kind: self.kind,
            device: lopts.device,
            dry_run: lopts.dry_run,
            tp: self.plan.tp,
            pp: self.plan.pp,
            ranks,
            bytes: self.bytes(),
            timings: LoadTimings::default(),
            hub_fetched: self.opened.fetched(),
            warnings: self.warnings.clone(),
            files_read: files,
            io: None,
            cache: None,
            repeats: None,
            checked: lopts.check && !lopts.dry_run,
        }
    }
}

/// `--dry-run`: the plan's checks passed; with `--read`, every byte read and hashed (and
/// compared with the manifest).
fn dry_run(planned: &Planned, lopts: &LoadOptions) -> Result<LoadReport, Error> {
    let mut files_read = Vec::new();
    if lopts.read {
        files_read = read_all(planned.root(), &planned.plan, planned.kind)?;
        let bad: Vec<Problem> = files_read
            .iter()
            .filter(|f| f.matches_manifest == Some(false))
            .map(|f| Problem {
                message: format!("{}: checksum {} differs from the manifest (the run record that lists it): the file changed or is corrupt", f.file, f.xxh3_64k),
                fix: Some("re-shard, or copy the file again".into()),
                file: Some(f.file.clone()),
                ..Default::default()
            })
            .collect();
        if !bad.is_empty() {
            return Err(plan::PlanError::Invalid(bad).into());
        }
    }
    let ranks = planned
        .plan
        .ranks
        .iter()
        .map(|r| RankReport {
            rank: r.rank,
            device: "-".into(),
            tensors: r.tensors.len(),
            bytes: r.bytes,
            copy_s: 0.0,
            stages: RankStages::default(),
            checksums: None,
        })
        .collect();
    Ok(planned.report(lopts, ranks, files_read))
}

/// A device per rank (rank j of this process on local device `local_base + j`), each with its
/// tensors allocated.
fn open_devices(
    planned: &Planned,
    kind: DeviceKind,
    threads: usize,
    timings: &mut LoadTimings,
) -> Result<Vec<Box<dyn Device>>, Error> {
    let t = Instant::now();
    let n = planned.plan.ranks.len();
    let mut local_base = planned.local_base;
    if kind == DeviceKind::Cuda {
        let found = crate::exec::cuda::device_count()?;
        // A task that sees exactly its own GPUs (srun --gpus-per-task, CUDA_VISIBLE_DEVICES set
        // per process) finds them from ordinal 0.
        if found == n {
            local_base = 0;
        }
        if local_base + n > found {
            let ranks: Vec<u64> = planned.plan.ranks.iter().map(|r| r.rank).collect();
            return Err(DeviceError::TooFewDevices {
                needed: local_base + n,
                found,
                ranks: crate::units::id_runs(&ranks),
            }
            .into());
        }
    }
    let mut devices: Vec<Box<dyn Device>> = Vec::new();
    for (j, r) in planned.plan.ranks.iter().enumerate() {
        let mut dev: Box<dyn Device> = match kind {
            DeviceKind::Cpu => Box::new(CpuDevice::default()),
            DeviceKind::Cuda => Box::new(crate::exec::cuda::CudaDevice::new(
                local_base + j,
                crate::exec::cuda::slots_per_device(n, threads, r.bytes),
            )?),
        };
        let sizes: Vec<u64> = r.tensors.iter().map(|t| t.bytes).collect();
        dev.alloc_phased(&sizes, &crate::exec::phases(&planned.plan, j))?;
        devices.push(dev);
    }
    timings.open_devices_s = t.elapsed().as_secs_f64();
    Ok(devices)
}

/// Reads, converts and copies every tensor to its device, then waits for the devices. Returns
/// the seconds each rank's device calls took.
fn transfer(
    planned: &Planned,
    devices: &[Box<dyn Device>],
    opts: ExecOptions,
    cancel: &AtomicBool,
    progress: &dyn Fn(u64) -> Box<dyn Progress>,
    timings: &mut LoadTimings,
) -> Result<(Vec<f64>, u64), Error> {
    let bar = progress(planned.bytes());
    let ctl = Control::new(cancel, bar.as_ref()).with_options(opts);
    let ranks: Vec<usize> = (0..planned.plan.ranks.len()).collect();
    let dests = Destinations::Devices(devices);
    let filled = crate::exec::fill(&planned.plan, planned.root(), &ranks, dests, &ctl)?;
    let stats = ctl.stats;
    drop(bar);
    timings.transfer_s = filled.transfer_s;
    timings.sync_s = filled.sync_s;
    timings.read_s = Stats::secs(&stats.read_ns);
    timings.convert_s = Stats::secs(&stats.convert_ns);
    timings.copy_s = Stats::secs(&stats.put_ns);
    timings.bytes_read = stats.bytes_read.load(std::sync::atomic::Ordering::Relaxed);
    let wall = timings.transfer_s + timings.sync_s;
    timings.read_gbps = timing::gbps(timings.bytes_read, wall);
    timings.h2d_gbps = timing::gbps(planned.bytes(), wall);
    let shared = stats
        .shared_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    Ok((filled.device_s, shared))
}

/// Per-rank reports; with `--checksums` or `--check`, every tensor copied back from its device
/// (and, with `--check`, compared with the same tensor computed on the host).
fn read_back(
    planned: &Planned,
    devices: &[Box<dyn Device>],
    copy_s: &[f64],
    timings: &LoadTimings,
    lopts: &LoadOptions,
    cancel: &AtomicBool,
) -> Result<Vec<RankReport>, Error> {
    let mut reports = Vec::new();
    for (j, r) in planned.plan.ranks.iter().enumerate() {
        let mut sums = None;
        if lopts.checksums || lopts.check {
            let mut v = Vec::new();
            for (ti, t) in r.tensors.iter().enumerate() {
                let got = devices[j].download(ti)?;
                if lopts.check {
                    let want = reference_bytes(&planned.plan, planned.root(), j, ti, cancel)?;
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
                    xxh3: format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&got)),
                });
            }
            sums = lopts.checksums.then_some(v);
        }
        reports.push(RankReport {
            rank: r.rank,
            device: devices[j].describe(),
            tensors: r.tensors.len(),
            bytes: r.bytes,
            copy_s: copy_s[j],
            stages: rank_stages(devices[j].as_ref(), timings.transfer_s + timings.sync_s),
            checksums: sums,
        });
    }
    Ok(reports)
}

/// One rank's stages from its device's counters, over the load's wall time.
fn rank_stages(d: &dyn Device, wall_s: f64) -> RankStages {
    let st = d.stages();
    let read_busy_s = st.read.busy_s();
    let h2d_bytes = st.upload.bytes();
    let h2d_s = if d.is_host() {
        st.upload.busy_s()
    } else {
        st.device_copy_s()
    };
    RankStages {
        read_bytes: st.read.bytes(),
        read_busy_s,
        read_gbps: timing::gbps(st.read.bytes(), read_busy_s),
        h2d_bytes,
        h2d_s,
        h2d_gbps: timing::gbps(h2d_bytes, h2d_s),
        overlap: timing::overlap(read_busy_s, h2d_s, wall_s),
        staging_wait_s: st.wait_s(),
    }
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
    let sink = LoadSink::new(&devices, vec![(0, 0)]);
    let pl = [Placement {
        rank,
        tensor,
        out: 0,
        offset: 0,
    }];
    crate::exec::execute(plan, root, &pl, &sink, &Control::new(cancel, &Quiet))?;
    Ok(devices[0].download(0)?)
}

/// `--dry-run --read`: every byte of every file the plan reads, hashed; compared with the manifest
/// of a pre-sharded folder.
fn read_all(root: &Path, plan: &Plan, kind: InputKind) -> Result<Vec<FileSum>, LoadError> {
    use rayon::prelude::*;
    let manifest = (kind == InputKind::PreSharded)
        .then(|| Manifest::read(root))
        .flatten();
    crate::exec::hooks::at(crate::exec::hooks::Point::Hash);
    let files: BTreeMap<&str, usize> = plan
        .sources
        .iter()
        .map(|s| (&*s.file, s.file_index))
        .collect();
    files
        .into_par_iter()
        .map(|(f, file_index)| {
            let path = root.join(f);
            let corrupt = |e: std::io::Error| {
                LoadError::Exec(ExecError::Corrupt {
                    path: path.clone(),
                    message: e.to_string(),
                })
            };
            // The bytes of the file whose header was checked: the same stamp before and after.
            let file = std::fs::File::open(&path).map_err(corrupt)?;
            crate::exec::still_planned(plan, file_index, &file, &path)?;
            let sum = checksum::of_open(&file, &|| false).map_err(corrupt)?;
            crate::exec::still_planned(plan, file_index, &file, &path)?;
            let bytes = crate::exec::planned_stamp(plan, file_index, &path)?.size;
            let matches_manifest = manifest
                .as_ref()
                .and_then(|m| m.files.iter().find(|x| x.name == f))
                .map(|m| m.matches(&path, &sum, bytes))
                .transpose()
                .map_err(corrupt)?;
            Ok(FileSum {
                file: f.to_string(),
                bytes,
                xxh3_64k: sum,
                matches_manifest,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seconds: f64) -> RunSample {
        RunSample {
            seconds,
            gbps: 8.0 / seconds,
            resident_share: 1.0,
        }
    }

    #[test]
    fn repeats_take_the_middle_run_or_the_mean_of_the_middle_two() {
        let odd = repeats(vec![sample(4.0), sample(1.0), sample(2.0)]);
        assert_eq!(
            (odd.seconds_min, odd.seconds_median, odd.seconds_max),
            (1.0, 2.0, 4.0)
        );
        let even = repeats(vec![sample(4.0), sample(1.0), sample(2.0), sample(8.0)]);
        assert_eq!(
            (even.seconds_min, even.seconds_median, even.seconds_max),
            (1.0, 3.0, 8.0)
        );
        assert_eq!(even.gbps_median, (8.0 / 2.0 + 8.0 / 4.0) / 2.0);
    }
}
