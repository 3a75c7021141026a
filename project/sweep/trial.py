"""One sweep trial: a ``python -m project.fit`` run in its run folder, and how it ends.

* :func:`run_trial` (the study's objective) writes the trial's config and ``trial.json``, runs fit
  (:func:`run_fit`: warm from the worker's :mod:`project.sweep.server`, else a subprocess), resumes it from its
  newest checkpoint after a retry or a signal, and turns the run into the trial's outcome: complete (the objective
  from ``results.json``), pruned, or failed with one line (:class:`TrialFailed`).
* :func:`stop_on_sigterm`, the worker's SIGTERM handler: the running trial saves a checkpoint at its current step
  and the worker ends, leaving the trial to be retried (resumed from that checkpoint) by the next worker.
* :class:`ReportToStudy`, the callback every trial's fit runs with: reports each epoch to the trial and stops the
  run when the study's pruner says so.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import signal
import socket

# bandit B404: a trial runs this program's fit: fixed module, arguments from the sweep
import subprocess  # nosec B404
import sys
from collections.abc import Container, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import lightning as L
import optuna
import yaml
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from project.cluster.slurm import JOB_ID_VAR, newest_checkpoint
from project.errors import ConfigError, UnreadableFile
from project.runs import files, layout, read
from project.runs.layout import FIT_LOG
from project.sweep import server as trial_server
from project.sweep.config import trial_config
from project.sweep.file import Sweep, make_pruner
from project.sweep.storage import open_storage, scrubbed, stable

ENV_STORAGE, ENV_STUDY, ENV_TRIAL = "PROJECT_SWEEP_STORAGE", "PROJECT_SWEEP_STUDY", "PROJECT_SWEEP_TRIAL"
ENV_PRUNER = "PROJECT_SWEEP_PRUNER"  # the sweep file's pruner as JSON: Optuna keeps no pruner in the storage


class ReportToStudy(L.Callback):
    """Report ``val/acc`` (``val/loss`` when the objective is minimized) to the sweep's trial each epoch and
    stop the run when Optuna's pruner says so (writing ``pruned.json`` into the run folder). In a sweep with
    ``folds`` the pruner compares the trial with trials of the same fold only (:class:`SameFoldStudy`).

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
        study_id = storage.get_study_id_from_name(os.environ[ENV_STUDY])
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, int(os.environ[ENV_TRIAL]))
        fold = storage.get_trial(trial_id).params.get("fold")
        study = SameFoldStudy(os.environ[ENV_STUDY], storage, fold, pruner=pruner)
        self.trial = optuna.Trial(study, trial_id)
        self.monitor = "val/acc" if study.direction == optuna.study.StudyDirection.MAXIMIZE else "val/loss"
        # The logger's own folder, not trainer.log_dir: under DDP that is a collective (a broadcast) and this is
        # rank 0 only.
        self.run = Path(trainer.logger.log_dir) if trainer.logger is not None and trainer.logger.log_dir else None

    def extra_hparams(self, run: Path) -> dict[str, Any]:
        """HPARAMS columns for a trial's run (``project.report.results.callback_hparams`` asks): ``trial`` (its number)
        and the swept values, from the run's ``trial.json``, so HPARAMS compares the trials of a sweep by what the
        sweep varied. ``{}`` for a run without one (or one that cannot be read as data: :func:`_read_trial`)."""
        info = _read_trial(run)
        number = info.get("run")
        if isinstance(number, bool) or not isinstance(number, int) or not isinstance(info.get("params", {}), dict):
            return {}
        swept = {k: v if isinstance(v, bool | int | float | str) else str(v) for k, v in info.get("params", {}).items()}
        return {"trial": number, **swept}

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
                    write_trial_file(self.run, layout.PRUNED, record)
                print(f"trial {self.trial.number} pruned after epoch {epoch} ({self.monitor} {value:.4f})", flush=True)
        # All ranks reach this point together; one rank stopping alone would leave the others waiting for it.
        if trainer.strategy.broadcast(prune, src=0):
            trainer.should_stop = True


