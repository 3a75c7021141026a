"""The run-folder commands' shared piece: ``RUN`` and ``--ckpt`` on the one command line of :class:`ProjectCLI`.

``python -m project.evaluate``, ``project.predict`` and ``project.export`` each declare a :class:`Command`: its
positionals, its own options (typed, added to the same jsonargparse parser as every ``--model.*``, ``--data.*``
and ``--trainer.*`` override, so ``--help`` lists them all and a bad value is one ``error:`` line) and the work.
:func:`command_main` does the rest, the same way for each:

1. ``RUN`` (the first argument) names a run folder, an experiment folder (its newest run) or a checkpoint inside a
   run (:func:`find_run`);
2. the run's experiment is rebuilt from its latest config (``config.yaml`` or the newest resume's) through
   :class:`~project.cli.parser.ProjectCLI`, with the command's options and the user's overrides after it, no logger and
   no resume (nothing is written into the run by rebuilding it; ``--trust_checkpoint`` is off unless given), as
   one process on one device whatever strategy, devices and nodes the run trained with (:data:`REBUILD`);
3. ``--ckpt`` (``best``, ``last`` or a file; a checkpoint given as ``RUN`` wins) is loaded with PyTorch's safe
   unpickler (:func:`project.checkpoints.load_checkpoint`) and its weights strictly into the rebuilt model
   (:func:`load_weights`: a slimmed checkpoint's widths first);
4. the command's work gets a :class:`RunJob`; every user-caused failure is one ``error:`` line
   (:func:`project.cli.entry.run_main`).
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentError
from lightning.pytorch.cli import LightningArgumentParser

from project import adapters, checkpoints
from project.cli.entry import exception_chain, quiet_library_banners, run_main
from project.cli.parser import ProjectCLI
from project.data.base import DEFAULT_DATA_DIR, DEFAULT_VAL_SIZE
from project.errors import ConfigError, DataError
from project.runs import layout, read, trust

# The run's own settings that a rebuilt experiment must not take over: it writes no run folder, resumes nothing,
# downloads nothing, runs as one process on one device (a run trained with DDP, on several nodes or devices, would
# otherwise start as many processes again, each classifying its share of predict's inputs into the same CSV), and
# reads data from the data folder the user names (default ``data``, as fit's), never from the folders a copied
# config names (docs/security.md). The run's callbacks are left out too (ProjectCLI.trainer_callbacks). The user's
# own options come after these and win.
REBUILD = [
    "--trainer.strategy",
    "auto",
    "--trainer.devices",
    "1",
    "--trainer.num_nodes",
    "1",
    "--trainer.logger",
    "false",
    "--trainer.profiler",
    "null",
    "--data.init_args.download",
    "false",
    "--data.init_args.data_dir",
    DEFAULT_DATA_DIR,
    "--data.init_args.source_dir",
    "null",
    "--ckpt_path",
    "null",
    "--trust_checkpoint",
    "false",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
    "--trainer.enable_checkpointing",
    "false",
]


@dataclass
class Command:
    """One run-folder command.

    Attributes:
        name: the module's name (``evaluate``): ``python -m project.<name>``.
        description: one line for ``--help``.
        add_arguments: adds the command's own options (and positionals after ``run``) to the shared parser.
        work: does the command's work on the rebuilt run; its return value is not used.
        overrides: settings the command always uses, before the user's (e.g. ``--trainer.accelerator cpu``).
        positionals: how ``--help`` shows the positionals.
    """

    name: str
    description: str
    add_arguments: Callable[[LightningArgumentParser], None]
    work: Callable[[RunJob], Any]
    overrides: tuple[str, ...] = ()
    positionals: str = "RUN"

    @property
    def prog(self) -> str:
        return f"python -m project.{self.name}"

    @property
    def usage(self) -> str:
        return f"{self.prog} {self.positionals} [--ckpt CKPT] [options] [--model.* --data.* --trainer.* overrides]"

    def option_names(self) -> set[str]:
        """The keys the command adds to the parser (``run``, ``ckpt`` and its own)."""
        parser = LightningArgumentParser()
        self.arguments(parser)
        return set(parser.get_defaults().keys())

    def arguments(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "run",
            type=str,
            help="run folder (logs/<experiment>/version_N), experiment folder "
            "(its newest run) or checkpoint inside a run",
        )
        parser.add_argument("--ckpt", type=str, default="best", help="best (default), last, or a checkpoint file")
        parser.add_argument(
            "--trust_config",
            type=bool,
            default=False,
            help="let the run's config name classes outside project, lightning, torch, torchvision and torchmetrics "
            "(importing them can run code: only for run folders you trust)",
        )
        self.add_arguments(parser)


@dataclass
class RunJob:
    """What a command works on: the run folder, the checkpoint (file, name for output files, loaded state) and
    the experiment rebuilt from the run's config with the checkpoint's weights (``cli.model``, ``cli.datamodule``,
    ``cli.trainer``); the command's own options are ``cli.config.<name>``."""

    run: Path
    ckpt: Path
    ckpt_name: str
    checkpoint: dict[str, Any]
    cli: ProjectCLI

    @property
    def options(self) -> Any:
        return self.cli.config


