"""The run folder: the one place that knows its layout.

``<save_dir>/<name>/version_N/`` holds one run and its resumes::

    config.yaml                  the config the run started with (never rewritten)
    config-resume-<k>.yaml       the config of each resume into this folder
    events.out.tfevents.*        TensorBoard: curves, layout, HPARAMS, images, PR curves, graph
    checkpoints/last.ckpt, checkpoints/epochNN-val_acc*.ckpt
    checkpoints/hpc_ckpt_<k>.ckpt  Lightning's SLURM preemption checkpoint (see project.cluster)
    slurm_job.json               the SLURM job that runs this folder, one entry per (re)start
    results.json                 written once the run has finished (atomically)
    metrics.csv                  one row per finished epoch (project.report.EpochMetrics), rewritten atomically

Checkpoints are read with PyTorch's safe unpickler (``torch.load(weights_only=True)``): a file that
needs more (a pickle that could run code) is refused unless the caller trusts it explicitly.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from pathlib import Path
from typing import Any

from project.errors import ConfigError

RESULTS = "results.json"
_VERSION = re.compile(r"version_(\d+)")


def to_builtin(hparams: Any) -> None:
    """Turn jsonargparse's typed numbers (``PositiveInt``, ...) in saved hyper-parameters into plain
    ``int``/``float`` in place, so checkpoints load with PyTorch's safe unpickler."""
    for key, value in list(hparams.items()):
        if isinstance(value, int | float) and not isinstance(value, bool) and type(value) not in (int, float):
            hparams[key] = int(value) if isinstance(value, int) else float(value)


def version_of(path: Path) -> int | None:
    m = _VERSION.fullmatch(path.name)
    return int(m.group(1)) if m else None


def runs_of(experiment: Path) -> list[Path]:
    """Run folders ``version_N`` of an experiment folder, oldest first (by N)."""
    if not experiment.is_dir():
        return []
    found = [p for p in experiment.iterdir() if p.is_dir() and version_of(p) is not None]
    return sorted(found, key=version_of)


def run_of_checkpoint(ckpt: Path) -> Path | None:
    """The run folder a checkpoint lies in (``<run>/checkpoints/<file>.ckpt``), or ``None``."""
    ckpt = ckpt.resolve()
    run = ckpt.parent.parent
    if ckpt.parent.name == "checkpoints" and version_of(run) is not None:
        return run
    return None


def checkpoint_of(run: Path, which: str = "last") -> Path:
    """``last.ckpt`` or the best checkpoint (by the run's ``results.json``, else the newest non-last file).

    Raises:
        ConfigError: the run holds no such checkpoint.
    """
    folder = run / "checkpoints"
    if which == "last":
        path = folder / "last.ckpt"
        if path.is_file():
            return path
    else:
        best = read_results(run).get("best_ckpt") if (run / RESULTS).is_file() else None
        if best and Path(best).is_file():
            return Path(best)
        candidates = sorted(
            (p for p in folder.glob("*.ckpt") if p.name != "last.ckpt" and not p.name.startswith("hpc_ckpt_")),
            key=os.path.getmtime,
        )
        if candidates:
            return candidates[-1]
    raise ConfigError(f"{run} holds no {which} checkpoint (looked in {folder})")


def _logger_dir(logger: Any) -> Path | None:
    """``save_dir/name`` of a TensorBoardLogger config (a jsonargparse Namespace or dict), else ``None``."""
    if logger is None or logger is False or "TensorBoardLogger" not in str(getattr(logger, "class_path", "")):
        return None
    args = logger.init_args
    return Path(args.save_dir, args.name or "")


