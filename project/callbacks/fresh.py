"""One callback object, several fits: :class:`FreshEachFit`."""

from __future__ import annotations

import copy
import weakref
from typing import Any

import lightning as L
import torch

# attributes of the mechanism itself, never reset
_OWN = ("_constructed", "_fit_trainer")


def _copied(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with fresh copies of its containers and tensors; other values (functions, file systems, numbers,
    strings) are shared."""
    return {k: copy.deepcopy(v) if isinstance(v, (dict, list, set, torch.Tensor)) else v for k, v in state.items()}


class FreshEachFit:
    """Mixin for the project's callbacks that keep state during a fit: a callback object given to another Trainer
    (the notebook pattern: build the callbacks once, fit several models one after the other) starts that fit as a
    newly constructed object would. Without it, a second fit would carry the first's state: its checkpoint folder
    and best paths (``RunCheckpoint``, which would then write into the first run's folder), the layers of the
    first model (``Pruning``, whose hooks then fail), its epoch timings (``Throughput``).

    Subclasses call :meth:`fresh_for` first thing in ``setup``. The state is kept when the same Trainer fits again
    or tests after fitting (``trainer.test(ckpt_path="best")`` needs the best path), and a resumed fit restores
    its state from the checkpoint after ``setup``, as before.
    """

    def fresh_for(self, trainer: L.Trainer, stage: str) -> None:
        """At the ``setup`` of a fit: remember the state as constructed (first fit) or go back to it (a fit by
        another Trainer than the last one)."""
        if stage != "fit":
            return
        state = self.__dict__
        if "_constructed" not in state:
            state["_constructed"] = _copied({k: v for k, v in state.items() if k not in _OWN})
        else:
            last = state.get("_fit_trainer")
            if last is None or last() is not trainer:
                for key in [k for k in state if k not in _OWN and k not in state["_constructed"]]:
                    del state[key]  # set by the previous fit (Lightning sets some only in setup)
                state.update(_copied(state["_constructed"]))
        state["_fit_trainer"] = weakref.ref(trainer)

    def __getstate__(self) -> dict[str, Any]:
        # pickled (ddp_spawn, deepcopy): a weak reference cannot be, and another process has another Trainer
        return {k: v for k, v in self.__dict__.items() if k != "_fit_trainer"}
