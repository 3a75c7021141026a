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


def die_with_parent(parent: int | None = None) -> None:
    """Linux: have the kernel send this process ``SIGKILL`` when its parent exits (no-op elsewhere).

    Args:
        parent: the pid this process's parent must have (default: the parent it has now). A worker passes the
            fork server's pid: when training is killed while a worker is still starting (unpickling its dataset,
            before this runs), the server is gone already and the worker's parent is init; asking the kernel then
            is too late, and comparing with the parent it has now would see nothing wrong. The process exits at
            once instead.
    """
    if not sys.platform.startswith("linux"):
        return
    expected = os.getppid() if parent is None else parent
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != expected:  # the parent died before the request took effect
        os._exit(1)


def worker_init(worker_id: int) -> None:
    """``DataLoader(worker_init_fn=...)``: the worker dies with the fork server that started it (or at once, when
    the server is already gone)."""
    guard = sys.modules.get("project.data.forkserver_guard")  # imported in the server, so inherited by its workers
    die_with_parent(getattr(guard, "SERVER_PID", None))


def worker_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context for DataLoader workers: a fork server that dies with training."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torchvision", "project.data", "project.data.forkserver_guard"])
    return ctx
