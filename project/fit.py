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

import logging
from pathlib import Path
from typing import Any

import torch

from project import checkpoints
from project.callbacks.pruning import ScheduledPruning
from project.cli.entry import exit_with, run_main
from project.cli.parser import ProjectCLI
from project.errors import ConfigError, UnreadableFile
from project.nets import build_net
from project.report import results as run_report
from project.report.figures import TestReport
from project.report.run_logger import run_dir
from project.runs import claims, layout, read

log = logging.getLogger("project")

# Settings that fix a run's length: a scheduler sized from them cannot continue when they change.
SCHEDULE_KEYS = (
    "trainer.max_epochs",
    "trainer.max_steps",
    "trainer.limit_train_batches",
    "trainer.accumulate_grad_batches",
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.benchmark",
    "data.class_path",
    "data.init_args.batch_size",
    "data.init_args.val_size",
    "data.init_args.folds",
)
# The data settings that choose a K-fold run's validation images (project.data.folds): a resume keeps them.
SPLIT_KEYS = ("folds", "fold", "seed")


def _get(tree: Any, key: str) -> Any:
    for part in key.split("."):
        tree = tree.get(part) if hasattr(tree, "get") else None
    return tree


def epochs_done(ckpt: dict[str, Any]) -> int:
    """Training epochs a checkpoint has completed (its fit loop's epoch counter)."""
    progress = ckpt["loops"]["fit_loop"]["epoch_progress"]["current"]
    return int(progress["processed"])


def check_resume(ckpt: dict[str, Any], ckpt_path: str, cli: ProjectCLI) -> None:
    """Refuse, before anything is written, a resume that cannot continue the checkpoint's run.

    Checked: the net's parameter names and shapes (a slimmed checkpoint's at its recorded widths); a
    length-sized LR scheduler (one-cycle, cosine) against the run's own config (``SCHEDULE_KEYS``); a K-fold run's
    fold, folds and seed (``SPLIT_KEYS``) against the checkpoint's data hyperparameters, so it goes on validating on
    the same images; each pruning callback's schedule against the checkpoint's
    (:meth:`ScheduledPruning.check_resume`).

    Raises:
        ConfigError: naming what differs and what to do.
    """
    model = cli.model
    # A slimmed checkpoint carries its widths; the module rebuilds that shape when it loads (on_load_checkpoint).
    widths = (ckpt.get("hyper_parameters") or {}).get("widths", model.hparams.get("widths"))
    with torch.device("meta"):
        net = build_net(model.hparams.net, model.hparams.num_classes, widths)
    model_sd = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.startswith("net.")}
    model_sd |= {f"net.{k}": tuple(v.shape) for k, v in net.state_dict().items()}
    ckpt_sd = {k: tuple(v.shape) for k, v in ckpt["state_dict"].items()}
    if model_sd != ckpt_sd:
        diff = sorted(set(model_sd.items()) ^ set(ckpt_sd.items()))[:2]
        raise ConfigError(
            f"ckpt_path: {ckpt_path} holds a different net than model.net={cli.model.hparams.net} "
            f"(first differences: {diff}); resume with the run's own model and data settings"
        )
    saved = ckpt.get("datamodule_hyper_parameters") or {}
    data = cli.datamodule.hparams
    if saved.get("folds") is not None or data.get("folds") is not None:
        changed_split = [(k, saved.get(k), data.get(k)) for k in SPLIT_KEYS if saved.get(k) != data.get(k)]
        if changed_split:
            what = ", ".join(f"data.{k} {a!r} -> {b!r}" for k, a, b in changed_split)
            raise ConfigError(
                f"ckpt_path: the run was validating on other images ({what}); resume with the run's own folds, "
                "fold and seed, or start a new run (drop --ckpt_path)"
            )
    sized = [s for s in ckpt.get("lr_schedulers", []) if s.get("total_steps") or s.get("T_max")]
    run = layout.run_of_checkpoint(Path(ckpt_path))
    before: Any = None
    if sized and run is not None and layout.latest_config(run).is_file():
        try:  # the run folder is data (docs/security.md): bounded, regular file, safe loader
            before = read.read_yaml(layout.latest_config(run), what="a run's config")
        except UnreadableFile:
            before = None
        if not isinstance(before, dict) or not before:
            log.warning(
                "%s is empty or unreadable; the schedule's settings are not compared", layout.latest_config(run)
            )
    if isinstance(before, dict) and before:
        now = cli.config.as_dict()
        changed = [(k, _get(before, k), _get(now, k)) for k in SCHEDULE_KEYS if _get(before, k) != _get(now, k)]
        if changed:
            what = ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in changed)
            raise ConfigError(
                f"ckpt_path: the run's learning-rate schedule was sized for its own length and cannot continue "
                f"with {what}; resume with the run's settings, or start a new run (drop --ckpt_path)"
            )
    ScheduledPruning.check_resume(cli.trainer.callbacks, ckpt.get("callbacks") or {})


def fit(cli: ProjectCLI) -> dict[str, Any]:
    """Fit, then test (on the best checkpoint, or on the final weights of a pruning run), and report.

    Returns:
        The ``results.json`` dict (see :func:`project.report.build_results`). Resuming a finished run
        returns its existing results and changes nothing.

    Raises:
        UserError: bad data or configuration found during the run, or a diverging loss. What the command
            added to the run folder is removed first unless it wrote a checkpoint.
    """
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    ckpt_path = cli.config.ckpt_path
    log_dir = run_dir(trainer)
    if ckpt_path is not None:
        ckpt = checkpoints.load_checkpoint(ckpt_path, trust=cli.config.trust_checkpoint)
        check_resume(ckpt, ckpt_path, cli)
        max_epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) else None
        done = max_epochs is not None and epochs_done(ckpt) >= max_epochs
        done = done or (trainer.max_steps not in (None, -1) and ckpt.get("global_step", 0) >= trainer.max_steps)
        run = layout.run_of_checkpoint(Path(ckpt_path))
        if done and run is not None and (run / layout.RESULTS).is_file():
            results = layout.read_results(run)
            if trainer.is_global_zero:
                print(f"{run} already finished ({epochs_done(ckpt)} epochs); nothing to do", flush=True)
                run_report.print_summary(results)
            return results
    before = layout.snapshot(log_dir)
    try:
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path, weights_only=not cli.config.trust_checkpoint)
        if trainer.interrupted:
            return {}
        pruning = run_report.callback(trainer, ScheduledPruning)
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        # A pruning run is judged on its final, fully pruned (or slimmed) weights: its best val/acc may predate
        # pruning.
        test_ckpt = "best" if best and pruning is None else None
        trainer.callbacks.append(TestReport())  # confusion matrix, misclassified images, PR curves
        metrics = trainer.test(model, datamodule=data, ckpt_path=test_ckpt, verbose=False, weights_only=True)[0]
    except BaseException:
        if trainer.is_global_zero and log_dir is not None:
            layout.undo_since(log_dir, before)
        raise
    results = run_report.build_results(trainer, model, metrics, test_ckpt, cli.config)
    if trainer.is_global_zero:
        if log_dir is not None:
            run_report.log_hparams(trainer, model, results)
            trainer.logger.finalize("success")
            layout.write_results(log_dir, results)
        run_report.print_summary(results)
    return results


def main(args: list[str] | None = None) -> int:
    """Entry point of ``python -m project.fit``; returns the exit status (0 ok, 1 bad data/run, 2 bad config)."""
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
