"""project.cluster.ddp and project.cli.torchrun: the DDP overlays take docs/cluster.md's rendezvous switches, and a node
left alone at the rendezvous ends in bounded time with one error line, launched as SLURM's ``srun`` starts a task and
as the Kubernetes Job's pods start torchrun."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
import yaml
from helpers import REPO, clean_env, free_port_for_slurm, job_torchrun_args, slurm_task

from project.cli.parser import ProjectCLI

DDP_OVERLAYS = sorted(
    p
    for p in (REPO / "configs" / "trainer").glob("*.yaml")
    if "strategy" in (yaml.safe_load(p.read_text()).get("trainer") or {})
)


def test_readme_listen_address_switch_parses_with_every_ddp_overlay():
    """docs/cluster.md's ``--trainer.strategy.listen_address`` (with ``rendezvous_timeout``, same place) on every
    shipped overlay that sets a strategy: parsed into ``BoundDDPStrategy``'s options (it was a parse error while the
    overlays named the strategy ``ddp`` by its registry string)."""
    docs = " ".join((REPO / "docs" / "cluster.md").read_text().split())
    assert "--trainer.strategy.listen_address <rank 0's address>" in docs
    assert [p.name for p in DDP_OVERLAYS] == ["ddp.yaml", "ddp_cpu.yaml"]
    for overlay in DDP_OVERLAYS:  # parsed and settled as --print_config settles it, in this process
        config = ProjectCLI.resolve(
            [
                *("--config", str(REPO / "configs/fashion_mnist.yaml"), "--config", str(overlay)),
                *("--trainer.strategy.listen_address", "10.1.2.3", "--trainer.strategy.rendezvous_timeout", "30"),
            ]
        )
        strategy = config["trainer"]["strategy"]
        assert strategy["class_path"] == "project.cluster.BoundDDPStrategy", strategy
        assert strategy["init_args"]["listen_address"] == "10.1.2.3"
        assert strategy["init_args"]["rendezvous_timeout"] == 30.0


def started_alone(commands: list[tuple[list[str], dict[str, str]]], cwd) -> list[tuple[subprocess.Popen, float]]:
    """Start every ``(argv, env)`` at once (each a node left alone, on its own port); returns each process with its
    run time in seconds, once all have ended (a node waits out its rendezvous timeout, so side by side they cost
    the time of one)."""
    start = time.monotonic()
    procs = [
        subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for argv, env in commands
    ]
    ended = []
    for proc in procs:
        proc.stdout_text, proc.stderr_text = proc.communicate(timeout=300)  # type: ignore[attr-defined]
        ended.append((proc, time.monotonic() - start))
    return ended


@pytest.mark.slow
def test_a_lone_node_ends_after_the_rendezvous_timeout_with_one_error_line(fashion_data, tmp_path):
    """Node 0 and node 1 of a 2-node job, each started alone (its peer never comes; two jobs side by side): rank 0
    waits for its peer at its store, rank 1 for rank 0's store; each ends after the 5 s rendezvous timeout with one
    ``error:`` line naming the meeting and the fix, exit status 1, no traceback or C++ log lines, and no run (the
    run never started)."""
    commands, ports = [], []
    for rank in (0, 1):
        job, port = free_port_for_slurm()
        ports.append(port)
        args = [
            *("--config", str(REPO / "configs/fashion_mnist.yaml")),
            *("--config", str(REPO / "configs/trainer/ddp_cpu.yaml")),
            *("--data.data_dir", str(fashion_data), "--data.num_workers", "0", "--data.persistent_workers", "false"),
            *("--trainer.devices", "1", "--trainer.num_nodes", "2", "--trainer.strategy.rendezvous_timeout", "5"),
            *("--trainer.max_epochs", "1", "--trainer.logger.init_args.save_dir", str(tmp_path / f"logs{rank}")),
        ]
        commands.append(([sys.executable, "-m", "project.fit", *args], slurm_task(job, rank, 2)))
    for rank, (proc, took) in enumerate(started_alone(commands, tmp_path)):
        stderr = proc.stderr_text  # type: ignore[attr-defined]
        assert proc.returncode == 1, stderr[-3000:]
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
        noise = ("[E", "[W", "frame #", "Exception raised")  # torch's C++ store logs each failed connection attempt
        assert not [line for line in stderr.splitlines() if line.startswith(noise)], stderr[-3000:]
        where = f"*:{ports[rank]}" if rank == 0 else f"127.0.0.1:{ports[rank]}"
        assert re.match(rf"error: rank {rank}: the 2 processes of this run .* did not all meet at {re.escape(where)} "
                        r"within 5 s", errors[0]), errors[0]  # fmt: skip
        assert "--trainer.strategy.rendezvous_timeout" in errors[0] and "--trainer.num_nodes" in errors[0]
        assert took < 120, took  # the timeout, plus starting Python and building the Trainer
        assert not list((tmp_path / f"logs{rank}").rglob("config.yaml"))


@pytest.mark.slow
def test_a_lone_torchrun_node_ends_after_the_rendezvous_timeout_with_one_error_line(fashion_data, tmp_path):
    """Pod 0 and pod 1 of deploy/kubernetes/train's Job, each started alone (the other pod pending; two Jobs side by
    side): its torchrun arguments as Kubernetes expands them, run as the image's entry point runs ``torchrun``, with a
    5 s rendezvous timeout. Each ends with one ``error:`` line naming the meeting point and the fix, exit status 1,
    no traceback or C++ log lines, and no run folder."""
    commands, ports = [], []
    for rank in (0, 1):
        _, port = free_port_for_slurm()
        ports.append(port)
        torchrun = job_torchrun_args(rank, port, RENDEZVOUS_TIMEOUT_S="5")
        assert "--rdzv_conf=timeout=5" in torchrun and "--nnodes=2" in torchrun
        args = [
            *("--config", str(REPO / "configs/fashion_mnist.yaml")),
            *("--config", str(REPO / "configs/trainer/ddp_cpu.yaml")),
            *("--data.data_dir", str(fashion_data), "--trainer.devices", "1", "--trainer.num_nodes", "2"),
            *("--trainer.logger.init_args.save_dir", str(tmp_path / f"logs{rank}")),
        ]
        commands.append(([sys.executable, "-m", "project.cli.torchrun", *torchrun, *args], clean_env()))
    for rank, (proc, took) in enumerate(started_alone(commands, tmp_path)):
        stderr = proc.stderr_text  # type: ignore[attr-defined]
        assert proc.returncode == 1, stderr[-3000:]
        assert stderr.count("error:") == 1 and "Traceback" not in stderr, stderr[-3000:]
        noise = ("[E", "[W", "frame #", "Exception raised")
        assert not [line for line in stderr.splitlines() if line.startswith(noise)], stderr[-3000:]
        (error,) = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert error.startswith(f"error: torchrun, node rank {rank} of --nnodes=2: the nodes did not all meet at "
                                f"127.0.0.1:{ports[rank]} (or lost each other) within 5 s"), error  # fmt: skip
        assert "--rdzv_conf=timeout=<seconds>" in error and "kubectl get pods" in error
        assert took < 120, took
        assert not (tmp_path / f"logs{rank}").exists()


@pytest.mark.parametrize("given", [None, "INFO"])
def test_torchrun_through_the_project_gives_its_workers_the_environment_as_given(tmp_path, given):
    """project.cli.torchrun quiets torch's C++ log only in torchrun's own agent: a worker sees
    ``TORCH_CPP_LOG_LEVEL`` as the user gave it (unset, or set), and the run's exit status is the worker's."""
    script = tmp_path / "worker.py"
    script.write_text("import os, sys\nprint('level', os.environ.get('TORCH_CPP_LOG_LEVEL'))\nsys.exit(3)\n")
    env = clean_env(**({"TORCH_CPP_LOG_LEVEL": given} if given else {}))
    env.pop("TORCH_CPP_LOG_LEVEL", None) if given is None else None
    proc = subprocess.run(
        [sys.executable, "-m", "project.cli.torchrun", "--standalone", "--nproc_per_node=1", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert f"level {given}" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert proc.returncode == 1 and "ChildFailedError" in proc.stderr  # torchrun's own report of a failed worker
