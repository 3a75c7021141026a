"""Run folders are hostile input: every file read from one goes through :mod:`project.runs.read` (regular files
only, sizes checked first, bounded JSON/YAML/CSV), and every file ``summarize`` and a sweep's report write goes
through :mod:`project.runs.files` (a planted link is replaced, never followed).

Three kinds of tests: properties (arbitrary bytes and hostile shapes into each reader: parsed, or one
:class:`UnreadableFile` of one line), ``python -m project.summarize`` over a logs folder holding one bad run (one
warning line, the other runs summarized, exit 0, in seconds), and links planted at every name those commands write.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import time
from pathlib import Path

import optuna
import pytest
import yaml
from helpers import write_sweep
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from project import summarize
from project.cluster import slurm
from project.errors import UnreadableFile
from project.runs import layout, read, resume
from project.summary import collect
from project.sweep import file as sweep_file
from project.sweep import report as sweep_report
from project.sweep import server as trial_server
from project.sweep import trial as sweep_trial

# Fast properties: no example database in the repository, a deadline that a bomb must not reach.
# No per-example deadline: on a loaded 2-core machine one example may take several seconds; each test bounds an
# example that hangs with within(10) instead (a deadline made the suite flaky under pytest-xdist).
PROPERTY = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# The billion laughs in YAML (457 bytes): 9^10 "lol"s once its aliases are expanded; composed, 100 nodes.
BOMB = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]\n" for prev, name in zip("abcdefghi", "bcdefghij")
)


class Hung(Exception):
    """Raised into a block that ran too long (not an ``OSError``: no reader may take it for a missing file)."""


@contextlib.contextmanager
def within(seconds: float):
    """Fail the test (instead of hanging it) when the block runs longer than ``seconds``: a SIGALRM interrupts a
    blocking open of a FIFO or a loop expanding an alias bomb."""

    def expire(signum, frame):
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def one_line(error: Exception, path: Path) -> str:
    """The error's message, checked to be one line naming ``path``."""
    message = str(error)
    assert "\n" not in message and "\r" not in message, message
    assert message.startswith(str(path)), message
    return message


def depth(value) -> int:
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return 1 + max(map(depth, children), default=0) if isinstance(value, dict | list) else 0


def finite_everywhere(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return all(map(finite_everywhere, children))


CONFIG = {
    "seed_everything": 1,
    "model": {"net": "lenet", "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.01}}},
    "data": {"class_path": "project.data.MNISTDataModule", "init_args": {"batch_size": 50, "data_dir": "data"}},
    "trainer": {"max_epochs": 2, "callbacks": [{"class_path": "project.callbacks.Pruning"}]},
}


def good_run(logs: Path, version: int, seed: int = 1, test_acc: float | None = None) -> Path:
    """A finished run folder as ``fit`` leaves it for ``summarize``: ``config.yaml``, ``results.json``,
    ``metrics.csv``."""
    run = logs / "exp" / f"version_{version}"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(CONFIG | {"seed_everything": seed}))
    acc = 0.5 + version / 100 if test_acc is None else test_acc
    results = {"test_acc": acc, "best_val_acc": 0.5, "seed": seed, "epochs": 2, "sparsity": 0.0}
    (run / "results.json").write_text(json.dumps(results))
    (run / "metrics.csv").write_text("epoch,step,val/acc\n0,10,0.5\n1,20,0.6\n")
    return run


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """One run folder for every example of the properties (rewritten by each)."""
    run = tmp_path_factory.mktemp("hostile") / "logs" / "exp" / "version_0"
    run.mkdir(parents=True)
    return run


# -- what hostile files look like -----------------------------------------------------------------------------------
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=25,
)
NESTING = st.integers(1, 3000)


def bomb(width: int, levels: int) -> str:
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


HOSTILE_JSON = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(str.encode),
    VALUES.map(lambda v: json.dumps(v).encode()),  # NaN and Infinity as JSON's non-standard literals
    VALUES.map(lambda v: json.dumps({"test_acc": v, "seed": v, "run": v, "params": v}).encode()),
    NESTING.map(lambda n: b"[" * n + b"]" * n),
    NESTING.map(lambda n: b'{"test_acc": ' * n + b"1" + b"}" * n),
    st.sampled_from(
        [
            b'{"test_acc": Infinity, "best_val_acc": NaN, "epochs": -Infinity, "sparsity": 1e999}',
            b'{"run": "7", "params": {"lr": [1, 2]}}',
            b'{"run": 1e400, "params": []}',
            b'{"test_acc": ' + b"9" * 5000 + b"}",
            b"\xef\xbb\xbf{}",
            b'{"a": 1}\x00',
            b"\xff\xfe{\x00}\x00",
        ]
    ),
)

