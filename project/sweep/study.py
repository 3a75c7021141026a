"""``python -m project.sweep --config configs/sweeps/<name>.yaml [--storage URL] [--n_trials N] [--workers K]``.

A sweep is an Optuna study whose trials are ordinary ``python -m project.fit`` runs, one process each, forked warm
from the worker (:mod:`project.sweep.server`: no second import of torch and Lightning per trial)::

    python -m project.sweep --config configs/sweeps/pruning.yaml --data.source_dir /usr/share/datasets/fashion-mnist
    python -m project.sweep --config configs/sweeps/lr.yaml --workers 2
    OPTUNA_STORAGE=postgresql://user:pw@db/sweeps python -m project.sweep --config configs/sweeps/lr.yaml  # shared
    python -m project.sweep --config configs/sweeps/lr.yaml --report          # tables and plots, at any time

Arguments after the sweep's own options are fit overrides added to the sweep file's base experiment.

* The sweep file (:mod:`project.sweep.file`): the base experiment, the search space over dotted config keys,
  the objective from ``results.json``, seeds, folds (K-fold cross-validation), sampler, pruner.
* Each trial trains in ``<save_dir>/<name>/version_<n>/`` (``n``: the number of the trial that first ran the
  point), a complete run folder plus ``trial.json`` (trial numbers, parameters, seed, state, value).
* Storage: ``sqlite:///<save_dir>/<name>/study.db`` unless ``--storage`` (or ``OPTUNA_STORAGE``) names another
  Optuna RDB URL; its password is never printed or written (:func:`shown`).
  Running the same command again continues the study. Grid points (× seeds × folds) are enqueued once by the
  process that creates the study; a worker only takes queued trials (Optuna pops each one atomically), so no
  point runs twice. A worker that dies stops sending heartbeats; after ``3 × heartbeat_s`` its trial is
  failed and re-queued (Optuna's ``RetryHeartbeatStaleTrialCallback``) and the retry resumes the run folder
  from its ``last.ckpt``.
* Bad trials are stopped early by the study's pruner on ``val/acc`` each epoch (:class:`ReportToStudy`); with
  ``folds`` a fold is compared with the same fold of other points.
* Modules: the sweep file in :mod:`project.sweep.file`, from its base to a trial's config in
  :mod:`project.sweep.config`, the storage in :mod:`project.sweep.storage`, one trial's
  run and outcome in :mod:`project.sweep.trial`, the report in :mod:`project.sweep.report`; this one holds the
  study, the workers and the command.

Exit status: 0 done, 2 bad sweep file or option (one ``error:`` line, nothing written), 1 a worker failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal

# bandit B404: the sweep starts its own workers: this program, fixed arguments
import subprocess  # nosec B404
import sys
import time
from pathlib import Path
from typing import Any, Literal, cast

import optuna
from optuna.trial import TrialState
from sqlalchemy.exc import SQLAlchemyError

from project.errors import ArgumentParser, ConfigError
from project.sweep import report as sweep_report
from project.sweep import server as trial_server
from project.sweep.config import check_folds, check_objective, key_path, resolve_base
from project.sweep.file import Sweep, load_sweep, make_pruner
from project.sweep.storage import default_storage, expand_user, open_storage, scrubbed, shown, stable
from project.sweep.trial import SIGTERM_STATUS, Context, Surplus, TrialFailed, run_trial, stop_on_sigterm


def sweep_folder(sweep: Sweep, base: dict[str, Any]) -> Path:
    """``<save_dir>/<name>``: the base logger's ``save_dir`` (default ``logs``) and the sweep's name."""
    return Path(base["trainer"]["logger"]["init_args"].get("save_dir") or "logs", sweep.name).expanduser()


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
    kwargs: dict[str, Any] = {
        "study_name": sweep.name,
        "storage": storage,
        "sampler": sampler,
        "pruner": make_pruner(sweep.pruner),
    }
    identity = json.loads(json.dumps({**sweep.identity(), "base": ctx.base}))
    if create:
        # Sweep.direction is the sweep file's objective.direction, which parsing limits to these two
        direction = cast(Literal["maximize", "minimize"], sweep.direction)
        try:
            study = optuna.create_study(direction=direction, load_if_exists=False, **kwargs)
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


def work(ctx: Context) -> None:
    """One worker: take trials until the sweep is done, waiting for other workers' running trials (one of
    them may die and be re-queued)."""
    # Ctrl-C stops this worker as a crash would: its trial stays RUNNING, turns stale and is retried (resumed)
    # by the next run. Optuna would otherwise record it as failed, and failed points are not rerun.
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    # SIGTERM (docker stop, a pod's deletion): the running trial saves a checkpoint first, then the same
    signal.signal(signal.SIGTERM, lambda *_: stop_on_sigterm(ctx))
    study = load_or_create_study(ctx, create=False)
    sweep = ctx.sweep
    points = math.ceil(sweep.total() / len(sweep.repeats()))
    while True:
        with stable():
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
    p.add_argument(
        "--storage",
        default=None,
        help="an Optuna RDB storage URL (default: $OPTUNA_STORAGE, else study.db "
        "in the sweep folder); keep a password out of the command line: OPTUNA_STORAGE, or ~/.pgpass",
    )
    p.add_argument("--n_trials", type=int, default=None, help="trials in all (default: the sweep file's / the grid)")
    p.add_argument("--workers", type=int, default=1, help="worker processes on this machine (default 1)")
    p.add_argument("--report", action="store_true", help="only print the report (tables, best point, plots)")
    p.add_argument("--worker_only", action="store_true", help=argparse.SUPPRESS)  # a --workers child: no report
    ns, extra = p.parse_known_args(argv)
    # Optuna's own convention (its CLI reads it too): the URL from the environment, out of every process listing.
    ns.storage = ns.storage or os.environ.get("OPTUNA_STORAGE") or None
    ns.storage = expand_user(ns.storage) if ns.storage else None
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
    from project.cli.entry import setup_logging

    setup_logging()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for handler in logging.getLogger("optuna").handlers:
        handler.addFilter(_one_line_failures)
    argv = list(sys.argv[1:] if argv is None else argv)
    ns, extra = parse(argv)
    ctx: Context | None = None
    try:
        sweep = load_sweep(Path(ns.config).expanduser(), ns.n_trials)
        base = resolve_base(sweep, extra)
        for p in sweep.space:
            key_path(base, p.key)
        folder = sweep_folder(sweep, base)
        check_objective(sweep, base)
        check_folds(sweep, base)
        ctx = Context(sweep, base, ns.storage or default_storage(folder), folder, extra)
        if not ns.report and ns.workers == 1:
            # Before the storage is opened and Optuna's heartbeat thread starts: see project.sweep.server.
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
        procs: list[subprocess.Popen] = []

        def forward(*_: object) -> None:  # a SIGTERM goes on to every worker; each ends once its trial has saved
            for p in procs:
                p.send_signal(signal.SIGTERM)

        signal.signal(signal.SIGTERM, forward)
        # bandit B603: this program's own workers, fixed arguments, no shell
        procs += [subprocess.Popen(me, preexec_fn=die_with_parent) for _ in range(ns.workers)]  # nosec B603
        codes = [p.wait() for p in procs]
        if SIGTERM_STATUS in codes or -signal.SIGTERM in codes:
            return SIGTERM_STATUS
        status = 1 if any(codes) else 0
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
