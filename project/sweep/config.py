"""From a sweep file's base experiment to each trial's fit config: the base resolved as ``python -m project.fit``
resolves it (:func:`resolve_base`), the objective checked against it (:func:`check_objective`), dotted keys found in
it (:func:`key_path`) and a trial's config written from it (:func:`trial_config`)."""

from __future__ import annotations

import copy
import importlib
import inspect
from typing import TYPE_CHECKING, Any

from project.errors import ConfigError

if TYPE_CHECKING:
    from project.sweep.file import Sweep


def resolve_base(sweep: Sweep, extra: list[str]) -> dict[str, Any]:
    """The base experiment's full config, as ``python -m project.fit`` resolves it before it trains
    (:meth:`project.cli.parser.ProjectCLI.resolve`: the same config steps, the default logger included).

    Raises:
        ConfigError: the base config does not parse or is refused (fit's error, on one line).
    """
    from jsonargparse import ArgumentError

    from project.cli.parse_errors import explain_parse_error
    from project.cli.parser import ProjectCLI

    args = [a for c in sweep.configs for a in ("--config", c)] + sweep.args + extra
    try:
        config = ProjectCLI.resolve(args)
    except SystemExit:  # --help and the like among the fit arguments
        raise ConfigError(f"base: the fit arguments do not parse ({' '.join(args)})") from None
    except (ArgumentError, ValueError) as e:
        raise ConfigError(f"base: {explain_parse_error(e)}") from None
    logger = (config.get("trainer") or {}).get("logger")
    if not isinstance(logger, dict) or "TensorBoardLogger" not in str(logger.get("class_path")):
        raise ConfigError("base: trials need the TensorBoard logger (trainer.logger); do not switch it off")
    config.pop("ckpt_path", None)
    return config


def check_objective(sweep: Sweep, base: dict[str, Any]) -> None:
    """Refuse an objective the base experiment cannot produce: ``best_val_acc`` (the checkpoint callback's best
    ``val/acc``) without validation or without checkpointing is ``null`` in every trial's ``results.json``.

    What this cannot see (a swept key that turns validation off, a NaN loss) fails that trial with one line.

    Raises:
        ConfigError: naming the setting and what to do.
    """
    trainer = base.get("trainer") or {}
    if sweep.metric != "best_val_acc":
        return
    why = None
    if trainer.get("limit_val_batches") in (0, 0.0):
        why = "trainer.limit_val_batches is 0 (no validation)"
    elif trainer.get("enable_checkpointing") is False:
        why = "trainer.enable_checkpointing is false (the best val/acc is the checkpoint callback's)"
    elif (trainer.get("max_epochs") or 0) > 0 and (trainer.get("check_val_every_n_epoch") or 1) > trainer["max_epochs"]:
        why = f"trainer.check_val_every_n_epoch is beyond trainer.max_epochs {trainer['max_epochs']} (no validation)"
    if why:
        raise ConfigError(
            f"objective.metric: best_val_acc is never measured: {why}; validate and checkpoint, or choose another "
            "objective (test_acc)"
        )


def check_folds(sweep: Sweep, base: dict[str, Any]) -> None:
    """With ``folds``, refuse a base experiment whose trials would all refuse their fold settings: fit's own checks
    (:func:`project.cli.checks.check_folds_without_val_size`) on the base with ``data.folds`` set.

    Raises:
        ConfigError: ``base: `` and fit's error line.
    """
    from jsonargparse import Namespace

    from project.cli import checks

    if not sweep.folds:
        return
    init = dict((base.get("data") or {}).get("init_args") or {}) | {"folds": sweep.folds, "fold": 0}
    try:
        checks.check_folds_without_val_size(Namespace(data=Namespace(init_args=Namespace(**init))))
    except ConfigError as e:
        raise ConfigError(f"base: {e}") from None


def key_path(config: dict[str, Any], key: str) -> tuple[Any, Any]:
    """The container holding dotted ``key`` and the last part (an int for list items).

    ``init_args`` may be left out (``model.optimizer.lr`` means ``model.optimizer.init_args.lr``).

    Raises:
        ConfigError: no such key in the resolved config.
    """
    node, parts = config, key.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"space.{key}: {'.'.join(parts[:i])} is a list of {len(node)}; use an index")
            if last:
                return node, int(part)
            node = node[int(part)]
            continue
        if isinstance(node, dict) and part not in node and isinstance(node.get("init_args"), dict):
            node = node["init_args"]
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(
                f"space.{key}: no such key in the base experiment's config (see python -m project.fit ... "
                "--print_config)"
            )
        if last:
            return node, part
        node = node[part]
    raise ConfigError(f"space.{key}: empty key")


def trial_config(
    base: dict[str, Any],
    params: dict[str, Any],
    seed: int,
    save_dir: str,
    name: str,
    version: int,
    fold: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The base config with the trial's values, seed, run folder and :class:`ReportToStudy` callback; ``fold``:
    ``(k, K)``, the trial's fold of a K-fold cross-validation (``data.fold``, ``data.folds``).

    Setting a ``class_path`` keeps only the ``init_args`` the new class accepts (AdamW's ``betas`` do not
    go to SGD).
    """
    config = copy.deepcopy(base)
    for key, value in params.items():
        node, part = key_path(config, key)
        node[part] = value
        if part == "class_path" and isinstance(node.get("init_args"), dict):
            module, _, cls = str(value).rpartition(".")
            accepted = inspect.signature(getattr(importlib.import_module(module), cls)).parameters
            node["init_args"] = {k: v for k, v in node["init_args"].items() if k in accepted}
    config["seed_everything"] = seed
    if fold is not None:
        data = config["data"].setdefault("init_args", {})
        data["fold"], data["folds"] = fold
    logger = config["trainer"]["logger"]["init_args"]
    logger.update(save_dir=save_dir, name=name, version=version)
    callbacks = config["trainer"].get("callbacks") or []
    callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
    config["trainer"]["callbacks"] = [*callbacks, {"class_path": "project.sweep.trial.ReportToStudy"}]
    return config
