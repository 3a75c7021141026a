"""Pruning: one schedule base (:class:`ScheduledPruning`) and unstructured pruning (:class:`Pruning`).

* Where is the pruning schedule (start/end epoch, fraction per epoch, its checkpoint state, the check on
  resume, the warning for a run too short for it)?  :class:`ScheduledPruning`, shared by :class:`Pruning`
  (single weights masked, Lightning's ``ModelPruning`` over ``torch.nn.utils.prune``) and
  :class:`project.callbacks.StructuredPruning` (whole channels removed, Torch-Pruning).
* Where are pruned weights counted?  :func:`sparsity` -- from the weights themselves, never from a
  callback's bookkeeping.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

import lightning as L
import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt, restricted_number_type
from lightning.pytorch.callbacks import Callback, ModelPruning
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torch.nn.utils import prune

from project import adapters
from project.callbacks.fresh import FreshEachFit
from project.errors import ConfigError, require

log = logging.getLogger(__name__)

LAYER_TYPES: dict[str, type[nn.Module]] = {"Conv2d": nn.Conv2d, "Linear": nn.Linear}
# A float in [0, 1), checked by jsonargparse when a config is parsed. Not under `if TYPE_CHECKING`: jsonargparse
# reads such blocks too, and would check a plain float. Type checkers see a variable, hence the ignores where used.
PruningAmount = restricted_number_type("PruningAmount", float, [(">=", 0), ("<", 1)], join="and")


def sparsity(pairs: list[tuple[str, torch.Tensor]]) -> dict[str, float]:
    """Fraction of exact zeros, per named tensor and over all of them (key ``"global"``).

    Args:
        pairs: ``(name, tensor)``; each tensor counted once even if listed twice.

    Returns:
        ``{name: zeros / numel, ..., "global": total zeros / total numel}``, fractions in [0, 1].
    """
    out: dict[str, float] = {}
    zeros = total = 0
    seen: set[int] = set()
    for name, t in pairs:
        z, n = int((t == 0).sum()), t.numel()
        out[name] = z / n if n else 0.0
        if id(t) not in seen:
            seen.add(id(t))
            zeros, total = zeros + z, total + n
    out["global"] = zeros / total if total else 0.0
    return out


def nonzero_params(module: nn.Module) -> int:
    """Number of non-zero parameter elements; a pruned tensor counts through its effective ``orig * mask``."""
    count = 0
    for sub in module.modules():
        for name, p in sub.named_parameters(recurse=False):
            base = name.removesuffix("_orig")
            mask = getattr(sub, f"{base}_mask", None) if name.endswith("_orig") else None
            count += int(((p * mask) if mask is not None else p).count_nonzero())
    return count


class ScheduledPruning(FreshEachFit, Callback):
    """What both pruning callbacks share: a schedule over epochs, its checkpoint state and its checks.

    The schedule: pruning happens at the **start** of each epoch from ``start_epoch`` to ``end_epoch`` (0-based,
    inclusive), the total pruned fraction growing linearly to ``target`` at ``end_epoch`` (:meth:`target_at`).
    Pruning at the start of an epoch means that epoch's validation and checkpoint already see the pruned net.
    What a fraction means is the subclass's: of the selected weights (:class:`Pruning`, masks from
    ``torch.nn.utils.prune`` through Lightning's ``ModelPruning``), or of each layer's output channels
    (:class:`project.callbacks.StructuredPruning`, removed with Torch-Pruning).

    Shared here, so both behave the same: the checks of the settings (:meth:`init_schedule`); :meth:`schedule`,
    saved in the checkpoint (``state_dict``) and compared on resume (:meth:`check_resume`); :attr:`state_key`,
    Lightning's key for the checkpoint state: class name, schedule and, from the second callback with the same
    settings on, its place among them (``copy``, :meth:`number_copies`), so a resumed run gives each callback its
    own state back; one warning when ``trainer.max_epochs`` ends the run before ``end_epoch``
    (:meth:`warn_if_cut_short`, at ``setup`` of ``fit``).

    A subclass sets :attr:`label` (how messages name it), :attr:`method` (a short name for reports),
    :meth:`schedule`, :meth:`reached`, :attr:`charts` and :meth:`results`, and calls :meth:`init_schedule` and
    :meth:`take_copy_number` from its ``__init__``.
    """

    #: How messages name the callback (``"<label> amount: ..."``).
    label: ClassVar[str] = "pruning"
    #: What a checkpoint this callback wrote has been through, when resuming it without the callback cannot
    #: continue the run (``None``: it can), and the config that brings the callback back.
    needed_to_resume: ClassVar[str | None] = None
    config_file: ClassVar[str] = ""
    #: TensorBoard custom-scalars sections for what the callback logs (``{section: {chart: ["Multiline", tags]}}``).
    charts: ClassVar[dict[str, dict[str, list]]] = {}
    #: Every kind of scheduled pruning by class name, the name its checkpoint state is keyed under.
    kinds: ClassVar[dict[str, type[ScheduledPruning]]] = {}
    # Which copy of its settings each new callback is: provisional (in order of creation) until numbered among a
    # Trainer's callbacks (number_copies), then the order in which that Trainer lists them.
    _created: ClassVar[dict[str, itertools.count]] = {}

    target: float
    start_epoch: int
    end_epoch: int
    copy: int = 0

    if TYPE_CHECKING:  # read-only here: Pruning sets it, StructuredPruning derives it from its norm

        @property
        def method(self) -> str:
            """A short name for reports (``l1_unstructured``, ``structured_l2``, ...)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        ScheduledPruning.kinds.setdefault(cls.__qualname__, cls)

    def init_schedule(self, amount: float, start_epoch: int, end_epoch: int | None) -> None:
        """Check and keep the schedule: final fraction ``amount``, epochs ``start_epoch`` to ``end_epoch``
        (``None``: ``start_epoch`` only).

        Raises:
            ConfigError: ``amount`` outside [0, 1), ``end_epoch < start_epoch``.
        """
        require(0 <= amount < 1, f"{self.label} amount", f"must be in [0, 1), got {amount}")
        end_epoch = start_epoch if end_epoch is None else end_epoch
        require(
            end_epoch >= start_epoch, f"{self.label} end_epoch", f"({end_epoch}) must be >= start_epoch ({start_epoch})"
        )
        self.target, self.start_epoch, self.end_epoch = float(amount), int(start_epoch), int(end_epoch)

    def take_copy_number(self) -> None:
        """Number this callback among those created with the same class and schedule (0, 1, ...)."""
        self.copy = next(ScheduledPruning._created.setdefault(self.settings_key(), itertools.count()))

    def schedule(self) -> dict[str, Any]:
        """The settings that decide what is pruned when (plain ``str``/``int``/``float``/``bool``/lists; stored in
        checkpoints, compared on resume)."""
        raise NotImplementedError

    def settings_key(self) -> str:
        """The state key of the first callback with these settings: ``"<class name>{<schedule>}"``."""
        return adapters.state_key(self, **self.schedule())

    @property
    def state_key(self) -> str:
        copy = {"copy": self.copy} if self.copy else {}
        return adapters.state_key(self, **self.schedule(), **copy)

    @staticmethod
    def number_copies(callbacks: list[Callback]) -> None:
        """Number the pruning callbacks of one Trainer that have the same class and settings, in list order (0, 1,
        ...).

        Called at ``setup`` and by the CLI once its Trainer is built; the numbers are what tie each callback to
        its state in a checkpoint, so a run resumed with the same callbacks in the same order gets each its own.
        """
        seen: dict[str, int] = {}
        for cb in callbacks:
            if isinstance(cb, ScheduledPruning):
                key = cb.settings_key()
                cb.copy = seen.get(key, 0)
                seen[key] = cb.copy + 1

    def target_at(self, epoch: int) -> float:
        """Total pruned fraction, in [0, ``target``], the schedule asks for once ``epoch`` (0-based) has started."""
        if epoch < self.start_epoch:
            return 0.0
        steps = self.end_epoch - self.start_epoch + 1
        return self.target * min(epoch - self.start_epoch + 1, steps) / steps

    def reached(self, fraction: float) -> str:
        """How the warning of a run too short for the schedule says what it reaches (``fraction`` of ``target``)."""
        return f"{fraction:.2f} will be pruned, not {self.target:.2f}"

    def warn_if_cut_short(self, max_epochs: int | None) -> None:
        """Warn (``UserWarning``, rank 0) when a run of ``max_epochs`` epochs ends before the schedule's last step:
        its step would come at the start of an epoch that never runs. ``None`` or ``-1``: no limit, no warning."""
        last = (max_epochs or 0) - 1
        if max_epochs not in (None, -1) and last < self.end_epoch:
            rank_zero_warn(
                f"{self.label} runs to epoch {self.end_epoch} but max_epochs is {max_epochs}: "
                f"{self.reached(self.target_at(last))}. Lower start_epoch/end_epoch or raise trainer.max_epochs to "
                f"{self.end_epoch + 1} or more",
                category=UserWarning,
            )

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.fresh_for(trainer, stage)
        # Trainer.callbacks: set by Lightning's CallbackConnector, not declared on the class
        ScheduledPruning.number_copies(trainer.callbacks)  # type: ignore[attr-defined]
        if stage == "fit":
            self.warn_if_cut_short(trainer.max_epochs)

    def state_dict(self) -> dict[str, Any]:
        return {"schedule": self.schedule()}

    def results(self) -> dict[str, Any]:
        """The ``results.json`` fields this callback fills in (see :func:`project.report.results.build_results`)."""
        return {}

    @staticmethod
    def check_resume(callbacks: list[Callback], states: dict[str, Any]) -> None:
        """Refuse, before anything runs, to resume a checkpoint's pruning under another schedule, or without a kind
        of pruning the checkpoint cannot continue without.

        Args:
            callbacks: the resumed run's (``trainer.callbacks``), numbered by :meth:`number_copies`.
            states: the checkpoint's ``"callbacks"`` entry, ``{state key: state}`` (hostile input: anything).

        Raises:
            ConfigError: naming the saved schedule, the configured one and what to do.
        """
        ours = [cb for cb in callbacks if isinstance(cb, ScheduledPruning)]
        states = {k: v for k, v in states.items() if isinstance(k, str) and isinstance(v, dict)}
        for key, state in states.items():
            kind = ScheduledPruning.kinds.get(key.split("{", 1)[0])
            if kind is not None and kind.needed_to_resume and not any(isinstance(cb, kind) for cb in ours):
                raise ConfigError(
                    f"ckpt_path: the checkpoint was {kind.needed_to_resume} on the schedule {state.get('schedule')} "
                    f"and the config has none; resume with the run's settings (e.g. --config {kind.config_file})"
                )
        for cb in ours:
            # the state is keyed by the settings: under changed settings, compare with the first of the same kind
            saved = [v.get("schedule") for k, v in states.items() if k.startswith(f"{type(cb).__qualname__}{{")]
            schedule = states.get(cb.state_key, {}).get("schedule")
            if schedule is None and saved:
                schedule = saved[0]
            if schedule is not None and schedule != cb.schedule():
                raise ConfigError(
                    f"ckpt_path: the checkpoint was pruned on the schedule {schedule}, the config asks for "
                    f"{cb.schedule()}; resume with the run's pruning settings"
                )


