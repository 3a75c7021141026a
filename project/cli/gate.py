"""The checkpoint gate of a resume: ``--ckpt_path`` read once, checked, and handed to Lightning.

A resume's checkpoint is read from disk once (:meth:`CheckpointGate.open`, a config step of
:class:`~project.cli.parser.ProjectCLI`, before anything is written): PyTorch's safe unpickler, sizes checked
first (:func:`project.checkpoints.load_checkpoint`). Once the Trainer exists, :meth:`CheckpointGate.check` refuses a
resume that cannot continue the checkpoint's run, :meth:`CheckpointGate.finished` finds a run that has nothing left to
do, and :meth:`CheckpointGate.hand_to` gives the checked dict to the run's checkpoint IO, so Lightning's
``trainer.fit(ckpt_path=...)`` restores exactly the bytes that were checked, without reading the file again.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch

from project import checkpoints
from project.callbacks.checkpoint import LocalAtomicCheckpointIO
from project.callbacks.pruning import ScheduledPruning
from project.errors import ConfigError, UnreadableFile
from project.nets import build_net
from project.runs import layout, read

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
# The data settings that choose a run's validation images (with data.val_size for a plain split): a resume keeps them.
SPLIT_KEYS = ("folds", "fold", "seed")


def _get(tree: Any, key: str) -> Any:
    for part in key.split("."):
        tree = tree.get(part) if hasattr(tree, "get") else None
    return tree


def epochs_done(ckpt: dict[str, Any]) -> int:
    """Training epochs a checkpoint has completed (its fit loop's epoch counter)."""
    progress = ckpt["loops"]["fit_loop"]["epoch_progress"]["current"]
    return int(progress["processed"])


@dataclass
class CheckpointGate:
    """One resume's checkpoint: ``path`` (a file, already resolved from ``last``/``best``/a run folder) and the
    ``checkpoint`` dict read from it once."""

    path: Path
    checkpoint: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path, trust: bool) -> CheckpointGate:
        """Read ``path`` once (:func:`project.checkpoints.load_checkpoint`).

        Raises:
            ConfigError: unreadable, unsafe without ``trust``, or not a Lightning training checkpoint.
        """
        return cls(Path(path), checkpoints.load_checkpoint(path, trust=trust))

    def check(self, cli: Any) -> None:
        """Refuse, before anything is written, a resume that cannot continue the checkpoint's run of ``cli`` (the
        :class:`~project.cli.parser.ProjectCLI` with its Trainer, model and data module built).

        Checked: the net's parameter names and shapes (a slimmed checkpoint's at its recorded widths); the
        split (``SPLIT_KEYS``, and ``val_size``) against the checkpoint's data hyperparameters, so it goes on
        validating on the same images; a mid-epoch checkpoint's number of processes
        (:meth:`check_processes`); a length-sized LR scheduler (one-cycle, cosine) against the run's own config
        (``SCHEDULE_KEYS``); each pruning callback's schedule (:meth:`ScheduledPruning.check_resume`).

        Raises:
            ConfigError: naming what differs and what to do.
        """
        self.check_net(cli)
        self.check_split(cli.datamodule.hparams)
        self.check_processes(type(cli.datamodule).__qualname__, cli.trainer.world_size)
        self.check_schedule(cli.config.as_dict())
        ScheduledPruning.check_resume(cli.trainer.callbacks, self.checkpoint.get("callbacks") or {})

    def check_net(self, cli: Any) -> None:
        """The checkpoint's parameter names and shapes are the configured net's (at the checkpoint's widths).

        Raises:
            ConfigError: the first differences.
        """
        model = cli.model
        # A slimmed checkpoint carries its widths; the module rebuilds that shape when it loads (on_load_checkpoint).
        widths = (self.checkpoint.get("hyper_parameters") or {}).get("widths", model.hparams.get("widths"))
        with torch.device("meta"):
            net = build_net(model.hparams.net, model.hparams.num_classes, widths)
        model_sd = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.startswith("net.")}
        model_sd |= {f"net.{k}": tuple(v.shape) for k, v in net.state_dict().items()}
        ckpt_sd = {k: tuple(v.shape) for k, v in self.checkpoint["state_dict"].items()}
        if model_sd != ckpt_sd:
            diff = sorted(set(model_sd.items()) ^ set(ckpt_sd.items()))[:2]
            raise ConfigError(
                f"ckpt_path: {self.path} holds a different net than model.net={model.hparams.net} "
                f"(first differences: {diff}); resume with the run's own model and data settings"
            )

    def check_split(self, data: dict[str, Any]) -> None:
        """A resumed run keeps validating on its own images: the checkpoint's data hyperparameters (``folds``,
        ``fold``, ``seed`` and, for a plain split, ``val_size`` as the run resolved it) against the data module's.
        An unset ``val_size`` of a data module whose data decide it (an image folder, before ``setup``) is not
        compared; a number is, so a config whose number means something else now is refused, not followed.

        Raises:
            ConfigError: naming each setting that changed, the checkpoint's value first.
        """
        saved = self.checkpoint.get("datamodule_hyper_parameters") or {}
        keys = [*SPLIT_KEYS, *(["val_size"] if saved.get("folds") is None and data.get("folds") is None else [])]
        changed = [
            (k, saved.get(k), data.get(k))
            for k in keys
            if k in saved and saved.get(k) != data.get(k) and not (k == "val_size" and data.get(k) is None)
        ]
        if changed:
            # data.seed is not set by hand: it follows seed_everything (ProjectCLI links them), so name that key.
            names = {k: "seed_everything" if k == "seed" else f"data.{k}" for k, _, _ in changed}
            # the values as a command line or YAML writes them (null, not None): JSON's scalars
            what = ", ".join(f"{names[k]} {json.dumps(a)} -> {json.dumps(b)}" for k, a, b in changed)
            own = ", ".join(f"{names[k]}: {json.dumps(a)}" for k, a, _ in changed)
            raise ConfigError(
                f"ckpt_path: the run was validating on other images ({what}); resume with the run's own {own}, "
                "or start a new run (drop --ckpt_path)"
            )

    def check_processes(self, data_key: str, world_size: int) -> None:
        """A checkpoint written in the middle of an epoch resumes under the number of processes that wrote it: its
        count of the epoch's batches done is per process (``data_key``: the data module's entry in the checkpoint,
        :meth:`~project.data.base.VisionDataModule.state_dict`), and under another number each process's share of
        the epoch's order differs, so the resumed epoch would train some images twice and others not at all.
        A checkpoint from an epoch's end (every ``epoch=*`` checkpoint, and ``last.ckpt`` after a whole epoch)
        resumes under any number. Checkpoints without the count's ``world_size`` (older versions) are not checked.

        Raises:
            ConfigError: naming both numbers and the two ways on.
        """
        state = self.checkpoint.get(data_key)
        if not isinstance(state, dict) or not state.get("train_batches_done"):
            return
        saved = state.get("world_size")
        if isinstance(saved, int) and saved != world_size:
            raise ConfigError(
                f"ckpt_path: {self.path} was written {state['train_batches_done']} batches into an epoch by {saved} "
                f"process(es), and this resume runs {world_size}; the epoch's remaining images are {saved} processes' "
                f"shares: resume with trainer.devices x trainer.num_nodes = {saved}, or from a checkpoint at an "
                "epoch's end (checkpoints/epoch=*.ckpt)"
            )

    def check_schedule(self, now: dict[str, Any]) -> None:
        """A scheduler sized from the run's length (``total_steps``, ``T_max``) continues only with the settings of
        the run's latest config (its folder's ``config.yaml`` or newest ``config-resume-<k>.yaml``).

        Raises:
            ConfigError: naming the settings that changed.
        """
        sized = [s for s in self.checkpoint.get("lr_schedulers", []) if s.get("total_steps") or s.get("T_max")]
        run = layout.run_of_checkpoint(self.path)
        if not sized or run is None or not layout.latest_config(run).is_file():
            return
        try:  # the run folder is data (docs/security.md): bounded, regular file, safe loader
            before = read.read_yaml(layout.latest_config(run), what="a run's config")
        except UnreadableFile:
            before = None
        if not isinstance(before, dict) or not before:
            log.warning(
                "%s is empty or unreadable; the schedule's settings are not compared", layout.latest_config(run)
            )
            return
        changed = [(k, _get(before, k), _get(now, k)) for k in SCHEDULE_KEYS if _get(before, k) != _get(now, k)]
        if changed:
            what = ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in changed)
            raise ConfigError(
                f"ckpt_path: the run's learning-rate schedule was sized for its own length and cannot continue "
                f"with {what}; resume with the run's settings, or start a new run (drop --ckpt_path)"
            )

    def finished(self, trainer: L.Trainer) -> dict[str, Any] | None:
        """The run's ``results.json`` when the checkpoint already reached ``max_epochs`` or ``max_steps`` and its run
        finished (a resume then has nothing to do), else ``None``."""
        max_epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) else None
        done = max_epochs is not None and epochs_done(self.checkpoint) >= max_epochs
        done = done or (
            trainer.max_steps not in (None, -1) and self.checkpoint.get("global_step", 0) >= trainer.max_steps
        )
        run = layout.run_of_checkpoint(self.path)
        if done and run is not None and (run / layout.RESULTS).is_file():
            if trainer.is_global_zero:
                print(f"{run} already finished ({epochs_done(self.checkpoint)} epochs); nothing to do", flush=True)
            return layout.read_results(run)
        return None

    def hand_to(self, trainer: L.Trainer) -> None:
        """Give the checked dict to the run's checkpoint IO, which returns it for the next load of :attr:`path`
        (Lightning's ``trainer.fit(ckpt_path=...)``) instead of reading the file again. A checkpoint IO of the
        user's own class reads the file itself."""
        io = trainer.strategy.checkpoint_io
        if isinstance(io, LocalAtomicCheckpointIO):
            io.serve_once(self.path, self.checkpoint)
