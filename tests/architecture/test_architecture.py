"""The package's shape (docs/architecture.md): no import cycle, the root holds the verbs and a few single-job
modules, package faces hold only the class paths configs name, and the class paths older runs name still run."""

from __future__ import annotations

import ast
import importlib
import json
import re

import grimp
import pytest
import yaml
from helpers import REPO, own_data, run_dirs, run_main, tiny_args

ROOT_MODULES = {
    "__init__",
    "__main__",
    # the verbs
    "fit",
    "evaluate",
    "predict",
    "export",
    "summarize",
    # the model and its nets
    "module",
    "nets",
    # single-job modules
    "adapters",
    "checkpoints",
    "decode",
    "errors",
}
FACES = {
    "project.data": {
        "MNISTDataModule",
        "FashionMNISTDataModule",
        "CIFAR10DataModule",
        "VisionDataModule",
        "ImageFolderDataModule",
        "CIFAR100DataModule",
        "KMNISTDataModule",
    },
    "project.callbacks": {
        "Pruning",
        "ScheduledPruning",
        "StructuredPruning",
        "Throughput",
        "StepLearningRateMonitor",
        "CudnnFlags",
        "RunCheckpoint",
        "LocalAtomicCheckpointIO",
    },
    "project.report": {"RunTensorBoardLogger", "TensorBoardLayout", "EpochMetrics"},
    "project.cluster": {"BoundDDPStrategy", "SlurmRequeue"},
    "project.sweep": {"ReportToStudy"},
}


def test_no_import_cycle():
    graph = grimp.build_graph("project")
    cycles = sorted(
        {
            tuple(sorted((module, imported)))
            for module in graph.modules
            for imported in graph.find_modules_directly_imported_by(module)
            if graph.chain_exists(importer=imported, imported=module)
        }
    )
    assert cycles == []


def test_the_root_holds_the_verbs_the_model_and_single_job_modules():
    assert {p.stem for p in (REPO / "project").glob("*.py")} == ROOT_MODULES


@pytest.mark.parametrize("face", sorted(FACES))
def test_a_package_face_holds_only_the_classes_configs_name(face):
    """A face is imports and ``__all__``: no definitions, no other names (no re-exports for code)."""
    module = importlib.import_module(face)
    tree = ast.parse(open(module.__file__).read())
    kinds = {type(node).__name__ for node in tree.body[1:]}  # after the docstring
    assert kinds <= {"ImportFrom", "Assign"}, kinds
    assert set(module.__all__) == FACES[face]
    assert all(isinstance(getattr(module, name), type) for name in module.__all__)


def test_every_face_name_and_every_shipped_config_class_path_imports():
    """Every class path in configs/ resolves (a moved class would leave a config naming a missing path)."""
    paths = set()

    def walk(tree):
        if isinstance(tree, dict):
            for key, value in tree.items():
                if key == "class_path" and isinstance(value, str) and value.startswith("project."):
                    paths.add(value)
                walk(value)
        elif isinstance(tree, list):
            for item in tree:
                walk(item)

    for config in (REPO / "configs").rglob("*.yaml"):
        walk(yaml.safe_load(config.read_text()))
    paths |= {f"{face}.{name}" for face, names in FACES.items() for name in names}
    for path in sorted(paths):
        module, _, name = path.rpartition(".")
        assert isinstance(getattr(importlib.import_module(module), name), type), path


@pytest.mark.slow
def test_a_run_written_with_the_old_class_paths_still_runs(tiny_mnist, tmp_path, monkeypatch, capsys):
    """A run folder from before the subpackages names project.slim.StructuredPruning, project.epoch_metrics...:
    ``fit --config`` of its config.yaml trains again, and evaluate rebuilds the run from it."""
    from project import evaluate
    from project.cli.checks import MOVED_CLASS_PATHS

    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--config", str(REPO / "configs" / "slim.yaml"))) == 0
    (run,) = run_dirs(tmp_path / "logs")
    text = (run / "config.yaml").read_text()
    new_to_old = {
        "project.callbacks.StructuredPruning": "project.slim.StructuredPruning",
        "project.report.EpochMetrics": "project.epoch_metrics.EpochMetrics",
        "project.report.RunTensorBoardLogger": "project.run_logger.RunTensorBoardLogger",
        "project.callbacks.training.batch_samples": "project.callbacks.batch_samples",
    }
    for new, old in new_to_old.items():
        assert new in text and MOVED_CLASS_PATHS[old] == new
        text = text.replace(new, old)
    (run / "config.yaml").write_text(text)
    capsys.readouterr()
    assert evaluate.main([str(run), *own_data(run), "--ckpt", "last"]) == 0
    assert json.loads((run / "eval-last-test.json").read_text())["samples"] > 0
    old = tmp_path / "old.yaml"
    old.write_text(text)
    assert run_main(["--config", str(old), *tiny_args(tiny_mnist, tmp_path / "again")]) == 0
    (again,) = run_dirs(tmp_path / "again")
    assert "project.callbacks.StructuredPruning" in (again / "config.yaml").read_text()


