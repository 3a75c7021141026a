"""The command line every command shares: the parser (:mod:`~project.cli.parser`), its config checks
(:mod:`~project.cli.checks`), the process entry and exit (:mod:`~project.cli.entry`), jsonargparse's errors as one
line (:mod:`~project.cli.parse_errors`), the run-folder commands' shared piece (:mod:`~project.cli.commands`) and
torchrun with a failed meeting of the nodes as one line (:mod:`~project.cli.torchrun`). This package's own module
imports nothing: :mod:`~project.cli.torchrun` must set torch's C++ log level before torch loads."""
