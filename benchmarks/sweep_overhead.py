"""Sweep and summarize overhead, two checkouts side by side in one run (not a test: it measures, it asserts nothing).

    python benchmarks/sweep_overhead.py --before /path/to/old/checkout --after . \\
        --data_dir /path/to/fashion-mnist-data [--seeds 4] [--rounds 2] [--runs 100 1000] [--out FILE.json]

* **Sweep**: the smoke sweep (``configs/sweeps/smoke.yaml``: LeNet, Fashion-MNIST, 2 epochs of 4 batches, 2
  learning rates) with ``--seeds`` seeds, run by each checkout in turn (before, after, before, after, ...), each in
  a fresh folder, with one extra callback, :class:`TrialClock`, that records in every trial's run folder when the
  trial's own work started (``setup`` of fit) and ended (``teardown`` of test), in wall-clock and in CPU seconds of
  the trial's process. Per-trial overhead = (sweep wall - the trials' own fit/test time) / trials; the same in
  CPU seconds (the sweep's whole process tree, from ``getrusage(RUSAGE_CHILDREN)``), which a busy machine
  disturbs less than wall time. The objective value of every (learning rate, seed) is compared across checkouts.
* **Summarize**: ``--runs`` copies of the after-sweep's trial folders (checkpoints left out), then
  ``python -m project.summarize`` over them with each checkout, as a whole process, plots included.

Runs each checkout with ``PYTHONPATH=<checkout>:benchmarks`` and ``OMP_NUM_THREADS=1`` (unless set).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _trainer_callback_base() -> type:
    from lightning.pytorch.callbacks import Callback

    return Callback


try:
    _Base = _trainer_callback_base()
except ImportError:  # the driver itself needs no Lightning
    _Base = object


class TrialClock(_Base):  # type: ignore[misc, valid-type]
    """Writes ``clock.json`` into the run folder: wall (``time.time``) and process CPU seconds at the start of
    fit's ``setup`` and at the end of test's ``teardown``: the trial's own work, whatever starts it."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self.start = (time.time(), time.process_time())

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "test" or not trainer.is_global_zero or trainer.logger is None:
            return
        end = (time.time(), time.process_time())
        # cpu_before_work_s: the process's CPU seconds before fit's setup (a fork starts at 0; a new interpreter
        # has imported torch and Lightning by then)
        record = {
            "wall_s": end[0] - self.start[0],
            "cpu_s": end[1] - self.start[1],
            "process_start": _started(),
            "work_start": self.start[0],
            "work_end": end[0],
            "cpu_before_work_s": self.start[1],
        }
        (Path(trainer.logger.log_dir) / "clock.json").write_text(json.dumps(record))


