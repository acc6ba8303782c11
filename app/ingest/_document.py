"""The upload as it travels from detection to parsing: its bytes and what sniffing has read of them.

A :class:`Document` is made once per upload (:meth:`Document.of` strips a UTF-8 byte-order mark).
Detection reads at most the first record (:attr:`Document.first`) or a zip's member names
(:attr:`Document.zip_names`, from the central directory alone); each is read once and kept on the
document. The format that claims the upload reads its records with :meth:`Document.records`, which
streams: JSONL a line at a time, a JSON array element by element after one parse, and a single JSON
document (already parsed whole by :attr:`first`) from that one parse. The JSON reading it uses
(:class:`Record`, :func:`loads`, :func:`bad_json`, :func:`looks_like_jsonl`) lives here too;
app/ingest/_common.py hands it to the formats with the other shared pieces.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from typing import Any

from app.core.errors import ApiError, located

try:
    import orjson

    strict_loads: Callable[[bytes | str], Any] = orjson.loads
except ImportError:  # pragma: no cover
    strict_loads = json.loads


def loads(raw: bytes | str) -> Any:
    """orjson speed; the stdlib parser for what orjson refuses but Python tools write (NaN,
    Infinity), so those reach validation and get a `not_finite` error naming the field."""
    try:
        return strict_loads(raw)
    except ValueError:
        try:
            return json.loads(raw)
        except RecursionError:  # e.g. 10,000 nested arrays: a 4xx, not a crash
            raise ValueError(TOO_DEEP) from None


TOO_DEEP = "the JSON nests too deeply (recursion limit exceeded)"


@dataclass
class Record:
    """One JSON object of an upload with its 1-based line (JSONL) and episode index."""

    line: int | None
    episode: int
    obj: Any

    @property
    def where(self) -> dict[str, Any]:
        return {"line": self.line, "episode": self.episode}

    def error(self, code: str, message: str, field: str | None = None, status: int = 422) -> ApiError:
        """An ApiError about this record (the message starts "line 3, episode 2: ")."""
        return located(status, code, message, field=field, **self.where)


def bad_json(line: int | None, err: Exception | str) -> ApiError:
    """422 ``bad_json`` naming the line of an upload that is not JSON."""
    return located(
        422,
        "bad_json",
        f"this is not valid JSON ({err}). Upload JSONL (one JSON object per line) or one JSON document.",
        line=line,
    )


def head_lines(data: bytes, k: int, limit: int) -> list[tuple[int, bytes]]:
    """The first ``k`` non-blank lines with their 1-based numbers, of the first ``limit`` bytes,
    found without splitting the rest."""
    view = data[:limit] if len(data) > limit else data
    out: list[tuple[int, bytes]] = []
    start, number = 0, 1
    while len(out) < k and start < len(view):
        end = view.find(b"\n", start)
        if end < 0:
            end = len(view)
        line = view[start:end].strip()
        if line:
            out.append((number, line))
        start, number = end + 1, number + 1
    return out


def looks_like_jsonl(data: bytes) -> bool:
    """True when the first non-blank line is a complete JSON value on its own (JSONL), or the
    document is a single line."""
    lines = head_lines(data, 2, 1 << 20)
    if len(lines) <= 1 and len(data) > (1 << 20):
        # A first line longer than 1 MiB (a trainer's per-token record): look as far as `first` does.
        lines = head_lines(data, 2, 1 << 22)
    if len(lines) <= 1:
        return False
    first = lines[0][1]
    if first in (b"[", b"{"):
        return False
    try:
        loads(first)
        return True
    except ValueError:
        # A truncated first line in the 1 MiB prefix: decide on its first character.
        return first.startswith(b"{") and len(data) > (1 << 20)


BOM = b"\xef\xbb\xbf"
ZIP_MAGIC = b"PK\x03\x04"
_DECODER = json.JSONDecoder()
_UNSET: Any = object()


class Document:
    """One upload's bytes (``data``, without a byte-order mark) and what detection read of them.

    A large JSONL upload may still be arriving while it is read (``rest``: the bytes after
    ``data``, segment by segment, as the server receives them; app/http/api/uploads.py). Then
    ``data`` is the upload's head, which detection reads (its first records, its first bytes), and
    :meth:`lines`, :meth:`spans` and :meth:`records` go on through ``rest``; only a format that reads nothing but
    those (:attr:`app.ingest._registry.Format.streams`) is given such a document."""

    def __init__(self, data: bytes, rest: Iterator[bytes] | None = None) -> None:
        self.data = data
        self._rest = rest
        # A single JSON document parsed whole by `first`; `records` takes it over (once).
        self._whole: Any = _UNSET

    @classmethod
    def of(cls, data: bytes | Document) -> Document:
        """The document of an upload's bytes (a UTF-8 byte-order mark dropped); a Document as is."""
        if isinstance(data, Document):
            return data
        return cls(data[len(BOM) :] if data.startswith(BOM) else data)

    @property
    def is_zip(self) -> bool:
        """A zip archive (what ``torch.save`` writes)."""
        return self.data[:4] == ZIP_MAGIC

    @cached_property
    def zip_names(self) -> list[str] | None:
        """A zip's member names, read from its central directory only; None for anything else
        (and for a zip whose directory cannot be read: app/ingest/_damage.py reports that)."""
        if not self.is_zip:
            return None
        try:
            with zipfile.ZipFile(io.BytesIO(self.data)) as zf:
                return zf.namelist()
        except (zipfile.BadZipFile, OSError, ValueError):
            return None

    def zip_member_head(self, suffix: str, limit: int) -> bytes:
        """The first ``limit`` bytes of the first zip member whose name ends with ``suffix`` (never
        inflating more than that); b"" when there is none or the archive cannot be read."""
        name = next((n for n in self.zip_names or () if n.endswith(suffix)), None)
        if name is None:
            return b""
        try:
            with zipfile.ZipFile(io.BytesIO(self.data)) as zf, zf.open(name) as f:
                return f.read(limit)
        except (zipfile.BadZipFile, OSError, RuntimeError, NotImplementedError, EOFError, ValueError):
            return b""

    @cached_property
    def first(self) -> Any:
        """The first record of a JSON/JSONL upload, parsed without the rest, or None (a zip, or
        bytes that are not JSON).

        JSONL: the first line. A JSON array: its first element, parsed from a prefix of the file.
        A single JSON document (one object, ``{"episodes": [...]}``) is the first record itself:
        it is parsed once here, and :meth:`records` takes that parse."""
        if self.is_zip:
            return None
        data = self.data
        try:
            if looks_like_jsonl(data):
                return loads(head_lines(data, 1, 1 << 22)[0][1])
            found, first = _first_of_array(data)
            if found:
                return first
            doc = loads(data)
        except (ValueError, IndexError):
            return None
        self._whole = doc
        if isinstance(doc, dict) and isinstance(doc.get("episodes"), list):
            doc = doc["episodes"]
        if isinstance(doc, list):
            return doc[0] if doc else None
        return doc

    def lines(self) -> Iterator[tuple[int, bytes]]:
        """The non-blank lines of a JSONL upload with their 1-based numbers, unparsed (for a
        format that reads its lines its own way; :func:`record_of` parses one as :meth:`records`
        does). Check :func:`looks_like_jsonl` first. A line that runs across the segments of a
        streamed upload is joined once, when its end arrives."""
        for line, buf, start, stop in self.spans():
            yield line, buf[start:stop]

    def spans(self) -> Iterator[tuple[int, bytes, int, int]]:
        """:meth:`lines` without copying them: ``(line number, buffer, start, stop)``, the line
        being ``buffer[start:stop]`` (its newline included): a span of the upload (or of the
        segment it arrived in), or, for a line that ran across segments, the line joined."""
        line = 0
        parts: list[bytes] = []  # the start of a line whose end is in a later segment
        for data in chain((self.data,), self._rest or ()):
            start, end = 0, len(data)
            while start < end:
                stop = data.find(b"\n", start)
                if stop < 0:
                    parts.append(data[start:])
                    break
                line += 1
                if parts:
                    joined = b"".join([*parts, data[start : stop + 1]])
                    parts.clear()
                    if not joined.isspace():
                        yield line, joined, 0, len(joined)
                elif not _blank(data, start, stop + 1):
                    yield line, data, start, stop + 1
                start = stop + 1
        if parts:  # the last line, without a newline
            joined = b"".join(parts)
            if not joined.isspace():
                yield line + 1, joined, 0, len(joined)

    def records(self) -> Iterator[Record]:
        """The JSON (one object, a list of objects, or ``{"episodes": [...]}``) or JSONL records,
        each as it is parsed. Bad JSON raises ApiError 422 ``bad_json`` naming the line (for JSONL,
        when the reading reaches it)."""
        data = self.data
        if not data or data.isspace():  # not `data.strip()`: that copies a whole upload
            raise ApiError(422, "empty_upload", "the upload is empty.")
        if looks_like_jsonl(data):
            for n, (line, raw) in enumerate(self.lines(), start=1):
                yield record_of(line, n, raw)
            return
        doc, self._whole = self._whole, _UNSET
        if doc is _UNSET:
            doc = _parse_whole(data)
        if isinstance(doc, dict) and isinstance(doc.get("episodes"), list):
            doc = doc["episodes"]
        if isinstance(doc, list):
            for i, obj in enumerate(doc, start=1):
                yield Record(None, i, obj)
            return
        yield Record(1, 1, doc)