def find_run(spec: str | Path) -> Path:
    """The run folder meant by ``spec``: a run folder, an experiment folder (its newest run), or a checkpoint.

    Raises:
        ConfigError: nothing that holds a run's ``config.yaml``.
    """
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".ckpt":
        run = layout.run_of_checkpoint(path)
        if run is not None:
            return run
    if path.is_dir() and layout.holds_run(path):
        return path
    if path.is_dir():
        found = [r for r in layout.runs_of(path) if layout.holds_run(r)]
        if found:
            return found[-1]
    raise ConfigError(
        f"{spec} is not a run folder (logs/<experiment>/version_N with a config.yaml), an experiment folder or a "
        "checkpoint inside a run"
    )


def command_checkpoint(spec: str, which: str) -> tuple[Path, Path, str]:
    """What a command's ``RUN`` argument and ``--ckpt`` name: ``(run, checkpoint file, name)``.

    ``spec`` is a run folder, an experiment folder (its newest run) or a checkpoint file inside a run (which then
    wins over ``which``); ``name`` is ``best``/``last`` or the file's stem, for the files the command writes.

    Raises:
        ConfigError: no such run or checkpoint.
    """
    run = find_run(spec)
    if Path(spec).suffix == ".ckpt":
        return run, Path(spec).expanduser(), Path(spec).stem
    if which in ("best", "last"):
        return run, layout.checkpoint_of(run, which), which
    path = Path(which).expanduser()
    if not path.is_file():
        raise ConfigError(f"--ckpt: {which} is neither best, last nor a checkpoint file")
    return run, path, path.stem