HOSTILE_YAML = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(str.encode),
    VALUES.map(lambda v: yaml.safe_dump(v).encode()),
    st.builds(bomb, st.integers(2, 12), st.integers(2, 12)).map(str.encode),
    NESTING.map(lambda n: b"[" * n + b"]" * n),
    NESTING.map(lambda n: "".join(f"{' ' * i}k:\n" for i in range(n)).encode()),
    st.sampled_from(
        [
            BOMB.encode(),
            b"&a [*a]",
            b"a: &a {b: *a}",
            b"base: &b {x: 1}\nother:\n  <<: [*b, *b]\n",
            b"a: !!python/object/apply:os.system [echo hi]",
            b"a: !!binary not-base64!",
            b"when: 2024-13-45",
            b"when: 2024-01-01 10:00:00 +99:00",
            b"n: " + b"1" * 5000,
            b"? [a, b]\n: c",
            b"a: 1\n---\nb: 2\n",
            b"a: *undefined",
            b"s: !!set {a, b}\nd: 2024-01-01\n",
            "a: é".encode("latin-1"),
        ]
    ),
)

CELLS = st.sampled_from(["", "0", "1", "-3", "0.5", "nan", "inf", "-inf", "1e999", "x", "1_0", '"', ","])
HOSTILE_CSV = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(str.encode),
    st.lists(st.lists(CELLS, min_size=1, max_size=5), max_size=5).map(
        lambda rows: ("epoch,step,val/acc\n" + "\n".join(",".join(r) for r in rows)).encode()
    ),
    st.integers(131_000, 140_000).map(lambda n: b"epoch,step,val/acc\n0,10," + b"x" * n + b"\n"),
    st.sampled_from([b"epoch,step\n0,\x001\n", b'epoch,step\n"0,1\n', b"epoch,step,val/acc\n0,1,0.5,9,9\n"]),
)


def write(path: Path, data: bytes) -> None:
    for stale in path.parent.iterdir():
        if stale.is_file():
            stale.unlink()
    path.write_bytes(data)


# -- (a) properties: parsed, or one UnreadableFile of one line --------------------------------------------------
@PROPERTY
@given(data=HOSTILE_JSON)
def test_results_json_is_a_finite_shallow_object_or_one_error(scratch, data):
    with within(10):  # an example that hangs fails instead of hanging the suite
        write(scratch / "results.json", data)
        try:
            results = layout.read_results(scratch)
        except UnreadableFile as e:
            one_line(e, scratch / "results.json")
            return
        assert isinstance(results, dict)
        assert finite_everywhere(results) and depth(results) <= read.MAX_DEPTH


@PROPERTY
@given(data=HOSTILE_YAML)
def test_a_runs_config_yaml_is_summarized_or_the_run_skipped_with_one_line(scratch, data):
    with within(10):  # an example that hangs fails instead of hanging the suite
        write(scratch / "results.json", b'{"test_acc": 0.5}')
        (scratch / "config.yaml").write_bytes(data)
        lines: list[str] = []
        runs = collect.collect([scratch], report=lines.append)
        if runs:
            (run,) = runs
            assert not lines and isinstance(run.config, dict) and len(run.config) <= read.YAML_NODES
        else:
            (line,) = lines
            assert "\n" not in line and line.startswith(f"skipped run {scratch}: {scratch / 'config.yaml'}")
        kind = resume._run_kind(scratch)
        assert kind is None or isinstance(kind, dict)


@PROPERTY
@given(data=HOSTILE_YAML)
def test_a_resume_config_is_read_as_data_or_refused_in_one_line(scratch, data):
    with within(10):  # an example that hangs fails instead of hanging the suite
        write(scratch / "config.yaml", yaml.safe_dump(CONFIG).encode())
        (scratch / "config-resume-1.yaml").write_bytes(data)
        assert layout.latest_config(scratch) == scratch / "config-resume-1.yaml"
        kind = resume._run_kind(scratch)  # --ckpt_path last compares the kinds of an experiment's runs
        assert kind is None or set(kind) == {"callbacks"}
        try:
            config = read.read_yaml(scratch / "config-resume-1.yaml")
        except UnreadableFile as e:
            one_line(e, scratch / "config-resume-1.yaml")
            assert kind is None
            return
        assert depth(config) <= read.MAX_DEPTH