# What a measurement or a history note looks like in prose: those belong in docs/ (docs/decisions.md), where they
# are dated by their machine and re-measured, not in the code, where they rot.
MEASUREMENT_OR_HISTORY = (
    r"\btook\s+(about\s+|~)?[0-9]",
    r"\b[0-9]+(\.[0-9]+)?\s*(ms|s|min)\s+instead of\b",
    r"\bused to\b",
    r"\b[0-9]+ of [0-9]+ (tests )?fail",
    r"\bon a [0-9]+-core\b",
    r"\bformerly\b|\bpreviously\b",
)


def test_docstrings_and_comments_carry_no_measurements_or_history():
    import io
    import re
    import tokenize

    pattern = re.compile("|".join(MEASUREMENT_OR_HISTORY), re.IGNORECASE)
    found = []
    for path in sorted((REPO / "project").rglob("*.py")):
        source = path.read_text()
        prose = [
            (tok.start[0], tok.string)
            for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type in (tokenize.COMMENT, tokenize.STRING)
        ]
        for line, text in prose:
            # a string spanning lines: join its lines so a phrase split by a line break is still seen
            for match in pattern.finditer(" ".join(text.split())):
                found.append(f"{path.relative_to(REPO)}:{line}: {match.group(0)!r}")
    assert found == [], "move these to docs/decisions.md:\n" + "\n".join(found)


def test_no_test_module_imports_another_test_module_or_conftest():
    """Shared test code lives in helper modules (tests/helpers.py, tests/tiny_data.py), never in a test module or a
    conftest, so that a test module can be read, moved or deleted alone."""
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                last = name.rsplit(".", 1)[-1]
                if last.startswith("test_") or last == "conftest" or name.startswith("tests."):
                    found.append(f"{path.relative_to(REPO)}: {name}")
    assert found == []


def test_every_package_module_says_what_it_is_for():
    """A module docstring that says what the module does (not missing, not a placeholder)."""
    lacking = []
    for path in sorted((REPO / "project").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if len(doc.split()) < 4 or "TODO" in doc:
            lacking.append(str(path.relative_to(REPO)))
    assert lacking == []


# A dotted name that is a file, not a Python object: ``project.sif`` (Apptainer), ``project.tar`` (an OCI archive).
FILE_NAME = re.compile(r"\.(sif|sqsh|tar|egg-info|egg|py|md|yaml|json|ckpt|onnx|pt2)$")
PROSE_FILES = ("project/**/*.py", "benchmarks/*.py", "scripts/*", "docs/**/*.md", "configs/**/*.yaml", "deploy/**/*")


def resolves(name: str) -> bool:
    """``project.a.b.C.meth`` names a module, then attributes of it, that exist today."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attr in parts[split:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_project_name_in_prose_resolves():
    """Every ``project.…`` name in a docstring, comment, doc, config, script or the README imports (a module that
    moved leaves a name nobody can follow); the old class paths older runs name are the documented exceptions
    (:data:`project.cli.checks.MOVED_CLASS_PATHS`, upgraded as a config is read)."""
    from project.cli.checks import MOVED_CLASS_PATHS

    files = [REPO / "README.md", REPO / "Dockerfile", *(p for g in PROSE_FILES for p in REPO.glob(g) if p.is_file())]
    pattern = re.compile(r"(?<![\w./-])project(?:\.[A-Za-z_]\w*(?:-info)?)+")
    unresolved = set()
    for path in files:
        for match in pattern.finditer(path.read_text(errors="replace")):
            name = match.group(0)
            if not FILE_NAME.search(name) and name not in MOVED_CLASS_PATHS and not resolves(name):
                unresolved.add(f"{path.relative_to(REPO)}: {name}")
    assert sorted(unresolved) == []
    assert all(resolves(new) for new in MOVED_CLASS_PATHS.values())
