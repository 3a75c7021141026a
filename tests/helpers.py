"""Helpers to run ``python -m project.fit`` from tests, in-process or as a subprocess."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import optuna
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from project.fit import main as run_main  # noqa: F401  (tests call it in-process)

REPO = Path(__file__).resolve().parents[1]


def tiny_args(paths: dict, logs: Path, *extra: str, name: str = "tiny") -> list[str]:
    """CLI arguments for a quick LeNet run on the tiny MNIST fixture (500 train / 100 val / 100 test)."""
    return [
        "--data",
        "project.data.MNISTDataModule",
        "--data.data_dir",
        str(paths["data"]),
        "--data.source_dir",
        str(paths["source"]),
        "--data.val_size",
        "100",
        "--data.batch_size",
        "50",
        "--model.optimizer",
        "torch.optim.SGD",
        "--model.optimizer.lr",
        "0.01",
        "--trainer.max_epochs",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.logger.init_args.save_dir",
        str(logs),
        "--trainer.logger.init_args.name",
        name,
        # No model graph (a torch.jit.trace, about a quarter of a tiny fit's time); the tests of the graph ask for it.
        "--trainer.logger.init_args.log_graph",
        "false",
        *extra,
    ]


def own_data(path: Path | str) -> list[str]:
    """``--data.data_dir`` of the data a test run was trained on, for a run-folder command on it (they read the data
    folder the user names, default ``data/``, not the one the run's config names). ``path``: a run, an experiment
    folder or a checkpoint in a run; ``[]`` when no run config is found."""
    path = Path(path)
    for folder in (path, path.parent, path.parent.parent):
        configs = sorted(folder.glob("config.yaml")) or sorted(folder.glob("version_*/config.yaml"))
        if configs:
            return ["--data.data_dir", str(yaml.safe_load(configs[-1].read_text())["data"]["init_args"]["data_dir"])]
    return []


def run_module(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``python -m project.fit ARGS`` in ``cwd``; returns the completed process (text output)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "project.fit", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def run_dirs(logs: Path) -> list[Path]:
    return sorted(p for p in logs.glob("*/version_*") if p.is_dir())


class LinearModel(L.LightningModule):
    """A linear classifier of 32 features into 2 classes (SGD, lr 0.1); ``extra`` is kept as a submodule."""

    def __init__(self, extra: nn.Module | None = None):
        super().__init__()
        self.lin = nn.Linear(32, 2)
        self.extra = extra

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.lin(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def linear_data() -> DataLoader:
    """64 seeded samples for :class:`LinearModel` in batches of 16: x float32 (16, 32), y int64 (16,) in {0, 1}."""
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(64, 32, generator=g), torch.randint(0, 2, (64,), generator=g)), 16)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (Linux: exists in /proc and is not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``, not ``pid`` itself (Linux: the parent pid is field 4 of /proc/<pid>/stat)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):  # a process that ended while we read
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def pruned_at_once(tmp_path: Path) -> Path:
    """The one trial of sweep ``smoke`` under ``tmp_path/logs``: checks that the study and its ``trial.json`` say it
    was pruned after epoch 0; returns its run folder."""
    folder = tmp_path / "logs" / "smoke"
    (trial,) = optuna.load_study(study_name="smoke", storage=f"sqlite:///{folder / 'study.db'}").get_trials()
    assert trial.state == optuna.trial.TrialState.PRUNED and list(trial.intermediate_values) == [0]
    run = folder / "version_0"
    assert json.loads((run / "trial.json").read_text())["state"] == "pruned"
    return run


class Preempt(Callback):
    """Test-only callback: SLURM's pre-kill signal (SIGUSR1) at training step ``PREEMPT_AT``, then SIGKILL two
    steps later, like a scheduler whose grace period ran out. Inactive unless ``PREEMPT_AT`` is set."""

    def on_train_batch_end(self, trainer, *args, **kwargs):
        at = os.environ.get("PREEMPT_AT")
        if at is None:
            return
        if trainer.global_step == int(at):
            os.kill(os.getpid(), signal.SIGUSR1)
        elif trainer.global_step == int(at) + 2:
            os.kill(os.getpid(), signal.SIGKILL)


class KillAt(Callback):
    """Test-only callback: ``kill -9`` of its own process after training step ``KILL_AT`` (a crash or an OOM
    kill mid-epoch, at a known point however fast the machine). Inactive unless ``KILL_AT`` is set."""

    def on_train_batch_end(self, trainer, *args, **kwargs):
        at = os.environ.get("KILL_AT")
        if at is not None and trainer.global_step == int(at):
            os.kill(os.getpid(), signal.SIGKILL)


class SleepAtEpoch(Callback):
    """Sleeps at the start of epoch 1 when ``SWEEP_TEST_SLEEP`` is set: a trial to kill after its first
    checkpoint (``--trainer.callbacks+=helpers.SleepAtEpoch``, ``tests/`` on ``PYTHONPATH``)."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == 1 and os.environ.get("SWEEP_TEST_SLEEP"):
            time.sleep(600)


class Sigterm(Callback):
    """Sends SIGTERM to its own process, once, on rank ``SIGTERM_RANK`` only (default 0: ``docker stop`` signals the
    launching process): at training step ``SIGTERM_AT``, or at the first batch of the phase ``SIGTERM_IN`` names
    (``validation``: after the sanity check; ``test``). Inactive unless one of them is set."""

    sent = False

    def _send(self, trainer, phase: str | None = None) -> None:
        rank = int(os.environ.get("SIGTERM_RANK", "0"))
        if phase == os.environ.get("SIGTERM_IN") and trainer.global_rank == rank and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_batch_end(self, trainer, *args, **kwargs):
        at = os.environ.get("SIGTERM_AT")
        if at is not None and trainer.global_step == int(at):
            self._send(trainer)

    def on_validation_batch_end(self, trainer, *args, **kwargs):
        if not trainer.sanity_checking:
            self._send(trainer, "validation")

    def on_test_batch_end(self, trainer, *args, **kwargs):
        self._send(trainer, "test")


class WaitForSignal(Callback):
    """At training step ``SIGNAL_AT`` touches ``SIGNAL_READY`` and waits (up to 60 s) for ``SIGNAL_SENT`` to exist:
    a test sends its signal from outside at a known step; inactive unless ``SIGNAL_AT`` is set."""

    def on_train_batch_end(self, trainer, *args, **kwargs):
        at = os.environ.get("SIGNAL_AT")
        if at is None or trainer.global_step != int(at):
            return
        Path(os.environ["SIGNAL_READY"]).touch()
        deadline = time.time() + 60
        while not Path(os.environ["SIGNAL_SENT"]).exists() and time.time() < deadline:
            time.sleep(0.02)


class OwnNet(nn.Module):
    """A user's own net, as ``model.net: helpers.OwnNet`` names it from a package outside the project (input
    (N, ``in_channels``, H, W), output (N, num_classes) logits): conv ``in_channels``->8 3x3, pooled to 4x4, then a
    linear layer. Parameters: ``in_channels * 72 + 8 + 128 * num_classes + num_classes``."""

    def __init__(self, num_classes: int, in_channels: int = 1) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(in_channels, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4))
        self.head = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class DataRecord(Callback):
    """Writes ``data-rank<r>.json`` into ``DATA_RECORD_DIR`` when training starts, on every rank: the data module's
    classes, normalization statistics, the train/val split (sha256 of its index lists) and the training batches
    this rank gets per epoch. Inactive unless ``DATA_RECORD_DIR`` is set."""

    def on_train_start(self, trainer, pl_module):
        folder = os.environ.get("DATA_RECORD_DIR")
        if folder is None:
            return
        dm = trainer.datamodule
        split = [hashlib.sha256(json.dumps(part.tolist()).encode()).hexdigest() for part in dm.split]
        batches = len(trainer.train_dataloader)
        record = {"classes": dm.classes, "mean": list(dm.mean), "std": list(dm.std), "split": split, "batches": batches}
        (Path(folder) / f"data-rank{trainer.global_rank}.json").write_text(json.dumps(record))


