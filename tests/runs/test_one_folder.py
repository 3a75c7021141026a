"""A run's files belong to its one run folder, whatever logger or profiler options the user sets (issue 41, kind 1):
each option writes into the run's folder, where every command finds it, or is refused with one error line."""

from __future__ import annotations

import pytest
from helpers import run_dirs, run_main, tiny_args

LOGGER_LISTS = {
    "csv beside tensorboard": [
        *("--metrics_csv", "null", "--trainer.logger+=lightning.pytorch.loggers.CSVLogger"),
        *("--trainer.logger.save_dir", "logs"),
    ],
    "two tensorboard loggers": [
        "--trainer.logger+=lightning.pytorch.loggers.TensorBoardLogger",
        *("--trainer.logger.save_dir", "logs"),
    ],
}


@pytest.mark.parametrize(
    "argv, key",
    [
        *((args, "trainer.logger: 2 loggers") for args in LOGGER_LISTS.values()),
        (["--trainer.profiler", "SimpleProfiler", "--trainer.profiler.dirpath", "elsewhere"], "trainer.profiler"),
        (["--trainer.profiler", "AdvancedProfiler", "--trainer.profiler.dirpath", "elsewhere"], "trainer.profiler"),
    ],
    ids=[*LOGGER_LISTS, "simple profiler elsewhere", "advanced profiler elsewhere"],
)
def test_an_option_that_would_split_a_run_is_one_error_line(argv, key, tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_main([*tiny_args(tiny_mnist, tmp_path / "logs"), *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}"), lines
    assert not (tmp_path / "logs").exists() and not (tmp_path / "elsewhere").exists()


def test_a_profilers_reports_land_in_the_run_folder(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["--trainer.profiler", "SimpleProfiler", "--trainer.profiler.filename", "perf"]
    assert run_main([*tiny_args(tiny_mnist, tmp_path / "logs"), *args]) == 0
    (run,) = run_dirs(tmp_path / "logs")
    reports = sorted(p.name for p in tmp_path.rglob("*perf*"))
    assert reports == ["fit-perf.txt", "test-perf.txt"] and (run / "fit-perf.txt").stat().st_size > 0
