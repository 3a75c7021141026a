"""The two recipe networks as plain ``nn.Module``s (no Lightning), with configurable widths, and your own net.

* :class:`SimpleCNN` -- recipe A (CIFAR-10): two 3x3 convolutions and one linear layer.
* :class:`LeNet` -- recipe B (MNIST): LeCun et al. (1998) LeNet-5 style, 20/50 filters, 500 hidden units.
* any ``torch.nn.Module`` class by class path (``model.net: {class_path: mypkg.MyNet, init_args: {...}}``):
  :func:`build_net` calls it with the number of classes as its first argument; :func:`net_class` resolves the
  class among modules already imported (by the config parser, under its allow-list, or by you), never imports one.

The defaults are the recipes' layers. The widths (conv ``channels``, ``hidden`` linear units) are constructor
arguments so that a structurally pruned ("slimmed") net is rebuilt from plain numbers: each net reports its
current widths with :meth:`widths`, and ``build_net(name, num_classes, widths)`` rebuilds that shape, into which
the slimmed net's ``state_dict`` loads strictly.
"""

from __future__ import annotations

import functools
import inspect
import io
import sys
from collections.abc import Callable, Sequence
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


#: A recipe net: an ``nn.Module`` with ``input_shape`` and :meth:`widths`.
Net: TypeAlias = SimpleCNN | LeNet

NETS: dict[str, type[Net]] = {"simple_cnn": SimpleCNN, "lenet": LeNet}

#: ``model.net`` as plain data (hyper-parameters, checkpoints, ``results.json``): a recipe net's name, or
#: ``{"class_path": "mypkg.MyNet", "init_args": {...}}`` for your own ``nn.Module`` class.
NetSpec: TypeAlias = str | dict[str, Any]


def net_spec(net: Any) -> NetSpec:
    """``model.net`` as plain data: a name as it is; a ``{class_path, init_args}`` mapping checked; an
    ``nn.Module`` class, or jsonargparse's ``functools.partial`` of one with its init args (what a
    ``Callable[[int], nn.Module]`` argument parses to), as that mapping.

    Raises:
        ValueError: anything else (the message says what ``model.net`` takes).
    """
    if isinstance(net, str):
        return net
    if isinstance(net, functools.partial):
        cls = next((a for a in net.args if isinstance(a, type)), net.func)
        return {"class_path": _class_path(cls), "init_args": dict(net.keywords)}
    if isinstance(net, type) and issubclass(net, nn.Module):
        return {"class_path": _class_path(net), "init_args": {}}
    if (
        isinstance(net, dict)
        and isinstance(net.get("class_path"), str)
        and isinstance(net.get("init_args", {}), dict)
        and set(net) <= {"class_path", "init_args"}
    ):
        return {"class_path": net["class_path"], "init_args": dict(net.get("init_args") or {})}
    raise ValueError(
        f"model.net: {net!r} is neither {' nor '.join(sorted(NETS))} nor a torch.nn.Module class "
        "({class_path: mypkg.MyNet, init_args: {...}})"
    )


def _class_path(cls: Any) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def net_class(class_path: str) -> type[nn.Module]:
    """The ``nn.Module`` class at ``class_path``, looked up among modules already imported; nothing is imported.

    A net's class path read back from a checkpoint or a run folder is data from elsewhere: importing it would run
    its module's code. So the import is left to whoever may do it: the config parser (your command line and
    config files; a run folder's config only for a package you trust, ``docs/security.md``) or your own
    ``import`` before ``ImageClassifier.load_from_checkpoint``.

    Raises:
        ValueError: the module is not imported, has no such class, or it is not an ``nn.Module`` class.
    """
    parts = class_path.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest imported module prefix; the rest is the class's qualname
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            obj: Any = module
            for name in parts[cut:]:
                obj = getattr(obj, name, None)
            if isinstance(obj, type) and issubclass(obj, nn.Module):
                return obj
            raise ValueError(f"model.net: {class_path} is not a torch.nn.Module class")
    raise ValueError(
        f"model.net: {class_path} is not imported, and a net read back from a file is never imported for you "
        "(it would run that module's code): import it yourself first, or name it in a config you trust"
    )


