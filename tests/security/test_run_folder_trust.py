"""A run folder copied from elsewhere is data (docs/security.md): the import paths its config names are checked
before anything is imported, and rebuilding it for a command writes nothing outside it and downloads nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

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


@pytest.mark.slow
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


def snapshot(root: Path, skip: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``root`` outside ``skip``: path -> (size, mtime in ns) of files, (0, 0) of
    folders (a folder's mtime changes with what is added, which the caller compares by name)."""
    return {
        str(p.relative_to(root)): (0, 0) if p.is_dir() else (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in root.rglob("*")
        if skip not in p.parents and p != skip
    }


def hostile_config(run: Path, elsewhere: Path, source: Path) -> None:
    """Point every path a run config can name outside the run: data (with real archives to import from), the
    Trainer's root, a profiler, and callbacks that write where they are told."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"]["init_args"].update(data_dir=str(elsewhere / "data"), source_dir=str(source), download=True)
    config["trainer"]["default_root_dir"] = str(elsewhere / "root")
    config["trainer"]["profiler"] = {
        "class_path": "lightning.pytorch.profilers.SimpleProfiler",
        "init_args": {"dirpath": str(elsewhere / "profiler"), "filename": "perf"},
    }
    config["trainer"]["callbacks"] = [
        {"class_path": "lightning.pytorch.callbacks.OnExceptionCheckpoint", "init_args": {"dirpath": str(elsewhere)}},
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"dirpath": str(elsewhere / "c")}},
        {"class_path": "lightning.pytorch.callbacks.BatchSizeFinder", "init_args": {"max_trials": 1}},
    ]
    (run / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.mark.parametrize("command", ["evaluate", "predict", "export"])
def test_a_command_on_a_copied_run_writes_only_its_outputs_and_reads_the_users_data(
    command, trained_run, tiny_mnist, tmp_path, monkeypatch
):
    """docs/security.md: whatever paths a copied config names, a command on the run writes its own outputs only
    (inside the run, or its ``--out``), imports nothing, downloads nothing, and reads the data folder the user
    names. Everything else under the test's folder is unchanged, file by file."""
    from project import evaluate, export, predict
    from project.data import MNISTDataModule

    run = tmp_path / "logs" / "x" / "version_0"
    shutil.copytree(trained_run, run)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    hostile_config(run, elsewhere, tiny_mnist["source"])
    MNISTDataModule(data_dir=str(tiny_mnist["data"]), source_dir=str(tiny_mnist["source"])).prepare_data()
    image = tmp_path / "in.png"
    Image.new("L", (28, 28), 200).save(image)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = snapshot(tmp_path, run)
    user = ["--data.data_dir", str(tiny_mnist["data"])]
    mains = {
        "evaluate": lambda: evaluate.main([str(run), *user]),
        "predict": lambda: predict.main([str(run), str(image), *user, "--out", str(work / "p.csv")]),
        "export": lambda: export.main([str(run), *user, "--repeats", "1"]),
    }
    assert mains[command]() == 0
    after = snapshot(tmp_path, run)
    added = {"evaluate": set(), "predict": {"work/p.csv"}, "export": set()}[command]
    assert set(after) - set(before) == added
    assert {k: v for k, v in after.items() if k in before} == before  # nothing else changed or went
    written = {p.name for p in run.iterdir()} - {p.name for p in trained_run.iterdir()}
    assert (
        written
        == {"evaluate": {"eval-best-test.json"}, "predict": set(), "export": {"model-best.onnx", "export.json"}}[
            command
        ]
    )


def test_evaluate_reads_the_users_data_folder_and_names_the_runs_when_it_is_empty(
    trained_run, tiny_mnist, tmp_path, monkeypatch, capsys
):
    """Without ``--data.data_dir`` a command reads ``data/`` where it runs, as fit does; a copied config's folders
    (which here hold the archives it could import) are not used, and the error says how to use them."""
    from project import evaluate
    from project.data import MNISTDataModule

    run = tmp_path / "logs" / "x" / "version_0"
    shutil.copytree(trained_run, run)
    hostile_config(run, tmp_path / "elsewhere", tiny_mnist["source"])
    monkeypatch.chdir(tmp_path)
    assert evaluate.main([str(run)]) != 0
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert f"add --data.data_dir {tmp_path / 'elsewhere' / 'data'}" in errors[0]
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "data" / "MNIST").exists()
    MNISTDataModule(data_dir="data", source_dir=str(tiny_mnist["source"])).prepare_data()  # the user's data/
    assert evaluate.main([str(run)]) == 0
    assert json.loads((run / "eval-best-test.json").read_text())["samples"] == 100


@pytest.mark.parametrize(
    "key, value",
    [
        (("model", "optimizer"), "logs.evil"),  # two lower-case parts: no class, no function shape
        (("model", "optimizer"), "torch.hub.load"),  # a trusted package, a downloading callable
        (("trainer", "callbacks"), [{"class_path": "torchmetrics.image.lpip.LearnedPerceptualImagePatchSimilarity"}]),
    ],
    ids=["module-in-logs", "torch-hub", "torchmetrics-lpips"],
)
def test_the_parser_imports_only_what_a_run_holds(key, value, trained_run, tmp_path, monkeypatch, capsys):
    """Issue 42, kind 2: what a run folder's config may import is a list jsonargparse enforces while it parses
    (project.runs.trust.RUN_IMPORTS), not a string pattern: a path the pattern lets through is refused by the parser
    before it is imported, with one error line; the module never runs."""
    from project import evaluate

    run = tmp_path / "logs" / "x" / "version_0"
    shutil.copytree(trained_run, run)
    (tmp_path / "logs" / "evil.py").write_text(EVIL.replace('with_name("RAN")', 'parent.parent.joinpath("RAN")'))
    config = yaml.safe_load((run / "config.yaml").read_text())
    *parents, last = key
    node = config
    for part in parents:
        node = node[part]
    node[last] = value
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # python -m puts the working directory first, as here
    modules = set(sys.modules)
    assert evaluate.main([str(run)]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: ") and "--trust_config true" in errors[0], errors
    path = value if isinstance(value, str) else value[0]["class_path"]
    assert f"names {path}" in errors[0], errors
    assert not (tmp_path / "RAN").exists() and "logs.evil" not in sys.modules
    assert not {m for m in set(sys.modules) - modules if m.startswith(("torchmetrics.image.lpip", "logs"))}


@pytest.mark.parametrize("include", ["config", "trainer"])
def test_a_file_the_run_config_includes_imports_nothing_the_run_may_not_hold(
    include, trained_run, tmp_path, monkeypatch, capsys
):
    """Issue 42, kind 1: jsonargparse loads the files a config names (a top-level ``config: extra.yaml``, a group
    given as a file, ``trainer: trainer.yaml``) after our check read config.yaml alone. The parser's own allow-list
    covers what they name too: the module shipped beside them never runs."""
    from project import evaluate

    run = planted_run(trained_run, tmp_path)
    config = yaml.safe_load((run / "config.yaml").read_text())
    trainer = config["trainer"]  # planted_run's callback, moved into the included file
    if include == "config":
        (run / "extra.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": trainer.pop("callbacks")}}))
        config["config"] = "extra.yaml"
    else:
        (run / "trainer.yaml").write_text(yaml.safe_dump(trainer))
        config["trainer"] = "trainer.yaml"
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    status = evaluate.main([str(run)])
    errors = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(errors) == 1 and errors[0].startswith("error: "), errors
    assert not (run / "RAN").exists()