def load_weights(cli: ProjectCLI, ckpt: Path, checkpoint: dict[str, Any]) -> None:
    """Load a checkpoint's weights strictly into the model rebuilt from the run's config.

    Args:
        checkpoint: the loaded checkpoint (``checkpoints.load_checkpoint``), or only its ``state_dict``. A structurally
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
            data_state = checkpoint.get(type(cli.datamodule).__qualname__)
            if isinstance(data_state, dict):  # what the data module saved (an image folder's statistics, classes)
                cli.datamodule.load_state_dict(data_state)
            checkpoint = checkpoint["state_dict"]
        cli.model.load_state_dict(checkpoint, strict=True)
    except ConfigError as e:
        raise ConfigError(f"{ckpt}: {e}") from None
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        raise ConfigError(f"{ckpt} does not fit model.net={cli.model.hparams.net} ({first})") from None


def cli_for_run(run: Path, args: list[str], prog: str, command: Command | None = None) -> ProjectCLI:
    """The run's own experiment, rebuilt from its latest config (``config.yaml`` or the newest resume's).

    No logger and no resume, so nothing is written into the run by rebuilding it, and one process on one device
    (``trainer.strategy: auto``, ``devices: 1``, ``num_nodes: 1``; :data:`REBUILD`); ``args`` are ordinary CLI
    arguments after the config (a command's positionals and options, overrides such as ``--data.data_dir``,
    ``--trainer.accelerator cpu``). The config is read as data first: an import path outside the trusted packages is
    refused (:func:`project.runs.trust.check_import_paths`) unless ``--trust_config true``; no profiler, no download.

    Raises:
        ConfigError, jsonargparse.ArgumentError: the config or an override is bad.
    """
    config = layout.latest_config(run)
    legacy: list[str] = []
    if command is not None:
        check_command_line(command, args)
        data = check_run_config(command, config)
        if not trusts_config(args):
            trust.check_import_paths(data, str(config))
        legacy = legacy_overrides(data)
    overrides = [*legacy, *(command.overrides if command is not None else ())]
    options = command.arguments if command is not None else None
    guard = (
        adapters.import_paths_only(trust.run_imports())
        if command is not None and not trusts_config(args)
        else contextlib.nullcontext()
    )
    try:
        with guard:  # the parser itself refuses what a run may not name, before importing it
            return ProjectCLI(
                ["--config", str(config), *REBUILD, "--trainer.default_root_dir", str(run), *overrides, *args],
                prog=prog,
                command_options=options,
                usage=command.usage if command is not None else None,
            )
    except (ArgumentError, ValueError, ImportError) as e:
        denied = denied_import(e)
        if denied is None:
            raise
        raise ConfigError(
            f"{config} (or a file it includes): names {denied}, outside what a run folder's config may name "
            f"(modules of {', '.join(trust.run_imports())}); importing it could run code from anywhere. If you "
            f"trust that package and have it installed, name it in {trust.TRUST_ENV}, or pass --trust_config true "
            "to trust this whole run folder"
        ) from None


def legacy_overrides(config: Any) -> list[str]:
    """Arguments that read a run config written by an earlier version as that version meant it: a K-fold run's
    ``data.val_size: 5000`` is unset (every config carried the default 5000 until ``val_size`` defaulted to unset,
    and a fold run took no other number, so it never was a choice; today any ``val_size`` with folds is refused).
    ``config``: the run's config read as data."""
    data = config.get("data") if isinstance(config, dict) else None
    init = data.get("init_args") if isinstance(data, dict) else None
    if isinstance(init, dict) and init.get("folds") is not None and init.get("val_size") == DEFAULT_VAL_SIZE:
        return ["--data.init_args.val_size", "null"]
    return []


def denied_import(e: BaseException) -> str | None:
    """The import path jsonargparse refused (its ``ImportDenied``) behind ``e``, wherever in the chain or the
    message (it reports a refusal inside a union of types as text), else None."""
    for cause in exception_chain(e):
        found = re.search(r"Importing '([\w.]+)' is not allowed", str(cause))
        if found:
            return found.group(1)
    return None


def trusts_config(args: list[str]) -> bool:
    """Whether the command line says ``--trust_config true`` (the last one given wins)."""
    value = None
    for i, arg in enumerate(args):
        if arg == "--trust_config" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--trust_config="):
            value = arg.split("=", 1)[1]
    return str(value).lower() in ("true", "yes", "1")


def check_command_line(command: Command, args: list[str]) -> None:
    """Refuse what a run-folder command cannot honour: fit's ``--ckpt_path`` (resume) and a logger (the command
    writes no run folder; a logger would start a fake one).

    Raises:
        ConfigError: naming the option and what to use instead.
    """
    for arg in args:
        key = arg.split("=", 1)[0]
        if key == "--ckpt_path":
            raise ConfigError(f"--ckpt_path is fit's resume option; {command.prog} takes --ckpt best, last or a file")
        if key == "--trainer.logger" or key.startswith("--trainer.logger."):
            raise ConfigError(f"{key}: {command.prog} writes no run folder and takes no logger; drop it")


