"""pytest plugin: runs Lightning's own tests for a parent class against the project's subclass.

Loaded by ``scripts/upstream_tests.sh`` (``-p upstream_subject``). With ``UPSTREAM_SUBJECT=ours`` each Lightning
test module below gets the project's class under the parent's name (the module global the tests call), so
every ``ModelCheckpoint(...)``, ``isinstance(..., ModelCheckpoint)`` and ``mock.patch.object(ModelCheckpoint,
...)`` in that module uses the subclass; with ``UPSTREAM_SUBJECT=parent`` (the default) nothing is replaced and
the same run measures Lightning's class itself. ``UPSTREAM_PARENT_STATE_KEY=1`` (with ``ours``) also gives the
subclass the parent's ``state_key`` (Lightning's tests look a callback's checkpoint state up under the literal
``"ModelCheckpoint{...}"``), to see which tests fail for another reason than the class name.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

# Lightning test module name -> (name the tests use, "module:attribute" of the project's subclass)
SUBJECTS = {
    "test_model_checkpoint": ("ModelCheckpoint", "project.callbacks:RunCheckpoint"),
    "test_throughput_monitor": ("ThroughputMonitor", "project.callbacks:Throughput"),
    "test_lr_monitor": ("LearningRateMonitor", "project.callbacks:StepLearningRateMonitor"),
    "test_tensorboard": ("TensorBoardLogger", "project.report:RunTensorBoardLogger"),
}


def _subclass(spec: str) -> type:
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def _parent_state_key(cls: type, parent: type) -> type:
    """``cls`` whose ``state_key`` names ``parent`` (same arguments), under ``cls``'s own name."""

    def state_key(self: Any) -> str:
        return cls.state_key.fget(self).replace(cls.__qualname__, parent.__qualname__, 1)

    probe = type(cls.__name__, (cls,), {"state_key": property(state_key), "__qualname__": cls.__qualname__})
    globals()[cls.__qualname__] = probe  # picklable by name (Lightning's test_pickling)
    return probe


def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    ours = os.environ.get("UPSTREAM_SUBJECT", "parent") == "ours"
    done = set()
    for item in items:
        module = getattr(item, "module", None)
        if module is None or module in done:
            continue
        done.add(module)
        short = module.__name__.rsplit(".", 1)[-1]
        if short not in SUBJECTS:
            continue
        name, spec = SUBJECTS[short]
        parent = getattr(module, name)
        cls = _subclass(spec) if ours else parent
        if not issubclass(cls, parent):
            raise TypeError(f"{spec} is not a subclass of {parent!r}")
        if ours and os.environ.get("UPSTREAM_PARENT_STATE_KEY") == "1":
            cls = _parent_state_key(cls, parent)
        setattr(module, name, cls)
        sys.stderr.write(f"upstream_subject: {module.__name__}.{name} = {cls.__module__}.{cls.__qualname__}\n")
