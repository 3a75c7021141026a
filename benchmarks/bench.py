"""``python -m benchmarks.bench``: what each speed switch buys, measured side by side in one process.

Rows (same net, batch size and data):

1. ``raw_loop`` -- the recipes' hand-written loop (``zero_grad``, forward, loss, ``backward``, ``step``) on
   the torchvision DataLoader: the reference every ratio is taken against;
2. ``lightning`` -- ``Trainer.fit`` on the same DataLoader;
3. ``lightning_in_memory`` -- ``Trainer.fit`` on the in-memory path (``data.in_memory``);
4. variants of row 3: mixed/bf16 precision, ``benchmark``, ``channels_last``, ``compile``, 50 % pruned
   (``pruned_50``: L1 unstructured, masks applied every forward), structurally pruned (``slim``: the net
   ``--slim_config`` slims to, e.g. LeNet 20/50/500 -> 13/34/340 with ``configs/slim.yaml``);
5. ``data_torchvision`` / ``data_in_memory`` -- batches drawn with no model at all;
6. ``infer_<net>_<batch>`` -- eager CPU/GPU inference (``eval()``, ``torch.inference_mode``) of the dense,
   the 50 % unstructured (masks made permanent, as ``fit`` leaves it) and the slimmed net at batch 1 and 256,
   in the config's memory format; ``ms/step`` is the latency of one batch. Batch-1 rows time 10x ``--steps``
   calls.

Each segment runs ``--warmup`` untimed steps, then ``--steps`` timed ones; every row runs ``--repeats``
times, interleaved with the other rows, and the median is reported. Per row: training samples/s, ms per
step, peak memory in MiB (process RSS on CPU, reset before each segment where Linux allows;
``torch.cuda.max_memory_allocated`` on GPU) and the ratio to its reference: row 1 for training rows,
``data_torchvision`` for data-only rows, the dense net at the same batch size for inference rows. Prints a
table and writes ``bench.json`` (rows with their settings) and ``bench.md`` (the same table in Markdown, and
the dense / unstructured / structured comparison when those rows ran).

Real data is used when ``--data_dir`` holds it (or ``--source_dir`` can import it); otherwise synthetic
images of the right shape (uint8 noise decoded through PIL exactly like the torchvision datasets).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from jsonargparse import ArgumentError
from PIL import Image
from torch.nn.utils import prune
from torch.utils.data import Dataset

from benchmarks.report import write_report
from project import data as data_mod
from project.callbacks.slim import StructuredPruning, slim
from project.callbacks.training import synced_time
from project.cli.entry import exit_with
from project.cli.parse_errors import explain_parse_error
from project.cli.parser import ProjectCLI
from project.errors import ArgumentParser, DataError, UserError
from project.module import ImageClassifier
from project.nets import macs_per_sample, train_flops_per_sample

log = logging.getLogger("benchmarks.bench")

ALL_ROWS = [
    "raw_loop",
    "lightning",
    "lightning_in_memory",
    "mixed_precision",
    "bf16_true",
    "benchmark",
    "channels_last",
    "compile",
    "pruned_50",
    "slim",
    "data_torchvision",
    "data_in_memory",
    "infer_dense_1",
    "infer_dense_256",
    "infer_pruned_50_1",
    "infer_pruned_50_256",
    "infer_slim_1",
    "infer_slim_256",
]
INFER_BATCHES = (1, 256)


class SyntheticImages(Dataset):
    """Random uint8 images served like torchvision's MNIST/CIFAR10: ``.data``, ``.targets``, PIL + transform."""

    def __init__(self, n: int, shape: tuple[int, int, int], transform: Any, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        c, h, w = shape
        self.data = torch.randint(0, 256, (n, h, w) if c == 1 else (n, h, w, c), dtype=torch.uint8, generator=g)
        self.targets = torch.randint(0, 10, (n,), generator=g)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = Image.fromarray(self.data[i].numpy(), mode="L" if self.data.ndim == 3 else "RGB")
        return self.transform(img), int(self.targets[i])


def peak_memory_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    # Linux: writing 5 to clear_refs resets the peak RSS (VmHWM) of this process.
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_memory_mib(device: torch.device) -> float:
    """Peak memory since the last reset, MiB: CUDA allocator peak on GPU, process peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gemm_gflops(device: torch.device, dtype: torch.dtype, n: int | None = None, reps: int = 10) -> float:
    """The machine's matmul ceiling: GFLOP/s of an (n x n) @ (n x n) product in ``dtype`` (2 n^3 FLOPs each).

    ``n`` defaults to 1024 on a CPU and 8192 on a GPU; the best of ``reps`` timed products after one warm-up.
    """
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = synced_time(device)
        a @ b
        best = min(best, synced_time(device) - t0)
    return 2 * n**3 / best / 1e9


class StepTimer(L.Callback):
    """Seconds between the end of step ``warmup`` and the end of the last step (device synchronized)."""

    def __init__(self, warmup: int, device: torch.device) -> None:
        self.warmup, self.device = warmup, device
        self.t0 = self.t1 = 0.0

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        step = trainer.global_step
        if step == self.warmup:
            self.t0 = synced_time(self.device)
        elif step > self.warmup:
            self.t1 = synced_time(self.device)


class Bench:
    """Builds the data module and model of one config and times each row (see the module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        # The experiment as fit would run it: same parser, same defaults, same checks.
        cli = ProjectCLI(["--config", args.config, "--trainer.logger", "false"], prog="python -m benchmarks.bench")
        self.net = cli.model.hparams.net
        self.num_classes = cli.model.hparams.num_classes
        self.channels_last = bool(cli.model.hparams.channels_last)
        self.slim_config = args.slim_config
        self._slim_widths: dict[str, list[int]] | None = None
        self.optimizer = cli.model.optimizer
        self.optimizer_name = type(self.optimizer([torch.nn.Parameter(torch.zeros(1))])).__name__
        self.data_cls = type(cli.datamodule)
        init = dict(cli.datamodule.hparams)
        self.batch_size = args.batch_size or init.get("batch_size", 64)
        self.args = args
        want_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        if args.device == "cuda" and not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA device is available; use --device cpu or auto")
        self.device = torch.device("cuda" if want_cuda else "cpu")
        # On a CPU, loader workers take cores from the compute threads (measured on 2 cores: the raw loop ran
        # 2,341 samples/s with 0 workers, 2,072 with 2); on a GPU they are what keeps the device fed.
        default_workers = init.get("num_workers", 0) if want_cuda else 0
        self.num_workers = default_workers if args.num_workers is None else args.num_workers
        self.steps, self.warmup, self.repeats = args.steps, args.warmup, args.repeats
        self.gemm_size: int | None = args.gemm_size
        self.dm_kwargs = dict(
            data_dir=args.data_dir,
            source_dir=args.source_dir,
            download=False,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            pin_memory=self.device.type == "cuda",
            persistent_workers=self.num_workers > 0,
            val_size=0,
        )
        self.synthetic = not self._real_data_available()

    def _real_data_available(self) -> bool:
        try:
            self.data_cls(**self.dm_kwargs).prepare_data()
            return True
        except DataError as e:
            log.info("using synthetic images (%s)", e)
            return False

    def datamodule(self, in_memory: bool) -> data_mod.VisionDataModule:
        dm = self.data_cls(**{**self.dm_kwargs, "in_memory": in_memory})
        if self.synthetic:
            n = (self.warmup + self.steps + 1) * self.batch_size
            shape = self.data_cls.input_shape
            dm.prepare_data = lambda: None
            dm.verify = lambda md5=True: None
            dm.make_dataset = lambda train, transform: SyntheticImages(n, shape, transform, seed=int(train))
        return dm

    def model(self, **kw: Any) -> ImageClassifier:
        return ImageClassifier(net=self.net, optimizer=self.optimizer, **kw)

    # -- rows -----------------------------------------------------------------------------------
    def raw_loop(self) -> float:
        """The recipes' loop; returns seconds for ``steps`` timed steps."""
        dm = self.datamodule(in_memory=False)
        dm.setup("fit")
        loader = dm.train_dataloader()
        net = self.model().net.to(self.device)
        opt = self.optimizer(net.parameters())
        t0 = 0.0
        it = iter(loader)
        for step in range(self.warmup + self.steps):
            x, y = next(it)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            loss.item()  # the recipes print the running loss; Lightning's progress bar reads it too
            if step == self.warmup - 1:
                t0 = synced_time(self.device)
        return synced_time(self.device) - t0

    def lightning(
        self, in_memory: bool, pruned: bool = False, trainer_kw: dict | None = None, **model_kw: Any
    ) -> float:
        dm = self.datamodule(in_memory=in_memory)
        model = self.model(**model_kw)
        if pruned:
            for m in model.net.modules():
                if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                    prune.l1_unstructured(m, "weight", amount=0.5)
        timer = StepTimer(self.warmup, self.device)
        trainer = L.Trainer(
            accelerator=self.device.type,
            devices=1,
            max_steps=self.warmup + self.steps,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[timer],
            **(trainer_kw or {}),
        )
        trainer.fit(model, datamodule=dm)
        return timer.t1 - timer.t0

    @property
    def slim_widths(self) -> dict[str, list[int]]:
        """The widths ``--slim_config``'s StructuredPruning leaves the config's net with (its final step)."""
        if self._slim_widths is None:
            cli = ProjectCLI(
                ["--config", self.args.config, "--config", self.slim_config, "--trainer.logger", "false"],
                prog="python -m benchmarks.bench",
            )
            cb = next((c for c in cli.trainer.callbacks if isinstance(c, StructuredPruning)), None)
            if cb is None:
                raise UserError(
                    f"--slim_config {self.slim_config}: it configures no project.callbacks.StructuredPruning"
                )
            net = self.model().net
            cb.reference(net)
            slim(net, cb.keep_at(cb.end_epoch), cb.norm, cb.layer_types)
            self._slim_widths = net.widths()
        return self._slim_widths

    def inference(self, kind: str, batch: int) -> float:
        """Seconds for ``steps`` (batch 1: 10x ``steps``) eager forward passes of one batch in eval mode."""
        net = self.model(widths=self.slim_widths if kind == "slim" else None).net.to(self.device).eval()
        if kind == "pruned_50":
            for m in net.modules():
                if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                    prune.l1_unstructured(m, "weight", amount=0.5)
                    prune.remove(m, "weight")  # permanent, as fit's Pruning leaves the net: zeros in dense tensors
        x = torch.randn(batch, *self.data_cls.input_shape, device=self.device)
        if self.channels_last:
            net.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        steps = self.infer_steps(batch)
        with torch.inference_mode():
            for _ in range(self.warmup):
                net(x)
            t0 = synced_time(self.device)
            for _ in range(steps):
                net(x)
            return synced_time(self.device) - t0

    def nets(self, with_slim: bool) -> dict[str, dict[str, Any]]:
        """Parameters (and nonzero ones), MACs per sample and widths of the dense, 50 % pruned and slimmed nets."""
        dense = self.model().net
        params = sum(p.numel() for p in dense.parameters())
        macs = macs_per_sample(self.net, self.num_classes, None)
        out = {
            "dense": {"params": params, "nonzero_params": params, "macs_per_sample": macs, "widths": dense.widths()},
            # l1_unstructured(amount=0.5) prunes round(0.5 * n) weights of each tensor; biases are kept
            "pruned_50": {
                "params": params,
                "macs_per_sample": macs,
                "widths": dense.widths(),
                "nonzero_params": params
                - sum(
                    round(0.5 * m.weight.numel())
                    for m in dense.modules()
                    if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))
                ),
            },
        }
        if with_slim:
            net = self.model(widths=self.slim_widths).net
            n = sum(p.numel() for p in net.parameters())
            macs = macs_per_sample(self.net, self.num_classes, self.slim_widths)
            out["slim"] = {"params": n, "nonzero_params": n, "macs_per_sample": macs, "widths": self.slim_widths}
        return out

    def infer_steps(self, batch: int) -> int:
        return self.steps * (10 if batch == 1 else 1)

    def data_only(self, in_memory: bool) -> float:
        dm = self.datamodule(in_memory=in_memory)
        dm.setup("fit")
        if in_memory:  # keep the tensors on the bench device, as training would
            dm._device = lambda: self.device  # type: ignore[method-assign]
        loader = dm.train_dataloader()
        it = iter(loader)
        t0 = 0.0
        for step in range(self.warmup + self.steps):
            x, _ = next(it)
            if step == self.warmup - 1:
                t0 = synced_time(self.device)
        return synced_time(self.device) - t0

    def row_fn(self, name: str) -> tuple[dict[str, Any], Any]:
        mixed = "16-mixed" if self.device.type == "cuda" else "bf16-mixed"
        table: dict[str, tuple[dict[str, Any], Any]] = {
            "raw_loop": ({"loop": "raw", "data": "torchvision"}, self.raw_loop),
            "lightning": ({"loop": "lightning", "data": "torchvision"}, lambda: self.lightning(False)),
            "lightning_in_memory": ({"loop": "lightning", "data": "in_memory"}, lambda: self.lightning(True)),
            "mixed_precision": (
                {"data": "in_memory", "precision": mixed},
                lambda: self.lightning(True, trainer_kw={"precision": mixed}),
            ),
            "bf16_true": (
                {"data": "in_memory", "precision": "bf16-true"},
                lambda: self.lightning(True, trainer_kw={"precision": "bf16-true"}),
            ),
            "benchmark": (
                {"data": "in_memory", "benchmark": True},
                lambda: self.lightning(True, trainer_kw={"benchmark": True}),
            ),
            "channels_last": (
                {"data": "in_memory", "channels_last": True},
                lambda: self.lightning(True, channels_last=True),
            ),
            "compile": ({"data": "in_memory", "compile": True}, lambda: self.lightning(True, compile=True)),
            "pruned_50": ({"data": "in_memory", "pruned": 0.5}, lambda: self.lightning(True, pruned=True)),
            "slim": (
                {"data": "in_memory", "widths": self.slim_widths} if name == "slim" else {},
                lambda: self.lightning(True, widths=self.slim_widths),
            ),
            "data_torchvision": ({"loop": "data only", "data": "torchvision"}, lambda: self.data_only(False)),
            "data_in_memory": ({"loop": "data only", "data": "in_memory"}, lambda: self.data_only(True)),
        }
        for kind in ("dense", "pruned_50", "slim"):
            for batch in INFER_BATCHES:
                settings = {
                    "loop": "inference",
                    "batch_size": batch,
                    "steps": self.infer_steps(batch),
                    "channels_last": self.channels_last,
                }
                if kind == "pruned_50":
                    settings["pruned"] = 0.5
                if kind == "slim" and name == f"infer_slim_{batch}":
                    settings["widths"] = self.slim_widths
                table[f"infer_{kind}_{batch}"] = (settings, lambda k=kind, b=batch: self.inference(k, b))
        return table[name]

    def add_ceiling(self, results: list[dict[str, Any]]) -> None:
        """Each model row's achieved GFLOP/s and its fraction of the measured GEMM ceiling of its dtype.

        Training rows count forward + backward FLOPs of their net (:func:`project.nets.train_flops_per_sample`),
        inference rows the forward pass (2 FLOPs per multiply-accumulate, :func:`project.nets.macs_per_sample`).
        A pruned row counts the dense net's FLOPs: the zeros are multiplied all the same. The fp32 ceiling is the
        best of the GEMMs timed after every round of rows (:meth:`run`), so that a slow phase of a shared machine
        cannot lower it; the fp16/bf16 one is timed once here (emulated bf16 takes seconds per product on a CPU).
        """
        flops = train_flops_per_sample(self.net, self.num_classes, None)
        low = torch.float16 if self.device.type == "cuda" else torch.bfloat16
        self.ceiling = {
            "fp32": max(self.fp32_gemm, default=0.0) or gemm_gflops(self.device, torch.float32, self.gemm_size),
            str(low).split(".")[-1]: gemm_gflops(self.device, low, self.gemm_size),
        }
        self.flops_per_sample = flops
        for r in results:
            if r["row"].startswith("data_"):
                r["gflops"] = r["ceiling_fraction"] = None
                continue
            widths = r["settings"].get("widths")
            if r["row"].startswith("infer_"):
                row_flops = 2 * macs_per_sample(self.net, self.num_classes, widths)
            elif widths is not None:
                row_flops = train_flops_per_sample(self.net, self.num_classes, widths)
            else:
                row_flops = flops
            precision = str(r["settings"].get("precision", "32-true"))
            key = "fp32" if precision.startswith("32") else str(low).split(".")[-1]
            r["flops_per_sample"] = row_flops
            r["gflops"] = r["samples_per_s"] * row_flops / 1e9
            r["ceiling_fraction"] = r["gflops"] / self.ceiling[key]
            r["ceiling_dtype"] = key

    def run(self, rows: list[str]) -> list[dict[str, Any]]:
        """Time every row ``repeats`` times, interleaved (row 1, row 2, ..., row 1, ...) so that slow
        phases of a noisy machine hit all rows alike; report the median per row."""
        fns = {name: self.row_fn(name) for name in rows}
        times: dict[str, list[float]] = {name: [] for name in rows}
        peaks: dict[str, float] = dict.fromkeys(rows, 0.0)
        self.fp32_gemm: list[float] = []
        for _ in range(self.repeats):
            for name in rows:
                gc.collect()  # shut down the previous segment's DataLoader workers before timing the next
                peak_memory_reset(self.device)
                times[name].append(fns[name][1]())
                peaks[name] = max(peaks[name], peak_memory_mib(self.device))
            self.fp32_gemm.append(gemm_gflops(self.device, torch.float32, self.gemm_size))  # the ceiling, once a round
        results: list[dict[str, Any]] = []
        for name in rows:
            seconds = statistics.median(times[name])
            steps = fns[name][0].get("steps", self.steps)
            batch = fns[name][0].get("batch_size", self.batch_size)
            row = {
                "row": name,
                "samples_per_s": steps * batch / seconds,
                "ms_per_step": 1000 * seconds / steps,
                "peak_mem_mib": peaks[name],
                "repeats_s": times[name],
                "settings": {
                    "net": self.net,
                    "optimizer": self.optimizer_name,
                    "dataset": self.data_cls.dataset_cls.__name__,
                    "synthetic": self.synthetic,
                    "batch_size": self.batch_size,
                    "num_workers": self.num_workers,
                    "device": str(self.device),
                    "precision": "32-true",
                    **fns[name][0],
                },
            }
            results.append(row)
            log.info("%-20s %10.0f samples/s %8.2f ms/step", name, row["samples_per_s"], row["ms_per_step"])
        self.add_ceiling(results)
        # Training rows compare with the raw recipe loop, data-only rows with the torchvision DataLoader, inference
        # rows with the dense net at the same batch size.
        speed = {r["row"]: r["samples_per_s"] for r in results}
        for r in results:
            if r["row"].startswith("infer_"):
                r["reference"] = f"infer_dense_{r['settings']['batch_size']}"
            else:
                r["reference"] = "data_torchvision" if r["row"].startswith("data_") else "raw_loop"
            ref = speed.get(r["reference"])
            r["ratio"] = r["samples_per_s"] / ref if ref else None
        return results


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| row | samples/s | ms/step | peak MiB | × reference | GFLOP/s | of GEMM ceiling |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = f"{r['ratio']:.2f} ({r['reference']})" if r["ratio"] else "-"
        gflops = f"{r['gflops']:.1f}" if r.get("gflops") else "-"
        frac = f"{100 * r['ceiling_fraction']:.1f} % ({r['ceiling_dtype']})" if r.get("ceiling_fraction") else "-"
        lines.append(
            f"| {r['row']} | {r['samples_per_s']:,.0f} | {r['ms_per_step']:.2f} | {r['peak_mem_mib']:,.0f} | {ratio} "
            f"| {gflops} | {frac} |"
        )
    return "\n".join(lines) + "\n"


