"""The config checks a type cannot express, one function each, run on the parsed config before anything is built
or written (:meth:`project.cli.parser.ProjectCLI.prepare_config`).

Each takes the parsed config (a jsonargparse Namespace) and raises :class:`~project.errors.ConfigError` with one line
naming the key and the fix, or settles what the config leaves open (``settle_*``: ``auto_precision``, the logger).
:data:`CHECKS` lists them in the order they run. Also here: reading config files before jsonargparse does (a YAML
error names the file, line and column) and the class paths of older runs (:data:`MOVED_CLASS_PATHS`)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
import re
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.loggers import CSVLogger

from project import adapters
from project.data.folds import check_folds
from project.errors import ConfigError, yaml_problem
from project.runs import files, layout

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


def _as_list(value: Any) -> list[Any]:
    """A config value that is one item, a list of them, or unset (None/false) as a list."""
    return value if isinstance(value, list) else [value] if value else []


def _names_subclass(item: Any, base: type) -> bool:
    """Whether a parsed (not yet instantiated) config item names a subclass of ``base`` by its ``class_path``."""
    path = getattr(item, "class_path", None)
    if not isinstance(path, str):
        return False
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, base)


# Class paths that run folders and configs written before the package was split into subpackages name, and the
# classes' homes today: such a config still runs (config.yaml of an older run, a user's own overlay).
MOVED_CLASS_PATHS = {
    "project.slim.StructuredPruning": "project.callbacks.StructuredPruning",
    "project.ddp.BoundDDPStrategy": "project.cluster.BoundDDPStrategy",
    "project.epoch_metrics.EpochMetrics": "project.report.EpochMetrics",
    "project.run_logger.RunTensorBoardLogger": "project.report.RunTensorBoardLogger",
    "project.report.TensorBoardLogger": "project.report.RunTensorBoardLogger",
    "project.sweep_trial.ReportToStudy": "project.sweep.ReportToStudy",
    "project.callbacks.batch_samples": "project.callbacks.training.batch_samples",  # Throughput's batch_size_fn
}
_MOVED = re.compile("|".join(re.escape(old) + r"(?![\w.])" for old in MOVED_CLASS_PATHS))


def upgrade_class_paths(args: list[str]) -> list[str]:
    """``args`` with every class path of :data:`MOVED_CLASS_PATHS` replaced by the class's home today: in command
    line values (``--trainer.callbacks+=project.slim.StructuredPruning``) and in the YAML/JSON config files named
    (a file that names one is passed on as its upgraded text). Other arguments are returned unchanged."""
    upgraded = []
    for arg in args:
        arg = _MOVED.sub(lambda m: MOVED_CLASS_PATHS[m.group(0)], str(arg))
        path = Path(arg).expanduser()
        if path.suffix.lower() in (".yaml", ".yml", ".json") and path.is_file():
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError):
                text = ""  # check_config_files names the problem
            if _MOVED.search(text):
                arg = _MOVED.sub(lambda m: MOVED_CLASS_PATHS[m.group(0)], text)
        upgraded.append(arg)
    return upgraded


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
        path = Path(value).expanduser()  # jsonargparse reads --config '~/x.yaml' from the home folder too
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


# The project's TensorBoard logger, and Lightning's, which runs as it (same arguments and files).
PROJECT_LOGGER = "project.report.RunTensorBoardLogger"
LIGHTNING_TENSORBOARD = (
    "lightning.pytorch.loggers.TensorBoardLogger",
    "lightning.pytorch.loggers.tensorboard.TensorBoardLogger",
)


GPU_ACCELERATORS = ("gpu", "cuda", "lightning.pytorch.accelerators.CUDAAccelerator")


def _compiled_for(capability: tuple[int, int], arches: list[str]) -> bool:
    """Whether a GPU of compute ``capability`` runs this torch build's kernels: a cubin ``sm_XY`` of the same major
    version and a minor version up to the GPU's, or PTX ``compute_XY`` of a capability up to the GPU's (CUDA's
    compatibility rules)."""
    for arch in arches:
        kind, _, digits = arch.partition("_")
        if not digits.isdigit():
            continue
        built = (int(digits[:-1]), int(digits[-1]))
        if (kind == "sm" and built[0] == capability[0] and built[1] <= capability[1]) or (
            kind == "compute" and built <= capability
        ):
            return True
    return False


def check_gpu_present(cfg: Any) -> None:
    """``trainer.accelerator: gpu`` (or ``cuda``; configs/trainer/gpu.yaml and ddp.yaml set it) where torch sees no
    CUDA GPU, or only GPUs this torch build has no kernels for, is refused with the fix, instead of Lightning's
    ``No supported gpu backend found!`` or a kernel error in the first step. The build's GPUs:
    ``torch.cuda.get_arch_list()``."""
    accelerator = cfg.trainer.accelerator
    name = str(getattr(accelerator, "class_path", accelerator) or "auto")
    if name.lower() not in GPU_ACCELERATORS and name not in GPU_ACCELERATORS:
        return
    build = f"torch {torch.__version__}"
    if torch.version.cuda is None:
        raise ConfigError(
            f"trainer.accelerator: {name} needs a CUDA build of torch, and {build} is built for the CPU only; install "
            "the locked CUDA build (requirements.lock) or pass --trainer.accelerator cpu"
        )
    if not torch.cuda.is_available():
        raise ConfigError(
            f"trainer.accelerator: {name}, but {build} (CUDA {torch.version.cuda}) finds no usable NVIDIA GPU here; "
            "without one pass --trainer.accelerator cpu (or leave out configs/trainer/gpu.yaml and ddp.yaml); "
            "in a container give it the GPUs (docker run --gpus all ..., podman run --device nvidia.com/gpu=all "
            "...); the host needs an NVIDIA driver for CUDA 13 (>= 580: nvidia-smi shows it)"
        )
    arches = torch.cuda.get_arch_list()
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        if not _compiled_for((major, minor), arches):
            gpu = f"GPU {index} ({torch.cuda.get_device_name(index)}, sm_{major}{minor})"
            raise ConfigError(
                f"trainer.accelerator: {name}, but {gpu} "
                f"is not supported by {build}, which has kernels for {' '.join(arches)}; use a GPU of those "
                "generations (docs/cluster.md lists them), or --trainer.accelerator cpu"
            )


def check_benchmark_vs_deterministic(cfg: Any) -> None:
    """``trainer.deterministic: true`` with ``trainer.benchmark: true`` is refused."""
    if cfg.trainer.deterministic is True and cfg.trainer.benchmark:
        raise ConfigError(
            "trainer.deterministic: true and trainer.benchmark: true conflict (cudnn.benchmark picks "
            "kernels by timing them, which is not deterministic); set one of them to false"
        )


def settle_auto_precision(cfg: Any) -> None:
    """``auto_precision: true`` with no ``trainer.precision``: :func:`fastest_precision` of the accelerator."""
    if cfg.auto_precision and cfg.trainer.precision is None:
        cfg.trainer.precision = fastest_precision(cfg.trainer.accelerator)


def settle_logger(cfg: Any) -> None:
    """Lightning's TensorBoardLogger (the shorthand ``--trainer.logger TensorBoardLogger`` or its class path) runs as
    the project's drop-in subclass; with ``model.compile`` no graph is logged (TensorBoard's graph is a
    ``torch.jit.trace``, which cannot trace a ``torch.compile``'d forward)."""
    for item in _as_list(cfg.trainer.logger):
        if getattr(item, "class_path", None) in LIGHTNING_TENSORBOARD:
            item.class_path = PROJECT_LOGGER
    logger = cfg.trainer.logger
    if cfg.model.compile and getattr(getattr(logger, "init_args", None), "log_graph", False):
        logger.init_args.log_graph = False


