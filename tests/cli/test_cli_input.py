"""Command-line input that must work or fail in one readable line, and secrets that must stay out of output:
YAML syntax errors located, Lightning's shorthand class names, several identical Pruning callbacks, Trainer
flags under every precision ``auto_precision`` picks, storage passwords, the DDP rendezvous address."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import lightning as L
import optuna
import pytest
import torch
import yaml
from helpers import REPO, SWITCHES, LinearModel, descendants, linear_data, results, run_dirs, run_main, tiny_args
from lightning.pytorch.callbacks import Callback
from sqlalchemy.engine import make_url

import project.cli.checks
from project.callbacks.pruning import Pruning
from project.cli.parser import ProjectCLI
from project.report import RunTensorBoardLogger
from project.sweep import config as sweep_config
from project.sweep import file as sweep_file
from project.sweep import storage as sweep_storage
from project.sweep import study as sweep_study
from project.sweep import trial as sweep_trial

# -- YAML syntax errors name the file, line and column --------------------------------------------------------


@pytest.mark.parametrize("form", ["config", "config=", "overlay"])
def test_yaml_syntax_error_names_file_line_and_column(tmp_path, capsys, form):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  lr: [0.1\n")
    args = {
        "config": ["--config", str(bad)],
        "config=": [f"--config={bad}"],
        "overlay": ["--config", str(REPO / "configs/mnist.yaml"), "--config", str(bad)],
    }[form]
    assert run_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"error: {bad}, line 3, column 1: not valid YAML")
    assert "starts at line 2, column 7" in err[0]


def test_sweep_file_yaml_syntax_error_names_file_line_and_column(tmp_path, capsys):
    path = tmp_path / "sw.yaml"
    path.write_text("name: x\nspace: {a: [1, 2}\n")
    assert sweep_study.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --config: {path}, line 2, column 17: not valid YAML")
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_epochs: 1\n\tfoo: 2\n")
    path.write_text(yaml.safe_dump({"name": "x", "base": {"config": [str(bad)]}, "space": {"model.lr": [1, 2]}}))
    assert sweep_study.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: base: {bad}, line 3, column 1: not valid YAML")
    assert not (tmp_path / "logs").exists()


# -- Lightning's shorthand class names ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "logger", ["TensorBoardLogger", "lightning.pytorch.loggers.TensorBoardLogger", "project.report.TensorBoardLogger"]
)
def test_tensorboard_logger_shorthand_is_the_project_logger(tmp_path, logger):
    cli = ProjectCLI(["--trainer.logger", logger, "--trainer.logger.save_dir", str(tmp_path)])
    assert type(cli.trainer.logger) is RunTensorBoardLogger
    assert cli.trainer.logger.save_dir == str(tmp_path)
    assert cli.trainer.logger.name == "mnist"  # the project's defaults are kept


# -- several Pruning callbacks with identical settings --------------------------------------------------------


def record_loads(monkeypatch) -> list[tuple[int, str]]:
    """(copy number, the state's marker) for every Pruning state a resume hands back."""
    loaded: list[tuple[int, str]] = []
    original = Pruning.load_state_dict

    def load_state_dict(self, state):
        loaded.append((self.copy, state.get("marker")))
        original(self, state)

    monkeypatch.setattr(Pruning, "load_state_dict", load_state_dict)
    return loaded


def mark_states(path: Path) -> list[str]:
    """Tag each Pruning state in the checkpoint with its own key; returns the keys in checkpoint order."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    keys = [k for k in ckpt["callbacks"] if k.startswith("Pruning{")]
    for k in keys:
        ckpt["callbacks"][k]["marker"] = k
    torch.save(ckpt, path)
    return keys


def test_two_identical_pruning_callbacks_in_a_plain_trainer(tmp_path, monkeypatch):
    def trainer(epochs):
        return L.Trainer(
            max_epochs=epochs,
            callbacks=[Pruning(amount=0.3), Pruning(amount=0.3)],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            default_root_dir=tmp_path,
        )

    first, model = trainer(1), LinearModel()
    first.fit(model, linear_data())
    zeros = int((model.lin.weight == 0).sum())
    assert abs(zeros - (1 - 0.7 * 0.7) * 64) <= 1  # both pruned: 30 %, then 30 % of the rest
    first.save_checkpoint(tmp_path / "a.ckpt")
    keys = mark_states(tmp_path / "a.ckpt")
    assert len(keys) == 2 and "'copy': 1" in keys[1] and "copy" not in keys[0]
    loaded = record_loads(monkeypatch)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*callbacks used to create the checkpoint.*")
        trainer(2).fit(LinearModel(), linear_data(), ckpt_path=tmp_path / "a.ckpt")
    assert sorted(loaded) == [(0, keys[0]), (1, keys[1])]


@pytest.mark.slow
def test_two_identical_pruning_callbacks_resume_from_the_cli(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pruning = ["--trainer.callbacks+=project.callbacks.Pruning", "--trainer.callbacks.amount", "0.3"] * 2
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", *pruning, "--trainer.limit_train_batches", "2")) == 0
    (run,) = run_dirs(tmp_path / "logs")
    assert results(run)["sparsity"] == pytest.approx(1 - 0.7 * 0.7, abs=1e-3)
    keys = mark_states(run / "checkpoints" / "last.ckpt")
    assert len(keys) == 2
    loaded = record_loads(monkeypatch)
    resume = ["--trainer.max_epochs", "2", "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]
    assert (
        run_main(tiny_args(tiny_mnist, tmp_path / "logs", *pruning, "--trainer.limit_train_batches", "2", *resume)) == 0
    )
    assert sorted(loaded) == [(0, keys[0]), (1, keys[1])]
    assert results(run)["epochs"] == 2


# -- the Trainer flags users reach for, under every precision auto_precision may pick -------------------------

FLAGS = {
    "clip_norm": ["--trainer.gradient_clip_val", "1.0"],
    "clip_value": ["--trainer.gradient_clip_val", "0.5", "--trainer.gradient_clip_algorithm", "value"],
    "clip_accumulate": ["--trainer.gradient_clip_val", "1.0", "--trainer.accumulate_grad_batches", "2"],
    "accumulate": ["--trainer.accumulate_grad_batches", "2"],
    "profiler_simple": ["--trainer.profiler", "simple"],
    "profiler_advanced": ["--trainer.profiler", "advanced"],
    "profiler_pytorch": ["--trainer.profiler", "pytorch"],
    "summary": ["--trainer.enable_model_summary", "true"],
    "summary_depth": ["--trainer.callbacks+=ModelSummary", "--trainer.callbacks.max_depth", "3"],
    "anomaly": ["--trainer.detect_anomaly", "true"],
    "bf16_true": ["--trainer.precision", "bf16-true"],
    "bf16_true_clip": ["--trainer.precision", "bf16-true", "--trainer.gradient_clip_val", "1.0"],
}
FAST = {"clip_norm", "clip_value", "clip_accumulate"}  # the ones that failed; the rest guard the matrix


# The precisions auto_precision can pick. On a CPU a GPU's pick, 16-mixed, runs as bf16-mixed: the same run as the
# bf16-mixed column, so it is one case per matrix (the flags that once failed, and one switch), not a column. A case
# whose flags set trainer.precision themselves runs under one pick: auto_precision does not apply to it.
PICKS = ("32-true", "bf16-mixed")


def precision_cases(names: dict, explicit, always_all: set) -> list:
    cases = []
    for name in names:
        picks = ("32-true",) if explicit(name) else PICKS + (("16-mixed",) if name in always_all else ())
        cases += [(name, picked) for picked in picks]
    return cases


def _sets_precision(args: list[str]) -> bool:
    return "--trainer.precision" in args or any(a.endswith("configs/amp.yaml") for a in args)


@pytest.mark.parametrize(
    ("flag", "picked"),
    [
        (f, p) if f in FAST else pytest.param(f, p, marks=pytest.mark.slow)
        for f, p in precision_cases(FLAGS, lambda f: _sets_precision(FLAGS[f]), FAST)
    ],
)
def test_tuned_config_with_trainer_flags_under_each_auto_precision(
    tiny_mnist, tmp_path, monkeypatch, capsys, picked, flag
):
    """configs/mnist.yaml (fused AdamW step, channels_last, in-memory data, auto_precision) with each flag, as
    auto_precision would run it on a CUDA GPU (16-mixed; bf16-mixed on a CPU), a CPU with native bf16
    (bf16-mixed) and any other CPU (32-true)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(project.cli.checks, "fastest_precision", lambda accelerator: picked)
    args = [
        "--config",
        str(REPO / "configs/mnist.yaml"),
        *tiny_args(tiny_mnist, tmp_path / "logs"),
        "--model.optimizer",
        "torch.optim.AdamW",
        "--model.optimizer.fused",
        "true",
        "--model.lr_scheduler.max_lr",  # tiny_args' lr, which the config's OneCycleLR sets
        "0.01",
        "--data.num_workers",
        "0",
        "--data.persistent_workers",
        "false",
        "--trainer.limit_train_batches",
        "4",
        "--trainer.limit_val_batches",
        "2",
        "--trainer.limit_test_batches",
        "2",
        *FLAGS[flag],
    ]
    status = run_main(args)
    assert status == 0, capsys.readouterr().err[-2000:]
    (run,) = run_dirs(tmp_path / "logs")
    expected = "bf16-true" if "bf16_true" in flag else {"16-mixed": "bf16-mixed"}.get(picked, picked)
    assert results(run)["precision"] == expected


# -- storage passwords are never printed or written -----------------------------------------------------------

SMOKE = REPO / "configs/sweeps/smoke.yaml"
POSTGRES = os.environ.get("PROJECT_TEST_POSTGRES_URL")
SECRET = "s3cr3t-PW-0x5eed"


def with_password(url: str) -> str:
    return make_url(url).set(password=SECRET).render_as_string(hide_password=False)


def smoke_file(folder: Path, name: str, **changes) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(yaml.safe_load(SMOKE.read_text()) | {"name": name} | changes))
    return path


