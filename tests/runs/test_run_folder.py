"""The run folder is the product's: one run per folder under any timing, and nothing read from a file (checkpoint
state, a planted link) ever leads a write or a delete outside it (issue: own the run folder).

Most tests run in-process on the tiny MNIST fixture; the concurrency test starts real processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import REPO, own_data, results, run_dirs, run_main, tiny_args
from tiny_data import PRUNING

from project import checkpoints, evaluate
from project.errors import ConfigError
from project.runs import claims, files, layout


def copy_run(run: Path, logs: Path, version: int = 0) -> Path:
    """A copy of the finished run ``run`` (a session fixture: read-only) as ``logs/tiny/version_<version>``, the
    folder :func:`helpers.tiny_args` with ``logs`` names; returns the copy."""
    copy = logs / "tiny" / f"version_{version}"
    shutil.copytree(run, copy, symlinks=True)
    return copy


def error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("error:")]


CLAIM_MANY = """
import sys
from project.runs import claims
print(*(claims.claim_run(sys.argv[1]) for _ in range(int(sys.argv[2]))), sep="\\n")
"""


# -- one run per folder ------------------------------------------------------------------------------------------
def test_claim_run_gives_every_process_its_own_folder(tmp_path):
    """8 processes claim 15 folders each at the same moment: 120 distinct folders, none reused."""
    experiment = tmp_path / "logs" / "exp"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIM_MANY, str(experiment), "15"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    claimed = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        claimed += out.split()
    assert len(claimed) == 120 and len(set(claimed)) == 120
    assert sorted(layout.version_of(Path(c)) for c in claimed) == list(range(120))


def test_claim_run_skips_files_and_never_takes_a_folder_that_holds_a_run(tmp_path):
    experiment = tmp_path / "exp"
    (experiment / "version_0").mkdir(parents=True)
    (experiment / "version_0" / "config.yaml").write_text("{}")
    (experiment / "version_3").write_text("a file named like a run")
    assert claims.claim_run(experiment) == experiment / "version_4"
    with pytest.raises(ConfigError, match="already holds a run"):
        claims.claim_run(experiment, version=0)
    # a sweep's prepared trial folder (no config.yaml yet) is taken as it is
    (experiment / "version_7").mkdir()
    (experiment / "version_7" / "trial.json").write_text("{}")
    assert claims.claim_run(experiment, version=7) == experiment / "version_7"


@pytest.mark.slow
def test_concurrent_fits_on_one_experiment_get_one_folder_each(fashion_data, tmp_path):
    """3 fits started at once on one save_dir, then 2 more while those folders exist: 5 folders, each holding
    exactly one run (its own config, results of its own seed, one last.ckpt)."""
    logs = tmp_path / "logs"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    base = [
        "--config",
        str(REPO / "configs/fashion_mnist.yaml"),
        "--data.data_dir",
        str(fashion_data),
        "--trainer.limit_train_batches",
        "2",
        "--trainer.limit_val_batches",
        "1",
        "--trainer.limit_test_batches",
        "1",
        "--trainer.max_epochs",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger.init_args.save_dir",
        str(logs),
    ]
    seeds = iter(range(11, 16))
    for at_once in (3, 2):
        procs = []
        for _ in range(at_once):
            args = [*base, "--seed_everything", str(next(seeds))]
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "project.fit", *args],
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for p in procs:
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-2000:]
    folders = run_dirs(logs)
    assert len(folders) == 5
    seen = set()
    for run in folders:
        files = sorted(p.name for p in run.iterdir() if p.is_file() and not p.name.startswith("events."))
        assert files == ["config.yaml", "hparams.yaml", "metrics.csv", "results.json"], (run, files)
        seed = yaml.safe_load((run / "config.yaml").read_text())["seed_everything"]
        assert results(run)["seed"] == seed and results(run)["log_dir"] == str(run.resolve())
        assert sorted(p.name for p in (run / "checkpoints").iterdir())[-1] == "last.ckpt"
        assert len(list((run / "checkpoints").glob("last*.ckpt"))) == 1
        seen.add(seed)
    assert seen == set(range(11, 16))


@pytest.mark.slow
def test_explicit_version_that_holds_a_run_is_refused(trained_run, tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    run = copy_run(trained_run, logs)
    assert run_dirs(logs) == [run]
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert run_main(tiny_args(tiny_mnist, logs, "--trainer.logger.init_args.version", "0")) == 2
    (err,) = error_lines(capsys)
    assert "already holds a run" in err and "--ckpt_path" in err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


# -- paths from a checkpoint are data ----------------------------------------------------------------------------
def plant(nested: Path, file: Path, link: Path) -> None:
    """What must survive: ``nested`` (in folders made for it) and ``file``, each holding its own name as text, and
    ``link``, a symbolic link to ``file``."""
    nested.parent.mkdir(parents=True)
    nested.write_text(nested.name)
    file.write_text(file.name)
    link.symlink_to(file)


@pytest.mark.slow
def test_crafted_checkpoint_paths_never_remove_anything_outside_the_run(trained_run, tiny_mnist, tmp_path, monkeypatch):
    """A checkpoint that loads with weights_only=True but whose RunCheckpoint state points at files and folders
    outside the run (``..`` paths, absolute paths, a link): resuming from it trains on and removes nothing
    outside the run (a copy of the session's finished 2-epoch run, resumed for 2 more epochs)."""
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    run = copy_run(trained_run, logs)
    ckpt_dir = run / "checkpoints"
    victim_dir, victim_file, link = tmp_path / "victim", tmp_path / "victim.ckpt", ckpt_dir / "link.ckpt"
    plant(victim_dir / "inner" / "precious.txt", victim_file, link)
    traversal = str(ckpt_dir / ".." / ".." / ".." / "victim")
    ckpt = torch.load(ckpt_dir / "last.ckpt", weights_only=True)
    (key,) = [k for k in ckpt["callbacks"] if k.startswith("RunCheckpoint")]
    state = ckpt["callbacks"][key]
    assert state["dirpath"] == str((trained_run / "checkpoints").resolve())  # the run's own folder, as written
    state["dirpath"] = str(ckpt_dir.resolve())  # the copy's, as its own checkpoint names it
    state["last_model_path"] = traversal
    state["best_model_path"] = str(victim_file)
    state["kth_best_model_path"] = str(link)
    state["best_k_models"] = {traversal: torch.tensor(0.99), str(victim_file): torch.tensor(0.98)}
    state["best_model_score"] = torch.tensor(0.99)
    crafted = ckpt_dir / "crafted.ckpt"
    torch.save(ckpt, crafted)
    link.unlink()  # the run folder itself holds no link: the paths in the state are the attack
    checkpoints.load_checkpoint(crafted)  # loads with the safe unpickler
    args = tiny_args(
        tiny_mnist, logs, "--checkpoint.save_top_k", "1", "--trainer.max_epochs", "4", "--ckpt_path", str(crafted)
    )
    assert run_main(args) == 0
    assert (victim_dir / "inner" / "precious.txt").read_text() == "precious.txt"
    assert victim_file.read_text() == "victim.ckpt"
    assert results(run)["epochs"] == 4 and run_dirs(logs) == [run]
    assert Path(results(run)["best_ckpt"]).parent == ckpt_dir.resolve()


def test_checkpoint_io_removes_only_single_files(tmp_path):
    from project.callbacks.checkpoint import LocalAtomicCheckpointIO

    folder, target, link = tmp_path / "folder.ckpt", tmp_path / "target.txt", tmp_path / "link.ckpt"
    plant(folder / "sub" / "x", target, link)
    io = LocalAtomicCheckpointIO()
    io.remove_checkpoint(folder)
    io.remove_checkpoint(f"file://{link}")
    assert (folder / "sub" / "x").read_text() == "x"  # a folder is never removed
    assert not link.is_symlink() and target.read_text() == "target.txt"  # the link itself goes, never its target


# -- planted links are replaced, never followed ------------------------------------------------------------------
def test_atomic_writes_never_follow_a_planted_link(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("secret")
    for name in (".results.json.tmp", "results.json", ".eval-best-test.json.tmp", "config.yaml"):
        (run / name).symlink_to(victim)
    files.write_json(run / "results.json", {"a": 1})
    files.write_text(run / "config.yaml", "b: 2\n")
    assert victim.read_text() == "secret"
    assert not (run / "results.json").is_symlink() and layout.read_results(run) == {"a": 1}
    assert (run / "config.yaml").read_text() == "b: 2\n"
    assert sorted(p.name for p in run.iterdir() if not p.is_symlink()) == ["config.yaml", "results.json"]


def test_a_write_killed_midway_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text("old: 1\n")

    def killed(fd):
        raise KeyboardInterrupt  # a signal between the write and the rename

    monkeypatch.setattr(files.os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        files.write_text(path, "new: 2\n" * 1000)
    assert path.read_text() == "old: 1\n" and [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


@pytest.mark.slow
def test_evaluate_never_writes_through_a_planted_link(trained_run, tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = copy_run(trained_run, tmp_path / "logs")
    victim = tmp_path / "victim.txt"
    victim.write_text("secret")
    (run / ".eval-best-test.json.tmp").symlink_to(victim)
    (run / "eval-best-test.json").symlink_to(victim)
    assert evaluate.main([str(run), *own_data(run)]) == 0
    assert victim.read_text() == "secret"
    assert not (run / "eval-best-test.json").is_symlink()
    assert '"acc"' in (run / "eval-best-test.json").read_text()


@pytest.mark.slow
def test_resume_into_a_run_folder_holding_a_link_is_refused(trained_run, tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    run = copy_run(trained_run, logs)
    (run / "hparams.yaml").unlink()
    victim = tmp_path / "victim.yaml"  # does not exist: Lightning would create it through the link
    (run / "hparams.yaml").symlink_to(victim)
    capsys.readouterr()
    assert run_main(tiny_args(tiny_mnist, logs, "--trainer.max_epochs", "3", "--ckpt_path", "last")) == 2
    (err,) = error_lines(capsys)
    assert "hparams.yaml is a symbolic link" in err
    assert not victim.exists() and not (run / "config-resume-1.yaml").exists()


# -- the user's machine: one error line, before any work, nothing left ------------------------------------------
@pytest.mark.parametrize("where", ["proc", "file", "under_file"])
def test_unusable_save_dir_is_one_error_before_any_work(where, tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("x")
    save_dir = {
        "proc": "/proc/forbidden",
        "file": str(tmp_path / "a_file"),
        "under_file": str(tmp_path / "a_file/logs"),
    }[where]
    args = tiny_args(tiny_mnist, tmp_path / "unused", "--trainer.logger.init_args.save_dir", save_dir)
    assert run_main(args) == 2
    (err,) = error_lines(capsys)
    assert err.startswith("error: trainer.logger.init_args.save_dir:") and Path(save_dir).name in err
    assert not (tiny_mnist["data"] / "MNIST").exists()  # nothing imported: refused before any work
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "mnist"]


@pytest.mark.parametrize("where", ["proc", "under_file"])
def test_unusable_data_dir_is_one_error_before_any_work(where, tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("x")
    data_dir = {"proc": "/proc/forbidden", "under_file": str(tmp_path / "a_file/data")}[where]
    args = tiny_args(tiny_mnist, tmp_path / "logs", "--data.data_dir", data_dir)
    assert run_main(args) == 2
    (err,) = error_lines(capsys)
    assert err.startswith("error: data.data_dir:")
    assert not (tmp_path / "logs").exists() or run_dirs(tmp_path / "logs") == []


# -- files written whole: a run killed while writing its config continues on retry -----------------------------
def test_config_killed_while_written_leaves_no_empty_config_and_a_retry_continues(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    real_replace = os.replace

    def killed_on_config(src, dst, **dir_fds):
        if Path(dst).name == "config.yaml":
            raise SystemExit(137)  # the worker was killed between writing and renaming
        return real_replace(src, dst, **dir_fds)

    monkeypatch.setattr(files.os, "replace", killed_on_config)
    args = tiny_args(tiny_mnist, logs, "--trainer.logger.init_args.version", "5")  # a sweep trial's folder
    with pytest.raises(SystemExit):
        run_main(args)
    monkeypatch.setattr(files.os, "replace", real_replace)
    run = logs / "tiny" / "version_5"
    assert not (run / "config.yaml").exists() and not [p for p in run.rglob("*.tmp")]
    assert run_main(args) == 0  # the retry takes the folder that holds no run yet
    assert yaml.safe_load((run / "config.yaml").read_text())["trainer"]["max_epochs"] == 1
    assert results(run)["epochs"] == 1 and run_dirs(logs) == [run]


# -- last.ckpt is the last state, whatever save_last says; checkpoints land where a URL says --------------------
def test_save_last_link_is_refused(tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--checkpoint.save_last", "link")) == 2
    (err,) = error_lines(capsys)
    assert "checkpoint.save_last" in err and "use true" in err
    assert run_dirs(tmp_path / "logs") == []  # the claimed folder is released


@pytest.mark.parametrize("scheme", ["file://", "local://"])
def test_checkpoint_dirpath_file_url_lands_on_the_local_filesystem(scheme, tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "elsewhere" / "ckpts"
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--checkpoint.dirpath", f"{scheme}{target}")) == 0
    assert (target / "last.ckpt").is_file() and len(list(target.glob("*.ckpt"))) == 2
    assert not list(tmp_path.glob("file*")) and not list(tmp_path.glob("local*"))
    r = results(run_dirs(tmp_path / "logs")[0])
    assert Path(r["best_ckpt"]).parent == target
    # the test on the best checkpoint restores its callback state; last.ckpt is still the run's last
    last = target / "last.ckpt"
    assert r["last_ckpt"] == str(last) and r["checkpoint_bytes"] == last.stat().st_size


def test_security_summary_names_the_guarantees():
    text = (REPO / "docs" / "security.md").read_text()
    security = text[text.index("## In short") :]
    for claim in ("exclusive", "symbolic link", "weights_only=True", "md5"):
        assert claim in security, claim


@pytest.mark.slow
def test_last_means_the_newest_run_of_the_commands_own_kind(
    trained_run, pruned_run, tiny_mnist, tmp_path, monkeypatch, capsys
):
    """A pruning run beside a plain run of one experiment, the pruning run the newer (copies of the session's finished
    plain 2-epoch and pruning 4-epoch runs): ``--ckpt_path last`` without the pruning callback resumes the plain run;
    with it, the pruning run; a kind with no run is one error line."""
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    plain, pruned = copy_run(trained_run, logs, 0), copy_run(pruned_run, logs, 1)
    assert run_dirs(logs) == [plain, pruned] and results(plain)["epochs"] == 2 and results(pruned)["epochs"] == 4
    capsys.readouterr()
    assert run_main(tiny_args(tiny_mnist, logs, "--trainer.max_epochs", "3", "--ckpt_path", "last")) == 0
    assert results(plain)["epochs"] == 3 and results(pruned)["epochs"] == 4
    assert run_main(tiny_args(tiny_mnist, logs, *PRUNING, "--trainer.max_epochs", "5", "--ckpt_path", "last")) == 0
    assert results(pruned)["epochs"] == 5 and run_dirs(logs) == [plain, pruned]
    capsys.readouterr()
    slim = ["--config", str(REPO / "configs/slim.yaml")]
    assert run_main(tiny_args(tiny_mnist, logs, *slim, "--trainer.max_epochs", "3", "--ckpt_path", "last")) == 2
    (err,) = error_lines(capsys)
    assert "no run under" in err and "StructuredPruning" in err