_SPACE = frozenset(b" \t\n\r\x0b\x0c")  # what bytes.isspace counts


def _blank(data: bytes, start: int, stop: int) -> bool:
    """``data[start:stop]`` is whitespace only (a blank line, which the JSON parsers would skip);
    a line that starts with anything else is decided by its first byte, without a copy."""
    return data[start] in _SPACE and data[start:stop].isspace()


def record_of(line: int, episode: int, raw: bytes) -> Record:
    """One JSONL line parsed as a :class:`Record`; 422 ``bad_json`` naming the line."""
    try:
        return Record(line, episode, loads(raw))
    except ValueError as e:
        raise bad_json(line, e) from None


def _parse_whole(data: bytes) -> Any:
    """One JSON document; 422 ``bad_json`` with the line of the error."""
    try:
        return strict_loads(data)
    except ValueError:
        try:  # the stdlib parser reports the line of the error
            return json.loads(data)
        except json.JSONDecodeError as e:
            raise bad_json(e.lineno, e.msg + f" at column {e.colno}") from None
        except RecursionError:
            raise bad_json(None, TOO_DEEP) from None
        except ValueError as e:
            raise bad_json(None, e) from None


def _first_of_array(data: bytes) -> tuple[bool, Any]:
    """(True, first element) of a JSON array, parsed from a prefix of ``data`` (1 MiB, then 16 MiB,
    then all of it: only the first element is ever parsed), (True, None) for an empty array;
    (False, None) when ``data`` is not an array or its first element is not valid JSON (the
    caller's whole-document parse then reports where)."""
    head = data[:64].lstrip()
    if not head.startswith(b"["):
        return False, None
    for size in (1 << 20, 1 << 24, len(data)):
        text = data[:size].decode("utf-8", errors="ignore")
        i = text.index("[") + 1
        while i < len(text) and text[i].isspace():
            i += 1
        if text[i : i + 1] == "]":
            return True, None
        try:
            return True, _DECODER.raw_decode(text, i)[0]  # parses the first element only
        except RecursionError:  # nested too deeply: the whole-document parse reports it
            break
        except ValueError:
            if size >= len(data):
                break
            # the first element runs past this prefix
    return False, None
