"""The project's ``LightningCLI`` and the one-line error handling shared by every entry point.

* :class:`ProjectCLI` -- LightningCLI over :class:`~project.module.ImageClassifier` and the data modules with
  the project's defaults (TensorBoard under ``logs/``, best/last checkpoints by ``val/acc``, learning rate
  every step, ``cudnn.enabled``), values typed as given, and shared config checks.
* :func:`run_main` -- turns every user-caused failure (jsonargparse's, ours, Lightning's
  ``MisconfigurationException``) into one ``error:`` line and an exit status.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import signal
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import lightning as L
import torch
import yaml
from jsonargparse import ArgumentError
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project import adapters, cluster, ddp  # noqa: F401  (ddp: every ddp* strategy name binds its rendezvous to one address)
from project.callbacks import (
    CudnnFlags,
    LocalAtomicCheckpointIO,
    Pruning,
    RunCheckpoint,
    StepLearningRateMonitor,
    Throughput,
)
from project.data import VisionDataModule
from project.errors import ConfigError, UserError, yaml_problem
from project.module import ImageClassifier
from project.report import EpochMetrics, TensorBoardLayout

log = logging.getLogger("project")

DEFAULT_LOGGER = {
    "class_path": "project.report.RunTensorBoardLogger",
    "init_args": {"save_dir": "logs", "name": "mnist", "default_hp_metric": False, "log_graph": True},
}
LIGHTNING_TENSORBOARD = (
    "lightning.pytorch.loggers.TensorBoardLogger",
    "lightning.pytorch.loggers.tensorboard.TensorBoardLogger",
)
DEFAULT_DATA = {"class_path": "project.data.MNISTDataModule"}
HELP_OVERVIEW = """The project's own options: --model.* (net, widths, optimizer, lr_scheduler, channels_last, compile),
--data.* (data_dir, source_dir, batch_size, num_workers, val_size, in_memory; see
`--data.help project.data.FashionMNISTDataModule`), --checkpoint.*, --cudnn.enabled, --ckpt_path,
--trust_checkpoint; pruning: --trainer.callbacks+=project.callbacks.Pruning (see
`--trainer.callbacks.help project.callbacks.Pruning`); structured pruning (a physically slimmed net):
--config configs/slim.yaml or --trainer.callbacks+=project.slim.StructuredPruning. Every other --trainer.* option
is Lightning's Trainer argument of the same name (full list below)."""


