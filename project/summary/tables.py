"""``python -m project.summarize [FOLDER...] [--by KEY...] [--x KEY] [--format md|csv] [--out DIR]``.

One table across run folders (default: everything under ``logs``):

* **runs**: every run folder (``<experiment>/version_N``) with its seed, epochs and metrics from
  ``results.json``; a folder without one is listed as ``unfinished`` (resumable when it holds
  ``checkpoints/last.ckpt``), never dropped;
* **groups**: runs whose configs differ only in the seed (and in paths, logger and loader settings that do
  not change results) form one group, shown with n and the mean ± sample standard deviation (``ddof=1``)
  of each metric. ``--by KEY...`` groups by those keys instead.

A KEY is a ``results.json`` key (``precision``, ``sparsity``...), ``experiment``, or a config key written
dotted without ``init_args`` (``model.optimizer.lr``, ``data.batch_size``, ``trainer.callbacks.Pruning.amount``);
any unambiguous ending of one works too (``lr``, ``amount``).

Writes into ``--out`` (default: the first FOLDER): ``summary.md``, ``summary.csv`` (groups),
``summary-runs.csv``, ``summary.json``, and PNG plots: ``val_acc.png`` (validation accuracy against step
from each run's ``metrics.csv``, or its TensorBoard event files when it has none, coloured by group; the legend,
below the plot, names each group by the keys that tell the groups apart, in at most 60 characters) and
``test_acc_vs_<KEY>.png`` (test accuracy of every run and each group's mean ± std against ``--x KEY``, default
the first ``--by`` key).
Reads only ``results.json``, YAML configs (safe loader), ``metrics.csv`` and event files: nothing in a run
folder runs code.
"""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from project.errors import ConfigError
from project.runs import layout
from project.summary.plots import short_labels

# yaml's safe loader, in C where libyaml is there (the pure-Python one took ~10 ms of a run's 45)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


DEFAULT_METRICS = ["test_acc", "best_val_acc", "train_samples_per_s", "sparsity", "epochs"]


# Config keys that do not change what a run computes: paths, logging, loader plumbing, the seed.
IGNORED = ("seed_everything", "data.seed", "trainer.logger", "data.data_dir", "data.source_dir", "data.download",
           "data.num_workers", "data.pin_memory", "data.persistent_workers", "ckpt_path", "trust_checkpoint",
           "trainer.enable_progress_bar", "trainer.enable_model_summary", "checkpoint.dirpath",
           "trainer.default_root_dir",
           # the run callbacks that only log or record (project.cli.RUN_CALLBACKS): how a run is watched
           "throughput", "lr_monitor", "tensorboard_layout", "metrics_csv", "slurm_requeue")  # fmt: skip


@dataclass
class Run:
    path: Path
    experiment: str
    results: dict[str, Any] | None
    config: dict[str, Any] = field(default_factory=dict)
    status: str = "finished"

    def value(self, key: str) -> Any:
        """``key`` in results, then config (see the module doc); None when absent."""
        if key == "experiment":
            return self.experiment
        if self.results and key in self.results:
            return self.results[key]
        return self.config.get(resolve_key(key, self.config))


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A config as ``{dotted.key: leaf}``; ``init_args`` levels dropped, list items named by their class."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        if "class_path" in tree:
            out[prefix.rstrip(".") or "class_path"] = tree["class_path"]
            out.update(flatten(tree.get("init_args") or {}, prefix))
            return out
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(tree, list) and tree:
        for i, item in enumerate(tree):
            name = str(item["class_path"]).rsplit(".", 1)[-1] if isinstance(item, dict) and "class_path" in item else i
            out.update(flatten(item, f"{prefix}{name}."))
    else:
        out[prefix.rstrip(".")] = tree
    return out


def resolve_key(key: str, config: dict[str, Any]) -> str:
    """The flattened config key meant by ``key`` (exact, else the unique one ending in ``.key``)."""
    if key in config:
        return key
    matches = [k for k in config if k.endswith("." + key)]
    return matches[0] if len(matches) == 1 else key


def collect(roots: list[Path]) -> list[Run]:
    """Every run folder under ``roots`` (a run folder counts as itself), with results and flattened config.

    Raises:
        ConfigError: a root does not exist.
    """
    found: dict[Path, None] = {}
    for root in roots:
        if not root.exists():
            raise ConfigError(f"{root} does not exist; give logs folders or run folders")
        candidates = [root] if layout.version_of(root) is not None else sorted(root.rglob("version_*"))
        for run in candidates:
            if run.is_dir() and layout.version_of(run) is not None:
                found[run] = None
    out = []
    for path in found:
        try:
            results, status = layout.read_results(path), "finished"
        except ConfigError:
            resumable = (path / "checkpoints" / "last.ckpt").is_file()
            results, status = None, "unfinished" + (" (resumable: last.ckpt)" if resumable else "")
        try:
            config = yaml.load(layout.latest_config(path).read_text(), Loader=SAFE_LOADER) or {}
        except (OSError, yaml.YAMLError):
            config = {}
        config = flatten(config) if isinstance(config, dict) else {}
        out.append(Run(path, path.parent.name, results, config, status))
    return out


