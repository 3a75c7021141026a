"""Structured pruning that pays: whole channels and neurons removed, the net physically slimmed.

Unstructured pruning (:class:`project.callbacks.Pruning`) zeroes single weights: the dense kernels do the same
work, so it buys no speed. :class:`StructuredPruning` removes whole conv channels and hidden linear neurons
instead, and with them the matching input slices of the layers that read them (conv2's input channels, fc1's
input columns behind the flatten, ...). What is left is a smaller dense net, faster on any hardware. The
dependency handling is Torch-Pruning's (Fang et al., "DepGraph: Towards Any Structural Pruning", CVPR 2023;
``torch-pruning`` on PyPI): its ``DependencyGraph`` finds the coupled layers, its ``MetaPruner`` ranks and cuts.

* :func:`macs_per_sample`, :func:`train_flops_per_sample`, :func:`count_params`, :func:`weights_bytes` -- what a
  net costs;
* :func:`slim` -- one pruning step on a plain ``nn.Module``;
* :class:`StructuredPruning` -- the Lightning callback: a schedule over epochs (the one
  :class:`project.callbacks.ScheduledPruning` gives both pruning callbacks), resumable, optimizers rebuilt.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Literal, cast

import lightning as L
import torch
from jsonargparse.typing import NonNegativeInt
from lightning.fabric.utilities.data import AttributeDict
from torch import nn

from project.callbacks.pruning import LAYER_TYPES, Pruning, PruningAmount, ScheduledPruning
from project.errors import ConfigError, require
from project.nets import NETS, Net, count_params, is_recipe_net, macs_per_sample, net_name

log = logging.getLogger(__name__)


def output_layer(net: nn.Module) -> nn.Module:
    """The classifier layer (the net's last ``nn.Linear``): never pruned, so the logits keep their classes."""
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ConfigError(f"structured pruning: {type(net).__name__} has no nn.Linear output layer")
    return linears[-1]


def prunable_layers(net: nn.Module, layer_types: tuple[type[nn.Module], ...]) -> dict[str, nn.Module]:
    """``{name: layer}`` whose output channels/neurons may be removed: ``layer_types``, minus the output layer."""
    out = output_layer(net)
    return {name: m for name, m in net.named_modules() if isinstance(m, layer_types) and m is not out}


def width_of(layer: nn.Module) -> int:
    """Output channels of a conv, output features of a linear layer."""
    return int(layer.out_channels if isinstance(layer, nn.Conv2d) else cast(nn.Linear, layer).out_features)


def kept(initial: int, amount: float) -> int:
    """Channels left when ``amount`` of ``initial`` are removed: ``floor(initial * (1 - amount))``, at least 1.

    The floor is Torch-Pruning's own rounding (``MetaPruner``); the 1e-9 keeps 100 * (1 - 0.29) at 71, not 70.
    """
    return max(1, math.floor(initial * (1 - amount) + 1e-9))


def slim(
    net: Net,
    keep: dict[str, int] | int,
    norm: int = 1,
    layer_types: tuple[type[nn.Module], ...] = (nn.Conv2d, nn.Linear),
) -> dict[str, int]:
    """Remove the least important output channels/neurons of ``net``'s prunable layers, in place.

    Args:
        net: a plain net with ``input_shape`` (see :mod:`project.nets`); its layers are narrowed in place
            (new, smaller ``weight``/``bias`` parameters on the same modules) and every dependent layer follows.
        keep: ``{layer name: channels to keep}`` to rank within each layer, or one ``int``: channels to keep in
            all prunable layers together (global ranking). Layers already at or below their number are left alone.
        norm: ``p`` of the Lp norm a channel is ranked by: Torch-Pruning's ``GroupMagnitudeImportance`` -- the
            norm of the weights removed with the channel (its filter, and the next layer's input slice; biases
            are not counted), averaged over the coupled layers and divided by the group's mean (which matters
            only for global ranking).
        layer_types: whose outputs may be removed (the output layer never is).

    Returns:
        ``{layer name: width}`` of the prunable layers after the step. Torch-Pruning skips a cut that would
        leave a layer with no channel (``DependencyGraph.check_pruning_group``), so with global ranking the total
        can stay above ``keep``.
    """
    import torch_pruning as tp

    layers = prunable_layers(net, layer_types)
    param = next(net.parameters())
    example = torch.zeros(1, *net.input_shape, device=param.device, dtype=param.dtype)
    importance = tp.importance.GroupMagnitudeImportance(p=norm)
    common: dict[str, Any] = {
        "importance": importance,
        "ignored_layers": [output_layer(net)],
        "root_module_types": list(layer_types),
    }
    kwargs: dict[str, Any]
    # MetaPruner keeps floor(current * (1 - ratio)) channels; asking for keep + 0.5 makes that exactly `keep`.
    if isinstance(keep, int):
        current = sum(width_of(m) for m in layers.values())
        if keep >= current:
            return {name: width_of(m) for name, m in layers.items()}
        kwargs = {"global_pruning": True, "pruning_ratio": 1 - (keep + 0.5) / current}
    else:
        ratios = {m: 1 - (keep[name] + 0.5) / width_of(m) for name, m in layers.items() if keep[name] < width_of(m)}
        if not ratios:
            return {name: width_of(m) for name, m in layers.items()}
        kwargs = {"global_pruning": False, "pruning_ratio": 0.0, "pruning_ratio_dict": ratios}
    with torch.enable_grad():  # the dependency graph is traced from the autograd graph of one forward pass
        tp.pruner.MetaPruner(net, example, **common, **kwargs).step()
    return {name: width_of(m) for name, m in layers.items()}


def rebuild_optimizers(trainer: L.Trainer) -> None:
    """Build the optimizers and LR schedulers again over the module's current parameters, keeping the schedule.

    After slimming, the optimizer holds the old (removed) parameter tensors. ``configure_optimizers`` runs again
    (Lightning's ``strategy.setup_optimizers``); each new param group then takes the old group's settings (the
    current ``lr``, momentum/betas a cyclic schedule set, ``initial_lr``, ...) and each scheduler the old one's
    state (its step count), so the learning-rate schedule continues where it was. The per-parameter state
    (momentum buffers, Adam moments) starts afresh: it belonged to tensors that no longer exist.
    """
    groups = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] for opt in trainer.optimizers]
    schedulers = [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs]
    trainer.strategy.setup_optimizers(trainer)
    for opt, saved in zip(trainer.optimizers, groups):
        for group, old in zip(opt.param_groups, saved):
            group.update(old)
    for config, state in zip(trainer.lr_scheduler_configs, schedulers):
        config.scheduler.load_state_dict(state)


