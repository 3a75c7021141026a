"""A sweep's report: the trials, the points (mean ± std over seeds), the best point, and plots.

Written by ``python -m project.sweep`` at the end of a sweep and by ``--report`` at any time, into the
sweep folder: ``report.md``, ``report.json``, ``objective-<key>.png`` per swept key and, when the runs
prune weights, ``accuracy-vs-sparsity.png`` (test accuracy against the measured sparsity, the dense points'
mean as a line). Values come from the study (trial states) and each run's ``results.json``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import optuna

from project import runs
from project.summarize import fmt, mean_std


def _num(value: Any) -> str:
    """Metrics, their std and sparsity: 4 decimals."""
    return f"{value:.4f}" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def collect(study: optuna.Study, keys: list[str]) -> list[dict[str, Any]]:
    """One row per trial that ran (surplus trials, which ran nothing, are left out)."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("surplus") or t.state == optuna.trial.TrialState.WAITING:
            continue
        run = Path(t.user_attrs["run"]) if "run" in t.user_attrs else None
        results: dict[str, Any] = {}
        if run is not None and (run / runs.RESULTS).is_file():
            results = runs.read_results(run)
        rows.append(
            {
                "trial": t.number,
                "state": t.state.name.lower(),
                "run": str(run) if run else None,
                "params": {k: t.params.get(k) for k in keys},
                "seed": t.params.get("seed"),
                "value": t.value,
                "retry_of": t.system_attrs.get("failed_trial"),
                "results": results,
            }
        )
    return rows


def report(study: optuna.Study, sweep: Any, folder: Path, echo: bool = False) -> dict[str, Any]:
    """Write ``report.md``, ``report.json`` and the plots into ``folder``; returns the report as a dict."""
    keys = [p.key for p in sweep.space]
    metric = sweep.metric
    rows = collect(study, keys)
    lines = [
        f"Sweep `{sweep.name}`: {metric} ({sweep.direction}), {len(rows)} trials",
        "",
        "| trial | state | run | " + " | ".join(keys) + f" | seed | {metric} | sparsity | epochs |",
        "|---:|---|---|" + "---|" * len(keys) + "---:|---:|---:|---:|",
    ]
    for r in rows:
        res = r["results"]
        state = r["state"] + (f" (retry of {r['retry_of']})" if r["retry_of"] is not None else "")
        lines.append(
            f"| {r['trial']} | {state} | {Path(r['run']).name if r['run'] else '-'} | "
            + " | ".join(fmt(r["params"][k]) for k in keys)
            + f" | {r['seed']} | {_num(res.get(metric))} | {_num(res.get('sparsity'))} | {fmt(res.get('epochs'))} |"
        )
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        if r["state"] == "complete":
            groups.setdefault(tuple(r["params"][k] for k in keys), []).append(r)
    points = []
    for values, members in groups.items():
        mean, std = mean_std([float(m["results"][metric]) for m in members if metric in m["results"]])
        sp, _ = mean_std([float(m["results"]["sparsity"]) for m in members if "sparsity" in m["results"]])
        points.append(
            {
                "params": dict(zip(keys, values)),
                "n": len(members),
                "mean": mean,
                "std": std,
                "sparsity": sp,
                "seeds": sorted(m["seed"] for m in members),
            }
        )
    points.sort(key=lambda p: tuple(str(v) if not isinstance(v, int | float) else v for v in p["params"].values()))
    lines += [
        "",
        "| " + " | ".join(keys) + f" | runs | {metric} (mean ± std) | sparsity |",
        "|" + "---|" * len(keys) + "---:|---:|---:|",
    ]
    for p in points:
        std = _num(p["std"]) if p["std"] is not None else "-"
        lines.append(
            "| "
            + " | ".join(fmt(v) for v in p["params"].values())
            + f" | {p['n']} | {_num(p['mean'])} ± {std} | {_num(p['sparsity'])} |"
        )
    scored = [p for p in points if p["mean"] is not None]
    best = None
    if scored:
        best = (max if sweep.direction == "maximize" else min)(scored, key=lambda p: p["mean"])
        lines += [
            "",
            f"Best point: {', '.join(f'{k}={fmt(v)}' for k, v in best['params'].items())}: {metric} "
            f"{_num(best['mean'])} ± {_num(best['std'])} over {best['n']} seed(s)",
        ]
    out = {
        "sweep": sweep.name,
        "metric": metric,
        "direction": sweep.direction,
        "trials": rows,
        "points": points,
        "best": best,
        "plots": plot(rows, points, keys, metric, folder),
    }
    text = "\n".join(lines) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.md").write_text(text)
    runs.write_json(folder / "report.json", out)
    if echo:
        print(text, end="")
    return out


def plot(
    rows: list[dict[str, Any]], points: list[dict[str, Any]], keys: list[str], metric: str, folder: Path
) -> list[str]:
    """The objective against each swept key (trials as dots, point means ± std as bars) and, when weights
    were pruned, test accuracy against sparsity with the dense baseline; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["state"] == "complete" and metric in r["results"]]
    if not done:
        return []
    written = []
    for key in keys:
        values = sorted({r["params"][key] for r in done}, key=lambda v: (isinstance(v, str), v))
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        where = {v: (v if numeric else i) for i, v in enumerate(values)}
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.scatter(
            [where[r["params"][key]] for r in done],
            [r["results"][metric] for r in done],
            s=12,
            alpha=0.5,
            label="trials",
        )
        by: dict[Any, list[float]] = {}
        for r in done:
            by.setdefault(r["params"][key], []).append(float(r["results"][metric]))
        xs = [where[v] for v in values]
        stats = [mean_std(by[v]) for v in values]
        ax.errorbar(
            xs,
            [m for m, _ in stats],
            yerr=[s or 0 for _, s in stats],
            marker="o",
            capsize=3,
            label="mean ± std over seeds (other keys pooled)",
        )
        if not numeric:
            ax.set_xticks(xs, [str(v).rsplit(".", 1)[-1] for v in values])
        elif len(values) > 2 and min(values) > 0 and max(values) / min(values) > 50:
            ax.set_xscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        name = f"objective-{key.replace('/', '_')}.png"
        fig.tight_layout()
        fig.savefig(folder / name, dpi=100)
        plt.close(fig)
        written.append(name)
    sparse = [p for p in points if p["sparsity"] is not None and p["mean"] is not None]
    if metric == "test_acc" and any(p["sparsity"] > 0 for p in sparse):
        sparse.sort(key=lambda p: p["sparsity"])
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.errorbar(
            [p["sparsity"] for p in sparse],
            [p["mean"] for p in sparse],
            yerr=[p["std"] or 0 for p in sparse],
            marker="o",
            capsize=3,
            label="pruned (mean ± std)",
        )
        dense = [p["mean"] for p in sparse if p["sparsity"] == 0]
        if dense:
            ax.axhline(statistics.fmean(dense), color="gray", linestyle="--", label="dense baseline")
        ax.set_xlabel("sparsity (fraction of weights that are zero)")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(folder / "accuracy-vs-sparsity.png", dpi=100)
        plt.close(fig)
        written.append("accuracy-vs-sparsity.png")
    return written
