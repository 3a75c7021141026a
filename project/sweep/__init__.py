"""``python -m project.sweep``: an Optuna study whose trials are ``fit`` runs.

The study and its command line (:mod:`~project.sweep.study`), the sweep file (:mod:`~project.sweep.file`), a
trial's config (:mod:`~project.sweep.config`), a trial (:mod:`~project.sweep.trial`), the storage
(:mod:`~project.sweep.storage`), the report (:mod:`~project.sweep.report`), the warm trial server
(:mod:`~project.sweep.server`).

The face: the class path a trial's config names (``project.sweep.ReportToStudy``).
"""

from project.sweep.trial import ReportToStudy

__all__ = ["ReportToStudy"]
