"""Clusters, simulated on one CPU machine: SLURM preemption and requeue.

What these tests check is about processes (signals, requeue and resume, rendezvous, shared storage), not about the
data: they run fashion_mnist.yaml on the tiny MNIST-format data set of ``tests/tiny_data.py``, imported as
Fashion-MNIST, with one OpenMP thread per process. Its md5 and size tables are patched in the test's process; the
Python processes a test starts get the same tables from a ``sitecustomize.py`` on their ``PYTHONPATH``
(:func:`tiny_data.tables_site`), so their commands are unchanged and the processes they start in turn (DDP ranks,
torchrun's workers) have them too. An uninterrupted reference run that is not about processes trains in the test's
process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml
from helpers import (
    LAUNCH_VARIABLES,
    REPO,
    clean_env,
    free_port_for_slurm,
    job_torchrun_args,
    results,
    run_dirs,
    run_main,
    sigterm_to_pid_1,
    slurm_task,
)
from tiny_data import make_image_folder, make_tiny_mnist, tables_site, with_site

from project.data.modules import FashionMNISTDataModule

# The tiny set's 600 training images: 500 train in batches of 20 (25 per epoch, 13 per DDP process; the tests'
# limit_*_batches cut every loader shorter, as on the real data), 100 validate; 100 test images.
TINY = ["--data.val_size", "100", "--data.batch_size", "20"]


def tiny_fashion(paths: dict) -> dict:
    """The tiny data set ``paths`` (:func:`tiny_data.make_tiny_mnist`, its tables patched in this process now)
    imported into ``paths["data"]`` as Fashion-MNIST, and ``site``: a folder whose ``sitecustomize.py`` patches the
    same tables in a Python process that has it on ``PYTHONPATH`` (:func:`tiny_data.with_site`)."""
    FashionMNISTDataModule(data_dir=str(paths["data"]), source_dir=str(paths["source"])).prepare_data()
    return {**paths, "site": tables_site(paths["source"].parent / "site")}


@pytest.fixture
def tiny(tiny_mnist) -> dict:
    """:func:`tiny_fashion` of the ``tiny_mnist`` fixture: its tables stay patched in this process for the test."""
    return tiny_fashion(tiny_mnist)


def slurm_env(tmp_path, tiny: dict, job: str, restart: int, **extra: str) -> dict[str, str]:
    """SLURM's batch-job environment, with a stub ``scontrol`` on PATH that records what it was asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "scontrol"
    stub.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.log"}\n')
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        PYTHONPATH=f"{REPO / 'tests'}{os.pathsep}{REPO}",
        SLURM_JOB_ID=job,
        SLURM_NTASKS="1",
        SLURM_JOB_NAME="fit",
        SLURM_NODEID="0",
        SLURM_PROCID="0",
        SLURM_LOCALID="0",
        SLURM_NODELIST="node1",
        SLURM_RESTART_COUNT=str(restart),
        **extra,
    )
    return with_site(env, tiny["site"])


def fit(args, tmp_path, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "project.fit", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )


def weights(run):
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def resume_args(tiny, logs, callback: str) -> list[str]:
    """fashion_mnist.yaml on the tiny data for 3 deterministic epochs of 10 steps into ``logs``, with a test-only
    ``callback`` that interrupts the run (``tests/`` on ``PYTHONPATH``)."""
    return [
        "--config",
        str(REPO / "configs/fashion_mnist.yaml"),
        "--data.data_dir",
        str(tiny["data"]),
        *TINY,
        "--trainer.limit_train_batches",
        "10",
        "--trainer.limit_val_batches",
        "3",
        "--trainer.limit_test_batches",
        "3",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.max_epochs",
        "3",
        "--trainer.deterministic",
        "true",
        "--trainer.logger.init_args.save_dir",
        str(logs),
        f"--trainer.callbacks+={callback}",
    ]


def reference_run(args, tmp_path, monkeypatch) -> Path:
    """The uninterrupted reference of ``args``, named ``ref``, trained in this process (no launcher's variables, one
    thread, as the subprocesses run); returns its run folder."""
    for name in [k for k in os.environ if k.startswith((*LAUNCH_VARIABLES, "PREEMPT_AT", "SIGTERM_"))]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with mock.patch.dict(os.environ):  # what the run sets there (PL_GLOBAL_SEED) stays out of the later commands
            assert run_main([*args, "--trainer.logger.init_args.name", "ref"]) == 0
    finally:
        torch.set_num_threads(threads)
    (ref_run,) = run_dirs(tmp_path / "logs")
    return ref_run


