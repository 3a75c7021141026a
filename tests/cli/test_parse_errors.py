"""A refused command line or config file is one line built from jsonargparse's exception chain and the type the
parser declares for the key (issue #25: errors from types and exceptions, not from matching whole messages)."""

from __future__ import annotations

import pytest
from jsonargparse import ArgumentError, ArgumentParser
from jsonargparse.typing import PositiveInt

from project.cli.entry import _exit_status
from project.cli.parse_errors import ParseError, _chain, _said, explain_parse_error
from project.cli.parser import ProjectCLI

BASE = ["--data", "project.data.MNISTDataModule", "--model.optimizer", "torch.optim.SGD"]
PRUNING = "--trainer.callbacks+=project.callbacks.Pruning"

KINDS = [
    # a bad int: the expected type is the declared Optional[int], not the first Union member the message names
    (["--trainer.max_epochs", "ten"], "trainer.max_epochs: invalid value 'ten'; expected int or null"),
    (["--checkpoint.every_n_epochs", "x"], "checkpoint.every_n_epochs: invalid value 'x'; expected int or null"),
    # a bad Literal, at the top and inside a class given by class_path
    (
        ["--model.net", "resnet"],
        "model.net: invalid value 'resnet'; expected one of 'lenet', 'simple_cnn' or a class path of a torch.nn.Module",
    ),
    (
        [PRUNING, "--trainer.callbacks.method", "x"],
        "trainer.callbacks.method: invalid value 'x'; expected one of 'l1_unstructured', 'random_unstructured', "
        "'ln_structured'",
    ),
    # a restricted type: its name and its rule
    (["--data.batch_size", "0"], "data.batch_size: 0 is not a PositiveInt (needs v>0)"),
    (["--data.num_workers", "-1"], "data.num_workers: -1 is not a NonNegativeInt (needs v>=0)"),
    (
        [PRUNING, "--trainer.callbacks.amount", "2"],
        "trainer.callbacks.amount: 2 is not a PruningAmount (needs v>=0 and v<1)",
    ),
    (
        [PRUNING, "--trainer.callbacks.end_epoch", "-1"],
        "trainer.callbacks.end_epoch: -1 is not a NonNegativeInt or null (needs v>=0)",
    ),
    (
        ["--data.batch_size", "abc"],
        "data.batch_size: invalid literal for int() with base 10: 'abc' (expected PositiveInt)",
    ),
    # a nested init argument of a class given by class_path (bool is no restricted int)
    (["--data.in_memory", "maybe"], "data.in_memory: invalid value 'maybe'; expected bool"),
    (
        [PRUNING, "--trainer.callbacks.layers", "[Conv3d]"],
        "trainer.callbacks.layers: invalid value 'Conv3d'; expected a list of (one of 'Conv2d', 'Linear') or null",
    ),
    (["--model.optimizer.init_args.lr", "abc"], "model.optimizer.lr: invalid value 'abc'; expected float"),
    # a class path Python cannot import: the module named, and the two ways to make it importable
    *[
        (
            [key, path],
            f"{key[2:].rstrip('+')}: cannot import no_such_pkg (No module named 'no_such_pkg'): install the package "
            "that holds it, or put the folder that holds it on PYTHONPATH",
        )
        for key, path in [
            ("--model.net", "no_such_pkg.nets.MyNet"),
            ("--model.optimizer", "no_such_pkg.Opt"),
            ("--trainer.callbacks+", "no_such_pkg.Callback"),
        ]
    ],
    (["--model.net", "torch.nn.NoSuchNet"], "model.net: module 'torch.nn' has no attribute 'NoSuchNet'"),
    # an unknown option
    (["--model.lrr", "0.1"], "unrecognized arguments: --model.lrr 0.1; did you mean --model.optimizer.lr?"),
]


def refusal(args: list[str]) -> ArgumentError:
    with pytest.raises(ArgumentError) as info:
        ProjectCLI([*BASE, *args])
    return info.value


@pytest.mark.parametrize(("args", "line"), KINDS, ids=[" ".join(k[0])[-40:] for k in KINDS])
def test_each_kind_of_refusal_is_one_line_naming_the_whole_key(args, line):
    error = refusal(args)
    assert isinstance(error, ParseError) and error.parser is not None
    assert explain_parse_error(error) == line


