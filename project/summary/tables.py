"""The tables of ``python -m project.summarize`` and of a sweep's report: every run, and groups of runs with n and
mean ± sample std (``ddof=1``) of each metric, as Markdown (:func:`summarize`) and CSV (:func:`groups_csv`,
:func:`runs_csv`). What the command writes and the keys it takes: :mod:`project.summarize`."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from project.errors import ConfigError
from project.summary.collect import Run, collect, fmt, group_runs, stats_of
from project.summary.labels import short_labels

DEFAULT_METRICS = ["test_acc", "best_val_acc", "train_samples_per_s", "sparsity", "epochs"]


def summarize(
    roots: list[Path],
    metrics: list[str],
    by: list[str] | None = None,
    found: list[Run] | None = None,
    grouped: list[Run] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Markdown tables (runs; groups with mean ± std) and the same data as a dict.

    ``grouped``: the runs of ``found`` that form the groups (default: every finished one; a sweep groups its
    completed trials only, not the pruned ones).

    Returns:
        ``(markdown, {"groups": {label: stats}, "runs": [...]})``; a group's stats hold ``runs``, ``paths``,
        ``{metric: {mean, std, n}}`` and ``short_label`` (:func:`short_labels`, the plots' name for it).

    Raises:
        ConfigError: a root does not exist or holds no run folder.
    """
    all_runs = collect(roots) if found is None else found  # ``found``: collect(roots), read once by the caller
    if not all_runs:
        raise ConfigError(f"no run folders (<experiment>/version_N) under {', '.join(map(str, roots))}")
    finished = [r for r in all_runs if r.results is not None] if grouped is None else grouped
    groups = group_runs(finished, by)
    group_of = {r.path: label for label, members in groups.items() for r in members}
    lines = [
        "| run | group | status | seed | " + " | ".join(metrics) + " |",
        "|---|---|---|---:|" + "---:|" * len(metrics),
    ]
    run_rows = []
    for run in all_runs:
        name = f"{run.experiment}/{run.path.name}"
        seed = run.value("seed") if run.results else run.config.get("seed_everything")
        cells = [run.value(m) if run.results else None for m in metrics]
        lines.append(
            f"| {name} | {group_of.get(run.path, '-')} | {run.status} | {fmt(seed)} | "
            + " | ".join(map(fmt, cells))
            + " |"
        )
        run_rows.append(
            {
                "run": str(run.path),
                "group": group_of.get(run.path, ""),
                "status": run.status,
                "seed": seed,
                **dict(zip(metrics, cells)),
            }
        )
    lines += [
        "",
        "| group | n | " + " | ".join(f"{m} (mean ± std)" for m in metrics) + " |",
        "|---|---:|" + "---:|" * len(metrics),
    ]
    short = short_labels(groups, by)
    group_stats = {
        label: stats_of(members, metrics) | {"short_label": short[label]} for label, members in groups.items()
    }
    for label, st in group_stats.items():
        means = ["-" if st[m]["mean"] is None else f"{fmt(st[m]['mean'])} ± {fmt(st[m]['std'])}" for m in metrics]
        lines.append(f"| {label} | {st['runs']} | " + " | ".join(means) + " |")
    return "\n".join(lines) + "\n", {"groups": group_stats, "runs": run_rows}


def groups_csv(stats: dict[str, Any], metrics: list[str]) -> str:
    """The groups table as CSV: ``group, n`` then ``<metric>_mean, <metric>_std, <metric>_n`` per metric."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["group", "n"] + [f"{m}_{s}" for m in metrics for s in ("mean", "std", "n")])
    for label, st in stats["groups"].items():
        writer.writerow([label, st["runs"]] + [st[m][s] for m in metrics for s in ("mean", "std", "n")])
    return buf.getvalue()


def runs_csv(stats: dict[str, Any]) -> str:
    buf = io.StringIO()
    rows = stats["runs"]
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
