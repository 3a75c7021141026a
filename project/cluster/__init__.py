"""Running on clusters: SLURM requeue and job records (:mod:`~project.cluster.slurm`), the DDP strategy whose
rendezvous listens on one address (:mod:`~project.cluster.ddp`).

The face: the class paths configs name (``project.cluster.SlurmRequeue``, ``project.cluster.BoundDDPStrategy``).
"""

from project.cluster.ddp import BoundDDPStrategy
from project.cluster.slurm import SlurmRequeue

__all__ = ["BoundDDPStrategy", "SlurmRequeue"]
