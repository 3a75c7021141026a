"""``python -m project.sweep --config configs/sweeps/<name>.yaml [--storage URL] [--n_trials N] [--workers K]``.

A sweep is an Optuna study whose trials are ordinary ``python -m project.fit`` runs, one subprocess each::

    python -m project.sweep --config configs/sweeps/pruning.yaml --data.source_dir /usr/share/datasets/fashion-mnist
    python -m project.sweep --config configs/sweeps/lr.yaml --workers 2
    python -m project.sweep --config configs/sweeps/lr.yaml --storage postgresql://user:pw@db/sweeps   # many machines
    python -m project.sweep --config configs/sweeps/lr.yaml --report          # tables and plots, at any time

Arguments after the sweep's own options are fit overrides added to the sweep file's base experiment.

* The sweep file (:func:`load_sweep`): ``base`` (fit's ``config`` files and ``args``), ``space`` (dotted keys
  of the resolved fit config -> a grid list, ``{categorical: [...]}``, ``{int: [lo, hi], step}``,
  ``{float: [lo, hi], step}``, ``{log_float: [lo, hi]}``), ``objective`` (a ``results.json`` metric and its
  direction), ``seeds`` (each point runs once per seed), ``sampler`` (``grid``, ``random``, ``tpe``),
  ``n_trials``, ``pruner``, ``heartbeat_s``, ``max_retry``.
* Each trial trains in ``<save_dir>/<name>/version_<n>/`` (``n``: the number of the trial that first ran the
  point), a complete run folder plus ``trial.json`` (trial numbers, parameters, seed, state, value).
* Storage: ``sqlite:///<save_dir>/<name>/study.db`` unless ``--storage`` names another Optuna RDB URL.
  Running the same command again continues the study. Grid points (× seeds) are enqueued once by the
  process that creates the study; a worker only takes queued trials (Optuna pops each one atomically), so no
  point runs twice. A worker that dies stops sending heartbeats; after ``3 × heartbeat_s`` its trial is
  failed and re-queued (Optuna's ``RetryHeartbeatStaleTrialCallback``) and the retry resumes the run folder
  from its ``last.ckpt``.
* Bad trials are stopped early by the study's pruner on ``val/acc`` each epoch (:class:`ReportToStudy`).

Exit status: 0 done, 2 bad sweep file or option (one ``error:`` line, nothing written), 1 a worker failed.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import inspect
import io
import json
import math
import os
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import optuna
import yaml
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from project import runs
from project.errors import ConfigError

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
TRIAL_FILE = "trial.json"
TRIAL_CONFIG = "sweep-trial.yaml"
PRUNED_FILE = "pruned.json"
ENV_STORAGE, ENV_STUDY, ENV_TRIAL = "PROJECT_SWEEP_STORAGE", "PROJECT_SWEEP_STUDY", "PROJECT_SWEEP_TRIAL"


@contextlib.contextmanager
def _stable() -> Iterator[None]:
    """Optuna marks the heartbeat helpers (there since 2.8/2.9) experimental: silenced around their calls only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


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
        """Grid sampler: every combination of the grids, seed last (so the first N trials are whole points)."""
        combos: list[dict[str, Any]] = [{}]
        for p in self.space:
            combos = [{**c, p.key: v} for c in combos for v in p.grid()]
        return [{**c, "seed": s} for c in combos for s in self.seeds]

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
    except (OSError, yaml.YAMLError) as e:
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
    make_pruner(sweep)
    if not sweep.heartbeat_s > 0 or sweep.max_retry < 0:
        raise ConfigError("heartbeat_s must be > 0 and max_retry >= 0")
    return sweep


def make_pruner(sweep: Sweep) -> optuna.pruners.BasePruner:
    """Optuna's ``<Name>Pruner(**options)`` from the sweep file's ``pruner: {name: {options}}``.

    Raises:
        ConfigError: unknown pruner or option.
    """
    if not sweep.pruner:
        return optuna.pruners.NopPruner()
    ((name, options),) = sweep.pruner.items()
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


def _path(config: dict[str, Any], key: str) -> tuple[Any, Any]:
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
        node, part = _path(config, key)
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


def _sqlite_serializable(storage: RDBStorage) -> None:
    """Make every SQLite transaction of ``storage`` ``BEGIN IMMEDIATE``.

    pysqlite starts a transaction only at the first write, so Optuna's ``SELECT ... FOR UPDATE`` then
    ``UPDATE`` (how a worker takes a queued trial) would not be atomic across processes on SQLite. This is
    SQLAlchemy's documented recipe for serializable pysqlite, applied once Optuna has set up its tables.
    """
    from sqlalchemy import event

    engine = storage.engine
    if engine.dialect.name != "sqlite":
        return

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened before the listeners: closed, reopened with them