class RunConfig(SaveConfigCallback):
    """Lightning's ``SaveConfigCallback``, keeping every config a run folder ran with, written atomically.

    A new run writes ``config.yaml``; each resume into the same folder adds ``config-resume-<k>.yaml``
    (k = 1, 2, ...), so the original config is never rewritten. Each file is written whole or not at all
    (:func:`project.runs.write_text`: a process killed midway leaves no empty ``config.yaml``), never through a
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
        from project import runs

        log_dir = Path(logger.log_dir)  # rank 0's own logger: trainer.log_dir would broadcast from rank 0 alone
        log_dir.mkdir(parents=True, exist_ok=True)
        name = self.config_filename
        if runs.holds_run(log_dir):
            k = len(list(log_dir.glob("config-resume-*.yaml"))) + 1
            name = f"config-resume-{k}.yaml"
        runs.write_text(log_dir / name, self.parser.dump(self.config, skip_none=False))


# Lightning 2.6's own pytree helper (lightning/pytorch/utilities/_pytree.py) builds torch's deprecated
# ``LeafSpec()`` on every batch: torch >= 2.10 warns once per process. Not ours to fix; filtered by message
# and module only.
warnings.filterwarnings(
    "ignore",
    message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    category=FutureWarning,
    module=r"lightning\.pytorch\.utilities\._pytree",
)


# Trainer settings Lightning uses without checking them first: these values crashed deep in a loop
# (ZeroDivisionError, IndexError), were reported against another key, or trained with a meaningless setting.
# key -> (check of a set value, what to use instead). Lightning's own checks cover the rest.
TRAINER_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "accumulate_grad_batches": (lambda v: v >= 1, "a positive integer (1: no accumulation)"),
    "check_val_every_n_epoch": (lambda v: v >= 1, "a positive integer, or null to validate by val_check_interval"),
    "val_check_interval": (
        lambda v: isinstance(v, float) or v >= 1,
        "a positive number of training batches, or a fraction of the epoch in [0.0, 1.0]",
    ),
    "limit_test_batches": (lambda v: v != 0, "a positive number of batches or a fraction: fit ends with a test"),
    "gradient_clip_val": (lambda v: v >= 0, "a non-negative number (0 or null: no clipping)"),
    "num_sanity_val_steps": (lambda v: v >= -1, "-1 (all batches), 0 (no sanity check) or a number of batches"),
    "min_epochs": (lambda v: v >= 0, "a non-negative integer"),
    "min_steps": (lambda v: v >= 0, "a non-negative integer"),
}


class ProjectCLI(LightningCLI):
    """LightningCLI with the project's defaults and checks (``run=False``: the entry point calls the work).

    Raises:
        ConfigError, jsonargparse.ArgumentError: bad input, before anything is written.
    """

    def __init__(self, args: list[str] | None = None, prog: str = "python -m project.fit", **kwargs: Any) -> None:
        kwargs["description"] = f"{kwargs.get('description', '')}\n\n{HELP_OVERVIEW}".strip()
        super().__init__(
            model_class=ImageClassifier,
            datamodule_class=VisionDataModule,
            subclass_mode_data=True,
            save_config_callback=RunConfig,
            run=False,
            args=args,
            seed_everything_default=42,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={
                "exit_on_error": False,
                "allow_abbrev": False,
                "prog": prog,
                "usage": f"{prog} [--config CONFIG ...] [--model.* ...] [--data.* ...] [--trainer.* ...] "
                "[--ckpt_path CKPT] [--print_config]",
                **kwargs,
            },
            auto_configure_optimizers=False,
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # Explicit args (the bench, evaluate, sweeps and tests build an experiment inside another program) are the
        # whole command line: the host program's own sys.argv is none of the experiment's business, and Lightning
        # warns when it sees both.
        check_config_files(sys.argv[1:] if args is None else args)
        if args is None:
            return super().parse_arguments(parser, args)
        argv = sys.argv
        sys.argv = argv[:1]
        try:
            return super().parse_arguments(parser, args)
        finally:
            sys.argv = argv

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
        # One seed: the split and shuffling order follow seed_everything.
        parser.link_arguments("seed_everything", "data.init_args.seed")
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
            }
        )
        adapters.prefer_int_over_float(parser)

    def before_instantiate_classes(self) -> None:
        cfg = self.config
        if cfg.trainer.deterministic is True and cfg.trainer.benchmark:
            raise ConfigError(
                "trainer.deterministic: true and trainer.benchmark: true conflict (cudnn.benchmark picks "
                "kernels by timing them, which is not deterministic); set one of them to false"
            )
        if cfg.auto_precision and cfg.trainer.precision is None:
            cfg.trainer.precision = fastest_precision(cfg.trainer.accelerator)
        for item in cfg.trainer.logger if isinstance(cfg.trainer.logger, list) else [cfg.trainer.logger]:
            # Lightning's TensorBoardLogger (its shorthand `--trainer.logger TensorBoardLogger` or its class path)
            # runs as the project's drop-in subclass: same arguments and files, the project's TensorBoard fixes.
            if getattr(item, "class_path", None) in LIGHTNING_TENSORBOARD:
                item.class_path = DEFAULT_LOGGER["class_path"]
        logger = cfg.trainer.logger
        if cfg.model.compile and getattr(getattr(logger, "init_args", None), "log_graph", False):
            # TensorBoard's graph is a torch.jit.trace, which cannot trace a torch.compile'd forward.
            logger.init_args.log_graph = False
        if cfg.trainer.barebones:
            raise ConfigError(
                "trainer.barebones: true turns off self.log, the metrics fit reports (test acc, results.json) are "
                "read from; for a quiet run use --trainer.enable_progress_bar false --trainer.enable_model_summary "
                "false, and python -m benchmarks.bench to time raw training steps"
            )
        for key in ("limit_train_batches", "max_epochs", "max_steps"):
            if cfg.trainer.get(key) == 0:
                raise ConfigError(f"trainer.{key}: 0 trains nothing; use a positive number")
        if cfg.ckpt_path is not None and cfg.trainer.enable_checkpointing is False:
            raise ConfigError(
                "trainer.enable_checkpointing: false with ckpt_path: the resumed run would keep its old checkpoints "
                "beside newer results; resume with checkpointing on"
            )
        for key, (ok, allowed) in TRAINER_RANGES.items():
            value = cfg.trainer.get(key)
            if value is not None and not isinstance(value, bool) and not ok(value):
                raise ConfigError(f"trainer.{key}: {value!r} is out of range; use {allowed}")
        cluster.prepare(cfg)  # under SLURM: a requeued job resumes its own run
        from project import runs

        data_args = getattr(cfg.data, "init_args", None)
        if data_args is not None and data_args.get("data_dir") is not None:
            runs.check_folder(data_args.data_dir, "data.data_dir", write=False)
        if cfg.ckpt_path is not None:
            cfg.ckpt_path = str(runs.resolve_ckpt_path(cfg.ckpt_path, cfg.trainer.logger, cfg.as_dict()))
            runs.load_checkpoint(cfg.ckpt_path, trust=cfg.trust_checkpoint)  # refuse unsafe files up front
            runs.resume_in_place(Path(cfg.ckpt_path), cfg.trainer.logger)
        self.claim_run_folder()

    def claim_run_folder(self) -> None:
        """Claim this run's folder before the Trainer exists (global rank 0 only), and point the logger at it.

        A new run gets a fresh ``version_N`` from :func:`project.runs.claim_run` (atomic: concurrent starts
        never share one); a resume in place uses its run's folder, refused if it holds a symbolic link; an
        explicit ``trainer.logger.init_args.version`` that already holds a run is refused. Other ranks read the
        folder from rank 0 (Lightning broadcasts ``trainer.log_dir``), so they claim nothing.

        Raises:
            ConfigError: the folder cannot be created or written, or holds a run / a link.
        """
        from project import runs

        cfg = self.config
        experiment = runs._logger_dir(cfg.trainer.logger)
        if experiment is None or cfg.trainer.fast_dev_run or not cluster.is_global_rank_zero():
            return
        args = cfg.trainer.logger.init_args
        if "://" in str(experiment):
            runs.check_folder(experiment, "trainer.logger.init_args.save_dir")
            return
        if cfg.ckpt_path is not None and args.version is not None:
            run = experiment / (f"version_{args.version}" if isinstance(args.version, int) else str(args.version))
            if run.is_dir() and runs.holds_run(run):
                runs.check_no_links(run)
                return
        run = runs.claim_run(experiment, args.version)
        args.version = runs.version_of(run) if isinstance(args.version, int) or args.version is None else run.name

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> L.Trainer:
        # Lightning refuses ``enable_checkpointing=False`` next to a ModelCheckpoint, and the run's RunCheckpoint
        # (``checkpoint.*``) is always one: without checkpointing it is left out, and fit tests the final weights.
        if config.get("enable_checkpointing") is False:
            callbacks = [c for c in callbacks if not isinstance(c, RunCheckpoint)]
        return super()._instantiate_trainer(config, callbacks)

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        plugins = self.config_init.trainer.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        if not any(hasattr(p, "save_checkpoint") for p in plugins):
            kwargs["plugins"] = [*plugins, LocalAtomicCheckpointIO()]
        with warnings.catch_warnings():
            # Lightning says this as a long UserWarning with a source line; we say it once, plainly, below.
            warnings.filterwarnings("ignore", message=".*AMP with fp16 is not supported on CPU.*")
            trainer = super().instantiate_trainer(**kwargs)
        Pruning.number_copies(trainer.callbacks)  # before a resume looks up each one's state
        trainer.callbacks.append(Throughput())
        if cluster.slurm_job() is not None:
            trainer.callbacks.append(cluster.SlurmRequeue())
        if trainer.loggers:
            trainer.callbacks += [StepLearningRateMonitor(), TensorBoardLayout(), EpochMetrics()]
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


def check_config_files(args: Any) -> None:
    """Read every YAML/JSON config file named in ``args`` (``--config`` files, overlays, a file given as an
    option's value) with the safe loader first, so that a syntax error names the file, line and column.

    jsonargparse parses the same files afterwards; its own message says ``"<unicode string>"`` instead of the file.

    Raises:
        ConfigError: ``<file>, line L, column C: <what the YAML parser found>``.
    """
    if not isinstance(args, (list, tuple)):
        return
    for arg in args:
        value = str(arg).split("=", 1)[1] if str(arg).startswith("--") and "=" in str(arg) else str(arg)
        path = Path(value)
        if path.suffix.lower() not in (".yaml", ".yml", ".json") or not path.is_file():
            continue
        try:
            yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(yaml_problem(path, e)) from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read the config file ({e})") from None


def fastest_precision(accelerator: Any) -> str:
    """The mixed precision this machine runs fastest, for ``auto_precision``.

    ``16-mixed`` when training on a CUDA GPU (tensor cores; the recipes' AMP trick), ``bf16-mixed`` on a CPU
    whose oneDNN has native bf16 (AVX512-BF16 or AMX), else ``32-true``: without native bf16 the CPU emulates
    it with conversions.
    """
    name = str(getattr(accelerator, "class_path", accelerator) or "auto").lower()
    if torch.cuda.is_available() and ("auto" in name or "gpu" in name or "cuda" in name):
        return "16-mixed"
    return "bf16-mixed" if adapters.cpu_has_native_bf16() else "32-true"


_GENERIC = ("Expected a <class 'NoneType'>", "Not a valid subclass", "a class path", "a dict ")


def explain_parse_error(message: str) -> str:
    """Boil jsonargparse's multi-line type error down to one line: the key, the value, what was expected.

    A ``ConfigError`` raised while a class was instantiated (e.g. ``model.net: ...``) is passed through as is.
    """
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    restricted = re.search(r"Not of type (\w+): (.*?) does not conform to restriction (.*)", message)
    if restricted:
        keys = [k for k in re.findall(r'Parser key "([^"]+)"', message) if k != "init_args"]
        name, value, rule = restricted.groups()
        return f"{'.'.join(keys)}: {value} is not a {name} (needs {rule.strip()})"
    nested = re.search(
        r"- Problem with given class_path '[^']+':\s*Parser key \"([^\"]+)\":\s*Expected a (.*?)\. Got value: (.*)",
        message,
    )
    outer = re.match(r'Parser key "([^"]+)"', message.strip())
    if nested and outer:  # an init argument of a class given by class_path (e.g. a callback's): name the key
        key, expected, given = nested.groups()
        expected = re.sub(r"<class '(\w+)'>", r"\1", expected).replace("typing.Literal", "one of ")
        return f"{outer.group(1)}.{key}: invalid value {given.strip()!r}; expected {expected}"
    deep = _explain_nested(message)
    if deep:
        return deep
    errors = [line[2:] for line in lines if line.startswith("- ")]
    specific = [e for e in errors if not e.startswith(_GENERIC) and not e.startswith("Expected a ")]
    if specific:
        return specific[0]
    key = re.search(r'Parser key "([^"]+)"', message)
    given = re.search(r"(?:Given|Got) value: (.*)", message)
    single = re.search(r"Expected a (.*?)\. Got value", message)
    if single:
        errors = [f"Expected a {single.group(1)}"]
    expected = [
        e.removeprefix("Expected a ") for e in errors if e.startswith("Expected a ") and not e.startswith(_GENERIC)
    ]
    expected = [re.sub(r"<class '(\w+)'>", r"\1", e).replace("typing.Literal", "one of ") for e in expected]
    if key and given:
        return f"{key.group(1)}: invalid value {given.group(1)!r}; expected {' or '.join(expected) or 'another type'}"
    return lines[0] if lines else message


def _explain_nested(message: str) -> str | None:
    """A bad value inside a class given by ``class_path`` (the data module's ``batch_size``, the optimizer's
    ``lr``, ...): jsonargparse reports it under the outer key, nested. Name the whole key, the value and the type
    expected; None when the message is not of that kind."""
    keys = [k for k in re.findall(r'Parser key "([^"]+)"', message) if k != "init_args"]
    if len(keys) >= 2:  # a bad value: checked first, jsonargparse may also list an option it tried and refused
        key = ".".join(keys)
        not_of_type = re.findall(r"Not of type (\w+): (.*)", message)
        if not_of_type:
            name, why = not_of_type[-1]
            return f"{key}: {why.strip()} (expected {name})"
        given = re.findall(r"Given value: (.*?)(?:\. Got value:.*)?$", message, re.MULTILINE)
        expected = sorted(set(re.findall(r"Expected a <class '(\w+)'>", message)) - {"NoneType"})
        if given and expected:
            return f"{key}: invalid value {given[-1].strip()!r}; expected {' or '.join(expected)}"
    unknown = re.search(r"Option '([^']+)' is not accepted", message)
    cls = re.search(r"class_path '([^']+)'", message)
    if unknown and keys and cls:  # a misspelled init argument in a YAML file
        return (f"{keys[0]}.{unknown.group(1)}: {cls.group(1)} has no such option "
                f"(its options: --{keys[0]}.help {cls.group(1)})")  # fmt: skip
    return None


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    # Lightning advertises a cloud logger on every start; this project logs to TensorBoard.
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(lambda r: "litlogger" not in r.getMessage())


SIGTERM_STATUS = 128 + signal.SIGTERM  # 143


def exit_with(main: Callable[[], int]) -> NoReturn:
    """``sys.exit(main())`` for the process of a ``python -m project.<command>``, without Python's slow exit.

    At exit Python collects garbage over every object still alive: after importing torch, torchvision and
    Lightning that pass took 2.4 s of a ``fit`` on a 2-core CPU. ``gc.freeze()`` (standard library) moves the
    objects alive at that moment (the imported modules, mostly) out of the collector's reach, here before and
    after the work; the exit then took 0.5 s, and the collections during training found less to scan. Nothing
    is skipped: finalizers, ``atexit`` handlers and logger flushes still run.

    A run stopped by SIGTERM (:data:`SIGTERM_STATUS` from :func:`run_main`) ends by SIGTERM again, as a shell
    command does, so that SLURM, a container runtime or ``project.sweep`` sees a killed process, not a success.
    """
    gc.freeze()
    status = main()
    gc.freeze()
    if status == SIGTERM_STATUS:  # stopped by SIGTERM: end by it too, so that a parent (a scheduler) sees a kill
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    sys.exit(status)


def run_main(make_cli: Callable[[], Any], work: Callable[[Any], Any]) -> int:
    """Build the CLI, do the work; every user-caused failure becomes one ``error:`` line on stderr.

    Returns:
        0 on success, 2 for a bad config (parse errors, :class:`ConfigError`, Lightning's
        ``MisconfigurationException``), 1 for bad data or a failed run (:class:`UserError`),
        :data:`SIGTERM_STATUS` (143, as a shell reports a SIGTERM) when a SIGTERM stopped the run.
    """
    setup_logging()
    cli = None
    from project import runs

    try:
        cli = make_cli()
        work(cli)
    except SIGTERMException:  # Lightning's loops raise it (a SystemExit without a code) after a SIGTERM
        print("error: stopped by SIGTERM; a run folder that holds a checkpoint is kept: resume it with --ckpt_path "
              "last (or the folder)", file=sys.stderr)  # fmt: skip
        return SIGTERM_STATUS
    except (ArgumentError, ValueError, MisconfigurationException, UserError) as e:
        parsing = cli is None
        status = _exit_status(e, parsing)
        if status is None:
            raise
        if parsing and not isinstance(e, MisconfigurationException):
            print(f"error: {explain_parse_error(str(e))} (see --help)", file=sys.stderr)
        else:
            print(f"error: {_one_line(e)}", file=sys.stderr)
        return status
    finally:
        runs.release_claimed()  # a run folder claimed for a command that failed before writing into it
    return 0


def _exit_status(e: BaseException, parsing: bool) -> int | None:
    """2 for a bad config, 1 for bad data or a failed run, None for a bug (re-raised with its traceback)."""
    if isinstance(e, (ArgumentError, ConfigError, MisconfigurationException)):
        return 2
    if isinstance(e, UserError):
        return 1
    # a plain ValueError: jsonargparse's type checks while parsing; Lightning's checks of settings while building
    # the Trainer (e.g. barebones with a logger) or while running
    bad_config = (parsing and "Does not validate" in str(e)) or _raised_by_lightning(e)
    return 2 if bad_config else None


def _raised_by_lightning(e: BaseException) -> bool:
    """Whether Lightning itself raised ``e`` (its checks of Trainer settings against the data raise ValueError)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}lightning{os.sep}" in tb.tb_frame.f_code.co_filename


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


# The loggers of the banner Lightning prints while it sets up a run ("Seed set to 42", "GPU available: ...",
# "TPU available: ...", "Using bfloat16 Automatic Mixed Precision (AMP)", "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES",
# "💡 Tip: ..."): all are INFO records of these two hierarchies; Lightning's warnings go through `warnings`.
BANNER_LOGGERS = ("lightning.pytorch", "lightning.fabric")


def quiet_library_banners() -> None:
    """Lightning's set-up banner off for a command that only reads a run (evaluate, predict, export).

    Raises the level of :data:`BANNER_LOGGERS` to WARNING, for the rest of the process: the banner comes again
    when such a command calls ``Trainer.test``/``predict``, after the run is rebuilt. Lightning's warnings and
    errors, the command's own result line and its ``error:`` lines are untouched. ``fit`` keeps the banner: it
    says which device and precision the run trains on.
    """
    for name in BANNER_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def cli_for_run(run: Any, overrides: list[str], prog: str) -> ProjectCLI:
    """The run's own experiment, rebuilt from its latest config (``config.yaml`` or the newest resume's).

    No logger and no resume, so nothing is written into the run by rebuilding it; ``overrides`` are
    ordinary CLI arguments (e.g. ``--data.data_dir``, ``--data.batch_size``, ``--trainer.accelerator cpu``).
    The config may name any importable class: it is code, load only runs you trust.

    Raises:
        ConfigError, jsonargparse.ArgumentError: the config or an override is bad.
    """
    from project import runs

    args = ["--config", str(runs.latest_config(run)), "--trainer.logger", "false", "--ckpt_path", "null",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            *overrides]  # fmt: skip
    quiet_library_banners()
    return ProjectCLI(args, prog=prog)
