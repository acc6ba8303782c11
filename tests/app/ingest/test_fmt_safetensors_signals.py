"""``token_signals.<name>`` tensors of the safetensors wire format (app/ingest/safetensors.py,
client/creditlens/wire.py): a user's own per-token signals, read as each episode's
``meta.token_signals[<name>]`` through the real app on a real database. The expected lists are
the tensors' non-padding positions written out by hand; floats come back as floats, null where
the number is NaN or infinite (as JSON null reads), ints as ints, BOOL as booleans. Malformed
signal tensors are a 422 naming the tensor, and nothing is stored."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from safetensors.numpy import save
from sqlalchemy import text

from app.core.errors import ApiError
from app.core.validate import ArrayEpisode, native_of
from app.ingest import parse_upload
from tests.app.ingest.test_fmt_safetensors import post, raw_file, refused_naming

nan, inf = math.nan, math.inf
B, T = 2, 5
# Row 0 ends with padding, row 1 starts with it: each keeps 4 of its 5 positions.
KINDS = np.array([[0, 1, 1, 2, 255], [255, 0, 1, 1, 1]], np.uint8)


def batch(**signals: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "kinds": KINDS,
        "token_ids": np.arange(B * T, dtype=np.int32).reshape(B, T),
        **{f"token_signals.{k}": v for k, v in signals.items()},
    }


# One signal per dtype family, the padding position holding what must not show (777, NaN, a
# uint64 beyond int64, True).
SIGNALS = {
    "ratio": np.array([[1.5, nan, 0.25, inf, 777.0], [888.0, -1.0, 2.0, nan, 0.5]], np.float32),
    "kl": np.array([[0.125, 0.5, 0.0, 1.0, 9.0], [9.0, 0.0625, 0.25, 0.75, 1.0]], np.float16),
    "weight": np.array([[0.1, 0.2, 0.3, 0.4, nan], [nan, 0.7, -0.0, 1e-310, 2.0]], np.float64),
    "is_masked": np.array([[0, 1, 0, 1, 1], [1, 0, 0, 1, 0]], bool),
    "count": np.array([[0, -3, 7, 2**31 - 1, 5], [-1, 4, 5, 6, 7]], np.int32),
    "steps": np.array([[0, 1, 2, 2**62, 2**64 - 1], [2**64 - 1, 5, 6, 7, 8]], np.uint64),
}
# By hand: row 0 without its last position, row 1 without its first; names in sorted order.
WANT = [
    {
        "count": [0, -3, 7, 2147483647],
        "is_masked": [False, True, False, True],
        "kl": [0.125, 0.5, 0.0, 1.0],
        "ratio": [1.5, None, 0.25, None],
        "steps": [0, 1, 2, 4611686018427387904],
        "weight": [0.1, 0.2, 0.3, 0.4],
    },
    {
        "count": [4, 5, 6, 7],
        "is_masked": [False, False, True, False],
        "kl": [0.0625, 0.25, 0.75, 1.0],
        "ratio": [-1.0, 2.0, None, 0.5],
        "steps": [5, 6, 7, 8],
        "weight": [0.7, -0.0, 1e-310, 2.0],
    },
]


def stored_meta_json(client, slug: str) -> dict:
    with client.app.state.engine.connect() as conn:
        raw = conn.execute(text("SELECT meta_json FROM episode WHERE slug = :s"), {"s": slug}).scalar_one()
    return json.loads(raw)


def metas(client, body: bytes) -> list[dict]:
    r = post(client, body)
    assert r.status_code == 201, r.text
    return [client.get(f"/api/episodes/{e['slug']}").json()["meta"] for e in r.json()["episodes"]]


def test_signals_round_trip_padding_dropped(client):
    r = post(client, save(batch(**SIGNALS)))
    assert r.status_code == 201, r.text
    for e, want in zip(r.json()["episodes"], WANT, strict=True):
        ep = client.get(f"/api/episodes/{e['slug']}").json()
        assert len(ep["tokens"]) == 4
        # Exact as JSON text: names in order, 1.0 not 1, true not 1, -0.0 and the subnormal kept.
        assert json.dumps(ep["meta"]["token_signals"]) == json.dumps(want)
        # Stored packed (app/core/token_signals.py), not as JSON text in the meta.
        assert "token_signals" not in stored_meta_json(client, e["slug"])
        adv = client.get(f"/api/episodes/{e['slug']}/advantages", params={"critic": "zero"})
        assert adv.status_code == 200 and adv.json()["episode"]["meta"]["token_signals"] == want
        assert client.get(f"/api/episodes/{e['slug']}/signals").status_code == 200


def test_bfloat16_signal(client):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save as torch_save

    # bfloat16-exact values (8 bits of mantissa): 1.5, -2.0, 0.15625 = 1.25 * 2**-3; NaN not scored.
    bf = torch.tensor([[1.5, -2.0, nan, 0.15625, 3.0], [3.0, 0.15625, 1.5, -2.0, nan]], dtype=torch.bfloat16)
    tensors = {k: torch.from_numpy(v) for k, v in batch().items()}
    got = metas(client, torch_save({**tensors, "token_signals.bf": bf}))
    assert [m["token_signals"] for m in got] == [
        {"bf": [1.5, -2.0, None, 0.15625]},
        {"bf": [0.15625, 1.5, -2.0, None]},
    ]


def test_signals_join_the_meta_ones(client):
    """A row's ``meta.token_signals`` keeps its own entries first (a number list, and a string that
    stays JSON), then the tensors'; one ``meta`` object for every row is not shared between them."""
    ratio = np.array([[1.0, 2.0, 3.0, 4.0, 0.0], [0.0, 5.0, 6.0, 7.0, 8.0]], np.float32)
    rows = [{"task": "t0", "token_signals": {"score": [1, 2, 3, 4], "note": "x"}}, {"task": "t1"}]
    got = metas(client, save(batch(ratio=ratio), metadata={"meta": json.dumps(rows)}))
    assert json.dumps(got[0]["token_signals"]) == json.dumps(
        {"score": [1, 2, 3, 4], "note": "x", "ratio": [1.0, 2.0, 3.0, 4.0]}
    )
    assert got[1]["token_signals"] == {"ratio": [5.0, 6.0, 7.0, 8.0]}
    assert [m["task"] for m in got] == ["t0", "t1"]
    one = {"token_signals": {"note": "every row"}}
    got = metas(client, save(batch(ratio=ratio), metadata={"meta": json.dumps(one)}))
    assert [m["token_signals"] for m in got] == [
        {"note": "every row", "ratio": [1.0, 2.0, 3.0, 4.0]},
        {"note": "every row", "ratio": [5.0, 6.0, 7.0, 8.0]},
    ]