class SameFoldStudy(optuna.Study):
    """The sweep's study as its pruner sees it from a trial of fold ``fold``: only the trials of that fold (the
    trial's ``fold`` parameter; every trial when ``fold`` is None), so a fold is compared with the same fold (folds
    differ in how hard their validation images are).

    Optuna's pruners read the other trials through :meth:`get_trials` (median, percentile, successive halving) and
    :attr:`best_trial` (Wilcoxon); Hyperband builds its own view and is refused with folds
    (:func:`project.sweep.file.load_sweep`).
    """

    def __init__(self, study_name: str, storage: Any, fold: int | None, pruner: optuna.pruners.BasePruner) -> None:
        super().__init__(study_name=study_name, storage=storage, pruner=pruner)
        self.fold = fold

    def get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        trials = super().get_trials(deepcopy=deepcopy, states=states)
        return trials if self.fold is None else [t for t in trials if t.params.get("fold") == self.fold]

    @property
    def best_trial(self) -> FrozenTrial:
        """The best complete trial of this fold (Optuna's raises ``ValueError`` when there is none)."""
        if self.fold is None:
            return super().best_trial
        done = [t for t in self.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
        if not done:
            raise ValueError(f"no complete trial of fold {self.fold} yet")
        pick = max if self.direction == optuna.study.StudyDirection.MAXIMIZE else min
        return pick(done, key=lambda t: cast(float, t.value))


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
    fit_pid: int | None = None  # the running trial's fit process
    stopping: bool = False  # a SIGTERM came: end once the running trial has saved


SIGTERM_STATUS = 128 + signal.SIGTERM  # 143, as a shell reports a process ended by SIGTERM


def stop_on_sigterm(ctx: Context) -> None:
    """The worker's SIGTERM handler (``docker stop``, a pod's deletion, ``scancel``: through the image's tini).

    The running trial's fit gets the SIGTERM too: Lightning stops it after its current training step and it saves
    ``hpc_ckpt_<k>.ckpt`` in its run folder (:class:`project.cluster.SlurmRequeue`); then the worker ends with
    :data:`SIGTERM_STATUS` (:func:`_fit_resuming`). Its trial stays running in the study, as after a crash: its
    heartbeat goes stale and the next worker retries it, resuming the run from that checkpoint. With no trial's fit
    running the worker ends at once. (Left to the default action, the worker would die at once and the kernel would
    kill its trial with it, ``PR_SET_PDEATHSIG``, before any checkpoint.)
    """
    ctx.stopping = True
    if ctx.fit_pid is None:
        os._exit(SIGTERM_STATUS)
    with contextlib.suppress(ProcessLookupError):
        os.kill(ctx.fit_pid, signal.SIGTERM)


def run_trial(ctx: Context, study: optuna.Study, trial: optuna.Trial) -> float:
    """The objective: one ``python -m project.fit`` process (:func:`run_fit`) in the trial's run folder.

    A retried trial (its worker died or was stopped) continues the first try's run folder from its newest
    checkpoint. A fit killed by a signal while this worker lives is resumed the same way, up to ``max_retry`` times.

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
    params, seed, fold = _suggest(sweep, trial)
    with stable():
        first = RetryHeartbeatStaleTrialCallback.retried_trial_number(frozen)
    if sweep.sampler != "grid" and "fixed_params" not in system and first is None:
        mine = {"seed": seed} | ({"fold": fold} if fold is not None else {})
        for other in sweep.repeats():
            if other != mine:  # the point's other seeds and folds, queued for any worker
                study.enqueue_trial({**params, **other})
    number = first if first is not None else trial.number
    run, info = _prepare_run(ctx.folder, trial, number, retried=first is not None)
    _write_trial_files(ctx, run, number, info, trial, params, seed, fold)
    point = f"{json.dumps(params)} seed {seed}" + (f" fold {fold}" if fold is not None else "")
    returncode = _fit_resuming(ctx, trial, run, info, point)
    return _outcome(ctx, trial, run, info, returncode)


def _suggest(sweep: Sweep, trial: optuna.Trial) -> tuple[dict[str, Any], Any, int | None]:
    """The trial's point, asked of the sampler: ``(params, seed, fold)`` (``fold`` ``None`` without folds)."""
    params = {p.key: p.suggest(trial) for p in sweep.space}
    seed = trial.suggest_categorical("seed", sweep.seeds)
    fold = trial.suggest_categorical("fold", list(range(sweep.folds))) if sweep.folds else None
    return params, seed, fold


def _prepare_run(folder: Path, trial: optuna.Trial, number: int, retried: bool) -> tuple[Path, dict[str, Any]]:
    """The trial's run folder ``<folder>/version_<number>``, created, and its ``trial.json`` so far (``{}`` unless
    ``retried``).

    A ``retried`` trial continues the first try's folder when that try left a checkpoint (``last.ckpt``, or the
    ``hpc_ckpt_<k>.ckpt`` a SIGTERM saves); else the folder is removed and the point starts afresh. A
    ``pruned.json`` left by an earlier try is removed.
    """
    run = folder / f"version_{number}"
    trial.set_user_attr("run", str(run))
    with in_place(run):
        os.close(files.open_below(folder.parent, folder, create=True))  # the sweep folder: no link on the way
        info = _read_trial(run) if retried else {}
        if retried and newest_checkpoint(run) is None and run.exists():
            import shutil

            shutil.rmtree(run)  # the dead try left no checkpoint: start the point afresh (refuses a link)
        os.close(files.open_below(folder.parent, run))
        files.unlink_below(run / layout.PRUNED, folder.parent)
    return run, info


@contextlib.contextmanager
def in_place(run: Path) -> Iterator[None]:
    """Turn the refusal of a link (or a file) on the way to a trial's files into one readable error.

    Raises:
        ConfigError: naming the run folder; a trial's files are written only in place, never through a link."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise ConfigError(
            f"{run}: a symbolic link or a file stands on the way to this trial's run folder (under "
            f"{run.parent.parent}); a sweep writes only in place, never through a link: remove it"
        ) from None


def _write_trial_files(
    ctx: Context,
    run: Path,
    number: int,
    info: dict[str, Any],
    trial: optuna.Trial,
    params: dict[str, Any],
    seed: Any,
    fold: int | None,
) -> None:
    """Write the trial's fit config (``sweep-trial.yaml``) and its ``trial.json`` (state ``running``, this trial
    added to its ``trials``) into ``run``; ``info`` is updated to what ``trial.json`` holds."""
    sweep = ctx.sweep
    folds = (fold, sweep.folds) if fold is not None and sweep.folds else None
    config = trial_config(ctx.base, params, seed, str(ctx.folder.parent), sweep.name, number, folds)
    with in_place(run):
        files.write_text(run / layout.TRIAL_CONFIG, yaml.safe_dump(config, sort_keys=False), run.parent.parent)
    info.update(
        sweep=sweep.name,
        study=sweep.name,
        run=number,
        params=params,
        seed=seed,
        **({"fold": fold} if fold is not None else {}),
        state="running",
        objective={"metric": sweep.metric, "direction": sweep.direction},
    )
    info["trials"] = [*info.get("trials", []), trial.number]
    write_trial_file(run, layout.TRIAL, info)


def _fit_resuming(ctx: Context, trial: optuna.Trial, run: Path, info: dict[str, Any], point: str) -> int:
    """Run the trial's fit in ``run`` (:func:`run_fit`, resumed from its newest checkpoint when there is one), again
    while a signal killed it, at most ``max_retry + 1`` times; returns fit's last exit status. ``info`` (the trial's
    ``trial.json``) gets the worker, whether it resumed and fit's pid; ``point`` (the params, seed and fold) is printed.
    After a SIGTERM to the worker (:func:`stop_on_sigterm`) the worker ends here once fit has saved and exited.

    Raises:
        TrialFailed: the trial's log cannot be opened (nothing ran; recorded in ``trial.json``).
    """
    sweep = ctx.sweep
    env = {
        **os.environ,
        ENV_STORAGE: ctx.storage_url,
        ENV_STUDY: sweep.name,
        ENV_TRIAL: str(trial.number),
        ENV_PRUNER: json.dumps(sweep.pruner),
        "PYTHONUNBUFFERED": "1",
        # a job id (the scheduler's, else the trial's own) makes fit save a checkpoint when SIGTERM stops it
        JOB_ID_VAR: os.environ.get(JOB_ID_VAR) or f"{sweep.name}-trial-{trial.number}",
    }
    info["worker"] = f"{socket.gethostname()}:{os.getpid()}"
    trial.set_user_attr("worker", info["worker"])
    for attempt in range(sweep.max_retry + 1):
        ckpt = newest_checkpoint(run)
        if ckpt is None and attempt > 0:
            _clear_dead_try(run, ctx.folder.parent)  # killed before its first checkpoint: start the point afresh
        resume = ["--ckpt_path", str(ckpt)] if ckpt is not None else []
        info["resumed"] = info.get("resumed", False) or bool(resume)
        note = f" (resumed from {ckpt.name})" if ckpt is not None else ""
        print(f"trial {trial.number}: {run} {point}{note}", flush=True)

        def started(pid: int) -> None:
            info["pid"] = pid
            write_trial_file(run, layout.TRIAL, info)
            ctx.fit_pid = pid

        try:
            returncode = run_fit(
                ctx.server, ["--config", str(run / layout.TRIAL_CONFIG), *resume], env, run / FIT_LOG, started
            )
        except TrialFailed as e:  # its log cannot be opened (a planted link): nothing ran
            info.update(state="failed", error=str(e))
            write_trial_file(run, layout.TRIAL, info)
            raise TrialFailed(f"trial {trial.number}: {e}") from None
        finally:
            ctx.fit_pid = None
        if ctx.stopping:
            saved = newest_checkpoint(run)
            print(f"trial {trial.number}: stopped by SIGTERM; the next worker resumes it from "
                  f"{saved if saved is not None else 'its start'}", file=sys.stderr, flush=True)  # fmt: skip
            os._exit(SIGTERM_STATUS)
        if returncode >= 0:
            break  # else a signal killed fit while this worker lives: resume it here
    return returncode


def _clear_dead_try(run: Path, below: Path) -> None:
    """Remove what a fit killed before its first checkpoint left in ``run`` (its ``config.yaml``, event files, an
    empty ``checkpoints/``), keeping the trial's own files (``trial.json``, ``sweep-trial.yaml``, ``sweep-fit.log``):
    the retry then starts the point afresh in the same folder, which fit would otherwise refuse as one that "already
    holds a run". Links are removed, never followed.

    Raises:
        ConfigError: a link or a file stands on the way to ``run`` (:func:`in_place`)."""
    import shutil

    keep = {layout.TRIAL, layout.TRIAL_CONFIG, FIT_LOG}
    with in_place(run):
        os.close(files.open_below(below, run, create=False))
        for entry in run.iterdir():
            if entry.name in keep:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def _outcome(ctx: Context, trial: optuna.Trial, run: Path, info: dict[str, Any], returncode: int) -> float:
    """The trial's value once fit has exited with ``returncode``: the objective from the run's ``results.json``,
    recorded in ``trial.json`` with the trial's final state.

    Raises:
        TrialFailed: fit exited with an error, or the objective is no finite number.
        optuna.TrialPruned: the pruner stopped this trial's run (its ``pruned.json``).
    """
    sweep = ctx.sweep
    if returncode != 0:
        error = scrubbed(_last_error(run / FIT_LOG), ctx.storage_url)
        info.update(state="failed", error=error)
        write_trial_file(run, layout.TRIAL, info)
        raise TrialFailed(f"trial {trial.number}: fit exited with {returncode}: {error}")
    results = layout.read_results(run)
    value: Any = results.get(sweep.metric)  # any JSON value; float() only once `finite` says it is a number
    finite = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    pruned = _read_json(run / layout.PRUNED)
    if pruned.get("trial") == trial.number:
        info.update(state="pruned", pruned=pruned, value=float(value) if finite else None)
        write_trial_file(run, layout.TRIAL, info)
        raise optuna.TrialPruned(f"trial {trial.number} pruned at epoch {pruned['epoch']}")
    if not finite:
        error = (
            f"objective {sweep.metric} is {json.dumps(value)} in {run / layout.RESULTS}, not a finite number "
            "(see objective.metric in the sweep file)"
        )
        info.update(state="failed", error=error)
        write_trial_file(run, layout.TRIAL, info)
        raise TrialFailed(f"trial {trial.number}: {error}")
    value = float(value)
    info.update(state="complete", value=value)
    write_trial_file(run, layout.TRIAL, info)
    print(f"trial {trial.number}: {sweep.metric} {value:.4f}", flush=True)
    return value


def run_fit(
    server: trial_server.TrialServer | None, args: list[str], env: dict[str, str], log: Path, started: Any
) -> int:
    """``python -m project.fit ARGS`` with ``env``, output appended to ``log``: in a warm child of the worker's
    trial server (:mod:`project.sweep.server`), else as a subprocess. Returns the exit status (negative: the
    signal that killed it); ``started(pid)`` is called once fit runs.

    The log is opened for appending only in place (:func:`project.sweep.server.open_log`, ``O_NOFOLLOW``), here
    first whichever process writes it.

    Raises:
        TrialFailed: the log cannot be opened (a symbolic link planted at its name, a folder); nothing is run.
    """
    try:
        fd = trial_server.open_log(log)
    except OSError as e:
        raise TrialFailed(trial_server.log_problem(log, e)) from None
    if server is not None and server.alive:
        os.close(fd)
        return server.run(args, env, log, started)
    from project.data.workers import die_with_parent

    with os.fdopen(fd, "ab") as out:
        command = [sys.executable, "-m", "project.fit", *args]
        # bandit B603: sys.executable -m project.fit, no shell
        proc = subprocess.Popen(  # nosec B603
            command, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
        started(proc.pid)
        return proc.wait()


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, read as data (:func:`project.runs.read.read_json`: a regular file of at most
    16 MiB, bounded nesting, non-finite numbers as ``None``); ``{}`` when missing, unreadable or not an object."""
    try:
        data = read.read_json(path, what=path.name)
    except UnreadableFile:
        return {}
    return data if isinstance(data, dict) else {}


