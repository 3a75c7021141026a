"""TODO docstring."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from project import adapters
from project.errors import ConfigError, yaml_problem

# Trainer settings Lightning uses without checking them first: these values crashed deep in a loop
# (ZeroDivisionError, IndexError), were reported against another key, or trained with a meaningless setting.
# key -> (check of a set value, what to use instead). Lightning's own checks cover the rest.
TRAINER_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "accumulate_grad_batches": (lambda v: v >= 1, "a positive integer (1: no accumulation)"),
    "check_val_every_n_epoch": (lambda v: v >= 1, "a positive integer, or null to validate by val_check_interval"),
    "val_check_interval": (
        lambda v: isinstance(v, float) or v >= 1,
        "a positive number of training batches, or a fraction of the epoch in [0.0, 1.0]",
    ),
    "limit_test_batches": (lambda v: v != 0, "a positive number of batches or a fraction: fit ends with a test"),
    "gradient_clip_val": (lambda v: v >= 0, "a non-negative number (0 or null: no clipping)"),
    "num_sanity_val_steps": (lambda v: v >= -1, "-1 (all batches), 0 (no sanity check) or a number of batches"),
    "min_epochs": (lambda v: v >= 0, "a non-negative integer"),
    "min_steps": (lambda v: v >= 0, "a non-negative integer"),
}


def _as_list(value: Any) -> list[Any]:
    """A config value that is one item, a list of them, or unset (None/false) as a list."""
    return value if isinstance(value, list) else [value] if value else []


def _names_subclass(item: Any, base: type) -> bool:
    """Whether a parsed (not yet instantiated) config item names a subclass of ``base`` by its ``class_path``."""
    path = getattr(item, "class_path", None)
    if not isinstance(path, str):
        return False
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, base)


# Class paths that run folders and configs written before the package was split into subpackages name, and the
# classes' homes today: such a config still runs (config.yaml of an older run, a user's own overlay).
MOVED_CLASS_PATHS = {
    "project.slim.StructuredPruning": "project.callbacks.StructuredPruning",
    "project.ddp.BoundDDPStrategy": "project.cluster.BoundDDPStrategy",
    "project.epoch_metrics.EpochMetrics": "project.report.EpochMetrics",
    "project.run_logger.RunTensorBoardLogger": "project.report.RunTensorBoardLogger",
    "project.report.TensorBoardLogger": "project.report.RunTensorBoardLogger",
    "project.sweep_trial.ReportToStudy": "project.sweep.ReportToStudy",
}
_MOVED = re.compile("|".join(re.escape(old) + r"(?![\w.])" for old in MOVED_CLASS_PATHS))


def upgrade_class_paths(args: list[str]) -> list[str]:
    """``args`` with every class path of :data:`MOVED_CLASS_PATHS` replaced by the class's home today: in command
    line values (``--trainer.callbacks+=project.slim.StructuredPruning``) and in the YAML/JSON config files named
    (a file that names one is passed on as its upgraded text). Other arguments are returned unchanged."""
    upgraded = []
    for arg in args:
        arg = _MOVED.sub(lambda m: MOVED_CLASS_PATHS[m.group(0)], str(arg))
        path = Path(arg)
        if path.suffix.lower() in (".yaml", ".yml", ".json") and path.is_file():
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError):
                text = ""  # check_config_files names the problem
            if _MOVED.search(text):
                arg = _MOVED.sub(lambda m: MOVED_CLASS_PATHS[m.group(0)], text)
        upgraded.append(arg)
    return upgraded


def check_config_files(args: Any) -> None:
    """Read every YAML/JSON config file named in ``args`` (``--config`` files, overlays, a file given as an
    option's value) with the safe loader first, so that a syntax error names the file, line and column.

    jsonargparse parses the same files afterwards; its own message says ``"<unicode string>"`` instead of the file.

    Raises:
        ConfigError: ``<file>, line L, column C: <what the YAML parser found>``.
    """
    if not isinstance(args, (list, tuple)):
        return
    for arg in args:
        value = str(arg).split("=", 1)[1] if str(arg).startswith("--") and "=" in str(arg) else str(arg)
        path = Path(value)
        if path.suffix.lower() not in (".yaml", ".yml", ".json") or not path.is_file():
            continue
        try:
            yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(yaml_problem(path, e)) from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read the config file ({e})") from None


def fastest_precision(accelerator: Any) -> str:
    """The mixed precision this machine runs fastest, for ``auto_precision``.

    ``16-mixed`` when training on a CUDA GPU (tensor cores; the recipes' AMP trick), ``bf16-mixed`` on a CPU
    whose oneDNN has native bf16 (AVX512-BF16 or AMX), else ``32-true``: without native bf16 the CPU emulates
    it with conversions.
    """
    name = str(getattr(accelerator, "class_path", accelerator) or "auto").lower()
    if torch.cuda.is_available() and ("auto" in name or "gpu" in name or "cuda" in name):
        return "16-mixed"
    return "bf16-mixed" if adapters.cpu_has_native_bf16() else "32-true"