# The keys that name a file or folder, wherever they are in the config (data, loggers, checkpoint callbacks,
# profilers, the Trainer, fit's --ckpt_path, the run-folder commands' RUN, --ckpt, --out and inputs).
PATH_KEYS = frozenset(
    {"data_dir", "source_dir", "save_dir", "root_dir", "dirpath", "default_root_dir", "ckpt_path"}
    | {"run", "ckpt", "out", "inputs"}
)


def expand_user(value: Any) -> Any:
    """``value`` with a leading ``~`` or ``~user`` expanded to the home folder (``os.path.expanduser``, as
    torchvision does for its ``root``): a string, or each string of a list; anything else unchanged. A URL
    (``s3://...``) is left alone."""
    if isinstance(value, list):
        return [expand_user(v) for v in value]
    if isinstance(value, str) and value.startswith("~"):
        return os.path.expanduser(value)
    return value


def settle_user_paths(cfg: Any) -> None:
    """``~`` in every path option (:data:`PATH_KEYS`, at any depth: ``data.init_args.data_dir``, each logger's
    ``save_dir``, ``checkpoint.dirpath``, a callback's or profiler's ``dirpath``, ``ckpt_path``, a command's
    ``--out``...) means the home folder, as a shell would read it unquoted: a YAML value or a quoted argument is
    expanded here, before any folder is checked or created (else a folder literally named ``~`` was created in the
    working directory). The run's ``config.yaml`` records the expanded path."""

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
            return
        if not hasattr(node, "__dict__") or isinstance(node, type):
            return
        for key, value in vars(node).items():
            if key in PATH_KEYS:
                setattr(node, key, expand_user(value))
            else:
                walk(value)

    walk(cfg)


