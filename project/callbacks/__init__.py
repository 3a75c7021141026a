"""The project's Lightning callbacks and checkpoint plugin, one module per job.

* :mod:`~project.callbacks.pruning` -- :class:`ScheduledPruning`, the schedule both pruning callbacks share;
  :class:`Pruning` (unstructured, Lightning's ``ModelPruning``); the zeros counted from the weights.
* :mod:`~project.callbacks.slim` -- :class:`StructuredPruning` (channels removed, Torch-Pruning).
* :mod:`~project.callbacks.training` -- :class:`CudnnFlags` (``torch.backends.cudnn.enabled``), :class:`Throughput`
  (samples/s, epoch time), :class:`StepLearningRateMonitor`.
* :mod:`~project.callbacks.fresh` -- :class:`FreshEachFit`: one callback object, several fits (the notebook pattern).
* :mod:`~project.callbacks.checkpoint` -- :class:`RunCheckpoint` (``last.ckpt`` always the newest state),
  :class:`LocalAtomicCheckpointIO` (atomic local writes, never through a link).

The face: the class paths configs name (``project.callbacks.Pruning``, ``project.callbacks.StructuredPruning``, ...).
"""

from project.callbacks.checkpoint import LocalAtomicCheckpointIO, RunCheckpoint
from project.callbacks.pruning import Pruning, ScheduledPruning
from project.callbacks.slim import StructuredPruning
from project.callbacks.training import CudnnFlags, StepLearningRateMonitor, Throughput

__all__ = [
    "CudnnFlags",
    "LocalAtomicCheckpointIO",
    "Pruning",
    "RunCheckpoint",
    "ScheduledPruning",
    "StepLearningRateMonitor",
    "StructuredPruning",
    "Throughput",
]
