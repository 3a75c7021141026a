"""jsonargparse's refusals as one line: :func:`explain_parse_error` turns its multi-line chain of errors into the
whole key, the value given and what the key takes (``data.batch_size: 0 is not a PositiveInt (needs v>0)``);
:class:`ParseError` carries the parser that refused, for the declared type. The entry point prints the line as
``error: ...`` with exit status 2 (:mod:`project.cli.entry`)."""

from __future__ import annotations

import difflib
import enum
import importlib
import re
import sys
import traceback
import types
import typing
from collections import abc
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from jsonargparse import ArgumentError

from project.errors import UserError


class ParseError(ArgumentError):
    """jsonargparse's refusal of a command line or config file, with the parser that refused it.

    :meth:`project.cli.parser.ProjectCLI.parse_arguments` raises it from jsonargparse's ``ArgumentError`` (the
    ``__cause__``), so that :func:`explain_parse_error` can look up the type the parser declares for the key, with
    ``hint``: where a misspelled key stands and the closest valid key (:func:`misspelling_hint`), or ``""``.
    """

    def __init__(self, error: ArgumentError, parser: Any, hint: str = "") -> None:
        super().__init__(None, error.message)
        self.parser = parser
        self.hint = hint


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


def failed_import(error: BaseException) -> str | None:
    """Where the module a class path names failed while the parser imported it (``"pkg/__init__.py, line 3"``), when
    ``error`` is what that module raised (a ``SyntaxError``, or any error its top-level code raises, which
    jsonargparse passes on as it is for some option types, e.g. ``--model.optimizer``); else None."""
    frames = list(traceback.walk_tb(error.__traceback__))
    if not any(f.f_code.co_name in ("import_object", "import_module") for f, _ in frames):
        return None
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}, line {error.lineno}"
    modules = [(f.f_code.co_filename, line) for f, line in frames if f.f_code.co_name == "<module>"]
    return f"{modules[-1][0]}, line {modules[-1][1]}" if modules else None


# Python's own words for a module it cannot find (ModuleNotFoundError), which jsonargparse folds into its message.
_NO_MODULE = re.compile(r"No module named '([^']+)'")
_NO_ATTRIBUTE = re.compile(r"module '[^']+' has no attribute '[^']+'")
_GIVEN = re.compile(r"^\s*Given value: (\S+)$", re.MULTILINE)
# A Union's refusal lists each member's reason; a class path's member (model.net) says why its import failed,
# after its own prefix or as the module's own error text. Reasons that are about the value, not an import:
_UNION_REASON = re.compile(
    r"^\s*- (?!Expected a typing\.Literal)(?:Type .* expects a function or a callable class: )?(.+)$", re.MULTILINE
)
_NOT_RAISED = ("Expected", "Unexpected import object")  # (a missing module or name returned before)
_DOTTED = re.compile(r"[A-Za-z_][\w.]*\.[A-Za-z_]\w*")


def _found(pattern: re.Pattern[str], chain: list[BaseException]) -> re.Match[str] | None:
    """The first match of ``pattern`` in the messages of ``chain``, outermost first."""
    return next((m for e in chain if (m := pattern.search(str(e)))), None)


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
    line = _explain(error)
    hint = next((e.hint for e in _chain(error) if isinstance(e, ParseError) and e.hint), "")
    return f"{line}; {hint}" if hint else line


def _explain(error: BaseException) -> str:
    chain = _chain(error)
    said = [_said(e) for e in chain]
    keys = [s.key for e, s in zip(chain, said) if isinstance(e, TypeError) and s.key and s.key != "init_args"]
    cls = next((s.class_path for s in reversed(said) if s.class_path), None)
    root, why = chain[-1], said[-1]
    if not keys or isinstance(error, UserError):
        return _first_line(root if isinstance(root, KeyError) else error)
    key = ".".join(keys)
    missing, given = _found(_NO_MODULE, chain), _found(_GIVEN, chain)
    if missing:  # a class path whose package Python cannot find
        module = missing.group(1)
        if given and given.group(1).split(".")[0] != module.split(".")[0]:  # the named package imports a missing one
            return (
                f"{key}: importing {given.group(1)} failed: it imports {module} ({missing.group(0)}): install "
                f"{module}, or put the folder that holds it on PYTHONPATH"
            )
        return (
            f"{key}: cannot import {module} ({missing.group(0)}): install the package that "
            "holds it, or put the folder that holds it on PYTHONPATH"
        )
    absent = _found(_NO_ATTRIBUTE, chain)
    if absent:  # the module imports, the name is not in it
        return f"{key}: {absent.group(0)}"
    if isinstance(root, KeyError):  # a misspelled init argument of a class given by class_path
        if why.option and cls:
            return f"{key}.{why.option}: {cls} has no such option (its options: --{key}.help {cls})"
        return f"{key}: {_first_line(root)}"
    parser = next((e.parser for e in chain if isinstance(e, ParseError)), None)
    declared = _declared_type(parser, keys, cls)
    options = typing.get_args(declared) if _is_union(declared) else (declared,)
    raised = _found(_UNION_REASON, chain)
    takes_class = any(typing.get_origin(o) is abc.Callable for o in options)  # model.net: a name or a class path
    reason, path = raised and raised.group(1), given and given.group(1)
    if takes_class and reason and path and _DOTTED.fullmatch(path) and not reason.startswith(_NOT_RAISED):
        return f"{key}: importing {path} failed: {reason}; fix that module, or name another class"
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
        elif typing.get_origin(option) is abc.Callable and typing.get_args(option):
            made = typing.get_args(option)[-1]  # Callable[[...], T]: a class path of a T (model.net: nn.Module)
            words.append(f"a class path of a {_public_path(made)}")
        elif typing.get_origin(option) is not typing.Literal:
            words.append(getattr(option, "__name__", None) or str(option).replace("typing.", ""))
    return " or ".join(words)