def draw_seed() -> int:
    """A seed for ``seed_everything: true``, as Lightning's ``seed_everything(None)`` chooses one: the seed of the
    process that started this one (``PL_GLOBAL_SEED``, which Lightning passes on to the DDP processes it launches)
    in a process of a multi-process run, else a new random one in Lightning's range, 0 .. 2**32 - 1."""
    inherited = os.environ.get("PL_GLOBAL_SEED")
    if launched_processes() > 1 and inherited is not None and inherited.isdigit():
        return int(inherited)
    return secrets.randbelow(2**32)


def launched_processes() -> int:
    """How many processes a launcher started for this run (``WORLD_SIZE``: torchrun, Lightning's own DDP launcher;
    ``SLURM_NTASKS``: srun); 1 outside one."""
    counts = [os.environ.get("WORLD_SIZE", "1"), os.environ.get("SLURM_NTASKS", "1")]
    return max(int(c) if c.isdigit() else 1 for c in counts)


def settle_seed(cfg: Any) -> None:
    """``seed_everything: true`` (Lightning: "a random seed") becomes the seed drawn for this run
    (:func:`draw_seed`, already given to ``data.seed`` by the parser's link), so that ``config.yaml``,
    ``results.json`` and HPARAMS record it and the run repeats exactly from its ``config.yaml``. A resume
    (``ckpt_path``) continues with the seed its run recorded (the same split and shuffling order).

    Raises:
        ConfigError: ``false`` (no seed: the split and shuffling need one), or ``true`` in processes started by
            torchrun or srun, which would each draw their own.
    """
    if cfg.seed_everything is False:
        raise ConfigError(
            "seed_everything: false leaves the run unseeded, but the train/val split and the shuffling need a seed; "
            "give an int, or true for a random one (recorded in config.yaml and results.json)"
        )
    if cfg.seed_everything is not True:
        return
    seed = cfg.data.init_args.seed
    run = layout.run_of_checkpoint(Path(cfg.ckpt_path)) if cfg.ckpt_path is not None else None
    config = layout.read_latest_config(run) if run is not None else None
    recorded = config.get("seed_everything") if isinstance(config, dict) else None
    if isinstance(recorded, int) and not isinstance(recorded, bool):
        seed = recorded
    elif launched_processes() > 1 and os.environ.get("PL_GLOBAL_SEED") is None:
        raise ConfigError(
            f"seed_everything: true would draw a different seed in each of the {launched_processes()} processes "
            "torchrun or srun started (different train/val splits); give an int"
        )
    cfg.seed_everything = cfg.data.init_args.seed = seed