def group_runs(finished: list[Run], by: list[str] | None) -> dict[str, list[Run]]:
    """Groups of finished runs, labelled; by ``by`` keys, else by config minus :data:`IGNORED` keys."""
    groups: dict[tuple, list[Run]] = {}
    if by:
        for run in finished:
            groups.setdefault(tuple((k, _hashable(run.value(k))) for k in by), []).append(run)
        return {", ".join(f"{k}={fmt(v)}" for k, v in key): members for key, members in groups.items()}
    for run in finished:
        kept = tuple(sorted((k, _hashable(v)) for k, v in run.config.items() if not k.startswith(IGNORED)))
        groups.setdefault((run.experiment, kept), []).append(run)
    # label: the experiment, plus the config values that tell its groups apart
    labelled: dict[str, list[Run]] = {}
    for (exp, kept), members in groups.items():
        siblings = [dict(k) for (e, k) in groups if e == exp]
        mine = dict(kept)
        keys = sorted({k for s in siblings for k in set(s) | set(mine) if s.get(k) != mine.get(k)})
        label = exp + (" [" + ", ".join(f"{k}={fmt(mine.get(k))}" for k in keys) + "]" if keys else "")
        labelled[label] = members
    return labelled


def group_identity(members: list[Run], by: list[str] | None) -> dict[str, Any]:
    """What a group's runs share and :func:`group_runs` grouped them by: the ``by`` keys' values, else the
    experiment and the config minus :data:`IGNORED` keys."""
    run = members[0]
    if by:
        return {k: run.value(k) for k in by}
    return {"experiment": run.experiment} | {k: v for k, v in run.config.items() if not k.startswith(IGNORED)}


def _hashable(v: Any) -> Any:
    return tuple(map(_hashable, v)) if isinstance(v, list) else v


def fmt(value: Any) -> str:
    """A table cell: ``-`` for None; floats with 4 decimals, 4 significant digits below 0.001 (learning rates),
    thousands separators from 100 on."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.4g}" if abs(value) < 1e-3 and value else f"{value:.4f}"
    return str(value)


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof=1) of ``values``; None where undefined (no values; n < 2)."""
    return (statistics.fmean(values) if values else None), (statistics.stdev(values) if len(values) > 1 else None)


def stats_of(members: list[Run], metrics: list[str]) -> dict[str, Any]:
    """``{metric: {mean, std, n}}`` over the runs holding a number for it (std None for n < 2)."""
    out: dict[str, Any] = {"runs": len(members), "paths": [str(r.path) for r in members]}
    for m in metrics:
        values = [float(v) for r in members if isinstance(v := r.value(m), int | float) and not isinstance(v, bool)]
        mean, std = mean_std(values)
        out[m] = {"mean": mean, "std": std, "n": len(values)}
    return out


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
    lines = ["| run | group | status | seed | " + " | ".join(metrics) + " |",
             "|---|---|---|---:|" + "---:|" * len(metrics)]  # fmt: skip
    run_rows = []
    for run in all_runs:
        name = f"{run.experiment}/{run.path.name}"
        seed = run.value("seed") if run.results else run.config.get("seed_everything")
        cells = [run.value(m) if run.results else None for m in metrics]
        lines.append(f"| {name} | {group_of.get(run.path, '-')} | {run.status} | {fmt(seed)} | "
                     + " | ".join(map(fmt, cells)) + " |")  # fmt: skip
        run_rows.append({"run": str(run.path), "group": group_of.get(run.path, ""), "status": run.status,
                         "seed": seed, **dict(zip(metrics, cells))})  # fmt: skip
    lines += ["", "| group | n | " + " | ".join(f"{m} (mean ± std)" for m in metrics) + " |",
              "|---|---:|" + "---:|" * len(metrics)]  # fmt: skip
    short = short_labels(groups, by)
    group_stats = {
        label: stats_of(members, metrics) | {"short_label": short[label]} for label, members in groups.items()
    }
    for label, st in group_stats.items():
        cells = ["-" if st[m]["mean"] is None else f"{fmt(st[m]['mean'])} ± {fmt(st[m]['std'])}" for m in metrics]
        lines.append(f"| {label} | {st['runs']} | " + " | ".join(cells) + " |")
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
