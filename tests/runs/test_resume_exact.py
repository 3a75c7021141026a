"""Exact resume (issue 24): a run resumed from any checkpoint, on any loader path, ends with the weights of an
uninterrupted run, bit for bit (CPU, ``deterministic: true``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import REPO, results, run_dirs, run_main, tiny_args
from lightning.pytorch.callbacks import Callback

SGD = [
    "--model.optimizer",
    "torch.optim.SGD",
    "--model.optimizer.lr",
    "0.01",
    "--model.optimizer.momentum",
    "0.9",
    "--trainer.deterministic",
    "true",
]
# the optimizer's lr agrees with max_lr: OneCycleLR sets it (another value is refused, never used)
ONE_CYCLE = [*SGD, "--model.lr_scheduler", "torch.optim.lr_scheduler.OneCycleLR", "--model.lr_scheduler.max_lr", "0.05"]
ONE_CYCLE += ["--model.optimizer.lr", "0.05", "--model.optimizer.momentum", "0.95"]  # max_momentum, its start
STEP_LR = [
    *SGD,
    "--model.lr_scheduler",
    "torch.optim.lr_scheduler.StepLR",
    "--model.lr_scheduler.step_size",
    "1",
    "--model.lr_scheduler.gamma",
    "0.5",
]
WORKERS_2 = ["--data.in_memory", "false", "--data.num_workers", "2"]
LOADERS = {
    "in_memory": ["--data.in_memory", "true"],
    "workers_0": ["--data.in_memory", "false", "--data.num_workers", "0"],
    "workers_2": WORKERS_2,
    "workers_2_persistent": [*WORKERS_2, "--data.persistent_workers", "true"],
}


class StopAt(Callback):
    """Test-only: stops the run after training step ``step``. In the middle of an epoch it first writes
    ``checkpoints/at.ckpt`` into the run folder (as SLURM's preemption handler writes ``hpc_ckpt_<k>.ckpt``); at an
    epoch's end the run's ``last.ckpt``, written after that epoch's validation, is where to resume from."""

    def __init__(self, step: int = 0) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args, **kwargs) -> None:
        if trainer.global_step == self.step and trainer.global_step % trainer.num_training_batches:
            trainer.save_checkpoint(Path(trainer.log_dir) / "checkpoints" / "at.ckpt")
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Callable[..., Path]:
    """``uninterrupted(paths, *args)``: the run folder of an uninterrupted ``fit`` of :func:`helpers.tiny_args` with
    ``args`` on the tiny data in ``paths``, trained once per ``args`` for the whole module (the tiny data set is the
    same, byte for byte, in every test) and shared by the cases that compare with it. Read it, don't change it."""
    runs: dict[tuple[str, ...], Path] = {}

    def run(paths: dict, *args: str) -> Path:
        if args not in runs:
            logs = tmp_path_factory.mktemp("uninterrupted")
            assert run_main(tiny_args(paths, logs, *args)) == 0
            (runs[args],) = run_dirs(logs)
        return runs[args]

    return run


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def assert_same_run(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    differ = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not differ, f"weights differ from the uninterrupted run's: {differ}"
    ra, rb = results(a), results(b)
    for key in ("test_acc", "test_loss", "best_val_acc", "global_step", "epochs"):
        assert rb[key] == ra[key], key


# Mid-epoch, every loader (each holds its own position inside an epoch: batches drawn, worker iterators); at an
# epoch's end the two ways an epoch's order is drawn (the in-memory batches, the DataLoader's sampler, which all the
# worker settings share), not the worker settings again.
RESUME_POINTS = [(14, loader) for loader in LOADERS] + [(10, "in_memory"), (10, "workers_0")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("step", "loader"), RESUME_POINTS, ids=[f"{'mid_epoch' if s == 14 else 'epoch_end'}-{x}" for s, x in RESUME_POINTS]
)
def test_resume_from_any_step_ends_with_the_uninterrupted_weights(
    loader, step, uninterrupted, tiny_mnist, tmp_path, monkeypatch
):
    """2 epochs of 10 steps, stopped after step 14 (4 batches into epoch 1, e.g. a SLURM requeue) or at the end of
    epoch 0 (step 10) and resumed from there: the uninterrupted run's weights and results (that run is trained once
    per loader, for both resume points)."""
    monkeypatch.chdir(tmp_path)
    args = [*ONE_CYCLE, *LOADERS[loader], "--trainer.max_epochs", "2"]
    straight = uninterrupted(tiny_mnist, *args)
    stop = ["--trainer.callbacks+=test_resume_exact.StopAt", "--trainer.callbacks.step", str(step)]
    assert run_main(tiny_args(tiny_mnist, tmp_path / "b", *args, *stop)) == 0
    (run,) = run_dirs(tmp_path / "b")
    ckpt = run / "checkpoints" / ("at.ckpt" if step % 10 else "last.ckpt")
    assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] == step
    assert run_main(tiny_args(tiny_mnist, tmp_path / "b", *args, "--ckpt_path", str(ckpt))) == 0
    assert run_dirs(tmp_path / "b") == [run]  # resumed in place
    assert results(run)["global_step"] == 20
    assert_same_run(straight, run)