@PROPERTY
@given(data=HOSTILE_CSV)
def test_metrics_csv_rows_have_finite_integer_epochs_or_one_error(scratch, data):
    with within(10):  # an example that hangs fails instead of hanging the suite
        write(scratch / "metrics.csv", data)
        rows = layout.read_epoch_metrics(scratch)  # a resumed run's EpochMetrics: [] when unreadable
        assert all(isinstance(r["epoch"], int) and isinstance(r["step"], int) for r in rows)
        assert all(isinstance(k, str) and isinstance(v, int | float) for r in rows for k, v in r.items())
        try:
            strict = layout.read_epoch_metrics(scratch, strict=True)  # summarize's curves: the problem, in one line
        except UnreadableFile as e:
            one_line(e, scratch / "metrics.csv")
            assert rows == []
            return
        assert repr(strict) == repr(rows)  # (NaN cells: nan != nan)


@PROPERTY
@given(data=HOSTILE_JSON)
def test_a_sweep_trials_json_is_an_object_or_nothing(scratch, data):
    with within(10):  # an example that hangs fails instead of hanging the suite
        write(scratch / "trial.json", data)
        info = sweep_trial._read_trial(scratch)
        assert isinstance(info, dict) and finite_everywhere(info)
        columns = sweep_trial.ReportToStudy().extra_hparams(scratch)
        assert isinstance(columns, dict)
        assert not columns or type(columns["trial"]) is int
        assert all(isinstance(v, bool | int | float | str) for v in columns.values())


# -- readers never block on what is not a regular file -------------------------------------------------------------
def _commands_check(run: Path) -> None:
    from project.cli.commands import check_run_config
    from project.evaluate import COMMAND

    check_run_config(COMMAND, run / "config.yaml")


READERS = {  # file name -> (what reads it, what it gives for a FIFO there: None when it raises UnreadableFile)
    "results.json": (layout.read_results, None),
    "config.yaml": (_commands_check, None),
    "config-resume-1.yaml": (resume._run_kind, "None"),
    "metrics.csv": (layout.read_epoch_metrics, "[]"),
    "trial.json": (sweep_trial._read_trial, "{}"),
    "trial.json:hparams": (lambda run: sweep_trial.ReportToStudy().extra_hparams(run), "{}"),
    "slurm_job.json": (slurm.job_of, "None"),
}