def _public_path(cls: Any) -> str:
    """The shortest import path of ``cls`` among loaded modules: ``torch.nn.Module``, not
    ``torch.nn.modules.module.Module``."""
    parts = str(getattr(cls, "__module__", "")).split(".")
    name = getattr(cls, "__qualname__", str(cls))
    for cut in range(1, len(parts) + 1):
        if getattr(sys.modules.get(".".join(parts[:cut])), name, None) is cls:
            return f"{'.'.join(parts[:cut])}.{name}"
    return f"{'.'.join(parts)}.{name}"


def _is_union(declared: Any) -> bool:
    return typing.get_origin(declared) in (typing.Union, types.UnionType)


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


# -- misspelled keys: where they stand, and the closest valid key ------------------------------------------------

_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.+)$")
_NOT_ACCEPTED = re.compile(r"Group '([^']+)' does not accept option '([^']+)'")
_SKIPPED = {"class_path", "init_args", "__path__", "config"}  # levels and bookkeeping keys a user does not write


def misspelling_hint(error: ArgumentError, parser: Any, args: list[str]) -> str:
    """For an unknown key (``--trainer.max_epoch 1`` on the command line, ``max_epoch:`` under ``trainer:`` in a
    ``--config`` file, ``--model.lr``), where it stands and the closest valid key: ``did you mean
    --trainer.max_epochs?``, ``in configs/x.yaml, line 2; did you mean trainer.max_epochs?``. The valid keys are
    those of the command with the unknown key left out (parsed again: the classes the command chose, their init
    arguments included, ``init_args`` levels dropped); closest by :func:`difflib.get_close_matches`, else a key
    ending in the same name (``--model.lr``: ``--model.optimizer.lr``). ``""`` for any other error, or when the
    command does not parse without the key either."""
    keys, cleaned, where = _unknown_keys(error, args)
    unknown: list[tuple[str, str]] = []  # (key, where) of each unknown key, in the order they were refused
    printing = vars(parser).pop("print_config", None)  # what the refused parse's --print_config left to print
    try:
        for _ in range(8):  # a few misspellings at once: each parse again refuses the next one
            if not keys or cleaned is None:
                return ""
            unknown += [(k, where) for k in keys]
            cleaned = [a for a in cleaned if not a.startswith(("--print_config", "--help", "-h"))]  # print, exit
            try:
                valid = set(_flat_keys(parser.parse_args(cleaned).as_dict()))
                break
            except ArgumentError as again:
                keys, cleaned, where = _unknown_keys(again, cleaned)
        else:
            return ""
    except (Exception, SystemExit):  # another problem besides: the line says what jsonargparse said, no guess
        return ""
    finally:
        if printing is not None:
            parser.print_config = printing
    hints = [_hint(key, where, valid, named=len(unknown) > 1) for key, where in unknown]
    return "; ".join(h for h in hints if h)


def _hint(key: str, where: str, valid: set[str], named: bool) -> str:
    """``did you mean --KEY?`` (command line; ``--BAD: did you mean --KEY?`` when several are ``named``), or
    ``BAD in FILE, line N; did you mean KEY?`` (a config file); ``""`` for a command-line key with no guess."""
    guess = _closest(key, valid)
    if where:
        return f"{key} in {where}" + (f"; did you mean {guess}?" if guess else "")
    if guess is None:
        return ""
    return f"--{key}: did you mean --{guess}?" if named else f"did you mean --{guess}?"


