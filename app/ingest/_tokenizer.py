"""Server-side token display for uploads of ids: a ``tokenizer.json`` sent beside the file.

The file is read with the ``tokenizers`` library (``Tokenizer.from_str``; nothing is downloaded)
and only its vocabulary is used: each id becomes its piece, shown readably by the rules of
:mod:`creditlens.tokens` (byte-level ``Ġ``/``Ċ`` and SentencePiece ``▁`` become spaces and
newlines, byte fallbacks are decoded). Special tokens are kept verbatim and their positions
reported, for ``meta.special_tokens``. Ids outside the vocabulary show as ``⟨id⟩``.

Per upload, each distinct id is looked up once; a row is then one numpy gather, except a row
holding a character split over several tokens, which is decoded whole with
:func:`creditlens.tokens.display_pieces`.
"""

from __future__ import annotations

import numpy as np

from app.core.errors import ApiError
from creditlens.tokens import display_pieces, piece_text, vocab_mode

FIELD = "tokenizer"
_NONE = np.array(None, dtype=object)  # compared element by element: which slots hold no text


def _bad(message: str) -> ApiError:
    return ApiError(422, "bad_tokenizer", f"field `{FIELD}`: {message}", field=FIELD)


class TokenDecoder:
    """Display strings of token ids under one tokenizer's vocabulary."""

    def __init__(self, vocab: dict[str, int], special: set[str]) -> None:
        size = max(vocab.values(), default=-1) + 1
        self.size = size
        self._pieces = np.full(size + 1, None, dtype=object)  # the last slot: ids outside the vocab
        for piece, i in vocab.items():
            self._pieces[i] = piece
        self.special = frozenset(special)
        self.mode = vocab_mode([p for p in vocab if p not in self.special])
        self.is_special = np.zeros(size + 1, dtype=bool)
        for piece in self.special:
            if piece in vocab:
                self.is_special[vocab[piece]] = True
        # Display text per id, filled lazily for the ids an upload uses; None = not looked up yet
        # or (with ``readable`` False) a piece that depends on its neighbours.
        self.text = np.full(size + 1, None, dtype=object)
        self.filled = np.zeros(size + 1, dtype=bool)
        self.readable = np.ones(size + 1, dtype=bool)

    def _fill(self, ids: np.ndarray) -> None:
        need = np.unique(ids[~self.filled[ids]]) if ids.size else ids
        for i in need.tolist():
            piece = self._pieces[i]
            if piece is None:
                text = None  # shown as ⟨id⟩ by rows()
            elif self.is_special[i]:
                text = piece
            else:
                text = piece_text(piece, self.mode)
                self.readable[i] = text is not None
            self.text[i] = text
            self.filled[i] = True

    def row(self, ids: np.ndarray) -> tuple[list[str], list[int]]:
        """(display string per id, positions of special tokens) of one episode's ids."""
        ids = np.asarray(ids, dtype=np.int64)
        slot = np.where((ids >= 0) & (ids < self.size), ids, self.size)
        self._fill(slot)
        text = self.text[slot]
        missing = np.equal(text, _NONE) & self.readable[slot]  # ids without a piece
        if missing.any():
            text[missing] = [f"⟨{i}⟩" for i in ids[missing].tolist()]
        if not self.readable[slot].all():
            # A character split over tokens: decode the row's pieces as one sequence.
            raw = self._pieces[slot]
            pieces = np.where(np.equal(raw, _NONE), text, raw).tolist()  # ⟨id⟩ outside the vocab
            shown = display_pieces(pieces, self.special, mode=self.mode).text
        else:
            shown = text.tolist()
        return shown, np.flatnonzero(self.is_special[slot]).tolist()


def load_tokenizer(data: bytes, limit: int | None = None) -> TokenDecoder:
    """A :class:`TokenDecoder` from the bytes of a ``tokenizer.json``; ApiError 413 beyond
    ``limit`` bytes, 422 naming the field ``tokenizer`` when it is not a tokenizer file."""
    if limit is not None and len(data) > limit:
        raise ApiError(
            413,
            "too_large",
            f"field `{FIELD}`: the tokenizer file is {len(data)} bytes; the limit is {limit} bytes "
            "(setting CREDITLENS_MAX_TOKENIZER_BYTES).",
            field=FIELD,
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad("the tokenizer file is not UTF-8 text; send the tokenizer.json file.") from None
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:  # the library raises a bare Exception with serde's message
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _bad(f"not a Hugging Face tokenizer.json ({first}).") from None
    vocab = tok.get_vocab(with_added_tokens=True)
    if not vocab:
        raise _bad("the tokenizer has an empty vocabulary.")
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    return TokenDecoder(vocab, special)