def _read_trial(run: Path) -> dict[str, Any]:
    """The run's ``trial.json`` (:func:`_read_json`)."""
    return _read_json(run / layout.TRIAL)


LOG_TAIL_BYTES = 1 << 20  # the end of a trial's log searched for its last error line: 1 MiB


def _last_error(log: Path) -> str:
    """The fit's last ``error:`` line in its log (else its last line), from the log's last :data:`LOG_TAIL_BYTES`
    bytes, read only in place (a link is not followed)."""
    try:
        lines = read.read_tail(log, LOG_TAIL_BYTES, "a trial's log").splitlines()
    except UnreadableFile:
        lines = []
    errors = [line for line in lines if line.startswith("error:")] or [line for line in lines if line.strip()]
    return errors[-1].strip() if errors else "no output"


def write_trial_file(run: Path, name: str, data: dict[str, Any]) -> None:
    """Write a trial's JSON file ``name`` into ``run`` (``<logs>/<sweep>/version_<n>``) atomically, with no link
    followed under ``<logs>`` (:func:`project.runs.files.open_below`): a folder swapped for a link is caught at the
    write.

    Raises:
        ConfigError: a link or a file on the way (:func:`in_place`)."""
    with in_place(run):
        files.write_json(run / name, data, run.parent.parent)
