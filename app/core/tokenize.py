"""The offline, deterministic tokenizer used for text-only uploads (chat messages, verl rollout
JSONL, RL Logging Board without ``response_tokens``).

It is GPT-2's pre-tokenisation regex (the split that runs before BPE merges: optional leading
space + a run of letters, optional space + digits, optional space + punctuation, whitespace), with
no merges and no vocabulary file, so nothing is ever downloaded. It is lossless:
``"".join(tokenize(s)) == s`` for every string. Tokens are therefore words rather than subwords,
which is what a person wants to read; counts differ from the training tokenizer's.
"""

from __future__ import annotations

import re

NAME = "gpt2-pretokenizer-regex"

# GPT-2 uses \p{L} / \p{N}; Python's re has no Unicode classes, so letters are [^\W\d_] and the
# punctuation class takes the rest of the non-space characters, underscore included.
_PATTERN = re.compile(r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


_SPACE = re.compile(r"\s")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into GPT-2 pre-tokens; the pieces concatenate back to ``text``."""
    return _PATTERN.findall(text)


def join_tokens(tokens: list[str]) -> str:
    """The text a person reads for a run of tokens. Tokens that carry their own spacing (a
    tokenizer's decoded pieces, or ``tokenize`` above) are concatenated as they are; tokens that
    never hold whitespace at all, as word-level tokens such as the built-in simulator's are, are
    joined with single spaces, so "Fix the bug" does not read "Fixthebug"."""
    text = "".join(tokens)
    if len(tokens) > 1 and not _SPACE.search(text):
        return " ".join(tokens)
    return text
