"""``python -m benchmarks.recipe_loop``: recipe B as the classic PyTorch tutorial writes it, no Lightning.

The loop of PyTorch's "Training a classifier" tutorial (``zero_grad``, forward, loss, ``backward``,
``step``; the running loss printed every ``--print_every`` batches; then the accuracy over the test set
under ``torch.no_grad()``) with recipe B's parts: ``project.nets.LeNet``, a torchvision MNIST or
Fashion-MNIST dataset with ``Compose([ToTensor(), Normalize(mean, std)])`` (the mean/std of
``project.data``), ``DataLoader(batch_size=64, shuffle=True)`` and ``SGD(lr=0.01, momentum=0.9)``::

    python -m benchmarks.recipe_loop --dataset fashion_mnist --data_dir data --epochs 2

It reads data already extracted in torchvision's layout (``<data_dir>/FashionMNIST/raw/*-ubyte``, as
``project.data``'s ``prepare_data`` leaves it) and never downloads. The last line printed is
``RESULT {json}``; ``python -m benchmarks.bench_e2e`` times this command against ``python -m project.fit``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn, optim
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from project.errors import ArgumentParser, DataError
from project.nets import LeNet

# torchvision class and Normalize (mean, std) per --dataset: the values of project.data's MNISTDataModule and
# FashionMNISTDataModule (tests/test_bench_e2e.py checks they agree). Not imported from there: project.data
# imports Lightning, which would add its import time (about 2 s on a 2-core CPU) to this loop's wall time.
DATASETS: dict[str, tuple[type[datasets.MNIST], tuple[float, ...], tuple[float, ...]]] = {
    "mnist": (datasets.MNIST, (0.1307,), (0.3081,)),
    "fashion_mnist": (datasets.FashionMNIST, (0.2860,), (0.3530,)),
}
IDX_FILES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


def check_data(data_dir: str, dataset: str) -> None:
    """Check that ``data_dir`` holds the four extracted IDX files of ``dataset`` in torchvision's layout.

    Raises:
        DataError: naming the first missing file and how to extract the data.
    """
    name = DATASETS[dataset][0].__name__
    for file in IDX_FILES:
        path = Path(data_dir, name, "raw", file)
        if not path.is_file():
            raise DataError(
                f"{path} not found: --data_dir must hold {name} extracted in torchvision's layout "
                f"({data_dir}/{name}/raw/*-ubyte); extract it with project.data's prepare_data, e.g. "
                f"python -m benchmarks.bench_e2e --source_dir DIR_WITH_THE_ARCHIVES"
            )


def loaders(data_dir: str, dataset: str, batch_size: int, num_workers: int) -> tuple[DataLoader, DataLoader]:
    """The tutorial's two loaders: shuffled training batches and the official test set in order.

    Raises:
        DataError: a file that does not parse (torchvision checks each file's length against its header).

    Returns:
        ``(train, test)``; each yields ``(x, y)``: x float32 (B, 1, 28, 28) normalized, y int64 (B,).
    """
    cls, mean, std = DATASETS[dataset]
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])
    try:
        train_set = cls(root=data_dir, train=True, download=False, transform=transform)
        test_set = cls(root=data_dir, train=False, download=False, transform=transform)
    except Exception as e:  # present but unreadable, e.g. truncated
        raise DataError(f"could not load {cls.__name__} from {data_dir}: {e}; extract it again") from None
    train = DataLoader(train_set, batch_size=batch_size, shuffle=True, num_workers=num_workers)
    test = DataLoader(test_set, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    return train, test


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(
    net: nn.Module,
    loader: DataLoader,
    epochs: int,
    lr: float,
    momentum: float,
    device: torch.device,
    limit_batches: int | None = None,
    print_every: int = 200,
) -> dict[str, float]:
    """The tutorial's training loop: SGD with momentum on cross-entropy, running loss every ``print_every`` batches.

    Args:
        limit_batches: stop each epoch after this many batches (``None``: the whole training set).

    Returns:
        ``train_time_s`` (seconds for all epochs, data loading included, device synchronized), ``steps``
        (optimizer steps) and ``train_start_unix`` (``time.time()`` just before the first epoch).
    """
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    net.train()
    steps = 0
    start_unix = time.time()
    t0 = time.perf_counter()
    for epoch in range(epochs):
        running_loss = 0.0
        for i, (inputs, labels) in enumerate(loader):
            if limit_batches is not None and i >= limit_batches:
                break
            inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad()
            outputs = net(inputs)
            loss = criterion(outputs, labels)
            loss.backward()
            optimizer.step()
            steps += 1
            running_loss += loss.item()
            if i % print_every == print_every - 1:
                print(f"[{epoch + 1}, {i + 1:5d}] loss: {running_loss / print_every:.3f}", flush=True)
                running_loss = 0.0
    _sync(device)
    return {"train_time_s": time.perf_counter() - t0, "steps": steps, "train_start_unix": start_unix}


@torch.no_grad()
def test_accuracy(net: nn.Module, loader: DataLoader, device: torch.device) -> tuple[float, int]:
    """The tutorial's test pass: the fraction (0-1) of test images whose arg-max logit is the label, and their count."""
    net.eval()
    correct = total = 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        predicted = net(images).argmax(1)
        total += labels.size(0)
        correct += (predicted == labels).sum().item()
    return correct / total, total


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m benchmarks.recipe_loop", description=__doc__.splitlines()[0])
    p.add_argument("--data_dir", default="data", help="extracted data in torchvision's layout")
    p.add_argument("--dataset", choices=sorted(DATASETS), default="mnist")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=42, help="torch.manual_seed: initial weights and shuffling")
    p.add_argument("--limit_train_batches", type=int, default=None, help="batches per epoch (default: all)")
    p.add_argument("--num_workers", type=int, default=0, help="DataLoader workers (the tutorial's 0 here)")
    p.add_argument("--print_every", type=int, default=200, help="batches between running-loss lines")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda when available")
    args = p.parse_args(argv)
    for key in ("epochs", "batch_size", "print_every", "limit_train_batches"):
        value = getattr(args, key)
        if value is not None and value < 1:
            p.error(f"--{key} must be >= 1, got {value}")
    if args.num_workers < 0:
        p.error(f"--num_workers must be >= 0, got {args.num_workers}")
    if args.lr <= 0:
        p.error(f"--lr must be > 0, got {args.lr}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available; use --device cpu or auto")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train and test as the tutorial does; returns the ``RESULT`` dict (accuracy 0-1, times in seconds).

    Raises:
        DataError: the data is not extracted under ``args.data_dir`` or a file is truncated.
    """
    check_data(args.data_dir, args.dataset)
    torch.manual_seed(args.seed)
    want_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if want_cuda else "cpu")
    train_loader, test_loader = loaders(args.data_dir, args.dataset, args.batch_size, args.num_workers)
    net = LeNet().to(device)
    stats = train(
        net, train_loader, args.epochs, args.lr, args.momentum, device, args.limit_train_batches, args.print_every
    )
    t0 = time.perf_counter()
    acc, n = test_accuracy(net, test_loader, device)
    _sync(device)
    return {
        "test_acc": acc,
        "train_time_s": stats["train_time_s"],
        "epochs": args.epochs,
        "steps": stats["steps"],
        "test_time_s": time.perf_counter() - t0,
        "test_samples": n,
        "train_start_unix": stats["train_start_unix"],
        "device": device.type,
        "dataset": args.dataset,
        "batch_size": args.batch_size,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.recipe_loop``; returns the exit status (0 ok, 1 bad data)."""
    args = parse_args(argv)
    try:
        result = run(args)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"Accuracy of the network on the {result['test_samples']} test images: {100 * result['test_acc']:.2f} %")
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