@pytest.fixture
def fake_server(tmp_path, monkeypatch) -> str:
    """A PostgreSQL URL with a password whose study really lives in a SQLite file (the printing path is the same)."""
    url = f"postgresql+psycopg2://sweeper:{SECRET}@db.example:5432/sweeps"
    real, db = sweep_storage.open_storage, f"sqlite:///{tmp_path / 'study.db'}"
    monkeypatch.setattr(sweep_study, "open_storage", lambda u, *a, **k: real(db if u == url else u, *a, **k))
    return url


def test_storage_password_stays_out_of_error_lines(tmp_path, monkeypatch, capsys, fake_server):
    monkeypatch.chdir(tmp_path)
    spec = smoke_file(tmp_path, "smoke")
    assert sweep_study.main(["--config", str(spec), "--storage", fake_server, "--report"]) == 2  # no study yet
    err = capsys.readouterr().err.strip()
    hidden = "postgresql+psycopg2://sweeper:***@db.example:5432/sweeps"
    assert err == f"error: no study 'smoke' in {hidden}; run the sweep first"
    sweep_ = sweep_file.load_sweep(spec)
    base = sweep_config.resolve_base(sweep_, [])
    sweep_study.load_or_create_study(
        sweep_trial.Context(sweep_, base, fake_server, tmp_path / "logs" / "smoke", []), create=True
    )
    other = smoke_file(tmp_path, "smoke", seeds=[7])  # the same study name from another sweep file
    assert sweep_study.main(["--config", str(other), "--storage", fake_server, "--report"]) == 2
    err = capsys.readouterr().err.strip()
    assert "was created from another sweep file" in err and SECRET not in err and "sweeper:***@" in err
    # the same through OPTUNA_STORAGE (Optuna's own variable: the URL stays out of every process listing)
    monkeypatch.setenv("OPTUNA_STORAGE", fake_server)
    assert sweep_study.main(["--config", str(other), "--report"]) == 2
    err = capsys.readouterr().err.strip()
    assert "was created from another sweep file" in err and SECRET not in err