class ProcessTree(Callback):
    """Writes ``process.json`` into the run folder when fit starts: this process's id, its parent's and its
    grandparent's (Linux ``/proc``): where a sweep trial's process came from."""

    def setup(self, trainer, pl_module, stage):
        if stage != "fit" or not trainer.is_global_zero:
            return
        parent = os.getppid()
        grandparent = int(Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[1])
        tree = {"pid": os.getpid(), "parent": parent, "grandparent": grandparent}
        (Path(trainer.logger.log_dir) / "process.json").write_text(json.dumps(tree))


def namespace_init(unshare: int, program: bytes) -> int:
    """The host pid of the process ``unshare --fork`` started, PID 1 of the new PID namespace, once it runs
    ``program`` (right after the fork it is still a copy of unshare)."""
    deadline = time.time() + 30
    while time.time() < deadline:
        for child in Path(f"/proc/{unshare}/task/{unshare}/children").read_text().split():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0].endswith(program):
                    return int(child)
        time.sleep(0.01)
    raise AssertionError(f"unshare started no {program!r}")


def sigterm_to_pid_1(
    command: list[str], cwd: Path, env: dict[str, str], ready: Path, sent: Path
) -> tuple[int, str, int]:
    """Run ``command`` under tini as PID 1 of a PID namespace of its own (``unshare --pid``), as the image runs it;
    once ``ready`` exists (:class:`WaitForSignal` touched it), send SIGTERM to PID 1, as ``docker stop`` or a pod's
    deletion does, and touch ``sent``. Returns the exit status, the output and PID 1's host pid."""
    cmd = ["unshare", "--pid", "--fork", "--kill-child", "tini", "--", *command]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        init = namespace_init(proc.pid, b"tini")
        deadline = time.monotonic() + 300
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), proc.stdout.read()[-3000:] if proc.poll() is not None else "never reached its step"
        os.kill(init, signal.SIGTERM)
        sent.touch()
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, init


