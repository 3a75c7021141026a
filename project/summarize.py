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
import logging
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from project import runs
from project.errors import ArgumentParser, ConfigError

# yaml's safe loader, in C where libyaml is there (the pure-Python one took ~10 ms of a run's 45)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
DEFAULT_METRICS = ["test_acc", "best_val_acc", "train_samples_per_s", "sparsity", "epochs"]
# Config keys that do not change what a run computes: paths, logging, loader plumbing, the seed.
IGNORED = ("seed_everything", "data.seed", "trainer.logger", "data.data_dir", "data.source_dir", "data.download",
           "data.num_workers", "data.pin_memory", "data.persistent_workers", "ckpt_path", "trust_checkpoint",
           "trainer.enable_progress_bar", "trainer.enable_model_summary", "checkpoint.dirpath",
           "trainer.default_root_dir")  # fmt: skip
LABEL_CHARS = 60  # a group's short label (plot legends): at most this many characters
VALUE_CHARS = 20  # one value in a short label
LEGEND_ENTRIES = 20  # groups named in a plot's legend; the others are counted in a last entry
CLASS_PATH = re.compile(r"(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)")


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
        candidates = [root] if runs.version_of(root) is not None else sorted(root.rglob("version_*"))
        for run in candidates:
            if run.is_dir() and runs.version_of(run) is not None:
                found[run] = None
    out = []
    for path in found:
        try:
            results, status = runs.read_results(path), "finished"
        except ConfigError:
            resumable = (path / "checkpoints" / "last.ckpt").is_file()
            results, status = None, "unfinished" + (" (resumable: last.ckpt)" if resumable else "")
        try:
            config = yaml.load(runs.latest_config(path).read_text(), Loader=SAFE_LOADER) or {}
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


def short_key(key: str, keys: set[str]) -> str:
    """The shortest dotted ending of ``key`` that names no other of ``keys`` (``lr`` for ``model.optimizer.lr``),
    as ``--by`` accepts it."""
    parts = key.split(".")
    for i in range(len(parts) - 1, -1, -1):
        end = ".".join(parts[i:])
        if sum(k == end or k.endswith("." + end) for k in keys) == 1:
            return end
    return key


