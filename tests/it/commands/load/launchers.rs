//! Launcher variables (torchrun, Slurm) pick this process's ranks.

use super::*;

// ---------------------------------------------------------------------------------------------
// 6. Launchers
// ---------------------------------------------------------------------------------------------

#[test]
fn torchrun_variables_pick_this_process_ranks() {
    let fx = fixtures_dir().join(GQA);
    let f = s(&fx);
    let args = [f, "--tp", "2", "--device", "cpu", "--json", "--checksums"];
    let r = json_ok(&args, &[("RANK", "1"), ("WORLD_SIZE", "2")]);
    assert_eq!(reported_ranks(&r), vec![1], "{r}");
    let case = golden_cases()
        .into_iter()
        .find(|c| c.name == "llama_gqa/tp2")
        .unwrap();
    assert_none(
        "rank 1 under torchrun",
        &compare("torchrun", &case, &r, &[1]),
    );

    // --ranks overrides the launcher.
    let mut with_ranks = args.to_vec();
    with_ranks.extend(["--ranks", "0"]);
    let r = json_ok(&with_ranks, &[("RANK", "1"), ("WORLD_SIZE", "2")]);
    assert_eq!(reported_ranks(&r), vec![0], "{r}");

    // 3 processes cannot split TP 4.
    assert_fails(
        &[f, "--tp", "4", "--device", "cpu", "--json"],
        &[("RANK", "0"), ("WORLD_SIZE", "3")],
        2,
        &["3 processes", "--tp 4"],
    );
    // A rank that is not a number.
    assert_fails(
        &[f, "--tp", "2", "--device", "cpu"],
        &[("RANK", "one"), ("WORLD_SIZE", "2")],
        2,
        &["RANK='one'"],
    );
    // RANK beyond WORLD_SIZE.
    assert_fails(
        &[f, "--tp", "2", "--device", "cpu"],
        &[("RANK", "2"), ("WORLD_SIZE", "2")],
        2,
        &["RANK=2 is not below WORLD_SIZE=2"],
    );
}

/// WORLD_SIZE without RANK is not a torchrun launch (torchrun sets both); without the launcher,
/// all ranks load.
#[test]
fn world_size_alone_is_ignored() {
    let fx = fixtures_dir().join(GQA);
    let r = json_ok(
        &[
            s(&fx),
            "--tp",
            "4",
            "--device",
            "cpu",
            "--dry-run",
            "--json",
        ],
        &[("WORLD_SIZE", "3")],
    );
    assert_eq!(reported_ranks(&r), vec![0, 1, 2, 3], "{r}");
}

#[test]
fn slurm_variables_pick_this_process_ranks() {
    let fx = fixtures_dir().join(GQA);
    let f = s(&fx);
    let env = [
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_LOCALID", "0"),
    ];
    let r = json_ok(&[f, "--tp", "4", "--device", "cpu", "--json"], &env);
    assert_eq!(reported_ranks(&r), vec![0, 1], "{r}");
    let r = json_ok(
        &[f, "--tp", "4", "--device", "cpu", "--json", "--ranks", "3"],
        &env,
    );
    assert_eq!(reported_ranks(&r), vec![3], "{r}");
    let env = [("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")];
    let r = json_ok(
        &[f, "--tp", "4", "--device", "cpu", "--dry-run", "--json"],
        &env,
    );
    assert_eq!(reported_ranks(&r), vec![2, 3], "{r}");
    assert_fails(
        &[f, "--tp", "4", "--device", "cpu"],
        &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "3")],
        2,
        &["srun", "3 processes"],
    );
}

/// torchrun wins over Slurm when both are set (torchrun inside an srun allocation).
#[test]
fn torchrun_wins_over_slurm() {
    let fx = fixtures_dir().join(GQA);
    let env = [
        ("RANK", "3"),
        ("WORLD_SIZE", "4"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "1"),
    ];
    let r = json_ok(
        &[
            s(&fx),
            "--tp",
            "4",
            "--device",
            "cpu",
            "--dry-run",
            "--json",
        ],
        &env,
    );
    assert_eq!(reported_ranks(&r), vec![3], "{r}");
}
