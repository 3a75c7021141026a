"""``python -m project.evaluate RUN [--ckpt best|last|FILE] [--split test|val] [overrides...]``.

Rebuilds model and data from the run folder's own config (overrides allowed: another ``--data.data_dir``,
``--data.batch_size``, ``--trainer.accelerator``...), loads the checkpoint with PyTorch's safe unpickler,
evaluates one split and writes ``eval-<ckpt>-<split>.json`` into the run folder: accuracy, loss, per-class
accuracy, the confusion matrix (rows: true class) and the number of samples. On the run's unchanged config
``--ckpt best --split test`` reproduces ``results.json``'s ``test_acc``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from project import runs
from project.cli import ProjectCLI, cli_for_run, exit_with, run_main
from project.errors import ArgumentParser, ConfigError


@dataclass
class Job:
    run: Path
    ckpt: Path
    ckpt_name: str
    split: str
    cli: ProjectCLI
    checkpoint: dict[str, Any]


def load_weights(cli: ProjectCLI, ckpt: Path, checkpoint: dict[str, Any]) -> None:
    """Load a checkpoint's weights strictly into the model rebuilt from the run's config.

    Args:
        checkpoint: the loaded checkpoint (``runs.load_checkpoint``), or only its ``state_dict``. A structurally
            pruned (slimmed) checkpoint records its layer widths in its ``hyper_parameters``; given the whole
            checkpoint, the model takes them first (``ImageClassifier.on_load_checkpoint``, as Lightning does when
            it restores), so the weights load strictly into the slimmed shape. A bare state dict loads only into
            the config's widths.

    Raises:
        ConfigError: the checkpoint does not fit the rebuilt net (e.g. an override changed the net), or its widths
            do not match its own weights (refused before a net of those widths is built).
    """
    try:
        if "state_dict" in checkpoint:
            cli.model.on_load_checkpoint(checkpoint)
            checkpoint = checkpoint["state_dict"]
        cli.model.load_state_dict(checkpoint, strict=True)
    except ConfigError as e:
        raise ConfigError(f"{ckpt}: {e}") from None
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        raise ConfigError(f"{ckpt} does not fit model.net={cli.model.hparams.net} ({first})") from None


def evaluate(job: Job) -> dict[str, Any]:
    """Evaluate ``job.split`` and write ``eval-<ckpt>-<split>.json``.

    Returns:
        ``acc``, ``loss`` (fractions / mean cross-entropy), ``per_class_acc`` ({class: fraction}),
        ``confusion_matrix`` (rows: true class), ``samples``, ``split``, ``ckpt``.
    """
    cli, data = job.cli, job.cli.datamodule
    load_weights(cli, job.ckpt, job.checkpoint)
    if job.split == "val":  # the module's test step keeps the confusion matrix; feed it the validation split
        data.test_dataloader = data.val_dataloader
    metrics = cli.trainer.test(cli.model, datamodule=data, verbose=False)[0]
    confusion = cli.model.test_confusion
    rows = confusion.sum(1).clamp(min=1)
    classes = data.classes
    out = {
        "acc": metrics["test/acc"],
        "loss": metrics["test/loss"],
        "per_class_acc": {classes[i]: float(confusion[i, i] / rows[i]) for i in range(len(classes))},
        "confusion_matrix": confusion.tolist(),
        "samples": int(confusion.sum()),
        "split": job.split,
        "ckpt": str(job.ckpt.resolve()),
        "precision": cli.trainer.precision,
    }
    if cli.trainer.is_global_zero:
        path = runs.write_json(job.run / f"eval-{job.ckpt_name}-{job.split}.json", out)
        print(f"{job.split} acc {out['acc']:.4f}  loss {out['loss']:.4f}  ({out['samples']} samples) -> {path}")
    return out


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = ArgumentParser(prog="python -m project.evaluate", description=__doc__.splitlines()[0],
                                epilog="Other arguments override the run's config, as in python -m project.fit.")
    p.add_argument("run", help="run folder (logs/<experiment>/version_N), experiment folder (newest run) or checkpoint")
    p.add_argument("--ckpt", default="best", help="best (default), last, or a checkpoint file")
    p.add_argument("--split", choices=["test", "val"], default="test")
    p.add_argument("--trust_checkpoint", action="store_true", help="allow full unpickling (only for files you made)")
    return p.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 bad arguments/config/checkpoint, 1 bad data)."""
    ns, overrides = parse(argv)

    def make() -> Job:
        run, ckpt, name = runs.command_checkpoint(ns.run, ns.ckpt)
        state = runs.load_checkpoint(ckpt, trust=ns.trust_checkpoint)
        return Job(run, ckpt, name, ns.split, cli_for_run(run, overrides, "python -m project.evaluate"), state)

    return run_main(make, evaluate)


if __name__ == "__main__":
    exit_with(main)