def net_name(net: NetSpec) -> str:
    """How messages name a net: a recipe net's name, or your class's path."""
    return net if isinstance(net, str) else str(net.get("class_path"))


def is_recipe_net(net: Any) -> bool:
    """Whether ``net`` names one of the recipe nets (:data:`NETS`), which have widths and a fixed input shape."""
    return isinstance(net, str)


def build_net(net: NetSpec, num_classes: int = 10, widths: dict[str, Any] | None = None) -> nn.Module:
    """Return a freshly initialised net: a recipe net by name (``"simple_cnn"`` or ``"lenet"``), or your own class
    (``{"class_path", "init_args"}``, resolved by :func:`net_class`) called as ``cls(num_classes, **init_args)``.

    Args:
        widths: a recipe net's layer widths as its :meth:`widths` reports them (e.g. LeNet's
            ``{"channels": [14, 35], "hidden": [350]}``); ``None`` or missing keys: the recipe's. Your own net has
            none (its init args set its shape).

    Raises:
        ValueError: unknown ``name`` (the message lists the known names), an unknown width key for that net,
            widths that are not positive integers, widths for your own net, or your class refused its arguments.
    """
    spec = net_spec(net)
    if isinstance(spec, dict):
        if widths:
            raise ValueError(
                f"model.widths: only {' and '.join(sorted(NETS))} have widths; {spec['class_path']} takes its shape "
                "from its init_args"
            )
        cls = net_class(spec["class_path"])
        try:
            return cls(num_classes, **spec["init_args"])
        except TypeError as e:
            raise ValueError(
                f"model.net: {spec['class_path']}({num_classes}, **init_args) failed ({e}); its first argument "
                "must take the number of classes"
            ) from None
    try:
        recipe = NETS[spec]
    except KeyError:
        raise ValueError(
            f"model.net: unknown net {spec!r}; choose one of {sorted(NETS)} or a class path "
            "({class_path: mypkg.MyNet, init_args: {...}})"
        ) from None
    widths = dict(widths or {})
    known = sorted(k for k in inspect.signature(recipe).parameters if k != "num_classes")
    unknown = sorted(set(widths) - set(known))
    if unknown:
        raise ValueError(f"model.widths: {spec} has no width {unknown[0]!r}; its widths are {known}")
    return recipe(num_classes=num_classes, **widths)


def widths_of(net: nn.Module) -> dict[str, list[int]] | None:
    """A recipe net's current layer widths (:meth:`LeNet.widths`, :meth:`SimpleCNN.widths`); None for your own."""
    return net.widths() if isinstance(net, SimpleCNN | LeNet) else None


def net_input_shape(net: NetSpec, input_shape: Sequence[int] | None = None) -> tuple[int, int, int]:
    """The (C, H, W) images ``net`` is fed: a recipe net's own, else ``input_shape`` (the data's).

    Raises:
        ValueError: your own net without ``input_shape``.
    """
    if is_recipe_net(net) and net in NETS:
        return tuple(NETS[str(net)].input_shape)  # type: ignore[return-value]
    if input_shape is None:
        raise ValueError("model.input_shape: your own net needs the (C, H, W) of its images (the CLI links the data's)")
    c, h, w = (int(v) for v in input_shape)
    return c, h, w


def _measure(
    net: NetSpec,
    num_classes: int,
    widths: dict[str, Any] | None,
    input_shape: Sequence[int] | None,
    batch: int,
    fn: Callable[[nn.Module, torch.Tensor], Any],
) -> Any:
    shape = net_input_shape(net, input_shape)
    try:
        with torch.device("meta"):
            copy = build_net(net, num_classes, widths)
            x = torch.zeros(batch, *shape)
        return fn(copy, x)
    except (NotImplementedError, RuntimeError) as e:  # your own net's code may need real values
        if is_recipe_net(net) or "meta" not in str(e).lower():
            raise
    with torch.random.fork_rng(devices=[]):
        copy = build_net(net, num_classes, widths)
        return fn(copy.eval(), torch.zeros(batch, *shape))


