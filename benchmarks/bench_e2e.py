"""``python -m benchmarks.bench_e2e``: the whole tutorial loop against the whole ``python -m project.fit``, wall clock.

``python -m benchmarks.bench`` times training steps inside one process; this times what a user waits for --
start-up, imports, data loading, training, evaluation and exit -- of two commands run as separate processes::

    python -m benchmarks.bench_e2e --config configs/fashion_mnist.yaml --source_dir /usr/share/datasets/fashion-mnist

1. The data set named by the config's ``data.class_path`` (MNIST or Fashion-MNIST) is made ready in
   ``--data_dir`` by that data module's ``prepare_data`` (imported from ``--source_dir`` when given).
2. ``raw loop`` -- ``python -m benchmarks.recipe_loop`` (the PyTorch tutorial's loop: LeNet, SGD with momentum,
   torchvision DataLoader with 0 workers, then the test-set accuracy) -- and ``fit`` -- ``python -m
   project.fit --config CONFIG`` as configured (its optimizer, loader workers, a validation split and pass
   every epoch, checkpoints, a test pass on the best checkpoint) -- run alternately, ``--repeats`` times
   each, ``--epochs`` epochs each, fit logging into a temporary folder that is removed afterwards.

Per command: the median wall time (``time.perf_counter`` around ``subprocess.run``), the ratio fit / raw,
test accuracy (median and each run; raw from its ``RESULT`` line, fit from its ``results.json``), and where
the time went: ``start-up`` (process launch until the raw loop's first epoch starts / until fit's Trainer
starts running, i.e. its first TensorBoard event), ``train`` (training steps including data loading:
``train_time_s`` / the sum of ``results.json``'s ``epoch_time_s``) and ``rest`` (evaluation, checkpoints,
exit). Writes ``--out`` (JSON) and a Markdown table beside it (``.md``) and prints the table.

``--fit_args`` / ``--raw_args`` add arguments to one side, as one string (``--fit_args="--data.num_workers 0"``);
``--limit_train_batches N`` shortens the epochs of both. A failed command stops the benchmark with one
``error:`` line holding the last lines of its stderr, exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

import project
from benchmarks.report import write_report
from project import data as data_mod
from project.errors import ArgumentParser, UserError

# config data.class_path (last part) -> recipe_loop --dataset
RAW_DATASET = {"MNISTDataModule": "mnist", "FashionMNISTDataModule": "fashion_mnist"}
ROWS = ("raw loop", "fit")
COLUMNS = ("command", "wall s (median)", "× raw loop", "start-up s", "train s", "rest s", "test acc (median)")


class RunError(UserError):
    """A benchmarked command failed or did not report its result."""


def data_module_name(config: Path) -> str:
    """The data module class named by a config's ``data.class_path`` (e.g. ``"FashionMNISTDataModule"``).

    Raises:
        UserError: the config names a data module other than MNIST or Fashion-MNIST (the raw loop is recipe B).
    """
    cfg = yaml.safe_load(config.read_text()) or {}
    data_cfg = cfg.get("data") or {}
    class_path = data_cfg.get("class_path", "project.data.MNISTDataModule") if isinstance(data_cfg, dict) else ""
    name = str(class_path).rsplit(".", 1)[-1]
    if name not in RAW_DATASET:
        raise UserError(
            f"--config {config}: data.class_path {class_path!r} is not project.data.MNISTDataModule or "
            "project.data.FashionMNISTDataModule; the raw loop is recipe B (LeNet on MNIST-family data)"
        )
    return name


def prepare(data_module: str, data_dir: str, source_dir: str | None) -> None:
    """Extract and check the data set in ``data_dir`` with the project's data module (``prepare_data``).

    Raises:
        UserError: missing or corrupt archives, or a failed download (the data module's message).
    """
    getattr(data_mod, data_module)(data_dir=data_dir, source_dir=source_dir).prepare_data()


def child_env() -> dict[str, str]:
    """The environment for the benchmarked processes: they import the same ``project`` package as this one.

    ``python -m project.<verb>`` in a child finds ``project`` via the current folder or an installed copy, which
    may be another checkout (an editable install points at one folder); putting this package's parent first
    on ``PYTHONPATH`` makes the children run the code this benchmark was started from.
    """
    root = str(Path(project.__file__).resolve().parents[1])
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def last_lines(text: str, n: int = 3) -> str:
    """The last ``n`` non-empty lines of ``text`` (progress-bar ``\\r`` updates count as lines), joined by ``|``."""
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return " | ".join(lines[-n:]) or "(no output)"


def run_command(cmd: list[str], label: str) -> tuple[float, float, str]:
    """Run ``cmd``; return ``(wall seconds, launch time as time.time(), stdout)``.

    Raises:
        RunError: non-zero exit status; the message holds the last lines of its stderr.
    """
    launch_unix = time.time()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RunError(f"{label} failed (exit {proc.returncode}): {last_lines(proc.stderr)}")
    return wall, launch_unix, proc.stdout


def raw_result(stdout: str, launch_unix: float, label: str) -> dict[str, Any]:
    """Test accuracy (0-1), training and start-up seconds from the raw loop's ``RESULT {json}`` line.

    Raises:
        RunError: no ``RESULT`` line.
    """
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RunError(f"{label} printed no RESULT line: {last_lines(stdout)}")
    r = json.loads(lines[-1].removeprefix("RESULT "))
    return {"test_acc": r["test_acc"], "train_s": r["train_time_s"], "startup_s": r["train_start_unix"] - launch_unix}


def first_event_unix(run_dir: Path) -> float | None:
    """Wall time (``time.time()``) of the first TensorBoard event in a run folder, or ``None`` if there is none.

    Lightning's TensorBoardLogger creates its event file when the Trainer logs the hyperparameters (``logger.save()``
    in ``Trainer._run``): after the CLI, the model and data modules, ``prepare_data`` and ``setup``, just before
    the sanity check and the first epoch.
    """
    times = []
    for path in run_dir.glob("events.out.tfevents.*"):
        first = next(iter(EventFileLoader(str(path)).Load()), None)
        if first is not None:
            times.append(first.wall_time)
    return min(times) if times else None


def fit_result(logs: Path, seen: set[Path], launch_unix: float, label: str) -> dict[str, Any]:
    """Test accuracy (0-1), training and start-up seconds of the newest run folder under ``logs``.

    Raises:
        RunError: no new ``*/version_*/results.json`` (one not in ``seen``) under ``logs``.
    """
    found = [p for p in logs.glob("*/version_*/results.json") if p not in seen]
    if not found:
        raise RunError(f"{label} wrote no new */version_*/results.json under {logs}")
    path = max(found, key=lambda p: p.stat().st_mtime)
    seen.add(path)
    r = json.loads(path.read_text())
    first = first_event_unix(path.parent)
    return {
        "test_acc": r["test_acc"],
        "train_s": sum(r["epoch_time_s"]),
        "startup_s": first - launch_unix if first is not None else None,
    }


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summarize(runs: dict[str, list[dict[str, Any]]], commands: dict[str, str]) -> list[dict[str, Any]]:
    """One row per command: medians over its runs of wall, start-up, train and rest seconds and of test accuracy.

    ``rest_s`` of a run is ``wall_s - startup_s - train_s`` (evaluation, checkpoints, exit); medians are taken
    per column, so a row's columns need not add up exactly. ``ratio`` is this row's median wall time over the
    raw loop's (1.0 for the raw loop itself).
    """
    for rs in runs.values():
        for r in rs:
            r["rest_s"] = r["wall_s"] - r["startup_s"] - r["train_s"] if r["startup_s"] is not None else None
    rows = []
    for name in ROWS:
        rs = runs[name]
        rows.append(
            {
                "row": name,
                "command": commands[name],
                **{k: _median([r[k] for r in rs]) for k in ("wall_s", "startup_s", "train_s", "rest_s")},
                "test_acc": _median([r["test_acc"] for r in rs]),
                "walls_s": [r["wall_s"] for r in rs],
                "test_accs": [r["test_acc"] for r in rs],
            }
        )
    for row in rows:
        row["ratio"] = row["wall_s"] / rows[0]["wall_s"]
    return rows


def markdown(rows: list[dict[str, Any]], header: str, loads: list[float]) -> str:
    """The rows as a Markdown table under ``header``, followed by the exact commands and the load averages."""

    def sec(v: float | None) -> str:
        return f"{v:.1f}" if v is not None else "-"

    lines = [
        header,
        "",
        "| " + " | ".join(COLUMNS) + " | test acc (each) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        each = ", ".join(f"{a:.4f}" for a in r["test_accs"])
        lines.append(
            f"| {r['row']} | {r['wall_s']:.1f} | {r['ratio']:.2f} | {sec(r['startup_s'])} | {sec(r['train_s'])} "
            f"| {sec(r['rest_s'])} | {r['test_acc']:.4f} | {each} |"
        )
    lines += ["", *(f"- {r['row']}: `{r['command']}`" for r in rows)]
    loads = ", ".join(f"{x:.2f}" for x in loads)
    lines += ["", f"1-minute load average before each run, in order: {loads} (other work on the machine skews times)"]
    return "\n".join(lines) + "\n"


def machine() -> str:
    """The GPU's name, or the CPU's core and torch thread counts."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"{platform.machine()} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, no GPU"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m benchmarks.bench_e2e", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/fashion_mnist.yaml", help="fit's config (MNIST or Fashion-MNIST)")
    p.add_argument("--source_dir", default=None, help="folder with the original archives to import offline")
    p.add_argument("--data_dir", default="data", help="where the data is extracted (torchvision's layout)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each command, alternated; medians reported")
    p.add_argument("--epochs", type=int, default=2, help="training epochs of both commands")
    p.add_argument("--limit_train_batches", type=int, default=None, help="training batches per epoch (both sides)")
    p.add_argument("--fit_args", default="", help="extra arguments for python -m project.fit (one string)")
    p.add_argument("--raw_args", default="", help="extra arguments for python -m benchmarks.recipe_loop (one string)")
    p.add_argument("--out", default="bench_e2e.json", help="JSON output; a .md table is written beside it")
    args = p.parse_args(argv)
    for key in ("repeats", "epochs", "limit_train_batches"):
        value = getattr(args, key)
        if value is not None and value < 1:
            p.error(f"--{key} must be >= 1, got {value}")
    if not Path(args.config).is_file():
        p.error(f"--config {args.config} does not exist")
    return args