def check_resumed_like_reference(logs, run, ref_run) -> dict:
    """The resumed job finished in its one ``fashion_mnist`` run folder ``run`` with the uninterrupted ``ref_run``'s
    results and weights, exactly; returns the run's ``slurm_job.json``."""
    assert [r for r in run_dirs(logs) if r.parent.name == "fashion_mnist"] == [run]  # one run folder
    got, want = results(run), results(ref_run)
    for key in ("test_acc", "test_loss", "best_val_acc", "epochs", "global_step"):
        assert got[key] == want[key], key
    a, b = weights(run), weights(ref_run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return json.loads((run / "slurm_job.json").read_text())


def test_slurm_requeue_resumes_in_the_same_run_with_the_same_result(tiny, tmp_path, monkeypatch):
    args = resume_args(tiny, tmp_path / "logs", "helpers.Preempt")
    ref_run = reference_run(args, tmp_path, monkeypatch)  # uninterrupted (in this process, no job)
    # job 4242: SIGUSR1 at step 15 (mid epoch 2 of 3, 10 steps each), killed at step 17
    env = slurm_env(tmp_path, tiny, "4242", 0, PREEMPT_AT="15")
    first = fit(args, tmp_path, env)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    (run,) = [r for r in run_dirs(tmp_path / "logs") if r.parent.name == "fashion_mnist"]
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    hpc = run / "checkpoints" / "hpc_ckpt_1.ckpt"
    assert torch.load(hpc, map_location="cpu", weights_only=True)["global_step"] == 15
    assert not (run / "results.json").exists()
    # the requeued job: same command, same job id
    second = fit(args, tmp_path, slurm_env(tmp_path, tiny, "4242", 1))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "requeued" in second.stderr and "hpc_ckpt_1.ckpt" in second.stderr
    job = check_resumed_like_reference(tmp_path / "logs", run, ref_run)
    assert job["job"] == "4242" and [s["restart_count"] for s in job["starts"]] == [0, 1]
    assert (run / "config-resume-1.yaml").is_file()


# The nodes: ``nodes`` processes forked from one interpreter that has imported the slow third-party libraries once
# (not the project: each process imports it itself, so they share nothing of it, only the folder). Each logs into its
# own file; they start prepare_data together, once all are ready. The tiny set's import is made to last a second, as
# a real-size one does, so that the others arrive while it holds the lock. Prints the processes' exit statuses.
PREPARE = """
import json, logging, os, sys, time, traceback
from pathlib import Path
import lightning, torchvision
data, source, folder, nodes = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
pids = []
for node in range(nodes):
    pid = os.fork()
    if pid == 0:
        code = 1
        with open(folder / f"{node}.log", "w") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
                from project.data.modules import FashionMNISTDataModule
                import_archives = FashionMNISTDataModule.import_archives
                def slow_import(self, source_dir):
                    time.sleep(1)
                    import_archives(self, source_dir)
                FashionMNISTDataModule.import_archives = slow_import
                (folder / f"{node}.ready").touch()
                while not (folder / "go").exists():  # start together
                    time.sleep(0.005)
                FashionMNISTDataModule(data_dir=data, source_dir=source).prepare_data()
                print("ready")
                code = 0
            except BaseException:
                traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    pids.append(pid)
deadline = time.time() + 120
while len(list(folder.glob("*.ready"))) < nodes and time.time() < deadline:
    time.sleep(0.005)
(folder / "go").touch()
print(json.dumps([os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]))
"""


def test_concurrent_prepare_on_shared_storage_imports_once(tiny, tmp_path):
    """Several nodes' ``prepare_data`` on one shared folder at once: one import, the others wait, files intact."""
    data, folder = tmp_path / "shared" / "data", tmp_path / "nodes"
    folder.mkdir()
    env = with_site(clean_env(), tiny["site"])
    proc = subprocess.run(
        [sys.executable, "-c", PREPARE, str(data), str(tiny["source"]), str(folder), "4"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = json.loads(proc.stdout.splitlines()[-1])
    outputs = [(folder / f"{node}.log").read_text() for node in range(4)]
    assert codes == [0, 0, 0, 0], outputs
    assert all(o.rstrip().endswith("ready") for o in outputs)
    assert sum(o.count("importing FashionMNIST") for o in outputs) == 1, outputs
    assert any("waiting for another process" in o for o in outputs), outputs  # they did meet at the lock
    dm = FashionMNISTDataModule(data_dir=str(data))
    dm.verify(md5=True)  # every file whole and as published (the tiny set's tables)
    assert not [p for p in data.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".extract")]


# Stubs for scripts/*.sbatch. srun: records its options and the CPUs per task it was given, sets one task's
# variables (rank 5 of 8, GPU 2), drops its own options (Pyxis' --container-* among them) and execs the task.
SRUN_STUB = """#!/bin/bash
echo "srun $* | cpus=${{SRUN_CPUS_PER_TASK:-}}" >> {log}
export SLURM_PROCID=5 SLURM_NTASKS=8 SLURM_LOCALID=1 CUDA_VISIBLE_DEVICES=2
while [[ "$1" == --* ]]; do shift; done
exec "$@"
"""
# The container (as `apptainer`, and as `python` for Pyxis, whose task is the container's process): records what
# it was given; a training task, on SIGUSR1, saves hpc_ckpt_1.ckpt (whole, by a rename, as fit does), goes on for
# 2 s (Lightning keeps training) and exits 3.
CONTAINER_STUB = """#!/bin/bash
task=${{APPTAINERENV_SLURM_PROCID:-${{SLURM_PROCID:-}}}}
gpus=${{APPTAINERENV_CUDA_VISIBLE_DEVICES:-${{CUDA_VISIBLE_DEVICES:-}}}}
nccl=${{APPTAINERENV_NCCL_SOCKET_IFNAME:-${{NCCL_SOCKET_IFNAME:-}}}}
echo "$(basename "$0") $* | procid=$task gpus=$gpus nccl=$nccl host_path=${{APPTAINERENV_PYTHONPATH:-}}" >> {log}
case "$*" in *project.fit*) ;; *) exit 0 ;; esac
save() {{
  echo task-got-USR1 >> {log}
  mkdir -p logs/cifar10/version_0/checkpoints && cd logs/cifar10/version_0/checkpoints
  echo ckpt > .hpc.tmp && mv .hpc.tmp hpc_ckpt_1.ckpt && echo task-saved >> {log}
  sleep 2; echo task-exits >> {log}; exit 3
}}
trap save USR1
echo task-started >> {log}
while true; do sleep 0.05; done
"""


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis"])
def test_sbatch_script_checkpoints_then_requeues_on_the_preemption_signal(runtime, tmp_path):
    """scripts/slurm.sbatch with stub srun/apptainer/scontrol, for Apptainer and Pyxis: the data is prepared in the
    image before the training srun; srun gets the CPUs per task (SRUN_CPUS_PER_TASK) and --kill-on-bad-exit=1; an
    Apptainer task runs ``apptainer exec --cleanenv`` with its SLURM variables, its GPUs and the site's NCCL/proxy
    settings passed in by name (nothing else of the host's); a Pyxis task runs in ``srun --container-image``. On
    SIGUSR1 to the batch shell the tasks save their checkpoint, and only then is the job requeued, from outside the
    container; the script exits with the tasks' status."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(SRUN_STUB.format(log=log))
    (bin_dir / ("apptainer" if runtime == "apptainer" else "python")).write_text(CONTAINER_STUB.format(log=log))
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "scontrol $*" >> {log}\n')
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NCCL_", "UCX_"))}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        SLURM_JOB_ID="77",
        SLURM_CPUS_PER_TASK="8",
        NCCL_SOCKET_IFNAME="ib0",
        PYTHONPATH="/host/site-packages",
        RUNTIME=runtime,
        IMAGE="project.sif" if runtime == "apptainer" else "project.sqsh",
    )
    proc = subprocess.Popen(
        ["bash", str(REPO / "scripts" / "slurm.sbatch")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 30
    while not (log.exists() and "task-started" in log.read_text()) and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 3, out  # the tasks' exit status
    lines = log.read_text().splitlines()
    calls = [line for line in lines if not line.startswith("task-")]
    events = [line for line in lines if line.startswith(("task-", "scontrol"))]
    if runtime == "apptainer":
        prepare, srun, task, requeue = calls
        image = "apptainer exec --nv --cleanenv --bind"
        assert prepare.startswith(image) and "download=False).prepare_data()" in prepare and "procid= gpus=" in prepare
        assert srun.startswith("srun --kill-on-bad-exit=1 bash -c") and srun.endswith("| cpus=8")
        assert task.startswith(image) and task.endswith("| procid=5 gpus=2 nccl=ib0 host_path=")
    else:
        srun_prepare, prepare, srun, task, requeue = calls
        assert srun_prepare.startswith("srun --ntasks=1 --nodes=1 --container-image=project.sqsh --container-mounts=")
        assert "download=False).prepare_data()" in prepare
        assert srun.startswith("srun --kill-on-bad-exit=1 --container-image=project.sqsh --container-mounts=")
        assert srun.endswith("| cpus=8") and "--container-workdir=/app python -m project.fit" in srun
        assert task.endswith("| procid=5 gpus=2 nccl=ib0 host_path=")
    assert "python -m project.fit" in task and "--data.download false" in task
    assert requeue == "scontrol requeue 77"
    # the checkpoint first, then the requeue (which would end the tasks), while the task still runs
    assert events == ["task-started", "task-got-USR1", "task-saved", "scontrol requeue 77", "task-exits"], events
    assert "preemption signal" in out and (tmp_path / "data").is_dir()
    assert not list((tmp_path / "logs").glob(".signal.*"))


def test_sweep_array_script_runs_the_same_worker_in_every_task(tmp_path):
    """scripts/slurm-sweep.sbatch with a stub apptainer: each array task runs ``project.sweep`` in the image with
    --cleanenv and the study's URL passed in (APPTAINERENV_OPTUNA_STORAGE), never on its command line; without
    OPTUNA_STORAGE it stops with one error line before starting anything. A preempted task is requeued."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(
        f'#!/bin/sh\necho "$* | $APPTAINERENV_OPTUNA_STORAGE | ${{APPTAINERENV_CUDA_VISIBLE_DEVICES:-}}" >> {log}\n'
    )
    (bin_dir / "apptainer").chmod(0o755)
    url = "postgresql+psycopg2://sweeps:secret@db:5432/sweeps"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OPTUNA_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SLURM_ARRAY_TASK_ID="3", CUDA_VISIBLE_DEVICES="1")
    script = ["bash", str(REPO / "scripts" / "slurm-sweep.sbatch")]
    for task in ("3", "4"):
        done = subprocess.run(script, cwd=tmp_path, env={**env, "SLURM_ARRAY_TASK_ID": task, "OPTUNA_STORAGE": url})
        assert done.returncode == 0
    first, second = log.read_text().splitlines()
    assert first == second  # the same worker in every task
    command, storage, gpus = first.split(" | ")
    assert command.startswith("exec --nv --cleanenv --bind") and storage == url and "secret" not in command
    assert gpus == "1"  # the task's GPU, through --cleanenv
    assert command.endswith("python -m project.sweep --config configs/sweeps/lr.yaml --trainer.accelerator gpu "
                            "--trainer.devices 1")  # fmt: skip
    assert (REPO / "configs/sweeps/lr.yaml").is_file()
    assert "#SBATCH --requeue" in (REPO / "scripts/slurm-sweep.sbatch").read_text().splitlines()
    missing = subprocess.run(script, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.startswith("error: OPTUNA_STORAGE is not set")
    assert len(missing.stderr.splitlines()) == 1 and len(log.read_text().splitlines()) == 2


SWEEP_WORKER_STUB = """#!/bin/bash
stop() {{ echo worker-got-TERM >> {log}; sleep 0.3; echo worker-saved-and-exits >> {log}; exit 143; }}
trap stop TERM
echo worker-started >> {log}
while true; do sleep 0.05; done
"""


@pytest.mark.parametrize(("sig", "requeued"), [(signal.SIGUSR1, True), (signal.SIGTERM, False)], ids=["USR1", "TERM"])
def test_sweep_array_task_stops_its_worker_then_requeues_on_the_time_limit_signal(sig, requeued, tmp_path):
    """scripts/slurm-sweep.sbatch under a simulated SLURM task: the time-limit signal (``--signal=B:USR1@120``) is
    SIGTERM to the worker (which saves its trial and exits 143), and only after the worker has exited is the task
    requeued; scancel's SIGTERM stops the worker the same way with no requeue. The task exits with the worker's
    status."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(SWEEP_WORKER_STUB.format(log=log))
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "scontrol $*" >> {log}\n')
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OPTUNA_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SLURM_JOB_ID="91", OPTUNA_STORAGE="sqlite:///s.db")
    script = REPO / "scripts" / "slurm-sweep.sbatch"
    assert "#SBATCH --signal=B:USR1@120" in script.read_text().splitlines()
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (log.exists() and "worker-started" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143, out
    events = log.read_text().splitlines()
    assert (
        events == ["worker-started", "worker-got-TERM", "worker-saved-and-exits"] + ["scontrol requeue 91"] * requeued
    )
    assert ("requeueing" in out) == requeued


def test_sigterm_stops_fit_as_a_kill_and_keeps_the_run(tiny, tmp_path):
    """``docker stop``, ``scancel`` and Kubernetes send SIGTERM: fit stops at the next step with one line, keeps
    the run folder with its checkpoint, and ends by SIGTERM itself (exit 143 in a shell), not with status 0."""
    args = [
        "--config",
        str(REPO / "configs/fashion_mnist.yaml"),
        "--data.data_dir",
        str(tiny["data"]),
        *TINY,
        "--trainer.limit_train_batches",
        "10",
        "--trainer.limit_val_batches",
        "3",
        "--trainer.limit_test_batches",
        "3",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.max_epochs",
        "3",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "logs"),
        "--trainer.callbacks+=helpers.Sigterm",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PYTHONPATH=f"{REPO / 'tests'}{os.pathsep}{REPO}", SIGTERM_AT="15")
    proc = fit(args, tmp_path, with_site(env, tiny["site"]))
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "stopped by SIGTERM" in errors[0], proc.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "logs")
    assert (run / "checkpoints" / "last.ckpt").is_file() and not (run / "results.json").exists()


def ddp_args(tmp_path, tiny, name: str, devices: int, nodes: int) -> list[str]:
    return [
        "--config",
        str(REPO / "configs/fashion_mnist.yaml"),
        "--data.data_dir",
        str(tiny["data"]),
        *TINY,
        "--data.num_workers",
        "0",
        "--data.persistent_workers",
        "false",
        "--trainer.accelerator",
        "cpu",
        "--trainer.strategy",
        "ddp",
        "--trainer.devices",
        str(devices),
        "--trainer.num_nodes",
        str(nodes),
        "--trainer.limit_train_batches",
        "6",
        "--trainer.limit_val_batches",
        "2",
        "--trainer.limit_test_batches",
        "2",
        "--trainer.max_epochs",
        "2",
        "--trainer.deterministic",
        "true",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / name),
        "--trainer.logger.init_args.name",
        "fashion",
    ]


def wait_all(procs) -> list[tuple[int, str]]:
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=300)  # a hang (a collective only some ranks make) fails
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out))
    return outs


def check_same_as_reference(logs, ref_run, outs) -> None:
    assert all(rc == 0 for rc, _ in outs), "\n".join(out[-3000:] for _, out in outs)
    (run,) = run_dirs(logs)  # one run folder for both nodes
    assert [p.name for p in run.rglob("results.json")] == ["results.json"]
    got, want = results(run), results(ref_run)
    for key in ("test_acc", "test_loss", "best_val_acc", "epochs", "global_step"):
        assert got[key] == want[key], key
    assert got["global_step"] == 12  # 2 epochs x 6 batches per process
    a, b = weights(run), weights(ref_run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def ddp_tiny(tmp_path_factory):
    """The tiny data set of :func:`tiny_fashion` for the module's DDP tests (its tables patched here only while it is
    imported; the processes get them from its ``site``)."""
    with pytest.MonkeyPatch.context() as mp:
        return tiny_fashion(make_tiny_mnist(tmp_path_factory.mktemp("ddp_tiny") / "mnist", mp))


@pytest.fixture(scope="module")
def one_node_two_processes(ddp_tiny, tmp_path_factory):
    """The reference: 1 node x 2 DDP processes on the CPU, launched by Lightning itself (configs/trainer/ddp_cpu)."""
    tmp_path = tmp_path_factory.mktemp("ddp_ref")
    args = ddp_args(tmp_path, ddp_tiny, "logs", devices=2, nodes=1)
    proc = subprocess.run(
        [sys.executable, "-m", "project.fit", *args],
        cwd=tmp_path,
        env=with_site(clean_env(), ddp_tiny["site"]),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "logs")
    return run


@pytest.mark.slow
def test_two_slurm_nodes_on_one_machine_train_as_one_node_with_two_processes(
    one_node_two_processes, ddp_tiny, tmp_path
):
    """2 nodes x 1 task as ``srun`` starts scripts/slurm.sbatch's command (each task's SLURM_* variables, the
    node list naming the first node, the port Lightning derives from the job id), on 127.0.0.1: one run folder,
    one results.json, and the result and weights of 1 node x 2 processes."""
    job, _ = free_port_for_slurm()
    args = ddp_args(tmp_path, ddp_tiny, "logs", devices=1, nodes=2)
    procs = []
    for node in (0, 1):
        env = with_site(slurm_task(job, node, 2), ddp_tiny["site"])
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "project.fit", *args],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    check_same_as_reference(tmp_path / "logs", one_node_two_processes, wait_all(procs))
    (run,) = run_dirs(tmp_path / "logs")
    assert json.loads((run / "slurm_job.json").read_text())["job"] == job


@pytest.mark.slow
def test_two_torchrun_nodes_on_one_machine_train_as_one_node_with_two_processes(
    one_node_two_processes, ddp_tiny, tmp_path
):
    """2 nodes x 1 process started as deploy/kubernetes/train/train.yaml starts them (its torchrun arguments, node rank
    from the pod's completion index; here 1 CPU process per node, master on 127.0.0.1): one run folder, one
    results.json, the result of 1 node x 2 processes."""
    _, port = free_port_for_slurm()
    args = ddp_args(tmp_path, ddp_tiny, "logs", devices=1, nodes=2)
    procs = []
    for node in (0, 1):
        torchrun = job_torchrun_args(node, port)
        assert "--nnodes=2" in torchrun and f"--node_rank={node}" in torchrun
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "project.cli.torchrun", *torchrun, *args],  # as the image runs torchrun
                cwd=tmp_path,
                env=with_site(clean_env(), ddp_tiny["site"]),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    check_same_as_reference(tmp_path / "logs", one_node_two_processes, wait_all(procs))


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (Linux ``/proc``): a node lost with all it ran. torchrun's workers
    run in sessions of their own, so a process group would miss them."""
    tree, i = [pid], 0
    while i < len(tree):
        with contextlib.suppress(OSError):
            tree += [int(c) for c in Path(f"/proc/{tree[i]}/task/{tree[i]}/children").read_text().split()]
        i += 1
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


@pytest.mark.slow
def test_a_gang_restart_after_one_node_is_lost_resumes_the_run_with_the_uninterrupted_result(
    one_node_two_processes, ddp_tiny, tmp_path
):
    """The JobSet's gang restart (deploy/kubernetes/jobset): 2 torchrun nodes of 1 process, node 1 lost with all its
    processes (SIGKILL) in the middle of the second epoch, node 0 then killed too (the JobSet deletes every pod),
    and both started again with the same command and the JobSet's PROJECT_JOB_ID (the run's name, the same at every
    restart): the gang resumes the run in place from the first epoch's last.ckpt and ends with the result of the
    uninterrupted 1 node x 2 processes run."""
    (jobset,) = [d for d in yaml.safe_load_all((REPO / "deploy/kubernetes/jobset/jobset.yaml").read_text())
                 if d["kind"] == "JobSet"]  # fmt: skip
    (container,) = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
    job_id = next(e["value"] for e in container["env"] if e["name"] == "PROJECT_JOB_ID")
    ready, sent = tmp_path / "ready", tmp_path / "sent"
    env = with_site(clean_env(PROJECT_JOB_ID=job_id), ddp_tiny["site"])
    env.update(SIGNAL_AT="8", SIGNAL_READY=str(ready), SIGNAL_SENT=str(sent))  # step 8: epoch 2's second step
    args = [*ddp_args(tmp_path, ddp_tiny, "logs", devices=1, nodes=2), "--trainer.callbacks+=helpers.WaitForSignal"]
    _, port = free_port_for_slurm()

    def start(node: int) -> subprocess.Popen:
        command = [sys.executable, "-m", "project.cli.torchrun", *job_torchrun_args(node, port), *args]
        return subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)  # fmt: skip

    nodes = [start(0), start(1)]
    deadline = time.monotonic() + 180
    while not ready.exists():
        assert all(p.poll() is None for p in nodes) and time.monotonic() < deadline, "the gang never reached step 8"
        time.sleep(0.1)
    (run,) = run_dirs(tmp_path / "logs")
    assert (run / "checkpoints" / "last.ckpt").is_file() and not (run / "results.json").exists()
    for node in (1, 0):  # node 1 lost, then the gang's other pod deleted
        kill_tree(nodes[node].pid)
        nodes[node].communicate(timeout=60)
    sent.touch()  # the restarted gang does not wait at step 8
    outs = wait_all([start(0), start(1)])
    check_same_as_reference(tmp_path / "logs", one_node_two_processes, outs)
    assert (run / "config-resume-1.yaml").is_file()  # resumed in place


