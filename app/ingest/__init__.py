"""Upload formats: detection and parsing into native episodes.

:data:`FORMATS` maps each format's name to its :class:`Format` (app/ingest/_registry.py), in
sniffing order. :func:`detect` names the format of an upload, :func:`iter_upload` streams its
episodes, :func:`parse_upload` collects them.

**Adding a format** (the one way): one module, one fixture folder, one test.

1. ``app/ingest/<name>.py``, named after the format, with a docstring saying what it reads
   (which tool writes it, the fields, how kinds, reward and group are found). It ends with::

       register_format(
           name="<name>",                # the module's own name
           description="...",            # one line, shown by GET /api/formats and the 422s
           priority=...,                 # a free number; lower is sniffed first
           sniff=sniff,                  # sniff(doc: Document) -> bool
           record=episode_from_record,   # JSON/JSONL: one record -> one EpisodeIn
           # or episodes=episodes,       # anything else: a generator of (line, episode)
           takes_tokenizer=False,        # True when it shows token ids through a tokenizer.json
       )

   ``sniff`` reads only ``doc.first`` (the first record, parsed alone), ``doc.zip_names`` or the
   first bytes of ``doc.data``. ``record`` builds an episode from a :class:`Record` (``rec.obj``;
   errors through ``rec.error(code, message, field)`` so they name line and episode); the records
   are streamed to it. ``episodes(doc)`` is a generator of ``(line, episode)`` (line None for a
   file without lines) that yields each episode as soon as it is read. With ``takes_tokenizer``
   both get the upload's :class:`TokenDecoder` (or None) as a second argument. Shared
   pieces: app/ingest/_common.py (numbers, lists, meta), _chat.py and _spans.py (chat messages,
   tool spans in text), _tokenizer.py (token ids -> pieces), _damage.py (damaged containers).
2. ``fixtures/formats/<name>/``: a real example file (public, with a README saying where it
   comes from) or one written from the format's documented schema by a script beside it.
3. ``tests/app/ingest/test_fmt_<name>.py``: upload the example through the real API and compare
   what is stored with what the file says; malformed variants answer a 4xx naming the field.
   ``tests/app/ingest/test_contract.py`` checks every registered format by itself: its example
   detects as itself, its episodes stream, and the formats table of ``docs/api.md`` lists it.

Then add the row to the formats table in ``docs/api.md``.
"""

from __future__ import annotations

from collections.abc import Iterator

from app.core.errors import ApiError
from app.core.schemas import EpisodeIn
from app.core.validate import native_of
from app.ingest._common import Parsed, Record
from app.ingest._containers import gunzip, is_gzip
from app.ingest._damage import check as check_damage
from app.ingest._document import Document, looks_like_jsonl
from app.ingest._mapping import iter_mapped, parse_mapping, unknown_format_hint
from app.ingest._registry import FORMATS, Format, Pair, discover, register_format
from app.ingest._tokenizer import TokenDecoder, load_tokenizer

__all__ = [
    "FORMATS",
    "Document",
    "Format",
    "Parsed",
    "Record",
    "TokenDecoder",
    "detect",
    "iter_upload",
    "load_tokenizer",
    "parse_upload",
    "register_format",
]

discover()


def detect(data: bytes | Document) -> str:
    """The name of the format of ``data``; ApiError 422 ``unknown_format`` if none matches."""
    return _sniffed(data if isinstance(data, Document) else _opened(data)).name


def _sniffed(doc: Document) -> Format:
    for fmt in FORMATS.values():
        if fmt.sniff(doc):
            return fmt
    first = doc.first
    if first is None and doc.data.strip() and not doc.is_zip:
        # Not one of the binary formats and not parseable: report the JSON error with its line.
        for _ in doc.records():
            pass
    raise ApiError(
        422,
        "unknown_format",
        "could not recognise the upload format. "
        + unknown_format_hint(first)
        + " Or pass format=<name> to choose one of the known formats: "
        + "; ".join(f"{n} ({f.description})" for n, f in FORMATS.items())
        + ".",
        line=1 if isinstance(first, dict) else None,
        episode=1 if isinstance(first, dict) else None,
    )