def check_precision_available(cfg: Any) -> None:
    """``trainer.precision: transformer-engine`` (or ``-float16``) needs NVIDIA's Transformer Engine package; without
    it Lightning raised a ``ModuleNotFoundError`` traceback while building the Trainer."""
    precision = str(cfg.trainer.precision)
    if precision.startswith("transformer-engine") and importlib.util.find_spec("transformer_engine") is None:
        raise ConfigError(
            f"trainer.precision: {precision} needs NVIDIA's Transformer Engine (pip install transformer_engine) and "
            "a CUDA GPU; without them use bf16-mixed, 16-mixed or 32-true"
        )


def check_checkpoint_io(cfg: Any) -> None:
    """``trainer.plugins`` keeps a ``CheckpointIO`` (checkpoints written whole)."""
    if not any(_names_subclass(p, CheckpointIO) for p in _as_list(cfg.trainer.get("plugins"))):
        raise ConfigError(
            "trainer.plugins: no CheckpointIO; checkpoints are written whole (temporary file, then rename) by "
            "project.callbacks.LocalAtomicCheckpointIO: keep it in the list (add plugins with "
            "--trainer.plugins+=CLASS) or give your own CheckpointIO"
        )


def check_one_metrics_csv(cfg: Any) -> None:
    """Lightning's ``CSVLogger`` and the ``metrics_csv`` callback would both write ``metrics.csv``."""
    loggers = _as_list(cfg.trainer.logger)
    if cfg.get("metrics_csv") is not None and any(_names_subclass(lg, CSVLogger) for lg in loggers):
        raise ConfigError(
            "trainer.logger: Lightning's CSVLogger writes metrics.csv into the run folder, as the run's "
            "metrics_csv callback does; keep one of them (--metrics_csv null, or the TensorBoard logger)"
        )


def check_one_run_logger(cfg: Any) -> None:
    """A run is one folder: each logger Lightning documents numbers and writes its own folder (``CSVLogger`` beside
    the TensorBoard logger wrote ``metrics.csv`` into ``lightning_logs/version_N``, a second "run" every command
    listed), so a list of loggers is refused; the run's own files (``metrics.csv``, the TensorBoard events) come from
    the one logger and the run callbacks."""
    loggers = [lg for lg in _as_list(cfg.trainer.logger) if lg is not True]
    if len(loggers) > 1:
        names = ", ".join(str(getattr(lg, "class_path", lg)).rpartition(".")[2] for lg in loggers)
        raise ConfigError(
            f"trainer.logger: {len(loggers)} loggers ({names}) would each write the run into a folder of its own, "
            "where every command sees another run; keep one (the default TensorBoard logger writes the run folder; "
            "metrics.csv comes from the metrics_csv callback)"
        )


def check_profiler_in_run_folder(cfg: Any) -> None:
    """A profiler writes its reports into the run folder (``filename`` names them there); a ``dirpath`` elsewhere
    would leave part of the run outside it."""
    profiler = cfg.trainer.get("profiler")
    dirpath = getattr(getattr(profiler, "init_args", None), "dirpath", None)
    if dirpath is not None:
        raise ConfigError(
            f"trainer.profiler.init_args.dirpath: {dirpath}; a profiler writes its reports into the run folder, "
            "where the run's other files are: drop dirpath (filename names the report file there)"
        )


def check_throughput_kept(cfg: Any) -> None:
    """``throughput`` measures ``results.json``'s speed: it may change, not go."""
    if cfg.get("throughput") is None:
        raise ConfigError(
            "throughput: null removes the callback that measures results.json's train_samples_per_s and "
            "epoch_time_s; keep it or change it (its options: --throughput.help project.callbacks.Throughput)"
        )


def check_not_barebones(cfg: Any) -> None:
    """``trainer.barebones`` turns off ``self.log``, which fit's results are read from."""
    if cfg.trainer.barebones:
        raise ConfigError(
            "trainer.barebones: true turns off self.log, the metrics fit reports (test acc, results.json) are "
            "read from; for a quiet run use --trainer.enable_progress_bar false --trainer.enable_model_summary "
            "false, and python -m benchmarks.bench to time raw training steps"
        )


