"""Short labels for groups of runs (plot legends): only what differs between groups (``lr=0.01``, ``StepLR``), at
most :data:`LABEL_CHARS` characters; the full label is in ``summary.md``/``summary.csv``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from project.summary.collect import Run

LABEL_CHARS = 60  # a group's short label (plot legends): at most this many characters


VALUE_CHARS = 20  # one value in a short label


CLASS_PATH = re.compile(r"(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)")


def short_key(key: str, keys: set[str]) -> str:
    """The shortest dotted ending of ``key`` that names no other of ``keys`` (``lr`` for ``model.optimizer.lr``),
    as ``--by`` accepts it."""
    parts = key.split(".")
    for i in range(len(parts) - 1, -1, -1):
        end = ".".join(parts[i:])
        if sum(k == end or k.endswith("." + end) for k in keys) == 1:
            return end
    return key


def abbreviate(value: Any, width: int = VALUE_CHARS) -> str:
    """A value for a short label: a class path by its class name, a list item by item, cut to ``width``
    characters (``…`` marks the cut)."""
    from project.summary.collect import fmt

    if isinstance(value, list | tuple):
        text = "[" + ",".join(abbreviate(v, width) for v in value) + "]"
    elif isinstance(value, str) and (m := CLASS_PATH.fullmatch(value)):
        text = m.group(1)
    else:
        text = fmt(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def fit_parts(parts: list[str], limit: int) -> str:
    """``parts`` joined by ``", "``, as many as fit in ``limit`` characters, then ``+N more`` for the rest."""
    for shown in range(len(parts), 0, -1):
        more = f", +{len(parts) - shown} more" if shown < len(parts) else ""
        text = ", ".join(parts[:shown])
        if len(text) + len(more) <= limit:
            return text + more
    more = f", +{len(parts) - 1} more" if len(parts) > 1 else ""
    return parts[0][: limit - len(more) - 1] + "…" + more


def short_labels(groups: dict[str, list[Run]], by: list[str] | None = None, limit: int = LABEL_CHARS) -> dict[str, str]:
    """``{label: short label}`` for plot legends: only the keys whose values differ between the groups, each named
    by its shortest ending (:func:`short_key`) with its value abbreviated (:func:`abbreviate`); the experiment by
    its name. At most ``limit`` characters: keys that do not fit are counted (``+3 more``); the full list is the
    group's label in ``summary.md``/``summary.csv``. Groups whose short labels would be equal are numbered."""
    from project.summary.collect import _hashable, group_identity

    ids = {label: group_identity(members, by) for label, members in groups.items()}
    keys = {k for ident in ids.values() for k in ident}
    differ = sorted(k for k in keys if len({repr(_hashable(i.get(k))) for i in ids.values()}) > 1)
    differ.sort(key=lambda k: k != "experiment")  # the experiment first
    out: dict[str, str] = {}
    for label, ident in ids.items():
        parts = [
            abbreviate(ident.get(k)) if k == "experiment" else f"{short_key(k, keys)}={abbreviate(ident.get(k))}"
            for k in differ
        ] or [abbreviate(ident.get("experiment", label), limit)]
        out[label] = fit_parts(parts, limit)
    seen: dict[str, int] = {}
    for text in out.values():
        seen[text] = seen.get(text, 0) + 1
    for n, (label, text) in enumerate(out.items(), 1):
        if seen[text] > 1:
            tag = f" #{n}"
            out[label] = text[: limit - len(tag)] + tag
    return out
