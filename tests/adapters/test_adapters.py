"""The library members the product reaches into exist with the shape ``project.adapters`` uses, and nothing outside
that module uses a library's non-public (underscored) member (issue: public API only)."""

from __future__ import annotations

import inspect
import io
import re
import tokenize
from typing import Optional, Union

import lightning as L
import torch
from helpers import REPO
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ModelPruning, ThroughputMonitor
from lightning.pytorch.cli import LightningArgumentParser

from project import adapters
from project.callbacks.checkpoint import RunCheckpoint
from project.callbacks.pruning import Pruning
from project.callbacks.training import Throughput

PACKAGE = REPO / "project"


def attribute_names(path) -> set[str]:
    """Names accessed as ``<expr>._name`` in a Python file (code only: comments and strings are skipped)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    return {
        b.string
        for a, b in zip(tokens, tokens[1:])
        if a.string == "." and b.type == tokenize.NAME and re.fullmatch(r"_[a-z]\w*", b.string)
    }


def own_names() -> set[str]:
    """Underscored names the project defines itself (functions, methods, attributes, class attributes)."""
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        names |= set(re.findall(r"\bdef (_[a-z]\w*)", text))
        names |= set(re.findall(r"\bself\.(_[a-z]\w*)\s*(?::[^=\n]+)?=[^=]", text))
        names |= set(re.findall(r"^\s+(_[a-z]\w*)\s*(?::[^=\n]+)?=[^=]", text, re.M))
        names |= set(re.findall(r"^(_[a-z]\w*)\s*(?::[^=\n]+)?=[^=]", text, re.M))
    return names


def test_no_library_private_member_outside_the_adapter_module():
    ours = own_names() | {"_exit"}  # os._exit: the standard library's documented immediate exit
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "adapters.py":
            continue
        foreign = sorted(attribute_names(path) - ours)
        if foreign:
            found[str(path.relative_to(REPO))] = foreign
    assert found == {}


def test_no_library_private_method_is_overridden_outside_the_adapter_module():
    """A project class that defines a method a library parent has under an underscored name overrides library
    internals: only ``project.adapters`` may (its ``LastSaveRecorder``, ``TrainerCallbacksCLI``,
    ``LotteryTicketFromInitialValues``)."""
    import importlib
    import pkgutil

    import project

    found, checked = [], 0
    for info in pkgutil.walk_packages(project.__path__, "project."):
        if info.name == "project.adapters" or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if not isinstance(cls, type) or cls.__module__ != module.__name__:
                continue
            library = [b for b in cls.__mro__[1:] if not b.__module__.startswith("project") and b is not object]
            checked += bool(library)
            for name in vars(cls):
                if (
                    name.startswith("_")
                    and not name.startswith("__")
                    and name != "_abc_impl"
                    and any(hasattr(b, name) for b in library)
                ):
                    found.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    assert checked >= 10 and found == []
    assert any(name.startswith("_") for name in vars(adapters.LastSaveRecorder))  # the test sees overrides


def test_lightning_members_the_adapters_use_still_exist(tiny_mnist, tmp_path):
    for cls, names in (
        (ModelCheckpoint, ["_save_last_checkpoint", "_monitor_candidates", "_should_save_on_train_epoch_end"]),
        (ModelPruning, ["_run_pruning", "_copy_param"]),
        (ThroughputMonitor, ["_compute", "_update"]),
        (LearningRateMonitor, ["_extract_stats"]),
    ):
        for name in names:
            assert callable(getattr(cls, name, None)), f"{cls.__name__}.{name}"
    params = inspect.signature(ModelCheckpoint._save_last_checkpoint).parameters
    assert list(params)[1:] == ["trainer", "monitor_candidates"]
    assert list(inspect.signature(ThroughputMonitor._compute).parameters)[1:] == ["trainer", "iter_num"]
    # the attributes, on live objects after a real (tiny) fit
    from project.data.modules import MNISTDataModule
    from project.module import ImageClassifier

    pruning, ckpt, monitor, lr = Pruning(amount=0.5), RunCheckpoint(dirpath=tmp_path / "c"), Throughput(), None
    lr = LearningRateMonitor(logging_interval="step")
    logger = L.pytorch.loggers.CSVLogger(tmp_path)
    trainer = L.Trainer(
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=1,
        logger=logger,
        accelerator="cpu",
        callbacks=[pruning, ckpt, monitor, lr],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    dm = MNISTDataModule(data_dir=tiny_mnist["data"], source_dir=tiny_mnist["source"], val_size=100, batch_size=50)
    trainer.fit(ImageClassifier(net="lenet", num_classes=10, input_shape=(1, 28, 28)), datamodule=dm)
    assert len(adapters.pruning_targets(pruning)) == 4 and adapters.pruning_settings(pruning) == (["weight"], True)
    from lightning.pytorch.trainer.states import RunningStage

    t0, samples, times = adapters.training_clock(monitor, RunningStage.TRAINING)
    assert samples == 100 and len(times) >= 1 and isinstance(t0, float)
    assert adapters.optimizer_steps(trainer) == 2
    assert set(adapters.lr_stats(lr, trainer)) == {"lr-SGD"}
    adapters.set_default_root_dir(trainer, str(tmp_path / "root"))
    assert trainer.default_root_dir == str(tmp_path / "root")


def test_jsonargparse_and_torch_members_the_adapters_use_still_exist():
    parser = LightningArgumentParser()
    parser.add_argument("--limit", type=Optional[Union[float, int]], default=None)  # noqa: UP007, UP045
    adapters.prefer_int_over_float(parser)
    assert parser.parse_args(["--limit", "1"]).limit == 1 and isinstance(parser.parse_args(["--limit", "1"]).limit, int)
    assert parser.parse_args(["--limit", "0.5"]).limit == 0.5
    # declared_type: the type jsonargparse checks a key against, for the one-line parse errors (project.entry)
    from jsonargparse.typing import PositiveInt

    from project.data.modules import MNISTDataModule

    parser.add_class_arguments(MNISTDataModule, "data")
    assert adapters.declared_type(parser, "data.batch_size") is PositiveInt
    assert adapters.declared_type(parser, "limit") == Optional[Union[int, float]]  # noqa: UP007, UP045
    assert adapters.declared_type(parser, "data.no_such_key") is None
    assert isinstance(adapters.cpu_has_native_bf16(), bool)
    assert callable(torch.ops.mkldnn._is_mkldnn_bf16_supported)
