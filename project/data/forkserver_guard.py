"""Imported only by the DataLoader fork server (a preload module): it dies with the training process.

See :mod:`project.data.workers`. Never import this module from a training process.
"""

from project.data.workers import die_with_parent

die_with_parent()
