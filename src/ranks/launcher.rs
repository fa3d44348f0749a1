//! Which run of how many this process is, as the launcher that started it says: torchrun
//! (RANK/WORLD_SIZE), srun (SLURM_PROCID/SLURM_NTASKS), a Slurm array
//! (SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_MIN/SLURM_ARRAY_TASK_COUNT) or a Kubernetes Indexed Job
//! (JOB_COMPLETION_INDEX, with the count in WLOAD_RUNS: Kubernetes puts the Job's completions in
//! no variable). `load` shares by the first two (one process per GPU or per node); `shard
//! --ranks launcher` by all four (one run per machine). The variables are read here only, so that
//! both commands take one launcher the same way and word its contradictions the same.

use std::fmt;

use super::{RankError, RankList, World};

/// The variable that gives a Kubernetes Indexed Job's run count (its `spec.completions`).
pub const RUNS_VAR: &str = "WLOAD_RUNS";

/// A launcher's word on this process: run `index` of `count`, and the variables it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub launcher: &'static str,
    pub index: u64,
    pub count: u64,
    /// The variables read, as `NAME=value`, for messages and the report.
    pub vars: Vec<(&'static str, String)>,
}

/// How a variable is looked up: the process environment, or a test's table.
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment.
pub(crate) fn process_env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

impl fmt::Display for Share {
    /// `Slurm array (SLURM_ARRAY_TASK_ID=1, SLURM_ARRAY_TASK_MIN=0, SLURM_ARRAY_TASK_COUNT=2)`.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let vars: Vec<String> = (self.vars.iter())
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        write!(f, "{} ({})", self.launcher, vars.join(", "))
    }
}

impl Share {
    /// The launcher's index and count from the variables `index` and `count`, parsed; an index
    /// not below the count is the launcher contradicting itself, said with both variables.
    fn read(
        launcher: &'static str,
        index: (&'static str, String),
        count: (&'static str, String),
    ) -> Result<Share, RankError> {
        let parse = |(k, v): &(&str, String)| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| RankError::Launcher(format!("{launcher}: {k}='{v}' is not a number")))
        };
        let (i, n) = (parse(&index)?, parse(&count)?);
        if i >= n {
            return Err(RankError::Launcher(format!(
                "{launcher}: {}={i} is not below {}={n} (process ranks run from 0 to {} - 1): the \
                 launcher's variables disagree; check how this process was started",
                index.0, count.0, count.0
            )));
        }
        Ok(Share {
            launcher,
            index: i,
            count: n,
            vars: vec![index, count],
        })
    }

    /// This run's block of `world`'s ranks: the `index`-th of `count` contiguous, equal blocks.
    /// A count that does not divide the world leaves no even split: refused, naming the
    /// variables and both sizes.
    pub fn ranks(&self, world: World) -> Result<RankList, RankError> {
        let size = world.size();
        if self.count > size || !size.is_multiple_of(self.count) {
            return Err(RankError::Launcher(format!(
                "--ranks launcher: {self} starts {n} runs, which cannot share the {size} ranks of \
                 {world} evenly; start a number of runs that divides {size} (1, or up to {size})",
                n = self.count,
            )));
        }
        let per = size / self.count;
        Ok(RankList(vec![
            self.index * per..=(self.index + 1) * per - 1,
        ]))
    }
}