def resolve_ckpt_path(spec: str, logger: Any) -> Path:
    """Turn ``--ckpt_path`` into a checkpoint file.

    ``last`` / ``best``: that checkpoint of the newest run of this experiment (``save_dir/name``);
    a run folder: its ``last.ckpt``; a file: itself. Lightning's own ``"last"`` looks only in the new,
    empty run folder.

    Raises:
        ConfigError: nothing to resume from, naming where it looked.
    """
    if spec in ("last", "best"):
        experiment = _logger_dir(logger)
        if experiment is None:
            raise ConfigError(f"ckpt_path: {spec!r} needs a TensorBoardLogger to find the experiment's runs")
        runs = [r for r in runs_of(experiment) if (r / "checkpoints").is_dir()]
        if not runs:
            raise ConfigError(f"ckpt_path: {spec!r}: no run with checkpoints under {experiment}; train one first")
        return checkpoint_of(runs[-1], spec)
    path = Path(spec)
    if path.is_dir():
        return checkpoint_of(path, "last")
    if not path.is_file():
        raise ConfigError(f"ckpt_path: {spec} does not exist; give a .ckpt file, a run folder, or 'last' / 'best'")
    return path


def load_checkpoint(path: str | Path, trust: bool = False) -> dict[str, Any]:
    """Read a checkpoint with ``torch.load(weights_only=True)`` on the CPU.

    Args:
        trust: allow full unpickling (``weights_only=False``) -- only for files the user made: a crafted
            pickle runs code when loaded.

    Raises:
        ConfigError: unreadable, not a Lightning checkpoint, or (untrusted) needing more than the safe
            unpickler allows.
    """
    import torch  # here: the commands that only read run folders (summarize) need not import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=not trust)
    except Exception as e:
        unsafe = re.search(r"(Unsupported (global|class)|unsupported GLOBAL)[^\n]*", str(e))
        if unsafe and not trust:
            raise ConfigError(
                f"ckpt_path: {path} needs more than PyTorch's safe unpickler ({unsafe.group(0).strip()}); "
                "it may be unsafe: a crafted checkpoint runs code when loaded. Load it only if you made it: "
                "--trust_checkpoint true"
            ) from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"ckpt_path: {path} is not a readable checkpoint ({type(e).__name__}: {first})") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "loops" not in ckpt:
        raise ConfigError(f"ckpt_path: {path} is not a Lightning training checkpoint (no state_dict/loops)")
    return ckpt


def resume_in_place(ckpt: Path, logger: Any) -> None:
    """Point the logger at the run folder the checkpoint came from, so the run continues there.

    Lightning would start a new ``version_N+1``; ModelCheckpoint would then forget the best score so far and
    the curves would split over two folders. Only done when the checkpoint belongs to this experiment and no
    logger version was set explicitly.
    """
    experiment = _logger_dir(logger)
    run = run_of_checkpoint(ckpt)
    if experiment is None or run is None or logger.init_args.version is not None:
        return
    if run.parent == experiment.resolve():
        logger.init_args.version = version_of(run)


def latest_config(run: Path) -> Path:
    """The config the run last ran with: its newest ``config-resume-<k>.yaml``, else ``config.yaml``."""
    resumes = sorted(run.glob("config-resume-*.yaml"), key=lambda p: int(re.findall(r"\d+", p.stem)[-1]))
    return resumes[-1] if resumes else run / "config.yaml"


def read_results(run: Path) -> dict[str, Any]:
    """The run's ``results.json`` as a dict.

    Raises:
        ConfigError: the run has no readable ``results.json`` (it has not finished).
    """
    path = run / RESULTS
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is missing or unreadable ({type(e).__name__}); has the run finished?") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a results object")
    return data


def write_json(path: Path, data: dict[str, Any]) -> Path:
    """Write ``data`` as JSON through a temporary file and an atomic rename; returns ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def write_report(out: Path, data: dict[str, Any], table: str) -> None:
    """Write ``data`` to ``out`` (JSON) and ``table`` beside it (``out`` with ``.md``), creating the folder;
    print the table and where both went. The benches' output."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, data)
    out.with_suffix(".md").write_text(table)
    print(table)
    print(f"wrote {out} and {out.with_suffix('.md')}")