def abbreviate(value: Any, width: int = VALUE_CHARS) -> str:
    """A value for a short label: a class path by its class name, a list item by item, cut to ``width``
    characters (``…`` marks the cut)."""
    if isinstance(value, list | tuple):
        text = "[" + ",".join(abbreviate(v, width) for v in value) + "]"
    elif isinstance(value, str) and (m := CLASS_PATH.fullmatch(value)):
        text = m.group(1)
    else:
        text = fmt(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def fit_parts(parts: list[str], limit: int) -> str:
    """``parts`` joined by ``", "``, as many as fit in ``limit`` characters, then ``+N more`` for the rest."""
    for shown in range(len(parts), 0, -1):
        more = f", +{len(parts) - shown} more" if shown < len(parts) else ""
        text = ", ".join(parts[:shown])
        if len(text) + len(more) <= limit:
            return text + more
    more = f", +{len(parts) - 1} more" if len(parts) > 1 else ""
    return parts[0][: limit - len(more) - 1] + "…" + more


def short_labels(groups: dict[str, list[Run]], by: list[str] | None = None, limit: int = LABEL_CHARS) -> dict[str, str]:
    """``{label: short label}`` for plot legends: only the keys whose values differ between the groups, each named
    by its shortest ending (:func:`short_key`) with its value abbreviated (:func:`abbreviate`); the experiment by
    its name. At most ``limit`` characters: keys that do not fit are counted (``+3 more``); the full list is the
    group's label in ``summary.md``/``summary.csv``. Groups whose short labels would be equal are numbered."""
    ids = {label: group_identity(members, by) for label, members in groups.items()}
    keys = {k for ident in ids.values() for k in ident}
    differ = sorted(k for k in keys if len({repr(_hashable(i.get(k))) for i in ids.values()}) > 1)
    differ.sort(key=lambda k: k != "experiment")  # the experiment first
    out: dict[str, str] = {}
    for label, ident in ids.items():
        parts = [abbreviate(ident.get(k)) if k == "experiment" else f"{short_key(k, keys)}={abbreviate(ident.get(k))}"
                 for k in differ] or [abbreviate(ident.get("experiment", label), limit)]  # fmt: skip
        out[label] = fit_parts(parts, limit)
    seen: dict[str, int] = {}
    for text in out.values():
        seen[text] = seen.get(text, 0) + 1
    for n, (label, text) in enumerate(out.items(), 1):
        if seen[text] > 1:
            tag = f" #{n}"
            out[label] = text[: limit - len(tag)] + tag
    return out


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


def val_curves(run: Path, tag: str = "val/acc") -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``tag`` per epoch, from the run's ``metrics.csv`` (see
    :class:`project.report.EpochMetrics`); a run without one (written before it existed) from its TensorBoard
    event files. Empty when neither has the tag."""
    if (run / runs.METRICS_CSV).is_file():
        rows = [r for r in runs.read_epoch_metrics(run) if tag in r]
        return [int(r["step"]) for r in rows], [r[tag] for r in rows]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    # TensorBoard's reader warns about what a curve does not use: a run written before the graph was logged once
    # per run holds two graphs ("Found more than one graph event per run"); its warnings are off for this read
    reader_log = logging.getLogger("tensorboard")
    level = reader_log.level
    reader_log.setLevel(logging.ERROR)
    try:
        acc.Reload()
        events = acc.Scalars(tag)
    except (KeyError, OSError, ValueError):
        return [], []
    finally:
        reader_log.setLevel(level)
    return [e.step for e in events], [e.value for e in events]


def plot(
    stats: dict[str, Any],
    all_runs: list[Run],
    out: Path,
    x_key: str | list[str] | None,
    y_key: str = "test_acc",
    name: str = "{y}_vs_{x}.png",
) -> list[Path]:
    """Write ``val_acc.png`` and, for each ``x_key`` (one or a list), ``y_key`` against it (default
    ``test_acc_vs_<x_key>.png``; ``name`` formats ``{y}`` and ``{x}``) into ``out``; return the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    written = []
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    groups = stats["groups"]
    # the legend below the axes (constrained layout keeps it outside them), one or two columns; the figure grows
    # with its rows, so the axes keep their size whatever the number of groups
    named = min(len(groups), LEGEND_ENTRIES) + (len(groups) > LEGEND_ENTRIES)
    ncols = 1 if named <= 6 else 2
    rows = -(-named // ncols)
    fig, ax = plt.subplots(figsize=(7 if ncols == 1 else 9, 4.2 + 0.2 * rows), dpi=120, layout="constrained")
    for i, (label, st) in enumerate(groups.items()):
        # A group's runs as one line broken by NaN between runs: one artist per group, not per run (1,000 runs
        # drew in seconds, most of it matplotlib's bookkeeping per line)
        xs: list[float] = []
        ys: list[float] = []
        for path in st["paths"]:
            steps, values = val_curves(Path(path))
            if steps:
                xs += [*steps, math.nan]
                ys += [*values, math.nan]
        if xs:
            name = f"{st.get('short_label', label)} (n={st['runs']})" if i < LEGEND_ENTRIES else None
            ax.plot(xs, ys, color=colors[i % len(colors)], alpha=0.8, lw=1.2, label=name)
    ax.set(xlabel="training step", ylabel="val/acc", title="Validation accuracy by group")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if len(groups) > LEGEND_ENTRIES:
        handles.append(Line2D([], [], linestyle="none"))
        labels.append(f"... {len(groups) - LEGEND_ENTRIES} more groups (summary.md)")
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=7, frameon=False)
    written.append(out / "val_acc.png")
    fig.savefig(written[-1])
    plt.close(fig)
    x_keys = [x_key] if isinstance(x_key, str) else x_key or []
    for x_key in x_keys:
        finished = [r for r in all_runs if r.results is not None and isinstance(r.value(y_key), int | float)]
        xs = [r.value(x_key) for r in finished]
        numeric = all(isinstance(x, int | float) and not isinstance(x, bool) for x in xs)
        cats = sorted({fmt(x) for x in xs}) if not numeric else []
        pos = [float(x) if numeric else cats.index(fmt(x)) for x in xs]
        fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
        ax.scatter(pos, [r.value(y_key) for r in finished], s=14, alpha=0.6, label="runs")
        by_x: dict[float, list[float]] = {}
        for p, r in zip(pos, finished):
            by_x.setdefault(p, []).append(float(r.value(y_key)))
        px = sorted(by_x)
        means = [statistics.fmean(by_x[p]) for p in px]
        stds = [statistics.stdev(by_x[p]) if len(by_x[p]) > 1 else 0.0 for p in px]
        ax.errorbar(px, means, yerr=stds, color="black", capsize=3, lw=1.2, label="mean ± std")
        if not numeric:
            ax.set_xticks(range(len(cats)), [abbreviate(c) for c in cats], rotation=20, fontsize=8)
        elif len(px) > 2 and min(px) > 0 and max(px) / min(px) > 50:
            ax.set_xscale("log")  # a learning rate swept over decades
        ax.set(xlabel=x_key, ylabel=y_key, title=f"{'Test accuracy' if y_key == 'test_acc' else y_key} against {x_key}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in x_key)
        written.append(out / name.format(y=y_key, x=safe))
        fig.tight_layout()
        fig.savefig(written[-1])
        plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 nothing to summarize or a bad argument)."""
    p = ArgumentParser(prog="python -m project.summarize", description=__doc__.splitlines()[0],
                                epilog="KEY: a results.json key, 'experiment', or a dotted config key (any "
                                       "unambiguous ending: lr, amount).")  # fmt: skip
    p.add_argument("roots", nargs="*", default=["logs"], metavar="FOLDER", help="logs folders or run folders")
    p.add_argument("--by", nargs="+", metavar="KEY", help="group by these keys (default: same config but the seed)")
    p.add_argument("--x", metavar="KEY", help="plot test accuracy against this key (default: the first --by key)")
    p.add_argument("--metrics", nargs="+", default=DEFAULT_METRICS, help="results.json keys to tabulate")
    p.add_argument("--format", choices=["md", "csv"], default="md", help="what to print (both are written)")
    p.add_argument("--out", metavar="DIR", help="folder for summary.* and plots (default: the first FOLDER)")
    p.add_argument("--no_plots", action="store_true", help="skip the PNG plots")
    ns = p.parse_args(argv)
    roots = [Path(r) for r in ns.roots]
    try:
        found = collect(roots)
        table, stats = summarize(roots, ns.metrics, ns.by, found)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(ns.out) if ns.out else (roots[0] if runs.version_of(roots[0]) is None else roots[0].parent)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(table)
    (out / "summary.csv").write_text(groups_csv(stats, ns.metrics))
    (out / "summary-runs.csv").write_text(runs_csv(stats))
    runs.write_json(out / "summary.json", _finite(stats))
    written = []
    if not ns.no_plots:
        written = plot(stats, found, out, ns.x or (ns.by[0] if ns.by else None))
    print(table if ns.format == "md" else groups_csv(stats, ns.metrics), end="")
    print(f"-> {out / 'summary.md'}, summary.csv, summary-runs.csv, summary.json"
          + "".join(f", {w.name}" for w in written), file=sys.stderr)  # fmt: skip
    return 0


def _finite(tree: Any) -> Any:
    """JSON-safe copy: NaN/inf become None."""
    if isinstance(tree, dict):
        return {k: _finite(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_finite(v) for v in tree]
    return None if isinstance(tree, float) and not math.isfinite(tree) else tree


if __name__ == "__main__":
    sys.exit(main())
