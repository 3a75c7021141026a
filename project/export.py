"""``python -m project.export RUN [--ckpt best|last|FILE] [--format onnx|torchscript|pt2] [--out FILE]``.

Exports a run's net (the LightningModule's ``forward``: float32 x (N, C, H, W) -> logits (N, num_classes))
with a dynamic batch axis, then checks the file it wrote against eager PyTorch on a real batch of the run's
test data (up to 256 images):

* ``onnx`` (default): ``LightningModule.to_onnx`` with PyTorch's ``torch.export``-based exporter
  (``dynamo=True``, needs ``onnxscript``), checked with onnxruntime's CPU provider;
* ``torchscript``: ``torch.jit.trace`` (deprecated by PyTorch in favour of ``torch.export``; kept for C++
  deployments that still load TorchScript);
* ``pt2``: ``torch.export.save`` of an ``ExportedProgram``, the format PyTorch recommends now.

Writes the model file (default ``<run>/model-<ckpt>.<onnx|ts.pt|pt2>``) and ``<run>/export.json`` with, per
format: the file, its size in bytes raw and gzip-compressed (pruned weights are zeros, which compress), the
max absolute difference to eager outputs (must be <= ``--atol``, default 1e-4, in fp32), and the median CPU
latency in milliseconds per batch of 1 and of 256, exported vs eager. A file that fails the check is deleted
and the command exits 1.

Pruned runs export like any other: their checkpoints hold plain (zeroed) weights, not masks; a structurally
pruned (slimmed) run exports its smaller net, rebuilt from the widths in its checkpoint.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, cast

import lightning as L
import torch
from jsonargparse.typing import PositiveFloat, PositiveInt
from lightning.pytorch.cli import LightningArgumentParser

from project.cli.commands import Command, RunJob, main_of
from project.cli.entry import exit_with
from project.cli.parser import ProjectCLI
from project.errors import ConfigError, UnreadableFile, UserError
from project.runs import files, layout, read

FORMATS = {"onnx": ".onnx", "torchscript": ".ts.pt", "pt2": ".pt2"}
LATENCY_BATCHES = (1, 256)
# The exporters' own loggers: the ONNX exporter's graph passes (onnxscript's optimizer and rewriter, onnx_ir's
# pass manager) say "No unused functions to remove", "Skipping constant folding for node ...", "Removed 7 unused
# nodes" at INFO on every export, printed by the commands' root handler.
EXPORTER_LOGGERS = ("onnxscript", "onnx_ir")
ORT_ERRORS_ONLY = 3  # onnxruntime's log severity: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal


@contextlib.contextmanager
def quiet_exporters() -> Iterator[None]:
    """For the exporter call only: :data:`EXPORTER_LOGGERS` at WARNING (their INFO chatter dropped, their warnings
    kept) and the exporters' deprecation notices (``FutureWarning``, ``DeprecationWarning``: TorchScript's, the
    traced module's) ignored; the levels and warning filters are restored afterwards."""
    loggers = [logging.getLogger(name) for name in EXPORTER_LOGGERS]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        for lg in loggers:
            lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def add_arguments(parser: LightningArgumentParser) -> None:
    parser.add_argument("--format", type=Literal["onnx", "torchscript", "pt2"], default="onnx", help="file format")
    parser.add_argument("--out", type=str | None, default=None, help="file to write (default: in the run folder)")
    parser.add_argument("--atol", type=PositiveFloat, default=1e-4, help="max abs difference to eager outputs")
    parser.add_argument("--repeats", type=PositiveInt, default=20, help="timed calls per latency figure")


def test_batch(cli: ProjectCLI, n: int = 256) -> torch.Tensor:
    """The first ``n`` images of the run's test split as the net sees them: float32 (n, C, H, W), on CPU."""
    data = cli.datamodule
    data.setup("test")
    x = torch.stack([data.test_set[i][0] for i in range(min(n, len(data.test_set)))])
    return x.float()


