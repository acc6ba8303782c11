"""``Run.log_tensors(..., token_signals={name: [B, T]})``: the client's own per-token signals end
to end, the real client logging to a real server process, and the arguments it refuses. The
expected lists are the logged values at the kept (``attention_mask`` 1) positions, by hand."""

from __future__ import annotations

import math

import httpx
import numpy as np
import pytest

from app.ingest import parse_upload
from creditlens import Client, _batch
from tests.live_server import Server

torch = pytest.importorskip("torch")
nan = math.nan


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("signals-e2e")
    with Server(tmp / "creditlens.db", tmp / "server.log") as srv:
        yield srv.base


def step() -> dict:
    """Two rows of 5: row 0 left-padded by one, row 1 right-padded by two; policy after 2 tokens."""
    attn = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    return {
        "token_ids": torch.arange(10).view(2, 5),
        "attention_mask": attn,
        "policy_mask": torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]]),
        "reward": torch.tensor([1.0, 0.0]),
        "token_signals": {
            # bfloat16-exact values, NaN where not scored (and on padding: dropped anyway).
            "importance_ratio": torch.tensor(
                [[nan, nan, 1.5, 0.75, 1.0], [nan, 1.25, 0.5, nan, nan]], dtype=torch.bfloat16
            ),
            "is_masked": torch.tensor([[True, False, True, False, False], [False, True, False, True, True]]),
            "bucket": np.array([[9, 0, 1, 2, 3], [4, 5, 6, 9, 9]], dtype=np.int16),
            "weight": [[0.0, 0.1, None, 0.3, 0.4], [0.5, None, 0.7, 0.0, 0.0]],  # lists: float64
        },
    }


WANT = [
    {"importance_ratio": [None, 1.5, 0.75, 1.0], "is_masked": [False, True, False, False]},
    {"importance_ratio": [None, 1.25, 0.5], "is_masked": [False, True, False]},
]
WANT[0] |= {"bucket": [0, 1, 2, 3], "weight": [0.1, None, 0.3, 0.4]}
WANT[1] |= {"bucket": [4, 5, 6], "weight": [0.5, None, 0.7]}


def test_logged_signals_read_back_from_the_server(server):
    data = step()
    with Client(server, strict=True) as c:
        run = c.run("signals", config={})
        run.log_tensors(0, meta={"token_signals": {"note": "from meta"}}, **data)
        data["token_signals"]["is_masked"].fill_(True)  # the trainer reuses its buffer: logged stays
        with pytest.raises(ValueError, match=r"`token_signals\[r\]` has shape \(2, 4\)"):  # strict
            run.log_tensors(1, token_ids=np.zeros((2, 5), int), token_signals={"r": np.zeros((2, 4))})
        assert run.flush(timeout=60) and run.sent == 1
    (s,) = httpx.get(f"{server}/api/runs/{run.id}").json()["steps"]
    batch = httpx.get(f"{server}/api/batches/{s['batch_id']}").json()
    eps = [httpx.get(f"{server}/api/episodes/{e['slug']}").json() for e in batch["episodes"]]
    assert [len(e["tokens"]) for e in eps] == [4, 3]
    for ep, want in zip(eps, WANT, strict=True):
        # The meta's own entry first, then the tensors in name order; types as logged.
        sig = ep["meta"]["token_signals"]
        assert list(sig) == ["note", "bucket", "importance_ratio", "is_masked", "weight"]
        assert sig == {"note": "from meta", **want}
        assert all(type(x) is bool for x in sig["is_masked"])
        assert all(type(x) is int for x in sig["bucket"])


def test_wire_dtypes():
    """float32 stays float32 (bfloat16 widened), float64 and lists float64, ints int64, bool BOOL."""
    snap = _batch.snapshot(
        token_ids=np.zeros((1, 2), int),
        token_signals={
            "f16": np.ones((1, 2), np.float16),
            "f64": np.ones((1, 2)),
            "bf16": torch.ones(1, 2, dtype=torch.bfloat16),
            "u8": np.ones((1, 2), np.uint8),
            "b": [[True, False]],
            "none": [[1, None]],
        },
    )
    from safetensors.numpy import load

    got = {k: v.dtype for k, v in load(_batch.build(snap)).items() if k.startswith("token_signals.")}
    assert got == {
        "token_signals.f16": np.float32,
        "token_signals.f64": np.float64,
        "token_signals.bf16": np.float32,
        "token_signals.u8": np.int64,
        "token_signals.b": np.bool_,
        "token_signals.none": np.float64,
    }
    ep = parse_upload(_batch.build(snap), "safetensors").episodes[0]
    assert ep.meta["token_signals"]["none"] == [1.0, None]
    assert ep.meta["token_signals"]["b"] == [True, False]


@pytest.mark.parametrize(
    "signals, match",
    [
        ({"r": np.zeros((2, 4))}, r"`token_signals\[r\]` has shape \(2, 4\) but the batch is \(2, 5\)"),
        ({"r": np.zeros(2)}, r"`token_signals\[r\]` has shape \(2,\)"),
        ({"label": [["a"] * 5] * 2}, r"`token_signals\[label\]` must hold numbers or booleans"),
        ({"": np.zeros((2, 5))}, "`token_signals` names must be non-empty strings"),
        ({3: np.zeros((2, 5))}, "`token_signals` names must be non-empty strings"),
        ([np.zeros((2, 5))], "`token_signals` must be a dict"),
        ({"big": np.full((2, 5), 2**63, np.uint64)}, r"`token_signals\[big\]` holds 9223372036854775808"),
    ],
    ids=["shape", "rank", "strings", "empty name", "int name", "not a dict", "beyond int64"],
)
def test_bad_signals_name_the_argument(signals, match):
    with pytest.raises(ValueError, match=match):
        _batch.snapshot(token_ids=np.zeros((2, 5), int), token_signals=signals)
