"""The spool: a run's unsent steps on disk, one file per step, sent oldest first.

Layout under the spool folder (``Client(spool_dir=...)``; by default ``$CREDITLENS_SPOOL_DIR``, else
``creditlens/spool`` in the user's cache folder: ``$XDG_CACHE_HOME`` or ``~/.cache``, on Windows
``%LOCALAPPDATA%``)::

    <name>-<hash of server URL and run name>/     one folder per run (server + name)
        <start time ns>-<pid>/                    one per process logging that run
            .lock                                 held (flock) while the process runs
            0000000000-<step>.<format>            the upload body, exactly as it is posted

A file is written under a temporary name and renamed into place (a crash leaves a whole file or
none) and removed once the server has answered for it (stored, 409 "the step exists", or a 4xx
refusal). A process's folder whose ``.lock`` nobody holds belongs to a process that ended with
steps unsent (killed, or closed before the server took them); ``client.run(name, resume=True)``
takes such folders over and sends their files first, oldest process first. Files are not
fsynced: a killed process loses nothing, a power cut may lose the last steps written.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

try:  # POSIX; on Windows every other process's folder counts as ended
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["Entry", "Spool", "default_spool_dir"]

_FILE = re.compile(r"(\d{10})-(-?\d+)\.([a-z_]+)")


def default_spool_dir() -> Path:
    """``$CREDITLENS_SPOOL_DIR``, else ``creditlens/spool`` in the user's cache folder."""
    env = os.environ.get("CREDITLENS_SPOOL_DIR")
    if env:
        return Path(env).expanduser()
    if sys.platform == "win32":  # pragma: no cover
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "creditlens" / "spool"


def run_key(server: str, name: str) -> str:
    """The folder name of one run: readable, and unique per (server URL, run name)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:40].strip("._") or "run"
    digest = hashlib.sha256(f"{server.rstrip('/')}\n{name}".encode()).hexdigest()[:12]
    return f"{slug}-{digest}"


@dataclass
class Entry:
    """One spooled step: its file, the step, the upload format and the file's size."""

    path: Path
    step: int
    fmt: str
    nbytes: int


def _try_lock(path: Path) -> IO[bytes] | None:
    """The open, exclusively locked ``path`` (created if missing); None when another process holds it."""
    try:
        f = open(path, "ab")  # noqa: SIM115 - held open while the folder is ours
    except OSError:
        return None
    if fcntl is None:  # pragma: no cover - Windows
        return f
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    return f


class _Folder:
    """One process's folder, locked by this process."""

    def __init__(self, path: Path, lock: IO[bytes]) -> None:
        self.path = path
        self.lock = lock

    def release(self) -> None:
        """Unlock; remove the folder when nothing is left in it."""
        try:
            if not any(p.name != ".lock" for p in self.path.iterdir()):
                (self.path / ".lock").unlink(missing_ok=True)
                self.path.rmdir()
        except OSError:
            pass  # another process reopened it, or it is gone: either way not ours to keep
        self.lock.close()


class Spool:
    """The steps of one run waiting on disk, for one process.

    :meth:`write` adds a step (atomically); :meth:`leftovers` takes over what ended processes left
    for the same run; :meth:`remove` deletes a step the server answered for; :meth:`close` unlocks
    (and removes the folders left empty)."""

    def __init__(self, root: Path, server: str, name: str) -> None:
        self.run_dir = Path(root) / run_key(server, name)
        own = self.run_dir / f"{time.time_ns():020d}-{os.getpid()}"
        own.mkdir(parents=True, exist_ok=True)
        lock = _try_lock(own / ".lock")
        if lock is None:  # pragma: no cover - a fresh folder of our own is never locked
            raise OSError(f"cannot lock {own}")
        self.own = _Folder(own, lock)
        self._adopted: list[_Folder] = []
        self._seq = 0

    @property
    def folder(self) -> Path:
        return self.own.path

    def write(self, step: int, fmt: str, body: bytes) -> Entry:
        """Put one step's upload body on disk: a temporary file renamed into place."""
        name = f"{self._seq:010d}-{step}.{fmt}"
        self._seq += 1
        path = self.own.path / name
        tmp = self.own.path / f".{name}.tmp"
        try:
            tmp.write_bytes(body)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        return Entry(path, step, fmt, len(body))

    def leftovers(self) -> list[Entry]:
        """The steps that ended processes left for this run, in the order they were logged
        (oldest process first); their folders are this process's from now on."""
        out: list[Entry] = []
        try:
            folders = sorted(p for p in self.run_dir.iterdir() if p.is_dir() and p != self.own.path)
        except OSError:
            return out
        for d in folders:
            lock = _try_lock(d / ".lock")
            if lock is None:
                continue  # a live process's (or one we cannot open): not ours
            folder = _Folder(d, lock)
            self._adopted.append(folder)
            for p in sorted(d.iterdir()):
                if p.name.endswith(".tmp"):  # a write the crash cut short: never renamed, never whole
                    p.unlink(missing_ok=True)
                    continue
                m = _FILE.fullmatch(p.name)
                if m:
                    out.append(Entry(p, int(m.group(2)), m.group(3), p.stat().st_size))
        return out

    def others(self) -> int:
        """Steps waiting in other processes' folders of this run (live or ended)."""
        n = 0
        try:
            for d in self.run_dir.iterdir():
                if d.is_dir() and d != self.own.path and d not in {f.path for f in self._adopted}:
                    n += sum(1 for p in d.iterdir() if _FILE.fullmatch(p.name))
        except OSError:
            pass
        return n

    @staticmethod
    def remove(entry: Entry) -> None:
        """Delete a step the server has answered for."""
        entry.path.unlink(missing_ok=True)

    def close(self) -> None:
        """Unlock this process's folders; those left empty are removed."""
        for f in [*self._adopted, self.own]:
            f.release()
        self._adopted = []
