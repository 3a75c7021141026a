"""SLURM preemption (and a restarted Kubernetes Job): a requeued job resumes in its own run folder.

Lightning does the signal part (``SLURMEnvironment(auto_requeue=True)``, detected from SLURM's environment):
on ``SIGUSR1`` (``#SBATCH --signal=SIGUSR1@90``) it saves ``hpc_ckpt_<k>.ckpt`` into
``trainer.default_root_dir`` and runs ``scontrol requeue <job id>``. On its own, the requeued job would then
start a new ``version_N`` and forget the best score. This module closes that gap:

* every start of a job records it in the run folder (``slurm_job.json``: job id, every start with its
  ``SLURM_RESTART_COUNT``) and points ``default_root_dir`` at the run's ``checkpoints/`` folder, so
  Lightning's preemption checkpoint lands inside the run (:class:`SlurmRequeue`);
* a start of the same job id (a requeue) finds that run and resumes it in place from its newest checkpoint
  (the preemption checkpoint, or ``last.ckpt`` when it is newer), like ``--ckpt_path RUN``.

A job is not a run: one job may run several fits (a seed loop in one ``sbatch`` script). Each start records its
fit's key (:func:`fit_key`, a digest of the config as given), and a start resumes only a run of its job with the same
key, and under SLURM only from an earlier start (a higher ``SLURM_RESTART_COUNT``); any other start of the job is a
new fit and gets its own run.

The same works for any scheduler that restarts a job's command: set ``PROJECT_JOB_ID`` to an id that stays the
same across restarts (deploy/kubernetes/train/train.yaml gives every pod the run's name). Such schedulers (and
``scancel``) stop a job with SIGTERM rather than SIGUSR1: Lightning then ends fit at the next training step
(``SIGTERMException``), and :class:`SlurmRequeue` first saves the same kind of checkpoint, ``hpc_ckpt_<k>.ckpt``,
so the restarted job resumes from the step it was stopped at, not from the last epoch's end. Outside SLURM (no
``SLURM_NTASKS``, or an interactive ``srun bash``) and without ``PROJECT_JOB_ID`` nothing changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project import adapters
from project.cluster.stop import StopOnSignal
from project.errors import UnreadableFile
from project.runs import files, layout, read, resume

log = logging.getLogger("project")
JOB_ID_VAR = "PROJECT_JOB_ID"


def slurm_job() -> str | None:
    """This batch job's id as ``scontrol requeue`` takes it (``<array job>_<task>`` for array tasks); outside a
    SLURM batch job (Lightning's ``SLURMEnvironment.detect()``), ``$PROJECT_JOB_ID`` (another scheduler's job
    id, the same for every restart); else None."""
    if not SLURMEnvironment.detect():
        return os.environ.get(JOB_ID_VAR) or None
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array is not None:
        return f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID', '0')}"
    return os.environ.get("SLURM_JOB_ID")


# The key of the fit this process started (fit_key of its config), recorded by SlurmRequeue at setup. A module value
# because the callback is built from the config after prepare ran; one fit at a time per process (a sweep's trials
# run one after another, each through prepare).
_started_fit: str | None = None


def fit_key(cfg: Any) -> str:
    """A digest (16 hex digits) of the fit's config as given: what tells one fit of a job from another. Taken before
    the seed is drawn (``seed_everything: true`` stays ``true``), without ``ckpt_path`` and the config file names, and
    without ``trainer.precision`` under ``auto_precision`` (a requeue may land on another kind of node)."""
    data = cfg.clone().as_dict() if hasattr(cfg, "as_dict") else dict(cfg)
    for key in ("ckpt_path", "config", "__path__"):
        data.pop(key, None)
    trainer = data.get("trainer")
    if isinstance(trainer, dict) and data.get("auto_precision"):
        trainer.pop("precision", None)
    text = json.dumps(data, sort_keys=True, default=_stable_text)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _stable_text(value: Any) -> str:
    """A config value JSON cannot hold (a function, a class, an object) as text that is the same in every process:
    its import path, not a repr with a memory address."""
    if hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", str(value))


def restart_count() -> int | None:
    """SLURM's ``SLURM_RESTART_COUNT`` of this start (0 before the first requeue); None outside SLURM."""
    if not SLURMEnvironment.detect():
        return None
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def _record(run: Path) -> dict[str, Any]:
    """The run's ``slurm_job.json`` (job id and starts), read once; ``{}`` when missing, unreadable or not a mapping."""
    try:
        data = read.read_json(run / layout.SLURM_JOB, what="a run's SLURM record")
    except UnreadableFile:
        return {}
    return data if isinstance(data, dict) else {}


