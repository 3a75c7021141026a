"""The benchmarks' output: a JSON file and its Markdown table beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from project.runs.files import write_json, write_text


def write_report(out: Path, data: dict[str, Any], table: str) -> None:
    """Write ``data`` to ``out`` (JSON) and ``table`` beside it (``out`` with ``.md``), creating the folder; print
    the table and where both went."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, data)
    write_text(out.with_suffix(".md"), table)
    print(table)
    print(f"wrote {out} and {out.with_suffix('.md')}")
