"""The two recipe networks as plain ``nn.Module``s (no Lightning), with configurable widths.

* :class:`SimpleCNN` -- recipe A (CIFAR-10): two 3x3 convolutions and one linear layer.
* :class:`LeNet` -- recipe B (MNIST): LeCun et al. (1998) LeNet-5 style, 20/50 filters, 500 hidden units.

The defaults are the recipes' layers. The widths (conv ``channels``, ``hidden`` linear units) are constructor
arguments so that a structurally pruned ("slimmed") net is rebuilt from plain numbers: each net reports its
current widths with :meth:`widths`, and ``build_net(name, num_classes, widths)`` rebuilds that shape, into which
the slimmed net's ``state_dict`` loads strictly.
"""

from __future__ import annotations

import inspect
import io
from collections.abc import Sequence
from typing import Any, TypeAlias

import torch
from torch import nn


def _widths(value: Sequence[int], n: int, key: str) -> tuple[int, ...]:
    widths = tuple(int(v) for v in value)
    if len(widths) != n or any(w < 1 for w in widths):
        raise ValueError(f"model.widths.{key}: needs {n} positive integer(s), got {list(value)}")
    return widths


class SimpleCNN(nn.Module):
    """Recipe A's CIFAR-10 network: 332,778 parameters for ``num_classes=10`` and the default widths.

    Layers: Conv2d(3->c1, 3x3, pad 1), ReLU, Conv2d(c1->c2, 3x3, pad 1), ReLU, flatten,
    Linear(c2*32*32 -> num_classes), with ``channels=(c1, c2)`` (recipe: 16, 32). There is no pooling, so the
    input size is fixed.

    Shapes:
        input: float tensor (N, 3, 32, 32); output: logits (N, num_classes), same dtype.

    Raises:
        ValueError: ``channels`` is not two positive integers.
    """

    input_shape = (3, 32, 32)

    def __init__(self, num_classes: int = 10, channels: Sequence[int] = (16, 32)) -> None:
        super().__init__()
        c1, c2 = _widths(channels, 2, "channels")
        self.conv1 = nn.Conv2d(3, c1, kernel_size=3, stride=1, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=3, stride=1, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(c2 * 32 * 32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        return self.fc(torch.flatten(x, 1))

    def widths(self) -> dict[str, list[int]]:
        """The current widths, read from the layers: ``{"channels": [c1, c2]}``."""
        return {"channels": [self.conv1.out_channels, self.conv2.out_channels]}


class LeNet(nn.Module):
    """Recipe B's MNIST network: 431,080 parameters for ``num_classes=10`` and the default widths.

    Layers: Conv2d(1->c1, 5x5), ReLU, MaxPool 2x2, Conv2d(c1->c2, 5x5), ReLU, MaxPool 2x2,
    flatten (c2*4*4), Linear(c2*16->h), ReLU, Linear(h->num_classes), with ``channels=(c1, c2)`` (recipe: 20, 50)
    and ``hidden=(h,)`` (recipe: 500).

    ``forward`` applies each ReLU after its max-pool instead of before. The two commute (ReLU is non-decreasing,
    so the max of ReLUs is the ReLU of the max), so outputs and gradients are the recipe's, while the ReLU and its
    backward touch a quarter of the values, (N, 20, 12, 12) instead of (N, 20, 24, 24) after the first
    convolution (the step-time gain is measured in docs/decisions.md).

    Shapes:
        input: float tensor (N, 1, 28, 28); output: logits (N, num_classes), same dtype.

    Raises:
        ValueError: ``channels`` is not two or ``hidden`` not one positive integer.
    """

    input_shape = (1, 28, 28)

    def __init__(
        self, num_classes: int = 10, channels: Sequence[int] = (20, 50), hidden: Sequence[int] = (500,)
    ) -> None:
        super().__init__()
        c1, c2 = _widths(channels, 2, "channels")
        (h,) = _widths(hidden, 1, "hidden")
        self.conv1 = nn.Conv2d(1, c1, kernel_size=5)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=5)
        self.pool = nn.MaxPool2d(2)
        self.relu = nn.ReLU()
        self.fc1 = nn.Linear(c2 * 4 * 4, h)
        self.fc2 = nn.Linear(h, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.pool(self.conv1(x)))  # = pool(relu(conv1(x))), a quarter of the ReLU work
        x = self.relu(self.pool(self.conv2(x)))
        x = self.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)

    def widths(self) -> dict[str, list[int]]:
        """The current widths, read from the layers: ``{"channels": [c1, c2], "hidden": [h]}``."""
        return {"channels": [self.conv1.out_channels, self.conv2.out_channels], "hidden": [self.fc1.out_features]}


