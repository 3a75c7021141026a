"""``python -m project.sweep``: see :mod:`project.sweep.study`."""

import sys

from project.sweep.study import main

if __name__ == "__main__":
    sys.exit(main())
