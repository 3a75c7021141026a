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
    folds: 5                           # K-fold cross-validation: each point (x seed) runs every fold as a trial
    sampler: grid                      # grid (the whole product, queued once), random, tpe
    n_trials: 18                       # trials in all, seeds included (default for grid: the whole grid)
    pruner: {median: {n_startup_trials: 5}}   # any optuna.pruners.<Name>Pruner and its options, or none
    heartbeat_s: 20                    # a trial without heartbeat for 3 x heartbeat_s is failed and retried
    max_retry: 3                       # retries of a trial whose process died

jsonargparse parses the file against :class:`SweepFile` (``Literal`` choices, ``PositiveInt``, ``PositiveFloat``,
one typed mapping per distribution), so a misspelled key, a wrong type or a value out of range is one
:class:`~project.errors.ConfigError` naming the file, the key and what it takes. The checks across keys follow
(low < high, a grid for every dimension, distinct seeds, a pruner Optuna has). Everything is checked before
anything is written.

``folds: K`` (>= 2) makes each point a K-fold cross-validation: every fold (``data.folds: K``, ``data.fold: k``;
:mod:`project.data.folds`) of every seed is one trial, and the report scores a point by the mean over its folds.
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Literal, NotRequired, TypedDict, get_args, get_origin, get_type_hints

import optuna
import yaml
from jsonargparse import ArgumentError, ArgumentParser
from jsonargparse.typing import NonNegativeInt, PositiveFloat, PositiveInt

from project.errors import ConfigError, yaml_problem

Metric = Literal["test_acc", "best_val_acc", "test_loss", "sparsity", "train_samples_per_s"]
Sampler = Literal["grid", "random", "tpe"]

# The distributions of ``space`` as YAML writes them (a plain list is a grid); functional syntax, since two keys
# are the names of builtins
Categorical = TypedDict("Categorical", {"categorical": list[Any]})  # noqa: UP013
IntRange = TypedDict("IntRange", {"int": tuple[int, int], "step": NotRequired[PositiveInt]})  # noqa: UP013
FloatRange = TypedDict("FloatRange", {"float": tuple[float, float], "step": NotRequired[PositiveFloat]})  # noqa: UP013
LogFloatRange = TypedDict("LogFloatRange", {"log_float": tuple[PositiveFloat, PositiveFloat]})  # noqa: UP013
Distribution = list[Any] | Categorical | IntRange | FloatRange | LogFloatRange
KINDS = {"categorical": Categorical, "int": IntRange, "float": FloatRange, "log_float": LogFloatRange}
KIND_HELP = {
    "categorical": "categorical needs a non-empty list of choices",
    "int": "int needs [low, high] integers with low < high and an optional integer step > 0",
    "float": "float needs [low, high] numbers with low < high and an optional step > 0",
    "log_float": "log_float needs low > 0, [low, high] with low < high and no step",
}
DISTRIBUTIONS = (
    "a list (grid) or one of {categorical: [...]}, {int: [lo, hi]}, {float: [lo, hi]}, "
    "{log_float: [lo, hi]} (optional step)"
)


@dataclass
class Base:
    """``base:``, the experiment as ``python -m project.fit`` takes it."""

    config: list[str] = field(default_factory=list, metadata={"help": "fit --config files (a path or a list)"})
    args: list[str] = field(
        default_factory=list, metadata={"help": "a list of fit arguments, e.g. ['--trainer.max_epochs', '2']"}
    )


@dataclass
class Objective:
    """``objective:``, a ``results.json`` metric and its direction (``objective: test_acc`` names the metric)."""

    metric: Metric = "test_acc"
    direction: Literal["maximize", "minimize"] = "maximize"


@dataclass
class SweepFile:
    """The keys of a sweep file and their types (see the module doc): what jsonargparse parses a file against."""

    space: dict[str, Distribution] = field(
        metadata={"help": "a mapping of dotted fit config keys to distributions or lists"}
    )
    name: str | None = None
    base: Base = field(default_factory=Base)
    objective: Objective = field(default_factory=Objective)
    seeds: list[int] = field(default_factory=lambda: [42], metadata={"help": "a list of distinct integers"})
    folds: PositiveInt | None = field(default=None, metadata={"help": "a number of folds >= 2, or null"})
    sampler: Sampler = "grid"
    sampler_seed: int = 0
    n_trials: PositiveInt | None = None
    pruner: str | dict[str, dict[str, Any] | None] = field(
        default="none", metadata={"help": "median, percentile, threshold, hyperband or none, or {name: {options}}"}
    )
    heartbeat_s: PositiveFloat = 20.0
    max_retry: NonNegativeInt = 3


