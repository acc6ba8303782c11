"""Readable token pieces: what a tokenizer's vocabulary entries look like as text.

Pure Python, no dependencies: the client uses it on ids it decodes with the user's tokenizer,
and the server can reuse it for uploads of ids that come with a ``tokenizer.json``.

Tokenizer vocabularies store pieces in an encoded form:

* byte-level BPE (GPT-2, Llama 3, Qwen): every byte is one printable character of a fixed
  table (OpenAI's ``bytes_to_unicode`` in GPT-2's ``encoder.py``): ``Ġ`` is a space, ``Ċ`` a
  newline, ``ĉ`` a tab, ``Ã©`` the two UTF-8 bytes of ``é``;
* SentencePiece (Llama 2, Mistral, Gemma): ``▁`` marks a space, and characters outside the
  vocabulary become byte-fallback pieces ``<0x0A>``.

:func:`display_pieces` turns such pieces back into text. A character whose UTF-8 bytes are split
over several tokens (an emoji in byte-level BPE, ``<0xE2><0x82><0xAC>`` for ``€``) is shown on
the token that completes it; the earlier tokens of it show as empty strings, so the pieces still
concatenate to the decoded text. Bytes that never form a valid character show as U+FFFD.
Special tokens (``<|im_start|>``, ``</s>``) are kept verbatim and reported.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Collection, Sequence
from functools import lru_cache
from typing import Literal, NamedTuple

__all__ = ["Display", "bytes_to_unicode", "display_pieces", "piece_text", "vocab_mode"]

Mode = Literal["auto", "byte_level", "sentencepiece", "plain"]

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SP_SPACE = "\u2581"  # ▁


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table: printable Latin-1 bytes map to themselves,
    the other 68 bytes to U+0100 onwards (so 0x20 space -> ``Ġ``, 0x0A newline -> ``Ċ``)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


@lru_cache(maxsize=1)
def _unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


class Display(NamedTuple):
    """The result of :func:`display_pieces`: one display string per piece and the positions of
    the special tokens among them."""

    text: list[str]
    special: list[int]


def _byte_level_bytes(piece: str) -> bytes | None:
    """The bytes a byte-level piece stands for, or None if it is not a byte-level piece."""
    table = _unicode_to_bytes()
    try:
        return bytes(table[c] for c in piece)
    except KeyError:
        return None


def _sentencepiece_bytes(piece: str) -> bytes:
    m = _BYTE_FALLBACK.fullmatch(piece)
    if m:
        return bytes([int(m.group(1), 16)])
    return piece.replace(_SP_SPACE, " ").encode("utf-8")


def _guess_mode(pieces: Sequence[str], special: Collection[str]) -> Mode:
    """SentencePiece when a piece has ``▁`` or is a byte fallback; byte-level when every piece is
    in the byte table and either one of them has a remapped byte (``Ġ``, ``Ċ``: U+0100 and up,
    never in ordinary Latin text) or their bytes decode as UTF-8 (a plain ``café`` does not: ``é``
    would be the lone byte 0xE9); plain otherwise. Callers who know the tokenizer pass ``mode``."""
    ordinary = [p for p in pieces if p not in special]
    if any(_SP_SPACE in p or _BYTE_FALLBACK.fullmatch(p) for p in ordinary):
        return "sentencepiece"
    chunks = []
    remapped = False
    for p in ordinary:
        b = _byte_level_bytes(p)
        if b is None:
            return "plain"
        chunks.append(b)
        remapped = remapped or any(ord(c) >= 0x100 for c in p)
    if remapped:
        return "byte_level"
    try:
        b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        return "plain"
    return "byte_level"


def vocab_mode(vocab: Collection[str]) -> Mode:
    """The piece encoding of a whole vocabulary (more reliable than one sequence's pieces):
    SentencePiece if ``▁`` pieces or byte fallbacks are common, byte-level if ``Ġ`` is, else plain."""
    n_sp = n_bl = 0
    for p in vocab:
        if _SP_SPACE in p or _BYTE_FALLBACK.fullmatch(p):
            n_sp += 1
        elif "Ġ" in p or "Ċ" in p:
            n_bl += 1
    if not n_sp and not n_bl:
        return "plain"
    return "sentencepiece" if n_sp >= n_bl else "byte_level"


def display_pieces(
    pieces: Sequence[str], special: Collection[str] = frozenset(), mode: Mode = "auto"
) -> Display:
    """Readable text for a sequence of tokenizer pieces (one episode's tokens, in order).

    ``special``: the tokenizer's special tokens (kept verbatim and reported in ``.special``).
    ``mode``: ``"byte_level"``, ``"sentencepiece"``, ``"plain"`` (pieces are already text), or
    ``"auto"`` (the default; see the module docstring for the rule). Returns
    ``Display(text, special)``: ``len(text) == len(pieces)``."""
    special = frozenset(special)
    if mode == "auto":
        mode = _guess_mode(pieces, special)
    out: list[str] = []
    marked: list[int] = []
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for i, piece in enumerate(pieces):
        if piece in special:
            # Bytes left pending before a special token never complete a character.
            pending = decoder.decode(b"", final=True)
            if pending and out:
                out[-1] += pending
            decoder.reset()
            out.append(piece)
            marked.append(i)
            continue
        if mode == "plain":
            out.append(piece)
            continue
        if mode == "byte_level":
            raw = _byte_level_bytes(piece)
            if raw is None:  # a piece outside the table (an added token): shown as it is
                out.append(decoder.decode(b"", final=True) + piece)
                decoder.reset()
                continue
        else:
            raw = _sentencepiece_bytes(piece)
        out.append(decoder.decode(raw))
    tail = decoder.decode(b"", final=True)
    if tail and out:
        out[-1] += tail
    return Display(out, marked)


def piece_text(piece: str, mode: Mode) -> str | None:
    """The display of one (non-special) piece on its own, or None when it depends on its
    neighbours (part of a character split over tokens, or ``mode="auto"``). Where every piece
    of a sequence has one, joining them equals :func:`display_pieces` — a per-vocabulary cache
    of this is the fast path for long sequences."""
    if mode == "plain":
        return piece
    if mode == "byte_level":
        raw = _byte_level_bytes(piece)
        if raw is None:
            return piece
    elif mode == "sentencepiece":
        raw = _sentencepiece_bytes(piece)
    else:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
