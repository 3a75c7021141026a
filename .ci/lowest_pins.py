"""Print ``name==<lower bound>`` for every runtime dependency of ``pyproject.toml`` (pip constraints): the lowest
versions the project says it supports, which ``.ci/lowest`` installs and tests."""

import re
import sys
import tomllib

project = tomllib.load(open(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml", "rb"))["project"]
for requirement in project["dependencies"]:
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([0-9][^,;\s]*).*", requirement)
    if match is None:
        sys.exit(f"{requirement}: no lower bound (>=) to test")
    print(f"{match.group(1)}=={match.group(3)}")
