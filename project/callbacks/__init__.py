"""The project's Lightning callbacks and checkpoint plugin, one module per job (every name importable from here).

* :mod:`~project.callbacks.pruning` -- :class:`ScheduledPruning`, the schedule both pruning callbacks share;
  :class:`Pruning` (unstructured, Lightning's ``ModelPruning``); :func:`sparsity` and :func:`nonzero_params`, the
  zeros counted from the weights. Structured pruning (channels removed, Torch-Pruning) is
  :class:`project.slim.StructuredPruning`.
* :mod:`~project.callbacks.training` -- :class:`CudnnFlags` (``torch.backends.cudnn.enabled``), :class:`Throughput`
  (samples/s, epoch time), :class:`StepLearningRateMonitor`.
* :mod:`~project.callbacks.checkpoint` -- :class:`RunCheckpoint` (``last.ckpt`` always the newest state),
  :class:`LocalAtomicCheckpointIO` (atomic local writes, never through a link).
"""

from project.callbacks.checkpoint import LocalAtomicCheckpointIO, RunCheckpoint, local_path
from project.callbacks.pruning import LAYER_TYPES, Pruning, PruningAmount, ScheduledPruning, nonzero_params, sparsity
from project.callbacks.training import (
    CudnnFlags,
    StepLearningRateMonitor,
    Throughput,
    batch_samples,
    synced_time,
)

__all__ = [
    "LAYER_TYPES",
    "CudnnFlags",
    "LocalAtomicCheckpointIO",
    "Pruning",
    "PruningAmount",
    "RunCheckpoint",
    "ScheduledPruning",
    "StepLearningRateMonitor",
    "Throughput",
    "batch_samples",
    "local_path",
    "nonzero_params",
    "sparsity",
    "synced_time",
]
