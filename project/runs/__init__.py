"""The run folder's one owner: its layout and records (:mod:`~project.runs.layout`), new folders claimed atomically
(:mod:`~project.runs.claims`), ``--ckpt_path`` resolved to a checkpoint (:mod:`~project.runs.resume`) and every file
written whole, never through a link (:mod:`~project.runs.files`)."""