def _opened(data: bytes | Document) -> Document:
    """The upload's document; a gzip upload inflated first (413 beyond its limit, 422 when the
    gzip is damaged), so every format reads its contents, not only the transcript reader."""
    doc = Document.of(data)
    return Document.of(gunzip(doc.data)) if is_gzip(doc.data) else doc


def _resolve(data: bytes | Document, fmt: str | None) -> tuple[Document, Format]:
    """(the upload's document, its format); 422 for an empty upload or an unknown format."""
    doc = _opened(data)
    if not doc.data or doc.data.isspace():  # not `.strip()`: that copies a whole upload
        raise ApiError(422, "empty_upload", "the upload is empty.")
    check_damage(doc.data)  # a truncated zip / parquet / safetensors says so, whatever the format
    if fmt in (None, "", "auto"):
        return doc, _sniffed(doc)
    found = FORMATS.get(str(fmt))
    if found is None:
        raise ApiError(
            422,
            "unknown_format",
            f"format {fmt!r} is not known; choose one of: auto, {', '.join(FORMATS)}.",
            field="format",
        )
    return doc, found


def _with_source(pairs: Iterator[Pair], source: str) -> Iterator[Pair]:
    for line, ep in pairs:
        if isinstance(ep.meta, dict):
            ep.meta.setdefault("source", source)
        yield line, ep


def iter_upload(
    data: bytes,
    fmt: str | None = None,
    tokenizer: TokenDecoder | None = None,
    mapping: str | dict[str, str] | None = None,
    rest: Iterator[bytes] | None = None,
) -> tuple[str, Iterator[Pair]]:
    """(format name, lazy ``(line, episode)`` pairs): episodes are yielded as the format reads
    them (binary formats as arrays), so an upload never holds every episode's Python lists at once.
    ``fmt``: a format name, or None/"auto" to detect it. ``tokenizer`` (:func:`load_tokenizer`)
    shows token ids as the tokenizer's pieces in the formats that take one. ``mapping`` ({native
    field: record key}, app/ingest/_mapping.py): read the records through it instead of a format
    ("mapped").

    ``rest``: the upload's bytes after ``data`` (then its head), segment by segment as they arrive
    (a large upload the server reads while it is received). A JSONL upload whose format reads by
    lines (:attr:`Format.streams`, detected on the head: its first records and first bytes) is
    read as it arrives and never held whole; any other upload is joined first and read as usual."""
    if rest is not None:
        streamed = None if mapping else _streamed(data, fmt, rest)
        if streamed is not None:
            doc, found = streamed
            return found.name, _with_source(found.stream(doc, tokenizer), f"upload:{found.name}")
        data = b"".join([data, *rest])
    mapped = parse_mapping(mapping)
    if mapped is not None:
        return "mapped", iter_mapped(_opened(data).data, mapped)
    doc, found = _resolve(data, fmt)
    return found.name, _with_source(found.stream(doc, tokenizer), f"upload:{found.name}")


def _streamed(head: bytes, fmt: str | None, rest: Iterator[bytes]) -> tuple[Document, Format] | None:
    """(a document that goes on through ``rest``, its format) when the upload can be read while it
    arrives (see :func:`iter_upload`); None when it must be read whole."""
    doc = Document.of(head)
    if is_gzip(doc.data) or not looks_like_jsonl(doc.data):
        return None
    try:
        _, found = _resolve(doc, fmt)
    except ApiError:  # no format in the head's first records: the whole upload decides (and says why)
        return None
    return (Document(doc.data, rest), found) if found.streams else None


def parse_upload(
    data: bytes,
    fmt: str | None = None,
    source: str | None = None,
    tokenizer: TokenDecoder | None = None,
) -> Parsed:
    """Every episode of an upload in format ``fmt`` (auto-detected when None or "auto") as native
    episodes, for the offline CLI, the demo data and tests (uploads stream with :func:`iter_upload`).
    Each episode's ``meta.source`` defaults to ``source`` (else "upload:<format>")."""
    doc, found = _resolve(data, fmt)
    out = Parsed(found.name)
    for line, ep in _with_source(found.stream(doc, tokenizer), source or f"upload:{found.name}"):
        out.episodes.append(ep if isinstance(ep, EpisodeIn) else native_of(ep))
        out.lines.append(line)
    return out
