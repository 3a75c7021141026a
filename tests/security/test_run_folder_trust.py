"""A run folder copied from elsewhere is data (docs/security.md): the import paths its config names are checked
before anything is imported, and rebuilding it for a command writes nothing outside it and downloads nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml

from project.cli.commands import cli_for_run
from project.errors import ConfigError
from project.runs.trust import TRUSTED_PACKAGES, check_import_paths, import_paths

EVIL = """
from pathlib import Path
Path(__file__).with_name("RAN").write_text("module code ran")
class Anything:
    pass
"""


def planted_run(trained_run, root):
    """A copy of a finished run under ``root/logs/dl/version_0`` that ships ``evil.py`` and names it in its config."""
    run = root / "logs" / "dl" / "version_0"
    shutil.copytree(trained_run, run)
    (run / "evil.py").write_text(EVIL)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["trainer"]["callbacks"] = [{"class_path": "logs.dl.version_0.evil.Anything"}]
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


@pytest.mark.parametrize("command", ["evaluate", "predict", "export"])
def test_a_class_path_into_the_run_folder_is_refused_before_it_is_imported(command, trained_run, tmp_path):
    """Under ``python -m`` the working directory is an import root and ``logs/`` a namespace package: the class path
    would import (run) ``evil.py``. It is one error line instead, and the module never runs."""
    run = planted_run(trained_run, tmp_path)
    extra = [str(tmp_path / "missing.png")] if command == "predict" else []
    out = subprocess.run(
        [sys.executable, "-m", f"project.{command}", "logs/dl/version_0", *extra],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "trainer.callbacks.0.class_path names logs.dl.version_0.evil.Anything" in errors[0]
    assert "--trust_config true" in errors[0]
    assert not (run / "RAN").exists()


def test_a_run_config_cannot_trust_itself(trained_run, tmp_path, capsys):
    """``trust_config`` is the command line's to give: a run config that sets it is refused like any command
    option written into a run."""
    from project import evaluate

    run = planted_run(trained_run, tmp_path)
    config = yaml.safe_load((run / "config.yaml").read_text()) | {"trust_config": True}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert evaluate.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert "trust_config is an option of python -m project.evaluate" in err and not (run / "RAN").exists()


def test_every_import_path_of_a_real_run_is_trusted_and_the_others_are_found(trained_run):
    config = yaml.safe_load((trained_run / "config.yaml").read_text())
    paths = import_paths(config)
    assert len(paths) >= 8 and {p.split(".")[0] for _, p in paths} <= set(TRUSTED_PACKAGES)
    check_import_paths(config, "config.yaml")  # nothing refused
    for config in ({"class_path": "evil.Thing"}, {"x": "os.path.join"}, {"x": "subprocess.Popen"}):
        with pytest.raises(ConfigError, match="outside the packages a run folder's config may name"):
            check_import_paths(config, "c.yaml")
    check_import_paths({"trainer": {"logger": {"init_args": {"name": "my.exp", "version": "v1.2"}}}}, "c.yaml")


def test_rebuilding_a_run_downloads_nothing_and_runs_no_profiler(trained_run, tmp_path):
    """A copied config asking for a download or a profiler writing elsewhere is rebuilt without them."""
    run = tmp_path / "logs" / "x" / "version_0"
    shutil.copytree(trained_run, run)
    elsewhere = tmp_path / "elsewhere"
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"]["init_args"]["download"] = True
    config["trainer"]["profiler"] = {
        "class_path": "lightning.pytorch.profilers.SimpleProfiler",
        "init_args": {"dirpath": str(elsewhere), "filename": "perf"},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    cli = cli_for_run(run, [], "python -m project.evaluate")
    assert cli.datamodule.hparams.download is False
    assert type(cli.trainer.profiler).__name__ == "PassThroughProfiler"
    assert not elsewhere.exists()
