"""``python -m project.sweep --config configs/sweeps/<name>.yaml [--storage URL] [--n_trials N] [--workers K]``.

A sweep is an Optuna study whose trials are ordinary ``python -m project.fit`` runs, one process each, forked warm
from the worker (:mod:`project.trial_server`: no second import of torch and Lightning per trial)::

    python -m project.sweep --config configs/sweeps/pruning.yaml --data.source_dir /usr/share/datasets/fashion-mnist
    python -m project.sweep --config configs/sweeps/lr.yaml --workers 2
    OPTUNA_STORAGE=postgresql://user:pw@db/sweeps python -m project.sweep --config configs/sweeps/lr.yaml  # shared
    python -m project.sweep --config configs/sweeps/lr.yaml --report          # tables and plots, at any time

Arguments after the sweep's own options are fit overrides added to the sweep file's base experiment.

* The sweep file (:mod:`project.sweep_file`): the base experiment, the search space over dotted config keys,
  the objective from ``results.json``, seeds, sampler, pruner.
* Each trial trains in ``<save_dir>/<name>/version_<n>/`` (``n``: the number of the trial that first ran the
  point), a complete run folder plus ``trial.json`` (trial numbers, parameters, seed, state, value).
* Storage: ``sqlite:///<save_dir>/<name>/study.db`` unless ``--storage`` (or ``OPTUNA_STORAGE``) names another
  Optuna RDB URL; its password is never printed or written (:func:`shown`).
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
import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import optuna
import yaml
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState
from sqlalchemy.exc import SQLAlchemyError

from project import runs, trial_server
from project.errors import ArgumentParser, ConfigError
from project.sweep_file import (
    Sweep,
    check_objective,
    key_path,
    load_sweep,
    make_pruner,
    resolve_base,
    trial_config,
)

TRIAL_FILE = "trial.json"
TRIAL_CONFIG = "sweep-trial.yaml"
FIT_LOG = "sweep-fit.log"
PRUNED_FILE = "pruned.json"
ENV_STORAGE, ENV_STUDY, ENV_TRIAL = "PROJECT_SWEEP_STORAGE", "PROJECT_SWEEP_STUDY", "PROJECT_SWEEP_TRIAL"
ENV_PRUNER = "PROJECT_SWEEP_PRUNER"  # the sweep file's pruner as JSON: Optuna keeps no pruner in the storage


@contextlib.contextmanager
def _stable() -> Iterator[None]:
    """Optuna marks the heartbeat helpers (there since 2.8/2.9) experimental: silenced around their calls only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


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
    ``PROJECT_SWEEP_STUDY``, ``PROJECT_SWEEP_TRIAL`` and ``PROJECT_SWEEP_PRUNER`` in the trial's environment, so
    rebuilding a trial's run (evaluate, predict, a resume by hand) never touches the study. What
    optuna-integration's ``PyTorchLightningPruningCallback`` does, except that the run finishes cleanly (tested,
    results written)
    instead of raising out of ``fit``.
    """

    def __init__(self) -> None:
        self.trial: optuna.Trial | None = None
        self.active = False  # in a sweep (every rank)
        self.run: Path | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Every rank of a DDP trial knows it is in a sweep (the environment is the same); only rank 0 talks to
        # the study, and its decision is broadcast so that all ranks stop after the same epoch.
        self.active = stage == "fit" and bool(os.environ.get(ENV_STORAGE))
        if not self.active or not trainer.is_global_zero:
            return
        pruner = make_pruner(json.loads(os.environ.get(ENV_PRUNER) or "{}"))
        storage = open_storage(os.environ[ENV_STORAGE])
        study = optuna.load_study(study_name=os.environ[ENV_STUDY], storage=storage, pruner=pruner)
        study_id = storage.get_study_id_from_name(os.environ[ENV_STUDY])
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, int(os.environ[ENV_TRIAL]))
        self.trial = optuna.Trial(study, trial_id)
        self.monitor = "val/acc" if study.direction == optuna.study.StudyDirection.MAXIMIZE else "val/loss"
        # The logger's own folder, not trainer.log_dir: under DDP that is a collective (a broadcast) and this is
        # rank 0 only.
        self.run = Path(trainer.logger.log_dir) if trainer.logger is not None and trainer.logger.log_dir else None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.active or trainer.sanity_checking:
            return
        prune = False
        if self.trial is not None and self.monitor in trainer.callback_metrics:  # rank 0
            value, epoch = float(trainer.callback_metrics[self.monitor]), trainer.current_epoch
            self.trial.report(value, step=epoch)
            prune = self.trial.should_prune()
            if prune:
                record = {"trial": self.trial.number, "epoch": epoch, self.monitor: value}
                if self.run is not None:
                    runs.write_json(self.run / PRUNED_FILE, record)
                print(f"trial {self.trial.number} pruned after epoch {epoch} ({self.monitor} {value:.4f})", flush=True)
        # All ranks reach this point together; one rank stopping alone would leave the others waiting for it.
        if trainer.strategy.broadcast(prune, src=0):
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
    server: trial_server.TrialServer | None = None  # warm trial processes (None: subprocesses)


def sweep_folder(sweep: Sweep, base: dict[str, Any]) -> Path:
    """``<save_dir>/<name>``: the base logger's ``save_dir`` (default ``logs``) and the sweep's name."""
    return Path(base["trainer"]["logger"]["init_args"].get("save_dir") or "logs", sweep.name)


def default_storage(folder: Path) -> str:
    return f"sqlite:///{folder.resolve() / 'study.db'}"


def shown(url: str) -> str:
    """A storage URL fit to print or store: its password replaced by ``***`` (SQLAlchemy's own rendering of a
    URL; for a string SQLAlchemy cannot parse, whatever sits between ``user:`` and ``@``)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError, TypeError):
        return re.sub(r"(//[^/@:]*:)[^/]*@", r"\1***@", url)