def export_file(model: L.LightningModule, fmt: str, example: torch.Tensor, out: Path) -> Callable:
    """Write ``model`` in ``fmt`` to ``out`` (batch axis dynamic); return a callable running the written file.

    The callable takes a float32 tensor (N, C, H, W) and returns logits (N, num_classes) as a float32 tensor.

    Raises:
        UserError: the exporter failed (its first line is in the message).
    """
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    try:
        with quiet_exporters():
            if fmt == "onnx":
                model.to_onnx(
                    out, example, dynamo=True, dynamic_shapes={"x": {0: batch}}, external_data=False, verbose=False
                )
                import onnxruntime as ort

                options = ort.SessionOptions()
                options.log_severity_level = ORT_ERRORS_ONLY  # its graph-optimizer notes are not the user's business
                session = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
                name = session.get_inputs()[0].name
                return lambda x: torch.from_numpy(session.run(None, {name: x.numpy()})[0])
            if fmt == "torchscript":
                # the plain net: tracing the LightningModule would touch its Trainer-only properties
                torch.jit.save(torch.jit.trace(model.net, example), str(out))
                loaded = torch.jit.load(str(out))  # our own file, just written
                return lambda x: loaded(x)
            program = torch.export.export(model, (example,), dynamic_shapes={"x": {0: batch}})
            torch.export.save(program, str(out))
            module = torch.export.load(str(out)).module()
            return lambda x: module(x)
    except Exception as e:  # the exporters raise many types (torch._dynamo, onnxscript, ...); report any as one line
        out.unlink(missing_ok=True)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{fmt} export of {type(model).__name__} failed: {first}") from None


def median_ms(fn: Callable, x: torch.Tensor, repeats: int) -> float:
    """Median wall time of ``fn(x)`` in milliseconds over ``repeats`` calls, after 3 warm-up calls."""
    times = []
    with torch.inference_mode():
        for i in range(repeats + 3):
            start = time.perf_counter()
            fn(x)
            if i >= 3:
                times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def export(job: RunJob) -> dict[str, Any]:
    """Export, check and time the net; write ``export.json``; return this format's record.

    Raises:
        ConfigError: ``--out`` is a folder.
        UserError: the export failed or its outputs differ from eager PyTorch by more than ``--atol``.
    """
    fmt = job.options.format
    out = _out_file(job)
    model = job.cli.model.cpu().eval()
    x = test_batch(job.cli)
    run_exported, eager_out, exported_out, diff = _export_checked(model, fmt, x, out, job.options.atol)
    record = _record(job, out, x, eager_out, exported_out, diff)
    record["latency_ms"] = _latencies(model, run_exported, x, job.options.repeats)
    path = _add_to_export_json(job.run, fmt, record)
    lat = record["latency_ms"]
    print(
        f"{fmt}: {out} ({record['bytes'] / 2**20:.2f} MiB, {record['gzip_bytes'] / 2**20:.2f} MiB gzip), "
        f"max |diff| {diff:.2e}; ms per batch of 1: {lat['batch_1']['exported']:.3f} vs eager "
        f"{lat['batch_1']['eager']:.3f}, of 256: {lat['batch_256']['exported']:.2f} vs {lat['batch_256']['eager']:.2f}"
        f" -> {path}"
    )
    return record


def _out_file(job: RunJob) -> Path:
    """The file to write: ``--out``, else ``<run>/model-<ckpt>.<suffix>``; its folder checked writable before
    anything is exported.

    Raises:
        ConfigError: ``--out`` is a folder, or its folder cannot be created or written.
    """
    fmt = job.options.format
    out = (
        Path(job.options.out)
        if job.options.out
        else job.run / layout.EXPORTED_MODEL.format(ckpt=job.ckpt_name, suffix=FORMATS[fmt])
    )
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give a file name")
    files.check_folder(out.parent, "--out", keep=True)  # writable, before anything is exported
    return out