def open_storage(url: str, heartbeat_s: float | None = None, max_retry: int = 3) -> RDBStorage:
    """Optuna's RDB storage at ``url`` (SQLite: serializable, 60 s lock timeout), with heartbeats when given."""
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    with _stable():
        storage = _rdb(url, engine_kwargs, heartbeat_s, max_retry)
    _sqlite_serializable(storage)
    return storage


def _rdb(url: str, engine_kwargs: dict[str, Any], heartbeat_s: float | None, max_retry: int) -> RDBStorage:
    kwargs: dict[str, Any] = {}
    if heartbeat_s:
        kwargs = {
            "heartbeat_interval": max(1, round(heartbeat_s)),
            "grace_period": max(2, round(3 * heartbeat_s)),
            "heartbeat_stale_trial_callback": RetryHeartbeatStaleTrialCallback(max_retry=max_retry),
        }
    return RDBStorage(url, engine_kwargs=engine_kwargs, **kwargs)


class ReportToStudy(L.Callback):
    """Report ``val/acc`` (``val/loss`` when the objective is minimized) to the sweep's trial each epoch and
    stop the run when Optuna's pruner says so (writing ``pruned.json`` into the run folder).

    Inert outside a sweep: it acts only when ``python -m project.sweep`` sets ``PROJECT_SWEEP_STORAGE``,
    ``PROJECT_SWEEP_STUDY`` and ``PROJECT_SWEEP_TRIAL`` in the trial's environment, so rebuilding a trial's
    run (evaluate, predict, a resume by hand) never touches the study. What optuna-integration's
    ``PyTorchLightningPruningCallback`` does, except that the run finishes cleanly (tested, results written)
    instead of raising out of ``fit``.
    """

    def __init__(self) -> None:
        self.trial: optuna.Trial | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or not os.environ.get(ENV_STORAGE) or not trainer.is_global_zero:
            return
        study = optuna.load_study(study_name=os.environ[ENV_STUDY], storage=open_storage(os.environ[ENV_STORAGE]))
        trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, int(os.environ[ENV_TRIAL]))
        self.trial = optuna.Trial(study, trial_id)
        self.monitor = "val/acc" if study.direction == optuna.study.StudyDirection.MAXIMIZE else "val/loss"

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.trial is None or trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        value, epoch = float(trainer.callback_metrics[self.monitor]), trainer.current_epoch
        self.trial.report(value, step=epoch)
        if self.trial.should_prune() and trainer.log_dir is not None:
            record = {"trial": self.trial.number, "epoch": epoch, self.monitor: value}
            runs.write_json(Path(trainer.log_dir) / PRUNED_FILE, record)
            print(f"trial {self.trial.number} pruned after epoch {epoch} ({self.monitor} {value:.4f})", flush=True)
            trainer.should_stop = True


class Surplus(Exception):
    """A grid trial that found the queue empty (another worker took the last point): it runs nothing."""


class TrialFailed(Exception):
    """The trial's fit exited with an error (recorded in ``trial.json``); the sweep goes on."""


@dataclass
class Context:
    sweep: Sweep
    base: dict[str, Any]
    storage_url: str
    folder: Path
    extra: list[str]


def sweep_folder(sweep: Sweep, base: dict[str, Any]) -> Path:
    """``<save_dir>/<name>``: the base logger's ``save_dir`` (default ``logs``) and the sweep's name."""
    return Path(base["trainer"]["logger"]["init_args"].get("save_dir") or "logs", sweep.name)


def default_storage(folder: Path) -> str:
    return f"sqlite:///{folder.resolve() / 'study.db'}"


def load_or_create_study(ctx: Context, create: bool) -> optuna.Study:
    """Load the sweep's study; with ``create``, create it first (enqueueing a grid's points) if it is new.

    Raises:
        ConfigError: the storage holds a study of this name made from another sweep file or base config.
    """
    sweep = ctx.sweep
    storage = open_storage(ctx.storage_url, sweep.heartbeat_s, sweep.max_retry)
    sampler: optuna.samplers.BaseSampler
    if sweep.sampler == "tpe":
        sampler = optuna.samplers.TPESampler(seed=sweep.sampler_seed)
    elif sweep.sampler == "random":
        sampler = optuna.samplers.RandomSampler(seed=sweep.sampler_seed)
    else:
        space = {p.key: p.grid() for p in sweep.space} | {"seed": sweep.seeds}
        sampler = optuna.samplers.GridSampler(space, seed=sweep.sampler_seed)
    kwargs = {"study_name": sweep.name, "storage": storage, "sampler": sampler, "pruner": make_pruner(sweep)}
    identity = json.loads(json.dumps({**sweep.identity(), "base": ctx.base}))
    if create:
        try:
            study = optuna.create_study(direction=sweep.direction, load_if_exists=False, **kwargs)
        except optuna.exceptions.DuplicatedStudyError:
            pass
        else:
            study.set_user_attr("sweep", identity)
            if sweep.sampler == "grid":
                for point in sweep.points()[: sweep.total()]:
                    study.enqueue_trial(point, skip_if_exists=False)
            study.set_user_attr("ready", True)
            return study
    try:
        study = optuna.load_study(**kwargs)
    except KeyError:
        raise ConfigError(f"no study {sweep.name!r} in {ctx.storage_url}; run the sweep first") from None
    for _ in range(600):
        if study.user_attrs.get("ready"):
            break
        time.sleep(0.1)  # another worker is still enqueueing the grid
    else:
        raise ConfigError(f"study {sweep.name!r} in {ctx.storage_url} was never completely set up; delete it")
    if study.user_attrs.get("sweep") != identity:
        raise ConfigError(
            f"study {sweep.name!r} in {ctx.storage_url} was created from another sweep file or base config; "
            "change the sweep's name or --storage, or run it with its original settings"
        )
    return study


