"""Imported only by the DataLoader fork server (a preload module): it dies with the training process.

See :mod:`project.data.workers`. Never import this module from a training process.
"""

import os

from project.data.workers import die_with_parent

# The server's pid, inherited by every worker it forks: a worker whose parent is no longer this process was
# orphaned while it started (project.data.workers.worker_init).
SERVER_PID = os.getpid()

# The server's own parent is training. Orphaned before this runs, the server still ends: multiprocessing's fork
# server loop exits when training's end of its "alive" pipe closes.
die_with_parent()