def _dtype_file(dtype: str, name: str = "token_signals.ratio") -> bytes:
    """A file whose signal has ``dtype`` in the header (written by hand: numpy cannot)."""
    header = {
        "kinds": {"dtype": "U8", "shape": [B, T], "data_offsets": [0, B * T]},
        "token_ids": {"dtype": "U8", "shape": [B, T], "data_offsets": [B * T, 2 * B * T]},
        name: {"dtype": dtype, "shape": [B, T], "data_offsets": [2 * B * T, 3 * B * T]},
    }
    return raw_file(header, KINDS.tobytes() + bytes(2 * B * T))


def _meta(obj: object, **signals: np.ndarray) -> bytes:
    return save(batch(**signals), metadata={"meta": json.dumps(obj)})


RATIO = SIGNALS["ratio"]
MALFORMED = {
    "wrong shape": (
        save(batch(ratio=np.zeros((B, T + 1), np.float32))),
        "token_signals.ratio",
        "length_mismatch",
    ),
    "one per row": (save(batch(ratio=np.zeros(B, np.float32))), "token_signals.ratio", "length_mismatch"),
    "complex dtype": (save(batch(ratio=np.zeros((B, T), np.complex64))), "token_signals.ratio", "wrong_type"),
    "string dtype": (_dtype_file("STR"), "token_signals.ratio", "wrong_type"),
    "empty name": (_dtype_file("U8", "token_signals."), "token_signals.", "unknown_field"),
    "beyond int64": (
        save(batch(steps=np.array([[0, 0, 0, 0, 0], [0, 2**63, 0, 0, 0]], np.uint64))),
        "token_signals.steps",
        "wrong_type",
    ),
    "in meta too": (
        _meta([{}, {"token_signals": {"ratio": [1, 2, 3, 4]}}], ratio=RATIO),
        "token_signals.ratio",
        "bad_meta",
    ),
    "meta signals not an object": (
        _meta({"token_signals": [1, 2]}, ratio=RATIO),
        "meta.token_signals",
        "bad_meta",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_signals_name_the_tensor_and_store_nothing(client, case):
    r = refused_naming(client, *MALFORMED[case])
    assert r.status_code == 422, r.text


def test_errors_name_the_episode():
    with pytest.raises(ApiError) as e:
        parse_upload(MALFORMED["beyond int64"][0], "safetensors")
    assert e.value.episode == 2 and str(2**63) in e.value.message
    with pytest.raises(ApiError) as e:
        parse_upload(MALFORMED["in meta too"][0], "safetensors")
    assert e.value.episode == 2 and "send each signal once" in e.value.message


def test_offline_parse_gives_plain_lists():
    """The offline CLI's path (parse_upload -> native_of): the same lists as the API answers."""
    eps = parse_upload(save(batch(**SIGNALS)), "safetensors").episodes
    for ep, want in zip(eps, WANT, strict=True):
        assert json.dumps(ep.meta["token_signals"]) == json.dumps(want)


def test_native_of_converts_signal_arrays_only():
    meta = {
        "task": "t",
        "token_signals": {
            "f": np.array([0.5, nan, -inf]),
            "i": np.array([3, -1, 2**40], np.int64),
            "b": np.array([True, False, True]),
            "kept": [1, None, 2],
            "note": "x",
        },
    }
    ep = native_of(ArrayEpisode(kinds=np.array([0, 1, 1], np.uint8), tokens=["a", "b", "c"], meta=meta))
    assert json.dumps(ep.meta) == json.dumps(
        {
            "task": "t",
            "token_signals": {
                "f": [0.5, None, None],
                "i": [3, -1, 2**40],
                "b": [True, False, True],
                "kept": [1, None, 2],
                "note": "x",
            },
        }
    )
    assert isinstance(meta["token_signals"]["f"], np.ndarray)  # the episode's own meta is untouched
