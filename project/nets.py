"""The two recipe networks as plain ``nn.Module``s (no Lightning).

* :class:`SimpleCNN` -- recipe A (CIFAR-10): two 3x3 convolutions and one linear layer.
* :class:`LeNet` -- recipe B (MNIST): LeCun et al. (1998) LeNet-5 style, 20/50 filters, 500 hidden units.
"""

from __future__ import annotations

import torch
from torch import nn


class SimpleCNN(nn.Module):
    """Recipe A's CIFAR-10 network: 332,778 parameters for ``num_classes=10``.

    Layers: Conv2d(3->16, 3x3, pad 1), ReLU, Conv2d(16->32, 3x3, pad 1), ReLU, flatten,
    Linear(32*32*32 -> num_classes). There is no pooling, so the input size is fixed.

    Shapes:
        input: float tensor (N, 3, 32, 32); output: logits (N, num_classes), same dtype.
    """

    input_shape = (3, 32, 32)

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, stride=1, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, stride=1, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(32 * 32 * 32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        return self.fc(torch.flatten(x, 1))


class LeNet(nn.Module):
    """Recipe B's MNIST network: 431,080 parameters for ``num_classes=10``.

    Layers: Conv2d(1->20, 5x5), ReLU, MaxPool 2x2, Conv2d(20->50, 5x5), ReLU, MaxPool 2x2,
    flatten (50*4*4 = 800), Linear(800->500), ReLU, Linear(500->num_classes).

    Shapes:
        input: float tensor (N, 1, 28, 28); output: logits (N, num_classes), same dtype.
    """

    input_shape = (1, 28, 28)

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, kernel_size=5)
        self.conv2 = nn.Conv2d(20, 50, kernel_size=5)
        self.pool = nn.MaxPool2d(2)
        self.relu = nn.ReLU()
        self.fc1 = nn.Linear(800, 500)
        self.fc2 = nn.Linear(500, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        x = self.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


NETS: dict[str, type[nn.Module]] = {"simple_cnn": SimpleCNN, "lenet": LeNet}


def build_net(name: str, num_classes: int = 10) -> nn.Module:
    """Return a freshly initialised net by name (``"simple_cnn"`` or ``"lenet"``).

    Raises:
        ValueError: unknown ``name``; the message lists the known names.
    """
    try:
        return NETS[name](num_classes=num_classes)
    except KeyError:
        raise ValueError(f"model.net: unknown net {name!r}; choose one of {sorted(NETS)}") from None