def _state_of(trial: Any) -> str:
    return trial.state.name.lower()


def run_trial(ctx: Context, study: optuna.Study, trial: optuna.Trial) -> float:
    """The objective: one ``python -m project.fit`` subprocess in the trial's run folder.

    A retried trial (its worker died) continues the first try's run folder from its ``last.ckpt``. A fit
    killed by a signal while this worker lives is resumed the same way, up to ``max_retry`` times.

    Raises:
        Surplus: a grid trial that did not come from the queue (nothing is run).
        optuna.TrialPruned: the pruner stopped the run.
        TrialFailed: fit exited with an error.
    """
    sweep = ctx.sweep
    frozen = study._storage.get_trial(trial._trial_id)  # Optuna 5's Trial no longer shows system attrs
    system = frozen.system_attrs
    if sweep.sampler == "grid" and "fixed_params" not in system:
        trial.set_user_attr("surplus", True)
        raise Surplus(f"trial {trial.number}: every grid point is taken; nothing to run")
    params = {p.key: p.suggest(trial) for p in sweep.space}
    seed = trial.suggest_categorical("seed", sweep.seeds)
    with _stable():
        first = RetryHeartbeatStaleTrialCallback.retried_trial_number(frozen)
    if sweep.sampler != "grid" and "fixed_params" not in system and first is None:
        for other in sweep.seeds:
            if other != seed:  # the point's other seeds, queued for any worker
                study.enqueue_trial({**params, "seed": other})
    number = first if first is not None else trial.number
    run = ctx.folder / f"version_{number}"
    trial.set_user_attr("run", str(run))
    info = _read_trial(run) if first is not None else {}
    ckpt = run / "checkpoints" / "last.ckpt"
    if first is not None and not ckpt.is_file() and run.exists():
        import shutil

        shutil.rmtree(run)  # the dead try left no checkpoint: start the point afresh
    run.mkdir(parents=True, exist_ok=True)
    (run / PRUNED_FILE).unlink(missing_ok=True)
    config = trial_config(ctx.base, params, seed, str(ctx.folder.parent), sweep.name, number)
    (run / TRIAL_CONFIG).write_text(yaml.safe_dump(config, sort_keys=False))
    info.update(
        sweep=sweep.name,
        study=sweep.name,
        run=number,
        params=params,
        seed=seed,
        state="running",
        objective={"metric": sweep.metric, "direction": sweep.direction},
    )
    info["trials"] = [*info.get("trials", []), trial.number]
    runs.write_json(run / TRIAL_FILE, info)
    env = {
        **os.environ,
        ENV_STORAGE: ctx.storage_url,
        ENV_STUDY: sweep.name,
        ENV_TRIAL: str(trial.number),
        "PYTHONUNBUFFERED": "1",
    }
    from project.data.workers import die_with_parent

    info["worker"] = f"{socket.gethostname()}:{os.getpid()}"
    trial.set_user_attr("worker", info["worker"])
    for _ in range(sweep.max_retry + 1):
        resume = ["--ckpt_path", str(ckpt)] if ckpt.is_file() else []
        info["resumed"] = info.get("resumed", False) or bool(resume)
        note = " (resumed from last.ckpt)" if resume else ""
        print(f"trial {trial.number}: {run} {json.dumps(params)} seed {seed}{note}", flush=True)
        command = [sys.executable, "-m", "project.fit", "--config", str(run / TRIAL_CONFIG), *resume]
        with open(run / "sweep-fit.log", "a") as log:
            proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
            info["pid"] = proc.pid
            runs.write_json(run / TRIAL_FILE, info)
            proc.wait()
        if proc.returncode >= 0:
            break  # else a signal killed fit while this worker lives: resume it here
    if proc.returncode != 0:
        error = _last_error(run / "sweep-fit.log")
        info.update(state="failed", error=error)
        runs.write_json(run / TRIAL_FILE, info)
        raise TrialFailed(f"trial {trial.number}: fit exited with {proc.returncode}: {error}")
    results = runs.read_results(run)
    value = float(results[sweep.metric])
    pruned = _read_json(run / PRUNED_FILE)
    if pruned.get("trial") == trial.number:
        info.update(state="pruned", pruned=pruned, value=value)
        runs.write_json(run / TRIAL_FILE, info)
        raise optuna.TrialPruned(f"trial {trial.number} pruned at epoch {pruned['epoch']}")
    info.update(state="complete", value=value)
    runs.write_json(run / TRIAL_FILE, info)
    print(f"trial {trial.number}: {sweep.metric} {value:.4f}", flush=True)
    return value


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_trial(run: Path) -> dict[str, Any]:
    return _read_json(run / TRIAL_FILE)


