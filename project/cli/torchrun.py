"""``python -m project.cli.torchrun ARGS``: PyTorch's ``torchrun ARGS``, with a failed meeting of the nodes as one
line.

The image's entry point runs ``torchrun ...`` through this module (``deploy/docker/entrypoint.sh``), which is how
``deploy/kubernetes`` starts every node. Everything torchrun does is unchanged (same arguments, same agent, same
workers, same exit status), except when its agent cannot reach the other nodes: a node started alone (the other
pods pending, holding its GPUs) ends after ``--rdzv_conf=timeout=<seconds>`` with one ``error:`` line naming the
rendezvous point and the fix and exit status 1, instead of torchrun's Python traceback and torch's C++ store
logging every failed connection with a C++ stack trace. The agent's C++ log level is set to FATAL for this;
the training processes it starts get the environment as it was given (``TORCH_CPP_LOG_LEVEL`` included).
It lives in ``project.cli``, whose package imports nothing, because that level is read once, when torch loads.

A SIGTERM to torchrun (``docker stop``, a pod's deletion: through the image's tini) is passed by its agent to the
training processes, each of which saves its checkpoint and ends (``fit``'s own lines say where); then this process
ends with one line and by the same signal, as ``fit`` does, instead of the agent's traceback and exit status 1.

Raises nothing: exits 1 with the ``error:`` line for a ``torch.distributed.DistError`` (the store: a timeout
waiting for the other nodes, a refused or lost connection) or torch elastic's ``RendezvousError`` (the ``c10d``
and ``etcd`` rendezvous backends) raised by the agent; ends by the signal after torch elastic's
``SignalException`` (SIGTERM, SIGINT, SIGHUP, SIGQUIT to the agent); any other failure is torchrun's own.
"""

from __future__ import annotations

import os
import signal
import sys

LOG_LEVEL = "TORCH_CPP_LOG_LEVEL"


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv`` (default ``sys.argv[1:]``); 0 on success, 1 after a failed meeting."""
    argv = sys.argv[1:] if argv is None else argv
    given = os.environ.get(LOG_LEVEL)
    os.environ[LOG_LEVEL] = "FATAL"  # read once, when torch's C++ library loads (below): this process only
    import torch.distributed as dist
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    if given is None:
        del os.environ[LOG_LEVEL]  # the workers torchrun starts inherit this environment
    else:
        os.environ[LOG_LEVEL] = given
    try:
        torchrun.main(argv)  # torchrun's own entry: its parser, its report of a failed worker, its exit status
    except (dist.DistError, RendezvousError) as e:
        args = torchrun.parse_args(argv)
        where = args.rdzv_endpoint or f"{args.master_addr}:{args.master_port}"
        conf = dict(kv.split("=", 1) for kv in args.rdzv_conf.split(",") if "=" in kv)
        timeout = f"{conf['timeout']} s" if "timeout" in conf else "torchrun's default timeout"
        print(
            f"error: torchrun, node rank {args.node_rank} of --nnodes={args.nnodes}: the nodes did not all meet at "
            f"{where} (or lost each other) within {timeout}: {type(e).__name__}: {' '.join(str(e).split())}; start "
            "every node of the job with the same --nnodes (on Kubernetes: every pod of the Job scheduled, `kubectl "
            "get pods`), check that node 0's address and port are reachable from the others, or raise "
            "--rdzv_conf=timeout=<seconds>",
            file=sys.stderr,
        )
        return 1
    except SignalException as e:  # the agent has stopped its workers with the signal and waited for them
        name = signal.Signals(e.sigval).name
        print(f"error: torchrun stopped by {name}; its training processes got it too (a run that holds a checkpoint "
              "is kept; the lines above say where)", file=sys.stderr, flush=True)  # fmt: skip
        signal.signal(e.sigval, signal.SIG_DFL)
        os.kill(os.getpid(), e.sigval)  # end by the signal, as torchrun's caller (tini, a scheduler) expects
        return 128 + e.sigval
    return 0


if __name__ == "__main__":
    sys.exit(main())
