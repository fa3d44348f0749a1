//! Which ranks this process handles: `--ranks` (`0-3,5`, kept as ranges until `--tp` is known so
//! that no input such as `0-18446744073709551615` makes wload allocate before it can say "out of
//! range"), else the share a launcher (torchrun, srun) gives this process, else all.

pub(crate) mod embed;
pub mod launcher;
pub(crate) mod stages;

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

/// Ranks as the user wrote them: inclusive ranges, in order, possibly overlapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankList(Vec<RangeInclusive<u64>>);

/// The ranks of a run: `tp × pp`, global rank `pp_rank * tp + tp_rank`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct World {
    pub tp: u64,
    pub pp: u64,
}

impl World {
    /// Tensor parallelism only.
    pub(crate) fn tp(tp: u64) -> World {
        World { tp, pp: 1 }
    }

    pub(crate) fn size(&self) -> u64 {
        self.tp.saturating_mul(self.pp)
    }
}

/// As the flags say it: `--tp 4`, or `--tp 4 --pp 2`.
impl fmt::Display for World {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "--tp {}", self.tp)?;
        if self.pp > 1 {
            write!(f, " --pp {}", self.pp)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--ranks: rank {rank} is out of range for {world} (ranks are 0 to {last})", last = .world.size().saturating_sub(1))]
pub struct RankOutOfRange {
    pub rank: u64,
    pub world: World,
}

/// Why no rank list could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RankError {
    #[error(transparent)]
    OutOfRange(#[from] RankOutOfRange),
    /// RANK/WORLD_SIZE (torchrun) or SLURM_PROCID/SLURM_NTASKS (srun) do not fit `--tp`.
    #[error("{0}")]
    Launcher(String),
}

impl RankList {
    /// Every rank is below `tp`; allocates nothing.
    pub(crate) fn check(&self, world: World) -> Result<(), RankOutOfRange> {
        match self
            .0
            .iter()
            .map(|r| *r.end())
            .find(|&end| end >= world.size())
        {
            Some(rank) => Err(RankOutOfRange { rank, world }),
            None => Ok(()),
        }
    }

    /// The ranks, sorted and de-duplicated, once [`RankList::check`] passes. Call it with a
    /// `tp` that is known to fit the model (planning checks that), as it allocates up to `tp`
    /// entries per range.
    pub(crate) fn resolve(&self, world: World) -> Result<Vec<u64>, RankOutOfRange> {
        self.check(world)?;
        let mut out: Vec<u64> = self.0.iter().flat_map(|r| r.clone()).collect();
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

impl FromStr for RankList {
    type Err = String;

    /// `0-3,5` → ranges 0..=3 and 5..=5.
    fn from_str(s: &str) -> Result<RankList, String> {
        let num = |x: &str| {
            x.trim()
                .parse::<u64>()
                .map_err(|_| format!("'{x}' is not a rank number (use e.g. 0-3 or 0,2,5)"))
        };
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let range = match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if a > b {
                        return Err(format!("'{part}' is an empty range"));
                    }
                    a..=b
                }
                None => {
                    let r = num(part)?;
                    r..=r
                }
            };
            out.push(range);
        }
        if out.is_empty() {
            return Err("no ranks given".into());
        }
        Ok(RankList(out))
    }
}

/// `shard --ranks`: a list, or `launcher`, this run's block of the ranks as the launcher that
/// started it says ([`launcher::run`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankChoice {
    List(RankList),
    Launcher,
}

impl FromStr for RankChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<RankChoice, String> {
        if s.trim() == "launcher" {
            return Ok(RankChoice::Launcher);
        }
        (s.parse().map(RankChoice::List))
            .map_err(|e| format!("{e}; or `launcher`, to take this run's share from its launcher"))
    }
}

impl fmt::Display for RankList {
    /// As given: `0-3,5`.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let runs = self.0.iter().map(|r| (*r.start(), *r.end()));
        f.write_str(&crate::units::runs_text(runs))
    }
}

/// Ranks from `--ranks`, else from torchrun (RANK/WORLD_SIZE/LOCAL_RANK) or Slurm
/// (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID), else all; and the first local device ordinal.
pub(crate) fn select(
    world: World,
    given: Option<&RankList>,
) -> Result<(Vec<u64>, usize), RankError> {
    if let Some(v) = given {
        return Ok((v.resolve(world)?, 0));
    }
    let tp = world.size();
    let Some((share, local)) = launcher::process(&launcher::process_env)? else {
        return Ok(((0..tp).collect(), 0));
    };
    let who = share.launcher;
    let (rank, world_n) = (share.index, share.count);
    if !tp.is_multiple_of(world_n) {
        return Err(RankError::Launcher(format!(
            "{who}: {world_n} processes cannot share {world} evenly (this is process {rank}); start \
             one process per GPU (world size {tp}), or one per node with {by} divisible by the node count",
            by = if world.pp > 1 { "--tp × --pp" } else { "--tp" },
        )));
    }
    let parse = |name: &str, v: &str| {
        v.trim()
            .parse::<u64>()
            .map_err(|_| RankError::Launcher(format!("{who}: {name}='{v}' is not a number")))
    };
    let per = tp / world_n;
    let local = match local {
        Some(l) => parse("local rank", &l)?,
        None => 0,
    };
    // rank < world and per × world = tp: the rank range cannot overflow; the local one can.
    let first_device = local
        .checked_mul(per)
        .and_then(|d| usize::try_from(d).ok())
        .ok_or_else(|| {
            RankError::Launcher(format!(
                "{who}: local rank {local} × {per} ranks per process is no device ordinal"
            ))
        })?;
    Ok(((rank * per..(rank + 1) * per).collect(), first_device))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranks(s: &str, tp: u64) -> Result<Vec<u64>, String> {
        s.parse::<RankList>()?
            .resolve(World::tp(tp))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn lists_and_ranges() {
        assert_eq!(ranks("0-3", 8), Ok(vec![0, 1, 2, 3]));
        assert_eq!(ranks("0,2,5", 8), Ok(vec![0, 2, 5]));
        assert_eq!(ranks("7, 1-2,2", 8), Ok(vec![1, 2, 7]));
        assert_eq!("1-2,7".parse::<RankList>().unwrap().to_string(), "1-2,7");
    }

    #[test]
    fn malformed_lists_are_refused() {
        for bad in [
            "3-1",
            "a",
            "",
            ",",
            "1-",
            "-1",
            "1-2-3",
            "18446744073709551616",
        ] {
            assert!(bad.parse::<RankList>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn huge_ranges_are_refused_before_anything_is_allocated() {
        let e = ranks("0-18446744073709551615", 8).unwrap_err();
        assert!(
            e.contains("rank 18446744073709551615 is out of range for --tp 8"),
            "{e}"
        );
        assert!(ranks("0-100000000", 8).unwrap_err().contains("100000000"));
        assert!(ranks("8", 8).unwrap_err().contains("ranks are 0 to 7"));
    }
}
