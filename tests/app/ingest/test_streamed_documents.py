"""A document still arriving (app/ingest/_document.py ``Document(head, rest)``, what the server
hands the reading thread for a large raw upload): its lines are the lines of the whole upload
wherever the segments cut them, and only a format read line by line is read before the upload is
all here (app/ingest/__init__.py ``iter_upload(..., rest=...)``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

from app.core.errors import ApiError
from app.ingest import iter_upload
from app.ingest._document import Document
from tests.app.ingest.fmt_helpers import example
from tests.app.svc_helpers import episode, jsonl


def _cut(data: bytes, at: list[int]) -> list[bytes]:
    bounds = [0, *sorted(at), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


TEXTS = [
    b'{"a": 1}\n{"b": 2}\n\n   \n{"c": [1, 2, 3]}\n',
    b'{"a": 1}\r\n{"b": 2}\r\n',  # CRLF: the "\r" stays with its line, as JSON allows
    b'{"a": 1}\n{"b": 2}',  # no newline at the end
    b"\n\n{}\n",
]


@pytest.mark.parametrize("text", TEXTS)
def test_lines_are_the_same_wherever_the_segments_cut(text):
    whole = list(Document(text).lines())
    rng = np.random.default_rng(0)
    for _ in range(200):
        k = int(rng.integers(1, 6))
        at = rng.integers(0, len(text) + 1, k).tolist()
        head, *rest = _cut(text, at)
        assert list(Document(head, iter(rest)).lines()) == whole, at
    # Every single cut, and one byte per segment.
    for i in range(len(text) + 1):
        head, *rest = _cut(text, [i])
        assert list(Document(head, iter(rest)).lines()) == whole
    head, *rest = _cut(text, list(range(1, len(text))))
    assert list(Document(head, iter(rest)).lines()) == whole


class Pulled:
    """The segments of an upload, counting how many the reader has taken."""

    def __init__(self, segments: list[bytes]) -> None:
        self.segments = segments
        self.taken = 0

    def __iter__(self) -> Iterator[bytes]:
        for s in self.segments:
            self.taken += 1
            yield s


def _segments(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_a_prime_rl_rank_file_is_read_as_it_arrives():
    line = example("prime_rl_tokens/rank_0.jsonl").splitlines()[0] + b"\n"
    data = line * 40
    head, *rest = _segments(data, 4 * len(line) + 17)  # the head holds 4 lines and a part
    pulled = Pulled(rest)
    fmt, pairs = iter_upload(head, rest=iter(pulled))
    assert fmt == "prime_rl_tokens" and pulled.taken == 0
    first = [next(pairs) for _ in range(4)]
    assert [n for n, _ in first] == [1, 2, 3, 4] and pulled.taken == 0  # the head's lines only
    next(pairs)
    assert pulled.taken == 1  # the fifth line ends in the first segment after the head
    rest_pairs = list(pairs)
    assert pulled.taken == len(rest) and len(rest_pairs) == 35 and rest_pairs[-1][0] == 40
    # The same episodes as the whole file read at once.
    _, whole = iter_upload(data)
    a = [ep for _, ep in whole]
    _, again = iter_upload(head, rest=iter(rest))
    b = [ep for _, ep in again]
    assert len(a) == len(b) == 40
    for x, y in zip(a, b, strict=True):
        assert x.token_ids.tolist() == y.token_ids.tolist() and x.group == y.group
        assert all(np.array_equal(x.floats[k], y.floats[k]) for k in x.floats)


def test_any_other_upload_is_joined_before_it_is_read():
    data = jsonl([episode() for _ in range(30)]).encode()  # native JSONL: not read line by line
    head, *rest = _segments(data, 100)
    pulled = Pulled(rest)
    fmt, pairs = iter_upload(head, rest=iter(pulled))
    assert fmt == "native" and pulled.taken == len(rest)
    assert len(list(pairs)) == 30


def test_an_upload_that_is_no_format_is_refused_once_it_is_all_here():
    data = b'{"schema_version": 1, "token_ids": [1], "loss_mask": [true]' * 20  # never a whole record
    head, *rest = _segments(data, 100)
    pulled = Pulled(rest)
    with pytest.raises(ApiError) as err:
        iter_upload(head, rest=iter(pulled))
    assert pulled.taken == len(rest) and err.value.status == 422


def test_a_head_without_a_whole_first_record_is_joined_and_read():
    line = example("prime_rl_tokens/rank_0.jsonl").splitlines()[0] + b"\n"
    data = line * 3
    head, *rest = _segments(data, len(line) // 3)  # the head is a third of the first record
    pulled = Pulled(rest)
    fmt, pairs = iter_upload(head, rest=iter(pulled))
    assert pulled.taken == len(rest) and fmt == "prime_rl_tokens"
    assert len(list(pairs)) == 3
    assert json.loads(line)["token_ids"]  # the example has ids