@pytest.mark.parametrize("name", sorted(READERS))
def test_a_fifo_in_a_run_folder_is_refused_without_blocking(name, tmp_path):
    """A FIFO with no writer blocks an ``open()`` for reading forever: each reader refuses it from its ``stat``."""
    run = tmp_path / "exp" / "version_0"
    run.mkdir(parents=True)
    if name == "config-resume-1.yaml":
        (run / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    os.mkfifo(run / name.split(":")[0])
    reader, expected = READERS[name]
    with within(10):
        if expected is None:
            with pytest.raises(UnreadableFile, match="is a FIFO") as caught:
                reader(run)
            one_line(caught.value, run / name)
        else:
            assert repr(reader(run)) == expected


# -- (b) summarize over a logs folder holding one bad run ------------------------------------------------------------
def summarize_logs(logs: Path, capsys, *args: str, seconds: float = 60) -> tuple[str, list[str]]:
    """``python -m project.summarize LOGS ARGS`` in-process: exit status 0 checked; (summary.md, warning lines)."""
    capsys.readouterr()
    with within(seconds):
        assert summarize.main([str(logs), *args]) == 0
    err = capsys.readouterr().err
    return (logs / "summary.md").read_text(), [line for line in err.splitlines() if line.startswith("warning:")]


def skipped_with_one_line(logs: Path, bad: Path, why: str, capsys, seconds: float = 60) -> str:
    good = [good_run(logs, 0), good_run(logs, 1)]
    start = time.monotonic()
    table, warnings = summarize_logs(logs, capsys, seconds=seconds)
    assert time.monotonic() - start < seconds
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: skipped run {bad}: "), warnings
    assert why in warnings[0], warnings[0]
    assert all(f"| exp/{run.name} |" in table for run in good) and f"/{bad.name} |" not in table
    return warnings[0]


def bad_run(logs: Path, version: int = 2) -> Path:
    run = logs / "exp" / f"version_{version}"
    run.mkdir(parents=True)
    return run


def test_summarize_skips_a_run_whose_results_json_is_a_fifo(tmp_path, capsys):
    logs = tmp_path / "logs"
    run = bad_run(logs)
    (run / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    os.mkfifo(run / "results.json")
    skipped_with_one_line(logs, run, "results.json: is a FIFO (named pipe)", capsys, seconds=30)


def test_summarize_does_not_read_a_1_gib_config(tmp_path, capsys):
    logs = tmp_path / "logs"
    run = bad_run(logs)
    (run / "results.json").write_text('{"test_acc": 0.9}')
    with open(run / "config.yaml", "wb") as f:
        f.truncate(1 << 30)  # sparse: no disk used; a reader that reads it holds 1 GiB
    line = skipped_with_one_line(logs, run, "config.yaml: is 1,073,741,824 bytes, over the 4 MiB limit", capsys)
    assert "a run's config" in line


def test_summarize_skips_a_run_whose_config_is_not_utf8(tmp_path, capsys):
    logs = tmp_path / "logs"
    run = bad_run(logs)
    (run / "results.json").write_text('{"test_acc": 0.9}')
    (run / "config.yaml").write_bytes("model:\n  net: lenét\n".encode("latin-1"))
    skipped_with_one_line(logs, run, "config.yaml: is not UTF-8 text (byte 0xe9 at offset 17)", capsys)


def test_summarize_leaves_a_non_finite_result_out_of_the_mean(tmp_path, capsys):
    """``Infinity`` is read as a missing value (as ``summary.json`` writes non-finite numbers): the run is listed,
    its ``test_acc`` is ``-`` and the mean ± std of its group is over the finite values."""
    logs = tmp_path / "logs"
    good_run(logs, 0, seed=1, test_acc=0.5)
    good_run(logs, 1, seed=1, test_acc=0.7)
    run = good_run(logs, 2, seed=1)
    (run / "results.json").write_text('{"test_acc": Infinity, "seed": 1, "epochs": 2, "best_val_acc": NaN}')
    table, warnings = summarize_logs(logs, capsys, "--by", "seed")
    assert warnings == []
    assert "| exp/version_2 | seed=1 | finished | 1 | - | - |" in table
    assert "| seed=1 | 3 | 0.6000 ± 0.1414 | 0.5000 ± 0.0000 |" in table
    stats = json.loads((logs / "summary.json").read_text())["groups"]["seed=1"]
    assert stats["test_acc"]["n"] == 2 and stats["best_val_acc"]["n"] == 2


def test_summarize_leaves_out_the_curve_of_a_metrics_csv_with_a_huge_cell(tmp_path, capsys):
    """A cell over the csv module's 128 KiB limit: that run's curve is left out of ``val_acc.png``, its row stays."""
    logs = tmp_path / "logs"
    good_run(logs, 0)
    good_run(logs, 1)
    run = good_run(logs, 2)
    (run / "metrics.csv").write_text("epoch,step,val/acc\n0,10," + "9" * (200 << 10) + "\n")
    table, warnings = summarize_logs(logs, capsys)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"warning: left the curve of run {run} out of val_acc.png: {run / 'metrics.csv'}")
    assert "field larger than field limit" in warnings[0]
    assert all(f"| exp/version_{i} |" in table for i in range(3))
    assert (logs / "val_acc.png").stat().st_size > 0


def test_summarize_skips_a_100000_deep_results_json_in_seconds(tmp_path, capsys):
    logs = tmp_path / "logs"
    run = bad_run(logs)
    (run / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    (run / "results.json").write_text("[" * 100_000 + "]" * 100_000)
    skipped_with_one_line(logs, run, "results.json: nests more than 64 arrays/objects deep", capsys, seconds=20)


def test_summarize_skips_a_yaml_alias_bomb_in_seconds(tmp_path, capsys):
    """457 bytes that expand to 9^10 nodes: refused from its 100 composed nodes, never expanded (``flatten`` of the
    loaded config would walk all of them)."""
    assert len(BOMB) <= 468
    logs = tmp_path / "logs"
    run = bad_run(logs)
    (run / "results.json").write_text('{"test_acc": 0.9}')
    (run / "config.yaml").write_text(BOMB)
    skipped_with_one_line(logs, run, "expands to more than 1,000,000 nodes through its aliases", capsys, seconds=20)


def test_sweep_report_leaves_out_a_trial_whose_results_cannot_be_read(tmp_path, capsys):
    spec = sweep_file.load_sweep(write_sweep(tmp_path))  # smoke: lr in {0.01, 0.05} x seeds {1, 2}, best_val_acc
    folder = tmp_path / "logs" / "smoke"
    study = trial_study(folder, {0: json.dumps({"best_val_acc": 0.2, "sparsity": 0.0, "epochs": 2, "seed": 1})})
    (folder / "version_1" / "results.json").write_text("[" * 100_000 + "]" * 100_000)
    capsys.readouterr()
    with within(60):
        out = sweep_report.report(study, spec, folder)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: trial 1: its results are left out: "), warnings
    assert [t["results"] != {} for t in out["trials"]] == [True, False]
    assert "Best point" in (folder / "report.md").read_text()


# -- (c) links planted at every name summarize and a sweep's report write -----------------------------------------
def plant_links(folder: Path, names: list[str], victim: Path) -> None:
    victim.write_text("precious")
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).symlink_to(victim)


def replaced_not_followed(folder: Path, names: list[str], victim: Path) -> None:
    assert victim.read_bytes() == b"precious"
    for name in names:
        path = folder / name
        assert not path.is_symlink() and path.is_file() and path.stat().st_size > 0, name
        assert path.stat().st_mode & 0o777 == 0o644, name


def test_summarize_replaces_links_planted_at_its_outputs_never_following_them(tmp_path, capsys):
    logs = tmp_path / "logs"
    good_run(logs, 0, seed=1)
    good_run(logs, 1, seed=2)
    names = ["summary.md", "summary.csv", "summary-runs.csv", "summary.json", "val_acc.png", "test_acc_vs_seed.png"]
    plant_links(logs, names, tmp_path / "victim.txt")
    summarize_logs(logs, capsys, "--by", "seed")
    replaced_not_followed(logs, names, tmp_path / "victim.txt")
    assert "| exp/version_1 |" in (logs / "summary.md").read_text()


def trial_study(folder: Path, results: dict[int, str]) -> optuna.Study:
    """A study of two completed trials (lr 0.01 and 0.05, seed 1) whose runs hold ``results[i]`` (default: a
    valid results.json)."""
    study = optuna.create_study(direction="maximize")
    lr = optuna.distributions.CategoricalDistribution([0.01, 0.05])
    seed = optuna.distributions.CategoricalDistribution([1, 2])
    for i, rate in enumerate((0.01, 0.05)):
        run = folder / f"version_{i}"
        run.mkdir(parents=True)
        value = 0.2 + i / 10
        default = json.dumps({"best_val_acc": value, "sparsity": 0.5, "epochs": 2, "seed": 1})
        (run / "results.json").write_text(results.get(i, default))
        (run / "metrics.csv").write_text("epoch,step,val/acc\n0,10,0.1\n1,20,0.2\n")
        study.add_trial(
            optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE,
                value=value,
                params={"model.optimizer.init_args.lr": rate, "seed": 1},
                distributions={"model.optimizer.init_args.lr": lr, "seed": seed},
                user_attrs={"run": str(run)},
            )
        )
    return study