def tensorboard_hparams(run) -> dict:
    """The hyper-parameters as TensorBoard's HPARAMS tab reads them from the run's event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    acc = EventAccumulator(str(run / "hparams")).Reload()
    out = {}
    for content in acc.PluginTagToContent("hparams").values():
        data = HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            for k, v in data.session_start_info.hparams.items():
                out[k] = v.string_value or v.number_value or v.bool_value
    return out


ONECYCLE = ["--model.lr_scheduler", "torch.optim.lr_scheduler.OneCycleLR", "--model.lr_scheduler.max_lr", "0.05"]
ONECYCLE += ["--model.optimizer.lr", "0.05"]  # as max_lr: OneCycleLR sets it (another value is refused, never used)
SMOKE = REPO / "configs/sweeps/smoke.yaml"


def write_sweep(folder: Path, name: str = "smoke", **changes) -> Path:
    spec = yaml.safe_load(SMOKE.read_text()) | {"name": name} | changes
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run_sweep(args: list[str], cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    cmd = [sys.executable, "-m", "project.sweep", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def study_of(name: str, storage: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=storage)


# -- every switch and overlay, alone and together ---------------------------------------------------------------
SWITCHES = {
    "bf16-mixed": (["--trainer.precision", "bf16-mixed"], {"precision": "bf16-mixed"}),
    "16-mixed": (["--trainer.precision", "16-mixed"], {"requested_precision": "16-mixed"}),
    "bf16-true": (["--trainer.precision", "bf16-true"], {"precision": "bf16-true"}),  # the graph's input cast
    "64-true": (["--trainer.precision", "64-true"], {"precision": "64-true"}),
    "amp overlay": (["--config", str(REPO / "configs/amp.yaml")], {"requested_precision": "16-mixed"}),
    "benchmark": (["--trainer.benchmark", "true"], {"cudnn_benchmark": True}),
    "deterministic": (["--trainer.deterministic", "true"], {"deterministic": True}),
    "cudnn off": (["--cudnn.enabled", "false"], {"cudnn_enabled": False}),
    "channels_last + summary": (
        ["--model.channels_last", "true", "--trainer.enable_model_summary", "true"],
        {"channels_last": True},
    ),
    "in_memory": (["--data.in_memory", "true"], {"in_memory": True}),
    "pruning overlay": (
        ["--config", str(REPO / "configs/pruning.yaml"), "--trainer.max_epochs", "2"],
        {"sparsity": pytest.approx(0.5, abs=1e-3)},
    ),
    "all together": (
        [
            "--config",
            str(REPO / "configs/pruning.yaml"),
            "--trainer.max_epochs",
            "2",
            "--data.in_memory",
            "true",
            "--model.channels_last",
            "true",
            "--trainer.precision",
            "bf16-mixed",
            "--trainer.benchmark",
            "true",
            "--cudnn.enabled",
            "false",
            "--trainer.enable_model_summary",
            "true",
        ],
        {"in_memory": True, "channels_last": True, "precision": "bf16-mixed", "sparsity": pytest.approx(0.5, abs=1e-3)},
    ),
    # Trainer flags a user reaches for when debugging and profiling
    "overfit_batches": (["--trainer.overfit_batches", "2"], {"global_step": 2}),
    "profiler": (["--trainer.profiler", "simple"], {}),
    "detect_anomaly": (["--trainer.detect_anomaly", "true"], {}),
    "accumulate": (["--trainer.accumulate_grad_batches", "2"], {"global_step": 5}),
    "gradient_clip": (["--trainer.gradient_clip_val", "0.5"], {}),
    "no sanity check": (["--trainer.num_sanity_val_steps", "0"], {}),
    "no checkpointing": (
        ["--trainer.enable_checkpointing", "false"],
        {"best_ckpt": None, "last_ckpt": None, "test_ckpt": "final weights"},
    ),
    "val every 2nd epoch": (["--trainer.check_val_every_n_epoch", "2", "--trainer.max_epochs", "2"], {"epochs": 2}),
    "log every step": (["--trainer.log_every_n_steps", "1"], {}),
    "one-cycle": (ONECYCLE, {"global_step": 10}),
}


def free_port_for_slurm() -> tuple[str, int]:
    """A SLURM job id whose port (Lightning: 15000 + the id's last 4 digits) is free on 127.0.0.1, and the port."""
    for _ in range(200):
        # not the module-level random: in-process fits seed it (seed_everything 42), and the two xdist workers then
        # drew the same "random" ports, one test's port taken by the other's between this probe and its use
        port = random.SystemRandom().randrange(15000, 25000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return f"9{port - 15000:04d}", port
    raise RuntimeError("no free port in 15000-24999")


LAUNCH_VARIABLES = ("SLURM_", "TORCHELASTIC_", "MASTER_", "PET_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any launcher's variables (SLURM, torchrun), the tests and the checkout on
    ``PYTHONPATH``, one OpenMP thread, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCH_VARIABLES)}
    env.update(PYTHONPATH=f"{REPO / 'tests'}{os.pathsep}{REPO}", OMP_NUM_THREADS="1", **extra)
    return env


def slurm_task(job: str, node: int, nodes: int, **extra: str) -> dict[str, str]:
    """The environment ``srun`` gives task ``node`` of a job of ``nodes`` single-task nodes, all on 127.0.0.1."""
    return clean_env(
        SLURM_JOB_ID=job,
        SLURM_JOB_NAME="cnn-recipes",
        SLURM_NTASKS=str(nodes),
        SLURM_NTASKS_PER_NODE="1",
        SLURM_NNODES=str(nodes),
        SLURM_JOB_NUM_NODES=str(nodes),
        SLURM_NODELIST="127.0.0.1",
        SLURM_JOB_NODELIST="127.0.0.1",
        SLURM_NODEID=str(node),
        SLURM_PROCID=str(node),
        SLURM_LOCALID="0",
        SLURM_RESTART_COUNT="0",
        **extra,
    )


def kubernetes_expand(arg: str, values: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of a container argument."""
    import re

    return re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], arg)


def job_torchrun_args(node: int, port: int, **values: str) -> list[str]:
    """What pod ``node`` of deploy/kubernetes/train's Job passes to torchrun (up to ``-m project.fit``, without
    ``torchrun`` itself), expanded as Kubernetes expands it: the container's env values, ``NODE_RANK`` = ``node``,
    then ``values``; here 1 process per node and the master on 127.0.0.1:``port``."""
    (job,) = [
        d for d in yaml.safe_load_all((REPO / "deploy/kubernetes/train/train.yaml").read_text()) if d["kind"] == "Job"
    ]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[0] == "torchrun" and "--nnodes=$(NNODES)" in args and "--node_rank=$(NODE_RANK)" in args
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    expanded = [
        kubernetes_expand(a, {**env, "NODE_RANK": str(node), **values}) for a in args[1 : args.index("project.fit") + 1]
    ]
    here = {"--nproc_per_node": "1", "--master_addr": "127.0.0.1", "--master_port": str(port)}  # 1 CPU process
    return [f"{a.split('=')[0]}={here[a.split('=')[0]]}" if a.split("=")[0] in here else a for a in expanded]
