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


def test_join_tokens_reads_as_text_with_or_without_spacing_in_the_tokens():
    from app.core.tokenize import join_tokens

    # Pieces that carry their own spacing concatenate back to the text, as tokenize promises.
    assert join_tokens(tokenize("What is 2+2?")) == "What is 2+2?"
    assert join_tokens(["What", " is", " 2+2?"]) == "What is 2+2?"
    # Word-level tokens with no whitespace anywhere (the simulator's) are joined with spaces.
    assert join_tokens(["<task>", "Fix", "the", "bug", "."]) == "<task> Fix the bug ."
    assert join_tokens(["single"]) == "single" and join_tokens([]) == ""