def restarts_this_fit(record: dict[str, Any], key: str) -> bool:
    """Whether this start continues the fit that a run of this job holds (``record``: its :func:`_record`): its starts
    were of the same fit key (a run recorded before keys existed counts as the same), and, under SLURM, this start's
    restart count is higher than theirs (the same count: another fit of the same start of the job, e.g. a loop in
    one script)."""
    starts = record.get("starts")
    starts = [s for s in starts if isinstance(s, dict)] if isinstance(starts, list) else []
    if any(s.get("fit", key) != key for s in starts):
        return False
    count = restart_count()
    if count is None or not starts:
        return True
    return all(isinstance(s.get("restart_count"), int) and s["restart_count"] < count for s in starts)


def job_of(run: Path, record: dict[str, Any] | None = None) -> str | None:
    """The SLURM job id recorded in a run folder (in ``record``, its :func:`_record`, when already read), or None
    (not written by a SLURM job, or unreadable)."""
    data = _record(run) if record is None else record
    return str(data.get("job")) if data.get("job") is not None else None


def next_preemption_checkpoint(folder: Path) -> Path:
    """``hpc_ckpt_<k>.ckpt`` in ``folder`` with ``k`` one above the highest there (1 in an empty folder), the name
    Lightning's SIGUSR1 handler gives its checkpoint, so that both kinds sort and resume alike."""
    prefix = layout.HPC_CKPT_PREFIX
    numbers = [int(n) for p in folder.glob(f"{prefix}*.ckpt") if (n := p.stem.removeprefix(prefix)).isdigit()]
    return folder / f"{prefix}{max(numbers, default=0) + 1}.ckpt"


def newest_checkpoint(run: Path) -> Path | None:
    """The run's newest resumable checkpoint: a preemption ``hpc_ckpt_<k>.ckpt`` or ``last.ckpt`` (by mtime)."""
    folder = run / layout.CHECKPOINTS
    found = [p for p in [*folder.glob(f"{layout.HPC_CKPT_PREFIX}*.ckpt"), folder / layout.LAST_CKPT] if p.is_file()]
    return max(found, key=os.path.getmtime) if found else None


def prepare(cfg: Any) -> None:
    """Under SLURM, before the Trainer is built: if this job id already has a run with a checkpoint (the job
    was requeued), resume that run in place from its newest checkpoint.

    Does nothing outside SLURM, without a TensorBoardLogger, or when ``ckpt_path`` or the logger's version
    was set explicitly. Every rank reads the same run folders (written by the job's previous start), so all
    agree on the run without talking to each other.
    """
    global _started_fit
    job = slurm_job()
    _started_fit = fit_key(cfg) if job is not None else None
    logger = cfg.trainer.logger
    experiment = resume._logger_dir(logger)
    if job is None or experiment is None or cfg.ckpt_path is not None or logger.init_args.version is not None:
        return
    key = _started_fit
    assert key is not None
    records = {run: _record(run) for run in layout.runs_of(experiment)}
    mine = [run for run, rec in records.items() if job_of(run, rec) == job and restarts_this_fit(rec, key)]
    if not mine:
        return
    ckpt = newest_checkpoint(mine[-1])
    if ckpt is None:
        log.warning("job %s: %s holds no checkpoint to resume; starting a new run", job, mine[-1])
        return
    cfg.ckpt_path = str(ckpt)
    logger.init_args.version = layout.version_of(mine[-1])
    log.info("job %s was requeued: resuming %s from %s", job, mine[-1], ckpt.name)