SWEEP_KEYS = tuple(f.name for f in fields(SweepFile))


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
    folds: int | None = None
    sampler: str = "grid"
    sampler_seed: int = 0
    n_trials: int | None = None
    pruner: dict[str, dict[str, Any]] = field(default_factory=dict)
    heartbeat_s: float = 20.0
    max_retry: int = 3

    def repeats(self) -> list[dict[str, int]]:
        """The trials one point runs: ``{"seed": s}`` per seed, times ``{"fold": k}`` per fold with ``folds``."""
        folds: list[dict[str, int]] = [{"fold": k} for k in range(self.folds)] if self.folds else [{}]
        return [{"seed": s, **f} for s in self.seeds for f in folds]

    def points(self) -> list[dict[str, Any]]:
        """Grid sampler: every combination of the grids, once per seed (and fold), seed by seed: the first trials
        cover the whole grid with the first seed, so a sweep stopped early (or ``n_trials`` below the total) still
        spans it; a point's folds follow each other, so its cross-validation is complete early."""
        combos: list[dict[str, Any]] = [{}]
        for p in self.space:
            combos = [{**c, p.key: v} for c in combos for v in p.grid()]
        folds: list[dict[str, int]] = [{"fold": k} for k in range(self.folds)] if self.folds else [{}]
        return [{**c, "seed": s, **f} for s in self.seeds for c in combos for f in folds]

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
        } | ({"folds": self.folds} if self.folds else {})


WORDS = {
    int: "an integer",
    float: "a number",
    str: "a string",
    NoneType: "null",
    PositiveInt: "an integer > 0",
    PositiveFloat: "a number > 0",
    NonNegativeInt: "an integer >= 0",
}


def _allowed(hint: Any) -> str:
    """What a type annotation takes, in words (``one of grid, random, tpe``, ``an integer > 0 or null``)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(map(str, args))
    if origin is UnionType:
        return " or ".join(_allowed(a) for a in args)
    if origin is list:
        return f"a list ({_allowed(args[0])} each)"
    if origin is dict:
        return "a mapping"
    return WORDS.get(hint, getattr(hint, "__name__", str(hint)))


def _fits(hint: Any, value: Any) -> bool:
    """Whether jsonargparse takes ``value`` as a ``hint``."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--value", type=hint)
    try:
        parser.parse_object({"value": copy.deepcopy(value)})
    except ArgumentError:
        return False
    return True


def _problem(key: str, value: Any, hint: Any, allowed: str | None = None) -> str | None:
    """What is wrong with ``value`` as a ``hint`` found at ``key``, as ``"<key>: <what>; <what it takes>"``, or
    None. A section (a dataclass) is gone through key by key, each value checked by jsonargparse."""
    if is_dataclass(hint):
        names = [f.name for f in fields(hint)]
        if not isinstance(value, dict):
            return f"{key or 'a sweep file'}: {value!r} is not a mapping; it takes {', '.join(names)}"
        hints, helps = get_type_hints(hint), {f.name: f.metadata.get("help") for f in fields(hint)}
        for k, v in value.items():
            if k not in hints:
                return f"{key + ': ' if key else ''}unknown key {k!r}; {key or 'a sweep file'} takes {', '.join(names)}"
            if problem := _problem(f"{key}.{k}" if key else k, v, hints[k], helps[k]):
                return problem
        for f in fields(hint):
            if f.default is MISSING and f.default_factory is MISSING and f.name not in value:
                return f"{key + '.' if key else ''}{f.name}: missing; give {helps[f.name] or _allowed(hints[f.name])}"
        return None
    if hint is Distribution and isinstance(value, dict):
        kinds = sorted(map(str, set(value) - {"step"}))
        if len(kinds) != 1:
            return f"{key}: {value!r} is not one distribution; use {DISTRIBUTIONS}"
        if kinds[0] not in KINDS:
            return f"{key}: unknown distribution {kinds[0]!r}; use {DISTRIBUTIONS}"
        return None if _fits(KINDS[kinds[0]], value) else f"{key}: {value!r}: {KIND_HELP[kinds[0]]}"
    if hint is Distribution:
        return None if isinstance(value, list) else f"{key}: {value!r} is not a distribution; use {DISTRIBUTIONS}"
    if get_origin(hint) is dict and isinstance(value, dict):
        return next(filter(None, (_problem(f"{key}.{k}", v, get_args(hint)[1]) for k, v in value.items())), None)
    return None if _fits(hint, value) else f"{key}: {value!r} is not {allowed or _allowed(hint)}"