#: A recipe net (what :func:`build_net` returns): an ``nn.Module`` with ``input_shape`` and :meth:`widths`.
Net: TypeAlias = SimpleCNN | LeNet

NETS: dict[str, type[Net]] = {"simple_cnn": SimpleCNN, "lenet": LeNet}


def build_net(name: str, num_classes: int = 10, widths: dict[str, Any] | None = None) -> Net:
    """Return a freshly initialised net by name (``"simple_cnn"`` or ``"lenet"``).

    Args:
        widths: layer widths as the net's :meth:`widths` reports them (e.g. LeNet's
            ``{"channels": [14, 35], "hidden": [350]}``); ``None`` or missing keys: the recipe's.

    Raises:
        ValueError: unknown ``name`` (the message lists the known names), an unknown width key for that net, or
            widths that are not positive integers.
    """
    try:
        cls = NETS[name]
    except KeyError:
        raise ValueError(f"model.net: unknown net {name!r}; choose one of {sorted(NETS)}") from None
    widths = dict(widths or {})
    known = sorted(k for k in inspect.signature(cls).parameters if k != "num_classes")
    unknown = sorted(set(widths) - set(known))
    if unknown:
        raise ValueError(f"model.widths: {name} has no width {unknown[0]!r}; its widths are {known}")
    return cls(num_classes=num_classes, **widths)


def macs_per_sample(net_name: str, num_classes: int, widths: dict[str, Any] | None) -> int:
    """Multiply-accumulates of one forward pass for one sample of the net with these widths.

    Counted by ``torch.utils.flop_counter.FlopCounterMode`` (convolutions and matrix products; 1 MAC = 2 FLOPs;
    bias additions, ReLU and pooling are not counted) on a copy built on the ``meta`` device, so it costs no
    compute and works whatever the trained net's device, dtype or compilation. Recipe LeNet: 2,293,000.
    """
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        net = build_net(net_name, num_classes, widths)
        x = torch.zeros(1, *net.input_shape)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        net(x)
    return int(counter.get_total_flops()) // 2


def train_flops_per_sample(net_name: str, num_classes: int, widths: dict[str, Any] | None) -> float:
    """FLOPs of one training step per sample (forward + backward) of the net with these widths.

    Lightning's ``measure_flops`` (``torch.utils.flop_counter``: convolutions and matrix products, 2 FLOPs per
    multiply-accumulate) on a copy built on the ``meta`` device, a batch of 8 with the loss taken as the sum of the
    logits: no compute, no gradients on the trained net. Recipe LeNet: 13,182,000 (about 3x the forward pass,
    less the input gradient of the first layer, which is not needed). Read by the bench and by
    ``ImageClassifier.flops_per_batch``.
    """
    from lightning.fabric.utilities.throughput import measure_flops

    batch = 8
    # callers may be under inference_mode (Lightning's ThroughputMonitor reads flops_per_batch there)
    # (and under anomaly detection, which would read values that meta tensors do not have)
    with torch.inference_mode(False), torch.enable_grad(), torch.autograd.set_detect_anomaly(False):
        with torch.device("meta"):
            net = build_net(net_name, num_classes, widths)
            x = torch.zeros(batch, *net.input_shape)
        return measure_flops(net, lambda: net(x), loss_fn=torch.Tensor.sum) / batch


def count_params(net: nn.Module) -> int:
    """Number of parameter elements (a slimmed net has fewer; zeros from unstructured pruning still count)."""
    return sum(p.numel() for p in net.parameters())


def weights_bytes(net: nn.Module) -> int:
    """Bytes of ``torch.save(net.state_dict())``: the size of the weights alone on disk, uncompressed."""
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}, buffer)
    return buffer.getbuffer().nbytes
