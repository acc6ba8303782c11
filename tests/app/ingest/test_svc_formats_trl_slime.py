"""TRL's completions parquet and slime's debug dumps, uploaded to the real app.

The TRL file is the one TRL's own GRPOTrainer writes (fixtures/formats/make_trl_completions.py;
the slow test runs the trainer here). The slime files are torch.save'd dicts shaped like slime's
rollout and train dumps (fixtures/formats/make_slime_dumps.py). Malformed variants answer a 4xx
naming the field (and the episode) and store nothing."""

from __future__ import annotations

import importlib.util
import io
import math

import pyarrow.parquet as pq
import pytest
import torch

from app.core.tokenize import tokenize
from app.ingest.trl_completions import END, write_example
from tests.app.svc_helpers import FORMATS, row_counts


def _module(name):
    spec = importlib.util.spec_from_file_location(name, FORMATS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def post(client, name, data):
    return client.post("/api/uploads", files={"file": (name, data)})


def stored(client, data, name="x"):
    r = post(client, name, data)
    assert r.status_code == 201, r.text
    body = r.json()
    batch = client.get(f"/api/batches/{body['batch_id']}").json()
    eps = [client.get(f"/api/episodes/{e['slug']}").json() for e in body["episodes"]]
    return batch, eps


def uploaded_adv(client, slug):
    adv = client.get(f"/api/episodes/{slug}/advantages", params={"scheme": "uploaded"}).json()
    return adv["schemes"][0]["advantages"]


def pick(ep, kind, key="tokens"):
    return [x for x, k in zip(ep[key], ep["kinds"], strict=True) if k == kind]


# --------------------------------------------------------------------------------------------- TRL


def check_trl(client, data: bytes):
    rows = pq.read_table(io.BytesIO(data)).to_pylist()
    batch, eps = stored(client, data, "completions.parquet")
    assert batch["source"] == "upload:trl_completions" and len(eps) == len(rows)
    reward_cols = [c for c in rows[0] if c not in ("step", "prompt", "completion", "advantage")]
    for row, ep in zip(rows, eps, strict=True):
        assert "".join(pick(ep, "prompt")) == row["prompt"]
        assert pick(ep, "policy") == tokenize(row["completion"]) + [END]
        assert ep["reward"] == pytest.approx(sum(row[c] for c in reward_cols))
        assert ep["meta"]["step"] == row["step"]
        adv = uploaded_adv(client, ep["slug"])
        # TRL's one advantage per completion sits on every policy token, nothing elsewhere.
        assert [a for a, k in zip(adv, ep["kinds"], strict=True) if k == "policy"] == pytest.approx(
            [row["advantage"]] * len(pick(ep, "policy"))
        )
        assert all(a in (None, 0.0) for a, k in zip(adv, ep["kinds"], strict=True) if k != "policy")
    # TRL samples each prompt num_generations (2) times: one group per prompt.
    groups = {}
    for row, ep in zip(rows, eps, strict=True):
        groups.setdefault(row["prompt"], set()).add(ep["group"])
    assert all(len(g) == 1 for g in groups.values())
    assert len({ep["group"] for ep in eps}) == len(groups)
    return rows, eps


def test_trl_fixture_round_trips(client):
    rows, eps = check_trl(client, (FORMATS / "trl_completions.parquet").read_bytes())
    # The fixture has a group whose rewards differ (1 and 0): GRPO's advantages are +-0.707.
    assert sorted(r["count_a"] for r in rows if r["prompt"] == "rename the loop index") == [0.0, 1.0]
    assert eps[1]["tokens"][-1] == END  # the empty completion still has its stop token


@pytest.mark.slow
def test_trl_parquet_written_by_grpo_trainer(client, tmp_path):
    """A real, tiny GRPOTrainer run (random 2-layer Llama, tokenizer trained here, CPU)."""
    pytest.importorskip("trl")
    files = _module("make_trl_completions").run(tmp_path, steps=2)
    assert [f.name for f in files] == ["completions_00001.parquet", "completions_00002.parquet"]
    for f in files:
        rows, _ = check_trl(client, f.read_bytes())
        assert len(rows) == 4 and list(rows[0]) == ["step", "prompt", "completion", "count_a", "advantage"]


def test_trl_conversational_rows(client):
    rows = [
        {
            "step": 5,
            "prompt": [{"role": "user", "content": "What is 2+2?"}],
            "completion": [{"role": "assistant", "content": "4"}],
            "accuracy": r,
            "fmt": 0.5,
            "advantage": a,
        }
        for r, a in ((1.0, 0.7), (0.0, -0.7))
    ]
    batch, eps = stored(client, write_example(rows))
    for row, ep in zip(rows, eps, strict=True):
        assert pick(ep, "policy") == ["4", "<|end|>"]
        assert "What is 2+2?" in "".join(pick(ep, "prompt"))
        assert ep["reward"] == row["accuracy"] + 0.5
        assert ep["meta"]["reward_functions"] == {"accuracy": row["accuracy"], "fmt": 0.5}
    assert eps[0]["group"] == eps[1]["group"]


def test_trl_unscored_reward_function_is_left_out(client):
    """TRL logs NaN where a reward function returned None (it did not apply to that sample)."""
    rows = [
        {"step": 1, "prompt": "p", "completion": "c", "math": math.nan, "code": 1.0, "advantage": 0.0},
        {"step": 1, "prompt": "p", "completion": "d", "math": math.nan, "code": 0.0, "advantage": 0.0},
    ]
    _, eps = stored(client, write_example(rows))
    assert [e["reward"] for e in eps] == [1.0, 0.0]
    assert eps[0]["meta"]["reward_functions"] == {"math": None, "code": 1.0}


# --------------------------------------------------------------------------------------------- slime


def test_slime_rollout_dump(client):
    d = torch.load(FORMATS / "slime_rollout.pt", weights_only=True)
    batch, eps = stored(client, (FORMATS / "slime_rollout.pt").read_bytes(), "0.pt")
    assert batch["source"] == "upload:slime_pt" and len(eps) == 4
    for s, ep in zip(d["samples"], eps, strict=True):
        R = s["response_length"]
        P = len(s["tokens"]) - R
        assert ep["tokens"] == [f"⟨{i}⟩" for i in s["tokens"]]
        assert ep["kinds"] == ["prompt"] * P + ["policy" if m else "tool" for m in s["loss_mask"]]
        assert ep["reward"] == s["reward"] and ep["group"] == str(s["group_index"])
        assert ep["logprobs"][P:] == s["rollout_log_probs"]
        assert ep["meta"]["step"] == 3 and ep["meta"]["status"] == s["status"]
        assert ep["truncated"] == (s["status"] == "truncated")
    assert eps[0]["kinds"].count("tool") == 2  # the tool observation inside the first response
    assert [e["truncated"] for e in eps] == [False, False, False, True]
    diag = batch["diagnostics"]
    assert sorted(g["n"] for g in diag["groups"]) == [2, 2]


def test_slime_train_dump(client):
    d = torch.load(FORMATS / "slime_train.pt", weights_only=True)
    batch, eps = stored(client, (FORMATS / "slime_train.pt").read_bytes(), "3_0.pt")
    assert len(eps) == 4
    for s, raw, ep in zip(d["samples"], d["raw_reward"], eps, strict=True):
        R = s["response_lengths"]
        P = len(s["tokens"]) - R
        assert ep["reward"] == raw  # the raw reward, not the group-normalised `rewards`
        assert ep["truncated"] == bool(s["truncated"])
        assert ep["logprobs"][P:] == s["log_probs"].double().tolist()
        assert ep["values"][P:] == s["values"].double().tolist()
        adv = uploaded_adv(client, ep["slug"])
        want = s["advantages"].double().tolist()
        pol = [a for a, k in zip(adv[P:], ep["kinds"][P:], strict=True) if k == "policy"]
        assert pol == pytest.approx([w for w, m in zip(want, s["loss_masks"].tolist(), strict=True) if m])
    # No group_index in a train dump: samples of the same prompt share a group.
    assert eps[0]["group"] == eps[1]["group"] != eps[2]["group"] == eps[3]["group"]


def test_slime_old_columnar_train_dump(client):
    s, raw = _module("make_slime_dumps").train_samples()
    cols = {k: [x[k] for x in s] for k in s[0]}
    cols["raw_reward"] = raw
    buf = io.BytesIO()
    torch.save({"rollout_id": 7, "rank": 0, "rollout_data": cols}, buf)
    _, eps = stored(client, buf.getvalue())
    assert [e["reward"] for e in eps] == raw and eps[0]["meta"]["step"] == 7


# --------------------------------------------------------------------------------------------- malformed


def _trl_rows():
    return pq.read_table(FORMATS / "trl_completions.parquet").to_pylist()


def _trl(change):
    rows = _trl_rows()
    change(rows)
    return write_example(rows)


def _slime(change, which="slime_train.pt"):
    mod = _module("make_slime_dumps")
    d = mod.train_dump() if which == "slime_train.pt" else mod.rollout_dump()
    change(d["samples"])
    buf = io.BytesIO()
    torch.save(d, buf)
    return buf.getvalue()


def _drop(rows, key):
    for r in rows:
        r.pop(key)


def _set(i, key, value):
    def change(rows):
        rows[i][key] = value

    return change


MALFORMED = {
    "trl_missing_completion": (
        lambda: _trl(lambda r: _drop(r, "completion")),
        422,
        "missing_field",
        "completion",
        1,
    ),
    "trl_nan_advantage": (lambda: _trl(_set(2, "advantage", math.nan)), 422, "not_finite", "advantage", 3),
    "trl_inf_reward": (lambda: _trl(_set(1, "count_a", math.inf)), 422, "not_finite", "count_a", 2),
    "trl_prompt_not_text": (
        lambda: write_example([{"step": 1, "prompt": 3, "completion": "x", "advantage": 0.0}]),
        422,
        "wrong_type",
        "prompt",
        1,
    ),
    "trl_advantage_text": (
        lambda: write_example([{"step": 1, "prompt": "p", "completion": "x", "r": 1.0, "advantage": "high"}]),
        422,
        "wrong_type",
        "advantage",
        1,
    ),
    "trl_truncated_file": (
        lambda: (FORMATS / "trl_completions.parquet").read_bytes()[:-200] + b"PAR1",
        422,
        "damaged_file",
        "file",
        None,
    ),
    "slime_missing_tokens": (lambda: _slime(lambda s: s[1].pop("tokens")), 422, "missing_field", "tokens", 2),
    "slime_mask_length": (
        lambda: _slime(lambda s: s[0].__setitem__("loss_masks", torch.ones(3, dtype=torch.int32))),
        422,
        "length_mismatch",
        "loss_masks",
        1,
    ),
    "slime_nan_advantages": (
        lambda: _slime(lambda s: s[3]["advantages"].__setitem__(1, math.nan)),
        422,
        "not_finite",
        "advantages",
        4,
    ),
    "slime_float_tokens": (
        lambda: _slime(lambda s: s[2].__setitem__("tokens", s[2]["tokens"].float())),
        422,
        "wrong_type",
        "tokens",
        3,
    ),
    "slime_reward_text": (
        lambda: _slime(lambda s: s[1].__setitem__("reward", "good"), "slime_rollout.pt"),
        422,
        "wrong_type",
        "reward",
        2,
    ),
    "slime_response_too_long": (
        lambda: _slime(lambda s: s[0].__setitem__("response_length", 99), "slime_rollout.pt"),
        422,
        "wrong_type",
        "response_length",
        1,
    ),
    "slime_log_probs_length": (
        lambda: _slime(lambda s: s[0]["rollout_log_probs"].pop(), "slime_rollout.pt"),
        422,
        "length_mismatch",
        "rollout_log_probs",
        1,
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_is_refused_and_nothing_stored(client, case):
    make, status, code, field, episode = MALFORMED[case]
    before = row_counts(client)
    r = post(client, case, make())
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["field"] == field and err["episode"] == episode, err
    if field and code != "damaged_file":  # a damaged file names its part, not a field
        assert f"`{field}`" in err["message"]
    assert row_counts(client) == before


def test_slime_pickled_object_is_refused(client, tmp_path):
    import numpy as np

    d = _module("make_slime_dumps").rollout_dump()
    d["samples"][0]["metadata"] = np.array(["x"], dtype=object)  # needs arbitrary unpickling
    torch.save(d, tmp_path / "evil.pt")
    before = row_counts(client)
    r = post(client, "evil.pt", (tmp_path / "evil.pt").read_bytes())
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_slime_dump"
    assert "weights_only" in r.json()["error"]["message"]
    assert row_counts(client) == before


def test_formats_are_listed(client):
    names = {f["name"] for f in client.get("/api/formats").json()}
    assert {"trl_completions", "slime_pt"} <= names


def test_declared_sizes_over_the_budget_are_413(client, monkeypatch):
    """Checked from the parquet footer / zip directory, before any column or tensor is decoded."""
    from app.ingest import slime_pt, trl_completions

    before = row_counts(client)
    monkeypatch.setattr(trl_completions, "MAX_UNCOMPRESSED_BYTES", 100)
    monkeypatch.setattr(slime_pt, "MAX_UNPACKED_BYTES", 1000)
    for name in ("trl_completions.parquet", "slime_train.pt"):
        r = post(client, name, (FORMATS / name).read_bytes())
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "too_large" and "limit" in r.json()["error"]["message"]
    assert row_counts(client) == before


def test_slime_fixtures_are_reproducible():
    """make_slime_dumps.py writes exactly the committed bytes (the fixtures cannot drift)."""
    mod = _module("make_slime_dumps")
    for name, d in (("slime_rollout.pt", mod.rollout_dump()), ("slime_train.pt", mod.train_dump())):
        assert mod.dump_bytes(d) == (FORMATS / name).read_bytes(), name