def check_trains_something(cfg: Any) -> None:
    """``limit_train_batches``, ``max_epochs`` or ``max_steps`` of 0 trains nothing."""
    for key in ("limit_train_batches", "max_epochs", "max_steps"):
        if cfg.trainer.get(key) == 0:
            raise ConfigError(f"trainer.{key}: 0 trains nothing; use a positive number")


def check_resume_keeps_checkpointing(cfg: Any) -> None:
    """A resume with checkpointing off would leave old checkpoints beside newer results."""
    if cfg.ckpt_path is not None and cfg.trainer.enable_checkpointing is False:
        raise ConfigError(
            "trainer.enable_checkpointing: false with ckpt_path: the resumed run would keep its old checkpoints "
            "beside newer results; resume with checkpointing on"
        )


def check_trainer_ranges(cfg: Any) -> None:
    """The Trainer settings of :data:`TRAINER_RANGES` are in range."""
    for key, (ok, allowed) in TRAINER_RANGES.items():
        value = cfg.trainer.get(key)
        if value is not None and not isinstance(value, bool) and not ok(value):
            raise ConfigError(f"trainer.{key}: {value!r} is out of range; use {allowed}")


def check_data_dir(cfg: Any) -> None:
    """``data.data_dir`` is a folder that can be read (and created)."""
    data_args = getattr(cfg.data, "init_args", None)
    if data_args is not None and data_args.get("data_dir") is not None:
        files.check_folder(data_args.data_dir, "data.data_dir", write=False)


def check_source_dir(cfg: Any) -> None:
    """fit: ``data.source_dir``, when given, is a folder, even when ``data_dir`` holds the data already (a mistyped
    folder should not pass unnoticed; the run-folder commands rebuild runs whose archives may be gone)."""
    data_args = getattr(cfg.data, "init_args", None)
    source = data_args.get("source_dir") if data_args is not None else None
    if source is not None and not Path(source).is_dir():
        raise ConfigError(f"data.source_dir: {source} is not a folder; give the folder holding the archives")


def _data_args(cfg: Any) -> Any:
    """The parsed ``data.init_args`` (a Namespace), or an empty dict when the data has none."""
    return getattr(cfg.data, "init_args", None) or {}


def check_fold_settings(cfg: Any) -> None:
    """K-fold cross-validation: ``data.folds`` (when set) is 2 or more and ``data.fold`` one of its folds; a
    ``data.fold`` other than 0 without ``data.folds`` is refused (it would be silently ignored)."""
    folds, fold = _data_args(cfg).get("folds"), _data_args(cfg).get("fold") or 0
    if folds is None and fold:
        raise ConfigError(f"data.fold: {fold} without data.folds; set data.folds to the number of folds (>= 2)")
    if folds is not None:
        check_folds(folds, fold)


def check_folds_without_val_size(cfg: Any) -> None:
    """With ``data.folds`` the validation images are a fold, so any ``data.val_size`` (even one equal to the
    default an unset one stands for) is refused rather than silently ignored."""
    args = _data_args(cfg)
    if args.get("folds") is not None and args.get("val_size") is not None:
        raise ConfigError(
            f"data.val_size: {args.get('val_size')} with data.folds: {args.get('folds')}; with folds each validation "
            "set is one fold (1/folds of the training images): drop data.val_size, or data.folds for a plain split"
        )


def check_no_twins(cfg: Any, twins: dict[str, type]) -> None:
    """A callback in ``trainer.callbacks`` of the class a run callback key (``lr_monitor``, ...) stands for would log
    the same tags or write the same files twice. ``twins``: run callback key -> that class."""
    extra = _as_list(cfg.trainer.get("callbacks"))
    for key, same in twins.items():
        twin = next((c for c in extra if _names_subclass(c, same)), None)
        if twin is not None and cfg.get(key) is not None:
            raise ConfigError(
                f"trainer.callbacks: {twin.class_path} does what the run's {key} callback does (the same tags or "
                f"files twice); keep one: drop it from trainer.callbacks, or --{key} null"
            )


