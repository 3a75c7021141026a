"""project.cli.gate: a resume's checkpoint is read from disk once, checked, and those very bytes are what Lightning
restores (no second read that a swapped file could slip through)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers import ONECYCLE, results, run_dirs, run_main, tiny_args

from project.cli.gate import CheckpointGate


def resume_args(tiny_mnist, logs: Path, last: Path) -> list[str]:
    return tiny_args(tiny_mnist, logs, "--trainer.max_epochs", "2", "--ckpt_path", str(last))


@pytest.fixture
def one_epoch(tiny_mnist, tmp_path, monkeypatch) -> Path:
    """A finished 1-epoch tiny run under ``tmp_path/logs``; returns its ``last.ckpt``."""
    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--trainer.max_epochs", "1")) == 0
    (run,) = run_dirs(tmp_path / "logs")
    return run / "checkpoints" / "last.ckpt"


@pytest.mark.slow
def test_a_resume_reads_its_checkpoint_file_once(one_epoch, tiny_mnist, tmp_path, monkeypatch):
    reads = []
    load = torch.load

    def counting_load(f, *args, **kwargs):
        if isinstance(f, str | os.PathLike) and Path(f).resolve() == one_epoch.resolve():
            reads.append(f)
        return load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counting_load)
    assert run_main(resume_args(tiny_mnist, tmp_path / "logs", one_epoch)) == 0
    assert len(reads) == 1  # the gate's read; Lightning got the checked dict from the checkpoint IO
    assert results(one_epoch.parent.parent)["epochs"] == 2


@pytest.mark.slow
def test_lightning_restores_the_checked_bytes_even_if_the_file_is_swapped(one_epoch, tiny_mnist, tmp_path, monkeypatch):
    """The file replaced after the gate checked it (a run folder others can write): the resume continues from what
    was checked; the swapped bytes are never read."""
    hand_to = CheckpointGate.hand_to

    def hand_to_then_swap(self, trainer):
        hand_to(self, trainer)
        one_epoch.write_bytes(b"swapped: not a checkpoint")

    monkeypatch.setattr(CheckpointGate, "hand_to", hand_to_then_swap)
    assert run_main(resume_args(tiny_mnist, tmp_path / "logs", one_epoch)) == 0
    r = results(one_epoch.parent.parent)
    assert r["epochs"] == 2 and r["global_step"] == 20  # 500 images / 50 per batch, two epochs


@pytest.mark.slow
@pytest.mark.parametrize("config", ["", "[not, a, mapping]\n"])
def test_a_run_config_that_says_nothing_skips_the_schedule_check_with_a_warning(
    config, tiny_mnist, tmp_path, caplog, monkeypatch
):
    """A run with a sized schedule (one-cycle) whose config.yaml was emptied or is not a mapping: the gate cannot
    compare the schedule's settings, says so once, and goes on (the checkpoint itself was checked): here to find
    the run finished."""
    from project.runs import layout

    monkeypatch.chdir(tmp_path)
    args = [*ONECYCLE, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3"]
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", *args)) == 0
    (run,) = run_dirs(tmp_path / "logs")
    written = layout.latest_config(run)
    written.write_text(config)
    with caplog.at_level("WARNING", logger="project"):
        resume = ["--ckpt_path", str(run / "checkpoints" / "last.ckpt")]
        assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", *args, *resume)) == 0
    warned = [r.getMessage() for r in caplog.records if "schedule's settings are not compared" in r.getMessage()]
    assert warned == [f"{written} is empty or unreadable; the schedule's settings are not compared"]
    assert results(run)["global_step"] == 3 and run_dirs(tmp_path / "logs") == [run]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--seed_everything", "7"], "seed_everything 42 -> 7); resume with the run's own seed_everything: 42"),
        (["--data.val_size", "99"], "data.val_size 100 -> 99); resume with the run's own data.val_size: 100"),
        (
            ["--data.folds", "3", "--data.val_size", "null"],
            "data.folds null -> 3); resume with the run's own data.folds: null",
        ),
    ],
    ids=["seed", "val_size", "folds"],
)
def test_a_resume_that_would_validate_on_other_images_is_refused(
    change, message, one_epoch, tiny_mnist, tmp_path, capsys
):
    """A plain run resumed with another seed or val_size (or turned into a fold run) would go on choosing its best
    checkpoint on other images, some of which it trained on: one ``error:`` line naming the change and the run's
    own value, and the run folder as it was."""
    run = one_epoch.parent.parent
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*"))
    capsys.readouterr()
    assert run_main([*resume_args(tiny_mnist, tmp_path / "logs", one_epoch), *change]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and message in err[0] and "validating on other images" in err[0], err
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*")) == before