def test_an_image_folder_under_ddp_gives_every_rank_the_same_classes_split_and_statistics(tmp_path):
    """Your own images (configs/image_folder.yaml) and your own net (``helpers.OwnNet``, a package outside the
    project) in a 2-process CPU DDP run: the decode cache is written once and read by both ranks, and both hold the
    same classes, the same seeded train/val split and the same training-split statistics, each with half the
    training batches; the run records the folder's classes and the net, its parameters counted from its layers."""
    data = make_image_folder(tmp_path / "images", per_class=40)
    records = tmp_path / "records"
    records.mkdir()
    args = [
        *("--config", str(REPO / "configs/image_folder.yaml"), "--data.data_dir", str(data)),
        *("--data.batch_size", "16", "--trainer.accelerator", "cpu", "--trainer.strategy", "ddp"),
        *("--trainer.devices", "2", "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false"),
        *("--trainer.logger.init_args.save_dir", str(tmp_path / "logs"), "--trainer.callbacks+=helpers.DataRecord"),
        *("--model.net", "helpers.OwnNet", "--model.net.in_channels", "3"),
    ]
    env = clean_env(DATA_RECORD_DIR=str(records))
    command = [sys.executable, "-m", "project.fit", *args]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0, rank1 = (json.loads((records / f"data-rank{r}.json").read_text()) for r in (0, 1))
    assert rank0 == rank1 and rank0["classes"] == ["cat", "dog", "frog"]
    assert rank0["batches"] == 4  # 108 training images (a tenth of 120 validates), 54 per rank in batches of 16
    assert len(list((data / ".cache").glob("images-*.pt"))) == 1
    (run,) = run_dirs(tmp_path / "logs")
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["data"]["init_args"]["classes"] == ["cat", "dog", "frog"] and results(run)["global_step"] == 8
    assert config["model"]["net"] == {"class_path": "helpers.OwnNet", "init_args": {"in_channels": 3}}
    assert results(run)["params"] == 3 * 72 + 8 + 128 * 3 + 3 and results(run)["test_acc"] is not None


