"""Clusters, simulated on one CPU machine: SLURM preemption and requeue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import REPO, clean_env, free_port_for_slurm, job_torchrun_args, results, run_dirs, slurm_task


def slurm_env(tmp_path, job: str, restart: int, **extra: str) -> dict[str, str]:
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
    return env


def fit(args, tmp_path, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "project.fit", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )


def weights(run):
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def resume_args(fashion_data, logs, callback: str) -> list[str]:
    """fashion_mnist.yaml for 3 deterministic epochs of 10 steps into ``logs``, with a test-only ``callback`` that
    interrupts the run (``tests/`` on ``PYTHONPATH``)."""
    return [
        "--config",
        str(REPO / "configs/fashion_mnist.yaml"),
        "--data.data_dir",
        str(fashion_data),
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


def test_slurm_requeue_resumes_in_the_same_run_with_the_same_result(fashion_data, tmp_path):
    args = resume_args(fashion_data, tmp_path / "logs", "helpers.Preempt")
    # uninterrupted reference, as SLURM job 100
    ref = fit([*args, "--trainer.logger.init_args.name", "ref"], tmp_path, slurm_env(tmp_path, "100", 0))
    assert ref.returncode == 0, ref.stderr[-3000:]
    (ref_run,) = run_dirs(tmp_path / "logs")
    # job 4242: SIGUSR1 at step 15 (mid epoch 2 of 3, 10 steps each), killed at step 17
    env = slurm_env(tmp_path, "4242", 0, PREEMPT_AT="15")
    first = fit(args, tmp_path, env)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    (run,) = [r for r in run_dirs(tmp_path / "logs") if r.parent.name == "fashion_mnist"]
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    hpc = run / "checkpoints" / "hpc_ckpt_1.ckpt"
    assert torch.load(hpc, map_location="cpu", weights_only=True)["global_step"] == 15
    assert not (run / "results.json").exists()
    # the requeued job: same command, same job id
    second = fit(args, tmp_path, slurm_env(tmp_path, "4242", 1))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "requeued" in second.stderr and "hpc_ckpt_1.ckpt" in second.stderr
    job = check_resumed_like_reference(tmp_path / "logs", run, ref_run)
    assert job["job"] == "4242" and [s["restart_count"] for s in job["starts"]] == [0, 1]
    assert (run / "config-resume-1.yaml").is_file()


PREPARE = """
import logging, sys, time
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(message)s")
from project.data.modules import FashionMNISTDataModule
while not Path(sys.argv[3]).exists():  # start together
    time.sleep(0.005)
FashionMNISTDataModule(data_dir=sys.argv[1], source_dir=sys.argv[2]).prepare_data()
print("ready")
"""


def test_concurrent_prepare_on_shared_storage_imports_once(fashion_source, tmp_path):
    """Several nodes' ``prepare_data`` on one shared folder at once: one import, the others wait, files intact."""
    data, go = tmp_path / "shared" / "data", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PREPARE, str(data), str(fashion_source), str(go)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(4)
    ]
    go.touch()
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert all(o.rstrip().endswith("ready") for o in outputs)
    assert sum(o.count("importing FashionMNIST") for o in outputs) == 1, outputs
    from project.data.modules import FashionMNISTDataModule

    dm = FashionMNISTDataModule(data_dir=str(data))
    dm.verify(md5=True)  # every file whole and as published
    assert not [p for p in data.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".extract")]


