"""jsonargparse's refusals as one line: :func:`explain_parse_error` turns its multi-line chain of errors into the
whole key, the value given and what the key takes (``data.batch_size: 0 is not a PositiveInt (needs v>0)``);
:class:`ParseError` carries the parser that refused, for the declared type. The entry point prints the line as
``error: ...`` with exit status 2 (:mod:`project.cli.entry`)."""

from __future__ import annotations

import enum
import importlib
import re
import types
import typing
from collections import abc
from typing import Any, NamedTuple

from jsonargparse import ArgumentError

from project.errors import UserError


class ParseError(ArgumentError):
    """jsonargparse's refusal of a command line or config file, with the parser that refused it.

    :meth:`project.cli.parser.ProjectCLI.parse_arguments` raises it from jsonargparse's ``ArgumentError`` (the
    ``__cause__``), so that :func:`explain_parse_error` can look up the type the parser declares for the key.
    """

    def __init__(self, error: ArgumentError, parser: Any) -> None:
        super().__init__(None, error.message)
        self.parser = parser


class _Said(NamedTuple):
    """The facts one exception of jsonargparse's chain holds only in its words (it has no attributes for them)."""

    key: str | None  # 'Parser key "K"' opening a TypeError: the key, relative to its parser, whose value failed
    class_path: str | None  # "Problem with given class_path 'C'": the class whose init arguments failed below it
    option: str | None  # an unknown option's KeyError: "Option 'O' is not accepted", "... does not accept option 'O'"
    given: str | None  # the value refused: "... Got value: V", "V does not conform to restriction R"
    rule: str | None  # R
    expected: str | None  # "Expected a <class 'T'>. Got value: V": T, where no declared type is at hand


# jsonargparse 4.53's wording (tests/test_parse_errors.py pins each): the key path, the class path, the unknown
# option's name and the value refused are only in its messages; its ArgumentError's ``argument_name`` is None.
_WORDS = {
    "key": re.compile(r'Parser key "([^"]+)"'),
    "class_path": re.compile(r"Problem with given class_path '([^']+)'"),
    "option": re.compile(r"option '([^']+)'", re.IGNORECASE),
    "given": re.compile(r"Got value: (.*)$|^(.*?) does not conform to restriction (.*)$"),
    "expected": re.compile(r"Expected a <class '(\w+)'>"),
}


def _said(error: BaseException) -> _Said:
    """What ``error`` itself says (its own message, not the messages of the errors nested in it), in words: the one
    place that reads jsonargparse's message text."""
    own = str(error).strip()
    key, cls, expected = (_WORDS[name].match(own) for name in ("key", "class_path", "expected"))
    option = _WORDS["option"].search(own) if isinstance(error, KeyError) else None
    given = _WORDS["given"].search(own.splitlines()[-1]) if own else None
    return _Said(
        key=key and key.group(1),
        class_path=cls and cls.group(1),
        option=option and option.group(1),
        given=given and (given.group(1) or given.group(2)),
        rule=given and given.group(3),
        expected=expected and expected.group(1),
    )


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the errors it was raised from (``__cause__``, else ``__context__``), outermost first."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def explain_parse_error(error: BaseException) -> str:
    """jsonargparse's multi-line refusal as one line: the whole key, the value given, what the key takes.

    Built on the exception chain jsonargparse raises (one ``TypeError`` per parser the value went through, the
    library's root error innermost; an unknown option is a ``KeyError``) and on the type the parser declares for the
    key (:class:`ParseError` carries the parser): ``data.batch_size: 0 is not a PositiveInt (needs v>0)``,
    ``trainer.max_epochs: invalid value 'ten'; expected int or null``, ``data.batch_sise:
    project.data.MNISTDataModule has no such option (...)``. Any other error (a ``ConfigError`` raised while a
    class was instantiated, e.g. ``model.net: ...``) is its first line.
    """
    chain = _chain(error)
    said = [_said(e) for e in chain]
    keys = [s.key for e, s in zip(chain, said) if isinstance(e, TypeError) and s.key and s.key != "init_args"]
    cls = next((s.class_path for s in reversed(said) if s.class_path), None)
    root, why = chain[-1], said[-1]
    if not keys or isinstance(error, UserError):
        return _first_line(root if isinstance(root, KeyError) else error)
    key = ".".join(keys)
    if isinstance(root, KeyError):  # a misspelled init argument of a class given by class_path
        if why.option and cls:
            return f"{key}.{why.option}: {cls} has no such option (its options: --{key}.help {cls})"
        return f"{key}: {_first_line(root)}"
    parser = next((e.parser for e in chain if isinstance(e, ParseError)), None)
    declared = _declared_type(parser, keys, cls)
    options = typing.get_args(declared) if _is_union(declared) else (declared,)
    if any(_is_restricted(o) for o in options):  # a restricted type's own check refused it: its name and rule
        if why.rule:
            return f"{key}: {why.given} is not a {_type_words(declared)} (needs {why.rule})"
        return f"{key}: {_first_line(root)} (expected {_type_words(declared)})"
    expected = _type_words(declared) if declared is not None else why.expected
    if why.given is not None:
        return f"{key}: invalid value {why.given!r}; expected {expected or 'another type'}"
    return f"{key}: {_first_line(root)}"


def _declared_type(parser: Any, keys: list[str], class_path: str | None) -> Any:
    """The type the parser checks the key's value against: the parser's own for a key of its own (``keys`` of
    one), else that of the init argument ``keys[-1]`` of the class ``class_path``; None when neither is known."""
    from jsonargparse import ArgumentParser

    from project import adapters

    if len(keys) == 1 and parser is not None:
        return adapters.declared_type(parser, keys[0])
    if class_path is None or "." not in class_path:
        return None
    module, name = class_path.rsplit(".", 1)
    try:  # jsonargparse imported it already to check the value
        cls = getattr(importlib.import_module(module), name)
        class_parser = ArgumentParser(exit_on_error=False)
        class_parser.add_class_arguments(cls)
    except (ImportError, AttributeError, ValueError, TypeError):
        return None
    return adapters.declared_type(class_parser, keys[-1])


def _is_restricted(declared: Any) -> bool:
    """Whether ``declared`` is a restricted subtype of a number or string (jsonargparse's ``PositiveInt``,
    ``restricted_number_type``, ...), whose own constructor refuses a value with its rule."""
    return (
        isinstance(declared, type)
        and issubclass(declared, (int, float, str))
        and not issubclass(declared, (bool, enum.Enum))
        and declared not in (int, float, str)
    )


def _type_words(declared: Any) -> str:
    """``int | None`` as ``int or null``, ``Literal['a', 'b']`` as ``one of 'a', 'b'``, ``list[int]`` as
    ``a list of (int)``."""
    options = typing.get_args(declared) if _is_union(declared) else (declared,)
    literals = [v for o in options if typing.get_origin(o) is typing.Literal for v in typing.get_args(o)]
    words = [f"one of {', '.join(repr(v) for v in literals)}"] if literals else []
    for option in options:
        if option is type(None):
            words.append("null")
        elif typing.get_origin(option) in (list, tuple, set, abc.Sequence) and typing.get_args(option):
            words.append(f"a list of ({_type_words(typing.get_args(option)[0])})")
        elif typing.get_origin(option) is not typing.Literal:
            words.append(getattr(option, "__name__", None) or str(option).replace("typing.", ""))
    return " or ".join(words)


def _is_union(declared: Any) -> bool:
    return typing.get_origin(declared) in (typing.Union, types.UnionType)


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__