@pytest.mark.parametrize("phase", ["step", "validation", "test"])
def test_sigterm_in_any_phase_of_a_ddp_run_stops_both_processes_and_the_requeue_resumes_exactly(
    phase, ddp_tiny, one_node_two_processes, tmp_path
):
    """A SIGTERM that reaches one process of a 2-process run: rank 1 in a training step of the second epoch (one task
    signalled; the requeue is then the exact resume of a DDP run from the middle of an epoch), or
    rank 0 (``docker stop`` signals the launching process) during the validation or the test. Lightning's own
    handler left the processes hung in a collective only one had entered, or stopped one and not the other; here
    both stop where they agreed to (project.cluster.stop), each with one error line, and end by
    SIGTERM. The requeue (the same job id and config) ends with the uninterrupted run's results and weights: a
    validation is not cut short (a run resumed from inside one would skip it and its checkpoint), a stopped test is
    run again."""
    args = [*ddp_args(tmp_path, ddp_tiny, "logs", devices=2, nodes=1), "--trainer.callbacks+=helpers.Sigterm"]
    env = with_site(clean_env(PROJECT_JOB_ID="stop-job"), ddp_tiny["site"])
    signal_at = {
        "step": {"SIGTERM_AT": "9", "SIGTERM_RANK": "1"},  # 3 batches into epoch 1: each rank's sampler shard
        "validation": {"SIGTERM_IN": "validation"},
        "test": {"SIGTERM_IN": "test"},
    }
    command = [sys.executable, "-m", "project.fit", *args]
    # both processes write to the pipes: run() returns when the last of them has exited (or fails on a hang)
    stopped = subprocess.run(command, cwd=tmp_path, env={**env, **signal_at[phase]}, capture_output=True, text=True,
                             timeout=180)  # fmt: skip
    assert stopped.returncode == -signal.SIGTERM, stopped.stderr[-3000:]
    # one line from each process (the two may interleave in the shared pipe)
    assert stopped.stderr.count("error:") == stopped.stderr.count("error: stopped by SIGTERM") == 2, stopped.stderr
    (run,) = run_dirs(tmp_path / "logs")
    assert not (run / "results.json").exists()
    if phase != "test":  # a stop during the fit saves where it stopped
        assert [p.name for p in (run / "checkpoints").glob("hpc_ckpt_*.ckpt")] == ["hpc_ckpt_1.ckpt"]
        assert f"SIGTERM: saved {run / 'checkpoints' / 'hpc_ckpt_1.ckpt'}" in stopped.stderr
    # the requeue, as SLURM or a replaced pod (deploy/kubernetes: no SLURM variables) runs it: the same command and
    # PROJECT_JOB_ID resume that job's run in place
    requeued = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    check_same_as_reference(tmp_path / "logs", one_node_two_processes, [(requeued.returncode, requeued.stderr)])
    assert "job stop-job was requeued" in requeued.stderr
    job = json.loads((run / "slurm_job.json").read_text())
    assert job["job"] == "stop-job" and [s["restart_count"] for s in job["starts"]] == [0, 1]
    if phase != "test":
        assert "from hpc_ckpt_1.ckpt" in requeued.stderr and (run / "config-resume-1.yaml").is_file()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PID namespaces")
