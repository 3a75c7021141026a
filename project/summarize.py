"""``python -m project.summarize [LOGS_OR_RUNS...] [--metrics test_acc best_val_acc ...] [--out summary.md]``.

One table across run folders: every finished run (a folder with ``results.json``) under the given folders
(default ``logs``), then per experiment the mean ± sample standard deviation of each metric over its runs
(seeds, repeats). Unfinished runs are listed as such. Reads only ``results.json`` (JSON, no code).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from project import runs
from project.errors import ConfigError

DEFAULT_METRICS = ["test_acc", "best_val_acc", "train_samples_per_s", "sparsity"]


def collect(roots: list[Path]) -> list[tuple[Path, dict[str, Any] | None]]:
    """``(run, results or None)`` for every run folder under ``roots`` (a run folder counts as itself)."""
    found: dict[Path, None] = {}
    for root in roots:
        if not root.exists():
            raise ConfigError(f"{root} does not exist")
        candidates = [root] if runs.version_of(root) is not None else sorted(root.rglob("version_*"))
        for run in candidates:
            if run.is_dir() and runs.version_of(run) is not None:
                found[run] = None
    out = []
    for run in found:
        try:
            out.append((run, runs.read_results(run)))
        except ConfigError:
            out.append((run, None))
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4f}"
    return str(value)


def summarize(roots: list[Path], metrics: list[str]) -> tuple[str, dict[str, Any]]:
    """Markdown tables (runs; mean ± std per experiment) and the same as a dict.

    Raises:
        ConfigError: a root does not exist or holds no run folder.
    """
    rows = collect(roots)
    if not rows:
        raise ConfigError(f"no run folders (version_N) under {', '.join(map(str, roots))}")
    lines = ["| experiment | run | seed | epochs | " + " | ".join(metrics) + " |",
             "|---|---|---:|---:|" + "---:|" * len(metrics)]  # fmt: skip
    groups: dict[str, list[dict[str, Any]]] = {}
    for run, res in rows:
        exp = run.parent.name
        if res is None:
            lines.append(f"| {exp} | {run.name} | | | unfinished |" + " |" * (len(metrics) - 1))
            continue
        groups.setdefault(exp, []).append(res)
        cells = " | ".join(_fmt(res.get(m)) for m in metrics)
        lines.append(f"| {exp} | {run.name} | {_fmt(res.get('seed'))} | {_fmt(res.get('epochs'))} | {cells} |")
    lines += ["", "| experiment | runs | " + " | ".join(f"{m} (mean ± std)" for m in metrics) + " |",
              "|---|---:|" + "---:|" * len(metrics)]  # fmt: skip
    stats: dict[str, Any] = {}
    for exp, results in groups.items():
        stats[exp] = {"runs": len(results)}
        cells = []
        for m in metrics:
            values = [float(r[m]) for r in results if isinstance(r.get(m), int | float)]
            mean = statistics.fmean(values) if values else None
            std = statistics.stdev(values) if len(values) > 1 else None
            stats[exp][m] = {"mean": mean, "std": std, "n": len(values)}
            cells.append("-" if mean is None else f"{_fmt(mean)} ± {_fmt(std) if std is not None else '-'}")
        lines.append(f"| {exp} | {len(results)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", stats


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 nothing to summarize)."""
    p = argparse.ArgumentParser(prog="python -m project.summarize", description=__doc__.splitlines()[0])
    p.add_argument("roots", nargs="*", default=["logs"], metavar="FOLDER", help="logs folders or run folders")
    p.add_argument("--metrics", nargs="+", default=DEFAULT_METRICS, help="results.json keys to tabulate")
    p.add_argument("--out", default=None, help="also write the Markdown table here (and a .json beside it)")
    ns = p.parse_args(argv)
    try:
        table, stats = summarize([Path(r) for r in ns.roots], ns.metrics)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table, end="")
    if ns.out:
        out = Path(ns.out)
        out.write_text(table)
        runs.write_json(out.with_suffix(".json"), stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
