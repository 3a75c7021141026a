"""A build step of the Dockerfile (removed after it runs): the part of ``requirements.lock`` the image installs.

    python runtime_lock.py requirements.lock report.json > /tmp/runtime.lock

``report.json`` is pip's installation report of a dry run (``pip install --dry-run --ignore-installed --report``)
that resolved the runtime's requirements with the lock as constraints. Printed: the lock's block (its ``name==version``
pin and ``--hash`` lines) of every distribution the report would install, so that
``pip install --require-hashes --no-deps -r /tmp/runtime.lock`` installs exactly those, each file checked against the
lock's sha256 hashes. Exits 1 with one ``error:`` line when the report holds a distribution the lock does not pin at
that version, or a pin without hashes.
"""

from __future__ import annotations

import json
import re
import sys


def canonical(name: str) -> str:
    """PEP 503 normalised name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def blocks(lock_text: str) -> dict[str, tuple[str, list[str]]]:
    """``{name: (version, lines)}``: each pin of the lock with its ``--hash`` continuation lines."""
    found: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in lock_text.splitlines():
        pin = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line)
        if pin:
            current = canonical(pin.group(1))
            found[current] = (pin.group(2), [line])
        elif current is not None and line.lstrip().startswith("--hash="):
            found[current][1].append(line)
        else:
            current = None
    return found


def main(argv: list[str]) -> int:
    lock_file, report_file = argv
    with open(lock_file, encoding="utf-8") as f:
        pinned = blocks(f.read())
    with open(report_file, encoding="utf-8") as f:
        resolved = [(canonical(i["metadata"]["name"]), i["metadata"]["version"]) for i in json.load(f)["install"]]
    wrong = [f"{name}=={version}" for name, version in resolved if pinned.get(name, ("", []))[0] != version]
    unhashed = [name for name, _ in resolved if name in pinned and len(pinned[name][1]) < 2]
    if wrong or unhashed:
        print(
            f"error: requirements.lock does not pin {', '.join(wrong) or '-'} and has no hashes for "
            f"{', '.join(unhashed) or '-'}; regenerate it (docs/usage.md: Install)",
            file=sys.stderr,
        )
        return 1
    for name, _ in resolved:
        print("\n".join(pinned[name][1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
