"""DDP's rendezvous on one address: :class:`BoundDDPStrategy`, as which every ``ddp*`` strategy name runs.

The processes of a DDP run meet at a ``torch.distributed.TCPStore`` that rank 0 serves on ``MASTER_PORT``.
Created by ``init_process_group("env://")``, as Lightning does, it listens on every interface (measured with
``ss -ltnp`` during a two-process CPU run: ``*:<MASTER_PORT>``), so anyone on the network can reach it while the
run lives, and it accepts any client; and a process whose peers never come waits for the collective timeout
(30 min) before a traceback. Here it listens on 127.0.0.1 for a single-node run, and the meeting is bounded by
its own timeout, after which the process ends with one ``error:`` line.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

from project.errors import ConfigError, RendezvousError

LOOPBACK = "127.0.0.1"


class BoundDDPStrategy(DDPStrategy):
    """Lightning's ``DDPStrategy`` whose rendezvous store listens on one address: 127.0.0.1 on a single node.

    The processes of a DDP run meet at a ``torch.distributed.TCPStore`` that rank 0 serves on
    ``MASTER_PORT``; created by ``init_process_group("env://")``, as Lightning does, it listens on every
    interface, so anyone on the network can reach it while the run lives (it accepts any client). This class
    creates the store itself, on a socket bound to ``listen_address`` (``TCPStore(master_listen_fd=...)``,
    torch's public argument), and hands it to ``init_process_group(store=...)``; Lightning then finds the
    process group ready. On one node it also points the backend's own sockets at the loopback interface
    (``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``, unless already set), which otherwise bind the address the
    host name resolves to.

    Every ``ddp*`` strategy name (``ddp``, ``ddp_spawn``, ``ddp_find_unused_parameters_true``, ...) runs as this
    class once :func:`register_strategies` ran (the CLI does), with the same options.

    The rendezvous is bounded: rank 0 waits at most ``rendezvous_timeout`` seconds for all ``world_size``
    processes to connect (``TCPStore(wait_for_workers=True)``), the others as long to reach it; then the process
    ends with one ``error:`` line (:class:`~project.errors.RendezvousError`, exit status 1) instead of holding its
    GPUs for the collective timeout. After the meeting the store's waits use the collective ``timeout`` again.

    Args:
        listen_address: the address the store binds. Default: ``127.0.0.1`` with ``num_nodes: 1``; with several
            nodes the other nodes must reach it, so by default it listens on every interface, as torch's does:
            set it to rank 0's address on the cluster network (and ``GLOO_SOCKET_IFNAME`` /
            ``NCCL_SOCKET_IFNAME`` to that network's interface). Under ``torchrun`` the store is torchrun's
            own (its ``--rdzv-endpoint`` / ``--master-addr``) and this setting is not used.
        rendezvous_timeout: seconds the processes wait for each other at the start (default 600: time for the
            other nodes' containers to start). Not used under ``torchrun``, whose agent meets its peers itself
            (``--rdzv_conf timeout=<s>``).
        **kwargs: Lightning's ``DDPStrategy`` arguments (``timeout``, ``process_group_backend``, ...).
    """

    def __init__(
        self, *args: Any, listen_address: str | None = None, rendezvous_timeout: float = 600.0, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if not rendezvous_timeout > 0:
            raise ConfigError(f"trainer.strategy.rendezvous_timeout: {rendezvous_timeout} is not > 0 (seconds)")
        self.listen_address = listen_address
        self.rendezvous_timeout = timedelta(seconds=rendezvous_timeout)
        self.collective_timeout: timedelta = kwargs.get("timeout") or dist.default_pg_timeout

    def setup_distributed(self) -> None:
        if not dist.is_initialized() and not TorchElasticEnvironment.detect():
            self.set_world_ranks()
            assert self.cluster_environment is not None  # Lightning's accelerator connector always sets one
            single = self.num_nodes == 1
            address = self.listen_address or (LOOPBACK if single else None)
            if single:
                loopback_interfaces()
            self._init_with_store(address, LOOPBACK if single else self.cluster_environment.main_address)
        super().setup_distributed()  # Lightning's own steps; it finds the process group initialized

    def _init_with_store(self, address: str | None, connect_to: str) -> None:
        """Meet the other processes at rank 0's store (bound to ``address``, or every interface when None), within
        the rendezvous timeout, and create the process group on it."""
        assert self.cluster_environment is not None  # Lightning's accelerator connector always sets one
        port = self.cluster_environment.main_port
        try:
            with c_stderr_held():
                if self.global_rank == 0 and address is not None:
                    family = socket.AF_INET6 if ":" in address else socket.AF_INET
                    server = socket.create_server((address, port), family=family)
                    store = dist.TCPStore(
                        address, port, self.world_size, True, self.rendezvous_timeout, master_listen_fd=server.detach()
                    )  # the store owns the socket now
                else:
                    master = self.global_rank == 0
                    store = dist.TCPStore(connect_to, port, self.world_size, master, self.rendezvous_timeout)
        except dist.DistError as e:
            seconds = int(self.rendezvous_timeout.total_seconds())
            where = f"{address or '*'}:{port}" if self.global_rank == 0 else f"{connect_to}:{port}"
            raise RendezvousError(
                f"rank {self.global_rank}: the {self.world_size} processes of this run ({self.num_nodes} node(s) x "
                f"{self.num_processes} device(s)) did not all meet at {where} within {seconds} s "
                f"({type(e).__name__}); start every node of the job with the same --trainer.num_nodes and "
                "--trainer.devices, check that rank 0's address and port are reachable from the others, or raise "
                "--trainer.strategy.rendezvous_timeout"
            ) from None
        store.set_timeout(self.collective_timeout)  # later waits on the store (NCCL's first meeting) as collectives
        cuda = self.root_device.type == "cuda"
        backend = self.process_group_backend or ("nccl" if cuda else "gloo")
        dist.init_process_group(
            backend,
            store=store,
            rank=self.global_rank,
            world_size=self.world_size,
            timeout=self.collective_timeout,
            device_id=self.root_device if cuda else None,
        )
        atexit.register(destroy_process_group)


@contextlib.contextmanager
def c_stderr_held() -> Iterator[None]:
    """Hold what is written to this process's stderr (file descriptor 2) meanwhile: replayed if the block
    succeeds, dropped if it raises. torch's C++ store logs each failed attempt to reach rank 0 there, with a C++
    stack trace; a failed meeting is said by the :class:`~project.errors.RendezvousError` line instead."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        met = False
        try:
            yield
            met = True
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if met:
                held.seek(0)
                sys.stderr.buffer.write(held.read())
                sys.stderr.flush()


def destroy_process_group() -> None:
    """At exit, as Lightning does for the process groups it creates (NCCL warns about one left behind)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def loopback_interfaces() -> None:
    """Let gloo and NCCL open their sockets on the loopback interface (``lo``/``lo0``), unless told otherwise."""
    names = {name for _, name in socket.if_nameindex()}
    lo = next((n for n in ("lo", "lo0") if n in names), None)
    if lo is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)


def register_strategies() -> None:
    """Make every ``ddp*`` strategy name of Lightning's registry (``ddp``, ``ddp_spawn``,
    ``ddp_find_unused_parameters_true``, ...) build :class:`BoundDDPStrategy` with the same options. Called by
    :class:`project.cli.parser.ProjectCLI`; calling it again changes nothing."""
    for name in list(StrategyRegistry):
        entry = StrategyRegistry[name]
        if entry["strategy"] is DDPStrategy:
            StrategyRegistry.register(
                name, BoundDDPStrategy, description=entry["description"], override=True, **entry["init_params"]
            )