def test_sbatch_script_checkpoints_and_requeues_on_the_preemption_signal(tmp_path):
    """scripts/slurm.sbatch with stub srun/apptainer/scontrol: the data is prepared in the image before srun; each
    task runs ``apptainer exec --cleanenv`` with its SLURM variables passed in as APPTAINERENV_SLURM_*; SIGUSR1 to
    the batch shell reaches the process in the container (srun, the task's exec'd apptainer), the job is
    requeued from outside the container, and the script exits with the tasks' status."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    # srun starts one task with the variables srun sets (SLURM_PROCID ...); exec: its signals reach the task
    (bin_dir / "srun").write_text('#!/bin/bash\nexport SLURM_PROCID=5 SLURM_NTASKS=8 SLURM_LOCALID=1\nexec "$@"\n')
    (bin_dir / "apptainer").write_text(
        "#!/bin/bash\n"
        f'echo "apptainer $* | env: $(env | grep -c ^SLURM_) SLURM, procid=${{APPTAINERENV_SLURM_PROCID:-}}" >> {log}\n'
        'case "$*" in *project.fit*) ;; *) exit 0 ;; esac\n'
        f"trap 'echo task-got-USR1 >> {log}; exit 3' USR1\necho task-started >> {log}\n"
        "while true; do sleep 0.05; done\n"
    )
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "scontrol $*" >> {log}\n')
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SLURM_JOB_ID="77")
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
    prepare, task, started, *rest = log.read_text().splitlines()
    image = "apptainer exec --nv --cleanenv --bind"
    assert prepare.startswith(image) and "prepare_data()" in prepare and prepare.endswith("procid=")
    assert task.startswith(image) and "python -m project.fit" in task and "--data.download false" in task
    assert task.endswith("procid=5")  # the task's own SLURM variables, passed in for Lightning
    assert started == "task-started" and sorted(rest) == ["scontrol requeue 77", "task-got-USR1"]
    assert "preemption signal" in out and (tmp_path / "data").is_dir()


def test_sweep_array_script_runs_the_same_worker_in_every_task(tmp_path):
    """scripts/slurm-sweep.sbatch with a stub apptainer: each array task runs ``project.sweep`` in the image with
    --cleanenv and the study's URL passed in (APPTAINERENV_OPTUNA_STORAGE), never on its command line; without
    OPTUNA_STORAGE it stops with one error line before starting anything."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(f'#!/bin/sh\necho "$* | $APPTAINERENV_OPTUNA_STORAGE" >> {log}\n')
    (bin_dir / "apptainer").chmod(0o755)
    url = "postgresql+psycopg2://sweeps:secret@db:5432/sweeps"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OPTUNA_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SLURM_ARRAY_TASK_ID="3")
    script = ["bash", str(REPO / "scripts" / "slurm-sweep.sbatch")]
    for task in ("3", "4"):
        done = subprocess.run(script, cwd=tmp_path, env={**env, "SLURM_ARRAY_TASK_ID": task, "OPTUNA_STORAGE": url})
        assert done.returncode == 0
    first, second = log.read_text().splitlines()
    assert first == second  # the same worker in every task
    command, storage = first.split(" | ")
    assert command.startswith("exec --nv --cleanenv --bind") and storage == url and "secret" not in command
    assert command.endswith("python -m project.sweep --config configs/sweeps/lr.yaml --trainer.accelerator gpu "
                            "--trainer.devices 1")  # fmt: skip
    assert (REPO / "configs/sweeps/lr.yaml").is_file()
    missing = subprocess.run(script, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.startswith("error: OPTUNA_STORAGE is not set")
    assert len(missing.stderr.splitlines()) == 1 and len(log.read_text().splitlines()) == 2


def test_sigterm_stops_fit_as_a_kill_and_keeps_the_run(fashion_data, tmp_path):
    """``docker stop``, ``scancel`` and Kubernetes send SIGTERM: fit stops at the next step with one line, keeps
    the run folder with its checkpoint, and ends by SIGTERM itself (exit 143 in a shell), not with status 0."""
    args = [
        "--config",
        str(REPO / "configs/fashion_mnist.yaml"),
        "--data.data_dir",
        str(fashion_data),
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
    proc = fit(args, tmp_path, env)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "stopped by SIGTERM" in errors[0], proc.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "logs")
    assert (run / "checkpoints" / "last.ckpt").is_file() and not (run / "results.json").exists()


def ddp_args(tmp_path, fashion_data, name: str, devices: int, nodes: int) -> list[str]:
    return [
        "--config",
        str(REPO / "configs/fashion_mnist.yaml"),
        "--data.data_dir",
        str(fashion_data),
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
def one_node_two_processes(fashion_data, tmp_path_factory):
    """The reference: 1 node x 2 DDP processes on the CPU, launched by Lightning itself (configs/trainer/ddp_cpu)."""
    tmp_path = tmp_path_factory.mktemp("ddp_ref")
    args = ddp_args(tmp_path, fashion_data, "logs", devices=2, nodes=1)
    proc = subprocess.run(
        [sys.executable, "-m", "project.fit", *args],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "logs")
    return run


@pytest.mark.slow
def test_two_slurm_nodes_on_one_machine_train_as_one_node_with_two_processes(
    one_node_two_processes, fashion_data, tmp_path
):
    """2 nodes x 1 task as ``srun`` starts scripts/slurm.sbatch's command (each task's SLURM_* variables, the
    node list naming the first node, the port Lightning derives from the job id), on 127.0.0.1: one run folder,
    one results.json, and the result and weights of 1 node x 2 processes."""
    job, _ = free_port_for_slurm()
    args = ddp_args(tmp_path, fashion_data, "logs", devices=1, nodes=2)
    procs = []
    for node in (0, 1):
        env = slurm_task(job, node, 2)
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
    one_node_two_processes, fashion_data, tmp_path
):
    """2 nodes x 1 process started as deploy/kubernetes/train/train.yaml starts them (its torchrun arguments, node rank
    from the pod's completion index; here 1 CPU process per node, master on 127.0.0.1): one run folder, one
    results.json, the result of 1 node x 2 processes."""
    _, port = free_port_for_slurm()
    args = ddp_args(tmp_path, fashion_data, "logs", devices=1, nodes=2)
    procs = []
    for node in (0, 1):
        torchrun = job_torchrun_args(node, port)
        assert "--nnodes=2" in torchrun and f"--node_rank={node}" in torchrun
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "project.cli.torchrun", *torchrun, *args],  # as the image runs torchrun
                cwd=tmp_path,
                env=clean_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    check_same_as_reference(tmp_path / "logs", one_node_two_processes, wait_all(procs))


