"""The figures of ``python -m project.summarize`` and of a sweep's report: short group labels for legends,
validation curves per group (``val_acc.png``) and a metric against a setting with mean ± std per value.

Labels name only what differs between groups (``lr=0.01``, ``StepLR``), at most :data:`LABEL_CHARS` characters;
the full label is in ``summary.md``/``summary.csv``. Legends sit below the axes, at most :data:`LEGEND_ENTRIES`
groups named. Plots are drawn with matplotlib's ``Agg`` backend (no display needed).
"""

from __future__ import annotations

import logging
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from project.runs import layout
from project.summary.labels import abbreviate

if TYPE_CHECKING:
    from project.summary.collect import Run


LEGEND_ENTRIES = 20  # groups named in a plot's legend; the others are counted in a last entry


def val_curves(run: Path, tag: str = "val/acc") -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``tag`` per epoch, from the run's ``metrics.csv`` (see
    :class:`project.report.EpochMetrics`); a run without one (written before it existed) from its TensorBoard
    event files. Empty when neither has the tag."""
    if (run / layout.METRICS_CSV).is_file():
        rows = [r for r in layout.read_epoch_metrics(run) if tag in r]
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

    from project.summary.collect import fmt

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
            legend = f"{st.get('short_label', label)} (n={st['runs']})" if i < LEGEND_ENTRIES else None
            ax.plot(xs, ys, color=colors[i % len(colors)], alpha=0.8, lw=1.2, label=legend)
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