@pytest.mark.parametrize("launcher", ["fit", "torchrun"])
def test_sigterm_to_pid_1_reaches_fit_through_tini(launcher, tiny, tmp_path):
    """The image's PID 1 is tini (Dockerfile), as in a container: in a PID namespace of its own (``unshare --pid``)
    SIGTERM to PID 1, as ``docker stop`` or a pod's deletion sends it, reaches fit (run as ``python -m project.fit``,
    or as deploy/kubernetes/train's pods run it, under torchrun), which saves a checkpoint at that step and ends;
    tini ends with it (128 + SIGTERM) and takes every process of the namespace with it. Without tini the test is
    skipped, except in CI (``CI`` set), where .ci/run installs it (Debian: tini). The sweep worker's own case:
    tests/sweep/test_sweep.py."""
    if shutil.which("tini") is None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)("tini is needed (Debian: apt-get install tini)")
    ready, sent = tmp_path / "ready", tmp_path / "sent"
    args = resume_args(tiny, tmp_path / "logs", "helpers.WaitForSignal")
    env = with_site(
        clean_env(PROJECT_JOB_ID="pid1", SIGNAL_AT="15", SIGNAL_READY=str(ready), SIGNAL_SENT=str(sent)),
        tiny["site"],
    )
    command = [sys.executable, "-m", "project.fit"]
    if launcher == "torchrun":  # one node of one process, as the Job's pod starts it
        command = [
            sys.executable,
            "-m",
            "project.cli.torchrun",
            *job_torchrun_args(0, free_port_for_slurm()[1], NNODES="1"),
        ]
    returncode, out, init = sigterm_to_pid_1([*command, *args], tmp_path, env, ready, sent)
    assert returncode == 128 + signal.SIGTERM, out[-3000:]
    (run,) = [r for r in run_dirs(tmp_path / "logs") if r.parent.name == "fashion_mnist"]
    checkpoint = run / "checkpoints" / "hpc_ckpt_1.ckpt"
    assert torch.load(checkpoint, map_location="cpu", weights_only=True)["global_step"] in (15, 16)
    assert f"SIGTERM: saved {checkpoint}" in out and "Traceback" not in out
    if launcher == "torchrun":
        assert "error: torchrun stopped by SIGTERM; its training processes got it too" in out
    assert not (run / "results.json").exists()
    assert not Path(f"/proc/{init}").exists()
