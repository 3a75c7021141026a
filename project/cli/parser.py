"""The project's ``LightningCLI``, shared by every command (the one-line error handling: :mod:`project.cli.entry`).

* :class:`ProjectCLI` -- LightningCLI over :class:`~project.module.ImageClassifier` and the data modules with
  the project's defaults (TensorBoard under ``logs/``, best/last checkpoints by ``val/acc``, learning rate
  every step, ``cudnn.enabled``), values typed as given, and shared config checks. Every callback and plugin a
  run uses is a key of its config (``--print_config``), and a run-folder command (:mod:`project.cli.commands`) adds
  its own options to the same parser.
"""

from __future__ import annotations

import copy
import logging
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from jsonargparse import ArgumentError
from lightning.pytorch.callbacks import LearningRateMonitor, ThroughputMonitor
from lightning.pytorch.cli import LightningArgumentParser, SaveConfigCallback

from project import adapters
from project.callbacks.checkpoint import RunCheckpoint
from project.callbacks.pruning import Pruning
from project.callbacks.training import CudnnFlags, Throughput
from project.cli import checks
from project.cli.gate import CheckpointGate
from project.cli.parse_errors import ParseError, failed_import, misspelling_hint
from project.cluster import ddp, slurm
from project.data.base import VisionDataModule
from project.errors import ConfigError
from project.module import ImageClassifier
from project.report.epoch_metrics import EpochMetrics
from project.report.results import TensorBoardLayout
from project.runs import claims, files, layout, resume

log = logging.getLogger("project")


DEFAULT_LOGGER = {
    "class_path": checks.PROJECT_LOGGER,
    "init_args": {"save_dir": "logs", "name": "mnist", "default_hp_metric": False, "log_graph": True},
}


DEFAULT_DATA = {"class_path": "project.data.MNISTDataModule"}


# The callbacks every run gets, each under its own key so that ``--print_config`` shows it and YAML or the command
# line changes it (``--lr_monitor.log_momentum true``, another class by ``class_path``) or removes it
# (``--lr_monitor null``). key -> (the class a replacement must subclass, the default's class path, the class a
# callback in trainer.callbacks duplicates it by: Lightning's parents included).
RUN_CALLBACKS: dict[str, tuple[type, str, type]] = {
    "throughput": (Throughput, "project.callbacks.Throughput", ThroughputMonitor),
    "lr_monitor": (LearningRateMonitor, "project.callbacks.StepLearningRateMonitor", LearningRateMonitor),
    "tensorboard_layout": (TensorBoardLayout, "project.report.TensorBoardLayout", TensorBoardLayout),
    "metrics_csv": (EpochMetrics, "project.report.EpochMetrics", EpochMetrics),
    "slurm_requeue": (slurm.SlurmRequeue, "project.cluster.SlurmRequeue", slurm.SlurmRequeue),
}


# Run callbacks that write through the logger: left out of a Trainer without one (evaluate, predict, export,
# ``--trainer.logger false``), where Lightning's LearningRateMonitor would refuse to start.
NEEDS_LOGGER = (LearningRateMonitor, TensorBoardLayout, EpochMetrics)


DEFAULT_PLUGINS = [{"class_path": "project.callbacks.LocalAtomicCheckpointIO"}]


HELP_OVERVIEW = """The project's own options: --model.* (net, widths, optimizer, lr_scheduler, channels_last, compile),
--data.* (data_dir, source_dir, batch_size, num_workers, val_size, in_memory; see
`--data.help project.data.FashionMNISTDataModule`), --checkpoint.*, --cudnn.enabled, --ckpt_path,
--trust_checkpoint; pruning: --trainer.callbacks+=project.callbacks.Pruning (see
`--trainer.callbacks.help project.callbacks.Pruning`); structured pruning (a physically slimmed net):
--config configs/slim.yaml or --trainer.callbacks+=project.callbacks.StructuredPruning. Every other --trainer.* option
is Lightning's Trainer argument of the same name (full list below)."""