def _last_error(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    errors = [line for line in lines if line.startswith("error:")] or [line for line in lines if line.strip()]
    return errors[-1].strip() if errors else "no output"


def work(ctx: Context) -> None:
    """One worker: take trials until the sweep is done, waiting for other workers' running trials (one of
    them may die and be re-queued)."""
    study = load_or_create_study(ctx, create=False)
    sweep = ctx.sweep
    points = math.ceil(sweep.total() / len(sweep.seeds))
    while True:
        with _stable():
            optuna.storages.fail_stale_trials(study)
        trials = study.get_trials(deepcopy=False)
        waiting = any(t.state == TrialState.WAITING for t in trials)
        fresh = [
            t
            for t in trials
            if "fixed_params" not in t.system_attrs
            and "failed_trial" not in t.system_attrs
            and not t.user_attrs.get("surplus")
        ]
        if waiting or (sweep.sampler != "grid" and len(fresh) < points):
            study.optimize(lambda t: run_trial(ctx, study, t), n_trials=1, catch=(Surplus, TrialFailed))
            continue
        if any(t.state == TrialState.RUNNING for t in trials):
            time.sleep(min(sweep.heartbeat_s, 5.0))
            continue
        return


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="python -m project.sweep",
        description=__doc__.splitlines()[0],
        epilog="Further --key value arguments are fit overrides of the base experiment.",
    )
    p.add_argument("--config", required=True, help="the sweep file (configs/sweeps/<name>.yaml)")
    p.add_argument("--storage", default=None, help="an Optuna RDB storage URL (default: study.db in the sweep folder)")
    p.add_argument("--n_trials", type=int, default=None, help="trials in all (default: the sweep file's / the grid)")
    p.add_argument("--workers", type=int, default=1, help="worker processes on this machine (default 1)")
    p.add_argument("--report", action="store_true", help="only print the report (tables, best point, plots)")
    ns, extra = p.parse_known_args(argv)
    bad = [a for a in extra if a.startswith("-") and not a.startswith("--")]
    if bad or (extra and not extra[0].startswith("--")):
        p.error(f"unrecognized arguments: {' '.join(extra)} (fit overrides look like --trainer.max_epochs 2)")
    if ns.workers < 1:
        p.error("--workers must be >= 1")
    if ns.n_trials is not None and ns.n_trials < 1:
        p.error("--n_trials must be >= 1")
    return ns, extra


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m project.sweep``; returns the exit status."""
    from project import sweep_report
    from project.cli import setup_logging

    setup_logging()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    argv = list(sys.argv[1:] if argv is None else argv)
    ns, extra = parse(argv)
    try:
        sweep = load_sweep(Path(ns.config), ns.n_trials)
        base = resolve_base(sweep, extra)
        for p in sweep.space:
            _path(base, p.key)
        folder = sweep_folder(sweep, base)
        ctx = Context(sweep, base, ns.storage or default_storage(folder), folder, extra)
        if ns.report:
            study = load_or_create_study(ctx, create=False)
        else:
            if ctx.storage_url.startswith("sqlite:///"):
                folder.mkdir(parents=True, exist_ok=True)
            study = load_or_create_study(ctx, create=True)
    except ConfigError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    status = 0
    if not ns.report and ns.workers == 1:
        work(ctx)
    elif not ns.report:
        from project.data.workers import die_with_parent

        me = [sys.executable, "-m", "project.sweep", *_without_workers(argv), "--workers", "1"]
        procs = [subprocess.Popen(me, preexec_fn=die_with_parent) for _ in range(ns.workers)]
        status = 1 if any(p.wait() != 0 for p in procs) else 0
    sweep_report.report(study, ctx.sweep, folder, echo=True)
    return status


def _without_workers(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--workers":
            skip = True
        elif not a.startswith("--workers="):
            out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main())
