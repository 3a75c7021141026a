"""Run folders read as data for summaries: :func:`collect` finds every run under some folders (its ``results.json``
and config, read through :mod:`project.runs.read`: bounded, YAML's safe loader; a run whose files cannot be read is
skipped with one warning line), :func:`group_runs` groups runs that differ only in the seed and the K-fold
``fold`` (or by given keys), :func:`stats_of` gives each group's n and mean ± sample std (``ddof=1``) over its finite
values, and :func:`per_fold` a group's values fold by fold."""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from project.errors import ConfigError, UnreadableFile
from project.runs import layout, read

# Config keys that do not change what a run computes: paths, logging, loader plumbing; and the axes a group is taken
# over: the seed and the K-fold fold (a key and everything under it: "data.fold" is not "data.folds").
IGNORED = (
    "seed_everything",
    "data.seed",
    "data.fold",
    "trainer.logger",
    "data.data_dir",
    "data.source_dir",
    "data.download",
    "data.num_workers",
    "data.pin_memory",
    "data.persistent_workers",
    "ckpt_path",
    "trust_checkpoint",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "checkpoint.dirpath",
    "trainer.default_root_dir",
    *layout.RUN_CALLBACK_KEYS,
)


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
        resolved = resolve_key(key, self.config)
        return self.config.get(ruling_key(resolved, self.config) if key == "lr" else resolved)


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


def ruling_key(key: str, config: dict[str, Any]) -> str:
    """The key whose value the run trained with in place of ``key`` (asked for by the short name ``lr``; a full key
    is taken as written): ``model.lr_scheduler.max_lr`` for the optimizer's ``lr`` under ``OneCycleLR``, which
    sets every step's rate from ``max_lr`` (the project refuses an optimizer ``lr`` that differs:
    :func:`project.cli.checks.check_scheduler_shadows`); else ``key``."""
    scheduler = str(config.get("model.lr_scheduler", ""))
    if key == "model.optimizer.lr" and scheduler.endswith(".OneCycleLR") and "model.lr_scheduler.max_lr" in config:
        return "model.lr_scheduler.max_lr"
    return key


def warn(message: str) -> None:
    """One ``warning:`` line on stderr (control characters escaped: a folder's name never breaks it)."""
    print(f"warning: {read.printable(message)}", file=sys.stderr)


def collect(roots: list[Path], report: Callable[[str], None] = warn) -> list[Run]:
    """Every run folder under ``roots`` (a run folder counts as itself), with results and flattened config.

    A run whose ``results.json`` or config is there but cannot be read as data (not a regular file, too large, not
    UTF-8, not valid or too deep JSON/YAML: :class:`~project.errors.UnreadableFile`) is left out, with one line
    to ``report`` (default :func:`warn`) naming the run and the problem.

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
            out.append(read_run(path))
        except UnreadableFile as e:
            report(f"skipped run {path}: {e}")
    return out


def read_run(path: Path) -> Run:
    """One run folder as a :class:`Run`: ``results.json`` (``unfinished`` without one) and its latest config,
    flattened (``{}`` without one).

    Raises:
        UnreadableFile: ``results.json`` or the config is there but cannot be read as data.
    """
    try:
        results, status = layout.read_results(path), "finished"
    except UnreadableFile:
        raise
    except ConfigError:
        resumable = (path / layout.CHECKPOINTS / layout.LAST_CKPT).is_file()
        results, status = None, "unfinished" + (f" (resumable: {layout.LAST_CKPT})" if resumable else "")
    config = layout.read_latest_config(path)
    config = flatten(config) if isinstance(config, dict) else {}
    return Run(path, path.parent.name, results, config, status)


def ignored(key: str) -> bool:
    """Whether a flattened config key is one of :data:`IGNORED` or lies under one."""
    return any(key == k or key.startswith(k + ".") for k in IGNORED)


def group_runs(finished: list[Run], by: list[str] | None) -> dict[str, list[Run]]:
    """Groups of finished runs, labelled; by ``by`` keys, else by config minus :data:`IGNORED` keys."""
    groups: dict[tuple, list[Run]] = {}
    if by:
        for run in finished:
            groups.setdefault(tuple((k, _hashable(run.value(k))) for k in by), []).append(run)
        return {", ".join(f"{k}={fmt(v)}" for k, v in key): members for key, members in groups.items()}
    for run in finished:
        kept = tuple(sorted((k, _hashable(v)) for k, v in run.config.items() if not ignored(k)))
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
    return {"experiment": run.experiment} | {k: v for k, v in run.config.items() if not ignored(k)}


def _hashable(v: Any) -> Any:
    """``v`` as a dict key: lists as tuples; anything else unhashable (a mapping, a set) by its ``repr``."""
    if isinstance(v, list):
        return tuple(map(_hashable, v))
    try:
        hash(v)
    except TypeError:
        return repr(v)
    return v


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


def number(value: Any) -> float | None:
    """``value`` as a finite float; ``None`` for anything else (a bool, a string, NaN, ±inf, an int beyond floats)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def stats_of(members: list[Run], metrics: list[str]) -> dict[str, Any]:
    """``{metric: {mean, std, n}}`` over the runs holding a finite number for it (std None for n < 2)."""
    out: dict[str, Any] = {"runs": len(members), "paths": [str(r.path) for r in members]}
    for m in metrics:
        values = [v for r in members if (v := number(r.value(m))) is not None]
        mean, std = mean_std(values)
        out[m] = {"mean": mean, "std": std, "n": len(values)}
    return out


def fold_of(run: Run) -> int | None:
    """A K-fold run's validation fold (``results.json``'s ``fold``, else its config's ``data.fold`` when it has
    ``data.folds``); ``None`` for a run without folds."""
    fold = run.value("fold")
    if run.results is None or "fold" not in run.results:
        fold = fold if run.config.get("data.folds") is not None else None
    return fold if isinstance(fold, int) and not isinstance(fold, bool) else None


def per_fold(members: list[Run], metrics: list[str]) -> dict[int, dict[str, Any]]:
    """``{fold: {metric: mean, "n": runs}}``: a group's values fold by fold (the mean over its seeds where a fold ran
    with several), for the groups of K-fold runs; ``{}`` when no member has a fold."""
    by_fold: dict[int, list[Run]] = {}
    for run in members:
        if (fold := fold_of(run)) is not None:
            by_fold.setdefault(fold, []).append(run)
    out: dict[int, dict[str, Any]] = {}
    for fold, runs in sorted(by_fold.items()):
        out[fold] = {"n": len(runs)}
        for m in metrics:
            out[fold][m] = mean_std([v for r in runs if (v := number(r.value(m))) is not None])[0]
    return out