# label, training row, inference-row prefix, key in Bench.nets()
PRUNING_KINDS = [
    ("dense", "lightning_in_memory", "infer_dense", "dense"),
    ("unstructured 50 %", "pruned_50", "infer_pruned_50", "pruned_50"),
    ("structured", "slim", "infer_slim", "slim"),
]


def pruning_markdown(rows: list[dict[str, Any]], nets: dict[str, dict[str, Any]]) -> str:
    """Dense vs 50 % unstructured vs structured side by side: size, MACs, training speed, inference latency.

    Speed-ups (×) are against the dense net: training samples/s, and latency at the same batch size (dense ms
    / row ms). A row that did not run shows ``-``.
    """
    by = {r["row"]: r for r in rows}

    def cell(row: str, ref: str, latency: bool) -> str:
        if row not in by:
            return "-"
        text = f"{by[row]['ms_per_step']:.2f} ms" if latency else f"{by[row]['samples_per_s']:,.0f}"
        if ref not in by:
            return text
        return f"{text} ({by[row]['samples_per_s'] / by[ref]['samples_per_s']:.2f}×)"

    head = " | ".join(f"inference latency, batch {b}" for b in INFER_BATCHES)
    lines = [
        f"| net | params (nonzero) | MACs/sample | training samples/s | {head} |",
        "|---|---:|---:|---:|" + "---:|" * len(INFER_BATCHES),
    ]
    for label, train_row, infer, key in PRUNING_KINDS:
        net = nets[key]
        name = label + (" " + "/".join(str(w) for ws in net["widths"].values() for w in ws) if key == "slim" else "")
        latency = " | ".join(cell(f"{infer}_{b}", f"infer_dense_{b}", True) for b in INFER_BATCHES)
        lines.append(
            f"| {name} | {net['params']:,} ({net['nonzero_params']:,}) | {net['macs_per_sample']:,} "
            f"| {cell(train_row, 'lightning_in_memory', False)} | {latency} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/mnist.yaml", help="experiment config: net, data module, batch size")
    p.add_argument("--data_dir", default="data", help="where the data set is (used if present)")
    p.add_argument("--source_dir", default=None, help="original archives to import offline")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--steps", type=int, default=50, help="timed steps per segment")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before each segment")
    p.add_argument("--repeats", type=int, default=5, help="segments per row; the median is reported")
    p.add_argument("--batch_size", type=int, default=None, help="default: the config's")
    p.add_argument("--num_workers", type=int, default=None, help="loader workers; default: config on GPU, 0 on CPU")
    p.add_argument("--rows", nargs="+", choices=ALL_ROWS, default=ALL_ROWS, metavar="ROW", help=" ".join(ALL_ROWS))
    p.add_argument(
        "--slim_config",
        default="configs/slim.yaml",
        help="overlay with the StructuredPruning whose final widths the slim rows use",
    )
    p.add_argument(
        "--gemm_size",
        type=int,
        default=None,
        help="n of the n x n GEMMs timed as the matmul ceiling; default 1024 on a CPU, 8192 on a GPU (smaller: "
        "faster, a lower ceiling)",
    )
    p.add_argument("--out", default="bench.json", help="JSON output; a .md table is written beside it")
    args = p.parse_args(argv)
    for key in ("steps", "warmup", "repeats", *(["gemm_size"] if args.gemm_size is not None else [])):
        if getattr(args, key) < 1:
            p.error(f"--{key} must be >= 1")
    if args.config and not Path(args.config).is_file():
        p.error(f"--config {args.config} does not exist")
    if any("slim" in row for row in args.rows) and not Path(args.slim_config).is_file():
        p.error(f"--slim_config {args.slim_config} does not exist")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.bench``; returns the exit status."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    args = parse_args(argv)
    try:
        bench = Bench(args)
        rows = bench.run(args.rows)
    except ArgumentError as e:
        print(f"error: {explain_parse_error(e)}", file=sys.stderr)
        return 2
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    when = time.strftime("%Y-%m-%d")
    cpu = f"CPU ({torch.get_num_threads()} threads)"
    where = torch.cuda.get_device_name(bench.device) if bench.device.type == "cuda" else cpu
    synthetic = " (synthetic)" if bench.synthetic else ""
    header = (
        f"{bench.net} / {bench.data_cls.dataset_cls.__name__}{synthetic}, batch {bench.batch_size}, "
        f"{args.steps} steps × {args.repeats} (median), {where}, torch {torch.__version__}, {when}; "
        f"training {bench.flops_per_sample / 1e6:.1f} MFLOP/sample; GEMM ceiling "
        + ", ".join(f"{k} {v:,.0f} GFLOP/s" for k, v in bench.ceiling.items())
    )
    nets = bench.nets(with_slim=any("slim" in row for row in args.rows))
    table = markdown(rows, header)
    comparison = pruning_markdown(rows, nets) if "slim" in nets else ""
    if comparison:
        table += "\nDense vs pruned (× = speed relative to the dense net):\n\n" + comparison
    meta = {
        "flops_per_sample": bench.flops_per_sample,
        "gemm_gflops": bench.ceiling,
        "fp32_gemm_gflops_per_round": bench.fp32_gemm,
        "gemm_size": bench.gemm_size or (8192 if bench.device.type == "cuda" else 1024),
        "nets": nets,
    }
    write_report(Path(args.out), {"header": header, **meta, "rows": rows}, table)
    return 0


if __name__ == "__main__":
    exit_with(main)