def scrubbed(text: str, url: str) -> str:
    """``text`` (an error message, a log line) with ``url`` and its password replaced as in :func:`shown`."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    text = text.replace(url, shown(url))
    try:
        password = make_url(url).password
    except (ArgumentError, ValueError, TypeError):
        password = None
    return text.replace(str(password), "***") if password else text


def load_or_create_study(ctx: Context, create: bool) -> optuna.Study:
    """Load the sweep's study; with ``create``, create it first (enqueueing a grid's points) if it is new.

    Raises:
        ConfigError: the storage holds a study of this name made from another sweep file or base config.
    """
    sweep = ctx.sweep
    where = shown(ctx.storage_url)  # never the password: error lines end up in logs and CI output
    try:
        storage = open_storage(ctx.storage_url, sweep.heartbeat_s, sweep.max_retry)
    except (ImportError, ValueError, SQLAlchemyError) as e:
        why = scrubbed(" ".join(str(e).split("\n")[0].split()), ctx.storage_url)
        raise ConfigError(f"--storage {where}: cannot open the study's storage ({type(e).__name__}: {why})") from None
    sampler: optuna.samplers.BaseSampler
    if sweep.sampler == "tpe":
        sampler = optuna.samplers.TPESampler(seed=sweep.sampler_seed)
    elif sweep.sampler == "random":
        sampler = optuna.samplers.RandomSampler(seed=sweep.sampler_seed)
    else:
        # The grid is Optuna's trial queue: each point (x seed) is enqueued once, with all its parameters, and
        # each queued trial is taken by one worker only. GridSampler would choose points per worker and can give
        # two workers the same one (its documentation says so); a queued trial never asks the sampler.
        sampler = optuna.samplers.RandomSampler(seed=sweep.sampler_seed)
    kwargs = {"study_name": sweep.name, "storage": storage, "sampler": sampler, "pruner": make_pruner(sweep.pruner)}
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
        raise ConfigError(f"no study {sweep.name!r} in {where}; run the sweep first") from None
    for _ in range(600):
        if study.user_attrs.get("ready"):
            break
        time.sleep(0.1)  # another worker is still enqueueing the grid
    else:
        raise ConfigError(f"study {sweep.name!r} in {where} was never completely set up; delete it")
    if study.user_attrs.get("sweep") != identity:
        raise ConfigError(
            f"study {sweep.name!r} in {where} was created from another sweep file or base config; "
            "change the sweep's name or --storage, or run it with its original settings"
        )
    return study


def run_trial(ctx: Context, study: optuna.Study, trial: optuna.Trial) -> float:
    """The objective: one ``python -m project.fit`` process (:func:`run_fit`) in the trial's run folder.

    A retried trial (its worker died) continues the first try's run folder from its ``last.ckpt``. A fit
    killed by a signal while this worker lives is resumed the same way, up to ``max_retry`` times.

    Raises:
        Surplus: a grid trial that did not come from the queue (nothing is run).
        optuna.TrialPruned: the pruner stopped the run.
        TrialFailed: fit exited with an error, or its ``results.json`` holds no finite objective value.
    """
    sweep = ctx.sweep
    # Optuna 5's Trial no longer shows system attrs: the frozen trial, through the study's public API
    frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == trial.number)
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
    runs.write_text(run / TRIAL_CONFIG, yaml.safe_dump(config, sort_keys=False))
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
        ENV_PRUNER: json.dumps(sweep.pruner),
        "PYTHONUNBUFFERED": "1",
    }
    info["worker"] = f"{socket.gethostname()}:{os.getpid()}"
    trial.set_user_attr("worker", info["worker"])
    for _ in range(sweep.max_retry + 1):
        resume = ["--ckpt_path", str(ckpt)] if ckpt.is_file() else []
        info["resumed"] = info.get("resumed", False) or bool(resume)
        note = " (resumed from last.ckpt)" if resume else ""
        print(f"trial {trial.number}: {run} {json.dumps(params)} seed {seed}{note}", flush=True)

        def started(pid: int) -> None:
            info["pid"] = pid
            runs.write_json(run / TRIAL_FILE, info)

        returncode = run_fit(ctx.server, ["--config", str(run / TRIAL_CONFIG), *resume], env, run / FIT_LOG, started)
        if returncode >= 0:
            break  # else a signal killed fit while this worker lives: resume it here
    if returncode != 0:
        error = scrubbed(_last_error(run / FIT_LOG), ctx.storage_url)
        info.update(state="failed", error=error)
        runs.write_json(run / TRIAL_FILE, info)
        raise TrialFailed(f"trial {trial.number}: fit exited with {returncode}: {error}")
    results = runs.read_results(run)
    value = results.get(sweep.metric)
    finite = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    pruned = _read_json(run / PRUNED_FILE)
    if pruned.get("trial") == trial.number:
        info.update(state="pruned", pruned=pruned, value=float(value) if finite else None)
        runs.write_json(run / TRIAL_FILE, info)
        raise optuna.TrialPruned(f"trial {trial.number} pruned at epoch {pruned['epoch']}")
    if not finite:
        error = (f"objective {sweep.metric} is {json.dumps(value)} in {run / runs.RESULTS}, not a finite number "
                 "(see objective.metric in the sweep file)")  # fmt: skip
        info.update(state="failed", error=error)
        runs.write_json(run / TRIAL_FILE, info)
        raise TrialFailed(f"trial {trial.number}: {error}")
    value = float(value)
    info.update(state="complete", value=value)
    runs.write_json(run / TRIAL_FILE, info)
    print(f"trial {trial.number}: {sweep.metric} {value:.4f}", flush=True)
    return value


def run_fit(
    server: trial_server.TrialServer | None, args: list[str], env: dict[str, str], log: Path, started: Any
) -> int:
    """``python -m project.fit ARGS`` with ``env``, output appended to ``log``: in a warm child of the worker's
    trial server (:mod:`project.trial_server`), else as a subprocess. Returns the exit status (negative: the
    signal that killed it); ``started(pid)`` is called once fit runs."""
    if server is not None and server.alive:
        return server.run(args, env, log, started)
    from project.data.workers import die_with_parent

    with open(log, "a") as out:
        command = [sys.executable, "-m", "project.fit", *args]
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        started(proc.pid)
        return proc.wait()


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
    # Ctrl-C stops this worker as a crash would: its trial stays RUNNING, turns stale and is retried (resumed)
    # by the next run. Optuna would otherwise record it as failed, and failed points are not rerun.
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
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


def _one_line_failures(record: logging.LogRecord) -> bool:
    """Optuna logs a failed trial with the objective's traceback; ours (a failed fit, a surplus grid trial) are
    told in their one-line message, the fit's own output is in the trial's ``sweep-fit.log``. A logging filter on
    Optuna's handler."""
    if record.exc_info and isinstance(record.exc_info[1], Surplus | TrialFailed):
        record.exc_info, record.exc_text = None, None
    # Optuna 5 follows each failure with "Trial N failed with value None.": ours raise, so it says nothing
    return not record.getMessage().endswith(" failed with value None.")


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = ArgumentParser(
        prog="python -m project.sweep",
        description="Run a sweep file as an Optuna study of python -m project.fit runs: resumable, crash-tolerant, "
        "shared by workers on one or many machines.",
        epilog="Further --key value arguments are fit overrides of the base experiment.",
    )
    p.add_argument("--config", required=True, help="the sweep file (configs/sweeps/<name>.yaml)")
    p.add_argument("--storage", default=None, help="an Optuna RDB storage URL (default: $OPTUNA_STORAGE, else study.db "
                   "in the sweep folder); keep a password out of the command line: OPTUNA_STORAGE, or ~/.pgpass")
    p.add_argument("--n_trials", type=int, default=None, help="trials in all (default: the sweep file's / the grid)")
    p.add_argument("--workers", type=int, default=1, help="worker processes on this machine (default 1)")
    p.add_argument("--report", action="store_true", help="only print the report (tables, best point, plots)")
    p.add_argument("--worker_only", action="store_true", help=argparse.SUPPRESS)  # a --workers child: no report
    ns, extra = p.parse_known_args(argv)
    # Optuna's own convention (its CLI reads it too): the URL from the environment, out of every process listing.
    ns.storage = ns.storage or os.environ.get("OPTUNA_STORAGE") or None
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
    for handler in logging.getLogger("optuna").handlers:
        handler.addFilter(_one_line_failures)
    argv = list(sys.argv[1:] if argv is None else argv)
    ns, extra = parse(argv)
    ctx: Context | None = None
    try:
        sweep = load_sweep(Path(ns.config), ns.n_trials)
        base = resolve_base(sweep, extra)
        for p in sweep.space:
            key_path(base, p.key)
        folder = sweep_folder(sweep, base)
        check_objective(sweep, base)
        ctx = Context(sweep, base, ns.storage or default_storage(folder), folder, extra)
        if not ns.report and ns.workers == 1:
            # Before the storage is opened and Optuna's heartbeat thread starts: see project.trial_server.
            ctx.server = trial_server.start()
        if ns.report:
            if ns.storage is None and not (folder / "study.db").is_file():
                raise ConfigError(f"no sweep {sweep.name!r} yet: {folder / 'study.db'} does not exist; run it first")
            study = load_or_create_study(ctx, create=False)
        else:
            if ctx.storage_url.startswith("sqlite:///"):
                folder.mkdir(parents=True, exist_ok=True)
            study = load_or_create_study(ctx, create=True)
    except ConfigError as e:
        if ctx is not None and ctx.server is not None:
            ctx.server.close()
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    status = 0
    if not ns.report and ns.workers == 1:
        try:
            work(ctx)
        finally:
            if ctx.server is not None:
                ctx.server.close()
    elif not ns.report:
        from project.data.workers import die_with_parent

        me = [sys.executable, "-m", "project.sweep", *_without_workers(argv), "--workers", "1", "--worker_only"]
        procs = [subprocess.Popen(me, preexec_fn=die_with_parent) for _ in range(ns.workers)]
        status = 1 if any(p.wait() != 0 for p in procs) else 0
    if not ns.worker_only:
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
