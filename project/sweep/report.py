"""A sweep's report: :mod:`project.summarize`'s tables and plots over the sweep's trials, and the best point.

Written by ``python -m project.sweep`` at the end of a sweep and by ``--report`` at any time, into the
sweep folder: ``report.md`` (every trial with its state, then the points: completed trials grouped by the swept
keys, mean ± sample std over seeds -- and over folds in a K-fold sweep, with each fold's value beside it -- then the
best point by that mean), ``report.json`` (the same as data), ``val_acc.png``
(validation accuracy per point), ``objective-<key>.png`` (the objective against each swept key) and, when the runs
prune weights, ``objective-sparsity.png`` (the objective against the measured sparsity; the dense runs sit at 0).
Trial states come from the study, values from each run's ``results.json`` (read as data, bounded: a trial whose
``results.json`` cannot be read is reported without values, with one ``warning:`` line). Every file is written
atomically, never through a link (:mod:`project.runs.files`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from project.errors import UnreadableFile
from project.runs import files, layout
from project.summary import plots, tables
from project.summary.collect import Run, fmt, group_runs, per_fold, warn


def collect(study: optuna.Study, keys: list[str]) -> list[dict[str, Any]]:
    """One row per trial that ran (surplus trials, which ran nothing, are left out)."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("surplus") or t.state == optuna.trial.TrialState.WAITING:
            continue
        run = Path(t.user_attrs["run"]) if "run" in t.user_attrs else None
        results: dict[str, Any] = {}
        if run is not None and (run / layout.RESULTS).exists():
            try:
                results = layout.read_results(run)
            except UnreadableFile as e:
                warn(f"trial {t.number}: its results are left out: {e}")
        rows.append(
            {
                "trial": t.number,
                "state": t.state.name.lower(),
                "run": str(run) if run else None,
                "params": {k: t.params.get(k) for k in keys},
                "seed": t.params.get("seed"),
                "fold": t.params.get("fold"),
                "value": t.value,
                "retry_of": t.system_attrs.get("failed_trial"),
                "results": results,
            }
        )
    return rows


def as_run(row: dict[str, Any], sweep_name: str) -> Run:
    """A trial as summarize's :class:`~project.summary.collect.Run`: its swept values and seed as the config, its
    trial number and state as the status (``trial 4: complete (retry of trial 0)``)."""
    retry = f" (retry of trial {row['retry_of']})" if row["retry_of"] is not None else ""
    return Run(
        path=Path(row["run"] or "-"),
        experiment=sweep_name,
        results=row["results"] or None,
        config={**row["params"], "seed_everything": row["seed"]},
        status=f"trial {row['trial']}: {row['state']}{retry}",
    )


def report(study: optuna.Study, sweep: Any, folder: Path, echo: bool = False) -> dict[str, Any]:
    """Write ``report.md``, ``report.json`` and the plots into ``folder``; returns the report as a dict."""
    keys = [p.key for p in sweep.space]
    metric = sweep.metric
    metrics = list(dict.fromkeys([metric, "sparsity", "epochs"]))
    rows = collect(study, keys)
    trials = [as_run(r, sweep.name) for r in rows]
    complete = [run for run, r in zip(trials, rows) if r["state"] == "complete" and run.results is not None]
    table = ""
    stats: dict[str, Any] = {"groups": {}, "runs": []}
    if trials:
        table, stats = tables.summarize([folder], metrics, keys, found=trials, grouped=complete)
    points = _points(complete, keys, stats, metric)
    lines = [f"Sweep `{sweep.name}`: {metric} ({sweep.direction}), {len(rows)} trials", "", table.rstrip("\n")]
    best = _best_point(points, sweep.direction)
    lines += _best_and_folds_lines(best, points, metric)
    folder.mkdir(parents=True, exist_ok=True)
    figures = _plots(stats, complete, keys, folder, metric)
    out = {
        "sweep": sweep.name,
        "metric": metric,
        "direction": sweep.direction,
        "trials": rows,
        "points": points,
        "best": best,
        "plots": [p.name for p in figures],
    }
    text = "\n".join(lines) + "\n"
    files.write_text(folder / "report.md", text, below=folder.parent)  # no link followed at the sweep folder
    files.write_json(folder / "report.json", out, below=folder.parent)
    if echo:
        print(text, end="")
    return out


def _points(complete: list[Run], keys: list[str], stats: dict[str, Any], metric: str) -> list[dict[str, Any]]:
    """The swept points: the completed trials grouped by the swept ``keys``, each with its values, ``n``, mean and
    sample std of ``metric`` over seeds (``stats``' groups), mean sparsity, seeds and, in a K-fold sweep, each
    fold's value; sorted by the swept values."""
    points = []
    for label, members in group_runs(complete, keys).items():
        st = stats["groups"][label]
        folds = per_fold(members, [metric])
        points.append(
            {
                "params": {k: members[0].config[k] for k in keys},
                "n": st["runs"],
                "mean": st[metric]["mean"],
                "std": st[metric]["std"],
                "sparsity": st["sparsity"]["mean"],
                "seeds": sorted(set(m.config["seed_everything"] for m in members)),
            }
            | ({"folds": {k: v[metric] for k, v in folds.items()}} if folds else {})
        )
    points.sort(key=lambda p: tuple(str(v) if not isinstance(v, int | float) else v for v in p["params"].values()))
    return points


def _best_point(points: list[dict[str, Any]], direction: str) -> dict[str, Any] | None:
    """The point with the best mean (highest when ``direction`` is ``maximize``, else lowest); ``None`` when no
    point has a mean."""
    scored = [p for p in points if p["mean"] is not None]
    if not scored:
        return None
    return (max if direction == "maximize" else min)(scored, key=lambda p: p["mean"])


def _best_and_folds_lines(best: dict[str, Any] | None, points: list[dict[str, Any]], metric: str) -> list[str]:
    """``report.md``'s lines after the tables: the best point with its mean ± std and what it is over, then, in a
    K-fold sweep, each point's value per fold."""
    lines = []
    if best is not None:
        over = f"{best['n']} seed(s)"
        if "folds" in best:
            over = f"{len(best['folds'])} fold(s) x {len(best['seeds'])} seed(s)"
        lines += [
            "",
            f"Best point: {', '.join(f'{k}={fmt(v)}' for k, v in best['params'].items())}: {metric} "
            f"{fmt(best['mean'])} ± {fmt(best['std'])} over {over}",
        ]
    if any("folds" in p for p in points):
        lines += ["", f"Folds ({metric}, each fold's mean over seeds):", ""]
        lines += [
            f"- {', '.join(f'{k}={fmt(v)}' for k, v in p['params'].items())}: "
            + ", ".join(f"fold {k} {fmt(v)}" for k, v in p.get("folds", {}).items())
            for p in points
        ]
    return lines


def _plots(stats: dict[str, Any], complete: list[Run], keys: list[str], folder: Path, metric: str) -> list[Path]:
    """Write the plots of the completed trials into ``folder`` (:func:`project.summary.plots.plot`:
    ``val_acc.png``, ``objective-<key>.png`` per swept key and, when any run pruned weights,
    ``objective-sparsity.png``); none without a completed trial. Returns their paths."""
    if not complete:
        return []
    pruned = any(isinstance(s, int | float) and s > 0 for s in (run.value("sparsity") for run in complete))
    x_keys = [*keys, *(["sparsity"] if pruned else [])]
    return plots.plot(stats, complete, folder, x_keys, y_key=metric, name="objective-{x}.png")
