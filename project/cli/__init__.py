"""The command line every command shares: the parser (:mod:`~project.cli.parser`), its config checks
(:mod:`~project.cli.checks`), the process entry and exit (:mod:`~project.cli.entry`), jsonargparse's errors as one
line (:mod:`~project.cli.parse_errors`) and the run-folder commands' shared piece (:mod:`~project.cli.commands`)."""