@pytest.mark.slow
def test_resume_mid_epoch_with_workers_and_a_plain_schedule(uninterrupted, tiny_mnist, tmp_path, monkeypatch):
    """Without a length-sized scheduler the fit loop builds the training loader itself, after the checkpoint's loop
    state is restored (the one-cycle runs above build it earlier, in ``configure_optimizers``): exact too (2 epochs,
    stopped after step 17, 7 batches into epoch 1)."""
    monkeypatch.chdir(tmp_path)
    args = [*STEP_LR, *LOADERS["workers_2"], "--trainer.max_epochs", "2"]
    straight = uninterrupted(tiny_mnist, *args)
    stop = ["--trainer.callbacks+=test_resume_exact.StopAt", "--trainer.callbacks.step", "17"]
    assert run_main(tiny_args(tiny_mnist, tmp_path / "b", *args, *stop)) == 0
    (run,) = run_dirs(tmp_path / "b")
    assert run_main(tiny_args(tiny_mnist, tmp_path / "b", *args, "--ckpt_path", str(run / "checkpoints/at.ckpt"))) == 0
    assert_same_run(straight, run)


@pytest.mark.slow
@pytest.mark.parametrize(("first", "final", "max_epochs"), [(3, 12, 3), (3, 15, -1), (10, 15, -1)])
def test_max_steps_stop_then_resume_to_more_steps_is_exact(
    first, final, max_epochs, uninterrupted, tiny_mnist, tmp_path, monkeypatch
):
    """A run stopped by ``trainer.max_steps`` (in the middle of epoch 0, or at its end) and resumed with
    ``--ckpt_path last`` and a larger ``max_steps`` ends as a straight run to that step count (10 steps per epoch;
    the two cases that end at step 15 share their straight run)."""
    monkeypatch.chdir(tmp_path)
    args = [*STEP_LR, "--trainer.max_epochs", str(max_epochs)]
    straight = uninterrupted(tiny_mnist, *args, "--trainer.max_steps", str(final))
    assert run_main(tiny_args(tiny_mnist, tmp_path / "b", *args, "--trainer.max_steps", str(first))) == 0
    (run,) = run_dirs(tmp_path / "b")
    assert results(run)["global_step"] == first
    resume = [*args, "--trainer.max_steps", str(final), "--ckpt_path", "last"]
    assert run_main(tiny_args(tiny_mnist, tmp_path / "b", *resume)) == 0
    assert run_dirs(tmp_path / "b") == [run]
    assert results(run)["global_step"] == results(straight)["global_step"] == final
    assert_same_run(straight, run)


