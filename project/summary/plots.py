"""The figures of ``python -m project.summarize`` and of a sweep's report: short group labels for legends,
validation curves per group (``val_acc.png``) and a metric against a setting with mean ± std per value.

Labels name only what differs between groups (``lr=0.01``, ``StepLR``), at most :data:`LABEL_CHARS` characters;
the full label is in ``summary.md``/``summary.csv``. Legends sit below the axes, at most :data:`LEGEND_ENTRIES`
groups named. Plots are drawn with matplotlib's ``Agg`` backend (no display needed) and written through
:func:`project.runs.files.write_bytes` (atomically, never through a link). A run whose curve cannot be read
(:func:`val_curves`) is left out of ``val_acc.png`` with one warning line.
"""

from __future__ import annotations

import io
import logging
import math
import os
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from project.errors import UnreadableFile
from project.runs import files, layout, read
from project.summary.labels import abbreviate

if TYPE_CHECKING:
    from project.summary.collect import Run


LEGEND_ENTRIES = 20  # groups named in a plot's legend; the others are counted in a last entry


def val_curves(run: Path, tag: str = "val/acc") -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``tag`` per epoch, from the run's ``metrics.csv`` (see
    :class:`project.report.EpochMetrics`); a run without one (written before it existed) from its TensorBoard
    event files, each checked first to be a regular file of at most :data:`project.runs.read.EVENTS_BYTES`
    (256 MiB). Empty when neither has the tag.

    Raises:
        UnreadableFile: ``metrics.csv`` is there but cannot be read (not a regular file, over 16 MiB, a cell over
            128 KiB...), or an event file is not a regular file or is too large.
    """
    if os.path.lexists(run / layout.METRICS_CSV):
        rows = [r for r in layout.read_epoch_metrics(run, strict=True) if tag in r]
        return [int(r["step"]) for r in rows], [r[tag] for r in rows]
    try:
        names = os.listdir(run)
    except OSError:
        return [], []
    for name in names:  # the files TensorBoard's loader opens (io_wrapper.IsSummaryEventsFile)
        if "tfevents" in name and not name.endswith(".profile-empty"):
            read.check_file(run / name, read.EVENTS_BYTES, "an event file")
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
    written = [_plot_val_curves(stats["groups"], out / "val_acc.png")]
    x_keys = [x_key] if isinstance(x_key, str) else x_key or []
    for x_key in x_keys:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in x_key)
        written.append(_plot_against(all_runs, x_key, y_key, out / name.format(y=y_key, x=safe)))
    return written


def _plot_val_curves(groups: dict[str, Any], path: Path) -> Path:
    """Write the validation accuracy curves of ``groups`` (label -> stats with ``paths``, ``runs`` and
    ``short_label``), one color per group, to ``path`` (``val_acc.png``); returns ``path``.

    The legend sits below the axes (constrained layout keeps it outside them), one or two columns, at most
    :data:`LEGEND_ENTRIES` groups named and the others counted; the figure grows with its rows, so the axes keep
    their size whatever the number of groups."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    named = min(len(groups), LEGEND_ENTRIES) + (len(groups) > LEGEND_ENTRIES)
    ncols = 1 if named <= 6 else 2
    rows = -(-named // ncols)
    fig, ax = plt.subplots(figsize=(7 if ncols == 1 else 9, 4.2 + 0.2 * rows), dpi=120, layout="constrained")
    for i, (label, st) in enumerate(groups.items()):
        xs, ys = _group_curve(st["paths"])
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
    written = save(fig, path)
    plt.close(fig)
    return written


def _group_curve(paths: list[str]) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of the validation accuracy of a group's runs (:func:`val_curves`) as one line broken by
    NaN between runs: one artist per group, not per run (1,000 runs drew in seconds, most of it matplotlib's
    bookkeeping per line). A run whose curve cannot be read is left out with one warning line."""
    from project.summary.collect import warn

    xs: list[float] = []
    ys: list[float] = []
    for path in paths:
        try:
            steps, values = val_curves(Path(path))
        except UnreadableFile as e:
            warn(f"left the curve of run {path} out of val_acc.png: {e}")
            continue
        if steps:
            xs += [*steps, math.nan]
            ys += [*values, math.nan]
    return xs, ys


def _plot_against(all_runs: list[Run], x_key: str, y_key: str, path: Path) -> Path:
    """Write ``y_key`` against ``x_key`` over the finished runs with a finite ``y_key`` to ``path``: each run a
    point, mean ± sample std per value of ``x_key`` (numbers on a linear axis, a log axis when they span more
    than 50x, anything else as sorted categories); returns ``path``."""
    import matplotlib.pyplot as plt

    from project.summary.collect import fmt, number

    finished = [r for r in all_runs if r.results is not None and number(r.value(y_key)) is not None]
    ys = [number(r.value(y_key)) or 0.0 for r in finished]  # each a finite number (the filter above)
    xs = [r.value(x_key) for r in finished]
    numeric = all(number(x) is not None for x in xs)
    cats = sorted({fmt(x) for x in xs}) if not numeric else []
    pos = [(number(x) or 0.0) if numeric else cats.index(fmt(x)) for x in xs]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.scatter(pos, ys, s=14, alpha=0.6, label="runs")
    by_x: dict[float, list[float]] = {}
    for p, y in zip(pos, ys):
        by_x.setdefault(p, []).append(y)
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
    fig.tight_layout()
    written = save(fig, path)
    plt.close(fig)
    return written


def save(fig: Any, path: Path) -> Path:
    """Write ``fig`` as PNG to ``path`` through :func:`project.runs.files.write_bytes` (a new file renamed over
    ``path``: a link planted there is replaced, never followed); returns ``path``."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return files.write_bytes(path, buffer.getvalue())
