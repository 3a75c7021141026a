"""The sweep file of ``python -m project.sweep``: what to train, what to search, how to judge.

A YAML mapping (read with the safe loader)::

    name: pruning                      # the study's name and the folder <save_dir>/<name>/ (default: file stem)
    base:                              # the experiment, as python -m project.fit takes it
      config: [configs/fashion_mnist.yaml, configs/pruning.yaml]
      args: [--trainer.max_epochs, "2"]
    space:                             # dotted keys of the resolved fit config (init_args may be left out;
      trainer.callbacks.0.init_args.amount: [0.0, 0.5, 0.9]          # list items by index): a grid list,
      model.optimizer.class_path: {categorical: [torch.optim.SGD, torch.optim.AdamW]}
      model.lr_scheduler.init_args.max_lr: {log_float: [0.0003, 0.3]}  # or {float: [lo, hi], step: s},
      data.init_args.batch_size: {int: [32, 256], step: 32}           # {int: [lo, hi], step: s}
    objective: {metric: test_acc, direction: maximize}   # a results.json metric (test_acc, best_val_acc, ...)
    seeds: [1, 2, 3]                   # each point runs once per seed (seed_everything)
    sampler: grid                      # grid (the whole product, queued once), random, tpe
    n_trials: 18                       # trials in all, seeds included (default for grid: the whole grid)
    pruner: {median: {n_startup_trials: 5}}   # any optuna.pruners.<Name>Pruner and its options, or none
    heartbeat_s: 20                    # a trial without heartbeat for 3 x heartbeat_s is failed and retried
    max_retry: 3                       # retries of a trial whose process died

Every check happens before anything is written; each failure is a :class:`~project.errors.ConfigError`
naming the key.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml

from project.errors import ConfigError, yaml_problem

SWEEP_KEYS = (
    "name",
    "base",
    "space",
    "objective",
    "seeds",
    "sampler",
    "sampler_seed",
    "n_trials",
    "pruner",
    "heartbeat_s",
    "max_retry",
)
METRICS = ("test_acc", "best_val_acc", "test_loss", "sparsity", "train_samples_per_s")
SAMPLERS = ("grid", "random", "tpe")
KINDS = ("categorical", "int", "float", "log_float")


@dataclass
class Param:
    """One searched dimension: ``key`` (dotted fit config key), ``kind`` (``grid`` or one of :data:`KINDS`)."""

    key: str
    kind: str
    values: list[Any] = field(default_factory=list)
    low: float = 0.0
    high: float = 0.0
    step: float | None = None

    def grid(self) -> list[Any]:
        """The values a grid sampler visits (an ``int`` range is expanded by its step)."""
        if self.kind in ("grid", "categorical"):
            return list(self.values)
        if self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        raise ConfigError(f"space.{self.key}: a {self.kind} range has no grid; give a list of values instead")

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.kind in ("grid", "categorical"):
            return trial.suggest_categorical(self.key, self.values)
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=int(self.step or 1))
        return trial.suggest_float(self.key, self.low, self.high, step=self.step, log=self.kind == "log_float")


@dataclass
class Sweep:
    """A parsed sweep file (see :func:`load_sweep`)."""

    name: str
    configs: list[str]
    args: list[str]
    space: list[Param]
    metric: str = "test_acc"
    direction: str = "maximize"
    seeds: list[int] = field(default_factory=lambda: [42])
    sampler: str = "grid"
    sampler_seed: int = 0
    n_trials: int | None = None
    pruner: dict[str, dict[str, Any]] = field(default_factory=dict)
    heartbeat_s: float = 20.0
    max_retry: int = 3

    def points(self) -> list[dict[str, Any]]:
        """Grid sampler: every combination of the grids, once per seed, seed by seed: the first trials cover the
        whole grid with the first seed, so a sweep stopped early (or ``n_trials`` below the total) still spans it."""
        combos: list[dict[str, Any]] = [{}]
        for p in self.space:
            combos = [{**c, p.key: v} for c in combos for v in p.grid()]
        return [{**c, "seed": s} for s in self.seeds for c in combos]

    def total(self) -> int:
        """The number of trials the sweep runs (``n_trials``, or the whole grid)."""
        if self.sampler == "grid":
            size = len(self.points())
            return min(size, self.n_trials) if self.n_trials else size
        return int(self.n_trials or 0)

    def identity(self) -> dict[str, Any]:
        """What a study must have been created with to be continued by this sweep file."""
        space = {p.key: [p.kind, p.values, p.low, p.high, p.step] for p in self.space}
        return {
            "space": space,
            "seeds": self.seeds,
            "metric": self.metric,
            "direction": self.direction,
            "sampler": self.sampler,
        }


def _param(key: str, spec: Any) -> Param:
    where = f"space.{key}"
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{where}: an empty grid; list at least one value")
        return Param(key, "grid", values=spec)
    if not isinstance(spec, dict) or len(set(spec) - {"step"}) != 1:
        raise ConfigError(
            f"{where}: {spec!r} is not a distribution; use a list (grid) or one of "
            "{categorical: [...]}, {int: [lo, hi]}, {float: [lo, hi]}, {log_float: [lo, hi]} (optional step)"
        )
    (kind,) = set(spec) - {"step"}
    if kind not in KINDS:
        raise ConfigError(f"{where}: unknown distribution {kind!r}; use one of {', '.join(KINDS)} or a list (grid)")
    value, step = spec[kind], spec.get("step")
    if kind == "categorical":
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{where}: categorical needs a non-empty list of choices")
        return Param(key, kind, values=value)
    ok = isinstance(value, list) and len(value) == 2 and all(isinstance(v, int | float) for v in value)
    if not ok or not value[0] < value[1]:
        raise ConfigError(f"{where}: {kind} needs [low, high] with low < high, got {value!r}")
    if kind == "log_float" and (value[0] <= 0 or step is not None):
        raise ConfigError(f"{where}: log_float needs low > 0 and no step")
    if kind == "int" and not all(isinstance(v, int) for v in [*value, step or 1]):
        raise ConfigError(f"{where}: int needs integer low, high and step")
    if step is not None and (not isinstance(step, int | float) or step <= 0):
        raise ConfigError(f"{where}: step must be a positive number, got {step!r}")
    return Param(key, kind, low=value[0], high=value[1], step=step)


def load_sweep(path: Path, n_trials: int | None = None) -> Sweep:
    """Read and check a sweep file (YAML, safe loader).

    Raises:
        ConfigError: unreadable file, unknown key, bad distribution, sampler, objective, seeds or numbers.
    """
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"--config: {yaml_problem(path, e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--config: cannot read {path} ({type(e).__name__})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a sweep file is a mapping with keys {', '.join(SWEEP_KEYS)}")
    unknown = sorted(set(raw) - set(SWEEP_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}; a sweep file has {', '.join(SWEEP_KEYS)}")
    base = raw.get("base") or {}
    if not isinstance(base, dict) or set(base) - {"config", "args"}:
        raise ConfigError(f"{path}: base: takes config (fit --config files) and args (a list of fit arguments)")
    configs = base.get("config") or []
    configs = [configs] if isinstance(configs, str) else configs
    args = base.get("args") or []
    if not isinstance(args, list):
        raise ConfigError(f"{path}: base.args: a list of fit arguments, e.g. ['--trainer.max_epochs', '2']")
    space = raw.get("space")
    if not isinstance(space, dict) or not space:
        raise ConfigError(f"{path}: space: map at least one dotted fit config key to a distribution or a list")
    objective = raw.get("objective") or {}
    objective = {"metric": objective} if isinstance(objective, str) else objective
    if not isinstance(objective, dict) or set(objective) - {"metric", "direction"}:
        raise ConfigError(f"{path}: objective: takes metric and direction")
    metric, direction = objective.get("metric", "test_acc"), objective.get("direction", "maximize")
    if metric not in METRICS:
        raise ConfigError(f"objective.metric: {metric!r} is not a results.json metric; use one of {', '.join(METRICS)}")
    if direction not in ("maximize", "minimize"):
        raise ConfigError(f"objective.direction: {direction!r}; use maximize or minimize")
    seeds = raw.get("seeds", [42])
    seeds = [seeds] if isinstance(seeds, int) else seeds
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(type(s) is int for s in seeds)
        or len(set(seeds)) < len(seeds)
    ):
        raise ConfigError(f"seeds: {seeds!r}; give a list of distinct integers")
    sampler = raw.get("sampler", "grid")
    if sampler not in SAMPLERS:
        raise ConfigError(f"sampler: {sampler!r} is not one of {', '.join(SAMPLERS)}")
    n_trials = n_trials if n_trials is not None else raw.get("n_trials")
    if n_trials is not None and (type(n_trials) is not int or n_trials < 1):
        raise ConfigError(f"n_trials: {n_trials!r}; give a positive integer")
    if sampler != "grid" and n_trials is None:
        raise ConfigError(f"n_trials: the {sampler} sampler needs n_trials (in the sweep file or --n_trials)")
    pruner = raw.get("pruner") or {}
    pruner = {pruner: {}} if isinstance(pruner, str) else pruner
    if not isinstance(pruner, dict) or len(pruner) > 1:
        raise ConfigError(f"pruner: {pruner!r}; give one of median, percentile, threshold, none with its options")
    sweep = Sweep(
        name=str(raw.get("name") or path.stem),
        configs=[str(c) for c in configs],
        args=[str(a) for a in args],
        space=[_param(str(k), v) for k, v in space.items()],
        metric=metric,
        direction=direction,
        seeds=seeds,
        sampler=sampler,
        sampler_seed=int(raw.get("sampler_seed", 0)),
        n_trials=n_trials,
        pruner={k: v or {} for k, v in pruner.items() if k != "none"},
        heartbeat_s=float(raw.get("heartbeat_s", 20.0)),
        max_retry=int(raw.get("max_retry", 3)),
    )
    if "seed" in (p.key for p in sweep.space):
        raise ConfigError("space.seed: list the seeds under seeds:, not in the space")
    if sweep.sampler == "grid":
        sweep.points()  # every dimension must have a grid
    make_pruner(sweep.pruner)
    if not sweep.heartbeat_s > 0 or sweep.max_retry < 0:
        raise ConfigError("heartbeat_s must be > 0 and max_retry >= 0")
    return sweep


def make_pruner(spec: dict[str, dict[str, Any]]) -> optuna.pruners.BasePruner:
    """Optuna's ``<Name>Pruner(**options)`` from the sweep file's ``pruner: {name: {options}}`` (``{}``: none).

    Raises:
        ConfigError: unknown pruner or option.
    """
    if not spec:
        return optuna.pruners.NopPruner()
    ((name, options),) = spec.items()
    cls = getattr(optuna.pruners, f"{str(name).capitalize()}Pruner", None)
    if cls is None or name in ("nop", "base"):
        raise ConfigError(f"pruner: unknown pruner {name!r}; use median, percentile, threshold, hyperband or none")
    try:
        return cls(**options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"pruner.{name}: {e}") from None


def resolve_base(sweep: Sweep, extra: list[str]) -> dict[str, Any]:
    """The base experiment's full config, as ``python -m project.fit ... --print_config`` resolves it.

    Raises:
        ConfigError: the base config does not parse (the fit error, on one line).
    """
    from jsonargparse import ArgumentError

    from project.cli import ProjectCLI, explain_parse_error

    args = [a for c in sweep.configs for a in ("--config", c)] + sweep.args + extra
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            ProjectCLI([*args, "--print_config"])
    except SystemExit as e:
        if e.code not in (0, None):
            raise ConfigError(f"base: the fit arguments do not parse ({' '.join(args)})") from None
    except (ArgumentError, ValueError) as e:
        raise ConfigError(f"base: {explain_parse_error(str(e))}") from None
    config = yaml.safe_load(out.getvalue())
    if not isinstance(config, dict):
        raise ConfigError(f"base: the fit arguments do not resolve to a config ({' '.join(args)})")
    logger = (config.get("trainer") or {}).get("logger") or {}
    if "TensorBoardLogger" not in str(logger.get("class_path")):
        raise ConfigError("base: trials need the TensorBoard logger (trainer.logger); do not switch it off")
    for key in ("ckpt_path", "print_config"):
        config.pop(key, None)
    return config


def check_objective(sweep: Sweep, base: dict[str, Any]) -> None:
    """Refuse an objective the base experiment cannot produce: ``best_val_acc`` (the checkpoint callback's best
    ``val/acc``) without validation or without checkpointing is ``null`` in every trial's ``results.json``.

    What this cannot see (a swept key that turns validation off, a NaN loss) fails that trial with one line.

    Raises:
        ConfigError: naming the setting and what to do.
    """
    trainer = base.get("trainer") or {}
    if sweep.metric != "best_val_acc":
        return
    why = None
    if trainer.get("limit_val_batches") in (0, 0.0):
        why = "trainer.limit_val_batches is 0 (no validation)"
    elif trainer.get("enable_checkpointing") is False:
        why = "trainer.enable_checkpointing is false (the best val/acc is the checkpoint callback's)"
    elif (trainer.get("max_epochs") or 0) > 0 and (trainer.get("check_val_every_n_epoch") or 1) > trainer["max_epochs"]:
        why = f"trainer.check_val_every_n_epoch is beyond trainer.max_epochs {trainer['max_epochs']} (no validation)"
    if why:
        raise ConfigError(
            f"objective.metric: best_val_acc is never measured: {why}; validate and checkpoint, or choose another "
            "objective (test_acc)"
        )


def key_path(config: dict[str, Any], key: str) -> tuple[Any, Any]:
    """The container holding dotted ``key`` and the last part (an int for list items).

    ``init_args`` may be left out (``model.optimizer.lr`` means ``model.optimizer.init_args.lr``).

    Raises:
        ConfigError: no such key in the resolved config.
    """
    node, parts = config, key.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"space.{key}: {'.'.join(parts[:i])} is a list of {len(node)}; use an index")
            if last:
                return node, int(part)
            node = node[int(part)]
            continue
        if isinstance(node, dict) and part not in node and isinstance(node.get("init_args"), dict):
            node = node["init_args"]
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(
                f"space.{key}: no such key in the base experiment's config (see python -m project.fit ... "
                "--print_config)"
            )
        if last:
            return node, part
        node = node[part]
    raise ConfigError(f"space.{key}: empty key")


def trial_config(
    base: dict[str, Any], params: dict[str, Any], seed: int, save_dir: str, name: str, version: int
) -> dict[str, Any]:
    """The base config with the trial's values, seed, run folder and :class:`ReportToStudy` callback.

    Setting a ``class_path`` keeps only the ``init_args`` the new class accepts (AdamW's ``betas`` do not
    go to SGD).
    """
    config = copy.deepcopy(base)
    for key, value in params.items():
        node, part = key_path(config, key)
        node[part] = value
        if part == "class_path" and isinstance(node.get("init_args"), dict):
            module, _, cls = str(value).rpartition(".")
            accepted = inspect.signature(getattr(importlib.import_module(module), cls)).parameters
            node["init_args"] = {k: v for k, v in node["init_args"].items() if k in accepted}
    config["seed_everything"] = seed
    logger = config["trainer"]["logger"]["init_args"]
    logger.update(save_dir=save_dir, name=name, version=version)
    callbacks = config["trainer"].get("callbacks") or []
    callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
    config["trainer"]["callbacks"] = [*callbacks, {"class_path": "project.sweep.ReportToStudy"}]
    return config
