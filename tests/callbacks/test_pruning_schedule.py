"""One schedule base for both pruning callbacks (``project.callbacks.ScheduledPruning``): the unstructured
``Pruning`` and the structured ``StructuredPruning`` compute, check, key, warn and refuse a resume the same way."""

from __future__ import annotations

import warnings

import lightning as L
import pytest

from project.callbacks.pruning import Pruning, ScheduledPruning
from project.callbacks.slim import StructuredPruning
from project.errors import ConfigError
from project.module import ImageClassifier

KINDS = [Pruning, StructuredPruning]
SHARED = ["target_at", "init_schedule", "warn_if_cut_short", "check_resume", "number_copies", "state_key"]


@pytest.mark.parametrize(
    "settings",
    [
        {"amount": 0.6, "start_epoch": 1, "end_epoch": 3},
        {"amount": 0.32, "start_epoch": 1},
        {"amount": 0.5, "start_epoch": 0, "end_epoch": 4},
        {"amount": 0.0, "start_epoch": 2, "end_epoch": 2},
    ],
)
def test_both_callbacks_ask_for_the_same_fraction_at_every_epoch(settings):
    unstructured, structured = Pruning(**settings), StructuredPruning(**settings)
    fractions = [unstructured.target_at(e) for e in range(7)]
    assert fractions == [structured.target_at(e) for e in range(7)]
    assert fractions[-1] == pytest.approx(settings["amount"])
    assert fractions[: settings["start_epoch"]] == [0.0] * settings["start_epoch"]
    assert unstructured.target == structured.target == structured.amount == settings["amount"]


def test_the_schedule_is_implemented_once():
    for kind in KINDS:
        assert issubclass(kind, ScheduledPruning)
        assert [name for name in SHARED if name in vars(kind)] == [], kind.__name__


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"amount": 1.0}, "amount: must be in [0, 1), got 1.0"),
        ({"amount": -0.1}, "amount: must be in [0, 1), got -0.1"),
        ({"start_epoch": 3, "end_epoch": 1}, "end_epoch: (1) must be >= start_epoch (3)"),
    ],
)
def test_both_refuse_a_bad_schedule_with_the_same_message(settings, problem):
    for kind, label in ((Pruning, "pruning"), (StructuredPruning, "structured pruning")):
        with pytest.raises(ConfigError) as error:
            kind(**settings)
        assert str(error.value) == f"{label} {problem}"


def test_the_short_run_warning_comes_from_one_place(monkeypatch):
    calls = []
    monkeypatch.setattr(ScheduledPruning, "warn_if_cut_short", lambda cb, epochs: calls.append((cb, epochs)))
    for kind in KINDS:
        cb = kind(amount=0.6, start_epoch=1, end_epoch=3)
        trainer = L.Trainer(max_epochs=2, callbacks=[cb], logger=False, enable_checkpointing=False)
        cb.setup(trainer, ImageClassifier(), "fit")
        cb.setup(trainer, ImageClassifier(), "validate")  # warns at fit only
        assert calls == [(cb, 2)]
        calls.clear()


def test_the_short_run_warning_says_what_each_kind_reaches():
    expected = {
        Pruning: "pruning runs to epoch 3 but max_epochs is 2: sparsity will reach 0.20, not 0.60",
        StructuredPruning: "structured pruning runs to epoch 3 but max_epochs is 2: 0.20 of the channels will be "
        "removed (amount 0.60)",
    }
    for kind, reached in expected.items():
        cb = kind(amount=0.6, start_epoch=1, end_epoch=3)
        with pytest.warns(UserWarning) as caught:
            cb.warn_if_cut_short(2)
        assert [str(w.message) for w in caught] == [
            f"{reached}. Lower start_epoch/end_epoch or raise trainer.max_epochs to 4 or more"
        ]
        with warnings.catch_warnings(record=True) as quiet:
            warnings.simplefilter("always")
            for enough in (4, 10, None, -1):
                cb.warn_if_cut_short(enough)
        assert quiet == []


@pytest.mark.parametrize("kind", KINDS)
def test_both_refuse_to_resume_under_another_schedule(kind):
    saved = kind(amount=0.3, start_epoch=0, end_epoch=1)
    states = {saved.state_key: saved.state_dict() | {"schedule": saved.schedule()}}
    ScheduledPruning.check_resume([kind(amount=0.3, start_epoch=0, end_epoch=1)], states)  # same schedule: fine
    changed = kind(amount=0.4, start_epoch=0, end_epoch=1)
    with pytest.raises(ConfigError) as error:
        ScheduledPruning.check_resume([changed], states)
    assert str(error.value) == (
        f"ckpt_path: the checkpoint was pruned on the schedule {saved.schedule()}, the config asks for "
        f"{changed.schedule()}; resume with the run's pruning settings"
    )
    # the same through the name the CLI uses, and a hostile state (not a dict) is no traceback
    with pytest.raises(ConfigError, match="the checkpoint was pruned on the schedule"):
        Pruning.check_resume([changed], {**states, "Pruning{'junk'}": "not a dict", 3: None})


def test_only_a_slimmed_checkpoint_needs_its_callback_to_resume():
    slimmed = StructuredPruning(amount=0.3)
    with pytest.raises(ConfigError) as error:
        ScheduledPruning.check_resume([], {slimmed.state_key: {"schedule": slimmed.schedule()}})
    assert str(error.value) == (
        f"ckpt_path: the checkpoint was slimmed by structured pruning on the schedule {slimmed.schedule()} and the "
        "config has none; resume with the run's settings (e.g. --config configs/slim.yaml)"
    )
    masked = Pruning(amount=0.3)  # masks only: the plain net continues without them
    ScheduledPruning.check_resume([], {masked.state_key: {"schedule": masked.schedule(), "masks": {}}})


def test_identical_copies_of_either_kind_get_their_own_state_key():
    callbacks = [StructuredPruning(amount=0.2), Pruning(amount=0.2), StructuredPruning(amount=0.2), Pruning(amount=0.2)]
    Pruning.number_copies(callbacks)  # the name the CLI calls numbers every kind
    assert [cb.copy for cb in callbacks] == [0, 0, 1, 1]
    assert len({cb.state_key for cb in callbacks}) == 4
    assert callbacks[0].state_key == callbacks[0].settings_key() and "'copy': 1" in callbacks[2].state_key