def _written(args: Any, key: str, params: Any, first: bool = False) -> Any:
    """The optimizer's ``args[key]`` (its first element, with ``first``: Adam's ``betas[0]``) when it differs from the
    class's default (``params``: its signature's parameters), so the user or a config wrote it; else None."""
    value, default = args.get(key), getattr(params.get(key), "default", None)
    if first:
        value = value[0] if isinstance(value, list | tuple) and value else None
        default = default[0] if isinstance(default, tuple) else None
    return None if value is None or value == default else value


def check_scheduler_shadows(cfg: Any) -> None:
    """A value the learning-rate scheduler overwrites must agree with it, or it is refused: ``OneCycleLR`` (Smith &
    Topin 2017; ``torch.optim.lr_scheduler``) sets every step's learning rate from its ``max_lr`` (starting at
    ``max_lr / div_factor``) and, with ``cycle_momentum`` (its default), the optimizer's ``momentum`` or Adam's first
    ``beta`` from ``max_momentum`` down to ``base_momentum``. So an optimizer ``lr`` other than its class default or
    ``max_lr``, or a momentum other than its default or ``max_momentum``, would be written and never used."""
    model = cfg.get("model")
    sched = model.get("lr_scheduler") if model is not None else None
    opt = model.get("optimizer") if model is not None else None
    if sched is None or opt is None or not str(sched.get("class_path", "")).endswith(".OneCycleLR"):
        return
    module, _, name = str(opt.get("class_path", "")).rpartition(".")
    opt_cls = getattr(sys.modules.get(module), name, None)  # imported by the parser already; nothing is imported here
    if opt_cls is None:
        return
    s_args, o_args = sched.get("init_args") or {}, opt.get("init_args") or {}
    params = inspect.signature(opt_cls).parameters
    max_lr, lr = s_args.get("max_lr"), _written(o_args, "lr", params)
    if lr is not None and isinstance(max_lr, int | float) and not math.isclose(lr, max_lr, rel_tol=1e-9):
        raise ConfigError(
            f"model.optimizer.lr: {lr} is never used: OneCycleLR sets every step's learning rate from "
            f"model.lr_scheduler.max_lr ({max_lr}); set --model.lr_scheduler.max_lr {lr} instead (and leave the "
            "optimizer's lr out, or equal to it)"
        )
    if not s_args.get("cycle_momentum", True):
        return
    top, low = s_args.get("max_momentum", 0.95), s_args.get("base_momentum", 0.85)
    # SGD's and RMSprop's momentum, or Adam's first beta (a changed second beta alone: OneCycleLR leaves it)
    for what, momentum in (
        ("model.optimizer.momentum", _written(o_args, "momentum", params)),
        ("model.optimizer.betas[0]", _written(o_args, "betas", params, first=True)),
    ):
        if isinstance(momentum, int | float) and not math.isclose(momentum, top, rel_tol=1e-9):
            raise ConfigError(
                f"{what}: {momentum} is never used: OneCycleLR (cycle_momentum true) moves it from "
                f"model.lr_scheduler.max_momentum ({top}) to base_momentum ({low}) and back; set those, write "
                f"{top} here (its start), or --model.lr_scheduler.cycle_momentum false to keep {momentum}"
            )


# Steps that depend on this machine rather than on the config (a GPU present; the precision auto_precision picks
# for this machine): --print_config and a sweep's base leave them out (ProjectCLI.config_steps).
MACHINE_CHECKS: tuple[Callable[[Any], None], ...] = (check_gpu_present, settle_auto_precision)

# Every command's checks, in the order they run (then check_no_twins, check_trainer_ranges and the data folders).
CHECKS: tuple[Callable[[Any], None], ...] = (
    settle_user_paths,
    check_gpu_present,
    check_benchmark_vs_deterministic,
    settle_auto_precision,
    check_precision_available,
    settle_logger,
    check_checkpoint_io,
    check_one_metrics_csv,
    check_one_run_logger,
    check_profiler_in_run_folder,
    check_throughput_kept,
    check_not_barebones,
    check_trains_something,
    check_resume_keeps_checkpointing,
    check_fold_settings,
    check_folds_without_val_size,
    check_scheduler_shadows,
)
