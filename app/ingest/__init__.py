"""Upload formats: detection and parsing into native episodes.

Add a format = add one module here (next to native.py) with ``NAME``, ``DESCRIPTION``,
``PRIORITY`` (lower is sniffed first), ``sniff(data, first_record) -> bool`` and
``parse(data, filename) -> Parsed``. Modules are discovered automatically.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from functools import lru_cache
from types import ModuleType

from app.core.errors import ApiError
from app.core.schemas import EpisodeIn
from app.core.validate import ArrayEpisode
from app.ingest._common import Parsed, first_object, forget_document
from app.ingest._damage import check as check_damage
from app.ingest._mapping import iter_mapped, parse_mapping, unknown_format_hint
from app.ingest._tokenizer import TokenDecoder, load_tokenizer

__all__ = ["Parsed", "formats", "detect", "parse_upload", "iter_upload", "load_tokenizer", "TokenDecoder"]


@lru_cache
def formats() -> dict[str, ModuleType]:
    """Every upload format module by NAME, in sniffing order."""
    mods = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(mod, "parse") and hasattr(mod, "sniff"):
            mods.append(mod)
    mods.sort(key=lambda m: getattr(m, "PRIORITY", 100))
    return {m.NAME: m for m in mods}


def detect(data: bytes, filename: str | None = None) -> str:
    """The name of the format of ``data``; ApiError 422 ``unknown_format`` if none matches."""
    first = None if data[:4] == b"PK\x03\x04" else first_object(data)
    for name, mod in formats().items():
        if mod.sniff(data, first):
            return name
    if first is None and data.strip():
        # Not one of the binary formats and not parseable: report the JSON error with its line.
        from app.ingest._common import read_records

        read_records(data)
    forget_document(data)  # no format will read the document first_object parsed
    raise ApiError(
        422,
        "unknown_format",
        "could not recognise the upload format. "
        + unknown_format_hint(first)
        + " Or pass format=<name> to choose one of the known formats: "
        + "; ".join(f"{n} ({m.DESCRIPTION})" for n, m in formats().items())
        + ".",
        line=1 if isinstance(first, dict) else None,
        episode=1 if isinstance(first, dict) else None,
    )


def _resolve(data: bytes, fmt: str | None, filename: str | None) -> tuple[bytes, str, ModuleType]:
    """(data without a BOM, the format's name, its module); 422 for an empty upload or unknown format."""
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark (Windows editors write one)
        data = data[3:]
    if not data or not data.strip():
        raise ApiError(422, "empty_upload", "the upload is empty.")
    check_damage(data)  # a truncated zip / parquet / safetensors says so, whatever the format
    if fmt in (None, "", "auto"):
        fmt = detect(data, filename)
    mod = formats().get(fmt)
    if mod is None:
        raise ApiError(
            422,
            "unknown_format",
            f"format {fmt!r} is not known; choose one of: auto, {', '.join(formats())}.",
            field="format",
        )
    return data, fmt, mod


def _tok_kw(mod: ModuleType, tokenizer: TokenDecoder | None) -> dict:
    """``tokenizer=`` for the formats of token ids (``TAKES_TOKENIZER``); others show text already."""
    return (
        {"tokenizer": tokenizer} if tokenizer is not None and getattr(mod, "TAKES_TOKENIZER", False) else {}
    )


def parse_upload(
    data: bytes,
    fmt: str | None = None,
    filename: str | None = None,
    source: str | None = None,
    tokenizer: TokenDecoder | None = None,
) -> Parsed:
    """Parse an upload in format ``fmt`` (auto-detected when None or "auto") into native episodes.

    Each episode's ``meta.source`` defaults to ``source`` (else "upload:<format>"). ``tokenizer``
    (:func:`load_tokenizer`) shows token ids as the tokenizer's pieces."""
    data, fmt, mod = _resolve(data, fmt, filename)
    parsed = mod.parse(data, filename, **_tok_kw(mod, tokenizer))
    for ep in parsed.episodes:
        if isinstance(ep.meta, dict):
            ep.meta.setdefault("source", source or f"upload:{fmt}")
    return parsed


def iter_upload(
    data: bytes,
    fmt: str | None = None,
    filename: str | None = None,
    tokenizer: TokenDecoder | None = None,
    mapping: str | dict | None = None,
) -> tuple[str, Iterator[tuple[int | None, EpisodeIn | ArrayEpisode]]]:
    """(format name, lazy ``(line, episode)`` pairs): formats with ``iter_parse`` yield episodes as
    they parse them (binary formats as arrays), so an upload never holds every episode's Python
    lists at once. ``tokenizer``: as in :func:`parse_upload`. ``mapping`` ({native field: record
    key}, app/ingest/_mapping.py): read the records through it instead of a format ("mapped")."""
    mapped = parse_mapping(mapping)
    if mapped is not None:
        data = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
        return "mapped", iter_mapped(data, mapped)
    data, fmt, mod = _resolve(data, fmt, filename)
    kw = _tok_kw(mod, tokenizer)

    def gen() -> Iterator[tuple[int | None, EpisodeIn | ArrayEpisode]]:
        if hasattr(mod, "iter_parse"):
            pairs = mod.iter_parse(data, filename, **kw)
        else:
            parsed = mod.parse(data, filename, **kw)
            pairs = zip(parsed.lines, parsed.episodes, strict=True)
        for line, ep in pairs:
            if isinstance(ep.meta, dict):
                ep.meta.setdefault("source", f"upload:{fmt}")
            yield line, ep

    return fmt, gen()