class RunConfig(SaveConfigCallback):
    """Lightning's ``SaveConfigCallback``, keeping every config a run folder ran with, written atomically.

    A new run writes ``config.yaml``; each resume into the same folder adds ``config-resume-<k>.yaml``
    (k = 1, 2, ...), so the original config is never rewritten. Each file is written whole or not at all
    (:func:`project.runs.files.write_text`: a process killed midway leaves no empty ``config.yaml``), never through a
    link. Without a logger there is no run folder and nothing is written (Lightning's callback would write
    ``config.yaml`` into the working directory). Uses Lightning's documented ``save_to_log_dir=False`` +
    ``save_config`` hook (rank 0 only).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["save_to_log_dir"] = False
        super().__init__(*args, **kwargs)

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        logger = trainer.logger
        if logger is None or logger.log_dir is None or trainer.fast_dev_run:
            return  # no run folder (evaluate, predict, export, --trainer.logger false): nothing to keep

        log_dir = Path(logger.log_dir)  # rank 0's own logger: trainer.log_dir would broadcast from rank 0 alone
        log_dir.mkdir(parents=True, exist_ok=True)
        name = self.config_filename
        if layout.holds_run(log_dir):
            resumes = layout.resume_configs(log_dir)
            name = layout.CONFIG_RESUME.format(resumes[-1][0] + 1 if resumes else 1)
        config = self.config.clone()
        data_args = config.data.get("init_args") if config.get("data") else None
        if data_args is not None and "classes" in data_args and data_args.classes is None and trainer.datamodule:
            # the classes an image-folder data module found: predict and export then need no image folder
            data_args.classes = list(trainer.datamodule.classes)  # type: ignore[attr-defined]
        split_off = getattr(trainer.datamodule, "split_off", None)
        if data_args is not None and data_args.get("val_size") is None and split_off is not None:
            data_args.val_size = split_off  # the tenth of train/ an unset val_size took, as a number
        if config.get("trust_checkpoint"):  # a one-time decision about one file, not a setting to pass on
            config.trust_checkpoint = False
        files.write_text(log_dir / name, self.parser.dump(config, skip_none=False))


def check_round_trip(parser: LightningArgumentParser, cfg: Any, flags: set[str]) -> None:
    """What ``--print_config[=flags]`` prints, given back to ``--config``, must be the same config: ``skip_null``
    drops a ``null`` that removes a callback (``--lr_monitor null``), and a run from the printed file would get the
    callback back without a word. Refused with the keys it would change; nothing is printed.

    Raises:
        ConfigError: naming the keys whose values the printed file would not keep, and the fix.
    """
    if "skip_null" not in flags:
        return  # comments and skip_default print what parses back to the same config
    full = yaml.safe_load(parser.dump(cfg, skip_none=False, skip_validation=True))
    printed = yaml.safe_load(parser.dump(cfg, skip_none=True, skip_validation=True))
    defaults = yaml.safe_load(parser.dump(parser.get_defaults(), skip_none=False, skip_validation=True))

    def dropped(full: Any, printed: Any, default: Any, path: str) -> list[str]:
        if isinstance(full, dict):
            keys = []
            for key, value in full.items():
                sub = f"{path}.{key}" if path else key
                missing = not isinstance(printed, dict) or key not in printed
                base = default.get(key) if isinstance(default, dict) else None
                if value is None and missing and base is not None:
                    keys.append(sub)  # a null the defaults fill back in
                elif not missing:
                    keys += dropped(value, printed[key], base, sub)
            return keys
        return []

    lost = dropped(full, printed, defaults, "")
    if lost:
        nulls = ", ".join(f"{k}: null" for k in lost)
        raise ConfigError(
            f"--print_config=skip_null would drop {nulls}, which a run from the printed file would fill with its "
            "default again; print without skip_null (--print_config)"
        )


# Lightning 2.6's own pytree helper (lightning/pytorch/utilities/_pytree.py) builds torch's deprecated
# ``LeafSpec()`` on every batch: torch >= 2.10 warns once per process. Not ours to fix; filtered by message
# and module only.
warnings.filterwarnings(
    "ignore",
    message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    category=FutureWarning,
    module=r"lightning\.pytorch\.utilities\._pytree",
)


# The stages of the config steps (ProjectCLI.config_steps).
CONFIG, MACHINE, RUN = "config", "machine", "run"


class Resolved(Exception):  # noqa: N818 -- control flow of ProjectCLI.resolve, not an error
    """Raised with the settled config to end :meth:`ProjectCLI.resolve` before anything is built."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__("resolved")
        self.config = config


