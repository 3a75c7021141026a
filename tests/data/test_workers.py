"""Loader workers end with training even when training is killed while they are still starting
(:mod:`project.data.workers`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import alive, descendants

GATED = '''
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset


class Gated(Dataset):
    """Unpickling (a worker's start) waits until the gate file exists: a worker still starting when training dies."""

    def __init__(self, gate):
        self.gate = gate

    def __getstate__(self):
        return {"gate": self.gate}

    def __setstate__(self, state):
        self.gate = state["gate"]
        while not Path(self.gate).exists():
            time.sleep(0.05)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.zeros(1)
'''

TRAIN = """
import sys
from gated import Gated
from project.data.loaders import dataloader

loader = dataloader(Gated(sys.argv[1]), None, 2, 2, False, True)
next(iter(loader))
"""


def wait_until(condition, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux's")
def test_workers_orphaned_while_starting_end_too(tmp_path):
    """Training is killed while both workers are still unpickling their dataset: the fork server dies with training,
    and each worker, finding itself orphaned when it reaches ``worker_init``, exits instead of waiting for batches
    forever (with the resource tracker it keeps open). This is what a loaded machine made of the kill -9 test."""
    (tmp_path / "gated.py").write_text(GATED)
    gate = tmp_path / "gate"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", TRAIN, str(gate)], cwd=tmp_path, env=env)
    kids: set[int] = set()
    try:

        def started() -> bool:
            kids.update(descendants(proc.pid))
            return len(kids) >= 4  # resource tracker, fork server, 2 workers

        assert wait_until(started, 120), kids
        time.sleep(1)  # the workers are inside __setstate__, before worker_init
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        gate.touch()  # the workers go on to worker_init, with their server already gone
        assert wait_until(lambda: not any(alive(p) for p in kids), 30), [p for p in kids if alive(p)]
    finally:
        gate.touch()
        for p in kids:
            if alive(p):
                os.kill(p, signal.SIGKILL)