def _param(key: str, spec: list[Any] | dict[str, Any]) -> Param:
    """A parsed ``space`` entry as a :class:`Param`; checks what its type cannot say (non-empty, low < high)."""
    where = f"space.{key}"
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{where}: an empty grid; list at least one value")
        return Param(key, "grid", values=spec)
    ((kind, value),) = ((k, v) for k, v in spec.items() if k != "step")
    if kind == "categorical":
        if not value:
            raise ConfigError(f"{where}: {KIND_HELP[kind]}")
        return Param(key, kind, values=list(value))
    if not value[0] < value[1]:
        raise ConfigError(f"{where}: {KIND_HELP[kind]}, got {list(value)!r}")
    return Param(key, kind, low=value[0], high=value[1], step=spec.get("step"))


def load_sweep(path: Path, n_trials: int | None = None) -> Sweep:
    """Read and check a sweep file (YAML, safe loader; parsed by jsonargparse against :class:`SweepFile`).

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
    raw = copy.deepcopy(raw)  # shorthands: a metric for objective, one seed, one base config
    if isinstance(raw.get("objective"), str):
        raw["objective"] = {"metric": raw["objective"]}
    if isinstance(raw.get("seeds"), int) and not isinstance(raw["seeds"], bool):
        raw["seeds"] = [raw["seeds"]]
    if isinstance(raw.get("base"), dict) and isinstance(raw["base"].get("config"), str):
        raw["base"]["config"] = [raw["base"]["config"]]
    raw = {k: v for k, v in raw.items() if v is not None or k in ("name", "n_trials")}  # ``key:`` left empty
    if n_trials is not None:
        raw["n_trials"] = n_trials
    if problem := _problem("", raw, SweepFile):
        raise ConfigError(f"{path}: {problem}")
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(SweepFile)
    try:
        spec = parser.instantiate(parser.parse_object(raw))
    except ArgumentError as e:  # what the key-by-key check did not find: jsonargparse's own first line
        raise ConfigError(f"{path}: {str(e).strip().splitlines()[0]}") from None
    try:
        return _sweep(spec, path.stem)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def _sweep(spec: Any, stem: str) -> Sweep:
    """The :class:`Sweep` of a parsed file, after the checks across keys its types cannot express."""
    if not spec.space:
        raise ConfigError("space: map at least one dotted fit config key to a distribution or a list")
    if not spec.seeds or len(set(spec.seeds)) < len(spec.seeds):
        raise ConfigError(f"seeds: {spec.seeds!r}; give a list of distinct integers")
    if spec.sampler != "grid" and spec.n_trials is None:
        raise ConfigError(f"n_trials: the {spec.sampler} sampler needs n_trials (in the sweep file or --n_trials)")
    pruner = {spec.pruner: {}} if isinstance(spec.pruner, str) else spec.pruner
    if len(pruner) != 1:
        raise ConfigError(f"pruner: {pruner!r}; give one of median, percentile, threshold, none with its options")
    sweep = Sweep(
        name=str(spec.name or stem),
        configs=list(spec.base.config),
        args=list(spec.base.args),
        space=[_param(str(k), v) for k, v in spec.space.items()],
        metric=spec.objective.metric,
        direction=spec.objective.direction,
        seeds=list(spec.seeds),
        folds=int(spec.folds) if spec.folds is not None else None,  # a plain int (PositiveInt does not dump)
        sampler=spec.sampler,
        sampler_seed=spec.sampler_seed,
        n_trials=spec.n_trials,
        pruner={k: v or {} for k, v in pruner.items() if k != "none"},
        heartbeat_s=float(spec.heartbeat_s),
        max_retry=spec.max_retry,
    )
    if "seed" in (p.key for p in sweep.space):
        raise ConfigError("space.seed: list the seeds under seeds:, not in the space")
    for p in sweep.space:
        if p.key.startswith("data.") and p.key.rsplit(".", 1)[-1] in ("fold", "folds"):
            raise ConfigError(f"space.{p.key}: give the number of folds as folds: K; each point then runs every fold")
    if sweep.folds is not None and sweep.folds < 2:
        raise ConfigError(f"folds: {sweep.folds} is not a cross-validation; give 2 or more folds, or leave it out")
    if sweep.folds is not None and "hyperband" in sweep.pruner:
        raise ConfigError(
            "pruner: hyperband compares trials in brackets of its own, across folds; with folds use median, "
            "percentile, wilcoxon or threshold, which compare a fold with the same fold"
        )
    if sweep.sampler == "grid":
        sweep.points()  # every dimension must have a grid
    make_pruner(sweep.pruner)
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