def write_results(run: Path, results: dict[str, Any]) -> Path:
    """Write the run's ``results.json`` atomically; returns its path."""
    return write_json(run / RESULTS, results)


def find_run(spec: str | Path) -> Path:
    """The run folder meant by ``spec``: a run folder, an experiment folder (its newest run), or a checkpoint.

    Raises:
        ConfigError: nothing that holds a run's ``config.yaml``.
    """
    path = Path(spec)
    if path.is_file() and path.suffix == ".ckpt":
        run = run_of_checkpoint(path)
        if run is not None:
            return run
    if path.is_dir() and (path / "config.yaml").is_file():
        return path
    if path.is_dir():
        found = [r for r in runs_of(path) if (r / "config.yaml").is_file()]
        if found:
            return found[-1]
    raise ConfigError(
        f"{spec} is not a run folder (logs/<experiment>/version_N with a config.yaml), an experiment folder or a "
        "checkpoint inside a run"
    )


def checkpoint_arg(run: Path, which: str) -> Path:
    """``best`` / ``last`` of ``run``, or a checkpoint file path.

    Raises:
        ConfigError: no such checkpoint.
    """
    if which in ("best", "last"):
        return checkpoint_of(run, which)
    path = Path(which)
    if not path.is_file():
        raise ConfigError(f"--ckpt: {which} is neither best, last nor a checkpoint file")
    return path


def command_checkpoint(spec: str, which: str) -> tuple[Path, Path, str]:
    """What a run-folder command's ``RUN`` argument and ``--ckpt`` name: ``(run, checkpoint file, name)``.

    ``spec`` is a run folder, an experiment folder (its newest run) or a checkpoint file inside a run (which then
    wins over ``which``); ``name`` is ``best``/``last`` or the file's stem, for the files the command writes.

    Raises:
        ConfigError: no such run or checkpoint.
    """
    run = find_run(spec)
    if Path(spec).suffix == ".ckpt":
        return run, Path(spec), Path(spec).stem
    ckpt = checkpoint_arg(run, which)
    return run, ckpt, which if which in ("best", "last") else ckpt.stem


def snapshot(run: Path | None) -> dict[Path, float]:
    """Every file under ``run`` with its modification time (empty when the folder does not exist)."""
    if run is None or not run.exists():
        return {}
    return {p: p.stat().st_mtime for p in run.rglob("*") if p.is_file()}


def undo_since(run: Path, before: dict[Path, float]) -> bool:
    """Remove what a failed command added to ``run``, unless it wrote a checkpoint worth keeping.

    A new folder with no checkpoint is removed whole; in an existing folder (a resume), the files the
    command created are removed. Returns whether anything was undone.
    """
    if not run.exists():
        return False
    now = snapshot(run)
    new_ckpts = [p for p, t in now.items() if p.suffix == ".ckpt" and before.get(p) != t]
    if new_ckpts:
        return False
    if not before:
        import shutil

        shutil.rmtree(run, ignore_errors=True)
        return True
    for p in now:
        if p not in before:
            p.unlink(missing_ok=True)
    return True


METRICS_CSV = "metrics.csv"


def read_epoch_metrics(run: Path | None) -> list[dict[str, float]]:
    """The rows of a run's ``metrics.csv`` (see :class:`project.report.EpochMetrics`): ``{"epoch": int, "step":
    int, metric: float}``, empty cells left out; ``[]`` when the run has none or it is unreadable. Read as data: a
    malformed cell is skipped, a file over 16 MiB is not read."""
    path = run / METRICS_CSV if run is not None else None
    try:
        if path is None or path.stat().st_size > 16 << 20:
            return []
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return []
    rows = []
    for raw in csv.DictReader(io.StringIO(text)):
        row: dict[str, float] = {}
        for key, cell in raw.items():
            try:
                row[key] = float(cell)
            except (TypeError, ValueError):
                continue
        if "epoch" in row and "step" in row:
            row["epoch"], row["step"] = int(row["epoch"]), int(row["step"])
            rows.append(row)
    return rows
