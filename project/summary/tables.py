"""The tables of ``python -m project.summarize`` and of a sweep's report: every run, and groups of runs with n and
mean ± sample std (``ddof=1``) of each metric, as Markdown (:func:`summarize`) and CSV (:func:`groups_csv`,
:func:`runs_csv`). What the command writes and the keys it takes: :mod:`project.summarize`."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from project.errors import ConfigError
from project.summary.collect import Run, collect, fmt, fold_of, group_runs, per_fold, stats_of
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
        ``{metric: {mean, std, n}}``, ``short_label`` (:func:`short_labels`, the plots' name for it) and, for K-fold
        runs, ``folds``: :func:`~project.summary.collect.per_fold` (a fold's mean over seeds, by fold). Runs with
        folds get a ``fold`` column.

    Raises:
        ConfigError: a root does not exist or holds no run folder.
    """
    all_runs = collect(roots) if found is None else found  # ``found``: collect(roots), read once by the caller
    if not all_runs:
        raise ConfigError(f"no run folders (<experiment>/version_N) under {', '.join(map(str, roots))}")
    finished = [r for r in all_runs if r.results is not None] if grouped is None else grouped
    groups = group_runs(finished, by)
    lines, run_rows = _runs_table(all_runs, metrics, groups)
    group_lines, group_stats = _groups_table(groups, metrics, by)
    return "\n".join(lines + group_lines) + "\n", {"groups": group_stats, "runs": run_rows}


def _runs_table(
    all_runs: list[Run], metrics: list[str], groups: dict[str, list[Run]]
) -> tuple[list[str], list[dict[str, Any]]]:
    """The runs table: its Markdown lines (header, one row per run: name, group, status, seed, the fold when any
    run has folds, ``metrics``) and the same rows as dicts (``run``, ``group``, ``status``, ``seed``, [``fold``],
    one key per metric; an unfinished run's metrics ``None``)."""
    group_of = {r.path: label for label, members in groups.items() for r in members}
    with_folds = any(fold_of(r) is not None for r in all_runs)
    fold_head = ("fold | ", "---:|") if with_folds else ("", "")
    lines = [
        f"| run | group | status | seed | {fold_head[0]}" + " | ".join(metrics) + " |",
        f"|---|---|---|---:|{fold_head[1]}" + "---:|" * len(metrics),
    ]
    run_rows = []
    for run in all_runs:
        name = f"{run.experiment}/{run.path.name}"
        seed = run.value("seed") if run.results else run.config.get("seed_everything")
        cells = [run.value(m) if run.results else None for m in metrics]
        fold = {"fold": fold_of(run)} if with_folds else {}
        lines.append(
            f"| {name} | {group_of.get(run.path, '-')} | {run.status} | {fmt(seed)} | "
            + "".join(f"{fmt(v)} | " for v in fold.values())
            + " | ".join(map(fmt, cells))
            + " |"
        )
        run_rows.append(
            {
                "run": str(run.path),
                "group": group_of.get(run.path, ""),
                "status": run.status,
                "seed": seed,
                **fold,
                **dict(zip(metrics, cells)),
            }
        )
    return lines, run_rows


def _groups_table(
    groups: dict[str, list[Run]], metrics: list[str], by: list[str] | None
) -> tuple[list[str], dict[str, Any]]:
    """The groups table: its Markdown lines (a blank line, header, one row per group: label, n, mean ± std of each
    metric) and each group's stats (:func:`~project.summary.collect.stats_of`, ``short_label``, per-fold values)."""
    lines = [
        "",
        "| group | n | " + " | ".join(f"{m} (mean ± std)" for m in metrics) + " |",
        "|---|---:|" + "---:|" * len(metrics),
    ]
    short = short_labels(groups, by)
    group_stats = {
        label: stats_of(members, metrics) | {"short_label": short[label]} | _folds(members, metrics)
        for label, members in groups.items()
    }
    for label, st in group_stats.items():
        means = ["-" if st[m]["mean"] is None else f"{fmt(st[m]['mean'])} ± {fmt(st[m]['std'])}" for m in metrics]
        lines.append(f"| {label} | {st['runs']} | " + " | ".join(means) + " |")
    return lines, group_stats


def _folds(members: list[Run], metrics: list[str]) -> dict[str, Any]:
    """``{"folds": per-fold values}`` for a group of K-fold runs, else ``{}``."""
    folds = per_fold(members, metrics)
    return {"folds": folds} if folds else {}


def groups_csv(stats: dict[str, Any], metrics: list[str]) -> str:
    """The groups table as CSV: ``group, n`` then ``<metric>_mean, <metric>_std, <metric>_n`` per metric; with
    K-fold groups also ``<metric>_fold<k>`` for each fold k (that fold's value; its mean over seeds), empty for the
    groups without that fold."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    folds = sorted({k for st in stats["groups"].values() for k in st.get("folds", {})})
    writer.writerow(
        ["group", "n"]
        + [f"{m}_{s}" for m in metrics for s in ("mean", "std", "n")]
        + [f"{m}_fold{k}" for m in metrics for k in folds]
    )
    for label, st in stats["groups"].items():
        by_fold = st.get("folds", {})
        writer.writerow(
            [label, st["runs"]]
            + [st[m][s] for m in metrics for s in ("mean", "std", "n")]
            + [by_fold[k][m] if k in by_fold else None for m in metrics for k in folds]
        )
    return buf.getvalue()


def runs_csv(stats: dict[str, Any]) -> str:
    buf = io.StringIO()
    rows = stats["runs"]
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