@pytest.mark.parametrize("given", ["--storage", "OPTUNA_STORAGE"])
@pytest.mark.parametrize("where", ["user info", "query", "query, percent-encoded"])
def test_unreachable_storage_is_one_line_without_the_password(where, given, tmp_path, capsys, monkeypatch):
    """The password wherever a URL may hold it (``user:password@``, ``?password=``, percent-encoded), given on the
    command line or by Optuna's variable: the one error line names the storage with ``***`` in its place."""
    spec = smoke_file(tmp_path, "smoke")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    secret = {"user info": SECRET, "query": SECRET, "query, percent-encoded": f"{SECRET}%2F%40x"}[where]
    url = {
        "user info": f"postgresql+psycopg2://sweeper:{secret}@127.0.0.1:{port}/sweeps",
        "query": f"postgresql+psycopg2://sweeper@127.0.0.1:{port}/sweeps?password={secret}",
        "query, percent-encoded": f"postgresql+psycopg2://sweeper@127.0.0.1:{port}/sweeps?password={secret}",
    }[where]
    args = ["--config", str(spec), "--report"]
    if given == "--storage":
        args += ["--storage", url]
    else:
        monkeypatch.setenv("OPTUNA_STORAGE", url)
    assert sweep_study.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --storage postgresql+psycopg2://sweeper"), err
    assert SECRET not in err[0] and "***" in err[0], err[0]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"weird://user:{SECRET}@host/x", "weird://user:***@host/x"),  # a scheme SQLAlchemy does not know
        (f"postgresql://u:{SECRET}@x@host/db", "postgresql://u:***@host/db"),  # an @ in the password
        (f"postgresql://u@h/db?sslmode=require&password={SECRET}", "postgresql://u@h/db?sslmode=require&password=***"),
        (
            f"postgresql://h/db?sslpassword={SECRET}&api_token={SECRET}#f",
            "postgresql://h/db?sslpassword=***&api_token=***#f",
        ),
        (f"not a url //user:pa@ss{SECRET}@host/x", sweep_storage.UNPARSABLE),  # where the secret stands is unknown
        ("sqlite:////tmp/study.db", "sqlite:////tmp/study.db"),
    ],
)
def test_shown_hides_every_credential_of_a_url(url, shown):
    assert sweep_storage.shown(url) == shown
    assert SECRET not in sweep_storage.scrubbed(f"failed at {url}", url)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://u:{SECRET}@h/db",
        f"postgresql://u@h/db?password={SECRET}",
        f"postgresql://u@h/db?password={SECRET.replace('-', '%2D')}",  # a driver repeats it decoded
    ],
)
def test_scrubbed_hides_a_credential_a_library_repeats_alone(url):
    assert sweep_storage.scrubbed(f"password {SECRET!r} rejected", url) == "password '***' rejected"


