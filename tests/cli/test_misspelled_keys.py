"""A misspelled key names the fix (project.cli.parse_errors.misspelling_hint): on the command line and in a
``--config`` file (with the file and line), for the Trainer's own keys, a class's init arguments and keys that skip a
level, one at a time or several: one ``error:`` line, exit status 2, nothing written, nothing printed."""

from __future__ import annotations

import pytest
from helpers import REPO, run_main

BASE = ["--config", str(REPO / "configs/mnist.yaml")]

# (the command line after BASE, files to write {name: text}, what the one error line must hold)
CASES = {
    "trainer key": (["--trainer.max_epoch", "1"], {}, ["did you mean --trainer.max_epochs?"]),
    "trainer key=value": (["--trainer.max_epoch=1"], {}, ["did you mean --trainer.max_epochs?"]),
    "init argument": (["--data.batch_sise", "3"], {}, ["did you mean --data.batch_size?"]),
    "a level skipped": (["--model.lr", "0.1"], {}, ["did you mean --model.optimizer.lr?"]),
    "nested init argument": (["--model.optimizer.lrr", "0.1"], {}, ["did you mean --model.optimizer.lr?"]),
    "file: trainer key": (
        ["--config", "bad.yaml"],
        {"bad.yaml": "seed_everything: 1\ntrainer:\n  max_epoch: 1\n"},
        ["trainer.max_epoch in bad.yaml, line 3", "did you mean trainer.max_epochs?"],
    ),
    "file: init argument under init_args": (
        ["--config", "bad.yaml"],
        {"bad.yaml": "data:\n  init_args:\n    batch_sise: 64\n"},
        ["data.batch_sise in bad.yaml, line 3", "did you mean data.batch_size?"],
    ),
    "several at once": (
        ["--trainer.max_epoch", "1", "--config", "bad.yaml"],
        {"bad.yaml": "model:\n  init_args:\n    optimizer:\n      init_args:\n        lrr: 0.1\n"},
        [
            "--trainer.max_epoch: did you mean --trainer.max_epochs?",
            "model.optimizer.lrr in bad.yaml, line 5; did you mean model.optimizer.lr?",
        ],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_misspelled_key_names_where_it_stands_and_the_closest_key(case, tmp_path, monkeypatch, capsys):
    args, files, wanted = CASES[case]
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert run_main([*BASE, *args, "--print_config"]) == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    for want in wanted:
        assert want in lines[0], lines[0]
    assert out == ""  # --print_config printed nothing for a refused command
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)  # nothing written


def test_no_guess_where_nothing_is_close(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_main([*BASE, "--zzzz", "3"]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert line == "error: unrecognized arguments: --zzzz 3 (see --help)"
