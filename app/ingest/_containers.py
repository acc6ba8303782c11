"""Containers of transcripts: the records of an upload whatever holds them.

* gzip (``\\x1f\\x8b``): inflated (at most :data:`MAX_INFLATED` bytes, 413 beyond), then read as
  below;
* a zip that is not torch's (:func:`is_torch_zip`: a ``data.pkl`` member) is a zip of JSON:
  Inspect AI's ``.eval`` (``header.json`` + one ``samples/<id>_epoch_<n>.json`` per sample, read in
  the order of id and epoch; ``attachment://<hash>`` strings replaced from the sample's
  ``attachments``; a sample of the dedup form without ``messages`` read from its
  ``message_pool``, the pool the model events' ``input_refs`` point into; the event log, which
  repeats the messages, is dropped), or any other zip: its ``.json``/``.jsonl`` members in name
  order;
* JSON and JSONL through :meth:`Document.records` (one object, an array of records, JSONL lines).

The records' shape (a bare list of messages, a list of message lists, an object holding a list of
records under any key) is app/ingest/_structure.py's business.
"""

from __future__ import annotations

import gzip
import io
import re
import zipfile
import zlib
from collections.abc import Iterator
from typing import Any

from app.core.errors import ApiError
from app.ingest._common import Record, loads
from app.ingest._document import Document

GZIP_MAGIC = b"\x1f\x8b"
MAX_INFLATED = 1 << 30
_SAMPLE = re.compile(r"^samples/(.+?)_epoch_(\d+)\.json$")
_ATTACHMENT = "attachment://"


def is_gzip(data: bytes) -> bool:
    """True for gzip bytes."""
    return data[:2] == GZIP_MAGIC


def gunzip(data: bytes, limit: int = MAX_INFLATED) -> bytes:
    """The inflated bytes of a gzip upload; 413 beyond ``limit``, 422 when it is not gzip."""
    out = io.BytesIO()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            while chunk := f.read(1 << 20):
                out.write(chunk)
                if out.tell() > limit:
                    raise ApiError(
                        413,
                        "too_large",
                        f"the gzip file inflates to more than {limit} bytes; split it into several uploads.",
                    )
    except (OSError, EOFError, zlib.error) as e:
        raise ApiError(
            422, "damaged_file", f"the gzip file cannot be read ({e}); nothing was stored."
        ) from None
    return out.getvalue()


def is_torch_zip(names: list[str]) -> bool:
    """True for the zip ``torch.save`` writes (``<archive>/data.pkl``)."""
    return any(n == "data.pkl" or n.endswith("/data.pkl") for n in names)


def is_inspect_eval(names: list[str]) -> bool:
    """True for an Inspect AI ``.eval`` log (``header.json`` or ``_journal/start.json`` beside
    ``samples/*.json``)."""
    return any(_SAMPLE.match(n) for n in names) and ("header.json" in names or "_journal/start.json" in names)


def json_members(names: list[str]) -> list[str]:
    """The members of a zip that hold JSON records, in the order they are read."""
    if is_inspect_eval(names):

        def key(n: str) -> tuple[int, str, int]:
            m = _SAMPLE.match(n)
            assert m is not None
            sid, epoch = m.group(1), int(m.group(2))
            return (int(sid), "", epoch) if sid.isdigit() else (1 << 62, sid, epoch)

        return sorted((n for n in names if _SAMPLE.match(n)), key=key)
    return sorted(
        n for n in names if n.endswith((".json", ".jsonl")) and not n.startswith(("__MACOSX/", "_journal/"))
    )


def _resolve_attachments(v: Any, attachments: dict[str, Any]) -> Any:
    if isinstance(v, str):
        if v.startswith(_ATTACHMENT):
            got = attachments.get(v[len(_ATTACHMENT) :])
            return got if isinstance(got, str) else v
        return v
    if isinstance(v, list):
        return [_resolve_attachments(x, attachments) for x in v]
    if isinstance(v, dict):
        return {k: _resolve_attachments(x, attachments) for k, x in v.items()}
    return v


def inspect_sample(sample: Any, header: dict[str, Any] | None = None) -> Any:
    """An Inspect sample ready to read: attachments resolved in its messages, messages rebuilt
    from ``message_pool`` when the sample has none, the header's task and model added."""
    if not isinstance(sample, dict):
        return sample
    out = dict(sample)
    pool = out.get("message_pool")
    if not out.get("messages") and isinstance(pool, list):
        out["messages"] = pool
    out.pop("message_pool", None)
    out.pop("events", None)  # the model/tool event log repeats the messages
    att = out.pop("attachments", None)
    if isinstance(att, dict) and att:
        for key in ("messages", "input", "output"):
            if key in out:
                out[key] = _resolve_attachments(out[key], att)
    ev = header.get("eval") if isinstance(header, dict) else None
    if isinstance(ev, dict):
        for key in ("task", "model"):
            if isinstance(ev.get(key), str):
                out.setdefault(key if key != "task" else "eval_task", ev[key])
    return out


def zip_records(doc: Document) -> Iterator[tuple[Record, str]]:
    """(record, member) of a zip of JSON, one member at a time."""
    names = doc.zip_names or []
    members = json_members(names)
    n = 0
    with zipfile.ZipFile(io.BytesIO(doc.data)) as zf:
        header: dict[str, Any] | None = None
        inspect = is_inspect_eval(names)
        if inspect and "header.json" in names:
            h = loads(zf.read("header.json"))
            header = h if isinstance(h, dict) else None
        for name in members:
            raw = zf.read(name)
            try:
                sub = Document(raw)
                for rec in sub.records():
                    n += 1
                    obj = inspect_sample(rec.obj, header) if inspect else rec.obj
                    yield Record(rec.line, n, obj), name
            except ApiError as e:
                raise ApiError(e.status, e.code, f"zip member `{name}`: {e.message}") from None


def records(doc: Document) -> Iterator[tuple[Record, str]]:
    """(record, where) of every record of an upload: zip members, or the JSON/JSONL records."""
    if is_gzip(doc.data):
        yield from records(Document.of(gunzip(doc.data)))
        return
    if doc.is_zip:
        yield from zip_records(doc)
        return
    for rec in doc.records():
        yield rec, ""