class SlurmRequeue(StopOnSignal):
    """Under SLURM (or with ``PROJECT_JOB_ID``): Lightning's preemption checkpoint goes into the run's
    ``checkpoints/``, a SIGTERM saves one too, and rank 0 records the job in the run folder (``slurm_job.json``), so
    a requeued or restarted start finds both. Everywhere: a SIGTERM stops every process of the run at the same point
    (:class:`~project.cluster.stop.StopOnSignal`). Every run has it (``slurm_requeue`` in ``--print_config``).

    Lightning saves the SIGUSR1 preemption checkpoint into ``trainer.default_root_dir``; that is set here, from
    the run folder all ranks agree on (``trainer.log_dir``, broadcast by Lightning), at ``setup``. On SIGTERM
    Lightning's loops raise ``SIGTERMException`` at a point every rank agreed on (:mod:`project.cluster.stop`);
    :meth:`on_exception` then saves
    ``hpc_ckpt_<k>.ckpt`` there with ``Trainer.save_checkpoint`` (a collective: every rank calls it) before fit
    ends. The checkpoint holds the loops' position, so the resumed run continues with the next batch.
    """

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage != "fit" or slurm_job() is None:
            return
        log_dir = trainer.log_dir  # a collective under DDP (a broadcast): read once, on every rank
        if log_dir is None:
            return
        folder = Path(log_dir) / layout.CHECKPOINTS
        adapters.set_default_root_dir(trainer, str(folder))  # read by Lightning's SIGUSR1 handler
        if trainer.is_global_zero:
            folder.mkdir(parents=True, exist_ok=True)
            record_start(Path(log_dir))

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        job = slurm_job()
        if not isinstance(exception, SIGTERMException) or job is None or trainer.state.fn != TrainerFn.FITTING:
            return
        folder = Path(trainer.default_root_dir)  # the run's checkpoints/ (setup); the same test on every rank
        if folder.name != layout.CHECKPOINTS:
            return  # stopped before setup pointed it at the run
        path = next_preemption_checkpoint(folder)
        trainer.save_checkpoint(path)
        log.warning("job %s: SIGTERM: saved %s; a restart of this job resumes from it", job, path)


def record_start(run: Path) -> None:
    """Add this start (job id, restart count, node list) to the run's ``slurm_job.json`` (rank 0, under SLURM or
    with ``PROJECT_JOB_ID``; the restart count is ``SLURM_RESTART_COUNT``, else the number of earlier starts)."""
    job = slurm_job()
    if job is None:
        return
    data = _record(run)
    data = data if data.get("job") == job else {"job": job, "starts": []}
    data["starts"].append(
        {
            "restart_count": int(os.environ.get("SLURM_RESTART_COUNT") or len(data["starts"])),
            "nodes": os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST"),
            "fit": _started_fit,  # fit_key of this start's config: which fit of the job this run is
        }
    )
    files.write_json(run / layout.SLURM_JOB, data)


RANK_VARIABLES = ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "JSM_NAMESPACE_RANK")


def is_global_rank_zero() -> bool:
    """Whether this process is (or will be) the run's global rank 0, read from the launcher's environment
    before any process group exists: torchrun (``RANK``, ``GROUP_RANK``), SLURM's ``srun`` (``SLURM_PROCID``),
    Lightning's own launcher (``LOCAL_RANK``, ``NODE_RANK``), LSF (``JSM_NAMESPACE_RANK``). A variable set to
    anything but 0 means another rank."""
    return all(os.environ.get(name, "0") in ("", "0") for name in RANK_VARIABLES)
