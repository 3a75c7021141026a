"""Tables (:mod:`~project.summary.tables`), short labels and plots (:mod:`~project.summary.plots`) over many run
folders, for ``python -m project.summarize`` and a sweep's report. Reads only files; imports no torch."""
