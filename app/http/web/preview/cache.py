"""The preview images' disk cache: PNG files named by the hash of what they show, bounded in
count and bytes, oldest evicted first."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from fastapi import Request

VERSION = "preview-2"  # bump when the drawing changes: old cache entries stop matching


class PreviewCache:
    """PNG files in a folder, named by the hash of what they show; at most ``max_files`` files
    and ``max_bytes`` bytes (oldest removed first)."""

    def __init__(self, folder: Path, max_files: int = 512, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.folder = folder
        self.max_files = max_files
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        p = self.folder / f"{key}.png"
        try:
            data = p.read_bytes()
        except OSError:
            return None
        os.utime(p)  # recently used: evicted last
        return data

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f".{key}.{threading.get_ident()}.tmp"
            tmp.write_bytes(data)
            tmp.replace(self.folder / f"{key}.png")
            files = sorted(self.folder.glob("*.png"), key=lambda q: q.stat().st_mtime)
            total = sum(q.stat().st_size for q in files)
            while files and (len(files) > self.max_files or total > self.max_bytes):
                old = files.pop(0)
                total -= old.stat().st_size
                old.unlink(missing_ok=True)


def cache_for(request: Request) -> PreviewCache:
    """The app's preview cache: next to a SQLite database file, else in the temp folder."""
    app = request.app
    cache = getattr(app.state, "preview_cache", None)
    if cache is None:
        url = app.state.settings.database_url
        if url.startswith("sqlite:///") and not url.endswith(":memory:"):
            folder = Path(url.removeprefix("sqlite:///")).parent / "previews"
        else:
            folder = Path(tempfile.gettempdir()) / "creditlens-previews"
        cache = app.state.preview_cache = PreviewCache(folder)
    return cache


def cache_key(kind: str, drawn: Any) -> str:
    blob = json.dumps([VERSION, kind, drawn], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:40]