/// torchrun's or srun's share of this process and its local rank (LOCAL_RANK, SLURM_LOCALID),
/// when one of them started it: what `load` splits the ranks of one machine's GPUs by.
pub(crate) fn process(env: Env) -> Result<Option<(Share, Option<String>)>, RankError> {
    let pairs = [
        ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ("srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ];
    for (who, i, n, local) in pairs {
        if let (Some(iv), Some(nv)) = (env(i), env(n)) {
            return Ok(Some((Share::read(who, (i, iv), (n, nv))?, env(local))));
        }
    }
    Ok(None)
}

/// The share of a whole run (one `shard --ranks launcher` per machine): torchrun's, srun's, a
/// Slurm array's, else a Kubernetes Indexed Job's; refused when none of them started it.
pub fn run(env: Env) -> Result<Share, RankError> {
    // An array task's batch step also has SLURM_PROCID=0 / SLURM_NTASKS=1: a one-task srun
    // share says nothing then, and the array is what splits the work.
    let array = slurm_array(env)?;
    match (process(env)?, array) {
        (Some((p, _)), Some(a)) if p.launcher == "srun" && p.count == 1 => Ok(a),
        (Some((p, _)), _) => Ok(p),
        (None, Some(a)) => Ok(a),
        (None, None) => kubernetes(env)?.ok_or_else(|| {
            RankError::Launcher(format!(
                "--ranks launcher: no launcher's variables are set (torchrun's RANK and \
                 WORLD_SIZE, srun's SLURM_PROCID and SLURM_NTASKS, a Slurm array's \
                 SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT, a Kubernetes Indexed Job's \
                 JOB_COMPLETION_INDEX with {RUNS_VAR}); run it under one of them, or give the \
                 ranks as --ranks LIST (e.g. 0-3)"
            ))
        }),
    }
}

/// [`run`] of this process's environment.
pub fn from_env() -> Result<Share, RankError> {
    run(&process_env)
}

/// A Slurm array task: its index among the array's tasks, from SLURM_ARRAY_TASK_ID less
/// SLURM_ARRAY_TASK_MIN, over SLURM_ARRAY_TASK_STEP (`--array=0-6:2`).
fn slurm_array(env: Env) -> Result<Option<Share>, RankError> {
    const ID: &str = "SLURM_ARRAY_TASK_ID";
    const MIN: &str = "SLURM_ARRAY_TASK_MIN";
    const STEP: &str = "SLURM_ARRAY_TASK_STEP";
    const COUNT: &str = "SLURM_ARRAY_TASK_COUNT";
    let (Some(id), Some(count)) = (env(ID), env(COUNT)) else {
        return Ok(None);
    };
    let (min, step) = (
        env(MIN).unwrap_or("0".into()),
        env(STEP).unwrap_or("1".into()),
    );
    let mut vars = vec![(ID, id), (MIN, min), (STEP, step)];
    let num = |(k, v): &(&str, String)| {
        v.trim()
            .parse::<u64>()
            .map_err(|_| RankError::Launcher(format!("Slurm array: {k}='{v}' is not a number")))
    };
    let (id, min, step) = (num(&vars[0])?, num(&vars[1])?, num(&vars[2])?.max(1));
    let said: Vec<String> = vars.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let offset = id
        .checked_sub(min)
        .filter(|o| o % step == 0)
        .ok_or_else(|| {
            RankError::Launcher(format!(
                "Slurm array: task {} is not on the array's range ({}): give the array as a range \
             from its first task, e.g. --array=0-3",
                id,
                said.join(", ")
            ))
        })?;
    let mut share = Share::read(
        "Slurm array",
        (ID, (offset / step).to_string()),
        (COUNT, count),
    )?;
    // Said as the launcher set them, the index derived from them.
    vars.push(share.vars.pop().expect("read keeps both variables"));
    if vars[2].1 == "1" {
        vars.remove(2);
    }
    share.vars = vars;
    Ok(Some(share))
}

/// A Kubernetes Indexed Job's pod: JOB_COMPLETION_INDEX, with the count the user puts in
/// [`RUNS_VAR`] (the Job's completions), refused without it.
fn kubernetes(env: Env) -> Result<Option<Share>, RankError> {
    const INDEX: &str = "JOB_COMPLETION_INDEX";
    let Some(index) = env(INDEX) else {
        return Ok(None);
    };
    let count = env(RUNS_VAR).ok_or_else(|| {
        RankError::Launcher(format!(
            "Kubernetes Indexed Job: {INDEX}={index} is set but {RUNS_VAR} is not: Kubernetes puts \
             the Job's completions in no variable; set {RUNS_VAR} to the same number as \
             spec.completions in the pod's env"
        ))
    })?;
    Share::read("Kubernetes Indexed Job", (INDEX, index), (RUNS_VAR, count)).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(vars: &[(&str, &str)]) -> Result<Share, String> {
        let env = |k: &str| {
            (vars.iter())
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        run(&env).map_err(|e| e.to_string())
    }

    fn ranks(vars: &[(&str, &str)], world: World) -> Result<String, String> {
        let s = share(vars)?;
        Ok(s.ranks(world).map_err(|e| e.to_string())?.to_string())
    }

    #[test]
    fn each_launcher_gives_its_block_of_the_world() {
        let w = World::tp(8);
        assert_eq!(
            ranks(&[("RANK", "1"), ("WORLD_SIZE", "2")], w).unwrap(),
            "4-7"
        );
        let srun = [("SLURM_PROCID", "3"), ("SLURM_NTASKS", "4")];
        assert_eq!(ranks(&srun, w).unwrap(), "6-7");
        let array = [
            ("SLURM_ARRAY_TASK_ID", "11"),
            ("SLURM_ARRAY_TASK_MIN", "10"),
            ("SLURM_ARRAY_TASK_COUNT", "2"),
            // The batch step of an array task: one task, which says nothing.
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ];
        assert_eq!(ranks(&array, w).unwrap(), "4-7");
        let s = share(&array).unwrap().to_string();
        assert!(s.starts_with("Slurm array (SLURM_ARRAY_TASK_ID=11"), "{s}");
        let stepped = [
            ("SLURM_ARRAY_TASK_ID", "6"),
            ("SLURM_ARRAY_TASK_MIN", "0"),
            ("SLURM_ARRAY_TASK_STEP", "2"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ];
        assert_eq!(ranks(&stepped, w).unwrap(), "6-7");
        let k8s = [("JOB_COMPLETION_INDEX", "0"), ("WLOAD_RUNS", "2")];
        assert_eq!(ranks(&k8s, World { tp: 2, pp: 2 }).unwrap(), "0-1");
        // torchrun first, as `load` takes it.
        let both = [("RANK", "0"), ("WORLD_SIZE", "2"), ("SLURM_PROCID", "1")];
        assert_eq!(share(&both).unwrap().launcher, "torchrun");
    }

    #[test]
    fn what_cannot_be_shared_is_refused_naming_the_variables() {
        let w = World::tp(8);
        let e = ranks(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "3")], w).unwrap_err();
        assert!(
            e.contains("srun (SLURM_PROCID=0, SLURM_NTASKS=3)")
                && e.contains("cannot share the 8 ranks of --tp 8"),
            "{e}"
        );
        let e = ranks(&[("RANK", "0"), ("WORLD_SIZE", "16")], w).unwrap_err();
        assert!(e.contains("WORLD_SIZE=16") && e.contains("16 runs"), "{e}");
        let e = share(&[("RANK", "2"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(e.contains("RANK=2 is not below WORLD_SIZE=2"), "{e}");
        let e = share(&[("JOB_COMPLETION_INDEX", "1")]).unwrap_err();
        assert!(
            e.contains("JOB_COMPLETION_INDEX=1") && e.contains("set WLOAD_RUNS"),
            "{e}"
        );
        let e = share(&[("JOB_COMPLETION_INDEX", "2"), ("WLOAD_RUNS", "2")]).unwrap_err();
        assert!(
            e.contains("JOB_COMPLETION_INDEX=2 is not below WLOAD_RUNS=2"),
            "{e}"
        );
        let e = share(&[
            ("SLURM_ARRAY_TASK_ID", "x"),
            ("SLURM_ARRAY_TASK_COUNT", "2"),
        ]);
        assert!(e.unwrap_err().contains("SLURM_ARRAY_TASK_ID='x'"));
        let odd = [
            ("SLURM_ARRAY_TASK_ID", "3"),
            ("SLURM_ARRAY_TASK_MIN", "4"),
            ("SLURM_ARRAY_TASK_COUNT", "2"),
        ];
        assert!(
            share(&odd)
                .unwrap_err()
                .contains("not on the array's range")
        );
        let e = share(&[]).unwrap_err();
        assert!(
            e.contains("no launcher's variables") && e.contains("--ranks LIST"),
            "{e}"
        );
    }
}