@pytest.mark.slow
@pytest.mark.skipif(not POSTGRES, reason="no PostgreSQL server: set PROJECT_TEST_POSTGRES_URL (.ci/run starts one)")
def test_postgresql_password_is_never_printed_or_written(fashion_data, tmp_path):
    """A real sweep trial on PostgreSQL with a password in the URL (the CI server trusts 127.0.0.1, so any
    password connects), given as --storage and as OPTUNA_STORAGE: neither the output, nor any file written,
    nor the study's or trials' attributes hold it."""
    name = f"secret_{uuid.uuid4().hex[:8]}"
    spec = smoke_file(tmp_path, name)
    url = with_password(POSTGRES)
    outputs = []
    steps = [
        (["--storage", url, "--report"], {}),  # before the study exists
        (["--n_trials", "1"], {"OPTUNA_STORAGE": url}),  # one trial, the URL from the environment
        (["--storage", url, "--report"], {}),
    ]
    for extra, env in steps:
        cmd = [
            sys.executable,
            "-m",
            "project.sweep",
            "--config",
            str(spec),
            *extra,
            "--data.data_dir",
            str(fashion_data),
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        outputs.append(subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300))
    assert outputs[0].returncode == 2 and "no study" in outputs[0].stderr
    assert outputs[1].returncode == 0, outputs[1].stderr[-3000:]
    assert outputs[2].returncode == 0, outputs[2].stderr[-3000:]
    for proc in outputs:
        assert SECRET not in proc.stdout + proc.stderr
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {"trial.json", "config.yaml", "sweep-fit.log", "report.md"} <= {p.name for p in files}
    assert [p for p in files if SECRET.encode() in p.read_bytes()] == []
    study = optuna.load_study(study_name=name, storage=url)
    attrs = [study.user_attrs] + [[t.user_attrs, t.system_attrs] for t in study.get_trials()]
    assert len(attrs) == 2 and SECRET not in json.dumps(attrs, default=str)