def _started() -> float:
    """When this process started (a fork or an exec), as ``time.time()`` (Linux ``/proc``; 10 ms ticks)."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _env(checkout: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(checkout), str(HERE)]),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "PYTHONUNBUFFERED": "1",
    }


def run_sweep(checkout: Path, data_dir: Path, seeds: int, work: Path) -> dict[str, Any]:
    """One smoke sweep of ``checkout`` in ``work``: wall, CPU, per-trial clocks and objective values."""
    import yaml

    spec = yaml.safe_load((checkout / "configs/sweeps/smoke.yaml").read_text())
    spec["seeds"] = list(range(1, seeds + 1))
    work.mkdir(parents=True)
    (work / "sweep.yaml").write_text(yaml.safe_dump(spec))
    cmd = [
        sys.executable,
        "-m",
        "project.sweep",
        "--config",
        "sweep.yaml",
        "--data.data_dir",
        str(data_dir),
        "--trainer.callbacks+=sweep_overhead.TrialClock",
    ]
    cpu0, t0, start = _children_cpu(), time.perf_counter(), time.time()
    proc = subprocess.run(cmd, cwd=work, env=_env(checkout), capture_output=True, text=True)
    wall, cpu, end = time.perf_counter() - t0, _children_cpu() - cpu0, time.time()
    if proc.returncode != 0:
        raise SystemExit(f"sweep failed in {work}:\n{proc.stderr[-3000:]}")
    trials = []
    for run in sorted((work / "logs" / spec["name"]).glob("version_*")):
        info = json.loads((run / "trial.json").read_text())
        clock = json.loads((run / "clock.json").read_text())
        lr = next(iter(info["params"].values()))
        trials.append({"lr": lr, "seed": info["seed"], "value": info["value"], **clock})
    n = len(trials)
    # the sweep's own start (imports, study) before the first trial's process, and its report after the last trial
    first, last = min(t["process_start"] for t in trials), max(t["work_end"] for t in trials)
    fixed = (first - start) + (end - last)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "trials": trials,
        "fixed_wall_s": fixed,
        "overhead_wall_s": (wall - sum(t["wall_s"] for t in trials)) / n,
        "steady_overhead_wall_s": (wall - fixed - sum(t["wall_s"] for t in trials)) / n,
        "trial_cpu_before_work_s": statistics.median(t["cpu_before_work_s"] for t in trials),
        "overhead_cpu_s": (cpu - sum(t["cpu_s"] for t in trials)) / n,
        "folder": str(work / "logs" / spec["name"]),
    }


def make_runs(template: Path, n: int, root: Path) -> None:
    """``n`` run folders under ``root/smoke`` copied round-robin from the trial folders in ``template``."""
    sources = sorted(template.glob("version_*"))
    for i in range(n):
        shutil.copytree(
            sources[i % len(sources)], root / "smoke" / f"version_{i}", ignore=shutil.ignore_patterns("checkpoints")
        )


def run_summarize(checkout: Path, root: Path, out: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "project.summarize", str(root), "--out", str(out)]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=_env(checkout), capture_output=True, text=True)  # cwd: not a checkout
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"summarize failed:\n{proc.stderr[-3000:]}")
    return {"wall_s": wall, "cpu_s": cpu}


def machine() -> dict[str, Any]:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in flags.splitlines() if line.startswith("model name")), "?")
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "arch": platform.machine(),
        "native_bf16": any(f in flags for f in ("avx512_bf16", "amx_bf16")),
        "load_avg_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True, help="checkout to compare against (e.g. main)")
    p.add_argument("--after", type=Path, default=HERE.parent, help="checkout under test (default: this one)")
    p.add_argument("--data_dir", type=Path, required=True, help="a data_dir with Fashion-MNIST imported")
    p.add_argument("--seeds", type=int, default=4, help="seeds per learning rate: 2 x seeds trials (default 4)")
    p.add_argument("--rounds", type=int, default=2, help="sweeps per checkout, interleaved (default 2)")
    p.add_argument("--runs", type=int, nargs="+", default=[100, 1000], help="run folders for summarize")
    p.add_argument("--out", type=Path, help="write the measurements as JSON here")
    ns = p.parse_args()
    checkouts = {"before": ns.before.resolve(), "after": ns.after.resolve()}
    for checkout in checkouts.values():  # each command must import its own checkout's package
        probe = [sys.executable, "-c", "import project; print(project.__file__)"]
        where = subprocess.run(
            probe, cwd=tempfile.gettempdir(), env=_env(checkout), capture_output=True, text=True
        ).stdout.strip()
        if not where.startswith(str(checkout)):
            raise SystemExit(f"{checkout}: python imports project from {where or 'nowhere'}")
    result: dict[str, Any] = {"machine": machine(), "precision": "32-true", "sweeps": {k: [] for k in checkouts}}
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        for r in range(ns.rounds):
            for label, checkout in checkouts.items():
                got = run_sweep(checkout, ns.data_dir.resolve(), ns.seeds, Path(tmp) / f"{label}-{r}")
                result["sweeps"][label].append(got)
                print(
                    f"{label} round {r}: {len(got['trials'])} trials, wall {got['wall_s']:.1f} s, cpu "
                    f"{got['cpu_s']:.1f} s, overhead per trial {got['overhead_wall_s']:.2f} s wall "
                    f"({got['steady_overhead_wall_s']:.2f} s without start and report), "
                    f"{got['overhead_cpu_s']:.2f} s cpu",
                    flush=True,
                )
        values = {
            label: sorted((t["lr"], t["seed"], t["value"]) for s in runs for t in s["trials"])
            for label, runs in result["sweeps"].items()
        }
        result["identical_values"] = len(set(map(tuple, values.values()))) == 1
        result["summarize"] = {}
        for n in ns.runs:
            root = Path(tmp) / f"runs-{n}"
            make_runs(Path(result["sweeps"]["after"][0]["folder"]), n, root)
            for label, checkout in checkouts.items():
                got = run_summarize(checkout, root, Path(tmp) / f"summary-{label}-{n}")
                result["summarize"].setdefault(str(n), {})[label] = got
                print(f"summarize {n} runs, {label}: wall {got['wall_s']:.1f} s, cpu {got['cpu_s']:.1f} s", flush=True)
            shutil.rmtree(root)
    lines = ["| measure | before | after |", "|---|---:|---:|"]
    measures = (
        ("overhead_wall_s", "per-trial overhead, wall (s)"),
        ("overhead_cpu_s", "per-trial overhead, CPU (s)"),
        ("steady_overhead_wall_s", "per-trial overhead without the sweep's start and report, wall (s)"),
        ("fixed_wall_s", "the sweep's start and report, wall (s)"),
        ("trial_cpu_before_work_s", "a trial process's CPU before its fit starts (s), median"),
        ("wall_s", "sweep wall (s)"),
        ("cpu_s", "sweep CPU (s)"),
    )
    for key, name in measures:
        cells = [statistics.median(s[key] for s in result["sweeps"][label]) for label in checkouts]
        lines.append(f"| {name}, median of {ns.rounds} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    for n, by in result["summarize"].items():
        lines.append(
            f"| summarize {n} runs, wall / CPU (s) | "
            + " | ".join(f"{by[label]['wall_s']:.2f} / {by[label]['cpu_s']:.2f}" for label in checkouts)
            + " |"
        )
    lines.append(f"\nidentical objective values: {result['identical_values']}; machine: {result['machine']}")
    print("\n".join(lines))
    if ns.out:
        ns.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