class Pruning(ScheduledPruning, adapters.LotteryTicketFromInitialValues, ModelPruning):
    """Magnitude (or random) pruning on a schedule, resumable; a subclass of Lightning's ``ModelPruning``.

    The masks come from ``torch.nn.utils.prune`` through ``ModelPruning``. What this class adds:

    * :class:`ScheduledPruning`'s schedule: pruned at the **start** of each epoch from ``start_epoch`` to
      ``end_epoch`` (default: ``start_epoch`` only), the pruned fraction growing linearly to ``amount``;
    * resumable masks: Lightning's ``ModelPruning`` keeps no state, so a resumed run would lose its
      masks and the zeros would fill back in. The masks are saved in the checkpoint's callback state and
      re-applied when fit resumes, before the optimizer state is restored;
    * ``sparsity/global`` and ``sparsity/<layer>`` logged each epoch, counted from the weights;
    * only real ``nn.Parameter`` attributes of the chosen layer types are pruned (a ``weight`` that
      is a bool, a buffer or ``None`` is skipped).

    Every checkpoint (``ModelCheckpoint``'s, ``trainer.save_checkpoint``'s, at any point of the schedule, with
    or without ``make_pruning_permanent``) holds the plain, mask-applied weights under the net's own parameter
    names, so it loads with ``ImageClassifier.load_from_checkpoint`` and strictly into an unpruned net; the
    masks and the schedule travel in the callback's state. Several ``Pruning`` callbacks, with different or
    identical settings, can run in one Trainer (like Lightning's ``ModelPruning``; see ``state_key``).

    Args:
        method: ``"l1_unstructured"`` (recipe default), ``"random_unstructured"`` or ``"ln_structured"``.
        amount: final fraction of the selected weights set to zero, in [0, 1).
        start_epoch: first epoch (0-based) at whose start pruning is applied.
        end_epoch: last pruning epoch; ``None`` prunes once at ``start_epoch``.
        global_pruning: rank all selected tensors together (unstructured methods only) instead of per layer.
        layers: module class names whose parameters are pruned.
        parameter_names: which parameters of those layers (``weight``, ``bias``).
        n: norm order for ``ln_structured``.
        dim: dimension along which ``ln_structured`` removes slices (0 = output channels).
        make_pruning_permanent: remove the masks at the end of fit, leaving zeros in plain weights.
        lottery_ticket: reset the unpruned weights to their initial values after each pruning step
            (Frankle & Carbin 2019); off, as in the recipe.
        verbose: Lightning's ``ModelPruning`` verbosity (0, 1 or 2).

    Raises:
        ConfigError: ``amount`` outside [0, 1), ``end_epoch < start_epoch``, unknown layer type, or global
            pruning with a structured method.
    """

    config_file = "configs/pruning.yaml"
    charts = {"Pruning": {"Sparsity (global, per layer)": ["Multiline", [r"sparsity/.*"]]}}
    method: str  # the constructor's ``method``

    def __init__(
        self,
        method: Literal["l1_unstructured", "random_unstructured", "ln_structured"] = "l1_unstructured",
        amount: PruningAmount = 0.5,  # type: ignore[valid-type]
        start_epoch: NonNegativeInt = 0,
        end_epoch: NonNegativeInt | None = None,
        global_pruning: bool = True,
        layers: list[Literal["Conv2d", "Linear"]] | None = None,
        parameter_names: list[Literal["weight", "bias"]] | None = None,
        n: PositiveInt = 1,
        dim: NonNegativeInt = 0,
        make_pruning_permanent: bool = True,
        lottery_ticket: bool = False,
        verbose: Literal[0, 1, 2] = 0,
    ) -> None:
        self.init_schedule(amount, start_epoch, end_epoch)
        layers = layers or ["Conv2d", "Linear"]
        structured = method == "ln_structured"
        require(
            not (structured and global_pruning),
            "pruning global_pruning",
            "ln_structured prunes per layer; set global_pruning: false",
        )
        ModelPruning.__init__(
            self,
            pruning_fn=method,
            parameter_names=cast("list[str] | None", parameter_names) or ["weight"],  # Lightning only reads it
            use_global_unstructured=global_pruning,
            amount=self._step_amount,
            make_pruning_permanent=make_pruning_permanent,
            use_lottery_ticket_hypothesis=lottery_ticket,
            pruning_dim=dim if structured else None,
            pruning_norm=n if structured else None,
            verbose=verbose,
        )
        self.method = method
        self.layer_types = tuple(LAYER_TYPES[name] for name in layers)
        self._names: dict[int, str] = {}
        self._pending_masks: dict[str, torch.Tensor] | None = None
        self._pruned = False
        self.take_copy_number()

    def schedule(self) -> dict[str, Any]:
        """The settings that decide which weights are pruned when (stored in checkpoints, compared on resume)."""
        names, global_pruning = adapters.pruning_settings(self)
        return {
            "method": self.method,
            "amount": float(self.target),
            "start_epoch": int(self.start_epoch),
            "end_epoch": int(self.end_epoch),
            "layers": [t.__name__ for t in self.layer_types],
            "parameter_names": names,
            "global_pruning": global_pruning,
        }

    def reached(self, fraction: float) -> str:
        return f"sparsity will reach {fraction:.2f}, not {self.target:.2f}"

    def results(self) -> dict[str, Any]:
        """``sparsity`` (global fraction of zeros in the pruned tensors) and ``sparsity_per_layer``
        (``{"<layer>.<param>": fraction}``), counted from the weights (:func:`sparsity`)."""
        stats = sparsity(self.named_targets())
        return {"sparsity": stats["global"], "sparsity_per_layer": {k: v for k, v in stats.items() if k != "global"}}

    def _step_amount(self, epoch: int) -> float:
        # torch.nn.utils.prune applies a float amount to the weights still unpruned, hence the ratio.
        if not self.start_epoch <= epoch <= self.end_epoch:
            return 0.0
        before, after = self.target_at(epoch - 1), self.target_at(epoch)
        return (after - before) / (1 - before)

    # -- which tensors -------------------------------------------------------------------------
    def filter_parameters_to_prune(self, parameters_to_prune: Any = ()) -> list[tuple[nn.Module, str]]:
        return [
            (m, name)
            for m, name in parameters_to_prune
            if isinstance(m, self.layer_types) and isinstance(getattr(m, name, None), nn.Parameter)
        ]

    def named_targets(self) -> list[tuple[str, torch.Tensor]]:
        """``(layer.param, effective tensor)`` for each pruned tensor (``orig * mask`` while masks are on)."""
        pairs = adapters.pruning_targets(self)
        return [(f"{self._names[id(m)]}.{name}", getattr(m, name).detach()) for m, name in pairs]

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.fresh_for(trainer, stage)  # another Trainer's fit: the layers of its model, not the last one's
        if stage == "fit":
            ModelPruning.setup(self, trainer, pl_module, stage)  # finds the (module, name) pairs to prune
            self._names = {id(m): name for name, m in pl_module.named_modules()}
        ScheduledPruning.setup(self, trainer, pl_module, stage)

    def apply_pruning(self, amount: float) -> None:
        # torch's global_unstructured flattens weights and masks with .view(-1), which fails on channels_last
        # tensors: prune on contiguous copies, then give the parameters back their memory format.
        restore = []
        for m, name in adapters.pruning_targets(self):
            for attr in (f"{name}_orig", name, f"{name}_mask"):
                t = getattr(m, attr, None)
                if isinstance(t, torch.Tensor) and not t.is_contiguous():
                    if isinstance(t, nn.Parameter):
                        t.data = t.data.contiguous()
                        restore.append(t)
                    else:
                        setattr(m, attr, t.contiguous())
        super().apply_pruning(amount)
        self._pruned = self._pruned or bool(amount)
        for p in restore:
            p.data = p.data.contiguous(memory_format=torch.channels_last)

    # -- hooks ---------------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        adapters.run_pruning(self, trainer.current_epoch)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning prunes here; we prune at the start of the epoch instead, and only report.
        stats = sparsity(self.named_targets())
        pl_module.log_dict({f"sparsity/{k}": v for k, v in stats.items()}, on_epoch=True)

    def state_dict(self) -> dict[str, Any]:
        masks = {}
        for m, name in adapters.pruning_targets(self):
            if hasattr(m, f"{name}_mask"):
                masks[f"{self._names[id(m)]}.{name}"] = getattr(m, f"{name}_mask").detach().cpu()
            elif self._pruned:  # made permanent at the end of fit: the mask is where the zeros are
                masks[f"{self._names[id(m)]}.{name}"] = (getattr(m, name) != 0).detach().cpu().to(torch.float32)
        return {"masks": masks} | ScheduledPruning.state_dict(self)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        # Replaces ModelPruning's, which only does this with make_pruning_permanent: store ``orig * mask`` under
        # the plain name, so the state_dict is the unpruned net's whatever the options.
        sd = checkpoint["state_dict"]
        prefix = {id(m): name for name, m in pl_module.named_modules()}
        for m, name in adapters.pruning_targets(self):
            key = f"{prefix[id(m)]}.{name}" if prefix[id(m)] else name
            if f"{key}_orig" in sd and f"{key}_mask" in sd:
                sd[key] = sd.pop(f"{key}_orig") * sd.pop(f"{key}_mask")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending_masks = state_dict.get("masks") or None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Runs after the optimizer was built over the plain parameters and before its state is restored,
        # exactly as in an uninterrupted run, where pruning renames ``weight`` to ``weight_orig`` in place.
        if not self._pending_masks:
            return
        targets = {f"{self._names[id(m)]}.{name}": (m, name) for m, name in adapters.pruning_targets(self)}
        for key, mask in self._pending_masks.items():
            module, name = targets[key]
            prune.custom_from_mask(module, name, mask.to(getattr(module, name).device))
            self._pruned = True
        log.info("restored %d pruning masks from the checkpoint", len(self._pending_masks))
        self._pending_masks = None