def test_restarted_kubernetes_job_resumes_its_run_with_the_same_result(fashion_data, tmp_path):
    """deploy/kubernetes: a pod stopped by SIGTERM mid-epoch (no SLURM variables, as the kubelet stops it) saves a
    checkpoint at that step; replaced, it runs the same command with the same PROJECT_JOB_ID (the Job's uid) and
    resumes the run that Job started, in place, from that checkpoint, with the uninterrupted result."""
    args = resume_args(fashion_data, tmp_path / "logs", "helpers.Sigterm")
    ref = fit([*args, "--trainer.logger.init_args.name", "ref"], tmp_path, clean_env())
    assert ref.returncode == 0, ref.stderr[-3000:]
    (ref_run,) = run_dirs(tmp_path / "logs")
    uid = "3f6c1a52-9d1e-4c1b-8f0e-6a7b2c9d0e11"
    first = fit(args, tmp_path, clean_env(PROJECT_JOB_ID=uid, SIGTERM_AT="15"))
    assert first.returncode == -signal.SIGTERM, first.stderr[-3000:]
    (run,) = [r for r in run_dirs(tmp_path / "logs") if r.parent.name == "fashion_mnist"]
    assert not (run / "results.json").exists()
    sigterm_ckpt = run / "checkpoints" / "hpc_ckpt_1.ckpt"  # step 15, mid epoch 2; last.ckpt is step 10
    assert torch.load(sigterm_ckpt, map_location="cpu", weights_only=True)["global_step"] == 15
    assert f"SIGTERM: saved {sigterm_ckpt}" in first.stderr
    # the replacement pod: same command, same Job uid
    second = fit(args, tmp_path, clean_env(PROJECT_JOB_ID=uid))
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"job {uid} was requeued" in second.stderr and "from hpc_ckpt_1.ckpt" in second.stderr
    job = check_resumed_like_reference(tmp_path / "logs", run, ref_run)
    assert job["job"] == uid and [s["restart_count"] for s in job["starts"]] == [0, 1]
