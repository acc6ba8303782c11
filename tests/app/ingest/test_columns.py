"""The column reader (app/ingest/_columns.py) against Python's own JSON reader: every list of
numbers it hands over as an array holds exactly the floats ``json.loads`` reads from the same text,
and every line it leaves to the generic reader is one where simdjson and Python's reader would
not agree."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from app.ingest._columns import ColumnReader, compiled_available


@pytest.fixture(params=[True, False], ids=["compiled", "simdjson"])
def make(request):
    """ColumnReader with the compiled list reader (app/ingest/_numbers.c), and without it (the
    reader a server built without a C compiler uses): the same answers."""
    if request.param:
        assert compiled_available()  # the test environment builds it
    return functools.partial(ColumnReader, compiled=request.param)


def _reprs(rng: np.random.Generator) -> list[float]:
    """Decimals as trainers write them: float64 and float32 values through ``repr`` (17 and ~9
    significant digits), tiny, huge and subnormal magnitudes, signed zeros, round numbers."""
    out = [
        *rng.standard_normal(20_000).tolist(),
        *rng.standard_normal(20_000).astype(np.float32).tolist(),
        *(10.0 ** rng.uniform(-307, 308, 20_000)).tolist(),
        *(rng.standard_normal(2_000) * 5e-324 * 2**40).tolist(),  # subnormals
        5e-324,
        2.2250738585072014e-308,  # the smallest normal
        1.7976931348623157e308,
        -0.0,
        0.0,
        1.0,
        0.1,
        9007199254740993.0,  # 2**53 + 1: not a float64, rounds to even
    ]
    return [float(x) for x in out]


def test_numbers_are_exactly_what_python_reads(make):
    values = _reprs(np.random.default_rng(7))
    line = json.dumps({"x": values, "n": 3}).encode()
    got = make().read(line)
    assert got is not None
    want = np.array(json.loads(line)["x"], dtype=np.float64)
    assert got["x"].dtype == np.float64
    # Bit for bit (signed zeros included), not approximately.
    assert got["x"].view(np.uint64).tolist() == want.view(np.uint64).tolist()
    assert got["n"] == 3


def test_decimals_written_by_hand_round_correctly(make):
    # More digits than float64 holds, and halfway cases: each must round as Python's float does.
    texts = [
        "0.30000000000000004441",
        "2.4703282292062327e-324",  # just under half the smallest subnormal: 0
        "2.4703282292062328e-324",  # just over: the smallest subnormal
        "1.00000000000000011102230246251565404236316680908203125",  # exactly halfway: to even
        "1.00000000000000011102230246251565404236316680908203126",  # just over: up
        "123456789012345678901234567890.5",
        "-1e-400",
    ]
    line = ('{"x":[' + ",".join(texts) + "]}").encode()
    got = make().read(line)
    assert got is not None
    assert got["x"].view(np.uint64).tolist() == np.array([float(t) for t in texts]).view(np.uint64).tolist()


def test_integer_fields_come_as_int64(make):
    ids = [0, 1, 151_643, 2**62]
    got = make(integer_fields=["ids"]).read(json.dumps({"ids": ids, "f": ids}).encode())
    assert got is not None
    assert got["ids"].dtype == np.int64 and got["ids"].tolist() == ids
    assert got["f"].dtype == np.float64  # not named as integers: numbers as floats


def test_what_is_not_a_list_of_numbers_is_its_python_value(make):
    obj = {
        "mask": [True, False, True],
        "with_null": [0.5, None, 1.0],
        "ids_with_a_float": [1, 2.5],
        "words": ["a", "b"],
        "losses": [{"rl": {"advantage": 0.5, "mask": True}}],
        "empty": [],
        "scalar": "calc",
        "obj": {"a": 1},
        "nothing": None,
    }
    got = make(integer_fields=["ids_with_a_float"]).read(json.dumps(obj).encode())
    assert got is not None
    assert got["mask"].dtype == np.bool_ and got["mask"].tolist() == obj["mask"]  # read from its text
    for key in ("with_null", "ids_with_a_float", "words", "losses", "scalar", "obj", "nothing"):
        assert got[key] == obj[key] and not isinstance(got[key], np.ndarray), key
    assert isinstance(got["empty"], np.ndarray) and got["empty"].size == 0
    assert list(got) == list(obj)  # the keys in the line's order


@pytest.mark.parametrize(
    "line",
    [
        b'{"x": [1.0, NaN, 2.0]}',  # Python's json writes NaN; simdjson refuses it
        b'{"x": [Infinity]}',
        b'{"x": [1e400]}',  # beyond float64: Python reads inf
        b'{"x": [18446744073709551616]}',  # beyond 64 bits: Python reads an int
        b'{"x": [123456789012345678901234567890]}',
        b'{"x": [[1, 2], [3]]}',  # simdjson would read the numbers of the inner lists as one list
        b'{"x": [1, [2]], "y": [3]}',
        b'{"x": [0.5], "topk": [[1], [2]]}',
        b'{"x": [0.5], "o": {"a": [1]}}',  # a list inside an object: counted as nested
        b'{"x": [0.5], "s": "a[1]"}',  # "[" in a string: left too (rare, and never wrong)
        b'{"x": 1, "x": 2}',  # simdjson keeps the first, Python the last
        b"[1, 2, 3]",  # not an object
        b"3",
        b'{"x": [1, 2',  # cut mid-line
        b'{"x": "\xff"}',  # not UTF-8
    ],
)
def test_lines_left_to_the_generic_reader(make, line):
    assert make().read(line) is None


def test_one_reader_reads_many_lines(make):
    reader = make()
    for i in range(50):
        got = reader.read(json.dumps({"x": [i, i + 0.5]}).encode())
        assert got is not None and got["x"].tolist() == [i, i + 0.5]
    assert reader.read(b"not json") is None
    assert reader.read(b'{"x": [7]}') == {"x": pytest.approx(np.array([7.0]))}


def test_a_line_read_in_place_inside_a_larger_buffer(make):
    # The span of a line in an upload segment: what lies around it (other lines, their brackets)
    # is not read.
    line = b'{"x": [0.25, -1.5], "k": "v"}\n'
    buf = b'{"y": [[1], [2]]}\n' + line + b'{"z": [3'
    start = buf.index(line)
    got = make().read(buf, start, start + len(line))
    assert got is not None and got["x"].tolist() == [0.25, -1.5] and got["k"] == "v"
    assert make().read(buf, 0, start) is None  # the nested line before it


@pytest.mark.parametrize(
    "text, as_array",
    [
        (b'{"m": [true, false,\n true], "x": [1]}', True),
        (b'{"x": [0.5], "m":[true,false,true]}', True),
        (b'{"s": "t", "m" : [ true , false , true ] }', True),
        (b'{"m": [true, null, true]}', False),  # null: the list, as JSON gives it
        (b'{"m": [true, 0, true]}', False),
        (b'{"m": [true, "false", true]}', False),
        (b'{"m": ["a]", true]}', False),  # a "]" inside a string
        (b'{"m": [false]}', True),
    ],
)
def test_boolean_lists_are_read_from_their_text_only_when_that_is_exact(make, text, as_array):
    got = make().read(text)
    assert got is not None
    want = json.loads(text)["m"]
    if as_array:
        assert isinstance(got["m"], np.ndarray) and got["m"].dtype == np.bool_
        assert got["m"].tolist() == want
    else:
        assert got["m"] == want and isinstance(got["m"], list)


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):  # bit for bit, NaN included
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.tobytes() == b.tobytes()
        )
    return a == b and type(a) is type(b)


def test_both_readers_agree_on_the_prime_rl_examples():
    # The examples written as prime-rl's exporter writes them (fixtures/formats/prime_rl_tokens):
    # schema 2 with every per-token field, schema 1 with its `losses` objects and null rewards.
    # The compiled reader takes the first; the second has lists it leaves (objects, nulls).
    assert compiled_available()
    folder = Path(__file__).resolve().parents[3] / "fixtures" / "formats" / "prime_rl_tokens"
    taken = 0
    for path in sorted(folder.glob("rank_*.jsonl")):
        for line in path.read_bytes().splitlines():
            ints = ("token_ids", "position_ids")
            fast = ColumnReader(integer_fields=ints, compiled=True, null_as_nan=True)
            plain = ColumnReader(integer_fields=ints, compiled=False, null_as_nan=True)
            a, b = fast.read(line), plain.read(line)
            assert a is not None and b is not None
            assert list(a) == list(b) and all(_same(a[k], b[k]) for k in a), path.name
            taken += fast._compiled(line, 0, len(line)) is not None
    assert taken >= 1


def test_nulls_among_numbers_are_nan_when_asked(make):
    line = b'{"w": [null, null], "x": [1, null, 2.5], "ids": [1, null], "m": [true, null], "s": [null, "a"]}'
    got = make(integer_fields=["ids"], null_as_nan=True).read(line)
    assert got is not None
    assert got["w"].dtype == np.float64 and np.isnan(got["w"]).all()
    assert got["x"][[0, 2]].tolist() == [1.0, 2.5] and np.isnan(got["x"][1])
    # Not numbers and nulls alone, or integers asked for: the lists as JSON gives them.
    assert got["ids"] == [1, None] and got["m"] == [True, None] and got["s"] == [None, "a"]
    plain = make().read(line)
    assert plain is not None and plain["w"] == [None, None] and plain["x"] == [1, None, 2.5]
