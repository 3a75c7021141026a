"""The confusion-matrix figure stays readable (and quick to draw) at any number of classes."""

from __future__ import annotations

import pytest
import torch

from project.report.figures import CELL_TEXT_MAX, confusion_figure


@pytest.mark.parametrize(("classes", "cells", "named"), [(10, 100, 10), (CELL_TEXT_MAX, 400, 20), (100, 0, 20)])
def test_counts_in_cells_up_to_20_classes_and_about_20_names_on_each_axis(classes, cells, named):
    """10 classes: each of the 100 cells prints its count, every class named; CIFAR-100: shaded cells only (10,000
    numbers are unreadable at the card's size and took about 12 s to draw), every 5th class named."""
    counts = torch.arange(classes * classes).view(classes, classes)
    labels = [f"class {i}" for i in range(classes)]
    ax = confusion_figure(counts, labels).axes[0]
    assert len(ax.texts) == cells
    if cells:
        assert ax.texts[1].get_text() == str(int(counts[0, 1]))
    step = classes // named
    assert [t.get_text() for t in ax.get_xticklabels()] == labels[::step]
    assert [t.get_text() for t in ax.get_yticklabels()] == labels[::step]
    assert ax.get_title().endswith(f"{int(counts.sum())} images)")