def _export_checked(
    model: L.LightningModule, fmt: str, x: torch.Tensor, out: Path, atol: float
) -> tuple[Callable, torch.Tensor, torch.Tensor, float]:
    """Export ``model`` in ``fmt`` to a temporary file beside ``out``, compare its outputs on ``x`` (float32
    (N, C, H, W)) with eager PyTorch's and move it to ``out`` only when they agree within ``atol``.

    Returns:
        ``(run_exported, eager_out, exported_out, diff)``: a callable running the written file, both outputs
        (float32 (N, num_classes) logits) and their max absolute difference.

    Raises:
        UserError: ``out``'s folder cannot be written, the export failed, or the outputs differ by more than
            ``atol`` (nothing is written).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    # a name reserved exclusively (never a planted link); the exporter then writes our own empty file
    try:
        fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=f".tmp{FORMATS[fmt]}")
    except OSError as e:
        raise UserError(f"--out {out}: cannot write it ({e.strerror or e}); choose another file") from None
    os.close(fd)
    os.chmod(name, files.new_file_mode())  # as the umask says, not mkstemp's 0600
    tmp = Path(name)
    try:
        run_exported = export_file(model, fmt, x[:2], tmp)  # batch 1 would be specialised
        with torch.inference_mode():
            eager_out = model(x).float()
            exported_out = run_exported(x).float()
        diff = float((eager_out - exported_out).abs().max())
        if not diff <= atol:
            raise UserError(
                f"the {fmt} file's outputs differ from PyTorch's by {diff:.3g} (> --atol {atol:g}) on "
                f"{len(x)} test images; not written"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return run_exported, eager_out, exported_out, diff


def _record(
    job: RunJob, out: Path, x: torch.Tensor, eager_out: torch.Tensor, exported_out: torch.Tensor, diff: float
) -> dict[str, Any]:
    """This format's ``export.json`` record without its latencies (``latency_ms`` empty): the file, the
    checkpoint, the file's size in bytes raw and gzip-compressed, how far its outputs are from eager PyTorch's
    (max absolute difference; the fraction of the ``x`` images whose top class agrees) and the torch threads."""
    raw = out.read_bytes()
    return {
        "file": str(out.resolve()),
        "ckpt": str(job.ckpt.resolve()),
        "bytes": len(raw),
        "gzip_bytes": len(gzip.compress(raw, compresslevel=9)),
        "max_abs_diff": diff,
        "checked_on": f"{len(x)} test images, float32",
        "argmax_agree": float((eager_out.argmax(1) == exported_out.argmax(1)).float().mean()),
        "latency_ms": {},
        "threads": torch.get_num_threads(),
    }


def _latencies(
    model: L.LightningModule, run_exported: Callable, x: torch.Tensor, repeats: int
) -> dict[str, dict[str, float]]:
    """Median latency in milliseconds (:func:`median_ms` over ``repeats`` calls) of the exported file and of eager
    PyTorch, per batch size of :data:`LATENCY_BATCHES` (``x``'s images repeated when it has fewer):
    ``{"batch_<n>": {"exported": ms, "eager": ms}}``."""
    latency = {}
    for n in LATENCY_BATCHES:
        xb = x[:n] if len(x) >= n else x[torch.arange(n) % len(x)]
        latency[f"batch_{n}"] = {
            "exported": round(median_ms(run_exported, xb, repeats), 4),
            "eager": round(median_ms(model, xb, repeats), 4),
        }
    return latency


def _add_to_export_json(run: Path, fmt: str, record: dict[str, Any]) -> Path:
    """Set ``fmt``'s record in the run's ``export.json`` (the other formats' records kept; an unreadable file is
    started afresh), written atomically; returns its path."""
    path = run / layout.EXPORT
    try:
        existing = read.read_json(path, what=layout.EXPORT) if path.is_file() else {}
    except UnreadableFile:
        existing = {}
    existing = existing if isinstance(existing, dict) else {}
    existing[fmt] = record
    files.write_json(path, existing)
    return path


COMMAND = Command(
    "export",
    "Export a run's net to ONNX, TorchScript or torch.export and check it.",
    add_arguments,
    export,
    overrides=("--trainer.accelerator", "cpu", "--model.compile", "false"),
)
main = main_of(COMMAND)


if __name__ == "__main__":
    exit_with(cast("Callable[[], int]", main))  # main_of's type leaves out that argv defaults to None