@pytest.mark.slow
def test_lightning_counts_the_resumed_epoch_twice_towards_max_epochs_with_max_steps(tiny_mnist, tmp_path, monkeypatch):
    """The limit docs/reliability.md states: with ``trainer.max_steps`` set, Lightning 2.6 counts the epoch a
    checkpoint was written in twice towards ``max_epochs``, so a resumed run that ``max_epochs`` (2 epochs, 20 steps)
    would stop before ``max_steps`` (15) ends one epoch early, at step 10. Fails once Lightning counts right: then
    drop that sentence."""
    monkeypatch.chdir(tmp_path)
    args = [*STEP_LR, "--trainer.max_epochs", "2", "--trainer.max_steps"]
    assert run_main(tiny_args(tiny_mnist, tmp_path / "a", *args, "15")) == 0
    assert run_main(tiny_args(tiny_mnist, tmp_path / "b", *args, "3")) == 0
    assert run_main(tiny_args(tiny_mnist, tmp_path / "b", *args, "15", "--ckpt_path", "last")) == 0
    (straight,), (run,) = run_dirs(tmp_path / "a"), run_dirs(tmp_path / "b")
    assert results(straight)["global_step"] == 15 and results(run)["global_step"] == 10


def throughput_curves(run: Path) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of the cumulative throughput tags in every event file of ``run`` (a resumed run
    writes a file per fit)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    curves: dict[str, dict[int, float]] = {}
    for events in sorted(run.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0}).Reload()
        for tag in ("train/samples", "train/batches", "train/time"):
            if tag in acc.Tags()["scalars"]:
                curves.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return curves


def test_throughput_totals_continue_across_a_resume(uninterrupted, tiny_mnist, tmp_path, monkeypatch):
    """Lightning's ThroughputMonitor starts train/samples, train/batches and train/time at 0 on every fit, so a
    resumed run's curves jumped back. Stopped after step 14 and resumed, they continue: samples and batches at every
    step as the uninterrupted run logged them, time never going back."""
    monkeypatch.chdir(tmp_path)
    args = [*STEP_LR, *LOADERS["in_memory"], "--trainer.max_epochs", "2", "--trainer.log_every_n_steps", "1"]
    straight = throughput_curves(uninterrupted(tiny_mnist, *args))
    stop = ["--trainer.callbacks+=test_resume_exact.StopAt", "--trainer.callbacks.step", "14"]
    assert run_main(tiny_args(tiny_mnist, tmp_path / "b", *args, *stop)) == 0
    (run,) = run_dirs(tmp_path / "b")
    assert run_main(tiny_args(tiny_mnist, tmp_path / "b", *args, "--ckpt_path", str(run / "checkpoints/at.ckpt"))) == 0
    resumed = throughput_curves(run)
    for tag in ("train/samples", "train/batches"):
        assert max(resumed[tag]) >= 19 and resumed[tag] == straight[tag], tag
    assert resumed["train/samples"][19] == 50 * 20  # batches of 50: every sample of both epochs counted once
    # time goes on from where the first fit was (the batch its checkpoint missed is estimated, so the first fit's
    # very last point may be a little later than the resumed first one; never back at 0)
    time = resumed["train/time"]
    after = [time[step] for step in sorted(time) if step >= 14]
    assert after == sorted(after) and after[0] > time[12] > 0


def test_a_mid_epoch_checkpoint_resumes_only_under_the_processes_that_wrote_it(
    tiny_mnist, tmp_path, monkeypatch, capsys
):
    """The data module's count of an epoch's batches done is per process: a checkpoint 3 batches into an epoch of
    one process, resumed by two DDP processes, would train each rank's share from its 4th batch (images the first
    process trained, or never reached). Refused before anything starts or is written; an epoch's end is not."""
    monkeypatch.chdir(tmp_path)
    stop = ["--trainer.callbacks+=test_resume_exact.StopAt", "--trainer.callbacks.step", "3"]
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", *SGD, *stop)) == 0
    (run,) = run_dirs(tmp_path / "logs")
    state = torch.load(run / "checkpoints" / "at.ckpt", weights_only=True)["MNISTDataModule"]
    assert state == {"train_batches_done": 3, "world_size": 1}
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*"))
    ddp = ["--config", str(REPO / "configs/trainer/ddp_cpu.yaml")]
    capsys.readouterr()
    resume = tiny_args(tiny_mnist, tmp_path / "logs", *SGD, *ddp, "--ckpt_path", str(run / "checkpoints" / "at.ckpt"))
    assert run_main(resume) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "3 batches into an epoch by 1 process(es), and this resume runs 2" in err[0], err
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*")) == before
