"""DataLoader worker processes that start safely and die with the training process.

Workers start from a fork server, not by forking the training process: the training process runs threads
(DDP's gloo and process observer, TensorBoard's event writer); ``fork()`` copies a lock one of them holds
and the new worker can block forever before it starts (seen: a 2-process DDP run hanging in its test loop).
The fork server is single-threaded and preloads torch and torchvision, so workers still start quickly.

The fork server, not the training process, is the workers' parent, so PyTorch's worker watchdog (which
watches the parent) did not notice a ``kill -9`` of training: server and workers lived on for minutes.
On Linux both ask the kernel for ``SIGKILL`` when their parent dies (``prctl(PR_SET_PDEATHSIG)``): the
server when training dies (this module is preloaded into it), each worker when the server dies.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Linux: have the kernel send this process ``SIGKILL`` when its parent exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def worker_init(worker_id: int) -> None:
    """``DataLoader(worker_init_fn=...)``: the worker dies with the fork server that started it."""
    die_with_parent()


def worker_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context for DataLoader workers: a fork server that dies with training."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torchvision", "project.data", "project.data.forkserver_guard"])
    return ctx
