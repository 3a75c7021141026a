"""``python -m project <command> [arguments]``: one entry for every command (the LightningCLI verbs' layout).

``fit`` trains; ``evaluate``, ``predict`` and ``export`` take a run folder; ``summarize`` tabulates runs; ``sweep``
runs an Optuna study of fit runs. ``python -m project fit ...`` is exactly ``python -m project.fit ...`` (the
command's module runs as ``__main__``, with its own ``--help``, errors and exit status).
"""

from __future__ import annotations

import runpy
import sys

COMMANDS = {
    "fit": "train, test on the best checkpoint, write results.json (a LightningCLI)",
    "evaluate": "evaluate a run's checkpoint on its test or validation split",
    "predict": "classify image files with a run's checkpoint into a CSV",
    "export": "export a run's net to ONNX, TorchScript or torch.export and check it",
    "summarize": "tabulate and plot every run under a folder, mean ± std over seeds",
    "sweep": "an Optuna study whose trials are fit runs",
}
USAGE = "usage: python -m project {" + ",".join(COMMANDS) + "} [arguments] (each command: --help)"


def main(argv: list[str] | None = None) -> int:
    """Run the command named by ``argv[0]`` as ``python -m project.<command>`` would; returns 2 for a missing or
    unknown command (one ``error:`` line), 0 for ``--help``. A command ends the process itself."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE + "\n\n" + "\n".join(f"  {name:10s} {what}" for name, what in COMMANDS.items()))
        return 0
    if not argv or argv[0] not in COMMANDS:
        given = f"{argv[0]!r} is not a command" if argv else "no command given"
        print(f"error: {given}; use one of {', '.join(COMMANDS)} (see python -m project --help)", file=sys.stderr)
        return 2
    sys.argv = [f"python -m project {argv[0]}", *argv[1:]]
    runpy.run_module(f"project.{argv[0]}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
