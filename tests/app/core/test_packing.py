"""The store's array packing (app/core/packing.py): exact to the bit, compact, and old rows still read.

Oracles we did not write: the zstd payloads are standard zstd frames that Debian's ``zstd`` tool
decompresses to the byte-shuffled values; a byte shuffle is checked against its definition
(numpy's own transpose of the byte matrix).
"""

from __future__ import annotations

import shutil
import struct
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from app.core import packing as pk

F64 = np.dtype("<f8")


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def roundtrip(a: np.ndarray, dtype=None) -> np.ndarray:
    blob = pk.pack(a)
    assert pk.is_packed(blob)
    assert len(blob) % 4 == 3
    out = pk.unpack(blob, a.dtype if dtype is None else dtype)
    assert out.flags.writeable
    return out


def header(blob: bytes) -> tuple[int, int, int, int, int, int]:
    return struct.unpack_from("<BBBBII", blob)


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(F64, st.integers(0, 300), elements=st.floats(allow_nan=False, width=64)))
def test_float64_round_trip_is_bit_exact(a):
    out = roundtrip(a)
    assert out.dtype == F64 and bits(out) == bits(a)


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.dtype("<f4"), st.integers(0, 300), elements=st.floats(allow_nan=False, width=32)))
def test_float32_values_come_back_as_the_same_float64(a):
    out = roundtrip(a.astype(F64))
    assert bits(out) == bits(a.astype(F64))
    if len(a) > 1 and len(np.unique(a.view("<u4"))) > 1:
        assert header(pk.pack(a.astype(F64)))[3] == 4  # stored as float32


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.dtype("<i8"), st.integers(0, 300), elements=st.integers(-(2**63), 2**63 - 1)))
def test_int64_round_trip(a):
    assert bits(roundtrip(a)) == bits(a)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3000)), min_size=1, max_size=40),
)
def test_kind_runs_round_trip(runs):
    a = np.repeat(np.array([v for v, _ in runs], np.uint8), [n for _, n in runs])
    assert bits(roundtrip(a)) == bits(a)


def test_signed_zero_and_subnormals_are_kept():
    a = np.array([-0.0, 0.0, 5e-324, -2.2250738585072014e-308, np.float32(1e-45)], dtype=F64)
    out = roundtrip(a)
    assert bits(out) == bits(a)
    assert np.signbit(out[0]) and not np.signbit(out[1])


def test_a_float64_only_value_keeps_the_array_in_float64():
    a = np.full(1000, 0.5)
    a[500] = 0.1  # not a float32
    blob = pk.pack(a)
    assert header(blob)[3] == 5
    assert bits(pk.unpack(blob, F64)) == bits(a)


def test_encodings_chosen():
    rng = np.random.default_rng(0)
    # One value: CONST, 12 header bytes + one float32 + pad.
    blob = pk.pack(np.zeros(8192))
    assert header(blob)[2] == pk.CONST and len(blob) == 19
    # A GRPO episode's advantages: 0 on the prompt, one value on the response: two runs.
    adv = np.zeros(8192)
    adv[1000:] = np.float32(-0.731)
    assert header(pk.pack(adv))[2] == pk.RLE
    # Kinds of a multi-turn episode: a few runs.
    kinds = np.repeat(np.array([0, 1, 2, 1, 2, 1], np.uint8), [500, 900, 300, 1200, 100, 5000])
    blob = pk.pack(kinds)
    assert header(blob)[2] == pk.RLE and len(blob) < 60
    # Random float32 logprobs: byte-shuffled zstd, smaller than the raw float32 bytes.
    lp = (-rng.exponential(0.5, 8192)).astype(np.float32).astype(F64)
    blob = pk.pack(lp)
    assert header(blob)[2] == pk.ZSTD and len(blob) < 0.95 * 4 * 8192
    # Incompressible bytes are stored raw (never bigger than raw + header + pad).
    noise = np.frombuffer(rng.bytes(8 * 300), dtype="<u8") >> np.uint64(2)
    blob = pk.pack(noise.view("<i8"))
    assert header(blob)[2] == pk.RAW and len(blob) <= 8 * 300 + 15


def test_empty_arrays():
    for dtype in ("u1", "<i4", "<i8", "<f8"):
        out = roundtrip(np.zeros(0, dtype=dtype))
        assert out.shape == (0,) and out.dtype == np.dtype(dtype)


