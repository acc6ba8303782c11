"""Per-token signals (`ref_logprobs`, `rollout_logprobs`, `entropy`) and `token_ids` in the native
format, filled by every format that has them, and server-side tokenizers (a `tokenizer` multipart
part holding a tokenizer.json) for uploads of ids. Real app, real SQLite file, real uploads."""

from __future__ import annotations

import importlib.util
import io
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import save
from sqlmodel import Session, select

from app.storage.codecs import episode_arrays
from app.storage.models import Episode
from tests.app.svc_helpers import FORMATS, episode, jsonl, make_client, row_counts, upload

SIGNALS = ("ref_logprobs", "rollout_logprobs", "entropy")


@pytest.fixture
def client(db_url):
    with make_client(db_url) as c:
        yield c


def stored(client, r) -> list[dict]:
    assert r.status_code == 201, r.text
    return [client.get(f"/api/episodes/{e['slug']}").json() for e in r.json()["episodes"]]


def with_signals(n_prompt=2, n_policy=3) -> dict:
    n = n_prompt + n_policy
    return episode(
        n_prompt=n_prompt,
        n_policy=n_policy,
        logprobs=[-0.1 * (i + 1) for i in range(n)],
        ref_logprobs=[-0.15 * (i + 1) for i in range(n)],
        rollout_logprobs=[-0.1 * (i + 1) + 1e-3 for i in range(n)],
        entropy=[0.5 + 0.01 * i for i in range(n)],
        token_ids=[10 + i for i in range(n)],
        advantages=[0.0, 0.3, 1.25, -0.5, 0.1],
        meta={"special_tokens": [0]},
    )


# --------------------------------------------------------------------------------- native fields


def test_native_signals_round_trip_bit_exact(client):
    sent = with_signals()
    sent["entropy"][2] = 0.1 + 0.2  # a float that only survives as float64
    [got] = stored(client, upload(client, [sent]))
    for name in (*SIGNALS, "token_ids", "advantages", "logprobs"):
        assert got[name] == sent[name], name
    assert got["meta"]["special_tokens"] == [0]
    # and the arrays the service computes with carry them, typed
    with Session(client.app.state.engine) as s:
        arr = episode_arrays(s.exec(select(Episode)).one())
    assert arr.token_ids.dtype == np.int64 and arr.token_ids.tolist() == sent["token_ids"]
    for name in SIGNALS:
        assert getattr(arr, name).dtype == np.float64 and getattr(arr, name).tolist() == sent[name]


def test_signals_are_optional(client):
    [got] = stored(client, upload(client, [episode()]))
    assert all(got[name] is None for name in (*SIGNALS, "token_ids"))


def test_json_schema_documents_the_fields(client):
    props = client.get("/api/schema/episode").json()["properties"]
    for name in SIGNALS:
        assert "number" in json.dumps(props[name]), name
    assert "integer" in json.dumps(props["token_ids"])