def test_sweep_report_replaces_links_planted_at_its_outputs_never_following_them(tmp_path):
    spec = sweep_file.load_sweep(write_sweep(tmp_path))
    folder = tmp_path / "logs" / "smoke"
    study = trial_study(folder, {})
    names = ["report.md", "report.json", "val_acc.png", "objective-model.optimizer.init_args.lr.png"]
    names.append("objective-sparsity.png")
    plant_links(folder, names, tmp_path / "victim.txt")
    out = sweep_report.report(study, spec, folder)
    assert out["plots"] == ["val_acc.png", "objective-model.optimizer.init_args.lr.png", "objective-sparsity.png"]
    replaced_not_followed(folder, names, tmp_path / "victim.txt")


class FakeServer:
    """A warm trial server that records instead of running fit."""

    alive = True

    def __init__(self) -> None:
        self.ran: list[list[str]] = []

    def run(self, args, env, log, started=None) -> int:
        self.ran.append(args)
        return 0


@pytest.mark.parametrize("server", ["warm", "subprocess"])
def test_a_trials_log_is_never_appended_to_through_a_planted_link(server, tmp_path):
    """``sweep-fit.log`` is opened ``O_NOFOLLOW``: a link at its name fails the trial in one line, nothing runs,
    the link's target is untouched, and the trial's last error is never read from it."""
    run = tmp_path / "logs" / "smoke" / "version_0"
    log = run / sweep_trial.FIT_LOG
    plant_links(run, [log.name], tmp_path / "victim.txt")
    (tmp_path / "victim.txt").write_text("precious\nerror: a secret line of the victim\n")
    fake = FakeServer() if server == "warm" else None
    started: list[int] = []
    with within(60), pytest.raises(sweep_trial.TrialFailed) as caught:
        sweep_trial.run_fit(fake, ["--help"], dict(os.environ), log, started.append)
    assert str(caught.value) == (
        f"{log} is a symbolic link; a trial's log is written only in place, never through a link: remove it"
    )
    assert (tmp_path / "victim.txt").read_bytes() == b"precious\nerror: a secret line of the victim\n"
    assert log.is_symlink() and not started and (fake is None or not fake.ran)
    assert "secret" not in sweep_trial._last_error(log)
    with pytest.raises(OSError):  # the trial server's child opens the log the same way
        trial_server.open_log(log)