def test_ints_stored_as_int32_when_they_fit():
    ids = np.random.default_rng(1).integers(0, 151_000, 8192)
    blob = pk.pack(ids)  # int64 in
    assert header(blob)[3] == 2
    assert len(blob) < 0.7 * 4 * 8192  # the high byte plane is all zeros
    out = pk.unpack(blob, np.int32)
    assert out.dtype == np.int32 and (out == ids).all()
    assert pk.unpack(blob, np.int64).dtype == np.int64


@pytest.mark.parametrize(
    "dtype,values",
    [
        ("<f8", [0.5, -1.25, 3.0]),  # 24 bytes: a multiple of 4
        ("<i4", [7, -1, 255, 3]),
        ("u1", [0, 1, 2, 1, 0, 0, 2]),  # 7 bytes: 3 mod 4, but kinds never start with 0xFF
        ("u1", [2, 2, 1]),
    ],
)
def test_old_rows_plain_bytes_still_read(dtype, values):
    old = np.array(values, dtype=dtype).tobytes()  # what a column held before packing
    assert not pk.is_packed(old)
    assert pk.unpack(old, dtype).tolist() == values
    assert pk.packed_length(old, dtype) == len(values)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=64).map(lambda b: b[: len(b) - len(b) % 4]))
def test_no_plain_float_or_int_column_looks_packed(b):
    # Every old float64/int32 column is a multiple of 4 bytes long: never 3 mod 4.
    assert not pk.is_packed(b)


def test_packed_length_reads_the_header():
    blob = pk.pack(np.arange(1234, dtype=np.int32))
    assert pk.packed_length(blob, "<i4") == 1234


def test_a_pinned_blob_still_decodes():
    # Bytes written by format version 1 (pack(np.array([0., 0., 0.25, 0.25, -1.5]))), kept here
    # verbatim so a later change of the writer can never make stored rows unreadable.
    blob = bytes.fromhex("ff010004050000001400000000000000000000000000803e0000803e0000c0bf000000")
    assert pk.unpack(blob, F64).tolist() == [0.0, 0.0, 0.25, 0.25, -1.5]
    assert pk.pack(np.array([0.0, 0.0, 0.25, 0.25, -1.5])) == blob


def test_corrupt_or_unknown_blobs_raise():
    blob = bytearray(pk.pack(np.arange(100, dtype=np.int32) * 7919))
    with pytest.raises(ValueError):
        pk.unpack(bytes([0xFF, 9]) + bytes(blob[2:]), "<i4")  # unknown version
    blob[-8] ^= 0xFF
    with pytest.raises((ValueError, OSError)):
        pk.unpack(bytes(blob), "<i4")


def test_text_round_trip():
    text = '["<|im_start|>", "user", "\\n", "Wie", " geht", "\'s", "?", " 你好", "🙂"]' * 200
    blob = pk.pack_text(text)
    assert pk.is_packed(blob) and len(blob) < len(text.encode()) / 5
    assert pk.unpack_text(blob) == text
    assert pk.unpack_text(pk.pack_text("")) == ""
    with pytest.raises(ValueError):
        pk.unpack(blob, "u1")
    with pytest.raises(ValueError):
        pk.unpack_text(pk.pack(np.zeros(3)))


def test_byte_shuffle_matches_its_definition():
    a = np.array([1.5, -2.0, 3.25], dtype="<f4")
    expected = a.view("u1").reshape(3, 4).T.tobytes()  # byte 0 of each, then byte 1 of each, ...
    assert pk._shuffle(a) == expected
    assert bits(pk._unshuffle(expected, np.dtype("<f4"), 3)) == bits(a)


@pytest.mark.skipif(shutil.which("zstd") is None, reason="Debian's zstd tool is not installed")
def test_zstd_payload_is_a_standard_frame(tmp_path):
    lp = (-np.random.default_rng(2).exponential(0.5, 4096)).astype("<f4")
    blob = pk.pack(lp.astype(F64))
    _, _, encoding, _, n, size = header(blob)
    assert encoding == pk.ZSTD and n == 4096
    payload = blob[12 : 12 + size]
    assert payload[:4] == bytes.fromhex("28b52ffd")  # zstd's frame magic number
    (tmp_path / "p.zst").write_bytes(payload)
    out = subprocess.run(["zstd", "-d", "-c", str(tmp_path / "p.zst")], capture_output=True, check=True)
    assert out.stdout == lp.view("u1").reshape(-1, 4).T.tobytes()
