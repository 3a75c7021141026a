"""Where a sweep's study lives: Optuna's RDB storage opened safely for many workers, and its URL shown without
the password.

* :func:`open_storage`: SQLite (serializable transactions, so that one queued trial goes to one worker) or any
  RDB URL (PostgreSQL), with heartbeats that let a dead worker's trial be failed and retried.
* :func:`expand_user`: ``~`` in an SQLite URL's file is the home folder.
* :func:`shown` / :func:`scrubbed`: a URL, or a text holding one, with its password replaced by ``***``: what
  gets printed, logged or written.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback


@contextlib.contextmanager
def stable() -> Iterator[None]:
    """Optuna marks the heartbeat helpers (there since 2.8/2.9) experimental: silenced around their calls only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _sqlite_serializable(storage: RDBStorage) -> None:
    """Make every SQLite transaction of ``storage`` ``BEGIN IMMEDIATE``.

    pysqlite starts a transaction only at the first write, so Optuna's ``SELECT ... FOR UPDATE`` then
    ``UPDATE`` (how a worker takes a queued trial) would not be atomic across processes on SQLite. This is
    SQLAlchemy's documented recipe for serializable pysqlite, applied once Optuna has set up its tables.
    """
    from sqlalchemy import event

    engine = storage.engine
    if engine.dialect.name != "sqlite":
        return

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened before the listeners: closed, reopened with them


def open_storage(url: str, heartbeat_s: float | None = None, max_retry: int = 3) -> RDBStorage:
    """Optuna's RDB storage at ``url`` (SQLite: serializable, 60 s lock timeout), with heartbeats when given."""
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    with stable():
        storage = _rdb(url, engine_kwargs, heartbeat_s, max_retry)
    _sqlite_serializable(storage)
    return storage


def _rdb(url: str, engine_kwargs: dict[str, Any], heartbeat_s: float | None, max_retry: int) -> RDBStorage:
    kwargs: dict[str, Any] = {}
    if heartbeat_s:
        kwargs = {
            "heartbeat_interval": max(1, round(heartbeat_s)),
            "grace_period": max(2, round(3 * heartbeat_s)),
            "heartbeat_stale_trial_callback": RetryHeartbeatStaleTrialCallback(max_retry=max_retry),
        }
    return RDBStorage(url, engine_kwargs=engine_kwargs, **kwargs)


def expand_user(url: str) -> str:
    """An SQLite URL whose database file starts with ``~`` (``sqlite:///~/studies/x.db``) with the home folder in
    its place (``os.path.expanduser``; SQLite would open a file under a folder literally named ``~``); any other URL
    unchanged."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and url[len(prefix) :].startswith("~"):
        return prefix + os.path.expanduser(url[len(prefix) :])
    return url


def default_storage(folder: Path) -> str:
    return f"sqlite:///{folder.resolve() / 'study.db'}"


# A query parameter whose name says it holds a credential: password=, sslpassword=, token=, api_key=, secret=, ...
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token|key|auth|cred|signature|sig$", re.IGNORECASE)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
UNPARSABLE = "<a URL that cannot be parsed, hidden>"


def shown(url: str) -> str:
    """A URL fit to print or store: the password of its user info and the value of every query parameter whose
    name says it holds a credential (``password``, ``sslpassword``, ``token``, ``api_key``, ``secret``, ...)
    replaced by ``***``; a string that is not ``scheme://...`` is hidden whole (:data:`UNPARSABLE`): where its
    secrets stand cannot be told."""
    match = _SCHEME.match(url)
    if match is None:
        return UNPARSABLE
    scheme, rest = match.group(0), url[match.end() :]
    at = rest.rfind("@")
    if at >= 0 and ":" in rest[:at]:  # user:password@host; the last @ (a password may hold one)
        rest = f"{rest[: rest.index(':')]}:***{rest[at:]}"
    head, question, query = rest.partition("?")
    if question:
        query, hash_, fragment = query.partition("#")
        pairs = [p.partition("=") for p in query.split("&")]
        query = (
            "&".join(k + eq + ("***" if eq and _SECRET_PARAM.search(k) else v) for k, eq, v in pairs) + hash_ + fragment
        )
    return scheme + head + question + query


def _secrets(url: str) -> list[str]:
    """The credentials ``url`` holds as :func:`shown` finds them (raw and percent-decoded), longest first."""
    from urllib.parse import unquote

    found = []
    match = _SCHEME.match(url)
    rest = url[match.end() :] if match else url
    at = rest.rfind("@")
    if at >= 0 and ":" in rest[:at]:
        found.append(rest[rest.index(":") + 1 : at])
    query = rest.partition("?")[2].partition("#")[0]
    found += [v for k, eq, v in (p.partition("=") for p in query.split("&")) if eq and v and _SECRET_PARAM.search(k)]
    return sorted({s for f in found for s in (f, unquote(f)) if s}, key=len, reverse=True)


def scrubbed(text: str, url: str) -> str:
    """``text`` (an error message, a log line) with ``url`` shown as :func:`shown` shows it, and every credential it
    holds (raw or percent-decoded, wherever a library repeated it) replaced by ``***``; an unparsable ``url``
    anywhere in ``text`` hidden whole."""
    text = text.replace(url, shown(url))
    for secret in _secrets(url) if _SCHEME.match(url) else []:
        text = text.replace(secret, "***")
    return text
