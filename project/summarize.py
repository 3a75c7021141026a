"""``python -m project.summarize [FOLDER...] [--by KEY...] [--x KEY] [--format md|csv] [--out DIR]``.

One table across run folders (default: everything under ``logs``):

* **runs**: every run folder (``<experiment>/version_N``) with its seed, epochs and metrics from
  ``results.json``; a folder without one is listed as ``unfinished`` (resumable when it holds
  ``checkpoints/last.ckpt``), never dropped;
* **groups**: runs whose configs differ only in the seed and the K-fold ``data.fold`` (and in paths, logger and
  loader settings that do not change results) form one group, shown with n and the mean ± sample standard
  deviation (``ddof=1``) of each metric: over seeds, over folds, or both. ``--by KEY...`` groups by those keys
  instead. K-fold runs get a ``fold`` column, and ``summary.csv`` each group's value fold by fold
  (``<metric>_fold<k>``: the mean over seeds where a fold ran with several).

A KEY is a ``results.json`` key (``precision``, ``sparsity``...), ``experiment``, or a config key written
dotted without ``init_args`` (``model.optimizer.lr``, ``data.batch_size``, ``trainer.callbacks.Pruning.amount``);
any unambiguous ending of one works too (``lr``, ``amount``).

Writes into ``--out`` (default: the first FOLDER): ``summary.md``, ``summary.csv`` (groups),
``summary-runs.csv``, ``summary.json``, and PNG plots: ``val_acc.png`` (validation accuracy against step
from each run's ``metrics.csv``, or its TensorBoard event files when it has none, coloured by group; the legend,
below the plot, names each group by the keys that tell the groups apart, in at most 60 characters) and
``test_acc_vs_<KEY>.png`` (test accuracy of every run and each group's mean ± std against ``--x KEY``, default
the first ``--by`` key).
Reads only ``results.json``, YAML configs (safe loader), ``metrics.csv`` and event files, as data
(:mod:`project.runs.read`: regular files only, sizes checked first, bounded parsers): nothing in a run folder runs
code, and a run whose files cannot be read is left out with one ``warning:`` line on stderr (its curve only, when
just its ``metrics.csv`` or event files are bad). Every file is written atomically, never through a link
(:mod:`project.runs.files`).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from project.errors import ArgumentParser, ConfigError
from project.runs import files, layout
from project.summary.plots import plot
from project.summary.tables import DEFAULT_METRICS, collect, groups_csv, runs_csv, summarize


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 nothing to summarize or a bad argument)."""
    p = ArgumentParser(
        prog="python -m project.summarize",
        description=__doc__.splitlines()[0],
        epilog=(
            "KEY: a results.json key, 'experiment', or a dotted config key (any unambiguous ending: lr, amount); "
            "lr is OneCycleLR's max_lr in runs it schedules, as it sets their rate."
        ),
    )
    p.add_argument("roots", nargs="*", default=["logs"], metavar="FOLDER", help="logs folders or run folders")
    p.add_argument(
        "--by", nargs="+", metavar="KEY", help="group by these keys (default: same config but the seed and fold)"
    )
    p.add_argument("--x", metavar="KEY", help="plot test accuracy against this key (default: the first --by key)")
    p.add_argument("--metrics", nargs="+", default=DEFAULT_METRICS, help="results.json keys to tabulate")
    p.add_argument("--format", choices=["md", "csv"], default="md", help="what to print (both are written)")
    p.add_argument("--out", metavar="DIR", help="folder for summary.* and plots (default: the first FOLDER)")
    p.add_argument("--no_plots", action="store_true", help="skip the PNG plots")
    ns = p.parse_args(argv)
    roots = [Path(r).expanduser() for r in ns.roots]
    try:
        found = collect(roots)
        table, stats = summarize(roots, ns.metrics, ns.by, found)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    first = roots[0] if layout.version_of(roots[0]) is None else roots[0].parent
    out = Path(ns.out).expanduser() if ns.out else first
    out.mkdir(parents=True, exist_ok=True)
    files.write_text(out / "summary.md", table)
    files.write_text(out / "summary.csv", groups_csv(stats, ns.metrics))
    files.write_text(out / "summary-runs.csv", runs_csv(stats))
    files.write_json(out / "summary.json", _finite(stats))
    written = []
    if not ns.no_plots:
        written = plot(stats, found, out, ns.x or (ns.by[0] if ns.by else None))
    print(table if ns.format == "md" else groups_csv(stats, ns.metrics), end="")
    print(
        f"-> {out / 'summary.md'}, summary.csv, summary-runs.csv, summary.json"
        + "".join(f", {w.name}" for w in written),
        file=sys.stderr,
    )
    return 0


def _finite(tree: Any) -> Any:
    """JSON-safe copy: NaN/inf become None; a value JSON has no type for (a date or a set from a YAML config) its
    ``str``."""
    if isinstance(tree, dict):
        return {k if isinstance(k, str | int | float | bool | None) else str(k): _finite(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return [_finite(v) for v in tree]
    if isinstance(tree, float):
        return tree if math.isfinite(tree) else None
    return tree if isinstance(tree, str | int | bool | None) else str(tree)


if __name__ == "__main__":
    sys.exit(main())
