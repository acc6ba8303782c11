"""The offline tokenizer: GPT-2's pre-tokenisation split, lossless."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.core.tokenize import tokenize


def test_gpt2_style_split():
    assert tokenize("Hello world's 123 foo_bar!!  x") == [
        "Hello",
        " world",
        "'s",
        " 123",
        " foo",
        "_",
        "bar",
        "!!",
        " ",
        " x",
    ]
    assert tokenize("def f(x):\n    return x") == ["def", " f", "(", "x", "):", "\n   ", " return", " x"]


@given(st.text())
def test_lossless(s):
    assert "".join(tokenize(s)) == s
