"""A ratio over nothing is undefined, not zero: a class without images has no accuracy (``null`` in evaluate's JSON,
no TensorBoard point), and a confusion matrix of no images has no accuracy in its title."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from project.report import figures

# 3 classes; class 1 has no images: 2 of class 0 right, 1 of class 2 right and 1 wrong (taken for class 0)
CONFUSION = torch.tensor([[2, 0, 0], [0, 0, 0], [1, 0, 1]])


def test_a_class_without_images_has_no_accuracy():
    assert figures.class_accuracies(CONFUSION) == [1.0, None, 0.5]
    assert json.dumps(dict(zip("abc", figures.class_accuracies(CONFUSION)))) == '{"a": 1.0, "b": null, "c": 0.5}'


class Writer:
    def __init__(self):
        self.scalars, self.figures = {}, {}

    def add_scalar(self, tag, value, step):
        self.scalars[tag] = value

    def add_figure(self, tag, figure, step):
        self.figures[tag] = figure.axes[0].get_title()

    def flush(self):
        pass


def test_the_test_report_writes_no_point_for_a_class_without_images(monkeypatch):
    writer = Writer()
    monkeypatch.setattr(figures, "run_writer", lambda trainer: writer)
    trainer = SimpleNamespace(datamodule=SimpleNamespace(classes=["0 - zero", "1 - one", "2 - two"]), global_step=7)
    model = SimpleNamespace(test_confusion=CONFUSION, test_outputs={"wrong": [], "probs": [], "targets": []})
    figures.write_test_report(trainer, model)
    assert writer.scalars == {"test/class_acc/0_-_zero": 1.0, "test/class_acc/2_-_two": 0.5}
    assert writer.figures["test/confusion_matrix"] == "test confusion matrix (acc 0.7500, 4 images)"
    figures.write_test_report(trainer, SimpleNamespace(**{**vars(model), "test_confusion": torch.zeros(3, 3)}))
    assert writer.figures["test/confusion_matrix"] == "test confusion matrix (acc undefined, 0 images)"
