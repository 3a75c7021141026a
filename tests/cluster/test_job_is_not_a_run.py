"""A job is not a run (issue kind): every fit of one job gets its own run; a restart of the job resumes each fit's
own run, told apart by the config as given and, under SLURM, by the restart count."""

from __future__ import annotations

import json

import pytest
from helpers import results, run_dirs, run_main, tiny_args

SHORT = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1"]


def fits(paths, logs, seeds) -> None:
    for seed in seeds:
        assert run_main(tiny_args(paths, logs, *SHORT, "--seed_everything", str(seed))) == 0


def test_a_seed_loop_in_one_job_trains_every_seed_and_a_restart_finds_each_run(
    tiny_mnist, tmp_path, monkeypatch, capsys
):
    """Two fits under one ``PROJECT_JOB_ID`` (a loop in one script): two runs, both trained. The job restarted runs
    the loop again: each fit finds its own finished run, and nothing new is started or trained."""
    monkeypatch.setenv("PROJECT_JOB_ID", "seed-loop-7")
    logs = tmp_path / "logs"
    fits(tiny_mnist, logs, (1, 2))
    runs = run_dirs(logs)
    assert [results(r)["seed"] for r in runs] == [1, 2]
    keys = [json.loads((r / "slurm_job.json").read_text())["starts"][0]["fit"] for r in runs]
    assert len(set(keys)) == 2 and all(len(k) == 16 for k in keys)
    capsys.readouterr()
    fits(tiny_mnist, logs, (1, 2))
    assert run_dirs(logs) == runs and capsys.readouterr().out.count("already finished") == 2


@pytest.mark.parametrize("restarted", [False, True])
def test_under_slurm_the_same_fit_twice_in_one_start_is_two_runs(restarted, tiny_mnist, tmp_path, monkeypatch, capsys):
    """Under SLURM, the same command twice in one start of the job (a repeat loop) trains twice; after a requeue
    (``SLURM_RESTART_COUNT`` 1) the same command resumes the newest run of that fit instead."""
    for name, value in {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "991", "SLURM_PROCID": "0",
                        "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    logs = tmp_path / "logs"
    fits(tiny_mnist, logs, (5,))
    if restarted:
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    capsys.readouterr()
    fits(tiny_mnist, logs, (5,))
    assert len(run_dirs(logs)) == (1 if restarted else 2)
    assert ("already finished" in capsys.readouterr().out) is restarted
