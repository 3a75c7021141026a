"""What a run folder's config may name: classes and functions of the packages the product trusts, nothing else.

A run's ``config.yaml`` comes from elsewhere (a colleague's ``logs/``, a paper's release), and jsonargparse imports
every class path it names while it parses the file, before any check of ours could run: a class path into a module
shipped inside the run folder (``logs.dl.version_0.evil.Anything``; under ``python -m`` the working directory is an
import root) would run that module's code. So a run-folder command reads the config as data first and refuses any
import path outside :data:`TRUSTED_PACKAGES`, unless the user opts in: for the packages they name in the environment
variable ``PROJECT_TRUSTED_PACKAGES`` (their own nets, say), or for everything (``--trust_config true``). See
``docs/security.md``.
"""

from __future__ import annotations

import os
import re
from typing import Any

from project.errors import ConfigError

# The packages whose classes and functions a run folder's config may name (the product and what it is built on).
TRUSTED_PACKAGES = ("project", "lightning", "torch", "torchvision", "torchmetrics")
# What jsonargparse may import while it rebuilds a run from a run folder's config (project.adapters.import_paths_only):
# the classes and callables a run of this project holds, by module, not every class of a trusted package (a
# torchmetrics metric that downloads weights when built, say). Anything else is refused by the parser itself before
# it is imported, whatever the string looks like.
RUN_IMPORTS = (
    "project",
    "torch.optim",  # optimizers and learning-rate schedulers
    "lightning.pytorch.callbacks",
    "lightning.pytorch.loggers",
    "lightning.pytorch.plugins",
    "lightning.pytorch.profilers",
    "lightning.pytorch.strategies",
    "lightning.pytorch.accelerators",
    "lightning.fabric.plugins",
)
#: The environment variable in which a user names more packages (or modules) they trust, comma-separated
#: (``PROJECT_TRUSTED_PACKAGES=mynets,lab.models``): added to both lists above, for their own nets and callbacks.
TRUST_ENV = "PROJECT_TRUSTED_PACKAGES"
_MODULE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
# A dotted import path: at least two components of Python identifiers.
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


def user_trusted() -> tuple[str, ...]:
    """The packages or modules named in :data:`TRUST_ENV` (empty when unset).

    Raises:
        ConfigError: an entry is not a dotted Python module name.
    """
    names = tuple(n.strip() for n in os.environ.get(TRUST_ENV, "").split(",") if n.strip())
    for name in names:
        if not _MODULE.fullmatch(name):
            raise ConfigError(f"{TRUST_ENV}: {name!r} is not a package or module name (e.g. mynets or lab.models)")
    return names


def trusted_packages() -> tuple[str, ...]:
    """:data:`TRUSTED_PACKAGES` and the user's (:func:`user_trusted`)."""
    return TRUSTED_PACKAGES + user_trusted()


def run_imports() -> tuple[str, ...]:
    """:data:`RUN_IMPORTS` and the user's (:func:`user_trusted`): what the parser may import from a run folder."""
    return RUN_IMPORTS + user_trusted()


def within(path: str, modules: tuple[str, ...]) -> bool:
    """Whether the dotted ``path`` is one of ``modules`` or lies under one."""
    return any(path == m or path.startswith(m + ".") for m in modules)


def import_paths(config: Any, key: str = "") -> list[tuple[str, str]]:
    """``(key, path)`` for every value of ``config`` (a parsed YAML tree) that jsonargparse may import: every
    ``class_path``, and every other string that is a dotted path naming a class (its last part capitalised) or a
    function two modules deep (``a.b.fn``); keys are dotted (``trainer.callbacks.0.class_path``)."""
    found: list[tuple[str, str]] = []
    if isinstance(config, dict):
        for name, value in config.items():
            found += import_paths(value, f"{key}.{name}" if key else str(name))
    elif isinstance(config, list):
        for i, value in enumerate(config):
            found += import_paths(value, f"{key}.{i}" if key else str(i))
    elif isinstance(config, str) and _DOTTED.fullmatch(config):
        parts = config.split(".")
        if key.endswith("class_path") or parts[-1][:1].isupper() or len(parts) >= 3:
            found.append((key, config))
    return found


def check_import_paths(config: Any, source: str) -> None:
    """Refuse a config from a run folder that names an import path outside :func:`trusted_packages`.

    Args:
        config: the parsed config (YAML read as data, nothing imported).
        source: the file it came from, for the message.

    Raises:
        ConfigError: one line naming the file, the key, the path and the opt-in.
    """
    trusted = trusted_packages()
    for key, path in import_paths(config):
        if not within(path, trusted):
            raise ConfigError(
                f"{source}: {key} names {path}, outside the packages a run folder's config may name "
                f"({', '.join(trusted)}); importing it could run code from anywhere. If you trust that package "
                f"and have it installed, name it in {TRUST_ENV} (e.g. {TRUST_ENV}={path.split('.')[0]}), or pass "
                "--trust_config true to trust this whole run folder"
            )
