"""slime's debug dumps (app/ingest/slime_pt.py, keys from creditlens.keys.SLIME), uploaded to the
real app.

The files are torch.save'd dicts shaped like slime's rollout and train dumps
(fixtures/formats/make_slime_dumps.py, which writes exactly the committed bytes). Malformed
variants answer a 4xx naming the field and the episode and store nothing; pickled objects are
refused; a dump that declares more than the budget is a 413."""

from __future__ import annotations

import io
import math

import pytest
import torch

from app.ingest import slime_pt
from tests.app.ingest.fmt_helpers import fixture_module, stored
from tests.app.ingest.fmt_helpers import upload as post
from tests.app.ingest.fmt_helpers import uploaded_advantages as uploaded_adv
from tests.app.svc_helpers import FORMATS, row_counts


def test_slime_rollout_dump(client):
    d = torch.load(FORMATS / "slime_rollout.pt", weights_only=True)
    batch, eps = stored(client, "0.pt", (FORMATS / "slime_rollout.pt").read_bytes())
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
    batch, eps = stored(client, "3_0.pt", (FORMATS / "slime_train.pt").read_bytes())
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
    s, raw = fixture_module("make_slime_dumps").train_samples()
    cols = {k: [x[k] for x in s] for k in s[0]}
    cols["raw_reward"] = raw
    buf = io.BytesIO()
    torch.save({"rollout_id": 7, "rank": 0, "rollout_data": cols}, buf)
    _, eps = stored(client, "x", buf.getvalue())
    assert [e["reward"] for e in eps] == raw and eps[0]["meta"]["step"] == 7


# --------------------------------------------------------------------------------------------- malformed


def _slime(change, which="slime_train.pt"):
    mod = fixture_module("make_slime_dumps")
    d = mod.train_dump() if which == "slime_train.pt" else mod.rollout_dump()
    change(d["samples"])
    buf = io.BytesIO()
    torch.save(d, buf)
    return buf.getvalue()


MALFORMED = {
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

    d = fixture_module("make_slime_dumps").rollout_dump()
    d["samples"][0]["metadata"] = np.array(["x"], dtype=object)  # needs arbitrary unpickling
    torch.save(d, tmp_path / "evil.pt")
    before = row_counts(client)
    r = post(client, "evil.pt", (tmp_path / "evil.pt").read_bytes())
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_slime_dump"
    assert "weights_only" in r.json()["error"]["message"]
    assert row_counts(client) == before


def test_declared_size_over_the_budget_is_413(client, monkeypatch):
    """Checked from the zip directory, before any tensor is decoded."""
    before = row_counts(client)
    monkeypatch.setattr(slime_pt, "MAX_UNPACKED_BYTES", 1000)
    r = post(client, "slime_train.pt", (FORMATS / "slime_train.pt").read_bytes())
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "too_large" and "limit" in r.json()["error"]["message"]
    assert row_counts(client) == before


def test_slime_fixtures_are_reproducible():
    """make_slime_dumps.py writes exactly the committed bytes (the fixtures cannot drift)."""
    mod = fixture_module("make_slime_dumps")
    for name, d in (("slime_rollout.pt", mod.rollout_dump()), ("slime_train.pt", mod.train_dump())):
        assert mod.dump_bytes(d) == (FORMATS / name).read_bytes(), name
