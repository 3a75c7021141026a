"""The files a run writes honour the process's umask, as files opened with ``open()`` do: ``0644`` under the
usual 022 (a team sharing ``logs/`` reads them), ``0600`` under 077 (nobody else does)."""

from __future__ import annotations

import os
import stat

import pytest
from helpers import run_dirs, run_main, tiny_args

from project.runs import files


@pytest.fixture
def umask():
    """``os.umask``, to set the umask for the test; the previous one is restored after."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_the_shared_writer_gives_the_mode_open_would(mask, mode, umask, tmp_path):
    umask(mask)
    assert files.new_file_mode() == mode
    written = files.write_json(tmp_path / "results.json", {"a": 1})
    with open(tmp_path / "plain.txt", "w") as f:  # what open() gives, for comparison
        f.write("x")
    assert stat.S_IMODE(written.stat().st_mode) == stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode) == mode


def test_a_run_under_umask_077_writes_nothing_others_can_read(umask, tiny_mnist, tmp_path, monkeypatch):
    """Checkpoints, results.json, config.yaml, the event files: every file of the run, 0600 or tighter."""
    monkeypatch.chdir(tmp_path)
    umask(0o077)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--trainer.max_epochs", "1")) == 0
    (run,) = run_dirs(tmp_path / "logs")
    written = [p for p in run.rglob("*") if p.is_file()]
    assert {"results.json", "config.yaml", "last.ckpt"} <= {p.name for p in written}
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in written if p.stat().st_mode & 0o077} == {}
