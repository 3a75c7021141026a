"""One callback object, several fits (the notebook pattern, issue 34): every callback the product ships, given to
a second Trainer, leaves the first run's folder as it was and gives the second fit what a new object gives it."""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

import project.callbacks
import project.cluster
import project.report
import project.sweep
from project.module import ImageClassifier
from project.report import RunTensorBoardLogger

# constructor arguments where the defaults would do nothing in 3 short epochs
SETTINGS: dict[str, dict[str, Any]] = {
    "Pruning": {"amount": 0.5, "start_epoch": 0, "end_epoch": 1},
    "StructuredPruning": {"amount": 0.3, "start_epoch": 1},
    "RunCheckpoint": {"monitor": "val/acc", "mode": "max", "save_last": True},
    "CudnnFlags": {"enabled": False},
}
NOT_REUSABLE = {
    "ScheduledPruning": "the schedule both pruning callbacks share, not a callback of its own",
    "ReportToStudy": "built by the sweep for one trial (it needs the trial's study)",
}


def shipped() -> list[type[Callback]]:
    """Every Lightning callback class on the package faces (the class paths configs name)."""
    found = {}
    for face in (project.callbacks, project.report, project.cluster, project.sweep):
        for name in face.__all__:
            cls = getattr(face, name)
            if inspect.isclass(cls) and issubclass(cls, Callback):
                found[name] = cls
    return [found[name] for name in sorted(found)]


def loader() -> DataLoader:
    """64 seeded MNIST-shaped images in batches of 16: float32 (16, 1, 28, 28), labels int64 (16,)."""
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.rand(64, 1, 28, 28, generator=g), torch.randint(0, 10, (64,), generator=g)), 16
    )


def fit(callback: Callback, root: Path) -> tuple[L.Trainer, ImageClassifier, Path]:
    """3 epochs of LeNet with ``callback`` in a new run folder under ``root``: the Trainer, the model, the folder."""
    L.seed_everything(0)
    model = ImageClassifier()
    trainer = L.Trainer(
        max_epochs=3,
        callbacks=[callback],
        logger=RunTensorBoardLogger(save_dir=root, name="run", log_graph=False),
        accelerator="cpu",
        limit_val_batches=2,
        num_sanity_val_steps=0,
        enable_checkpointing=isinstance(callback, L.pytorch.callbacks.ModelCheckpoint),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader(), loader())
    return trainer, model, Path(trainer.log_dir)


def folder(run: Path) -> dict[str, str]:
    """Every file under ``run`` (TensorBoard's event files aside: their names hold the time) and its sha256."""
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file() and "tfevents" not in p.name
    }


def observed(callback: Callback, model: ImageClassifier) -> dict[str, Any]:
    """What a fit's callback and model end with: the weights, and the callback's results or measurements."""
    seen: dict[str, Any] = {"weights": {k: v.clone() for k, v in model.state_dict().items()}}
    if hasattr(callback, "results"):
        seen["results"] = callback.results()
    if hasattr(callback, "epoch_time_s"):
        seen["epochs timed"] = len(callback.epoch_time_s)
    for key in ("best_model_path", "last_model_path"):
        if getattr(callback, key, None):
            seen[key] = Path(getattr(callback, key)).name
    return seen


def test_every_shipped_callback_is_walked():
    names = {cls.__name__ for cls in shipped()}
    assert set(NOT_REUSABLE) <= names and set(SETTINGS) <= names
    assert len(names) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("cls", [c for c in shipped() if c.__name__ not in NOT_REUSABLE], ids=lambda c: c.__name__)
def test_a_callback_object_fits_a_second_model_as_a_new_one_would(cls, tmp_path):
    callback = cls(**SETTINGS.get(cls.__name__, {}))
    _, _, first = fit(callback, tmp_path / "reused")
    before = folder(first)
    _, model, second = fit(callback, tmp_path / "reused")
    assert second != first and folder(first) == before  # the first run's folder is left as it was
    fresh = cls(**SETTINGS.get(cls.__name__, {}))
    _, fresh_model, fresh_run = fit(fresh, tmp_path / "fresh")
    assert set(folder(second)) == set(folder(fresh_run))  # the same files (checkpoints, metrics.csv, ...)
    got, want = observed(callback, model), observed(fresh, fresh_model)
    assert got.keys() == want.keys()
    for key in got.keys() - {"weights"}:
        assert got[key] == want[key], key
    assert got["weights"].keys() == want["weights"].keys()
    for name, value in got["weights"].items():
        assert torch.equal(value, want["weights"][name]), name
