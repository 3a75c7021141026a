"""``python -m project.fit``: train, test on the best checkpoint, write ``results.json``.

A thin entry point over :func:`fit`, which does the work and returns the metrics::

    python -m project.fit --config configs/fashion_mnist.yaml --trainer.max_epochs 2
    python -m project.fit --config configs/mnist.yaml --config configs/pruning.yaml
    python -m project.fit --config configs/fashion_mnist.yaml --config configs/slim.yaml
    python -m project.fit --config configs/mnist.yaml --ckpt_path last
    python -m project.fit --config configs/cifar10.yaml --print_config

Each run writes ``logs/<experiment>/version_N/`` (see :mod:`project.runs`). Bad input (unknown key, wrong
type, missing data, a checkpoint that cannot continue under the new settings, ...) prints one ``error:``
line, exits non-zero and leaves the filesystem as it found it.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from project.callbacks.pruning import ScheduledPruning
from project.cli.entry import exit_with, run_main
from project.cli.parser import ProjectCLI
from project.cluster import stop
from project.report import results as report
from project.report.figures import TestReport
from project.report.run_logger import run_dir
from project.runs import claims, layout


def fit(cli: ProjectCLI) -> dict[str, Any]:
    """Fit, then test (on the best checkpoint, or on the final weights of a pruning run), and report.

    The recipe: the parsed, checked config (:class:`ProjectCLI`: its config steps ran, the run folder is claimed);
    a resume's checkpoint, read once, checked against the run and handed to Lightning (:mod:`project.cli.gate`);
    ``Trainer.fit``; ``Trainer.test`` with the test-set figures; the run's report (:func:`report.finish`).

    Returns:
        The ``results.json`` dict (see :func:`project.report.results.build_results`). Resuming a finished run
        returns its existing results and changes nothing; an interrupted fit (SIGTERM) returns ``{}``.

    Raises:
        UserError: bad data or configuration found during the run, or a diverging loss. What the command
            added to the run folder is removed first unless it wrote a checkpoint.
    """
    trainer, model, data, gate = cli.trainer, cli.model, cli.datamodule, cli.gate
    ckpt_path, weights_only = cli.config.ckpt_path, not cli.config.trust_checkpoint
    if gate is not None:
        gate.check(cli)
        if (finished := gate.finished(trainer)) is not None:
            return report.already_finished(trainer, finished)
        gate.hand_to(trainer)
    with layout.undone_on_failure(run_dir(trainer), owner=trainer.is_global_zero):
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path, weights_only=weights_only)
        if trainer.interrupted:
            return {}
        test_ckpt = checkpoint_to_test(trainer)
        trainer.callbacks.append(TestReport())  # confusion matrix, misclassified images, PR curves
        metrics = trainer.test(model, datamodule=data, ckpt_path=test_ckpt, verbose=False, weights_only=True)[0]
    return report.finish(trainer, model, metrics, test_ckpt, cli.config)


def checkpoint_to_test(trainer: L.Trainer) -> str | None:
    """``"best"`` (the best checkpoint by ``val/acc``), or ``None`` (the final weights) for a run without
    checkpoints and for a pruning run, which is judged on its final, fully pruned (or slimmed) weights: its best
    ``val/acc`` may predate pruning."""
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    return "best" if best and report.callback(trainer, ScheduledPruning) is None else None


def main(args: list[str] | None = None) -> int:
    """Entry point of ``python -m project.fit``; returns the exit status (0 ok, 1 bad data/run, 2 bad config, 143
    stopped by SIGTERM). A SIGTERM from here on stops the run where all its processes can
    (:mod:`project.cluster.stop`)."""
    stop.watch()
    return run_main(lambda: ProjectCLI(args, description=__doc__.splitlines()[0]), fit_and_release)


def fit_and_release(cli: ProjectCLI) -> dict[str, Any]:
    """:func:`fit`; then the run folder this command claimed is removed if it is still empty (the run failed before
    writing anything into it)."""
    try:
        return fit(cli)
    finally:
        claims.release(cli.claimed)


if __name__ == "__main__":
    exit_with(main)
