"""Warm trial processes for ``python -m project.sweep``: a fork server forked from the sweep worker.

A trial run as a fresh ``python -m project.fit`` subprocess would pay the start-up again: importing torch,
torchvision and Lightning before its fit begins. The worker has imported all of it already (it resolves the base
experiment with the same CLI), so right after that, and before it opens the study's storage or starts a thread, it
forks a *trial server*: a copy of itself that only waits for trial requests. For each trial the server forks a child
that runs ``project.fit`` exactly as ``python -m project.fit`` runs it (``runpy``, ``sys.argv``, the trial's
environment, output into the trial's log), so the child goes straight to its config (measured in docs/decisions.md).

What a subprocess per trial gives is kept: each trial is its own process (a crash, a hang or a leak ends with
it; the worker's heartbeats and retries are unchanged); the trial's results are those of the same fit run
alone. Forking is safe here because the server is forked while the worker runs no Python thread, has run no
torch operation (so no OpenMP thread pool and no CUDA context exist; OpenBLAS's idle pool, started when numpy
loads, shuts itself down around a fork) and holds no database connection; the server itself never starts a
thread. Each process asks the kernel for ``SIGKILL`` when its parent dies (``PR_SET_PDEATHSIG``), so a
killed worker takes its server and the server its trial: a retry never races an old fit. A DDP trial's other
ranks are started by Lightning as ``python -m project.fit`` from the child, as before.

Elsewhere (no ``fork``, a worker that already runs threads) :func:`start` returns ``None`` and trials run as
subprocesses. The environment variables that native libraries read once, at import (``OMP_NUM_THREADS``, ...),
are the worker's: set them before starting the sweep, as for any command.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import runpy
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from project.data.workers import die_with_parent

# A trial's log (sweep-fit.log) is appended to, created if missing, never through a link (ELOOP instead).
LOG_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def open_log(path: str | Path) -> int:
    """A file descriptor appending to the trial's log ``path`` (created 0644 if missing), opened only in place: a
    symbolic link planted at the name is refused (``O_NOFOLLOW``), never followed, and a hard link (a name shared with
    another file) is removed and the log started afresh, never appended to. Close-on-exec: a child gets it only as
    its stdout/stderr.

    Raises:
        OSError: the log cannot be opened (``ELOOP`` for a link); :func:`log_problem` words it in one line.
    """
    fd = os.open(path, LOG_FLAGS, 0o644)
    if os.fstat(fd).st_nlink > 1:  # a hard link planted at the name: another file's bytes; replaced, not appended to
        os.close(fd)
        os.unlink(path)
        fd = os.open(path, LOG_FLAGS | os.O_EXCL, 0o644)
    return fd


def log_problem(path: str | Path, error: OSError) -> str:
    """One line for a trial's log that :func:`open_log` refused."""
    if error.errno == errno.ELOOP:
        return f"{path} is a symbolic link; a trial's log is written only in place, never through a link: remove it"
    return f"{path}: cannot open the trial's log ({error.strerror})"


class TrialServer:
    """The worker's end of a trial server: :meth:`run` one fit at a time in a warm child process."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock, self.pid = sock, pid
        self.file = sock.makefile("rw", encoding="utf-8")

    def run(self, args: list[str], env: dict[str, str], log: Path, started: Any = None) -> int:
        """Run ``python -m project.fit ARGS`` in a child of the server; returns its exit status as
        ``subprocess`` gives it (negative: killed by that signal).

        ``started(pid)`` is called once the child runs. A server that has died reports ``-SIGKILL`` (the
        trial is then resumed or failed like any killed fit); :attr:`alive` turns false.
        """
        try:
            self.file.write(json.dumps({"args": args, "env": env, "log": str(log)}) + "\n")
            self.file.flush()
            pid = json.loads(self.file.readline())["pid"]
            if started is not None:
                started(pid)
            return int(json.loads(self.file.readline())["returncode"])
        except (OSError, ValueError, KeyError):
            self.close()
            return -signal.SIGKILL

    @property
    def alive(self) -> bool:
        return self.sock.fileno() >= 0

    def close(self) -> None:
        """Stop the server (it exits when its end of the socket closes)."""
        try:
            self.file.close()
        finally:
            self.sock.close()
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def start() -> TrialServer | None:
    """Fork the trial server from this (the worker's) process; ``None`` where that is not safe or possible.

    Call it after the imports and before anything starts a thread or opens a connection.
    """
    if not hasattr(os, "fork") or threading.active_count() != 1:
        return None
    ours, theirs = socket.socketpair()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the server
        ours.close()
        _serve(theirs)
    theirs.close()
    return TrialServer(ours, pid)


def _serve(sock: socket.socket) -> None:
    """The server's loop: one request at a time; reply with the child's pid, then with its exit status."""
    code = 0
    try:
        # Ctrl-C, and a SIGTERM sent to the whole process group (scancel), reach the worker and the trial; they
        # decide (the worker forwards its SIGTERM to the trial and ends once the trial has saved)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        die_with_parent()
        # Python's recipe for fork without exec: the collector of a child then never writes to the objects it
        # shares with the server (each write would copy a page)
        gc.freeze()
        with sock.makefile("rw", encoding="utf-8") as f:
            for line in f:
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    f.close()
                    sock.close()
                    _child(request["args"], request["env"], request["log"])
                f.write(json.dumps({"pid": pid}) + "\n")
                f.flush()
                _, status = os.waitpid(pid, 0)
                f.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
                f.flush()
    except BaseException:  # the worker went away mid-request: nothing to report to
        code = 1
    os._exit(code)


def _child(args: list[str], env: dict[str, str], log: str) -> None:
    """Become ``python -m project.fit ARGS`` with ``env``, output appended to ``log``; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as a new process has it: Lightning then handles SIGTERM
        die_with_parent()
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            out = open_log(log)
        except OSError as e:  # a link planted since the worker checked: one line on the worker's stderr
            print(f"error: {log_problem(log, e)}", file=sys.stderr)
            raise SystemExit(1) from None
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        # streams of the process's own, as a new process has them, line by line into the log
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(env)
        # What `python -m project.fit ARGS` does: the module runs as __main__ (so Lightning's DDP launcher starts
        # the other ranks as `python -m project.fit ARGS` too) and reads its arguments from sys.argv.
        sys.argv = ["project.fit", *args]
        runpy.run_module("project.fit", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