# -- the DDP rendezvous listens on 127.0.0.1 on one node ------------------------------------------------------


class Hold(Callback):
    """Test-only: each rank writes ``ready-<rank>`` into ``$HOLD_DIR`` at the start of training and waits there for
    a ``go`` file, so a test can look at the run's sockets while every process is alive."""

    def on_train_start(self, trainer, pl_module):
        folder = os.environ.get("HOLD_DIR")
        if not folder:
            return
        Path(folder, f"ready-{trainer.global_rank}").write_text(str(os.getpid()))
        for _ in range(6000):  # 10 min at most, should the test die
            if Path(folder, "go").exists():
                return
            time.sleep(0.1)


def listening(pids: set[int]) -> list[str]:
    """``address:port`` of every TCP socket in LISTEN state that one of ``pids`` holds (from /proc)."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                addr, port = local.split(":")
                raw = bytes.fromhex(addr)
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # per-word host byte order
                found.append(f"{socket.inet_ntop(family, raw)}:{int(port, 16)}")
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_single_node_ddp_listens_on_loopback_only(fashion_data, tmp_path):
    hold = tmp_path / "hold"
    hold.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(Path(__file__).parent), str(REPO / "tests")]),
        "HOLD_DIR": str(hold),
    }
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [
        sys.executable,
        "-m",
        "project.fit",
        "--config",
        str(REPO / "configs/fashion_mnist.yaml"),
        "--config",
        str(REPO / "configs/trainer/ddp_cpu.yaml"),
        "--data.data_dir",
        str(fashion_data),
        "--data.num_workers",
        "0",
        "--trainer.max_epochs",
        "1",
        "--trainer.limit_train_batches",
        "2",
        "--trainer.limit_val_batches",
        "2",
        "--trainer.limit_test_batches",
        "2",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.callbacks+=test_cli_input.Hold",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while len(list(hold.glob("ready-*"))) < 2 and proc.poll() is None:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        sockets = listening({proc.pid} | descendants(proc.pid))
    finally:
        (hold / "go").touch()
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    # rank 0's rendezvous store and each rank's gloo socket, all on the loopback interface
    assert len(sockets) >= 3, sockets
    assert all(s.rsplit(":", 1)[0] in ("127.0.0.1", "::1") for s in sockets), sockets


# Switches that change no dtype or numeric path on a CPU (what is logged or checked, and when; cudnn's flags, which a
# CPU ignores; the schedule): one pick is enough. Those that touch the step (clipping, accumulation, anomaly
# detection, the profilers) run under both picks in the tuned-config matrix above.
ONE_PICK = {
    "benchmark",
    "cudnn off",
    "overfit_batches",
    "profiler",
    "detect_anomaly",
    "accumulate",
    "gradient_clip",
    "no sanity check",
    "no checkpointing",
    "val every 2nd epoch",
    "log every step",
    "one-cycle",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "picked"),
    precision_cases(SWITCHES, lambda n: _sets_precision(SWITCHES[n][0]) or n in ONE_PICK, {"in_memory"}),
)
def test_every_switch_under_each_auto_precision(name, picked, tiny_mnist, tmp_path, monkeypatch):
    """Every switch (helpers.SWITCHES) trains and is recorded, under each precision auto_precision can pick
    (configs/mnist.yaml sets auto_precision: a plain run of a switch is one of these three)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(project.cli.checks, "fastest_precision", lambda accelerator: picked)
    extra, expected = SWITCHES[name]
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--auto_precision", "true", *extra)) == 0
    (run,) = run_dirs(tmp_path / "logs")
    r = results(run)
    assert r["test_samples"] == 100 and 0 <= r["test_acc"] <= 1
    for key, value in expected.items():
        assert r[key] == value, key
    if "--trainer.precision" not in extra and not {"precision", "requested_precision"} & set(expected):
        assert r["precision"] == {"16-mixed": "bf16-mixed"}.get(picked, picked)