class StructuredPruning(ScheduledPruning):
    """Structured (channel/neuron) pruning on a schedule, physically slimming the net; resumable.

    The schedule is :class:`~project.callbacks.ScheduledPruning`'s: at the **start** of each epoch from
    ``start_epoch`` to ``end_epoch`` (default: ``start_epoch`` only) the removed fraction grows linearly to
    ``amount``: each prunable layer keeps ``floor(n0 * (1 - fraction))`` of
    its ``n0`` recipe channels (``global_pruning: false``), or all prunable layers together keep that fraction of
    their total, ranked against each other (``global_pruning: true``). Channels are ranked by the L1 or L2
    norm of their weights (see :func:`slim`). Each step comes at the start of its epoch, so epoch ``end_epoch`` and
    the ones after it fine-tune the fully slimmed net: ``max_epochs - end_epoch`` epochs (one for
    ``configs/slim.yaml``, ``start_epoch: 1``, with the shipped configs' ``max_epochs: 2``); a run too short to
    reach ``end_epoch`` warns.

    Prunable: the nets' conv layers (``"Conv2d"``) and hidden linear layers (``"Linear"``), never the output
    layer. After each step the optimizers are rebuilt (:func:`rebuild_optimizers`), the module's ``widths``
    hyper-parameter records the new layer widths, so every checkpoint holds plain weights of the slimmed shape
    and the widths to rebuild it (``ImageClassifier.on_load_checkpoint``): resume, ``evaluate``, ``predict`` and
    ``load_from_checkpoint`` need not know the net was pruned.

    Logged each epoch: ``slim/params``, ``slim/macs_per_sample`` and ``slim/width/<layer>``.

    Args:
        amount: final fraction of channels/neurons removed, in [0, 1).
        norm: 1 or 2, the Lp norm channels are ranked by.
        global_pruning: rank all prunable layers' channels together instead of within each layer.
        start_epoch, end_epoch: the epochs at whose start a pruning step happens.
        layers: which layer types lose outputs: ``["Conv2d", "Linear"]`` (default) or one of them.

    Raises:
        ConfigError: ``amount`` outside [0, 1), ``end_epoch < start_epoch``; at ``fit``: together with unstructured
            :class:`~project.callbacks.Pruning`, ``model.compile: true`` or more than one process.
    """

    label = "structured pruning"
    needed_to_resume = "slimmed by structured pruning"  # its net has the slimmed widths
    config_file = "configs/slim.yaml"
    charts = {
        "Structured pruning": {
            "Parameters": ["Multiline", ["slim/params"]],
            "MACs per sample": ["Multiline", ["slim/macs_per_sample"]],
            "Layer widths": ["Multiline", [r"slim/width/.*"]],
        }
    }

    def __init__(
        self,
        amount: PruningAmount = 0.5,  # type: ignore[valid-type]
        norm: Literal[1, 2] = 1,
        global_pruning: bool = False,
        start_epoch: NonNegativeInt = 0,
        end_epoch: NonNegativeInt | None = None,
        layers: list[Literal["Conv2d", "Linear"]] | None = None,
    ) -> None:
        self.init_schedule(amount, start_epoch, end_epoch)
        require(norm in (1, 2), "structured pruning norm", f"must be 1 or 2, got {norm}")
        layers = layers or ["Conv2d", "Linear"]
        require(
            bool(layers) and all(name in LAYER_TYPES for name in layers),
            "structured pruning layers",
            f"must be a list of {sorted(LAYER_TYPES)}, got {layers}",
        )
        self.norm, self.global_pruning = int(norm), bool(global_pruning)
        self.layer_names = list(layers)
        self.layer_types = tuple(LAYER_TYPES[name] for name in layers)
        self.initial: dict[str, int] = {}
        self.before: dict[str, int] = {}
        self.take_copy_number()

    @property
    def amount(self) -> float:
        """The final fraction removed (the constructor's ``amount``; ``target`` in the schedule base)."""
        return self.target

    @property
    def method(self) -> str:
        """Short name for reports: ``structured_l1`` or ``structured_l2``."""
        return f"structured_l{self.norm}"

    def schedule(self) -> dict[str, Any]:
        """The settings that decide what is removed when (stored in checkpoints, compared on resume)."""
        return {
            "amount": self.target,
            "norm": self.norm,
            "global_pruning": self.global_pruning,
            "start_epoch": self.start_epoch,
            "end_epoch": self.end_epoch,
            "layers": self.layer_names,
        }

    def reached(self, fraction: float) -> str:
        return f"{fraction:.2f} of the channels will be removed (amount {self.target:.2f})"

    def results(self) -> dict[str, Any]:
        """``structured_pruning`` (the schedule) and ``params_before``/``macs_per_sample_before``: parameter
        elements and multiply-accumulates per sample of the net the run started with."""
        before = {f"{k}_before": v for k, v in self.before.items()}
        return {"structured_pruning": self.schedule(), **before}

    def reference(self, net: nn.Module) -> None:
        """Take ``net``'s prunable layer widths as the ones the schedule's fractions refer to."""
        self.initial = {name: width_of(m) for name, m in prunable_layers(net, self.layer_types).items()}

    def keep_at(self, epoch: int) -> dict[str, int] | int:
        """Channels to keep once ``epoch`` has started: per layer, or in total with global ranking."""
        fraction = self.target_at(epoch)
        if self.global_pruning:
            return kept(sum(self.initial.values()), fraction)
        return {name: kept(n, fraction) for name, n in self.initial.items()}

    # -- hooks ---------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.fresh_for(trainer, stage)  # another Trainer's fit: that model's widths, not the last one's
        if stage != "fit":
            return super().setup(trainer, pl_module, stage)
        # Trainer.callbacks: set by Lightning's CallbackConnector, not declared on the class
        if any(isinstance(cb, Pruning) for cb in trainer.callbacks):  # type: ignore[attr-defined]
            raise ConfigError(
                "trainer.callbacks: StructuredPruning removes channels, Pruning masks single weights of the same "
                "layers; use one of them (configs/slim.yaml or configs/pruning.yaml)"
            )
        spec = getattr(pl_module.hparams, "net", "lenet")
        if not is_recipe_net(spec):
            raise ConfigError(
                f"model.net: StructuredPruning slims {' and '.join(sorted(NETS))} only, whose layer widths rebuild "
                f"them; {net_name(spec)} is built from its own init_args, so a slimmed "
                "checkpoint could not be loaded again. Use Pruning (unstructured, configs/pruning.yaml)"
            )
        if getattr(pl_module.hparams, "compile", False):
            raise ConfigError(
                "model.compile: structured pruning rebuilds the net's layers during training and cannot run with "
                "model.compile true; set model.compile false"
            )
        if trainer.world_size > 1:
            raise ConfigError(
                f"structured pruning runs in one process (world size here: {trainer.world_size}); DDP keeps "
                "references to the parameters that slimming replaces. Use trainer.devices 1"
            )
        # The net as configured (setup runs before a resumed checkpoint is loaded): the schedule's reference.
        net = cast(Net, pl_module.net)
        self.reference(net)
        hp = cast(AttributeDict, pl_module.hparams)
        self.before = {
            "params": count_params(net),
            "macs_per_sample": macs_per_sample(hp.net, hp.num_classes, net.widths()),
        }
        super().setup(trainer, pl_module, stage)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.step(trainer, pl_module, trainer.current_epoch)

    def step(self, trainer: L.Trainer, pl_module: L.LightningModule, epoch: int) -> bool:
        """Slim the net to the schedule's widths for ``epoch`` (a no-op if it has them); returns whether it did."""
        net = cast(Net, pl_module.net)
        before = net.widths()
        slim(net, self.keep_at(epoch), self.norm, self.layer_types)
        if net.widths() == before:
            return False
        if pl_module.hparams.get("channels_last"):
            net.to(memory_format=torch.channels_last)  # the new parameters come back contiguous
        pl_module.hparams["widths"] = net.widths()
        rebuild_optimizers(trainer)
        log.info("structured pruning, epoch %d: widths %s -> %s", epoch, before, net.widths())
        return True

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        net, hp = cast(Net, pl_module.net), cast(AttributeDict, pl_module.hparams)
        stats = {
            "slim/params": float(count_params(net)),
            "slim/macs_per_sample": float(macs_per_sample(hp.net, hp.num_classes, net.widths())),
        }
        for name, layer in prunable_layers(net, self.layer_types).items():
            stats[f"slim/width/{name}"] = float(width_of(layer))
        pl_module.log_dict(stats, on_epoch=True)

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"initial": dict(self.initial)}