def test_a_misspelled_yaml_key_names_the_key_the_class_and_where_its_options_are(tmp_path):
    (tmp_path / "typo.yaml").write_text("data:\n  init_args:\n    batch_sise: 64\n")
    (tmp_path / "float.yaml").write_text("data:\n  init_args:\n    batch_size: 12.5\n")
    (tmp_path / "model.yaml").write_text("model:\n  lrr: 0.1\n")
    cls = "project.data.MNISTDataModule"
    assert explain_parse_error(refusal(["--config", str(tmp_path / "typo.yaml")])) == (
        f"data.batch_sise: {cls} has no such option (its options: --data.help {cls}); "
        f"data.batch_sise in {tmp_path / 'typo.yaml'}, line 3; did you mean data.batch_size?"
    )
    assert explain_parse_error(refusal(["--config", str(tmp_path / "float.yaml")])) == (
        "data.batch_size: 12.5 not an integer (expected PositiveInt)"
    )
    assert explain_parse_error(refusal(["--config", str(tmp_path / "model.yaml")])) == (
        f"Group 'model' does not accept option 'lrr'; model.lrr in {tmp_path / 'model.yaml'}, line 2; "
        "did you mean model.optimizer.lr?"
    )


class Base:
    pass


class Inner(Base):
    def __init__(self, size: PositiveInt = 1, mode: str = "a") -> None:
        self.size, self.mode = size, mode


def test_the_words_read_from_jsonargparse_are_still_its_words():
    """jsonargparse keeps the key, the class path, the unknown option and the given value only in its messages:
    ``_said`` reads each from one exception of the chain. A rewording in a new jsonargparse fails here."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--inner", type=Base)
    parser.add_argument("--n", type=int | None)
    with pytest.raises(ArgumentError) as info:
        parser.parse_args(["--inner", f'{{"class_path": "{__name__}.Inner", "init_args": {{"size": -3}}}}'])
    said = [_said(e) for e in _chain(info.value)]
    assert [s.key for e, s in zip(_chain(info.value), said) if isinstance(e, TypeError) and s.key] == ["inner", "size"]
    assert [s.class_path for s in said if s.class_path] == [f"{__name__}.Inner"]
    assert (said[-1].given, said[-1].rule) == ("-3", "v>0")
    with pytest.raises(ArgumentError) as info:
        parser.parse_args(["--inner", f'{{"class_path": "{__name__}.Inner", "init_args": {{"sise": 3}}}}'])
    chain = _chain(info.value)
    assert isinstance(chain[-1], KeyError) and _said(chain[-1]).option == "sise"
    with pytest.raises(ArgumentError) as info:
        parser.parse_args(["--n", "ten"])
    assert (_said(_chain(info.value)[-1]).given, _said(_chain(info.value)[-1]).expected) == ("ten", "int")
    assert explain_parse_error(info.value) == "n: invalid value 'ten'; expected int"  # no parser: the message's type


def test_a_value_error_jsonargparse_raises_while_parsing_is_a_bad_config():
    """Told by where it was raised, not by its text: jsonargparse's own check -> exit 2; ours -> a bug (None)."""
    with pytest.raises(ValueError) as info:
        PositiveInt(-1)
    assert _exit_status(info.value, parsing=True) == 2
    assert _exit_status(info.value, parsing=False) is None
    assert _exit_status(ValueError("Does not validate against any of the Union subtypes"), parsing=True) is None


@pytest.mark.parametrize(
    ("source", "key", "line"),
    [
        (
            "def f(:\n",
            "--model.optimizer",
            "a class path's module raised SyntaxError as it was imported (invalid syntax",
        ),
        ("raise RuntimeError('boom')\n", "--model.optimizer", "a class path's module raised RuntimeError as it was "),
        ("raise RuntimeError('boom')\n", "--model.net", "model.net: importing {pkg}.Net failed: boom; fix that module"),
        (
            "import not_installed_xyz\n",
            "--model.net",
            "model.net: importing {pkg}.Net failed: it imports not_installed_xyz (No module named "
            "'not_installed_xyz'): install not_installed_xyz",
        ),
    ],
    ids=["syntax-optimizer", "raises-optimizer", "raises-net", "missing-dependency-net"],
)
def test_a_class_path_whose_module_fails_to_import_is_one_line_naming_it(
    source, key, line, tmp_path, monkeypatch, capsys
):
    """A user's package that is there but fails as it is imported: one ``error:`` line with what it raised and
    where (a ``--model.optimizer`` path's error once escaped the parser as a traceback, exit 1), not "invalid
    value" or advice to install the package that is there."""
    from project.fit import main

    pkg = f"userpkg_{key[8:11]}_{abs(hash(source)) % 10**6}"
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main([*BASE, key, f"{pkg}.{'Net' if key == '--model.net' else 'Opt'}"]) == 2
    (err,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert err.startswith(f"error: {line.format(pkg=pkg)}"), err
    if "optimizer" in key:
        assert f"{tmp_path / pkg / '__init__.py'}, line 1" in err
    assert not (tmp_path / "logs").exists()
