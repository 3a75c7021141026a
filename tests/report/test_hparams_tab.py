"""TensorBoard's HPARAMS tab over a logdir of several experiments (issue 24): fit runs and sweep trials together
show every run's columns, whichever run TensorBoard happens to read first. Checked with TensorBoard's own hparams
backend (``backend_context.Context`` over its data provider), as the HPARAMS plugin serves the tab."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import results, run_dirs, run_main, tiny_args
from lightning.pytorch.callbacks import Callback
from tensorboard import context as tb_context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import api_pb2, backend_context, get_experiment, list_session_groups, metadata
from tiny_data import make_tiny_mnist

from project.report.results import HP_METRICS, HPARAMS_RUN

SWEPT = "model.optimizer.init_args.lr"
STANDARD = {
    "net",
    "dataset",
    "optimizer",
    "lr",
    "weight_decay",
    "momentum",
    "lr_scheduler",
    "batch_size",
    "max_epochs",
    "precision",
    "in_memory",
    "channels_last",
    "compile",
    "pruning",
    "pruning_amount",
    "seed",
    "folds",
    "fold",
}


class TrialFile(Callback):
    """Test-only: makes the run a sweep trial as ``python -m project.sweep`` does, by writing its ``trial.json``
    (trial ``number``, swept ``model.optimizer.init_args.lr``) before training."""

    def __init__(self, number: int = 0, lr: float = 0.0) -> None:
        self.number, self.lr = number, lr

    def on_fit_start(self, trainer, pl_module) -> None:
        info = {"sweep": "lr", "run": self.number, "params": {SWEPT: self.lr}, "state": "running"}
        (Path(trainer.log_dir) / "trial.json").write_text(json.dumps(info))


def backend(logdir: Path) -> backend_context.Context:
    """TensorBoard's hparams backend over ``logdir``, as ``tensorboard --logdir`` builds it."""
    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
    return backend_context.Context(base_plugin.TBContext(logdir=str(logdir), data_provider=provider))


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    """``logs`` with 3 fit runs (experiment ``tiny``, seeds 1-3) and 2 trials of a sweep ``lr`` (lr 0.01, 0.03), built
    once for the module (read it, don't change it); each run 2 training steps and 1 validation batch, on
    :func:`make_tiny_mnist` data whose md5 tables are patched only while they train."""
    root = tmp_path_factory.mktemp("hparams_tab")
    logs = root / "logs"
    short = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    with pytest.MonkeyPatch.context() as mp:
        tiny_mnist = make_tiny_mnist(root / "mnist", mp)
        mp.chdir(root)
        for seed in (1, 2, 3):
            assert run_main(tiny_args(tiny_mnist, logs, *short, "--seed_everything", str(seed))) == 0
        for number, lr in enumerate((0.01, 0.03)):
            trial = [
                "--trainer.callbacks+=project.sweep.ReportToStudy",  # in every trial; it adds the trial's columns
                "--trainer.callbacks+=test_hparams_tab.TrialFile",
                "--trainer.callbacks.number",
                str(number),
                "--trainer.callbacks.lr",
                str(lr),
                "--model.optimizer.lr",
                str(lr),
            ]
            assert run_main(tiny_args(tiny_mnist, logs, *short, *trial, name="lr")) == 0
    return logs


@pytest.mark.slow
def test_every_logdir_order_shows_every_runs_columns(logdir):
    ctx, request = backend(logdir), tb_context.RequestContext()
    content = ctx.hparams_metadata(request, "")
    sessions = sorted(run for run, tags in content.items() if metadata.SESSION_START_INFO_TAG in tags)
    assert sessions == [f"{run.parent.name}/{run.name}/{HPARAMS_RUN}" for run in run_dirs(logdir)]
    # no run declares the table for all: an experiment summary of one run would hide the others' columns
    assert not [run for run, tags in content.items() if metadata.EXPERIMENT_TAG in tags]
    metrics = {HP_METRICS[k] for k in HP_METRICS if results(run_dirs(logdir)[0]).get(k) is not None}
    assert {"test/acc", "test/loss", "val/best_acc", "test/params", "test/sparsity"} <= metrics
    runs = list(content)
    for first in range(len(runs)):  # TensorBoard reads runs in no fixed order: try each run first
        order = runs[first:] + runs[:first]
        experiment = ctx.experiment_from_metadata(
            request, "", True, {run: content[run] for run in order}, ctx.hparams_from_data_provider(request, "", 0)
        )
        columns = {h.name: h for h in experiment.hparam_infos}
        assert set(columns) == STANDARD | {"trial", SWEPT}, order
        assert {m.name.tag for m in experiment.metric_infos} == metrics, order
        assert all(m.name.group == "" for m in experiment.metric_infos)
        assert columns["in_memory"].type == api_pb2.DATA_TYPE_BOOL and columns["lr"].type == api_pb2.DATA_TYPE_FLOAT64
        assert columns["trial"].type == columns[SWEPT].type == api_pb2.DATA_TYPE_FLOAT64
        # listed (and ticked) first: what differs among these runs -- the seed, lr, the trial and the swept key
        assert {c for c, h in columns.items() if h.differs} == {"seed", "lr", "trial", SWEPT}, order


@pytest.mark.slow
def test_each_run_is_one_row_with_its_values(logdir):
    ctx, request = backend(logdir), tb_context.RequestContext()
    experiment = get_experiment.Handler(request, ctx, "", api_pb2.GetExperimentRequest()).run()
    names = [h.name for h in experiment.hparam_infos]
    cols = [api_pb2.ColParams(hparam=name) for name in names]
    cols += [api_pb2.ColParams(metric=m.name) for m in experiment.metric_infos]
    query = api_pb2.ListSessionGroupsRequest(
        start_index=0,
        slice_size=100,
        col_params=cols,
        aggregation_type=api_pb2.AGGREGATION_AVG,
        allowed_statuses=[api_pb2.STATUS_SUCCESS, api_pb2.STATUS_UNKNOWN],
    )
    groups = list_session_groups.Handler(request, ctx, "", query).run().session_groups
    rows = {group.sessions[0].name: group for group in groups}
    assert len(rows) == 5
    for run in run_dirs(logdir):
        row, r = rows[f"{run.parent.name}/{run.name}/{HPARAMS_RUN}"], results(run)
        values = {m.name.tag: m.value for m in row.metric_values}
        assert values["test/acc"] == pytest.approx(r["test_acc"]) and values["val/best_acc"] == pytest.approx(
            r["best_val_acc"]
        )
        assert row.hparams["seed"].number_value == r["seed"]
        trial = json.loads((run / "trial.json").read_text()) if (run / "trial.json").is_file() else None
        if trial is None:
            assert "trial" not in row.hparams and SWEPT not in row.hparams
        else:
            assert row.hparams["trial"].number_value == trial["run"]
            assert row.hparams[SWEPT].number_value == row.hparams["lr"].number_value == trial["params"][SWEPT]
