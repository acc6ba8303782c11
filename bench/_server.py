"""The real server a benchmark talks to: its own (``make bench``), or, under
``python -m bench --quick``, one shared by every module that needs no special settings (a server
start costs seconds; the quick run is a check that every benchmark runs, not a measurement)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from tests.live_server import Server  # noqa: E402

SHARED: Server | None = None  # set by bench/__main__.py in quick mode


@contextmanager
def server(tmp: Path, name: str, **env: str) -> Iterator[Server]:
    """A started server on ``tmp/<name>.db`` with settings ``env``, stopped afterwards; the shared
    one instead when there is one and ``env`` asks for nothing."""
    if SHARED is not None and not env:
        yield SHARED
        return
    with Server(tmp / f"{name}.db", tmp / f"{name}.log", **env) as srv:
        yield srv