def _unknown_keys(error: ArgumentError, args: list[str]) -> tuple[list[str], list[str] | None, str]:
    """The unknown keys an error names, the command line without them, and the file and line of one given in a
    ``--config`` file (``""`` for the command line)."""
    messages = [str(e).strip().splitlines()[-1].strip() for e in _chain(error) if str(e).strip()]
    for message in messages:
        if match := _UNRECOGNIZED.search(message):
            keys = [t[2:].split("=", 1)[0] for t in match.group(1).split() if t.startswith("--")]
            return keys, _without_options(args, keys), ""
        if match := _NOT_ACCEPTED.search(message):
            return _in_config_files([_user_key(f"{match.group(1)}.{match.group(2)}")], args)
    said = [_said(e) for e in _chain(error)]
    if isinstance(_chain(error)[-1], KeyError) and (option := said[-1].option):
        keys = [s.key for e, s in zip(_chain(error), said) if isinstance(e, TypeError) and s.key]
        key = _user_key(".".join([*keys, option]))
        if any(a.split("=", 1)[0] == f"--{key}" for a in args):
            return [key], _without_options(args, [key]), ""
        return _in_config_files([key], args)
    return [], None, ""


def _user_key(key: str) -> str:
    """A key as a user writes it: ``model.init_args.optimizer.init_args.lr`` is ``model.optimizer.lr``."""
    return ".".join(part for part in key.split(".") if part != "init_args")


def _without_options(args: list[str], keys: list[str]) -> list[str]:
    """``args`` without ``--KEY VALUE`` and ``--KEY=VALUE`` for each of ``keys``."""
    out, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        if name in keys:
            skip = "=" not in arg and i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        out.append(arg)
    return out


def _in_config_files(keys: list[str], args: list[str]) -> tuple[list[str], list[str] | None, str]:
    """Find ``keys[0]`` in the ``--config`` files of ``args``: the keys, the command line with that file's key
    removed (the file's content given inline, as jsonargparse takes ``--config``), and ``FILE, line N``."""
    for i, arg in enumerate(args):
        path = args[i + 1] if arg == "--config" and i + 1 < len(args) else arg.partition("=")[2]
        if not (arg == "--config" or arg.startswith("--config=")) or not Path(path).is_file():
            continue
        try:
            text = Path(path).read_text()
            line = _line_of(yaml.compose(text), keys[0].split("."))
        except (OSError, yaml.YAMLError):
            continue
        if line is None:
            continue
        content = yaml.safe_load(text)
        _drop(content, keys[0].split("."))
        inline = yaml.safe_dump(content) if content else "{}"
        cleaned = [*args[:i], "--config", inline, *args[i + (2 if arg == "--config" else 1) :]]
        return keys, cleaned, f"{path}, line {line}"
    return keys, None, ""


def _line_of(node: Any, parts: list[str]) -> int | None:
    """The 1-based line of the key ``parts`` in a composed YAML ``node`` (``init_args`` levels looked through)."""
    if not isinstance(node, yaml.MappingNode) or not parts:
        return None
    for key, value in node.value:
        if key.value == parts[0]:
            return key.start_mark.line + 1 if len(parts) == 1 else _line_of(value, parts[1:])
        if key.value == "init_args" and (line := _line_of(value, parts)) is not None:
            return line
    return None


def _drop(content: Any, parts: list[str]) -> None:
    """Remove the key ``parts`` from a loaded YAML mapping (``init_args`` levels looked through)."""
    if not isinstance(content, dict):
        return
    if parts[0] in content:
        if len(parts) == 1:
            del content[parts[0]]
        else:
            _drop(content[parts[0]], parts[1:])
    elif "init_args" in content:
        _drop(content["init_args"], parts)


def _flat_keys(config: Any, prefix: str = "") -> list[str]:
    """Every key of a parsed config, dotted, as a user writes it (without ``class_path``/``init_args`` levels)."""
    if isinstance(config, list):
        return [k for item in config for k in _flat_keys(item, prefix)]
    if not isinstance(config, dict):
        return [prefix] if prefix else []
    keys = [prefix] if prefix else []
    for key, value in config.items():
        if key in _SKIPPED:
            keys += _flat_keys(value, prefix) if key == "init_args" else []
        else:
            keys += _flat_keys(value, f"{prefix}.{key}" if prefix else key)
    return keys


def _closest(key: str, valid: set[str]) -> str | None:
    """The valid key closest to ``key`` in spelling; else, under the same first part, the closest key ending in the
    same name, then in a close name (``model.lr``, ``model.lrr``: ``model.optimizer.lr``); else None."""
    close = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.8)
    if close:
        return close[0]
    first, last = key.split(".", 1)[0], key.rsplit(".", 1)[-1]
    under = sorted(k for k in valid if k.startswith(f"{first}.") and k != key)  # a level skipped or misspelled
    for cutoff in (1.0, 0.75):  # the same name, then a close one
        names = {k.rsplit(".", 1)[-1] for k in under}
        near = set(difflib.get_close_matches(last, sorted(names), n=3, cutoff=cutoff))
        found = [k for k in under if k.rsplit(".", 1)[-1] in near]
        if found:
            return max(found, key=lambda k: difflib.SequenceMatcher(None, key, k).ratio())
    return None
