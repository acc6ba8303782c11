"""The safetensors upload format (app/ingest/safetensors.py), the Python client's wire format,
through the real app: the example fixtures/formats/safetensors/batch.safetensors (written by the
client's own code, make_batch.py beside it), a round trip of what the client writes, and
malformed files refused with a 4xx naming the tensor while the database stays unchanged."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save

from creditlens import _batch
from tests.app.ingest.fmt_helpers import example, fixture_module, stored
from tests.app.svc_helpers import row_counts

B, T = 3, 8


def test_example_batch(client):
    """What make_batch.py wrote: padding dropped, the tool token inside row 0's response, float32
    log-probs read back exactly, one group per row."""
    data = example("safetensors/batch.safetensors")
    assert fixture_module("safetensors/make_batch").batch_bytes() == data  # the file cannot drift
    batch, eps = stored(client, "batch.safetensors", data)
    assert batch["source"] == "upload:safetensors"
    assert eps[0]["tokens"] == [f"⟨{i}⟩" for i in range(102, 108)]
    assert eps[0]["kinds"] == ["prompt", "policy", "policy", "tool", "policy", "policy"]
    assert eps[1]["kinds"] == ["prompt"] * 2 + ["policy"] * 6
    lp = np.linspace(-1.0, -0.25, 16, dtype=np.float32).reshape(2, 8)
    assert eps[0]["logprobs"] == lp[0, 2:].astype(float).tolist()
    assert eps[1]["logprobs"] == lp[1].astype(float).tolist()
    assert [e["reward"] for e in eps] == [1.0, 0.0] and [e["group"] for e in eps] == ["3", "4"]
    assert eps[0]["advantages"] == [0.0, 0.5, 0.5, 0.0, 0.5, 0.5]


def post(client, body: bytes, fmt: str | None = "safetensors"):
    params = {"format": fmt} if fmt else {}
    return client.post(
        "/api/uploads", content=body, params=params, headers={"content-type": "application/octet-stream"}
    )


def refused_naming(client, body: bytes, field: str, code: str):
    """Post ``body``: a 4xx whose error names ``field`` (in the message too) with ``code``, and
    nothing stored. The response, for a test that asks more of it."""
    r = post(client, body)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert (err["field"], err["code"]) == (field, code), err
    assert f"`{field}`" in err["message"]
    assert row_counts(client) == (0, 0)
    return r


def tensors() -> dict[str, np.ndarray]:
    kinds = np.array(
        [[0, 0, 1, 1, 2, 1, 255, 255], [0, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 255, 255, 255, 255]]
    )
    rng = np.random.default_rng(1)
    return {
        "kinds": kinds.astype(np.uint8),
        "token_ids": np.arange(B * T, dtype=np.int32).reshape(B, T),
        "values": rng.random((B, T)).astype(np.float32),
        "logprobs": -rng.random((B, T)),
        "advantages": rng.standard_normal((B, T)).astype(np.float16),
        "entropy": rng.random((B, T)).astype(np.float32),
        "reward": np.array([1.0, 0.0, 1.0]),
        "groups": np.array([7, 7, 8], dtype=np.int64),
    }


def raw_file(header: dict, data: bytes, n: int | None = None) -> bytes:
    """A safetensors file written by hand (for files the library would refuse to write)."""
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if n is None else n) + h + data


def test_round_trip_through_the_app(client):
    t = tensors()
    meta = {"tokens": json.dumps([["<s>", "Hi", " there", "!", "\n", "ok"], list("abcdefgh"), list("wxyz")])}
    r = post(client, save(t, metadata=meta))
    assert r.status_code == 201, r.text
    slugs = [e["slug"] for e in r.json()["episodes"]]
    eps = [client.get(f"/api/episodes/{s}").json() for s in slugs]
    assert eps[0]["tokens"] == ["<s>", "Hi", " there", "!", "\n", "ok"]
    assert eps[0]["kinds"] == ["prompt", "prompt", "policy", "policy", "tool", "policy"]
    assert eps[2]["kinds"] == ["prompt", "prompt", "prompt", "policy"]
    keep = t["kinds"][0] != 255
    np.testing.assert_allclose(eps[0]["values"], t["values"][0][keep], rtol=1e-6)
    np.testing.assert_allclose(eps[1]["logprobs"], t["logprobs"][1])
    np.testing.assert_allclose(eps[0]["advantages"], t["advantages"][0][keep].astype(float))
    np.testing.assert_allclose(eps[2]["entropy"], t["entropy"][2][:4], rtol=1e-6)
    assert eps[0]["token_ids"] == [0, 1, 2, 3, 4, 5]
    assert [e["group"] for e in eps] == ["7", "7", "8"]
    assert [e["reward"] for e in eps] == [1.0, 0.0, 1.0]
    # The format is recognised without format=.
    r = post(client, save(t), fmt=None)
    assert r.status_code == 201, r.text
    ep = client.get(f"/api/episodes/{r.json()['episodes'][1]['slug']}").json()
    assert ep["tokens"][:3] == ["⟨8⟩", "⟨9⟩", "⟨10⟩"]


def test_client_batch_with_bfloat16_and_padding_nan(client):
    torch = pytest.importorskip("torch")
    attn = torch.ones(2, 6, dtype=torch.long)
    attn[1, 4:] = 0
    logprobs = torch.full((2, 6), -0.5)
    logprobs[1, 5] = float("nan")  # on padding: ignored
    snap = _batch.snapshot(
        token_ids=torch.arange(12).view(2, 6),
        attention_mask=attn,
        policy_mask=torch.tensor([[0, 1, 1, 0, 1, 1], [0, 0, 1, 1, 0, 0]]),
        advantages=torch.linspace(-1, 1, 12).view(2, 6).to(torch.bfloat16),
        logprobs=logprobs,
        reward=torch.tensor([0.0, 1.0]),
    )
    r = post(client, _batch.build(snap))
    assert r.status_code == 201, r.text
    ep = client.get(f"/api/episodes/{r.json()['episodes'][1]['slug']}").json()
    assert ep["kinds"] == ["prompt", "prompt", "policy", "policy"]
    assert ep["logprobs"] == [-0.5] * 4
    want = torch.linspace(-1, 1, 12).view(2, 6).to(torch.bfloat16).float()[1, :4].tolist()
    assert ep["advantages"] == want


def _with(**changes) -> bytes:
    t = tensors()
    t.update(changes)
    return save({k: v for k, v in t.items() if v is not None})


def _nan_values() -> np.ndarray:
    v = tensors()["values"]
    v[1, 3] = np.nan
    return v


def _lying_offsets() -> bytes:
    # token_ids claims to start inside kinds: the ranges overlap and the file's last bytes are orphaned.
    header = {
        "kinds": {"dtype": "U8", "shape": [B, T], "data_offsets": [0, B * T]},
        "token_ids": {"dtype": "I32", "shape": [B, T], "data_offsets": [B * T - 8, 5 * B * T - 8]},
    }
    return raw_file(header, bytes(5 * B * T))


def _huge_shape() -> bytes:
    header = {
        "kinds": {"dtype": "U8", "shape": [B, T], "data_offsets": [0, B * T]},
        "values": {"dtype": "F32", "shape": [10**9, 10**9], "data_offsets": [B * T, B * T + 4 * B * T]},
    }
    return raw_file(header, bytes(5 * B * T))


def _truncated() -> tuple[bytes, str]:
    """The file without its last 10 bytes, and the tensor stored last (the one cut)."""
    good = _with()
    (n,) = struct.unpack_from("<Q", good)
    header = json.loads(good[8 : 8 + n])
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    return good[:-10], last


MALFORMED = {
    "wrong shape": (_with(values=np.zeros((B, T + 1), np.float32)), "values", "length_mismatch"),
    "wrong rank": (_with(reward=np.zeros((B, 1))), "reward", "length_mismatch"),
    "float token ids": (_with(token_ids=np.zeros((B, T), np.float32)), "token_ids", "wrong_type"),
    "int values": (_with(values=np.zeros((B, T), np.int32)), "values", "wrong_type"),
    "NaN on a token": (_with(values=_nan_values()), "values", "not_finite"),
    "inf reward": (_with(reward=np.array([1.0, np.inf, 0.0])), "reward", "not_finite"),
    "unknown kind": (_with(kinds=np.full((B, T), 7, np.uint8)), "kinds", "unknown_kind"),
    "all padding": (_with(kinds=np.full((B, T), 255, np.uint8)), "kinds", "bad_safetensors"),
    "unknown tensor": (_with(foo=np.zeros(3)), "foo", "unknown_field"),
    "no kinds": (_with(kinds=None), "kinds", "missing_field"),
    "offsets overlap": (_lying_offsets(), "token_ids", "bad_safetensors"),
    "huge declared shape": (_huge_shape(), "values", "bad_safetensors"),
    # Cut off: the file is damaged, naming the tensor the cut runs through (app/ingest/_damage.py).
    "truncated data": (*_truncated(), "damaged_file"),
    "tokens of the wrong length": (
        save(tensors(), metadata={"tokens": json.dumps([["a"], ["b"], ["c"]])}),
        "tokens",
        "bad_safetensors",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_names_the_tensor_and_stores_nothing(client, case):
    refused_naming(client, *MALFORMED[case])


def test_malformed_rows_are_named():
    from app.core.errors import ApiError
    from app.ingest import parse_upload

    with pytest.raises(ApiError) as e:
        parse_upload(_with(values=_nan_values()), "safetensors")
    assert e.value.episode == 2 and "position 3" in e.value.message


@pytest.mark.parametrize(
    "body, code",
    [
        (struct.pack("<Q", 2**62) + b"{}", "bad_safetensors"),  # a header length far beyond the file
        (struct.pack("<Q", 40) + b'{"kinds": ', "damaged_file"),  # a header cut short
        (b"\x01\x02", "bad_safetensors"),  # shorter than the length prefix
        (
            raw_file({"kinds": {"dtype": "U8", "shape": [1, 2], "data_offsets": [0, 2]}}, b"\x01\x01", n=5),
            "damaged_file",  # the header's JSON is cut
        ),
    ],
    ids=["huge header length", "truncated header", "tiny", "bad json"],
)
def test_broken_headers_are_422(client, body, code):
    r = post(client, body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == code
    assert row_counts(client) == (0, 0)
