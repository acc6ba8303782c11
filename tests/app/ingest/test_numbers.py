"""The compiled list reader (app/ingest/_numbers.c) against Python's own reading of the same text:
every decimal becomes, bit for bit, the float64 ``float()`` makes of it, every integer the int
``int()`` makes; what is not a JSON number is refused; and the table of powers of five it relies on
is what its generator (app/ingest/_pow5_table.py) writes, each entry within the bound the reader's
checks assume."""

from __future__ import annotations

import json
import math
import random
import struct
from decimal import Decimal, getcontext

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.ingest import _pow5_table
from app.ingest._columns import ColumnReader, compiled_available

pytestmark = pytest.mark.skipif(not compiled_available(), reason="the compiled reader is not built")
if compiled_available():
    from app.ingest import _numbers  # type: ignore[attr-defined]


def _bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def _double(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def test_the_power_table_is_what_its_generator_writes():
    assert _pow5_table.HEADER.read_text() == _pow5_table.render()


def test_each_power_of_five_lies_within_one_above_its_entry():
    # 5^q * 2^s in [T, T + 1) with 2^127 <= T < 2^128: the one-sided error from_pow5 assumes.
    for q in range(_pow5_table.Q_MIN, _pow5_table.Q_MAX + 1):
        t, s = _pow5_table.entry(q)
        assert 1 << 127 <= t < 1 << 128
        num, den = (5**q, 1) if q >= 0 else (1, 5**-q)
        scaled_num, scaled_den = (num << s, den) if s >= 0 else (num, den << -s)
        assert t * scaled_den <= scaled_num < (t + 1) * scaled_den, q
    assert _pow5_table.entry(0) == (1 << 127, 127)
    assert _pow5_table.entry(1) == (5 << 125, 125)


def _halfway_tokens(rng: random.Random, n: int) -> list[str]:
    """Decimals at and around the exact midpoint between two neighbouring float64s: the midpoint in
    full (a tie: to even), cut to 17-19 significant digits, and one unit above or below in the last
    digit: the products the reader must not round on a guess."""
    getcontext().prec = 1200
    out = []
    for _ in range(n):
        x = _double(rng.randrange(1 << 52, 0x7FE0000000000000))
        mid = (Decimal(x) + Decimal(float(np.nextafter(x, np.inf)))) / 2
        digits, exp = mid.as_tuple().digits, mid.adjusted()
        out.append(f"{mid:e}")
        for keep in (17, 18, 19):
            body = "".join(map(str, digits[:keep]))
            for delta in (-1, 0, 1):
                d = str(int(body) + delta)
                out.append(f"{d[0]}.{d[1:]}e{exp + len(d) - keep}")
    return out


def _tokens(seed: int) -> list[str]:
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    tokens = [
        *map(repr, nrng.standard_normal(5_000).astype(np.float32).astype(float).tolist()),  # 16-17 digits
        *map(repr, nrng.standard_normal(5_000).tolist()),
        *(repr(_double(rng.randrange(0x7FF0000000000000))) for _ in range(20_000)),  # any finite float64
        *(repr(-_double(rng.getrandbits(52))) for _ in range(2_000)),  # subnormals
        *_halfway_tokens(rng, 2_000),
    ]
    for _ in range(20_000):  # up to 25 significant digits, exponents across the whole range
        d = rng.randint(1, 25)
        m = str(rng.randrange(10 ** (d - 1), 10**d))
        e = rng.randint(-345, 310)
        sign = "-" if rng.random() < 0.5 else ""
        shape = rng.randrange(4)
        if shape == 0:
            tokens.append(f"{sign}{m[0]}.{m[1:] or '0'}e{e}")
        elif shape == 1:
            tokens.append(f"{sign}{m}E+{abs(e) % 300}")
        elif shape == 2:
            tokens.append(f"{sign}0.{'0' * rng.randint(0, 30)}{m}")
        else:
            cut = rng.randint(1, len(m))
            tokens.append(f"{sign}{m[:cut]}.{m[cut:] or '0'}")
    tokens += [
        "0.0", "-0.0", "0e5", "-0E-5", "0.000", "1.0", "0.1", "0.5", "-2.5", "1e22", "1e23", "1e-22",
        "9007199254740993.0", "9007199254740992.5", "5e-324", "2.4703282292062327e-324",
        "2.4703282292062328e-324", "2.2250738585072011e-308", "2.2250738585072014e-308",
        "1.7976931348623157e308", "1.7976931348623158e308", "4.9406564584124654e-324",
        "1.00000000000000011102230246251565404236316680908203125",
        "1.00000000000000011102230246251565404236316680908203126",
        "0.30000000000000004441", "123456789012345678901234567890.5", "1e-400", "-1e-400",
        "1" + "0" * 19 + ".5", "0." + "0" * 340 + "1", "7.2057594037927933e16",
    ]  # fmt: skip
    return tokens


@pytest.mark.parametrize("seed", [1, 2])
def test_every_decimal_is_the_float_python_reads(seed):
    mismatches = []
    for token in _tokens(seed):
        got = _numbers.read_number(token.encode())
        if math.isinf(float(token)):  # beyond float64: left to the other readers
            assert got is None, token
            continue
        assert got is not None, token
        is_int, value = got
        assert not is_int, token
        if _bits(value) != _bits(float(token)):
            mismatches.append((token, value, float(token)))
    assert mismatches == []


def test_integers_are_python_ints_up_to_int64():
    for text in ["0", "-0", "7", "-7", "151643", "9007199254740993", str(2**63 - 1), str(-(2**63))]:
        assert _numbers.read_number(text.encode()) == (True, int(text)), text
    # One past int64 either way, and more digits: left to the other readers.
    for text in [str(2**63), str(-(2**63) - 1), "1" * 20, "-" + "9" * 25]:
        assert _numbers.read_number(text.encode()) is None, text


@pytest.mark.parametrize(
    "text",
    [
        "", "-", "+1", "01", "-01", "1.", ".5", "1.e5", "1e", "1e+", "1e-", "--1", "0x10", "1_000",
        "NaN", "Infinity", "-Infinity", "nan", "inf", "true", "null", '"1"', "1 ", " 1", "1,",
        "1e400", "-1e400", "1" * 400,  # beyond float64 (Python reads inf or a huge int)
    ],
)  # fmt: skip
def test_what_is_not_a_json_number_within_float64_is_refused(text):
    assert _numbers.read_number(text.encode()) is None


def _read(line: bytes, threads: int = 2, start: int = 0, stop: int | None = None):
    stop = len(line) if stop is None else stop
    got = _numbers.read_lists(line, start, stop, threads)
    if got is None:
        return None
    out = []
    for open_, close, kind, data in got:
        dtype = {_numbers.INT: np.int64, _numbers.BOOL: np.bool_, _numbers.EMPTY: np.uint8}.get(
            kind, np.float64
        )
        out.append((open_, close, kind, np.frombuffer(data, dtype=dtype).tolist()))
    return out


def test_each_list_of_a_line_with_its_place_and_kind():
    line = b'{"ids": [1, -2, 3], "x": [1, 2.5], "m": [true, false], "e": [ ], "s": "no list", "n": [null, 2]}'
    got = _read(line)
    opens = [i for i, c in enumerate(line) if c == ord("[")]
    assert [(o, line[c : c + 1]) for o, c, _, _ in got] == [(o, b"]") for o in opens]
    assert [(kind, values) for _, _, kind, values in got] == [
        (_numbers.INT, [1, -2, 3]),
        (_numbers.FLOAT, [1.0, 2.5]),  # an integer before the first float becomes a float
        (_numbers.BOOL, [True, False]),
        (_numbers.EMPTY, []),
        (_numbers.NULLS, [pytest.approx(float("nan"), nan_ok=True), 2.0]),  # NaN for each null
    ]


def test_whitespace_anywhere_json_allows_it():
    line = b'{"x": [\n 1 ,\t2.5\r\n, -3e0 ], "m": [ true ,false ]}'
    got = _read(line)
    assert [v for *_, v in got] == [[1.0, 2.5, -3.0], [True, False]]


@pytest.mark.parametrize(
    "line",
    [
        b'{"x": [1, 2,]}', b'{"x": [,]}', b'{"x": [1 2]}', b'{"x": [1, nul]}', b'{"x": [true, null]}', b'{"x": [1, "2"]}',
        b'{"x": [true, 1]}', b'{"x": [1, true]}', b'{"x": [tru]}', b'{"x": [True]}', b'{"x": [[1], [2]]}',
        b'{"x": [{"a": 1}]}', b'{"x": [1, NaN]}', b'{"x": [1, 2', b'{"s": "a[1, b"}',
        b'{"x": [1], "y": [2, oops]}',  # one bad list among good ones: the whole line
    ],
)  # fmt: skip
def test_a_line_with_any_list_not_flat_numbers_or_booleans_is_left(line):
    assert _read(line) is None


def test_threads_give_the_same_answer_as_one():
    rng = np.random.default_rng(3)
    obj = {f"f{i}": rng.standard_normal(int(rng.integers(0, 3000))).tolist() for i in range(40)}
    obj["ids"] = rng.integers(-(2**62), 2**62, 5000).tolist()
    line = json.dumps(obj).encode()
    one = _read(line, threads=1)
    assert one is not None and len(one) == 41
    for threads in (2, 3, 16, 64):  # more threads than lists or than the limit: capped
        assert _read(line, threads=threads) == one
    want = [np.array(v, dtype=np.int64 if k == "ids" else np.float64) for k, v in obj.items()]
    assert [np.array(v).tobytes() for *_, v in one] == [w.tobytes() for w in want]


def test_a_window_of_a_larger_buffer_is_read_alone():
    buf = b'{"a": [[1]]}\n{"x": [0.25, 4]}\n{"b": [1'
    start = buf.index(b'{"x"')
    stop = buf.index(b"\n", start)
    assert _read(buf, start=start, stop=stop) == [(start + 6, stop - 2, _numbers.FLOAT, [0.25, 4.0])]
    assert _read(buf, start=0, stop=start - 1) is None  # the nested list before it
    with pytest.raises(ValueError):
        _numbers.read_lists(buf, 5, len(buf) + 1, 1)


def test_the_arrays_outlive_the_line_they_came_from():
    line = bytearray(json.dumps({"x": [0.5] * 1000, "ids": list(range(1000))}).encode())
    got = _numbers.read_lists(line, 0, len(line), 2)
    arrays = [
        np.frombuffer(data, dtype=np.float64 if kind == _numbers.FLOAT else np.int64)
        for *_, kind, data in got
    ]
    line[:] = b" " * len(line)  # the upload's segment reused
    del got, line
    assert arrays[0].tolist() == [0.5] * 1000 and arrays[1].tolist() == list(range(1000))
    arrays[0][0] = 2.0  # writable, as numpy's own arrays are
    assert arrays[0][0] == 2.0


# --- any text: the reader declines, or agrees with Python's json to the bit


def _python_kind(items: list) -> tuple[int, list] | None:
    """What read_lists must answer for a list json.loads read, or None when it must decline."""
    if not items:
        return _numbers.EMPTY, []
    if all(type(v) is bool for v in items):
        return _numbers.BOOL, items
    if not all(v is None or type(v) in (int, float) for v in items):
        return None
    if any(type(v) is int and not -(2**63) <= v < 2**63 for v in items):
        return None
    if any(type(v) is float and math.isinf(v) for v in items):
        return None
    if any(v is None for v in items):
        return _numbers.NULLS, [math.nan if v is None else float(v) for v in items]
    if all(type(v) is int for v in items):
        return _numbers.INT, items
    return _numbers.FLOAT, [float(v) for v in items]


_TOKENS = st.one_of(
    st.integers(-(2**64), 2**64).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(width=32, allow_nan=False, allow_infinity=False).map(repr),
    st.from_regex(r"-?(0|[1-9][0-9]{0,22})(\.[0-9]{1,22})?([eE][+-]?[0-9]{1,3})?", fullmatch=True),
    st.sampled_from(
        ["true", "false", "null", "NaN", "-", "01", "1.", ".5", "1e", '"a"', "[", "]", "{}", "nul"]
    ),
)
_GLUE = st.sampled_from([",", ", ", " ,", ",\n", "\t,\r", ",,", " ", ""])


@st.composite
def _list_text(draw) -> str:
    tokens = draw(st.lists(_TOKENS, max_size=12))
    glue = [draw(_GLUE) if draw(st.integers(0, 9)) == 0 else "," for _ in tokens]
    body = "".join(
        t + (g if i + 1 < len(tokens) else "") for i, (t, g) in enumerate(zip(tokens, glue, strict=True))
    )
    return draw(st.sampled_from(["[", "[ ", "[\n"])) + body + draw(st.sampled_from(["]", " ]", "\t]"]))


@given(lists=st.lists(_list_text(), min_size=1, max_size=4), threads=st.integers(1, 3))
@settings(max_examples=400, deadline=None)
def test_any_line_of_lists_is_declined_or_read_as_python_reads_it(lists, threads):
    # The whole line through the column reader's compiled path: read_lists for the lists, json for
    # what is left. It takes exactly the lines whose every list it can read, and reads them to the bit.
    line = ("{" + ", ".join(f'"k{i}": {text}' for i, text in enumerate(lists)) + "}").encode()
    got = ColumnReader(threads=threads, null_as_nan=True)._compiled(line, 0, len(line))
    try:
        parsed = json.loads(line, parse_constant=lambda name: name)  # NaN stays text: declined
        want = [_python_kind(v) for v in parsed.values()]
    except ValueError:  # not JSON
        want = [None]
    if any(w is None for w in want):
        assert got is None
        return
    assert got is not None and list(got) == [f"k{i}" for i in range(len(lists))]
    for arr, (kind, values) in zip(got.values(), want, strict=True):
        if kind == _numbers.BOOL:
            assert arr.dtype == np.bool_ and arr.tolist() == values
        else:  # every list not named as integers comes as float64
            assert arr.dtype == np.float64
            assert arr.tobytes() == np.array(values, dtype=np.float64).tobytes()