class ProjectCLI(adapters.TrainerCallbacksCLI):
    """LightningCLI with the project's defaults and checks (``run=False``: the entry point calls the work).

    Raises:
        ConfigError, ParseError (a jsonargparse.ArgumentError): bad input, before anything is written.
    """

    def __init__(
        self,
        args: list[str] | None = None,
        prog: str = "python -m project.fit",
        command_options: Callable[[LightningArgumentParser], None] | None = None,
        usage: str | None = None,
        resolve_only: bool = False,
        **kwargs: Any,
    ) -> None:
        # a run-folder command (project.cli.commands) adds its own options to this one parser
        self.command_options = command_options
        self.claimed: list[Path] = []  # the folders this command claimed (claims.release: those still empty)
        self.drawn_seed: int | None = None  # seed_everything: true
        self.gate: CheckpointGate | None = None  # a resume's checkpoint, read once (open_gate)
        self.resolve_only = resolve_only  # stop after the config steps (resolve)
        ddp.register_strategies()  # every ddp* strategy name binds its rendezvous to one address
        kwargs["description"] = f"{kwargs.get('description', '')}\n\n{HELP_OVERVIEW}".strip()
        usage = usage or (
            f"{prog} [--config CONFIG ...] [--model.* ...] [--data.* ...] [--trainer.* ...] "
            "[--ckpt_path CKPT] [--print_config]"
        )
        try:
            self.build(args, prog, usage, kwargs)
        except BaseException:  # a bad config or class: the run folder claimed for it goes (when still empty)
            claims.release(self.claimed)
            raise

    def build(self, args: list[str] | None, prog: str, usage: str, kwargs: dict[str, Any]) -> None:
        """LightningCLI's own ``__init__``: parse, check (:meth:`prepare_config`), instantiate."""
        super().__init__(
            model_class=ImageClassifier,
            datamodule_class=VisionDataModule,
            subclass_mode_data=True,
            save_config_callback=RunConfig,
            run=False,
            args=args,
            seed_everything_default=42,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"exit_on_error": False, "allow_abbrev": False, "prog": prog, "usage": usage, **kwargs},
            auto_configure_optimizers=False,
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # Explicit args (the bench, evaluate, sweeps and tests build an experiment inside another program) are the
        # whole command line: the host program's own sys.argv is none of the experiment's business, and Lightning
        # warns when it sees both.
        given = sys.argv[1:] if args is None else args
        checks.check_config_files(given)
        if isinstance(given, list | tuple):
            args = checks.upgrade_class_paths(list(given))  # configs of runs from before the package's subpackages
        argv = sys.argv
        if args is not None:
            sys.argv = argv[:1]
        try:
            self.check_before_printing(parser, list(args) if isinstance(args, list | tuple) else [])
            super().parse_arguments(parser, args)
        except ArgumentError as e:  # with the parser, whose declared types explain_parse_error looks up
            given_args = list(args) if isinstance(args, list | tuple) else []
            raise ParseError(e, parser, misspelling_hint(e, parser, given_args)) from e
        except Exception as e:  # what a module a class path names raised as it was imported
            where = failed_import(e)
            if where is None:
                raise
            raise ConfigError(
                f"a class path's module raised {type(e).__name__} as it was imported ({e}; {where}): fix that "
                "module, or name another class"
            ) from None
        finally:
            sys.argv = argv
        # checked here, before LightningCLI seeds: its "Seed set to N" line would come before an error line
        self.prepare_config()

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--ckpt_path",
            type=str | None,
            default=None,
            help="resume training: a .ckpt file, a run folder, or 'last' / 'best' (newest run of this experiment)",
        )
        parser.add_argument(
            "--trust_checkpoint",
            type=bool,
            default=False,
            help="load a checkpoint that needs full unpickling (it can run code: only for files you made)",
        )
        parser.add_argument(
            "--auto_precision",
            type=bool,
            default=False,
            help="when trainer.precision is not set: 16-mixed on a CUDA GPU, bf16-mixed on a CPU with native bf16 "
            "(AVX512-BF16/AMX), else 32-true (the choice is recorded in results.json)",
        )
        parser.add_lightning_class_args(RunCheckpoint, "checkpoint")
        parser.add_lightning_class_args(CudnnFlags, "cudnn")
        for key, (base, _, _) in RUN_CALLBACKS.items():
            parser.add_lightning_class_args(base, key, subclass_mode=True, required=False)
        # One seed: the split and shuffling order follow seed_everything (``true``: the seed drawn for the run, which
        # prepare_config then records as seed_everything: checks.settle_seed).
        parser.link_arguments("seed_everything", "data.init_args.seed", compute_fn=self.data_seed)
        parser.link_arguments("data", "model.num_classes", compute_fn=lambda d: d.num_classes, apply_on="instantiate")
        parser.link_arguments("data", "model.input_shape", compute_fn=lambda d: d.input_shape, apply_on="instantiate")
        parser.set_defaults(
            {
                "data": DEFAULT_DATA,
                "trainer.logger": DEFAULT_LOGGER,
                "trainer.max_epochs": 2,
                "checkpoint.monitor": "val/acc",
                "checkpoint.mode": "max",
                "checkpoint.save_last": True,
                "checkpoint.filename": "epoch{epoch:02d}-val_acc{val/acc:.4f}",
                "checkpoint.auto_insert_metric_name": False,
                "trainer.plugins": DEFAULT_PLUGINS,
                **{key: {"class_path": path} for key, (_, path, _) in RUN_CALLBACKS.items()},
            }
        )
        if self.command_options is not None:
            self.command_options(parser)
        adapters.prefer_int_over_float(parser)

    def data_seed(self, seed: bool | int) -> int:
        """``data.seed`` for ``seed_everything``: the int itself; for ``true`` (Lightning: "a random seed") one seed
        drawn per command (:func:`checks.draw_seed`); ``false`` maps to 0 here and is refused by
        :func:`checks.settle_seed`."""
        if seed is True:
            if self.drawn_seed is None:
                self.drawn_seed = checks.draw_seed()
            return self.drawn_seed
        return 0 if seed is False else seed

    def config_steps(self) -> list[tuple[str, Callable[[Any], None]]]:
        """Every config step, in the order it runs, with its stage: ``config`` steps settle and check the config
        alone (``--print_config`` and a sweep's base stop after them: :meth:`resolve`); ``machine`` steps check this
        machine (a GPU, the data folders); ``run`` steps prepare the run (a SLURM requeue's checkpoint, the
        checkpoint gate, the run folder). Each step takes the parsed config and settles it in place or raises
        ``ConfigError`` (one line naming the key and the fix)."""
        twins = {key: same for key, (_, _, same) in RUN_CALLBACKS.items()}
        return [
            (CONFIG, self.settle_default_logger),
            *((MACHINE if check in checks.MACHINE_CHECKS else CONFIG, check) for check in checks.CHECKS),
            (CONFIG, lambda cfg: checks.check_no_twins(cfg, twins)),
            (CONFIG, checks.check_trainer_ranges),
            (MACHINE, checks.check_data_dir),
            *([(MACHINE, checks.check_source_dir)] if self.command_options is None else []),  # fit's own data
            (RUN, slurm.prepare),  # under SLURM: a requeued job resumes its own run
            (RUN, self.open_gate),
            (CONFIG, checks.settle_seed),
            (RUN, lambda cfg: self.claim_run_folder()),
        ]

    def run_config_steps(self, cfg: Any, stages: tuple[str, ...] = (CONFIG, MACHINE, RUN)) -> None:
        """The :meth:`config_steps` of ``stages``, in order, on ``cfg``.

        Raises:
            ConfigError: one line naming the key and the fix.
        """
        for stage, step in self.config_steps():
            if stage in stages:
                step(cfg)

    def prepare_config(self) -> None:
        """Every config step (:meth:`config_steps`) on the parsed config, before anything is built or written.

        Raises:
            ConfigError: one line naming the key and the fix.
        """
        self.run_config_steps(self.config)

    def open_gate(self, cfg: Any) -> None:
        """``--ckpt_path`` (``last``, ``best``, a run folder, a file) resolved to a file, read once and kept as
        :attr:`gate` (:class:`~project.cli.gate.CheckpointGate`), and the logger pointed at the run it continues.

        Raises:
            ConfigError: no such run or file, or a file the safe unpickler refuses.
        """
        if cfg.ckpt_path is None:
            return
        cfg.ckpt_path = str(resume.resolve_ckpt_path(cfg.ckpt_path, cfg.trainer.logger, cfg.as_dict()))
        self.gate = CheckpointGate.open(cfg.ckpt_path, trust=cfg.trust_checkpoint)
        resume.resume_in_place(Path(cfg.ckpt_path), cfg.trainer.logger)

    def settle_default_logger(self, cfg: Any) -> None:
        """``trainer.logger: null`` (or ``true``) is the default logger, as Lightning documents for its Trainer: here
        the run's own (:data:`DEFAULT_LOGGER`, a run folder under ``logs/``), not Lightning's ``lightning_logs/``
        in the working directory without the run's config, metrics and learning rate. ``false``: no logger."""
        if cfg.trainer.logger is None or cfg.trainer.logger is True:
            cfg.trainer.logger = copy.deepcopy(self.parser.get_defaults().trainer.logger)

    def check_before_printing(self, parser: LightningArgumentParser, args: list[str]) -> None:
        """``--print_config`` prints the config and exits while jsonargparse parses, before :meth:`prepare_config`:
        a config the checks refuse (``--throughput null``) was printed, and ``fit --config`` of that file refused.
        So the ``config`` steps run first on the config without ``--print_config`` (a copy: what is printed is what
        was given); a parse error is left to the parse that follows, which reports it. For :meth:`resolve`, the
        checked copy is the answer (:class:`Resolved`).

        Raises:
            ConfigError: one line naming the key and the fix; nothing is printed.
            Resolved: for :meth:`resolve`, with the checked config.
        """
        plain = [a for a in args if a != "--print_config" and not str(a).startswith("--print_config=")]
        if len(plain) == len(args) and not self.resolve_only:
            return
        try:
            cfg = parser.parse_args(plain)
        except ArgumentError:
            if self.resolve_only:
                raise
            return
        flags = {f for a in args if str(a).startswith("--print_config=") for f in str(a).split("=", 1)[1].split(",")}
        if not self.resolve_only:
            check_round_trip(parser, cfg, flags)
        self.run_config_steps(cfg, stages=(CONFIG,))
        if self.resolve_only:
            raise Resolved(yaml.safe_load(parser.dump(cfg, skip_unset=False, skip_validation=True)))

    @classmethod
    def resolve(cls, args: list[str]) -> dict[str, Any]:
        """The config ``python -m project.fit ARGS`` would run, as a dict: parsed, then settled by the ``config``
        steps (the default logger, the checks, the seed) as ``--print_config`` settles it, without the steps
        that check this machine or prepare a run. Builds nothing and writes nothing (a sweep's base experiment).

        Raises:
            ConfigError, ParseError: as ``fit`` with the same arguments.
        """
        try:
            cls(args, resolve_only=True)
        except Resolved as done:
            return done.config
        raise AssertionError("ProjectCLI(resolve_only=True) returned without its config")

    def claim_run_folder(self) -> None:
        """Claim this run's folder before the Trainer exists (global rank 0 only), and point the logger at it.

        A new run gets a fresh ``version_N`` from :func:`project.runs.claims.claim_run` (atomic: concurrent starts
        never share one); a resume in place uses its run's folder, refused if it holds a symbolic link; an
        explicit ``trainer.logger.init_args.version`` that already holds a run is refused. Other ranks read the
        folder from rank 0 (Lightning broadcasts ``trainer.log_dir``), so they claim nothing.

        Raises:
            ConfigError: the folder cannot be created or written, or holds a run / a link.
        """

        cfg = self.config
        experiment = resume._logger_dir(cfg.trainer.logger)
        if experiment is None or cfg.trainer.fast_dev_run or not slurm.is_global_rank_zero():
            return
        args = cfg.trainer.logger.init_args
        # every file of the run, from here on, is written below the folders the user gave through directory fds
        files.hold_below(args.save_dir)
        if cfg.get("checkpoint") is not None and cfg.checkpoint.get("dirpath"):
            files.hold_below(cfg.checkpoint.dirpath)
        if "://" in str(experiment):
            files.check_folder(experiment, "trainer.logger.init_args.save_dir")
            return
        if cfg.ckpt_path is not None and args.version is not None:
            run = experiment / (f"version_{args.version}" if isinstance(args.version, int) else str(args.version))
            if run.is_dir() and layout.holds_run(run):
                layout.check_no_links(run)
                return
        run = claims.claim_run(experiment, args.version, self.claimed)
        args.version = layout.version_of(run) if isinstance(args.version, int) or args.version is None else run.name

    def trainer_callbacks(self, config: dict[str, Any], callbacks: list[Any]) -> list[Any]:
        # Lightning refuses ``enable_checkpointing=False`` next to a ModelCheckpoint, and the run's RunCheckpoint
        # (``checkpoint.*``) is always one: without checkpointing it is left out, and fit tests the final weights.
        # Removed run callbacks (``--lr_monitor null``) are None here; those that write through the logger are
        # left out of a Trainer without one.
        if self.command_options is not None:
            # A run-folder command (evaluate, predict, export) rebuilds the run to test or predict, not to train:
            # the run's callbacks are left out, since a copied config's callbacks may write where they say
            # (OnExceptionCheckpoint, BatchSizeFinder; docs/security.md). Weights and a slimmed shape load through
            # the module (project.cli.commands.load_weights), not through callbacks.
            config["callbacks"] = []  # the config's own trainer.callbacks (Lightning adds ``callbacks`` to these)
            return []
        logged = bool(config.get("logger"))
        callbacks = [
            c
            for c in callbacks
            if c is not None
            and not (config.get("enable_checkpointing") is False and isinstance(c, RunCheckpoint))
            and (logged or not isinstance(c, NEEDS_LOGGER))
        ]
        return callbacks

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        with warnings.catch_warnings():
            # Lightning says this as a long UserWarning with a source line; we say it once, plainly, below.
            warnings.filterwarnings("ignore", message=".*AMP with fp16 is not supported on CPU.*")
            trainer = super().instantiate_trainer(**kwargs)
        Pruning.number_copies(trainer.callbacks)  # before a resume looks up each one's state
        requested = str(self.config.trainer.precision)
        requested = trainer.precision if requested == "None" else requested
        if requested != trainer.precision and trainer.is_global_zero:
            log.warning(
                "precision %r is not supported on %s; training with %r (recorded in results.json)",
                requested,
                type(trainer.accelerator).__name__.removesuffix("Accelerator").upper(),
                trainer.precision,
            )
        return trainer