def check_logits(net: NetSpec, num_classes: int, input_shape: Sequence[int]) -> None:
    """Check that your own net maps (N, C, H, W) images of ``input_shape`` to (N, num_classes) logits, on a copy on
    the ``meta`` device (no memory, no compute).

    Raises:
        ValueError: its forward fails on such a batch, or gives another shape (the message names both).
    """
    shape = "x".join(map(str, input_shape))
    try:
        with torch.no_grad():
            out = _measure(net, num_classes, None, input_shape, 2, lambda m, x: m(x))
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 -- the user's forward: any failure is a config error, said in one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"model.net: {net_name(net)} fails on {shape} images from the data ({first})") from None
    got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if got != (2, num_classes):
        raise ValueError(
            f"model.net: {net_name(net)} maps 2 images of {shape} to {got}, not logits "
            f"(2, {num_classes}) (N, num_classes); its first argument must set the number of outputs"
        )


def macs_per_sample(
    net: NetSpec, num_classes: int, widths: dict[str, Any] | None, input_shape: Sequence[int] | None = None
) -> int:
    """Multiply-accumulates of one forward pass for one sample of the net with these widths.

    Counted by ``torch.utils.flop_counter.FlopCounterMode`` (convolutions and matrix products; 1 MAC = 2 FLOPs;
    bias additions, ReLU and pooling are not counted) on a copy built on the ``meta`` device, so it costs no
    compute and works whatever the trained net's device, dtype or compilation. Recipe LeNet: 2,293,000. Your own
    net is fed images of ``input_shape`` (C, H, W); one whose code cannot run on ``meta`` is counted on a CPU copy.
    """
    from torch.utils.flop_counter import FlopCounterMode

    def count(copy: nn.Module, x: torch.Tensor) -> int:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            copy(x)
        return int(counter.get_total_flops()) // 2

    return int(_measure(net, num_classes, widths, input_shape, 1, count))


def train_flops_per_sample(
    net: NetSpec, num_classes: int, widths: dict[str, Any] | None, input_shape: Sequence[int] | None = None
) -> float:
    """FLOPs of one training step per sample (forward + backward) of the net with these widths.

    Lightning's ``measure_flops`` (``torch.utils.flop_counter``: convolutions and matrix products, 2 FLOPs per
    multiply-accumulate) on a copy built on the ``meta`` device, a batch of 8 with the loss taken as the sum of the
    logits: no compute, no gradients on the trained net. Recipe LeNet: 13,182,000 (about 3x the forward pass,
    less the input gradient of the first layer, which is not needed). Read by the bench and by
    ``ImageClassifier.flops_per_batch``. ``input_shape`` as for :func:`macs_per_sample`.
    """
    from lightning.fabric.utilities.throughput import measure_flops

    batch = 8
    # callers may be under inference_mode (Lightning's ThroughputMonitor reads flops_per_batch there)
    # (and under anomaly detection, which would read values that meta tensors do not have)
    with torch.inference_mode(False), torch.enable_grad(), torch.autograd.set_detect_anomaly(False):
        flops = _measure(
            net,
            num_classes,
            widths,
            input_shape,
            batch,
            lambda copy, x: measure_flops(copy, lambda: copy(x), loss_fn=torch.Tensor.sum),
        )
    return float(flops) / batch


def count_params(net: nn.Module) -> int:
    """Number of parameter elements (a slimmed net has fewer; zeros from unstructured pruning still count)."""
    return sum(p.numel() for p in net.parameters())


def weights_bytes(net: nn.Module) -> int:
    """Bytes of ``torch.save(net.state_dict())``: the size of the weights alone on disk, uncompressed."""
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}, buffer)
    return buffer.getbuffer().nbytes