def check_run_config(command: Command, config: Path) -> Any:
    """Refuse a run config that sets one of the command's own options (``ckpt``, ``out``, ``inputs``, ...): fit
    never writes them, so such a key was added by hand, and it would choose silently what the command reads or
    writes. The command's options come from its command line only. Returns the config read as data (nothing
    imported), for the check of its import paths.

    Raises:
        ConfigError: naming the file and the key.
        UnreadableFile: the config cannot be read as data (:func:`project.runs.read.read_yaml`: a regular file of
            at most 4 MiB, UTF-8, valid YAML, bounded as a tree), refused before the parser reads it.
    """
    keys = read.read_yaml(config, what="a run's config")
    clash = sorted(set(keys) & command.option_names()) if isinstance(keys, dict) else []
    if clash:
        raise ConfigError(
            f"{config}: {clash[0]} is an option of {command.prog}, not a run setting (fit never writes it); "
            "remove it from the run's config and give it on the command line"
        )
    return keys


def leading_positionals(argv: list[str]) -> list[str]:
    """The arguments before the first option (``RUN``, and ``predict``'s inputs)."""
    lead = []
    for arg in argv:
        if arg.startswith("-"):
            break
        lead.append(arg)
    return lead


def command_main(command: Command, argv: list[str] | None = None) -> int:
    """Parse, rebuild the run, load its checkpoint, do the command's work; returns the exit status (0 ok, 2 bad
    arguments/config/checkpoint, 1 bad data or a failed run, as :func:`project.cli.entry.run_main`)."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def make() -> RunJob:
        lead = leading_positionals(argv)
        if not lead:
            if not argv or {"-h", "--help"} & set(argv):  # help, or the parser's own "required: run"
                ProjectCLI(
                    argv,
                    prog=command.prog,
                    command_options=command.arguments,
                    description=command.description,
                    usage=command.usage,
                )
            raise ConfigError(f"RUN comes first (a run folder, an experiment folder or a checkpoint): {command.usage}")
        run = find_run(lead[0])
        # positionals first, so that jsonargparse reads them as positionals after the config file
        cli = cli_for_run(run, argv, command.prog, command)
        run, ckpt, name = command_checkpoint(lead[0], cli.config.ckpt)
        checkpoint = checkpoints.load_checkpoint(
            ckpt, trust=cli.config.trust_checkpoint
        )  # whole: a slimmed net's widths
        load_weights(cli, ckpt, checkpoint)
        return RunJob(run, ckpt, name, checkpoint, cli)

    def work(job: RunJob) -> Any:
        try:
            return command.work(job)
        except DataError as e:
            raise DataError(f"{e}{data_dir_hint(job)}") from None

    with quiet_library_banners():
        return run_main(make, work)


def data_dir_hint(job: RunJob) -> str:
    """Where the run's own config says its data was, as a suggestion: a run-folder command reads the data folder the
    user names (``--data.data_dir``, default ``data``), not the one a copied config names (docs/security.md)."""
    used = str(job.cli.config.data.init_args.data_dir)
    config = read.read_yaml(layout.latest_config(job.run), what="a run's config")
    named = config.get("data", {}).get("init_args", {}).get("data_dir") if isinstance(config, dict) else None
    if isinstance(named, str) and named != used:
        return f" (the run was trained on data in {named}: if that folder is yours, add --data.data_dir {named})"
    return ""


def main_of(command: Command) -> Callable[[list[str] | None], int]:
    """A ``main(argv) -> exit status`` for ``command`` (what ``python -m project.<name>`` runs)."""

    def main(argv: list[str] | None = None) -> int:
        return command_main(command, argv)

    main.__doc__ = f"Entry point of ``{command.prog}``; returns the exit status."
    return main


__all__ = [
    "Command",
    "RunJob",
    "cli_for_run",
    "command_checkpoint",
    "command_main",
    "find_run",
    "load_weights",
    "main_of",
]
