"""The upload formats' registry: one :class:`Format` per format, in sniffing order.

Each format module of app/ingest (named after its format) calls :func:`register_format` once at
import; :func:`discover` imports every module of the package whose name does not start with ``_``
and fills :data:`FORMATS`. Registration refuses a name that is not its module's, a name or a
priority that another format has, and a module that registers nothing is an error, so no format
is ever skipped or ordered by accident.

The contract (every format, the same shape):

* ``sniff(doc) -> bool``: does this upload look like the format? It reads only ``doc.first`` (the
  first record of a JSON/JSONL upload), ``doc.zip_names`` or a few bytes of ``doc.data``;
* ``episodes(doc) -> Iterator[(line, episode)]`` (``episodes(doc, tokenizer)`` with
  ``takes_tokenizer``): a generator of native episodes
  (:class:`~app.core.schemas.EpisodeIn`, or :class:`~app.core.validate.ArrayEpisode` for
  array-shaped binary formats) with the file line of each (None where the file has no lines). It
  yields each episode as it is read, so an upload never holds every episode at once. Errors are
  ApiErrors naming line, episode and field;
* or, for a format whose JSON/JSONL records map one-to-one onto episodes, ``record(rec) ->
  EpisodeIn`` (``record(rec, tokenizer)`` with ``takes_tokenizer``): the registry streams the
  records (:meth:`Document.records`) through it;
* ``streams=True``: the format reads a JSONL upload through :meth:`Document.lines`,
  :meth:`Document.spans` or :meth:`Document.records` alone (never the whole of ``doc.data``), so a large upload is read
  while it still arrives (:func:`app.ingest.iter_upload` with ``rest``).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

from app.core.schemas import EpisodeIn
from app.core.validate import ArrayEpisode
from app.ingest._common import Record
from app.ingest._document import Document
from app.ingest._tokenizer import TokenDecoder

PACKAGE = "app.ingest"

Pair = tuple[int | None, EpisodeIn | ArrayEpisode]
EpisodesFn = Callable[[Document, TokenDecoder | None], Iterator[Pair]]
DocEpisodesFn = Callable[[Document], Iterator[Pair]]
RecordFn = Callable[[Record], EpisodeIn]
TokenRecordFn = Callable[[Record, TokenDecoder | None], EpisodeIn]
SniffFn = Callable[[Document], bool]


@dataclass(frozen=True)
class Format:
    """One upload format: what ``GET /api/formats`` lists and what detection and parsing call."""

    name: str
    description: str
    priority: int  # lower is sniffed first; unique
    sniff: SniffFn
    episodes: EpisodesFn
    takes_tokenizer: bool  # shows token ids through a ``tokenizer`` part (a tokenizer.json)
    module: str
    streams: bool = False  # reads JSONL by lines alone: may be given a document still arriving

    def stream(self, doc: Document, tokenizer: TokenDecoder | None = None) -> Iterator[Pair]:
        """The format's ``(line, episode)`` pairs of ``doc``; ``tokenizer`` only reaches the
        formats that take one."""
        return self.episodes(doc, tokenizer if self.takes_tokenizer else None)


# name -> Format, in sniffing order (ascending priority).
FORMATS: dict[str, Format] = {}


class RegistrationError(RuntimeError):
    """A format module that breaks the registry's rules (a programming error, found at import)."""


def each_record(fn: RecordFn) -> EpisodesFn:
    """The episodes of a format whose records map one-to-one onto episodes: each record of the
    document, as it is read, through ``fn``."""
    return each_record_with_tokenizer(lambda rec, _tokenizer: fn(rec))


def each_record_with_tokenizer(fn: TokenRecordFn) -> EpisodesFn:
    """:func:`each_record` for a record function that takes the upload's tokenizer."""

    def episodes(doc: Document, tokenizer: TokenDecoder | None) -> Iterator[Pair]:
        for rec in doc.records():
            yield rec.line, fn(rec, tokenizer)

    return episodes


def _without_tokenizer(fn: DocEpisodesFn) -> EpisodesFn:
    def episodes(doc: Document, _tokenizer: TokenDecoder | None) -> Iterator[Pair]:
        return fn(doc)

    return episodes


def register_format(
    *,
    name: str,
    description: str,
    priority: int,
    sniff: SniffFn,
    episodes: DocEpisodesFn | EpisodesFn | None = None,
    record: RecordFn | TokenRecordFn | None = None,
    takes_tokenizer: bool = False,
    module: str | None = None,
    streams: bool = False,
) -> Format:
    """Register the format of the calling module (``module``: its ``__name__``, by default the
    caller's) and return it. Give exactly one of ``episodes`` (a generator function, see the module
    docstring) and ``record`` (one record -> one episode). Raises :class:`RegistrationError` for a
    name that is not the module's, a name or priority already taken, or a missing piece."""
    if module is None:
        module = str(sys._getframe(1).f_globals.get("__name__", ""))
    if name != module.rsplit(".", 1)[-1]:
        raise RegistrationError(
            f"format {name!r} is registered by module {module!r}: a format lives in the module "
            f"named after it (app/ingest/{name}.py)."
        )
    if not description or not callable(sniff):
        raise RegistrationError(f"format {name!r} needs a description and a sniff function.")
    if (episodes is None) == (record is None):
        raise RegistrationError(f"format {name!r}: give exactly one of `episodes` and `record`.")
    stream: EpisodesFn
    if episodes is None:
        stream = (
            each_record_with_tokenizer(cast(TokenRecordFn, record))
            if takes_tokenizer
            else each_record(cast(RecordFn, record))
        )
    elif takes_tokenizer:
        stream = cast(EpisodesFn, episodes)
    else:
        stream = _without_tokenizer(cast(DocEpisodesFn, episodes))
    for other in FORMATS.values():
        if other.module == module:
            continue  # the same module imported again (a reload): it replaces itself
        if other.name == name:
            raise RegistrationError(f"format {name!r} is registered twice ({other.module}, {module}).")
        if other.priority == priority:
            raise RegistrationError(
                f"formats {other.name!r} and {name!r} both have priority {priority}; the sniffing "
                "order must not depend on module names: choose a free priority."
            )
    fmt = Format(name, description, priority, sniff, stream, takes_tokenizer, module, streams)
    FORMATS[name] = fmt
    ordered = sorted(FORMATS.values(), key=lambda f: f.priority)
    FORMATS.clear()
    FORMATS.update((f.name, f) for f in ordered)
    return fmt


def discover(package: str = PACKAGE) -> dict[str, Format]:
    """Import every format module of ``package`` (app/ingest; each registers itself) and return
    :data:`FORMATS`; :class:`RegistrationError` names a module that registers nothing."""
    for info in pkgutil.iter_modules(sys.modules[package].__path__):
        if info.name.startswith("_"):
            continue
        qualified = f"{package}.{info.name}"
        importlib.import_module(qualified)
        if not any(f.module == qualified for f in FORMATS.values()):
            raise RegistrationError(
                f"module {qualified} registers no format: every module of app/ingest not starting "
                "with `_` is a format and calls register_format (helpers start with `_`)."
            )
    return FORMATS