def commands(args: argparse.Namespace, data_module: str, logs: Path) -> dict[str, list[str]]:
    """The two command lines (absolute data and config paths, so they run from any folder)."""
    data_dir = str(Path(args.data_dir).resolve())
    epochs = str(args.epochs)
    raw = [sys.executable, "-m", "benchmarks.recipe_loop", "--dataset", RAW_DATASET[data_module]]
    raw += ["--data_dir", data_dir, "--epochs", epochs]
    fit = [sys.executable, "-m", "project.fit", "--config", str(Path(args.config).resolve())]
    fit += ["--trainer.max_epochs", epochs, "--data.data_dir", data_dir]
    fit += ["--trainer.logger.init_args.save_dir", str(logs)]
    if args.limit_train_batches is not None:
        raw += ["--limit_train_batches", str(args.limit_train_batches)]
        fit += ["--trainer.limit_train_batches", str(args.limit_train_batches)]
    return {"raw loop": raw + shlex.split(args.raw_args), "fit": fit + shlex.split(args.fit_args)}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Prepare the data, run both commands ``repeats`` times alternately; returns the JSON report.

    Raises:
        UserError: bad config or data, a failed command (:class:`RunError`).
    """
    data_module = data_module_name(Path(args.config))
    prepare(data_module, args.data_dir, args.source_dir)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ROWS}
    seen: set[Path] = set()
    loads: list[float] = []  # 1-minute load average before each run: other work on the machine shows here
    with tempfile.TemporaryDirectory(prefix="bench_e2e_logs_") as tmp:
        logs = Path(tmp)
        cmds = commands(args, data_module, logs)
        for i in range(args.repeats):
            for name in ROWS:
                label = f"{name} (run {i + 1}/{args.repeats}: {shlex.join(cmds[name])})"
                loads.append(os.getloadavg()[0])
                wall, launch, stdout = run_command(cmds[name], label)
                if name == "raw loop":
                    result = raw_result(stdout, launch, label)
                else:
                    result = fit_result(logs, seen, launch, label)
                runs[name].append({"wall_s": wall, **result, "load_avg_before": loads[-1]})
                print(f"{name} {i + 1}/{args.repeats}: {wall:.1f} s, test acc {result['test_acc']:.4f}", flush=True)
    shown = {name: shlex.join(["python", *cmd[1:]]).replace(str(logs), "<tmp logs>") for name, cmd in cmds.items()}
    rows = summarize(runs, shown)
    limit = f", {args.limit_train_batches} training batches per epoch" if args.limit_train_batches else ""
    header = (
        f"{machine()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}, {args.epochs} epoch(s){limit}, "
        f"{args.repeats} repeat(s) of each command, alternated"
    )
    return {
        "header": header,
        "ratio": rows[1]["ratio"],
        "rows": rows,
        "runs": runs,
        "load_avg_before_runs": loads,
        "config": args.config,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.bench_e2e``; returns the exit status (0 ok, 1 a failed run or bad data)."""
    args = parse_args(argv)
    try:
        report = bench(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    table = markdown(report["rows"], report["header"], report["load_avg_before_runs"])
    write_report(Path(args.out), report, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