BAD = {
    **{f"{f} too short": (f, lambda e, f=f: e.__setitem__(f, e[f][:-1]), "length_mismatch") for f in SIGNALS},
    **{f"{f} NaN": (f, lambda e, f=f: e[f].__setitem__(3, float("nan")), "not_finite") for f in SIGNALS},
    "token_ids too long": ("token_ids", lambda e: e["token_ids"].append(1), "length_mismatch"),
    "negative token id": ("token_ids", lambda e: e["token_ids"].__setitem__(1, -4), "bad_token_ids"),
    "token id beyond int32": ("token_ids", lambda e: e["token_ids"].__setitem__(1, 2**40), "bad_token_ids"),
    "token id beyond int64": ("token_ids", lambda e: e["token_ids"].__setitem__(1, 2**70), "wrong_type"),
    "float token id": ("token_ids", lambda e: e["token_ids"].__setitem__(1, 1.5), "wrong_type"),
    "special position out of range": (
        "meta.special_tokens",
        lambda e: e["meta"].__setitem__("special_tokens", [5]),
        "bad_meta",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_signal_names_line_episode_and_field(client, case):
    field, change, code = BAD[case]
    bad = with_signals()
    change(bad)
    body = jsonl([with_signals(), bad])  # json.dumps writes NaN, as Python tools do
    r = client.post("/api/uploads", files={"file": ("eps.jsonl", body)})
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert (err["field"], err["code"], err["line"], err["episode"]) == (field, code, 2, 2), err
    assert err["message"].startswith("line 2, episode 2:") and f"`{field}`" in err["message"]
    assert row_counts(client) == (0, 0)


# --------------------------------------------------------------------------------- every format


def verl_batch(B=2, P=3, R=4) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.arange(B * (P + R)).view(B, P + R) + 5
    return {
        "prompts": ids[:, :P].clone(),
        "responses": ids[:, P:].clone(),
        "response_mask": torch.tensor([[1, 1, 0, 1], [1, 1, 1, 1]]),
        "attention_mask": torch.ones(B, P + R, dtype=torch.long),
        "token_level_rewards": torch.zeros(B, R),
        "old_log_probs": -torch.rand(B, R, generator=g),
        "ref_log_prob": -torch.rand(B, R, generator=g),
        "rollout_log_probs": -torch.rand(B, R, generator=g),
        "entropys": torch.rand(B, R, generator=g),
        "advantages": torch.randn(B, R, generator=g),
        "uid": ["a", "a"],
    }


def torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_verl_pt_fills_the_fields(client):
    d = verl_batch()
    eps = stored(client, client.post("/api/uploads", files={"file": ("b.pt", torch_bytes(d))}))
    P = d["prompts"].shape[1]
    for b, ep in enumerate(eps):
        for field, key in (
            ("logprobs", "old_log_probs"),
            ("ref_logprobs", "ref_log_prob"),
            ("rollout_logprobs", "rollout_log_probs"),
            ("entropy", "entropys"),
            ("advantages", "advantages"),
        ):
            assert ep[field][P:] == d[key][b].double().tolist(), field
        assert ep["token_ids"] == d["prompts"][b].tolist() + d["responses"][b].tolist()
        assert ep["tokens"][0] == f"⟨{d['prompts'][b, 0].item()}⟩"  # no tokenizer: ⟨id⟩


def _module(name):
    spec = importlib.util.spec_from_file_location(name, FORMATS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_slime_pt_fills_the_fields(client):
    d = _module("make_slime_dumps").train_dump()
    for s in d["samples"]:
        R = int(s["response_lengths"])
        s["rollout_log_probs"] = s["log_probs"] - 0.01
        s["entropy"] = torch.linspace(0.1, 0.9, R)
    eps = stored(client, client.post("/api/uploads", files={"file": ("3_0.pt", torch_bytes(d))}))
    for s, ep in zip(d["samples"], eps, strict=True):
        P = len(s["tokens"]) - int(s["response_lengths"])
        assert ep["token_ids"] == list(s["tokens"])
        assert ep["ref_logprobs"][P:] == s["ref_log_probs"].double().tolist()
        assert ep["rollout_logprobs"][P:] == s["rollout_log_probs"].double().tolist()
        assert ep["entropy"][P:] == s["entropy"].double().tolist()
        assert ep["logprobs"][P:] == s["log_probs"].double().tolist()


def test_slime_rollout_dump_has_no_second_logprob_signal(client):
    body = (FORMATS / "slime_rollout.pt").read_bytes()
    eps = stored(client, client.post("/api/uploads", files={"file": ("0.pt", body)}))
    # its rollout_log_probs are the only log-probs: `logprobs`, not a ratio of 1 against themselves
    assert eps[0]["logprobs"] is not None and eps[0]["rollout_logprobs"] is None


def test_nemo_rl_fills_the_fields(client):
    rec = json.loads((FORMATS / "nemo_rl.jsonl").read_text().splitlines()[0])
    rec["reference_policy_logprobs"] = [-0.3] * len(rec["token_ids"])
    [ep] = stored(client, client.post("/api/uploads", files={"file": ("n.jsonl", json.dumps(rec) + "\n")}))
    n = rec["input_lengths"]
    assert ep["ref_logprobs"] == [-0.3] * n
    assert ep["rollout_logprobs"] == rec["generation_logprobs"][:n]
    assert ep["logprobs"] == rec["prev_logprobs"][:n]
    assert ep["token_ids"] == rec["token_ids"][:n]


def st_batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    kinds = np.array([[0, 0, 1, 1, 2, 1, 255], [0, 1, 1, 1, 1, 1, 1]], dtype=np.uint8)
    return {
        "kinds": kinds,
        "token_ids": np.arange(14, dtype=np.int64).reshape(2, 7) + 100,
        "logprobs": -rng.random((2, 7)),
        "ref_logprobs": -rng.random((2, 7)).astype(np.float32),
        "rollout_logprobs": -rng.random((2, 7)),
        "entropy": rng.random((2, 7)).astype(np.float16),
        "advantages": rng.standard_normal((2, 7)),
        "reward": np.array([1.0, 0.0]),
    }


def test_safetensors_fills_the_fields(client):
    t = st_batch()
    body = save(t)
    eps = stored(client, client.post("/api/uploads", files={"file": ("b.safetensors", body)}))
    for b, ep in enumerate(eps):
        keep = t["kinds"][b] != 255
        for name in ("logprobs", *SIGNALS, "advantages"):
            assert ep[name] == t[name][b][keep].astype(np.float64).tolist(), name
        assert ep["token_ids"] == t["token_ids"][b][keep].tolist()
        assert ep["tokens"] == [f"⟨{i}⟩" for i in t["token_ids"][b][keep].tolist()]


def test_safetensors_nan_on_a_signal_names_the_tensor(client):
    t = st_batch()
    t["entropy"][1, 4] = np.nan
    r = client.post("/api/uploads", files={"file": ("b.safetensors", save(t))})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert (err["field"], err["code"], err["episode"]) == ("entropy", "not_finite", 2)
    assert row_counts(client) == (0, 0)


def test_trl_parquet_has_no_signals(client):
    body = (FORMATS / "trl_completions.parquet").read_bytes()
    eps = stored(client, client.post("/api/uploads", files={"file": ("c.parquet", body)}))
    assert all(ep[name] is None for ep in eps for name in SIGNALS)


# --------------------------------------------------------------------------------- tokenizers


@pytest.fixture(scope="module")
def tok():
    """A tiny byte-level BPE trained here (nothing downloaded), with one special token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    t.train_from_iterator(["def f(x):\n    return x + 1\n", "the cat sat on the mat\n"] * 100, trainer)
    return t


def with_tokenizer(client, body: bytes, name: str, tokenizer: bytes):
    files = {"file": (name, body), "tokenizer": ("tokenizer.json", tokenizer)}
    return client.post("/api/uploads", files=files)


def test_verl_pt_with_tokenizer_shows_readable_pieces(client, tok):
    prompt = tok.encode("the cat").ids
    resp = tok.encode("def f(x):\n").ids + [tok.token_to_id("<|im_end|>")]
    d = {
        "prompts": torch.tensor([prompt]),
        "responses": torch.tensor([resp]),
        "response_mask": torch.ones(1, len(resp), dtype=torch.long),
        "token_level_rewards": torch.zeros(1, len(resp)),
    }
    r = with_tokenizer(client, torch_bytes(d), "b.pt", tok.to_str().encode())
    [ep] = stored(client, r)
    assert "".join(ep["tokens"]) == "the catdef f(x):\n<|im_end|>"
    assert not any("Ġ" in t or "Ċ" in t for t in ep["tokens"])
    assert ep["meta"]["special_tokens"] == [len(prompt) + len(resp) - 1]
    assert ep["token_ids"] == prompt + resp


def test_safetensors_with_tokenizer_shows_readable_pieces(client, tok):
    text = "the mat sat é\n"  # é is two bytes: split over tokens in a byte-level BPE
    ids = tok.encode(text).ids
    T = len(ids)
    kinds = np.ones((1, T), dtype=np.uint8)
    kinds[0, 0] = 0
    body = save({"kinds": kinds, "token_ids": np.array([ids], dtype=np.int32), "reward": np.array([1.0])})
    [ep] = stored(client, with_tokenizer(client, body, "b.safetensors", tok.to_str().encode()))
    assert "".join(ep["tokens"]) == text and len(ep["tokens"]) == T
    assert "meta" in ep and "special_tokens" not in ep["meta"]


def test_bad_tokenizer_is_422_naming_the_field(client):
    body = save(st_batch())
    for junk in (b"{not json", b'{"model": 3}', b"\xff\xfe"):
        r = with_tokenizer(client, body, "b.safetensors", junk)
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert (err["field"], err["code"]) == ("tokenizer", "bad_tokenizer") and "`tokenizer`" in err[
            "message"
        ]
    assert row_counts(client) == (0, 0)


def test_tokenizer_size_is_bounded(db_url, tok):
    raw = tok.to_str().encode()
    with make_client(db_url, max_tokenizer_bytes=len(raw) - 1) as c:
        r = with_tokenizer(c, save(st_batch()), "b.safetensors", raw)
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert err["field"] == "tokenizer" and "CREDITLENS_MAX_TOKENIZER_BYTES" in err["message"]
        assert row_counts(c) == (0, 0)


def test_ids_outside_the_vocabulary_keep_the_id_display(client, tok):
    body = save({"kinds": np.array([[0, 1]], dtype=np.uint8), "token_ids": np.array([[5, 10**6]])})
    [ep] = stored(client, with_tokenizer(client, body, "b.safetensors", tok.to_str().encode()))
    assert ep["tokens"][1] == "⟨1000000⟩" and ep["tokens"][0] != "⟨5⟩"


def test_nemo_rl_with_tokenizer_shows_readable_pieces(client, tok):
    ids = tok.encode("the cat").ids + tok.encode(" sat").ids
    rec = {"token_ids": ids, "token_loss_mask": [0] * 2 + [1] * (len(ids) - 2), "rewards": 1.0}
    body = (json.dumps(rec) + "\n").encode()
    [ep] = stored(client, with_tokenizer(client, body, "n.jsonl", tok.to_str().encode()))
    assert "".join(ep["tokens"]) == "the cat sat" and ep["token_ids"] == ids
